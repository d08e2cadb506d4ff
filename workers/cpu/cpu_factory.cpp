// The CPU backend's registration (backend_factory.h): no devices, no settings; the pool's thread count
// comes from BackendConfig::threads.
#include "inferd/backend_factory.h"
#include "inferd/cpu_backend.h"

namespace inferd {

const BackendFactory& cpu_backend_factory() {
  static const BackendFactory factory{
      "cpu",
      [](const BackendConfig& config) -> Result<std::unique_ptr<Backend>> {
        if (!config.device.empty()) {
          return Status(Code::kInvalidArgument, "the CPU backend has no devices (got device '" + config.device + "')");
        }
        if (!config.settings.empty()) {
          return Status(Code::kInvalidArgument, "the CPU backend has no setting '" + config.settings.begin()->first + "'");
        }
        auto b = CpuBackend::create(CpuBackendOptions{config.threads});
        if (!b) return b.status();
        return std::unique_ptr<Backend>(std::move(b).value());
      },
      {},
      [] { return std::vector<BackendVariant>{{"cpu", BackendConfig{}}}; }};
  return factory;
}

}  // namespace inferd
