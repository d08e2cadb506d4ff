// inferd/cpu_backend.h — the CPU backend: graphs (inferd/graph.h) on inferd_kernels_cpu and a thread pool.
//
// prepare() reads the weights in place (the shared segment's bytes are the kernels' layout: nothing is
// converted or copied) and reserves the KV cache. compute() lowers the graph once per kind of step into
// a program of CPU steps that every thread of the pool walks, with a barrier only where a step reads
// what another thread wrote:
//  * Stage-aware matmuls (choose_matmul_path): a step of one token (decode) takes the GEMV path — every
//    thread normalises and quantizes the single activation row itself into its own buffer (the fused
//    decode GEMV with activation quantization) and streams its share of weight rows, with no pass over
//    the activations and no barrier before the matmul; several tokens (prefill, batched decode) quantize
//    the rows once, split across threads, and run the blocked GEMM.
//  * Fused operators: matmul_add writes the residual sum in the matmul's store, matmul_swiglu computes
//    gate and up rows together and applies SwiGLU, rope_kv rotates Q and K and writes K and V into the
//    cache's sub-tensor (KvCache) in one pass.
//  * Weight rows are claimed in dynamic chunks (multiples of 64 rows), so a thread the OS preempts does
//    not hold the others up at the next barrier; results do not depend on who computes which chunk.
//  * Activation arena: every intermediate tensor gets an offset in one buffer, planned greedy-by-size
//    from its lifetime in barrier-separated phases (ArenaPlan); per-thread buffers likewise. The plan is
//    keyed by (tokens rounded to 32, logits rows rounded to 32, KV length padded), so a decode step
//    rebuilds it only when a length crosses a padding step (CpuBackendStats::plan_rebuilds).
// Numerics: ggml's x86 CPU backend bit for bit (ARCHITECTURE.md, "Numerics").
//
// Thread safety: one thread at a time calls compute(); the pool's threads run inside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "inferd/backend.h"

namespace inferd {

struct CpuBackendOptions {
  int32_t n_threads = 0;  // 0: the number of CPUs this process may run on
};

// Which matmul path a step with `n_tokens` tokens takes.
enum class MatmulPath { kGemv, kGemm };
MatmulPath choose_matmul_path(int64_t n_tokens);

struct CpuBackendStats {
  int64_t gemv_passes = 0;    // steps that took the decode (GEMV) path
  int64_t gemm_passes = 0;    // steps that took the prefill (GEMM) path
  int64_t plan_rebuilds = 0;  // times the shape-dependent arena plan was rebuilt
  size_t arena_bytes = 0;     // current arena size
  size_t arena_naive_bytes = 0;
  size_t kv_bytes = 0;
};

class CpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CpuBackend>> create(const CpuBackendOptions& options);
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string_view family() const override { return "cpu"; }
  std::string describe() const override;
  bool supports(const graph::Graph& g, const graph::Node& node) const override;
  Status prepare(const graph::Graph& g, const BackendShape& shape) override;
  Status compute(const graph::Graph& g, graph::StepIO& io) override;
  BackendMemory memory() const override;
  bool exact() const override { return true; }

  int32_t n_threads() const;
  const CpuBackendStats& stats() const;
  // The current activation arena plan, as a table.
  std::string plan_report() const;
  // Forces the matmul path (benchmarks compare both paths on the same shapes); nullptr = automatic.
  void force_matmul_path(const MatmulPath* path);

 private:
  struct Impl;
  explicit CpuBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd
