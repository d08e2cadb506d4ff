// step_logic.h — what every StepBackend does around its forward pass, written once: validating a
// submission, giving each sequence's slot the KV blocks the step names, starting sequences afresh (at
// position 0, or after a cached prefix: a new sampler resumed at the request's draw), building the
// engine batch, and sampling the rows that asked for a token.
// A backend supplies only the forward pass (CPU engine, OpenCL engine, ...), so the contract the
// supervisor relies on (step_backend.h) cannot drift between backends.
//
// Thread safety: one thread, the backend's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "inferd/model_runner.h"
#include "inferd/ipc/ring.h"
#include "inferd/sampler.h"
#include "inferd/status.h"

namespace inferd::worker {

class StepLogic {
 public:
  struct Limits {
    int32_t n_slots = 1;
    int32_t n_ubatch = 1;
    int32_t n_ctx = 1;
    int32_t n_vocab = 1;
    // The ids the sampler may pick, [0, n_sample) (0: n_vocab): the tokenizer's vocabulary where it is
    // smaller than the embedding (padded rows have no token, and the daemon would refuse them).
    int32_t n_sample = 0;
    int32_t n_embd = 0;  // floats per embedding (0: this stage returns none)
  };
  // The engine's view of its KV slots.
  struct Slots {
    std::function<int32_t(int32_t slot)> length;
    std::function<void(int32_t slot)> clear;
    // Gives a slot its KV blocks and its length (ModelRunner::set_slot).
    std::function<Status(int32_t slot, std::span<const int32_t> blocks, int32_t length)> assign;
  };

  // `samples`: false for a pipeline stage before the last (it keeps no samplers).
  StepLogic(Limits limits, bool samples);

  int32_t sample_vocab() const {
    return limits_.n_sample > 0 && limits_.n_sample < limits_.n_vocab ? limits_.n_sample : limits_.n_vocab;
  }

  // Validates `sub` (a malformed one is an error naming what is wrong, never a crash), gives each
  // sequence's slot the blocks it names, starts the sequences that start afresh (ipc::kSeqFresh or
  // position 0: the slot's length becomes the first token's position, a new sampler), and builds batch(),
  // with each ipc::kTokenSampled replaced by the token its slot sampled last (which it consumes).
  Status begin(const ipc::Submission& sub, const Slots& slots);
  std::span<const BatchToken> batch() const { return batch_; }

  // Adds every token of the batch to its sequence's sampling history, then samples one token per
  // row marked `logits` (`logits` holds those rows in batch order, n_vocab floats each) into `out`,
  // with its log-probabilities when the sequence asked; a sequence that asked for its embedding gets
  // its row of `embd` (n_embd floats per row, in the same order) instead of a token.
  void sample(const ipc::Submission& sub, std::span<const float> logits, std::span<const float> embd,
              ipc::Completion& out);

 private:
  Status check(const ipc::Submission& sub, const Slots& slots) const;
  void logprobs(std::span<const float> logits, uint32_t n_top, ipc::StepOutput& o, ipc::TopLogprob* top);

  Limits limits_;
  bool samples_;
  std::vector<std::optional<Sampler>> samplers_;  // per KV slot
  std::vector<int32_t> last_sampled_;             // per KV slot: sampled and not fed yet, else -1
  std::vector<BatchToken> batch_;
  std::vector<ipc::TopLogprob> heap_;  // logprobs(): the best n_top so far
};

}  // namespace inferd::worker
