#include "inferd/thread_pool.h"

#include <chrono>
#include <algorithm>
#include <climits>

#include "inferd/status.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace inferd {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the futex calls below need a plain 32-bit atomic");

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Blocks while *word == expected (spurious returns are fine: callers loop).
void block_while_equal(std::atomic<uint32_t>& word, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  word.wait(expected, std::memory_order_seq_cst);
#endif
}

void wake_all(std::atomic<uint32_t>& word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  word.notify_all();
#endif
}

// Returns once word != old, spinning up to kSpinNanos before blocking.
//
// No lost wake-ups: a sleeper increments `sleepers` and then re-reads `word`; a notifier changes `word` and
// then reads `sleepers` (all seq_cst). At least one of them sees the other's write, and the futex re-checks
// `word` in the kernel before sleeping.
uint32_t wait_for_change(std::atomic<uint32_t>& word, uint32_t old, std::atomic<uint32_t>& sleepers) {
  uint32_t v = word.load(std::memory_order_acquire);
  if (v != old) return v;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ThreadPool::kSpinNanos);
  for (int i = 1;; ++i) {
    cpu_relax();
    v = word.load(std::memory_order_acquire);
    if (v != old) return v;
    if (i % 32 == 0 && std::chrono::steady_clock::now() >= deadline) break;
  }
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  while ((v = word.load(std::memory_order_seq_cst)) == old) block_while_equal(word, old);
  sleepers.fetch_sub(1, std::memory_order_relaxed);
  return v;
}

// Call after a seq_cst modification of `word`.
inline void notify(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers) {
  if (sleepers.load(std::memory_order_seq_cst) != 0) wake_all(word);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  INFERD_ASSERT(n_threads >= 1, "a pool needs at least the calling thread");
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int ith = 1; ith < n_threads; ++ith) workers_.emplace_back([this, ith] { worker_main(ith); });
}

ThreadPool::~ThreadPool() {
  INFERD_ASSERT(!in_run_, "ThreadPool destroyed during run()");
  if (workers_.empty()) return;
  stop_ = true;
  start_epoch_.fetch_add(1, std::memory_order_seq_cst);
  notify(start_epoch_, start_sleepers_);
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::worker_main(int ith) {
  uint32_t seen = 0;
  for (;;) {
    seen = wait_for_change(start_epoch_, seen, start_sleepers_);
    if (stop_) return;
    (*job_)(ith, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1) notify(pending_, pending_sleepers_);
  }
}

void ThreadPool::run(const std::function<void(int ith, int nth)>& fn) {
  INFERD_ASSERT(!in_run_, "ThreadPool::run() is not reentrant");
  if (n_threads_ == 1) {
    in_run_ = true;
    fn(0, 1);
    in_run_ = false;
    return;
  }
  in_run_ = true;
  job_ = &fn;
  pending_.store(static_cast<uint32_t>(n_threads_ - 1), std::memory_order_relaxed);
  start_epoch_.fetch_add(1, std::memory_order_seq_cst);
  notify(start_epoch_, start_sleepers_);

  fn(0, n_threads_);

  uint32_t left = pending_.load(std::memory_order_acquire);
  while (left != 0) left = wait_for_change(pending_, left, pending_sleepers_);
  job_ = nullptr;
  in_run_ = false;
}

void ThreadPool::barrier() {
  INFERD_ASSERT(in_run_, "ThreadPool::barrier() called outside run()");
  if (n_threads_ == 1) return;
  // The phase cannot move before this thread arrives, so reading it first is race-free.
  const uint32_t phase = barrier_phase_.load(std::memory_order_acquire);
  if (barrier_arrived_.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(n_threads_ - 1)) {
    barrier_arrived_.store(0, std::memory_order_relaxed);
    barrier_phase_.fetch_add(1, std::memory_order_seq_cst);
    notify(barrier_phase_, barrier_sleepers_);
  } else {
    wait_for_change(barrier_phase_, phase, barrier_sleepers_);
  }
}

std::pair<int64_t, int64_t> split_range(int64_t n, int ith, int nth, int64_t align) {
  INFERD_ASSERT(n >= 0 && nth >= 1 && ith >= 0 && ith < nth && align >= 1);
  const int64_t blocks = (n + align - 1) / align;
  const int64_t base = blocks / nth;
  const int64_t extra = blocks % nth;
  const int64_t first_block = ith * base + std::min<int64_t>(ith, extra);
  const int64_t n_blocks = base + (ith < extra ? 1 : 0);
  const int64_t begin = std::min(first_block * align, n);
  const int64_t end = std::min((first_block + n_blocks) * align, n);
  return {begin, end};
}

}  // namespace inferd
