// The CPU step backend: the engine (workers/engine) behind the StepBackend contract.

#include "inferd/engine.h"
#include "inferd/kernels/cpu.h"
#include "inferd/sampler.h"
#include "step_backend.h"
#include "step_logic.h"

namespace inferd::worker {
namespace {

class CpuBackend final : public StepBackend {
 public:
  CpuBackend(std::unique_ptr<Engine> engine, const BackendOptions& o)
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
      hidden = std::span<const float>(rows.value(), size_t{sub.n_tokens} * static_cast<size_t>(engine_->model().config().n_embd));
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

  std::string device() const override {
    const EngineOptions& o = engine_->options();
    std::string layers = engine_->is_first_stage() && engine_->is_last_stage()
                             ? ""
                             : ", layers " + std::to_string(o.first_layer) + "-" + std::to_string(o.end_layer - 1);
    return std::string("CPU (") + kernels::isa_name(kernels::best_isa()) + "), " + std::to_string(o.n_threads) +
           " threads" + layers;
  }
  uint64_t kv_bytes() const override { return engine_->stats().kv_bytes; }
  uint64_t arena_bytes() const override { return engine_->stats().arena_bytes; }

 private:
  std::unique_ptr<Engine> engine_;
  StepLogic logic_;
  StepLogic::Slots slots_;
  const ipc::HiddenExchange* hidden_in_;
  const ipc::HiddenExchange* hidden_out_;
};

}  // namespace

Result<std::unique_ptr<StepBackend>> make_cpu_backend(std::shared_ptr<const Model> model, const BackendOptions& options) {
  EngineOptions eo;
  eo.n_ctx = options.context_size;
  eo.n_slots = options.slots;
  eo.n_threads = options.threads;
  eo.n_ubatch = options.batch_tokens;
  eo.pad_step = options.pad_step;
  eo.first_layer = options.first_layer;
  eo.end_layer = options.end_layer;
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
  auto engine = Engine::create(std::move(model), eo);
  if (!engine) return engine.status();
  return std::unique_ptr<StepBackend>(new CpuBackend(std::move(engine).value(), options));
}

}  // namespace inferd::worker
