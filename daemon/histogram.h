// daemon/histogram.h — a latency histogram with fixed bucket bounds, for /metrics (Prometheus's
// histogram: cumulative buckets "le", a sum and a count).
// Thread safety: a plain value; the scheduler that fills it owns it (supervisor thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace inferd::daemon {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, ascending (seconds)
  std::vector<uint64_t> counts;  // observations per bucket (bounds.size() + 1: the last is above every bound)
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v) {
    const size_t i = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
    ++counts[i];
    sum += v;
    ++count;
  }
};

// Time to first token (arrival to first generated token), seconds.
inline Histogram ttft_histogram() {
  return Histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
}
// A request's mean time per generated token after the first, seconds.
inline Histogram token_latency_histogram() {
  return Histogram({0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1});
}

}  // namespace inferd::daemon
