// The OpenCL step backend: inferd::opencl::ClEngine behind the StepBackend contract (validation,
// samplers and the position-0 reset are StepLogic's, shared with every backend). Sampling runs on the
// host over the logits rows the engine downloads. A pipeline stage works as the CPU backend's does:
// a stage after the first reads its hidden states from `hidden_in`, one before the last publishes
// them to `hidden_out` and samples nothing.
//
// Environment (for tests and tuning): INFERD_OPENCL_STORAGE=buffer|image_buffer|texture2d forces the
// activations' storage; the program binary cache is default_cache_dir() ($XDG_CACHE_HOME or $HOME).
#include <cstdlib>
#include <optional>
#include <span>
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
  OpenClBackend(std::unique_ptr<ClEngine> engine, const BackendOptions& o)
      : engine_(std::move(engine)),
        logic_({engine_->options().n_slots, engine_->options().n_ubatch, engine_->options().n_ctx, engine_->n_vocab()},
               engine_->is_last_stage()),
        slots_{[this](int32_t s) { return engine_->slot_length(s); }, [this](int32_t s) { engine_->clear_slot(s); }},
        hidden_in_(o.hidden_in),
        hidden_out_(o.hidden_out) {}

  Status step(const ipc::Submission& sub, ipc::Completion& out) override {
    INFERD_RETURN_IF_ERROR(logic_.begin(sub, slots_));
    std::span<const float> hidden;
    if (!engine_->is_first_stage()) {
      auto rows = hidden_in_->read(sub.id, sub.n_tokens);
      if (!rows) return rows.status();
      hidden = std::span<const float>(rows.value(),
                                      size_t{sub.n_tokens} * static_cast<size_t>(engine_->model().config().n_embd));
    }
    auto result = engine_->forward(logic_.batch(), hidden);
    if (!result) return result.status();
    out.n_outputs = 0;
    if (!engine_->is_last_stage()) {  // hidden states for the next stage; nothing to sample
      hidden_out_->publish(sub.id, result.value().data(), sub.n_tokens);
      return Status::ok();
    }
    logic_.sample(sub, result.value(), out);
    return Status::ok();
  }

  std::string device() const override { return engine_->describe(); }
  uint64_t kv_bytes() const override { return engine_->stats().kv_bytes; }
  uint64_t arena_bytes() const override { return engine_->stats().activation_bytes; }

 private:
  std::unique_ptr<ClEngine> engine_;
  StepLogic logic_;
  StepLogic::Slots slots_;
  const ipc::HiddenExchange* hidden_in_;
  const ipc::HiddenExchange* hidden_out_;
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
  const bool first = options.first_layer == 0;
  const bool last = options.end_layer == 0 || options.end_layer == n_layer;
  if (first != (options.hidden_in == nullptr) || last != (options.hidden_out == nullptr)) {
    return Status(Code::kInvalidArgument, "a pipeline stage needs a hidden-state exchange on each inner boundary");
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
  eo.first_layer = options.first_layer;
  eo.end_layer = options.end_layer;
  auto engine = ClEngine::create(std::move(model), std::move(runtime).value(), eo);
  if (!engine) return engine.status();
  return std::unique_ptr<StepBackend>(new OpenClBackend(std::move(engine).value(), options));
}

}  // namespace inferd::worker
