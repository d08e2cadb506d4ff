// inferd/backend_factory.h — how a backend folder offers its backend to the registry
// (backend_registry.h): a factory that makes instances from a config, the settings it reads from the
// worker's environment, and the configurations the backend-ops suite runs.
// Thread safety: factories are constant; create() may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/backend.h"
#include "inferd/status.h"

namespace inferd {

// How to make a backend instance. Settings are the backend's own (documented by its factory); a key
// it does not know, or a value outside its choices, is kInvalidArgument naming both.
struct BackendConfig {
  std::string device;     // "" = the backend's default device; else a decimal index
  int32_t threads = 0;    // host threads (the CPU backend's pool); 0 = every CPU this process may use
  std::map<std::string, std::string> settings;
};

// One configuration the backend-ops suite runs (a name for the test, and the config).
struct BackendVariant {
  std::string name;
  BackendConfig config;
  // The variant differs from an earlier one only in where activations are stored (an OpenCL storage), code
  // that every weight type shares: the suite runs it on the cases of a few weight types, not of every one.
  bool storage_only = false;
};

struct BackendFactory {
  std::string_view family;
  // Creates an instance: kNotFound when the device does not exist, kInvalidArgument for bad settings.
  std::function<Result<std::unique_ptr<Backend>>(const BackendConfig& config)> create;
  // Settings the worker reads from its environment, as setting -> variable (e.g. "numerics" ->
  // "INFERD_OPENCL_NUMERICS"): the daemon passes its environment to its workers.
  std::map<std::string, std::string> environment;
  // The configurations the backend-ops suite compares with the CPU reference.
  std::function<std::vector<BackendVariant>()> test_variants;
};

}  // namespace inferd
