// The step backend of every worker: a ModelRunner (one model graph, on the backend the registry made)
// behind the StepBackend contract. Validation, samplers and the position-0 reset are StepLogic's; a
// pipeline stage after the first reads its hidden states from `hidden_in`, one before the last
// publishes them to `hidden_out` and samples nothing.
#include <span>
#include <utility>

#include "inferd/backend_registry.h"
#include "inferd/model_runner.h"
#include "step_backend.h"
#include "step_logic.h"

namespace inferd::worker {
namespace {

// The tokenizer's vocabulary size (tokenizer.ggml.tokens), 0 when the file has none.
int32_t vocabulary_size(const Model& model) {
  auto tokens = model.file().get_string_array("tokenizer.ggml.tokens");
  return tokens ? static_cast<int32_t>(tokens->size()) : 0;
}

class StageRunner final : public StepBackend {
 public:
  StageRunner(std::unique_ptr<ModelRunner> runner, const BackendOptions& o)
      : runner_(std::move(runner)),
        logic_({runner_->runner_options().n_slots, runner_->runner_options().n_ubatch, runner_->runner_options().n_ctx,
                runner_->n_vocab(), vocabulary_size(runner_->model()),
                runner_->is_last_stage() ? runner_->model().config().n_embd : 0},
               runner_->is_last_stage()),
        slots_{[this](int32_t s) { return runner_->slot_length(s); }, [this](int32_t s) { runner_->clear_slot(s); },
               [this](int32_t s, std::span<const int32_t> blocks, int32_t length) {
                 return runner_->set_slot(s, blocks, length);
               }},
        hidden_in_(o.hidden_in),
        hidden_out_(o.hidden_out) {}

  Status step(const ipc::Submission& sub, ipc::Completion& out) override {
    INFERD_RETURN_IF_ERROR(logic_.begin(sub, slots_));
    std::span<const float> hidden;
    if (!runner_->is_first_stage()) {
      auto rows = hidden_in_->read(sub.id, sub.n_tokens);
      if (!rows) return rows.status();
      hidden = std::span<const float>(rows.value(),
                                      size_t{sub.n_tokens} * static_cast<size_t>(runner_->model().config().n_embd));
    }
    auto result = runner_->forward(logic_.batch(), hidden);
    if (!result) return result.status();
    out.n_outputs = 0;
    if (!runner_->is_last_stage()) {  // hidden states for the next stage; nothing to sample
      hidden_out_->publish(sub.id, result.value().data(), sub.n_tokens);
      return Status::ok();
    }
    logic_.sample(sub, result.value(), runner_->embeddings(), out);
    return Status::ok();
  }

  std::string device() const override {
    const RunnerOptions& o = runner_->runner_options();
    return runner_->backend().describe() +
           (runner_->is_first_stage() && runner_->is_last_stage()
                ? ""
                : ", layers " + std::to_string(o.first_layer) + "-" + std::to_string(o.end_layer - 1));
  }
  uint64_t kv_bytes() const override { return runner_->backend().memory().kv; }
  uint64_t arena_bytes() const override { return runner_->backend().memory().activations; }
  bool healthy() const override { return runner_->backend().healthy(); }

 private:
  std::unique_ptr<ModelRunner> runner_;
  StepLogic logic_;
  StepLogic::Slots slots_;
  const ipc::HiddenExchange* hidden_in_;
  const ipc::HiddenExchange* hidden_out_;
};

// The slot count, batch size and stage boundaries a worker accepts; kInvalidArgument otherwise.
Status check_options(const Model& model, const BackendOptions& options) {
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

}  // namespace

Result<std::unique_ptr<StepBackend>> make_stage_runner(std::shared_ptr<const Model> model, const BackendFactory& factory,
                                                       const BackendOptions& options) {
  INFERD_RETURN_IF_ERROR(check_options(*model, options));
  BackendConfig config;
  config.device = options.device;
  config.threads = options.threads;
  auto backend = create_backend(factory, std::move(config));
  if (!backend) return backend.status();
  RunnerOptions ro;
  ro.n_ctx = options.context_size;
  ro.n_slots = options.slots;
  ro.n_ubatch = options.batch_tokens;
  ro.pad_step = options.pad_step;
  ro.n_blocks = options.kv_blocks;
  ro.first_layer = options.first_layer;
  ro.end_layer = options.end_layer;
  auto runner = ModelRunner::create(std::move(model), std::move(backend).value(), ro);
  if (!runner) return runner.status();
  return std::unique_ptr<StepBackend>(new StageRunner(std::move(runner).value(), options));
}

}  // namespace inferd::worker
