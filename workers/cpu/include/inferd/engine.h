// inferd/engine.h — a llama-family model (or a pipeline stage of it) on the CPU: the model graph run by
// the CPU backend (cpu_backend.h) through the forward pass every backend shares (model_runner.h).
//
// An Engine owns a KV cache with `n_slots` sequence slots, an activation arena and a thread pool, and
// runs forward passes over batches of tokens; see ModelRunner for the batch and stage contracts and
// CpuBackend for the techniques (stage-aware matmuls, KV sub-tensors, mask padding, the arena).
//
// Thread safety: an Engine is used by one thread at a time (the thread that calls forward/eval); it
// uses its own pool of worker threads internally.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "inferd/cpu_backend.h"
#include "inferd/model.h"
#include "inferd/model_runner.h"
#include "inferd/status.h"

namespace inferd {

struct EngineOptions {
  int32_t n_ctx = 0;       // tokens per slot; 0: min(the model's training context, 4096)
  int32_t n_slots = 1;     // sequences that can be in flight at once
  int32_t n_threads = 0;   // 0: the number of CPUs this process may run on
  int32_t n_ubatch = 512;  // most tokens in one forward pass
  int32_t pad_step = 64;   // decode attends over lengths rounded up to this; 64 or 128
  int32_t n_blocks = 0;    // KV blocks in the pool (RunnerOptions::n_blocks); 0: a run per slot
  // The layers this engine runs, [first_layer, end_layer) (end_layer 0: all). An engine whose range
  // starts after layer 0 takes hidden states instead of embedding tokens; one whose range ends before
  // the last layer returns hidden states instead of logits (a pipeline stage; see forward()).
  int32_t first_layer = 0;
  int32_t end_layer = 0;
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

class Engine final : public ModelRunner {
 public:
  static Result<std::unique_ptr<Engine>> create(std::shared_ptr<const Model> model, const EngineOptions& options);

  // The options in effect (n_ctx, n_threads and end_layer resolved).
  const EngineOptions& options() const { return options_; }
  const EngineStats& stats() const;
  // The current activation arena plan, as a table.
  std::string plan_report() const { return cpu_->plan_report(); }
  // Forces the matmul path (benchmarks compare both paths on the same shapes); nullptr = automatic.
  void force_matmul_path(const MatmulPath* path) { cpu_->force_matmul_path(path); }

 private:
  Engine() = default;

  CpuBackend* cpu_ = nullptr;  // owned by the runner
  EngineOptions options_;
  mutable EngineStats stats_;
};

}  // namespace inferd
