// The CUDA backend's registration (backend_factory.h). Device: a decimal index (cudaGetDevice order;
// CUDA_VISIBLE_DEVICES applies). Settings, each also read from the worker's environment:
//   matmul   INFERD_CUDA_MATMUL   auto | gemv | tensor_cores (default auto: the GEMV up to 8 tokens,
//                                 tensor cores above; the forced paths are for tests and benchmarks)
// A value outside this list is kInvalidArgument naming the setting and its variable.
#include <cstdlib>
#include <string>

#include "inferd/backend_factory.h"
#include "inferd/cuda/cuda_backend.h"

namespace inferd {

namespace {

using namespace cuda;

const std::map<std::string, std::string> kEnvironment = {{"matmul", "INFERD_CUDA_MATMUL"}};
constexpr MatmulPath kPaths[] = {MatmulPath::kAuto, MatmulPath::kGemv, MatmulPath::kTensorCores};

Result<std::unique_ptr<Backend>> create(const BackendConfig& config) {
  CudaOptions o;
  for (const auto& [key, value] : config.settings) {
    if (!kEnvironment.count(key)) return Status(Code::kInvalidArgument, "the CUDA backend has no setting '" + key + "'");
    bool found = false;
    std::string expected;
    for (MatmulPath p : kPaths) {
      if (value == matmul_path_name(p)) {
        o.matmul = p;
        found = true;
      }
      expected += std::string(expected.empty() ? "" : ", ") + matmul_path_name(p);
    }
    if (!found) {
      return Status(Code::kInvalidArgument,
                    kEnvironment.at(key) + " (" + key + ") = '" + value + "': expected one of " + expected);
    }
  }
  if (!config.device.empty()) {
    char* end = nullptr;
    const long index = std::strtol(config.device.c_str(), &end, 10);
    if (end == config.device.c_str() || *end != '\0' || index < 0 || index > 1024) {
      return Status(Code::kInvalidArgument, "CUDA device '" + config.device + "': expected a device index");
    }
    o.device = static_cast<int>(index);
  }
  auto b = CudaBackend::create(o);
  if (!b) return b.status();
  return std::unique_ptr<Backend>(std::move(b).value());
}

// The backend-ops suite's configurations: the per-step choice, and each matmul path forced.
std::vector<BackendVariant> variants() {
  std::vector<BackendVariant> v;
  for (MatmulPath p : kPaths) {
    std::map<std::string, std::string> settings;
    if (p != MatmulPath::kAuto) settings["matmul"] = matmul_path_name(p);
    v.push_back({std::string("cuda_") + matmul_path_name(p), BackendConfig{"", 0, std::move(settings)}});
  }
  return v;
}

}  // namespace

const BackendFactory& cuda_backend_factory() {
  static const BackendFactory factory{"cuda", create, kEnvironment, variants};
  return factory;
}

}  // namespace inferd
