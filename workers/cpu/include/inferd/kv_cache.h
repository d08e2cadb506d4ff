// inferd/kv_cache.h — the pre-allocated key/value cache of an engine.
//
// One buffer holds K and V for every (sequence slot, layer, kv head, position), allocated once for
// the whole context when the engine is created. Each forward step writes its new K/V rows in place
// into a sub-tensor view of that buffer (Transformer-Lite 2.4): no concatenation and no copy of the
// cache, ever. Rows are IEEE half floats, `head_dim` wide, as in llama.cpp's default F16 cache.
//
// Layout (fp16 elements), slot-major so that a slot's memory is contiguous:
//   [slot][layer][k|v][kv_head][position][head_dim]
// so attention for one head streams one contiguous [position][head_dim] block.
// Pages are touched lazily: a slot that never held a long sequence does not occupy RAM.
// Thread safety: views may be written concurrently for disjoint (slot, layer, head, position) rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "inferd/dtype.h"
#include "inferd/model.h"
#include "inferd/status.h"

namespace inferd {

class KvCache {
 public:
  // A view of positions [0, n_ctx) of one (slot, layer, kv head) of K or V.
  struct View {
    fp16_t* data = nullptr;
    int64_t head_dim = 0;
    fp16_t* row(int64_t pos) const { return data + pos * head_dim; }
  };

  // Reserves the whole cache; kFailed when the address space cannot be had.
  static Result<std::unique_ptr<KvCache>> create(const ModelConfig& config, int32_t n_slots, int32_t n_ctx);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  View k(int32_t slot, int32_t layer, int32_t kv_head) const { return view(slot, layer, 0, kv_head); }
  View v(int32_t slot, int32_t layer, int32_t kv_head) const { return view(slot, layer, 1, kv_head); }

  int32_t n_slots() const { return n_slots_; }
  int32_t n_ctx() const { return n_ctx_; }
  size_t bytes() const { return bytes_; }

 private:
  KvCache(const ModelConfig& config, int32_t n_slots, int32_t n_ctx);
  View view(int32_t slot, int32_t layer, int32_t kv, int32_t kv_head) const;

  int32_t n_slots_, n_ctx_, n_layer_, n_head_kv_, head_dim_;
  size_t bytes_ = 0;
  fp16_t* data_ = nullptr;  // owned: mmap'd anonymous memory
};

}  // namespace inferd
