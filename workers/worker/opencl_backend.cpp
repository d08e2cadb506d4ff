// The OpenCL step backend: inferd::opencl::ClEngine behind the StepBackend contract (validation,
// samplers and the position-0 reset are StepLogic's, shared with every backend). Sampling runs on the
// host over the logits rows the engine downloads. Whole models only: a pipeline stage is refused.
//
// Environment (for tests and tuning): INFERD_OPENCL_STORAGE=buffer|image_buffer|texture2d forces the
// activations' storage; the program binary cache is default_cache_dir() ($XDG_CACHE_HOME or $HOME).
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include "inferd/opencl/cl_engine.h"
#include "inferd/sampler.h"
#include "step_backend.h"
#include "step_logic.h"

namespace inferd::worker {
namespace {

using opencl::ClEngine;

class OpenClBackend final : public StepBackend {
 public:
  explicit OpenClBackend(std::unique_ptr<ClEngine> engine)
      : engine_(std::move(engine)),
        logic_({engine_->options().n_slots, engine_->options().n_ubatch, engine_->options().n_ctx, engine_->n_vocab()},
               /*samples=*/true),
        slots_{[this](int32_t s) { return engine_->slot_length(s); }, [this](int32_t s) { engine_->clear_slot(s); }} {}

  Status step(const ipc::Submission& sub, ipc::Completion& out) override {
    INFERD_RETURN_IF_ERROR(logic_.begin(sub, slots_));
    auto logits = engine_->forward(logic_.batch());
    if (!logits) return logits.status();
    logic_.sample(sub, logits.value(), out);
    return Status::ok();
  }

  std::string device() const override { return engine_->describe(); }
  uint64_t kv_bytes() const override { return engine_->stats().kv_bytes; }
  uint64_t arena_bytes() const override { return engine_->stats().activation_bytes; }

 private:
  std::unique_ptr<ClEngine> engine_;
  StepLogic logic_;
  StepLogic::Slots slots_;
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

}  // namespace

Result<std::unique_ptr<StepBackend>> make_opencl_backend(std::shared_ptr<const Model> model,
                                                         const BackendOptions& options) {
  if (options.slots < 1 || options.slots > static_cast<int32_t>(ipc::kMaxStepSeqs)) {
    return Status(Code::kInvalidArgument, "slots must be in [1, " + std::to_string(ipc::kMaxStepSeqs) + "]");
  }
  if (options.batch_tokens < 1 || options.batch_tokens > static_cast<int32_t>(ipc::kMaxStepTokens)) {
    return Status(Code::kInvalidArgument, "batch tokens must be in [1, " + std::to_string(ipc::kMaxStepTokens) + "]");
  }
  const int32_t n_layer = model->config().n_layer;
  const bool whole = options.first_layer == 0 && (options.end_layer == 0 || options.end_layer == n_layer);
  if (!whole || options.hidden_in != nullptr || options.hidden_out != nullptr) {
    return Status(Code::kUnimplemented, "the OpenCL backend runs whole models, not pipeline stages");
  }
  auto storage = storage_from_env();
  if (!storage) return storage.status();
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
  auto engine = ClEngine::create(std::move(model), std::move(runtime).value(), eo);
  if (!engine) return engine.status();
  return std::unique_ptr<StepBackend>(new OpenClBackend(std::move(engine).value()));
}

}  // namespace inferd::worker
