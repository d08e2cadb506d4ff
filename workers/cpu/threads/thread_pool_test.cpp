#include "inferd/thread_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

namespace inferd {
namespace {

TEST(SplitRange, CoversRangeInOrderWithNearlyEqualChunks) {
  for (int64_t n : {0, 1, 5, 7, 64, 100, 1000, 4097}) {
    for (int nth = 1; nth <= 9; ++nth) {
      int64_t expect_begin = 0;
      int64_t smallest = n, largest = 0;
      for (int ith = 0; ith < nth; ++ith) {
        auto [b, e] = split_range(n, ith, nth);
        EXPECT_EQ(b, expect_begin) << "n=" << n << " nth=" << nth << " ith=" << ith;
        EXPECT_LE(b, e);
        smallest = std::min(smallest, e - b);
        largest = std::max(largest, e - b);
        expect_begin = e;
      }
      EXPECT_EQ(expect_begin, n) << "n=" << n << " nth=" << nth;
      EXPECT_LE(largest - smallest, 1) << "n=" << n << " nth=" << nth;
    }
  }
}

TEST(SplitRange, AlignsBoundaries) {
  for (int64_t n : {0, 3, 32, 33, 100, 1000, 1536}) {
    for (int64_t align : {1, 4, 16, 32}) {
      for (int nth = 1; nth <= 7; ++nth) {
        int64_t expect_begin = 0;
        for (int ith = 0; ith < nth; ++ith) {
          auto [b, e] = split_range(n, ith, nth, align);
          EXPECT_EQ(b, expect_begin);
          EXPECT_TRUE(b == n || b % align == 0) << "n=" << n << " align=" << align << " nth=" << nth << " ith=" << ith;
          EXPECT_TRUE(e == n || e % align == 0);
          EXPECT_LE(e - b, ((n + align - 1) / align + nth - 1) / nth * align);
          expect_begin = e;
        }
        EXPECT_EQ(expect_begin, n);
      }
    }
  }
  EXPECT_EQ(split_range(100, 0, 3, 32), std::make_pair(int64_t{0}, int64_t{64}));
  EXPECT_EQ(split_range(100, 1, 3, 32), std::make_pair(int64_t{64}, int64_t{96}));
  EXPECT_EQ(split_range(100, 2, 3, 32), std::make_pair(int64_t{96}, int64_t{100}));
}

TEST(ThreadPool, SizeOneRunsInlineOnTheCaller) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  int calls = 0;
  std::thread::id where;
  pool.run([&](int ith, int nth) {
    EXPECT_EQ(ith, 0);
    EXPECT_EQ(nth, 1);
    pool.barrier();
    where = std::this_thread::get_id();
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(where, std::this_thread::get_id());
}

TEST(ThreadPool, EveryThreadRunsOnceAndCallerIsZero) {
  for (int n : {2, 3, 4, 8}) {
    ThreadPool pool(n);
    ASSERT_EQ(pool.size(), n);
    std::vector<int> hits(static_cast<size_t>(n), 0);
    std::vector<std::thread::id> ids(static_cast<size_t>(n));
    pool.run([&](int ith, int nth) {
      EXPECT_EQ(nth, n);
      hits[static_cast<size_t>(ith)] += 1;
      ids[static_cast<size_t>(ith)] = std::this_thread::get_id();
    });
    for (int i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)], 1) << "ith=" << i;
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    for (int i = 1; i < n; ++i) EXPECT_NE(ids[static_cast<size_t>(i)], std::this_thread::get_id());
  }
}

// Each round is a small fork-join reduction with two barriers, like a layer of the forward pass: every thread
// writes its partial sum, all read all partials, then the slots are reused in the next phase.
TEST(ThreadPool, ManyRoundsWithBarriersComputeKnownSums) {
  constexpr int64_t kN = 10'000;
  for (int n : {2, 3, 4}) {
    ThreadPool pool(n);
    std::vector<int64_t> partial(static_cast<size_t>(n));
    std::vector<int64_t> seen_total(static_cast<size_t>(n));
    for (int round = 0; round < 500; ++round) {
      std::atomic<int> mismatches{0};
      pool.run([&](int ith, int nth) {
        for (int phase = 0; phase < 3; ++phase) {
          auto [b, e] = split_range(kN, ith, nth, 8);
          int64_t s = 0;
          for (int64_t i = b; i < e; ++i) s += i * (round + phase + 1);
          partial[static_cast<size_t>(ith)] = s;
          pool.barrier();
          seen_total[static_cast<size_t>(ith)] = std::accumulate(partial.begin(), partial.end(), int64_t{0});
          const int64_t expect = kN * (kN - 1) / 2 * (round + phase + 1);
          if (seen_total[static_cast<size_t>(ith)] != expect) mismatches.fetch_add(1);
          pool.barrier();  // nobody overwrites partial[] before everyone has read it
        }
      });
      ASSERT_EQ(mismatches.load(), 0) << "n=" << n << " round=" << round;
    }
  }
}

TEST(ThreadPool, WorkerWritesAreVisibleAfterRun) {
  ThreadPool pool(4);
  std::vector<int> data(4096, 0);
  for (int round = 1; round <= 200; ++round) {
    pool.run([&](int ith, int nth) {
      auto [b, e] = split_range(static_cast<int64_t>(data.size()), ith, nth);
      for (int64_t i = b; i < e; ++i) data[static_cast<size_t>(i)] = round;
    });
    for (int v : data) ASSERT_EQ(v, round);
  }
}

TEST(ThreadPool, CreateAndDestroyRepeatedly) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(1 + i % 4);
    if (i % 2 == 0) pool.run([](int, int) {});
  }
}

double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// The one test where waiting is the point: idle workers must block, not spin. Spinning for 200 ms on three
// workers would cost ~600 ms of CPU; allow 60 ms for noise.
TEST(ThreadPool, IdlePoolUsesNoCpu) {
  ThreadPool pool(4);
  pool.run([&](int, int) { pool.barrier(); });
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double used = process_cpu_seconds() - before;
  EXPECT_LT(used, 0.06) << "idle pool burned " << used * 1e3 << " ms of CPU in 200 ms";
  int sum = 0;
  std::mutex m;
  pool.run([&](int ith, int) {
    std::lock_guard<std::mutex> lock(m);
    sum += ith;
  });
  EXPECT_EQ(sum, 0 + 1 + 2 + 3);
}

}  // namespace
}  // namespace inferd
