// The OpenCL step backend: inferd::opencl::ClEngine behind the StepBackend contract, with the CPU
// backend's validation, samplers and position-0 reset (cpu_backend.cpp; the two must stay in step —
// the supervisor relies on the same contract from every backend). Sampling runs on the host over the
// logits rows the engine downloads. Whole models only: a pipeline stage is refused.
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

namespace inferd::worker {
namespace {

using opencl::ClEngine;

class OpenClBackend final : public StepBackend {
 public:
  OpenClBackend(std::unique_ptr<ClEngine> engine, const BackendOptions& o)
      : engine_(std::move(engine)), samplers_(static_cast<size_t>(o.slots)) {}

  Status step(const ipc::Submission& sub, ipc::Completion& out) override {
    INFERD_RETURN_IF_ERROR(check_submission(sub));
    const int32_t n_vocab = engine_->n_vocab();

    // Sequences starting afresh get a clean slot and a new sampler.
    batch_.clear();
    std::vector<int32_t> first_token(sub.n_seqs, -1), last_token(sub.n_seqs, -1);
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      const uint32_t s = sub.tokens[i].seq;
      if (first_token[s] < 0) first_token[s] = static_cast<int32_t>(i);
      last_token[s] = static_cast<int32_t>(i);
    }
    for (uint32_t s = 0; s < sub.n_seqs; ++s) {
      const ipc::StepSeq& seq = sub.seqs[s];
      if (first_token[s] < 0) continue;
      if (sub.tokens[first_token[s]].pos == 0) {
        engine_->clear_slot(static_cast<int32_t>(seq.slot));
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
      } else if (!samplers_[seq.slot]) {
        return Status(Code::kInvalidArgument, "slot " + std::to_string(seq.slot) + " continues a sequence it never started");
      }
    }
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      const ipc::StepToken& t = sub.tokens[i];
      const ipc::StepSeq& seq = sub.seqs[t.seq];
      const bool wants = (seq.flags & ipc::kSeqWantToken) != 0 && static_cast<int32_t>(i) == last_token[t.seq];
      batch_.push_back(BatchToken{t.token, static_cast<int32_t>(seq.slot), t.pos, wants});
    }
    auto logits = engine_->forward(batch_);
    if (!logits) return logits.status();
    out.n_outputs = 0;
    for (const BatchToken& b : batch_) samplers_[static_cast<size_t>(b.slot)]->accept(b.token);

    size_t row = 0;
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      if (!batch_[i].logits) continue;
      const uint32_t s = sub.tokens[i].seq;
      auto& sampler = samplers_[sub.seqs[s].slot];
      const std::span<const float> l =
          logits.value().subspan(row * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab));
      ++row;
      ipc::StepOutput& o = out.outputs[out.n_outputs++];
      o = {};
      o.seq = s;
      o.token = sampler->sample(l);
    }
    return Status::ok();
  }

  std::string device() const override { return engine_->describe(); }
  uint64_t kv_bytes() const override { return engine_->stats().kv_bytes; }
  uint64_t arena_bytes() const override { return engine_->stats().activation_bytes; }

 private:
  Status check_submission(const ipc::Submission& sub) const {
    const opencl::ClEngineOptions& o = engine_->options();
    auto bad = [](const std::string& what) { return Status(Code::kInvalidArgument, "bad submission: " + what); };
    if (sub.n_seqs == 0 || sub.n_seqs > ipc::kMaxStepSeqs) return bad(std::to_string(sub.n_seqs) + " sequences");
    if (sub.n_tokens == 0 || sub.n_tokens > ipc::kMaxStepTokens || static_cast<int32_t>(sub.n_tokens) > o.n_ubatch) {
      return bad(std::to_string(sub.n_tokens) + " tokens (at most " + std::to_string(o.n_ubatch) + ")");
    }
    std::vector<bool> slot_used(static_cast<size_t>(o.n_slots), false);
    for (uint32_t s = 0; s < sub.n_seqs; ++s) {
      const uint32_t slot = sub.seqs[s].slot;
      if (slot >= static_cast<uint32_t>(o.n_slots)) return bad("slot " + std::to_string(slot));
      if (slot_used[slot]) return bad("slot " + std::to_string(slot) + " appears twice");
      slot_used[slot] = true;
    }
    std::vector<int32_t> next_pos(sub.n_seqs, -1);
    for (uint32_t i = 0; i < sub.n_tokens; ++i) {
      const ipc::StepToken& t = sub.tokens[i];
      if (t.seq >= sub.n_seqs) return bad("token " + std::to_string(i) + " names sequence " + std::to_string(t.seq));
      if (t.token < 0 || t.token >= engine_->n_vocab()) return bad("token id " + std::to_string(t.token));
      const int32_t slot = static_cast<int32_t>(sub.seqs[t.seq].slot);
      const int32_t expect = next_pos[t.seq] >= 0 ? next_pos[t.seq] : (t.pos == 0 ? 0 : engine_->slot_length(slot));
      if (t.pos != expect) {
        return bad("slot " + std::to_string(slot) + ": position " + std::to_string(t.pos) + ", expected " +
                   std::to_string(expect));
      }
      if (t.pos >= o.n_ctx) return Status(Code::kOutOfRange, "slot " + std::to_string(slot) + " is full");
      next_pos[t.seq] = t.pos + 1;
    }
    return Status::ok();
  }

  std::unique_ptr<ClEngine> engine_;
  std::vector<std::optional<Sampler>> samplers_;
  std::vector<BatchToken> batch_;
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
  return std::unique_ptr<StepBackend>(new OpenClBackend(std::move(engine).value(), options));
}

}  // namespace inferd::worker
