#include "inferd/arena.h"

#include <gtest/gtest.h>

#include <random>

namespace inferd {
namespace {

void expect_valid(const ArenaPlan& plan, size_t alignment) {
  const auto& ts = plan.tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(ts[i].offset % alignment, 0u) << ts[i].name;
    EXPECT_LE(ts[i].offset + ts[i].bytes, plan.total_bytes()) << ts[i].name;
    for (size_t j = i + 1; j < ts.size(); ++j) {
      const bool live_together = ts[i].first_use <= ts[j].last_use && ts[j].first_use <= ts[i].last_use;
      const bool disjoint = ts[i].offset + ts[i].bytes <= ts[j].offset || ts[j].offset + ts[j].bytes <= ts[i].offset;
      if (live_together && ts[i].bytes > 0 && ts[j].bytes > 0) {
        EXPECT_TRUE(disjoint) << ts[i].name << " and " << ts[j].name << " overlap";
      }
    }
  }
}

TEST(ArenaPlan, DisjointLifetimesShareMemory) {
  ArenaPlan plan;
  plan.add("a", 1000, 0, 1);
  plan.add("b", 1000, 2, 3);
  plan.add("c", 500, 1, 2);
  plan.plan(64);
  expect_valid(plan, 64);
  EXPECT_EQ(plan.offset(0), plan.offset(1));  // a and b never live together
  EXPECT_LT(plan.total_bytes(), plan.naive_bytes());
}

TEST(ArenaPlan, AllAliveNeedsTheSum) {
  ArenaPlan plan;
  plan.add("a", 128, 0, 5);
  plan.add("b", 256, 0, 5);
  plan.add("c", 64, 0, 5);
  plan.plan(64);
  expect_valid(plan, 64);
  EXPECT_EQ(plan.total_bytes(), 448u);
}

TEST(ArenaPlan, RandomPlansAreValid) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 200; ++round) {
    ArenaPlan plan;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) {
      const int a = static_cast<int>(rng() % 10), b = static_cast<int>(rng() % 10);
      std::string name = "t";
      name += std::to_string(i);
      plan.add(name, rng() % 5000, std::min(a, b), std::max(a, b));
    }
    plan.plan(32);
    expect_valid(plan, 32);
    EXPECT_LE(plan.total_bytes(), plan.naive_bytes() + 32u * static_cast<size_t>(n));
  }
}

}  // namespace
}  // namespace inferd
