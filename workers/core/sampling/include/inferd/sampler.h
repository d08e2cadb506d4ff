// inferd/sampler.h — turns a step's logits into the next token.
//
// The chain follows llama.cpp's default order: penalties -> top-k -> top-p -> min-p -> temperature -> softmax
// -> draw. The draw uses our own RNG (xoshiro256** seeded through splitmix64), so a seed gives the same tokens
// with every standard library (barring last-bit differences between platforms' exp()); the filters order ties by (logit descending, token id ascending), so the
// surviving set never depends on how a library's sort or nth_element permutes equal elements.
//
// Thread safety: a Sampler belongs to one sequence and is not thread-safe; distinct Samplers are independent.
// validate() is a pure function.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "inferd/rng.h"
#include "inferd/status.h"

namespace inferd {

struct SamplingParams {
  float temperature = 0.8f;        // [0, 100]; 0 = greedy (argmax; ties -> lowest id)
  int32_t top_k = 40;              // <= 0 or >= n_vocab: disabled
  float top_p = 0.95f;             // (0, 1]; 1 = disabled
  float min_p = 0.05f;             // [0, 1); 0 = disabled
  float repeat_penalty = 1.0f;     // (0, 100]; 1 = disabled
  int32_t repeat_last_n = 64;      // penalty window in tokens; 0 = no penalties, -1 = the whole history
  float frequency_penalty = 0.0f;  // [-2, 2], as OpenAI: logit -= count * frequency_penalty
  float presence_penalty = 0.0f;   // [-2, 2], as OpenAI: logit -= presence_penalty if count > 0
  uint64_t seed = kSeedFromClock;

  static constexpr uint64_t kSeedFromClock = 0xFFFFFFFFFFFFFFFFull;
};

// Rejects NaN, infinities and out-of-range values with Code::kInvalidArgument and a message naming the field
// and its allowed range, e.g. "top_p must be in (0, 1], got 1.5".
Status validate(const SamplingParams& p);

// The tokens before a sampled position that the sampler's penalty history holds: 0 when no penalty is
// active (the history is not kept), repeat_last_n, or -1 for the whole history.
inline int32_t penalty_window(const SamplingParams& p) {
  const bool penalties = p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  return penalties ? p.repeat_last_n : 0;
}

// A token and its probability in the final distribution the sampler draws from.
struct TokenProb {
  int32_t id;
  float p;
};

class Sampler {
 public:
  // Preconditions: validate(p).is_ok(), n_vocab >= 1. With seed == kSeedFromClock a seed is taken from the
  // clock; seed() reports it so that a run can be replayed.
  Sampler(const SamplingParams& p, int32_t n_vocab);

  // Draws a token from logits (n_vocab values, never modified). Does not add it to the history: call
  // accept(). NaN logits count as -infinity. With temperature 0 this is an argmax over the penalized logits
  // that allocates nothing; otherwise it consumes exactly one random number.
  int32_t sample(std::span<const float> logits);

  // The distribution sample() would draw from for these logits, in the order the draw walks it (a function
  // of the logits, the history and the params only). Greedy: the argmax with p = 1. Consumes no random
  // numbers. For tests, diagnostics and per-token log-probabilities.
  std::vector<TokenProb> distribution(std::span<const float> logits);

  // Adds a token to the penalty history. Call it for the prompt tokens too. Precondition: 0 <= token < n_vocab.
  void accept(int32_t token);

  // Forgets the history and restarts the random sequence from seed().
  void reset();

  // Advances the random sequence as if `n` tokens had been sampled (greedy sampling draws nothing, so
  // it is a no-op there). A sequence replayed on a restarted worker resumes its random sequence where
  // it stopped, so the replay produces the tokens the uninterrupted run would have.
  void skip_draws(uint64_t n);

  uint64_t seed() const { return seed_; }
  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    float logit;   // penalized
    float weight;  // unnormalized probability, once a stage has computed it
    int32_t id;
  };

  float penalized(int32_t id, float logit) const;
  int32_t greedy(std::span<const float> logits) const;
  // Runs penalties and the filters; leaves the survivors (as temperature-scaled, unnormalized weights) in
  // cand_[0, n) and returns n. *sum receives the sum of the weights.
  size_t build_distribution(std::span<const float> logits, double* sum);

  SamplingParams params_;
  int32_t n_vocab_;
  uint64_t seed_;
  Rng rng_;
  std::vector<Candidate> cand_;  // scratch, n_vocab entries; empty in greedy mode
  std::vector<Candidate> heap_;  // scratch for a small top-k

  // Penalty history: counts_ per token over the window, and the distinct tokens with a nonzero count.
  bool track_history_;
  std::vector<int32_t> counts_;
  std::vector<int32_t> active_;      // tokens with counts_ > 0, unordered
  std::vector<int32_t> active_pos_;  // index of each token in active_, or -1
  std::vector<int32_t> window_;      // ring of the last repeat_last_n tokens (unused for -1)
  size_t window_next_ = 0;
  size_t window_fill_ = 0;
};

}  // namespace inferd
