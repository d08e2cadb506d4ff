// inferd/thread_pool.h — a fork-join pool for the CPU forward pass.
//
// A decode step calls run() about ten times per layer, so a run() round trip and a barrier() must cost a few
// microseconds. Waiting threads therefore spin for a bounded time (kSpinNanos) and then block on a futex;
// an idle pool uses no CPU.
//
// Thread safety: one owner. run() must be called from one thread at a time (the same one or not); barrier()
// may be called only by the participants of a run() in progress, and then by all of them the same number of
// times. Jobs must not throw (the project is built without using exceptions) and must not call run().
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

namespace inferd {

class ThreadPool {
 public:
  // How long a waiting thread polls before it blocks in the kernel. Long enough to span the gap between
  // two decode steps served through the daemon (~70 us of rings, wake-ups and scheduling), so that the
  // workers are still polling when the next step starts instead of waiting for a futex wake-up.
  static constexpr int64_t kSpinNanos = 200'000;

  // n_threads counts every participant, the caller of run() included: n_threads - 1 workers are started.
  // Precondition: n_threads >= 1.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();  // joins the workers; must not race with run()

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(ith, nth) on all nth = size() threads, the caller as ith 0, and returns when all have returned.
  // With size() == 1 this is a plain call. Everything written by any participant before it returned is
  // visible to the caller afterwards.
  void run(const std::function<void(int ith, int nth)>& fn);

  // Inside run(): returns once every participant has called it; writes made before it by any participant
  // are visible to all after it.
  void barrier();

 private:
  void worker_main(int ith);

  const int n_threads_;
  std::vector<std::thread> workers_;

  // Written by the caller of run() before start_epoch_ is bumped; read by workers after they see the bump.
  const std::function<void(int, int)>* job_ = nullptr;
  bool stop_ = false;
  bool in_run_ = false;

  // Each group is written by different threads at different times: keep them on separate cache lines.
  alignas(64) std::atomic<uint32_t> start_epoch_{0};  // bumped once per run() and once at shutdown
  std::atomic<uint32_t> start_sleepers_{0};           // workers blocked in the kernel on start_epoch_
  alignas(64) std::atomic<uint32_t> pending_{0};      // workers still running the current job
  std::atomic<uint32_t> pending_sleepers_{0};
  alignas(64) std::atomic<uint32_t> barrier_arrived_{0};
  alignas(64) std::atomic<uint32_t> barrier_phase_{0};  // bumped by the last thread to arrive
  std::atomic<uint32_t> barrier_sleepers_{0};
};

// Splits [0, n) into nth contiguous chunks whose sizes differ by at most `align` and returns chunk ith as
// [begin, end). Every boundary except n itself is a multiple of `align`; chunks may be empty when n is small.
// Preconditions: n >= 0, 0 <= ith < nth, align >= 1.
std::pair<int64_t, int64_t> split_range(int64_t n, int ith, int nth, int64_t align = 1);

}  // namespace inferd
