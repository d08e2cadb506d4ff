// The OpenCL step backend: inferd::opencl::ClEngine behind the StepBackend contract (validation,
// samplers and the position-0 reset are StepLogic's, shared with every backend). Sampling runs on the
// host over the logits rows the engine downloads. A pipeline stage works as the CPU backend's does:
// a stage after the first reads its hidden states from `hidden_in`, one before the last publishes
// them to `hidden_out` and samples nothing.
//
// Environment (for tests and tuning): INFERD_OPENCL_STORAGE=buffer|image_buffer|texture2d|texture3d|
// texture2d_split forces the activations' storage; INFERD_OPENCL_ACTIVATIONS=f32|f16 their data type
// (default: f16 with float numerics on a device with cl_khr_fp16); INFERD_OPENCL_NUMERICS=exact|float
// the numerics (default: exact where the device has cl_khr_fp64); INFERD_OPENCL_INT_DOT=float|int8
// forces how the exact matmuls form their int8 dot products (default: int8 where the device has
// cl_khr_integer_dot_product). A value not in these lists fails the load with a message naming the
// variable. The program binary cache is default_cache_dir() ($XDG_CACHE_HOME or $HOME).
#include <cstdlib>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "inferd/opencl/cl_engine.h"
#include "inferd/sampler.h"
#include "engine_backend.h"

namespace inferd::worker {
namespace {

using opencl::ClEngine;

class OpenClBackend final : public EngineBackend<ClEngine> {
 public:
  using EngineBackend::EngineBackend;

  std::string device() const override { return engine().describe(); }
  uint64_t kv_bytes() const override { return engine().stats().kv_bytes; }
  uint64_t arena_bytes() const override { return engine().stats().activation_bytes; }
};

// The value of environment variable `name` among `choices` (named by `name_of`); unset when the
// variable is unset or empty, kInvalidArgument naming the variable and the choices otherwise.
template <typename T, size_t N, typename NameOf>
Result<std::optional<T>> choice_from_env(const char* name, const T (&choices)[N], NameOf name_of) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::optional<T>();
  std::string expected;
  for (const T& c : choices) {
    if (std::string_view(value) == name_of(c)) return std::optional<T>(c);
    expected += std::string(expected.empty() ? "" : ", ") + name_of(c);
  }
  return Status(Code::kInvalidArgument, std::string(name) + "='" + value + "': expected one of " + expected);
}

constexpr opencl::IntDot kIntDots[] = {opencl::IntDot::kFloat, opencl::IntDot::kInt8};
constexpr opencl::Numerics kNumerics[] = {opencl::Numerics::kExact, opencl::Numerics::kFloat};

}  // namespace

Result<std::unique_ptr<StepBackend>> make_opencl_backend(std::shared_ptr<const Model> model,
                                                         const BackendOptions& options) {
  INFERD_RETURN_IF_ERROR(check_engine_backend_options(*model, options));
  auto storage = choice_from_env("INFERD_OPENCL_STORAGE", opencl::kAllStorageTypes, opencl::storage_name);
  if (!storage) return storage.status();
  auto data_type = choice_from_env("INFERD_OPENCL_ACTIVATIONS", opencl::kAllDataTypes, opencl::data_type_name);
  if (!data_type) return data_type.status();
  auto numerics = choice_from_env("INFERD_OPENCL_NUMERICS", kNumerics, opencl::numerics_name);
  if (!numerics) return numerics.status();
  auto int_dot = choice_from_env("INFERD_OPENCL_INT_DOT", kIntDots, opencl::int_dot_name);
  if (!int_dot) return int_dot.status();
  opencl::RuntimeOptions ro;
  ro.cache_dir = opencl::default_cache_dir();
  auto runtime = opencl::Runtime::create_default(ro, options.device);
  if (!runtime) return runtime.status();
  opencl::ClEngineOptions eo;
  eo.n_ctx = options.context_size;
  eo.n_slots = options.slots;
  eo.n_ubatch = options.batch_tokens;
  eo.pad_step = options.pad_step;
  eo.activation_storage = storage.value();
  eo.activation_type = data_type.value();
  if (numerics.value()) eo.numerics = *numerics.value();
  eo.int_dot = int_dot.value();
  eo.first_layer = options.first_layer;
  eo.end_layer = options.end_layer;
  auto engine = ClEngine::create(std::move(model), std::move(runtime).value(), eo);
  if (!engine) return engine.status();
  return std::unique_ptr<StepBackend>(new OpenClBackend(std::move(engine).value(), options));
}

}  // namespace inferd::worker
