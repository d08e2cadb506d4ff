// The OpenCL step backend: inferd::opencl::ClEngine behind the StepBackend contract (validation,
// samplers and the position-0 reset are StepLogic's, shared with every backend). Sampling runs on the
// host over the logits rows the engine downloads. A pipeline stage works as the CPU backend's does:
// a stage after the first reads its hidden states from `hidden_in`, one before the last publishes
// them to `hidden_out` and samples nothing.
//
// Environment (for tests and tuning): INFERD_OPENCL_STORAGE=buffer|image_buffer|texture2d forces the
// activations' storage; INFERD_OPENCL_INT_DOT=float|int8 forces how the exact matmuls form their int8
// dot products (default: int8 where the device has cl_khr_integer_dot_product); the program binary
// cache is default_cache_dir() ($XDG_CACHE_HOME or $HOME).
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

Result<std::optional<opencl::StorageType>> storage_from_env() {
  const char* value = std::getenv("INFERD_OPENCL_STORAGE");
  if (value == nullptr || *value == '\0') return std::optional<opencl::StorageType>();
  for (opencl::StorageType s : opencl::kAllStorageTypes) {
    if (std::string_view(value) == opencl::storage_name(s)) return std::optional<opencl::StorageType>(s);
  }
  return Status(Code::kInvalidArgument,
                std::string("INFERD_OPENCL_STORAGE='") + value + "': expected buffer, image_buffer or texture2d");
}

Result<std::optional<opencl::IntDot>> int_dot_from_env() {
  const char* value = std::getenv("INFERD_OPENCL_INT_DOT");
  if (value == nullptr || *value == '\0') return std::optional<opencl::IntDot>();
  for (opencl::IntDot d : {opencl::IntDot::kFloat, opencl::IntDot::kInt8}) {
    if (std::string_view(value) == opencl::int_dot_name(d)) return std::optional<opencl::IntDot>(d);
  }
  return Status(Code::kInvalidArgument, std::string("INFERD_OPENCL_INT_DOT='") + value + "': expected float or int8");
}

}  // namespace

Result<std::unique_ptr<StepBackend>> make_opencl_backend(std::shared_ptr<const Model> model,
                                                         const BackendOptions& options) {
  INFERD_RETURN_IF_ERROR(check_engine_backend_options(*model, options));
  auto storage = storage_from_env();
  if (!storage) return storage.status();
  auto int_dot = int_dot_from_env();
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
  eo.int_dot = int_dot.value();
  eo.first_layer = options.first_layer;
  eo.end_layer = options.end_layer;
  auto engine = ClEngine::create(std::move(model), std::move(runtime).value(), eo);
  if (!engine) return engine.status();
  return std::unique_ptr<StepBackend>(new OpenClBackend(std::move(engine).value(), options));
}

}  // namespace inferd::worker
