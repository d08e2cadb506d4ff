#include "inferd/backend_registry.h"

#include <cstdlib>

namespace inferd {

const BackendFactory* find_backend(std::string_view family) {
  for (const BackendFactory* f : registered_backends()) {
    if (f->family == family) return f;
  }
  return nullptr;
}

Result<std::unique_ptr<Backend>> create_backend(const BackendFactory& factory, BackendConfig config) {
  for (const auto& [setting, variable] : factory.environment) {
    const char* value = std::getenv(variable.c_str());
    if (value != nullptr && *value != '\0' && !config.settings.count(setting)) config.settings[setting] = value;
  }
  return factory.create(config);
}

}  // namespace inferd
