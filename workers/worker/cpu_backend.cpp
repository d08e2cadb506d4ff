// The CPU step backend: the engine (workers/engine) behind the StepBackend contract.
#include <optional>
#include <vector>

#include "inferd/engine.h"
#include "inferd/kernels/cpu.h"
#include "inferd/sampler.h"
#include "step_backend.h"

namespace inferd::worker {
namespace {

class CpuBackend final : public StepBackend {
 public:
  CpuBackend(std::unique_ptr<Engine> engine, const BackendOptions& o)
      : engine_(std::move(engine)), samplers_(static_cast<size_t>(o.slots)), hidden_in_(o.hidden_in),
        hidden_out_(o.hidden_out) {}

  Status step(const ipc::Submission& sub, ipc::Completion& out) override {
    INFERD_RETURN_IF_ERROR(check_submission(sub));
    const int32_t n_vocab = engine_->n_vocab();

    // Sequences starting afresh get a clean slot and a new sampler.
    batch_.clear();
    std::vector<int32_t> first_token(sub.n_seqs, -1), last_token(sub.n_seqs, -1);
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      uint32_t s = sub.tokens[i].seq;
      if (first_token[s] < 0) first_token[s] = static_cast<int32_t>(i);
      last_token[s] = static_cast<int32_t>(i);
    }
    const bool last = engine_->is_last_stage();
    for (uint32_t s = 0; s < sub.n_seqs; ++s) {
      const ipc::StepSeq& seq = sub.seqs[s];
      if (first_token[s] < 0) continue;
      if (sub.tokens[first_token[s]].pos == 0) {
        engine_->clear_slot(static_cast<int32_t>(seq.slot));
        if (!last) continue;  // only the last stage samples
        SamplingParams p;
        p.temperature = seq.temperature;
        p.top_k = seq.top_k;
        p.top_p = seq.top_p;
        p.min_p = seq.min_p;
        p.repeat_penalty = seq.repeat_penalty;
        p.repeat_last_n = seq.repeat_last_n;
        p.frequency_penalty = seq.frequency_penalty;
        p.presence_penalty = seq.presence_penalty;
        p.seed = seq.seed;
        Status valid = inferd::validate(p);
        if (!valid) return valid.with_context("sequence in slot " + std::to_string(seq.slot));
        auto& sampler = samplers_[seq.slot];
        sampler.emplace(p, n_vocab);
        sampler->skip_draws(seq.n_sampled);
      } else if (last && !samplers_[seq.slot]) {
        return Status(Code::kInvalidArgument, "slot " + std::to_string(seq.slot) + " continues a sequence it never started");
      }
    }
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      const ipc::StepToken& t = sub.tokens[i];
      const ipc::StepSeq& seq = sub.seqs[t.seq];
      bool wants = (seq.flags & ipc::kSeqWantToken) != 0 && static_cast<int32_t>(i) == last_token[t.seq];
      batch_.push_back(BatchToken{t.token, static_cast<int32_t>(seq.slot), t.pos, wants});
    }
    std::span<const float> hidden;
    if (!engine_->is_first_stage()) {
      auto rows = hidden_in_->read(sub.id, sub.n_tokens);
      if (!rows) return rows.status();
      hidden = std::span<const float>(rows.value(), size_t{sub.n_tokens} * static_cast<size_t>(engine_->model().config().n_embd));
    }
    auto logits = engine_->forward(batch_, hidden);
    if (!logits) return logits.status();
    out.n_outputs = 0;
    if (!last) {
      hidden_out_->publish(sub.id, logits.value().data(), sub.n_tokens);
      return Status::ok();
    }
    for (const BatchToken& b : batch_) samplers_[static_cast<size_t>(b.slot)]->accept(b.token);

    size_t row = 0;
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      if (!batch_[i].logits) continue;
      const uint32_t s = sub.tokens[i].seq;
      auto& sampler = samplers_[sub.seqs[s].slot];
      std::span<const float> l = logits.value().subspan(row * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab));
      ++row;
      ipc::StepOutput& o = out.outputs[out.n_outputs++];
      o = {};
      o.seq = s;
      o.token = sampler->sample(l);
    }
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
  Status check_submission(const ipc::Submission& sub) const {
    const EngineOptions& o = engine_->options();
    auto bad = [](const std::string& what) { return Status(Code::kInvalidArgument, "bad submission: " + what); };
    if (sub.n_seqs == 0 || sub.n_seqs > ipc::kMaxStepSeqs) return bad(std::to_string(sub.n_seqs) + " sequences");
    if (sub.n_tokens == 0 || sub.n_tokens > ipc::kMaxStepTokens || static_cast<int32_t>(sub.n_tokens) > o.n_ubatch) {
      return bad(std::to_string(sub.n_tokens) + " tokens (at most " + std::to_string(o.n_ubatch) + ")");
    }
    std::vector<bool> slot_used(static_cast<size_t>(o.n_slots), false);
    for (uint32_t s = 0; s < sub.n_seqs; ++s) {
      uint32_t slot = sub.seqs[s].slot;
      if (slot >= static_cast<uint32_t>(o.n_slots)) return bad("slot " + std::to_string(slot));
      if (slot_used[slot]) return bad("slot " + std::to_string(slot) + " appears twice");
      slot_used[slot] = true;
    }
    std::vector<int32_t> next_pos(sub.n_seqs, -1);
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      const ipc::StepToken& t = sub.tokens[i];
      if (t.seq >= sub.n_seqs) return bad("token " + std::to_string(i) + " names sequence " + std::to_string(t.seq));
      if (t.token < 0 || t.token >= engine_->n_vocab()) return bad("token id " + std::to_string(t.token));
      int32_t slot = static_cast<int32_t>(sub.seqs[t.seq].slot);
      int32_t expect = next_pos[t.seq] >= 0 ? next_pos[t.seq] : (t.pos == 0 ? 0 : engine_->slot_length(slot));
      if (t.pos != expect) {
        return bad("slot " + std::to_string(slot) + ": position " + std::to_string(t.pos) + ", expected " +
                   std::to_string(expect));
      }
      if (t.pos >= o.n_ctx) return Status(Code::kOutOfRange, "slot " + std::to_string(slot) + " is full");
      next_pos[t.seq] = t.pos + 1;
    }
    return Status::ok();
  }

  std::unique_ptr<Engine> engine_;
  std::vector<std::optional<Sampler>> samplers_;
  std::vector<BatchToken> batch_;
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
