#include "prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

namespace inferd::daemon {
namespace {

constexpr uint32_t kB = 4;  // tokens per block, small for the tests

std::vector<int32_t> tokens(int32_t first, size_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence as the scheduler drives it: allocates, writes and publishes its blocks in order.
std::vector<int32_t> run_sequence(PrefixCache& c, const std::vector<int32_t>& toks) {
  std::vector<int32_t> blocks = c.match(toks, toks.size() / kB);
  int32_t chain = blocks.empty() ? PrefixCache::kNone : blocks.back();
  for (size_t i = blocks.size(); (i + 1) * kB <= toks.size(); ++i) {
    const int32_t b = c.allocate();
    EXPECT_NE(b, PrefixCache::kNone);
    blocks.push_back(b);
    chain = c.publish(chain, b, std::span<const int32_t>(toks).subspan(i * kB, kB));
    EXPECT_EQ(chain, b);
  }
  return blocks;
}

TEST(PrefixCache, ASecondSequenceSharesTheFirstOnesPrefixBlocks) {
  PrefixCache c(16, kB);
  std::vector<int32_t> a = tokens(100, 12);
  const std::vector<int32_t> a_blocks = run_sequence(c, a);
  ASSERT_EQ(a_blocks.size(), 3u);
  // Same first 8 tokens, then different: the first two blocks are shared.
  std::vector<int32_t> b = a;
  b[9] = 7;
  const std::vector<int32_t> hit = c.match(b, 3);
  EXPECT_EQ(hit, std::vector<int32_t>(a_blocks.begin(), a_blocks.begin() + 2));
  EXPECT_EQ(c.refs(a_blocks[0]), 2u);
  // The same tokens in another context are not a hit: the chain starts at the sequence's start.
  std::vector<int32_t> shifted(a.begin() + 4, a.end());
  EXPECT_TRUE(c.match(shifted, 2).empty());
  // At most max_blocks.
  const std::vector<int32_t> one = c.match(a, 1);
  EXPECT_EQ(one, std::vector<int32_t>{a_blocks[0]});
  const PrefixCacheStats s = c.stats();
  EXPECT_EQ(s.lookups, 4u);  // run_sequence's own match, b, shifted, one
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.hit_tokens, 3u * kB);
  c.release(hit);
  c.release(one);
  c.release(a_blocks);
  EXPECT_EQ(c.stats().blocks_used, 0u);
  EXPECT_EQ(c.stats().blocks_cached, 3u);  // cached, evictable, still findable
  const std::vector<int32_t> again = c.match(a, 3);
  EXPECT_EQ(again, a_blocks);
}

TEST(PrefixCache, EvictionTakesTheLeastRecentlyUsedAndDeeperBlocksFirst) {
  PrefixCache c(6, kB);
  const std::vector<int32_t> a = tokens(0, 12), b = tokens(1000, 8);
  std::vector<int32_t> a_blocks = run_sequence(c, a);  // 3 blocks
  std::vector<int32_t> b_blocks = run_sequence(c, b);  // 2 blocks
  c.release(a_blocks);  // a released first: least recently used
  c.release(b_blocks);
  EXPECT_EQ(c.stats().blocks_cached, 5u);
  // One free block, then evictions: a's last block goes first, then its middle one.
  const int32_t f = c.allocate();
  EXPECT_TRUE(f != PrefixCache::kNone);
  const int32_t e1 = c.allocate();
  EXPECT_EQ(e1, a_blocks[2]);
  EXPECT_EQ(c.stats().evictions, 1u);
  const int32_t e2 = c.allocate();
  EXPECT_EQ(e2, a_blocks[1]);
  EXPECT_TRUE(c.cached(a_blocks[0]));
  EXPECT_EQ(c.match(a, 3), std::vector<int32_t>{a_blocks[0]});
  EXPECT_EQ(c.match(b, 2), b_blocks);
}

TEST(PrefixCache, EvictingABlockEvictsWhatContinuesIt) {
  PrefixCache c(3, kB);
  const std::vector<int32_t> a = tokens(0, 12);
  std::vector<int32_t> a_blocks = run_sequence(c, a);
  // Make the first block the least recently used by touching the others... it is released last, so it is
  // the most recent; release the first alone earlier to make it the oldest.
  c.release(std::span<const int32_t>(a_blocks).first(1));
  c.release(std::span<const int32_t>(a_blocks).subspan(1));
  // The first block (oldest) is evicted and takes its two descendants with it: all three are free.
  const int32_t x = c.allocate();
  EXPECT_EQ(c.stats().evictions, 3u);
  EXPECT_EQ(c.stats().blocks_cached, 0u);
  EXPECT_TRUE(c.match(a, 3).empty());
  EXPECT_NE(c.allocate(), PrefixCache::kNone);
  EXPECT_NE(c.allocate(), PrefixCache::kNone);
  EXPECT_EQ(c.allocate(), PrefixCache::kNone);  // every block referenced
  (void)x;
}

TEST(PrefixCache, ReferencedBlocksAreNeverEvictedAndTheBudgetHolds) {
  PrefixCache c(4, kB);
  const std::vector<int32_t> a = tokens(0, 8);
  std::vector<int32_t> a_blocks = run_sequence(c, a);  // held
  std::vector<int32_t> other = {c.allocate(), c.allocate()};
  EXPECT_EQ(c.allocate(), PrefixCache::kNone);
  EXPECT_EQ(c.stats().blocks_used, 4u);
  EXPECT_TRUE(c.cached(a_blocks[0]) && c.cached(a_blocks[1]));
  c.release(other);
  EXPECT_EQ(c.stats().blocks_used + c.stats().blocks_cached, 2u);
}

TEST(PrefixCache, ADuplicateBlockChainsToTheCachedOne) {
  PrefixCache c(8, kB);
  const std::vector<int32_t> a = tokens(0, 8);
  // Two sequences computing the same prefix at once (neither found the other's blocks).
  const int32_t x0 = c.allocate(), y0 = c.allocate();
  EXPECT_EQ(c.publish(PrefixCache::kNone, x0, std::span<const int32_t>(a).first(kB)), x0);
  EXPECT_EQ(c.publish(PrefixCache::kNone, y0, std::span<const int32_t>(a).first(kB)), x0);  // already there
  c.retain(x0);
  const int32_t y1 = c.allocate();
  EXPECT_EQ(c.publish(x0, y1, std::span<const int32_t>(a).subspan(kB, kB)), y1);
  EXPECT_EQ(c.match(a, 2), (std::vector<int32_t>{x0, y1}));
  // A parent that is no longer cached: nothing is published under it.
  c.clear();
  const int32_t z = c.allocate();
  EXPECT_EQ(c.publish(x0, z, std::span<const int32_t>(a).subspan(kB, kB)), PrefixCache::kNone);
  EXPECT_FALSE(c.cached(z));
}

TEST(PrefixCache, ClearForgetsEverythingCachedAndFreesWhatNobodyHolds) {
  PrefixCache c(4, kB);
  const std::vector<int32_t> a = tokens(0, 8), b = tokens(50, 8);
  std::vector<int32_t> a_blocks = run_sequence(c, a);
  std::vector<int32_t> b_blocks = run_sequence(c, b);
  c.release(a_blocks);
  c.clear();
  EXPECT_EQ(c.stats().blocks_cached, 0u);
  EXPECT_EQ(c.stats().blocks_used, 2u);
  EXPECT_TRUE(c.match(b, 2).empty());
  c.release(b_blocks);
  for (int i = 0; i < 4; ++i) EXPECT_NE(c.allocate(), PrefixCache::kNone);
}

}  // namespace
}  // namespace inferd::daemon
