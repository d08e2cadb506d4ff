// daemon/prefix_cache.h — one model's KV blocks, and the prefix cache over them.
//
// The workers' KV cache is a pool of n_blocks blocks of kKvBlockTokens (64) positions (graph.h); the
// scheduler decides which blocks each sequence uses, and every step carries each sequence's table. This
// class owns that pool:
//
//   allocate()   a free block for a sequence to write; when none is free, the least recently used cached
//                block is evicted (with the cached blocks that continue it, which nothing could reach).
//   publish()    a sequence's full block becomes findable: keyed by its 64 tokens and by the block
//                holding the tokens before them (a chain from the start of the sequence), so a hit is a
//                whole prefix, never 64 tokens out of context.
//   match()      the longest chain of cached blocks that begins a new sequence's tokens; the sequence
//                references them (shared, never copied) and prefills only the rest.
//   release()    a sequence drops its blocks: cached ones stay cached, as evictable, others are free.
//   clear()      a worker died, and the KV with it: nothing cached survives.
//
// A block is written only by the sequence that allocated it, and only at positions past what it has
// published; a published block is read-only for everyone. Reference counts make sharing safe: a block
// is free only when no sequence holds it and it is not cached. The pool never grows: KV bytes are
// bounded by n_blocks blocks whatever the traffic.
//
// Keys hash the tokens, but a hit compares them, and the parent, in full: a collision is a miss.
// Thread safety: the scheduler's thread only.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace inferd::daemon {

struct PrefixCacheStats {
  uint32_t blocks = 0;         // the pool
  uint32_t blocks_used = 0;    // referenced by a sequence
  uint32_t blocks_cached = 0;  // published and referenced by none (evictable)
  uint64_t lookups = 0;        // match() calls
  uint64_t hits = 0;           // of them, those that found at least one block
  uint64_t hit_tokens = 0;     // tokens the hits found (not prefilled)
  uint64_t evictions = 0;      // cached blocks evicted to make room (descendants included)
};

class PrefixCache {
 public:
  static constexpr int32_t kNone = -1;

  PrefixCache(uint32_t n_blocks, uint32_t block_tokens);

  // The longest run of cached blocks that holds tokens[0, 64 k), k <= max_blocks: each referenced by the
  // caller (to release() later). The blocks in order; empty when the first block is not cached.
  std::vector<int32_t> match(std::span<const int32_t> tokens, size_t max_blocks);

  // A block for the caller to write, referenced once; kNone when every block is referenced.
  int32_t allocate();

  // The caller's `block` (referenced, full) holds `tokens` (block_tokens of them) after the prefix whose
  // last block is `parent` (kNone: the sequence's first block). Returns the block that now stands for
  // this prefix: `block`, or one cached earlier with the same content (the caller keeps its own block,
  // unpublished, and chains its next block to the returned one, which it must retain() for as long as it
  // chains to it). kNone when `parent` is no longer cached (evicted meanwhile): the rest of the sequence
  // is not published.
  int32_t publish(int32_t parent, int32_t block, std::span<const int32_t> tokens);

  // One more reference to `block` (a cached block the caller chains to without holding it otherwise).
  void retain(int32_t block);

  // Drops one reference to each block, last first (so a chain's deeper blocks are evicted before its
  // first ones).
  void release(std::span<const int32_t> blocks);

  // Forgets every cached block: unreferenced ones become free, referenced ones unpublished.
  void clear();

  PrefixCacheStats stats() const;
  uint32_t block_tokens() const { return block_tokens_; }
  uint32_t n_blocks() const { return static_cast<uint32_t>(blocks_.size()); }
  // For tests: whether `block` is cached (findable), and its reference count.
  bool cached(int32_t block) const { return blocks_[static_cast<size_t>(block)].published; }
  uint32_t refs(int32_t block) const { return blocks_[static_cast<size_t>(block)].refs; }

 private:
  struct Block {
    uint32_t refs = 0;
    bool published = false;
    int32_t parent = kNone;         // published: the block before it in its chain
    uint64_t key = 0;               // published: its key in index_
    std::vector<int32_t> tokens;    // published: its tokens
    std::vector<int32_t> children;  // published blocks whose parent it is
    bool in_lru = false;
    std::list<int32_t>::iterator lru;  // valid when in_lru
  };

  uint64_t key_of(int32_t parent, std::span<const int32_t> tokens) const;
  int32_t find(int32_t parent, std::span<const int32_t> tokens) const;
  // Unpublishes `block` and every block that continues it; those nobody references become free.
  void unpublish(int32_t block);
  void reference(int32_t block);

  uint32_t block_tokens_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;                  // unreferenced, unpublished
  std::list<int32_t> lru_;                     // unreferenced, published: least recently used first
  std::unordered_multimap<uint64_t, int32_t> index_;
  uint32_t used_ = 0;
  uint64_t lookups_ = 0, hits_ = 0, hit_tokens_ = 0, evictions_ = 0;
};

}  // namespace inferd::daemon
