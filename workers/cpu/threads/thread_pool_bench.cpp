// Measures the round-trip cost of ThreadPool::run() and ThreadPool::barrier().
// Usage: inferd_threads_bench [n_threads=2] [iterations=200000]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "inferd/thread_pool.h"

int main(int argc, char** argv) {
  const int n_threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200000;
  if (n_threads < 1 || iters < 1) {
    std::fprintf(stderr, "usage: %s [n_threads >= 1] [iterations >= 1]\n", argv[0]);
    return 2;
  }
  inferd::ThreadPool pool(n_threads);
  using Clock = std::chrono::steady_clock;
  const auto us_per = [iters](Clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count() / iters;
  };

  pool.run([](int, int) {});  // wake the workers
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) pool.run([](int, int) {});
  const double run_us = us_per(Clock::now() - t0);

  t0 = Clock::now();
  pool.run([&](int, int) {
    for (int i = 0; i < iters; ++i) pool.barrier();
  });
  const double barrier_us = us_per(Clock::now() - t0);

  std::printf("threads=%d iterations=%d: empty run() %.3f us, barrier() %.3f us\n", n_threads, iters, run_us,
              barrier_us);
  return 0;
}
