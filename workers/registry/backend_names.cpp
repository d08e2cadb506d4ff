#include "inferd/backend_names.h"

#include <vector>

namespace inferd {

std::optional<BackendName> parse_backend_name(std::string_view name) {
  const size_t colon = name.find(':');
  BackendName b{std::string(name.substr(0, colon)), ""};
  if (b.family.empty()) return std::nullopt;
  if (colon == std::string_view::npos) return b;
  b.device = std::string(name.substr(colon + 1));
  if (b.device.empty() || b.device.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const BackendFamily* family = find_backend_family(b.family);
  if (family != nullptr && !family->has_devices) return std::nullopt;  // "cpu:0": the CPU has no devices
  return b;
}

const BackendFamily* find_backend_family(std::string_view family) {
  for (const BackendFamily& f : backend_families()) {
    if (f.name == family) return &f;
  }
  return nullptr;
}

std::string backend_name_forms() {
  std::vector<std::string> forms;
  for (const BackendFamily& f : backend_families()) {
    forms.emplace_back(f.name);
    if (f.has_devices) forms.push_back(std::string(f.name) + ":N");
  }
  std::string out;
  for (size_t i = 0; i < forms.size(); ++i) {
    if (i > 0) out += i + 1 == forms.size() ? " or " : ", ";
    out += forms[i];
  }
  return out;
}

Status check_backend_name(std::string_view name) {
  const auto parsed = parse_backend_name(name);
  const BackendFamily* family = parsed ? find_backend_family(parsed->family) : nullptr;
  if (family == nullptr) {
    return Status(Code::kInvalidArgument,
                  "unknown backend '" + std::string(name) + "' (expected " + backend_name_forms() + ")");
  }
  if (!family->built) {
    return Status(Code::kUnimplemented, "backend '" + std::string(name) + "' is not available in this build of inferd");
  }
  return Status::ok();
}

}  // namespace inferd
