// engine_backend.h (private) — what the CPU and OpenCL step backends share: the options both check, and
// the step of an engine that runs a whole model or one pipeline stage of it (StepLogic's validation and
// sampling; a stage after the first reads its hidden states from `hidden_in`, one before the last
// publishes them to `hidden_out` and samples nothing).
//
// EngineT is inferd::Engine or inferd::opencl::ClEngine: options() (n_slots, n_ubatch, n_ctx), n_vocab(),
// model(), slot_length(), clear_slot(), is_first_stage(), is_last_stage(), forward(batch, hidden_in).
// Thread safety: one owner, like StepBackend.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>

#include "inferd/model.h"
#include "step_backend.h"
#include "step_logic.h"

namespace inferd::worker {

// The slot count, batch size and stage boundaries every engine backend accepts; kInvalidArgument otherwise.
inline Status check_engine_backend_options(const Model& model, const BackendOptions& options) {
  if (options.slots < 1 || options.slots > static_cast<int32_t>(ipc::kMaxStepSeqs)) {
    return Status(Code::kInvalidArgument, "slots must be in [1, " + std::to_string(ipc::kMaxStepSeqs) + "]");
  }
  if (options.batch_tokens < 1 || options.batch_tokens > static_cast<int32_t>(ipc::kMaxStepTokens)) {
    return Status(Code::kInvalidArgument, "batch tokens must be in [1, " + std::to_string(ipc::kMaxStepTokens) + "]");
  }
  const int32_t n_layer = model.config().n_layer;
  const bool first = options.first_layer == 0;
  const bool last = options.end_layer == 0 || options.end_layer == n_layer;
  if (first != (options.hidden_in == nullptr) || last != (options.hidden_out == nullptr)) {
    return Status(Code::kInvalidArgument, "a pipeline stage needs a hidden-state exchange on each inner boundary");
  }
  return Status::ok();
}

template <typename EngineT>
class EngineBackend : public StepBackend {
 public:
  EngineBackend(std::unique_ptr<EngineT> engine, const BackendOptions& o)
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

 protected:
  const EngineT& engine() const { return *engine_; }

 private:
  std::unique_ptr<EngineT> engine_;
  StepLogic logic_;
  StepLogic::Slots slots_;
  const ipc::HiddenExchange* hidden_in_;
  const ipc::HiddenExchange* hidden_out_;
};

}  // namespace inferd::worker
