// Measures Sampler::sample() on a model-sized vocabulary with synthetic logits.
// Usage: inferd_sampling_bench [n_vocab=49152] [iterations=2000]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "inferd/rng.h"
#include "inferd/sampler.h"

namespace {

double us_per_sample(const inferd::SamplingParams& p, const std::vector<float>& logits, int iters) {
  inferd::Sampler s(p, static_cast<int32_t>(logits.size()));
  for (int i = 0; i < 64; ++i) s.accept(i);
  volatile int32_t sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) sink = sink + s.sample(logits);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  const int n_vocab = argc > 1 ? std::atoi(argv[1]) : 49152;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 2000;
  if (n_vocab < 1 || iters < 1) {
    std::fprintf(stderr, "usage: %s [n_vocab >= 1] [iterations >= 1]\n", argv[0]);
    return 2;
  }
  // Roughly the shape of real logits: a Gaussian bulk and a few strong candidates.
  inferd::Rng rng(1);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  for (float& l : logits) {
    const double u1 = rng.next_double() + 1e-12, u2 = rng.next_double();
    l = static_cast<float>(2.0 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  for (int i = 0; i < 10 && i < n_vocab; ++i) logits[static_cast<size_t>(i * 997 % n_vocab)] = 12.0f - i;

  struct Case {
    const char* name;
    inferd::SamplingParams p;
  };
  inferd::SamplingParams greedy;
  greedy.temperature = 0.0f;
  inferd::SamplingParams defaults;
  defaults.seed = 1;
  inferd::SamplingParams penalized = defaults;
  penalized.repeat_penalty = 1.1f;
  inferd::SamplingParams top_p_only = defaults;
  top_p_only.top_k = 0;
  top_p_only.min_p = 0.0f;
  inferd::SamplingParams top_p_min_p = defaults;
  top_p_min_p.top_k = 0;
  inferd::SamplingParams unfiltered = defaults;
  unfiltered.top_k = 0;
  unfiltered.top_p = 1.0f;
  unfiltered.min_p = 0.0f;
  const Case cases[] = {{"greedy", greedy},
                        {"defaults (k40 p0.95 min_p0.05 t0.8)", defaults},
                        {"defaults + repeat_penalty 1.1", penalized},
                        {"top_p 0.95 only", top_p_only},
                        {"top_p 0.95 + min_p 0.05", top_p_min_p},
                        {"no filters", unfiltered}};
  for (const Case& c : cases) {
    std::printf("n_vocab=%d %-38s %8.1f us/sample\n", n_vocab, c.name, us_per_sample(c.p, logits, iters));
  }
  return 0;
}
