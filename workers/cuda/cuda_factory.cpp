// The CUDA backend's registration (backend_factory.h). Device: a decimal index (cudaGetDevice order;
// CUDA_VISIBLE_DEVICES applies). Settings, each also read from the worker's environment:
//   matmul       INFERD_CUDA_MATMUL       gemv | tensor_cores (default gemv: float; tensor cores read fp16
//                                         tiles; either serves every step)
//   activations  INFERD_CUDA_ACTIVATIONS  float | q8 (default q8 with float numerics and the GEMV, else
//                                         float; q8: matmul inputs quantized as the CPU engine quantizes
//                                         them, Q4_0/Q4_1/Q8_0/Q4_K rows dotted with them in integers)
//   numerics     INFERD_CUDA_NUMERICS     exact | float (default: exact, unless tensor_cores or q8 is set
//                                         or the host's CPU engine runs its scalar kernels; exact: the CPU
//                                         engine's arithmetic, logits equal to its bit for bit)
//   graphs       INFERD_CUDA_GRAPHS       on | off (default on: steps of up to 16 tokens replay a CUDA
//                                         graph captured once per shape)
//   fuse         INFERD_CUDA_FUSE         on | off (default on: decode steps launch fused GEMVs for Q/K/V
//                                         and gate/up + SwiGLU/GeGLU; float numerics)
//   split_attention INFERD_CUDA_SPLIT_ATTENTION on | off (default on: float numerics' attention split
//                                         over the positions and merged; off: a thread block per head)
//   q6k_integer  INFERD_CUDA_Q6K_INTEGER  on | off (default off: Q6_K rows take the float-input GEMV; on: the
//                                         integer GEMV with 8-bit inputs reads them too; with q8 activations)
// A value outside these lists is kInvalidArgument naming the setting and its variable.
#include <cstdlib>
#include <string>

#include "inferd/backend_factory.h"
#include "inferd/cuda/cuda_backend.h"

namespace inferd {

namespace {

using namespace cuda;

const std::map<std::string, std::string> kEnvironment = {{"matmul", "INFERD_CUDA_MATMUL"},
                                                         {"activations", "INFERD_CUDA_ACTIVATIONS"},
                                                         {"numerics", "INFERD_CUDA_NUMERICS"},
                                                         {"graphs", "INFERD_CUDA_GRAPHS"},
                                                         {"fuse", "INFERD_CUDA_FUSE"},
                                                         {"split_attention", "INFERD_CUDA_SPLIT_ATTENTION"},
                                                         {"q6k_integer", "INFERD_CUDA_Q6K_INTEGER"}};
constexpr MatmulPath kPaths[] = {MatmulPath::kGemv, MatmulPath::kTensorCores};
constexpr Activations kActivations[] = {Activations::kFloat, Activations::kQ8};
constexpr Numerics kNumerics[] = {Numerics::kFloat, Numerics::kExact};

template <typename T, size_t N, typename NameOf>
bool pick(const std::string& value, const T (&choices)[N], NameOf name_of, T* out, std::string* expected) {
  for (const T& c : choices) {
    if (value == name_of(c)) {
      *out = c;
      return true;
    }
    *expected += std::string(expected->empty() ? "" : ", ") + name_of(c);
  }
  return false;
}

Result<std::unique_ptr<Backend>> create(const BackendConfig& config) {
  CudaOptions o;
  Numerics numerics = Numerics::kExact;
  Activations activations = Activations::kFloat;
  for (const auto& [key, value] : config.settings) {
    if (!kEnvironment.count(key)) return Status(Code::kInvalidArgument, "the CUDA backend has no setting '" + key + "'");
    std::string expected;
    if (key == "graphs" || key == "fuse" || key == "split_attention" || key == "q6k_integer") {
      if (value != "on" && value != "off") {
        return Status(Code::kInvalidArgument,
                      kEnvironment.at(key) + " (" + key + ") = '" + value + "': expected one of on, off");
      }
      (key == "graphs"            ? o.graphs
       : key == "fuse"            ? o.fuse
       : key == "split_attention" ? o.split_attention
                                  : o.q6k_integer) = value == "on";
      continue;
    }
    const bool found = key == "matmul"        ? pick(value, kPaths, matmul_path_name, &o.matmul, &expected)
                       : key == "activations" ? pick(value, kActivations, activations_name, &activations, &expected)
                                              : pick(value, kNumerics, numerics_name, &numerics, &expected);
    if (found && key == "numerics") o.numerics = numerics;
    if (found && key == "activations") o.activations = activations;
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

// The backend-ops suite's configurations: each matmul path, quantized matmul inputs, exact numerics.
std::vector<BackendVariant> variants() {
  std::vector<BackendVariant> v;
  for (MatmulPath p : kPaths) {
    v.push_back({std::string("cuda_") + matmul_path_name(p),
                 BackendConfig{"", 0, {{"numerics", "float"}, {"matmul", matmul_path_name(p)}, {"activations", "float"}}}});
  }
  v.push_back({"cuda_q8", BackendConfig{"", 0, {{"numerics", "float"}, {"activations", "q8"}}}});
  v.push_back({"cuda_unsplit_attention", BackendConfig{"", 0, {{"numerics", "float"}, {"split_attention", "off"}}}});
  v.push_back({"cuda_exact", BackendConfig{"", 0, {{"numerics", "exact"}}}});
  v.push_back({"cuda_exact_nograph", BackendConfig{"", 0, {{"numerics", "exact"}, {"graphs", "off"}}}});
  return v;
}

}  // namespace

const BackendFactory& cuda_backend_factory() {
  static const BackendFactory factory{"cuda", create, kEnvironment, variants};
  return factory;
}

}  // namespace inferd
