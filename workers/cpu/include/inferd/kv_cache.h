// inferd/kv_cache.h — the pre-allocated key/value cache of an engine: a pool of blocks.
//
// The cache is n_blocks blocks of graph::kKvBlockTokens (64) positions, each holding K and V of those
// positions for every layer and kv head, allocated once when the engine is created. A slot's position p
// lives in block table[slot][p / 64] (the step's StepIO::kv_table, bound before each step), so sequences
// can share the blocks of a common prompt prefix (the daemon's prefix cache) and a slot's blocks need not
// be adjacent. Each forward step writes its new K/V rows in place into a sub-tensor view of the pool
// (Transformer-Lite 2.4): no concatenation and no copy of the cache, ever. Rows are IEEE half floats,
// `head_dim` wide, as in llama.cpp's default F16 cache.
//
// Layout (fp16 elements), block-major so that a block's memory is contiguous:
//   [block][layer][k|v][kv_head][64 positions][head_dim]
// so attention for one head streams contiguous runs of 64 rows, one run per block.
// Pages are touched lazily: a block never written does not occupy RAM.
// Thread safety: views may be written concurrently for disjoint (block, layer, head, position) rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "inferd/dtype.h"
#include "inferd/graph.h"
#include "inferd/model.h"
#include "inferd/status.h"

namespace inferd {

class KvCache {
 public:
  // The rows of one (slot, layer, kv head) of K or V, positions [0, n_ctx), through the slot's block table.
  struct View {
    fp16_t* base = nullptr;         // this (layer, k|v, head)'s rows in block 0
    const int32_t* table = nullptr;  // the slot's blocks
    int64_t block_stride = 0;       // elements from one block to the next
    int64_t head_dim = 0;
    fp16_t* row(int64_t pos) const {
      return base + table[pos / graph::kKvBlockTokens] * block_stride + (pos % graph::kKvBlockTokens) * head_dim;
    }
  };

  // Reserves the whole pool; kFailed when the address space cannot be had.
  static Result<std::unique_ptr<KvCache>> create(const ModelConfig& config, int32_t n_blocks, int32_t blocks_per_slot);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // The block tables of the step about to run ([n_slots][blocks_per_slot], StepIO::kv_table; borrowed until
  // the next bind). Their entries are valid block ids wherever the step reads or writes.
  void bind(std::span<const int32_t> table) { table_ = table.data(); }

  View k(int32_t slot, int32_t layer, int32_t kv_head) const { return view(slot, layer, 0, kv_head); }
  View v(int32_t slot, int32_t layer, int32_t kv_head) const { return view(slot, layer, 1, kv_head); }

  int32_t n_blocks() const { return n_blocks_; }
  size_t bytes() const { return bytes_; }

 private:
  KvCache(const ModelConfig& config, int32_t n_blocks, int32_t blocks_per_slot);
  View view(int32_t slot, int32_t layer, int32_t kv, int32_t kv_head) const;

  int32_t n_blocks_, blocks_per_slot_, n_layer_, n_head_kv_, head_dim_;
  size_t block_elems_ = 0;
  size_t bytes_ = 0;
  fp16_t* data_ = nullptr;  // owned: mmap'd anonymous memory
  const int32_t* table_ = nullptr;
};

}  // namespace inferd
