#include "prefix_cache.h"

#include <algorithm>

#include "inferd/status.h"

namespace inferd::daemon {

PrefixCache::PrefixCache(uint32_t n_blocks, uint32_t block_tokens) : block_tokens_(block_tokens), blocks_(n_blocks) {
  INFERD_ASSERT(n_blocks > 0 && block_tokens > 0);
  free_.reserve(n_blocks);
  for (uint32_t i = n_blocks; i-- > 0;) free_.push_back(static_cast<int32_t>(i));  // block 0 first
}

uint64_t PrefixCache::key_of(int32_t parent, std::span<const int32_t> tokens) const {
  // FNV-1a over the parent and the tokens, then a final mix: only a bucket choice (hits compare in full).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint32_t>(parent));
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

int32_t PrefixCache::find(int32_t parent, std::span<const int32_t> tokens) const {
  const auto [lo, hi] = index_.equal_range(key_of(parent, tokens));
  for (auto it = lo; it != hi; ++it) {
    const Block& b = blocks_[static_cast<size_t>(it->second)];
    if (b.parent == parent && std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end())) {
      return it->second;
    }
  }
  return kNone;
}

void PrefixCache::reference(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.refs++ == 0) ++used_;
  if (b.in_lru) {
    lru_.erase(b.lru);
    b.in_lru = false;
  }
}

std::vector<int32_t> PrefixCache::match(std::span<const int32_t> tokens, size_t max_blocks) {
  ++lookups_;
  std::vector<int32_t> found;
  int32_t parent = kNone;
  for (size_t i = 0; i < max_blocks && (i + 1) * block_tokens_ <= tokens.size(); ++i) {
    const int32_t id = find(parent, tokens.subspan(i * block_tokens_, block_tokens_));
    if (id == kNone) break;
    found.push_back(id);
    parent = id;
  }
  for (int32_t id : found) reference(id);
  if (!found.empty()) {
    ++hits_;
    hit_tokens_ += found.size() * block_tokens_;
  }
  return found;
}

int32_t PrefixCache::allocate() {
  if (free_.empty() && !lru_.empty()) {
    const size_t before = free_.size();
    unpublish(lru_.front());
    evictions_ += free_.size() - before;
  }
  if (free_.empty()) return kNone;
  const int32_t id = free_.back();
  free_.pop_back();
  reference(id);
  return id;
}

int32_t PrefixCache::publish(int32_t parent, int32_t id, std::span<const int32_t> tokens) {
  INFERD_ASSERT(tokens.size() == block_tokens_);
  Block& b = blocks_[static_cast<size_t>(id)];
  INFERD_ASSERT(b.refs > 0 && !b.published, "block %d is not its publisher's to publish", id);
  if (parent != kNone && !blocks_[static_cast<size_t>(parent)].published) return kNone;
  if (const int32_t same = find(parent, tokens); same != kNone) return same;
  b.published = true;
  b.parent = parent;
  b.key = key_of(parent, tokens);
  b.tokens.assign(tokens.begin(), tokens.end());
  index_.emplace(b.key, id);
  if (parent != kNone) blocks_[static_cast<size_t>(parent)].children.push_back(id);
  return id;
}

void PrefixCache::retain(int32_t id) {
  INFERD_ASSERT(id >= 0 && static_cast<size_t>(id) < blocks_.size());
  reference(id);
}

void PrefixCache::release(std::span<const int32_t> ids) {
  for (size_t i = ids.size(); i-- > 0;) {
    const int32_t id = ids[i];
    Block& b = blocks_[static_cast<size_t>(id)];
    INFERD_ASSERT(b.refs > 0, "block %d released more often than referenced", id);
    if (--b.refs > 0) continue;
    --used_;
    if (b.published) {
      b.lru = lru_.insert(lru_.end(), id);
      b.in_lru = true;
    } else {
      free_.push_back(id);
    }
  }
}

void PrefixCache::unpublish(int32_t id) {
  std::vector<int32_t> todo{id};
  // Detach from the parent (whose other children stay cached).
  const int32_t parent = blocks_[static_cast<size_t>(id)].parent;
  if (parent != kNone) std::erase(blocks_[static_cast<size_t>(parent)].children, id);
  while (!todo.empty()) {
    const int32_t cur = todo.back();
    todo.pop_back();
    Block& b = blocks_[static_cast<size_t>(cur)];
    INFERD_ASSERT(b.published);
    const auto [lo, hi] = index_.equal_range(b.key);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == cur) {
        index_.erase(it);
        break;
      }
    }
    todo.insert(todo.end(), b.children.begin(), b.children.end());
    b.children.clear();
    b.published = false;
    b.parent = kNone;
    b.tokens.clear();
    if (b.in_lru) {
      lru_.erase(b.lru);
      b.in_lru = false;
    }
    if (b.refs == 0) free_.push_back(cur);
  }
}

void PrefixCache::clear() {
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = blocks_[i];
    if (!b.published) continue;
    b.published = false;
    b.parent = kNone;
    b.tokens.clear();
    b.children.clear();
    if (b.in_lru) {
      b.in_lru = false;
      free_.push_back(static_cast<int32_t>(i));
    }
  }
  lru_.clear();
  index_.clear();
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s;
  s.blocks = static_cast<uint32_t>(blocks_.size());
  s.blocks_used = used_;
  s.blocks_cached = static_cast<uint32_t>(lru_.size());
  s.lookups = lookups_;
  s.hits = hits_;
  s.hit_tokens = hit_tokens_;
  s.evictions = evictions_;
  return s;
}

}  // namespace inferd::daemon
