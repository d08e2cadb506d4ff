#include "inferd/kv_cache.h"

#include <sys/mman.h>

#include "inferd/status.h"

namespace inferd {

KvCache::KvCache(const ModelConfig& config, int32_t n_blocks, int32_t blocks_per_slot)
    : n_blocks_(n_blocks), blocks_per_slot_(blocks_per_slot), n_layer_(config.n_layer), n_head_kv_(config.n_head_kv),
      head_dim_(config.head_dim) {
  INFERD_ASSERT(n_blocks > 0 && blocks_per_slot > 0);
  block_elems_ = 2 * static_cast<size_t>(n_layer_) * static_cast<size_t>(n_head_kv_) * graph::kKvBlockTokens *
                 static_cast<size_t>(head_dim_);
  bytes_ = sizeof(fp16_t) * block_elems_ * static_cast<size_t>(n_blocks);
}

Result<std::unique_ptr<KvCache>> KvCache::create(const ModelConfig& config, int32_t n_blocks, int32_t blocks_per_slot) {
  std::unique_ptr<KvCache> cache(new KvCache(config, n_blocks, blocks_per_slot));
  // Anonymous mapping: zero pages, committed only when written.
  void* p = mmap(nullptr, cache->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return make_error(Code::kFailed, "cannot reserve %zu bytes for the KV cache", cache->bytes_);
  }
  cache->data_ = static_cast<fp16_t*>(p);
  return cache;
}

KvCache::~KvCache() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

KvCache::View KvCache::view(int32_t slot, int32_t layer, int32_t kv, int32_t kv_head) const {
  INFERD_ASSERT(table_ != nullptr && slot >= 0 && layer >= 0 && layer < n_layer_ && kv_head >= 0 && kv_head < n_head_kv_);
  const size_t run = static_cast<size_t>(graph::kKvBlockTokens) * static_cast<size_t>(head_dim_);
  const size_t index = (static_cast<size_t>(layer) * 2 + static_cast<size_t>(kv)) * static_cast<size_t>(n_head_kv_) +
                       static_cast<size_t>(kv_head);
  return View{data_ + index * run, table_ + static_cast<size_t>(slot) * static_cast<size_t>(blocks_per_slot_),
              static_cast<int64_t>(block_elems_), head_dim_};
}

}  // namespace inferd
