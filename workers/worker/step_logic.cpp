#include "step_logic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace inferd::worker {

StepLogic::StepLogic(Limits limits, bool samples)
    : limits_(limits),
      samples_(samples),
      samplers_(static_cast<size_t>(limits.n_slots)),
      last_sampled_(static_cast<size_t>(limits.n_slots), -1) {}

Status StepLogic::check(const ipc::Submission& sub, const Slots& slots) const {
  auto bad = [](const std::string& what) { return Status(Code::kInvalidArgument, "bad submission: " + what); };
  if (sub.n_seqs == 0 || sub.n_seqs > ipc::kMaxStepSeqs) return bad(std::to_string(sub.n_seqs) + " sequences");
  if (sub.n_tokens == 0 || sub.n_tokens > ipc::kMaxStepTokens || static_cast<int32_t>(sub.n_tokens) > limits_.n_ubatch) {
    return bad(std::to_string(sub.n_tokens) + " tokens (at most " + std::to_string(limits_.n_ubatch) + ")");
  }
  std::vector<bool> slot_used(static_cast<size_t>(limits_.n_slots), false);
  uint64_t embd_floats = 0;
  for (uint32_t s = 0; s < sub.n_seqs; ++s) {
    const ipc::StepSeq& seq = sub.seqs[s];
    const uint32_t slot = seq.slot;
    if (slot >= static_cast<uint32_t>(limits_.n_slots)) return bad("slot " + std::to_string(slot));
    if (slot_used[slot]) return bad("slot " + std::to_string(slot) + " appears twice");
    slot_used[slot] = true;
    if ((seq.flags & ipc::kSeqWantLogprobs) != 0 && seq.top_logprobs > ipc::kMaxTopLogprobs) {
      return bad("slot " + std::to_string(slot) + " asks for " + std::to_string(seq.top_logprobs) + " top logprobs");
    }
    if ((seq.flags & ipc::kSeqWantEmbedding) != 0 && (seq.flags & ipc::kSeqWantToken) != 0) {
      if (samples_ && limits_.n_embd <= 0) return bad("slot " + std::to_string(slot) + " asks for an embedding");
      embd_floats += static_cast<uint64_t>(limits_.n_embd);
    }
  }
  if (embd_floats > ipc::kMaxEmbdFloats) {
    return bad("the step's embeddings need " + std::to_string(embd_floats) + " floats; a completion holds " +
               std::to_string(ipc::kMaxEmbdFloats));
  }
  if (sub.n_blocks > ipc::kMaxStepBlocks) return bad(std::to_string(sub.n_blocks) + " KV blocks");
  for (uint32_t s = 0; s < sub.n_seqs; ++s) {
    const ipc::StepSeq& seq = sub.seqs[s];
    if (seq.first_block > sub.n_blocks || seq.n_blocks > sub.n_blocks - seq.first_block) {
      return bad("slot " + std::to_string(seq.slot) + " names KV blocks past the step's " + std::to_string(sub.n_blocks));
    }
  }
  std::vector<int32_t> next_pos(sub.n_seqs, -1);
  for (uint32_t i = 0; i < sub.n_tokens; ++i) {
    const ipc::StepToken& t = sub.tokens[i];
    if (t.seq >= sub.n_seqs) return bad("token " + std::to_string(i) + " names sequence " + std::to_string(t.seq));
    const ipc::StepSeq& seq = sub.seqs[t.seq];
    const int32_t slot = static_cast<int32_t>(seq.slot);
    const bool first = next_pos[t.seq] < 0;
    const bool fresh = first && (t.pos == 0 || (seq.flags & ipc::kSeqFresh) != 0);
    if (t.pos < 0) return bad("token " + std::to_string(i) + " at position " + std::to_string(t.pos));
    if (fresh && t.pos > 0 && seq.n_blocks == 0) {
      return bad("slot " + std::to_string(slot) + " starts at position " + std::to_string(t.pos) + " without KV blocks");
    }
    if (seq.n_blocks > 0 && static_cast<int64_t>(t.pos) >= int64_t{seq.n_blocks} * graph::kKvBlockTokens) {
      return bad("slot " + std::to_string(slot) + ": position " + std::to_string(t.pos) + " is past its " +
                 std::to_string(seq.n_blocks) + " KV blocks");
    }
    if (t.token == ipc::kTokenSampled) {
      if (!samples_) return bad("token " + std::to_string(i) + " continues from a sampled token, but this stage does not sample");
      if (!first || fresh) {
        return bad("token " + std::to_string(i) + ": only a continuing sequence's first token may be the sampled one");
      }
      if (last_sampled_[static_cast<size_t>(slot)] < 0) {
        return bad("slot " + std::to_string(slot) + " has no sampled token to continue from");
      }
    } else if (t.token < 0 || t.token >= limits_.n_vocab) {
      return bad("token id " + std::to_string(t.token));
    }
    const int32_t expect = !first ? next_pos[t.seq] : (fresh ? t.pos : slots.length(slot));
    if (t.pos != expect) {
      return bad("slot " + std::to_string(slot) + ": position " + std::to_string(t.pos) + ", expected " +
                 std::to_string(expect));
    }
    if (t.pos >= limits_.n_ctx) return Status(Code::kOutOfRange, "slot " + std::to_string(slot) + " is full");
    next_pos[t.seq] = t.pos + 1;
  }
  return Status::ok();
}

Status StepLogic::begin(const ipc::Submission& sub, const Slots& slots) {
  INFERD_RETURN_IF_ERROR(check(sub, slots));
  std::vector<int32_t> first_token(sub.n_seqs, -1), last_token(sub.n_seqs, -1);
  for (uint32_t i = 0; i < sub.n_tokens; ++i) {
    const uint32_t s = sub.tokens[i].seq;
    if (first_token[s] < 0) first_token[s] = static_cast<int32_t>(i);
    last_token[s] = static_cast<int32_t>(i);
  }
  // Each slot gets the blocks its sequence names; sequences starting afresh get the length of their
  // cached prefix (0: none) and a new sampler, resumed at the request's draw.
  for (uint32_t s = 0; s < sub.n_seqs; ++s) {
    const ipc::StepSeq& seq = sub.seqs[s];
    if (first_token[s] < 0) continue;
    const int32_t slot = static_cast<int32_t>(seq.slot);
    const int32_t first_pos = sub.tokens[first_token[s]].pos;
    const bool fresh = first_pos == 0 || (seq.flags & ipc::kSeqFresh) != 0;
    if (seq.n_blocks > 0) {
      const std::span<const int32_t> blocks(sub.blocks + seq.first_block, seq.n_blocks);
      Status st = slots.assign(slot, blocks, fresh ? first_pos : slots.length(slot));
      if (!st) return Status(Code::kInvalidArgument, "bad submission: " + st.message());
    } else if (fresh) {
      slots.clear(slot);
    }
    if (fresh) {
      last_sampled_[seq.slot] = -1;
      if (!samples_) continue;
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
      Status valid = validate(p);
      if (!valid) return valid.with_context("sequence in slot " + std::to_string(seq.slot));
      auto& sampler = samplers_[seq.slot];
      sampler.emplace(p, sample_vocab());
      sampler->skip_draws(seq.n_sampled);
    } else if (samples_ && !samplers_[seq.slot]) {
      return Status(Code::kInvalidArgument, "slot " + std::to_string(seq.slot) + " continues a sequence it never started");
    }
  }
  batch_.clear();
  for (uint32_t i = 0; i < sub.n_tokens; ++i) {
    const ipc::StepToken& t = sub.tokens[i];
    const ipc::StepSeq& seq = sub.seqs[t.seq];
    const bool wants = (seq.flags & ipc::kSeqWantToken) != 0 && static_cast<int32_t>(i) == last_token[t.seq];
    int32_t token = t.token;
    if (token == ipc::kTokenSampled) token = std::exchange(last_sampled_[seq.slot], -1);  // fed once
    batch_.push_back(BatchToken{token, static_cast<int32_t>(seq.slot), t.pos, wants});
  }
  return Status::ok();
}

void StepLogic::sample(const ipc::Submission& sub, std::span<const float> logits, std::span<const float> embd,
                       ipc::Completion& out) {
  INFERD_ASSERT(samples_);
  for (const BatchToken& b : batch_) samplers_[static_cast<size_t>(b.slot)]->accept(b.token);
  const size_t n_vocab = static_cast<size_t>(limits_.n_vocab);
  const size_t n_embd = static_cast<size_t>(std::max(limits_.n_embd, 0));
  out.n_outputs = 0;
  out.n_embd_floats = 0;
  size_t row = 0;
  for (uint32_t i = 0; i < sub.n_tokens; ++i) {
    if (!batch_[i].logits) continue;
    INFERD_ASSERT((row + 1) * n_vocab <= logits.size());
    const uint32_t s = sub.tokens[i].seq;
    const ipc::StepSeq& seq = sub.seqs[s];
    const uint32_t slot = seq.slot;
    const uint32_t index = out.n_outputs++;
    ipc::StepOutput& o = out.outputs[index];
    o = {};
    o.seq = s;
    if ((seq.flags & ipc::kSeqWantEmbedding) != 0) {  // room checked by begin()
      INFERD_ASSERT((row + 1) * n_embd <= embd.size() && out.n_embd_floats + n_embd <= ipc::kMaxEmbdFloats);
      std::copy_n(embd.begin() + static_cast<std::ptrdiff_t>(row * n_embd), n_embd, out.embd + out.n_embd_floats);
      out.n_embd_floats += static_cast<uint32_t>(n_embd);
      o.token = ipc::kTokenEmbedding;
      ++row;
      continue;
    }
    const std::span<const float> row_logits = logits.subspan(row * n_vocab, static_cast<size_t>(sample_vocab()));
    o.token = samplers_[slot]->sample(row_logits);
    if ((seq.flags & ipc::kSeqWantLogprobs) != 0) logprobs(row_logits, seq.top_logprobs, o, out.top[index]);
    last_sampled_[slot] = o.token;
    ++row;
  }
}

// Log-softmax of the raw logits (the model's distribution, before penalties and temperature): the
// sampled token's value and the n_top most likely tokens' (ties: the lower id first). NaN logits count
// as -infinity, as the sampler counts them.
void StepLogic::logprobs(std::span<const float> logits, uint32_t n_top, ipc::StepOutput& o, ipc::TopLogprob* top) {
  auto value = [](float v) { return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v; };
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits) max = std::max(max, value(v));
  double sum = 0;  // float exps (each in (0, 1]), summed in double: ~3x faster than double exps, as exact
  for (float v : logits) sum += static_cast<double>(std::exp(value(v) - max));
  const double log_z = static_cast<double>(max) + std::log(sum);
  auto lp = [&](float v) { return static_cast<float>(static_cast<double>(value(v)) - log_z); };
  o.logprob = lp(logits[static_cast<size_t>(o.token)]);
  // The best n_top so far, in a heap ordered by `better`: its front is the worst of them, the one to drop.
  auto better = [](const ipc::TopLogprob& a, const ipc::TopLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
  };
  heap_.clear();
  for (size_t i = 0; i < logits.size() && n_top > 0; ++i) {
    const ipc::TopLogprob c{static_cast<int32_t>(i), value(logits[i])};
    if (heap_.size() < n_top) {
      heap_.push_back(c);
      std::push_heap(heap_.begin(), heap_.end(), better);
    } else if (better(c, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), better);
      heap_.back() = c;
      std::push_heap(heap_.begin(), heap_.end(), better);
    }
  }
  std::sort_heap(heap_.begin(), heap_.end(), better);  // best first
  o.n_top = static_cast<uint32_t>(heap_.size());
  for (size_t k = 0; k < heap_.size(); ++k) top[k] = {heap_[k].token, lp(heap_[k].logprob)};
}

}  // namespace inferd::worker
