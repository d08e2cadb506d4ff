// inferd/engine.h — the CPU forward pass of a llama-family model.
//
// An Engine owns a KV cache with `n_slots` sequence slots, an activation arena and a thread pool,
// and runs forward passes over batches of tokens. A batch may mix slots (continuous batching: the
// decode steps of many sequences in one pass) and several tokens of one slot (prefill).
//
// Techniques (see ../shared/TECHNIQUES.md):
//  * Stage-aware matmuls. One token per pass (decode) runs a GEMV in which every thread normalises
//    and quantizes the activation itself and streams its share of weight rows — no extra pass, no
//    barrier. Several tokens (prefill, batched decode) quantize the activations once, then run a
//    blocked GEMM whose micro-kernel decodes each weight block once for 4 tokens.
//  * KV sub-tensors. New K/V rows are written in place into the pre-allocated cache.
//  * Mask padding. Attention runs over the KV length rounded up to `pad_step` (64 or 128) with the
//    padding masked, so the shape-dependent plan (arena layout, score buffers) is rebuilt only when
//    a length crosses a step. Rebuilds are counted in EngineStats.
//  * Activation arena. Intermediate tensors get offsets in one buffer, planned greedy-by-size from
//    their lifetimes (ArenaPlan).
//
// Thread safety: an Engine is used by one thread at a time (the thread that calls forward/eval);
// it uses its own pool of worker threads internally.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "inferd/model.h"
#include "inferd/status.h"

namespace inferd {

struct EngineOptions {
  int32_t n_ctx = 0;       // tokens per slot; 0: min(the model's training context, 4096)
  int32_t n_slots = 1;     // sequences that can be in flight at once
  int32_t n_threads = 0;   // 0: the number of CPUs this process may run on
  int32_t n_ubatch = 512;  // most tokens in one forward pass
  int32_t pad_step = 64;   // decode attends over lengths rounded up to this; 64 or 128
  // The layers this engine runs, [first_layer, end_layer) (end_layer 0: all). An engine whose range
  // starts after layer 0 takes hidden states instead of embedding tokens; one whose range ends before
  // the last layer returns hidden states instead of logits (a pipeline stage; see forward()).
  int32_t first_layer = 0;
  int32_t end_layer = 0;
};

// The limits every backend's engine shares (KV slots, context, pass size, padding step): kInvalidArgument
// naming the first value outside them.
Status check_engine_shape(int32_t n_ctx, int32_t n_slots, int32_t n_ubatch, int32_t pad_step);

// One token of a batch: which slot it belongs to, its position there, and whether its logits are wanted.
struct BatchToken {
  int32_t token = 0;
  int32_t slot = 0;
  int32_t pos = 0;
  bool logits = false;
};

struct EngineStats {
  int64_t forward_calls = 0;
  int64_t tokens = 0;
  int64_t gemv_passes = 0;    // passes that took the decode (GEMV) path
  int64_t gemm_passes = 0;    // passes that took the prefill (GEMM) path
  int64_t plan_rebuilds = 0;  // times the shape-dependent plan was rebuilt
  size_t arena_bytes = 0;     // current arena size
  size_t arena_naive_bytes = 0;
  size_t kv_bytes = 0;
};

// Which matmul path a pass with `n_tokens` tokens takes.
enum class MatmulPath { kGemv, kGemm };
MatmulPath choose_matmul_path(int64_t n_tokens);

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(std::shared_ptr<const Model> model, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One forward pass over `batch` (1..n_ubatch tokens). For each slot, the batch's tokens must have
  // consecutive positions starting at the slot's current length (which then grows). Returns the logits
  // of the tokens marked `logits`, in batch order, n_vocab floats each, valid until the next call.
  // Pipeline stages: a stage that does not start at layer 0 reads `hidden_in` (batch.size() x n_embd
  // floats, the previous stage's output) instead of embedding the tokens; a stage that does not end at
  // the last layer returns the hidden states of every token (batch.size() x n_embd) instead of logits.
  // Errors: kInvalidArgument (bad token id / slot / position / hidden_in size), kOutOfRange (past the
  // context).
  Result<std::span<const float>> forward(std::span<const BatchToken> batch, std::span<const float> hidden_in = {});
  bool is_first_stage() const { return options_.first_layer == 0; }
  bool is_last_stage() const { return options_.end_layer == model_->config().n_layer; }

  // Appends `tokens` to `slot` in passes of at most n_ubatch tokens. Returns the logits of the last
  // token, or of every token when `all_logits`.
  Result<std::span<const float>> eval(int32_t slot, std::span<const int32_t> tokens, bool all_logits = false);

  // Forgets a slot's sequence (its cache rows are simply overwritten later).
  void clear_slot(int32_t slot);
  // Shortens a slot's sequence to `length` tokens (<= current length).
  void truncate_slot(int32_t slot, int32_t length);
  int32_t slot_length(int32_t slot) const;

  const Model& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  int32_t n_vocab() const { return model_->config().n_vocab; }
  const EngineStats& stats() const;
  // The current activation arena plan, as a table.
  std::string plan_report() const;

  // Forces the matmul path (benchmarks compare both paths on the same shapes); nullptr = automatic.
  void force_matmul_path(const MatmulPath* path);

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<const Model> model_;
  EngineOptions options_;
};

}  // namespace inferd
