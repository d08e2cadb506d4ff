#include "inferd/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace inferd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Above this k, top-k uses nth_element; at or below it, one pass with a k-entry heap, which for a 50k-150k
// vocab costs little more than a comparison per token.
constexpr int32_t kHeapTopKLimit = 256;

template <typename C>
float max_of(const C* c, size_t n) {
  float m = kNegInf;
  for (size_t i = 0; i < n; ++i) m = std::max(m, c[i].logit);
  return m;
}

// Segments this short are finished by insertion sort in select_top_p().
constexpr size_t kSelectSortLimit = 16;

// Stable compaction of c[0, n) to the entries with logit >= floor; returns their count.
template <typename C>
size_t keep_at_least(C* c, size_t n, float floor) {
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (c[i].logit >= floor) c[kept++] = c[i];
  }
  return kept;
}

// Top-p without sorting: a quickselect on probability mass. Rearranges c[0, n) so that c[0, cut) holds the
// fewest best entries (under `better`) whose weights sum to at least `need`, and returns cut (n if all of
// them fall short). Expected O(n). The partitioning is our own code, so the resulting order, which the draw
// walks, is the same with every standard library.
template <typename C, typename Better>
size_t select_top_p(C* c, size_t n, double need, const Better& better) {
  size_t lo = 0, hi = n;
  // Invariant: c[0, lo) are better than c[lo, n) and weigh less than the original need; `need` is what
  // remains to be found in c[lo, hi), and everything from hi on is worse than c[lo, hi).
  while (hi - lo > kSelectSortLimit) {
    const size_t mid = lo + (hi - lo) / 2;
    if (better(c[mid], c[lo])) std::swap(c[mid], c[lo]);
    if (better(c[hi - 1], c[lo])) std::swap(c[hi - 1], c[lo]);
    if (better(c[hi - 1], c[mid])) std::swap(c[hi - 1], c[mid]);
    std::swap(c[mid], c[hi - 1]);  // the median of three is the pivot, parked at the end
    const C pivot = c[hi - 1];
    size_t store = lo;
    double mass = 0.0;
    for (size_t j = lo; j < hi - 1; ++j) {
      if (better(c[j], pivot)) {
        mass += c[j].weight;
        std::swap(c[store++], c[j]);
      }
    }
    std::swap(c[store], c[hi - 1]);
    if (mass >= need) {
      hi = store;
      continue;
    }
    mass += c[store].weight;
    if (mass >= need) return store + 1;
    need -= mass;
    lo = store + 1;
  }
  for (size_t i = lo + 1; i < hi; ++i) {  // insertion sort of the short rest
    const C x = c[i];
    size_t j = i;
    for (; j > lo && better(x, c[j - 1]); --j) c[j] = c[j - 1];
    c[j] = x;
  }
  for (size_t i = lo; i < hi; ++i) {
    need -= c[i].weight;
    if (need <= 0.0) return i + 1;
  }
  return hi;  // only rounding (or a set that cannot reach the target) gets here
}

bool in_closed(float v, float lo, float hi) { return v >= lo && v <= hi; }  // false for NaN

Status range_error(const char* field, const char* range, float got) {
  return make_error(Code::kInvalidArgument, "%s must be in %s, got %g", field, range, static_cast<double>(got));
}

uint64_t seed_from_clock() {
  uint64_t state = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
                   (static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) << 1);
  uint64_t seed = Rng::splitmix64(&state);
  if (seed == SamplingParams::kSeedFromClock) seed ^= 1;
  return seed;
}

}  // namespace

Status validate(const SamplingParams& p) {
  if (!in_closed(p.temperature, 0.0f, 100.0f)) return range_error("temperature", "[0, 100]", p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return range_error("top_p", "(0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) return range_error("min_p", "[0, 1)", p.min_p);
  if (!(p.repeat_penalty > 0.0f && p.repeat_penalty <= 100.0f)) {
    return range_error("repeat_penalty", "(0, 100]", p.repeat_penalty);
  }
  if (p.repeat_last_n < -1) {
    return make_error(Code::kInvalidArgument, "repeat_last_n must be >= -1, got %d", p.repeat_last_n);
  }
  if (!in_closed(p.frequency_penalty, -2.0f, 2.0f)) {
    return range_error("frequency_penalty", "[-2, 2]", p.frequency_penalty);
  }
  if (!in_closed(p.presence_penalty, -2.0f, 2.0f)) {
    return range_error("presence_penalty", "[-2, 2]", p.presence_penalty);
  }
  return Status::ok();
}

Sampler::Sampler(const SamplingParams& p, int32_t n_vocab)
    : params_(p),
      n_vocab_(n_vocab),
      seed_(p.seed == SamplingParams::kSeedFromClock ? seed_from_clock() : p.seed),
      rng_(seed_) {
  INFERD_ASSERT(validate(p).is_ok(), "Sampler built from invalid params: call validate() first");
  INFERD_ASSERT(n_vocab >= 1);
  const auto n = static_cast<size_t>(n_vocab);
  if (p.temperature > 0.0f) {
    cand_.resize(n);
    if (p.top_k > 0 && p.top_k <= kHeapTopKLimit) heap_.reserve(static_cast<size_t>(p.top_k));
  }
  track_history_ = penalty_window(p) != 0;
  if (track_history_) {
    counts_.assign(n, 0);
    active_pos_.assign(n, -1);
    if (p.repeat_last_n > 0) window_.resize(static_cast<size_t>(p.repeat_last_n));
  }
}

void Sampler::accept(int32_t token) {
  INFERD_ASSERT(token >= 0 && token < n_vocab_, "token id out of range");
  if (!track_history_) return;
  if (!window_.empty()) {
    if (window_fill_ == window_.size()) {
      const int32_t old = window_[window_next_];
      if (--counts_[static_cast<size_t>(old)] == 0) {
        const int32_t pos = active_pos_[static_cast<size_t>(old)];
        const int32_t moved = active_.back();
        active_[static_cast<size_t>(pos)] = moved;
        active_pos_[static_cast<size_t>(moved)] = pos;
        active_.pop_back();
        active_pos_[static_cast<size_t>(old)] = -1;
      }
    } else {
      ++window_fill_;
    }
    window_[window_next_] = token;
    window_next_ = (window_next_ + 1) % window_.size();
  }
  if (counts_[static_cast<size_t>(token)]++ == 0) {
    active_pos_[static_cast<size_t>(token)] = static_cast<int32_t>(active_.size());
    active_.push_back(token);
  }
}

void Sampler::skip_draws(uint64_t n) {
  if (params_.temperature <= 0.0f) return;
  for (uint64_t i = 0; i < n; ++i) rng_.next_u64();
}

void Sampler::reset() {
  rng_.reseed(seed_);
  if (!track_history_) return;
  for (int32_t t : active_) {
    counts_[static_cast<size_t>(t)] = 0;
    active_pos_[static_cast<size_t>(t)] = -1;
  }
  active_.clear();
  window_next_ = 0;
  window_fill_ = 0;
}

float Sampler::penalized(int32_t id, float logit) const {
  const int32_t count = counts_[static_cast<size_t>(id)];
  if (count == 0) return logit;
  // As llama.cpp: the repeat penalty always pushes a logit down, whatever its sign.
  float l = logit > 0.0f ? logit / params_.repeat_penalty : logit * params_.repeat_penalty;
  l -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
  return l;
}

int32_t Sampler::greedy(std::span<const float> logits) const {
  const size_t n = logits.size();
  const float* x = logits.data();
  if (!track_history_ || active_.empty()) {
    // Lane-wise maxima vectorize without -ffast-math; NaN never wins a `>`. Then the first index holding
    // the max gives the lowest id among ties.
    constexpr size_t kLanes = 16;
    float lane[kLanes];
    std::fill(lane, lane + kLanes, kNegInf);
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (size_t j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    }
    float best = kNegInf;
    for (; i < n; ++i) best = x[i] > best ? x[i] : best;
    for (float v : lane) best = v > best ? v : best;
    if (best == kNegInf) return 0;
    for (size_t k = 0; k < n; ++k) {
      if (x[k] == best) return static_cast<int32_t>(k);
    }
    return 0;
  }
  int32_t best_id = 0;
  float best = kNegInf;
  for (size_t i = 0; i < n; ++i) {
    const float l = penalized(static_cast<int32_t>(i), x[i]);
    if (l > best) {
      best = l;
      best_id = static_cast<int32_t>(i);
    }
  }
  return best_id;
}

size_t Sampler::build_distribution(std::span<const float> logits, double* sum) {
  // The total order every filter uses: higher logit first, then lower id.
  const auto better = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  Candidate* c = cand_.data();
  size_t size = cand_.size();
  for (size_t i = 0; i < size; ++i) {
    const float l = logits[i];
    // A NaN logit becomes -inf (never drawn); +inf would turn the softmax into NaN, so it becomes the largest
    // finite value.
    c[i].logit = std::isnan(l) ? kNegInf : std::min(l, std::numeric_limits<float>::max());
    c[i].id = static_cast<int32_t>(i);
  }
  if (track_history_) {
    for (int32_t t : active_) c[t].logit = penalized(t, c[t].logit);
  }
  const float max_logit = max_of(c, size);
  if (max_logit == kNegInf) {  // every token impossible: fall back to the lowest id
    c[0].id = 0;
    c[0].weight = 1.0f;
    *sum = 1.0;
    return 1;
  }

  // Whether c[0, size) is in the total order. Until a filter reorders it, it is in id order.
  bool sorted = false;

  const int32_t k = params_.top_k;
  if (k > 0 && static_cast<size_t>(k) < size) {
    const auto ku = static_cast<size_t>(k);
    if (k <= kHeapTopKLimit) {
      // heap_ is a min-heap under `better`: its front is the worst of the best k seen so far.
      heap_.assign(c, c + ku);
      std::make_heap(heap_.begin(), heap_.end(), better);
      for (size_t i = ku; i < size; ++i) {
        if (better(c[i], heap_.front())) {
          std::pop_heap(heap_.begin(), heap_.end(), better);
          heap_.back() = c[i];
          std::push_heap(heap_.begin(), heap_.end(), better);
        }
      }
      std::copy(heap_.begin(), heap_.end(), c);
    } else {
      std::nth_element(c, c + ku, c + size, better);
    }
    size = ku;
    std::sort(c, c + size, better);
    sorted = true;
  }

  const float min_logit = params_.min_p > 0.0f ? max_logit + std::log(params_.min_p) : kNegInf;

  if (params_.top_p < 1.0f && size > 1) {
    // Softmax (at temperature 1, as llama.cpp) over the survivors of top-k; keep the shortest run of best
    // tokens, in the total order, whose probability reaches top_p.
    double total = 0.0;
    for (size_t i = 0; i < size; ++i) total += (c[i].weight = std::exp(c[i].logit - max_logit));
    const double target = static_cast<double>(params_.top_p) * total;
    if (sorted) {
      double cum = 0.0;
      for (size_t i = 0; i < size; ++i) {
        cum += c[i].weight;
        if (cum >= target) {
          size = i + 1;
          break;
        }
      }
    } else {
      // Tokens below min_logit go anyway, and dropping them first leaves few to select from. If the rest
      // cannot reach the target, they are all kept, which is what top-p followed by min-p gives.
      if (min_logit > kNegInf) size = keep_at_least(c, size, min_logit);
      size = select_top_p(c, size, target, better);
    }
  }

  if (min_logit > kNegInf) size = keep_at_least(c, size, min_logit);  // keeps the max and the order

  // Temperature, then unnormalized softmax weights. Dividing the difference (rather than multiplying by
  // 1 / temperature) keeps the max at exp(0) = 1 even for a tiny temperature.
  const float temperature = params_.temperature;
  double total = 0.0;
  for (size_t i = 0; i < size; ++i) {
    total += (c[i].weight = std::exp((c[i].logit - max_logit) / temperature));
  }
  *sum = total;
  return size;
}

int32_t Sampler::sample(std::span<const float> logits) {
  INFERD_ASSERT(logits.size() == static_cast<size_t>(n_vocab_), "logits must have n_vocab entries");
  if (params_.temperature == 0.0f) return greedy(logits);
  double total = 0.0;
  const size_t size = build_distribution(logits, &total);
  const double r = rng_.next_double() * total;
  double cum = 0.0;
  for (size_t i = 0; i < size; ++i) {
    cum += cand_[i].weight;
    if (r < cum) return cand_[i].id;
  }
  // r landed on the rounding slack at the end: take the last token with any weight.
  for (size_t i = size; i-- > 0;) {
    if (cand_[i].weight > 0.0f) return cand_[i].id;
  }
  return cand_[0].id;
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits) {
  INFERD_ASSERT(logits.size() == static_cast<size_t>(n_vocab_), "logits must have n_vocab entries");
  if (params_.temperature == 0.0f) return {TokenProb{greedy(logits), 1.0f}};
  double total = 0.0;
  const size_t size = build_distribution(logits, &total);
  std::vector<TokenProb> out(size);
  for (size_t i = 0; i < size; ++i) {
    out[i] = {cand_[i].id, static_cast<float>(cand_[i].weight / total)};
  }
  return out;
}

}  // namespace inferd
