#include "inferd/engine.h"

namespace inferd {

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const Model> model, const EngineOptions& options) {
  CpuBackendOptions bo;
  bo.n_threads = options.n_threads;
  auto backend = CpuBackend::create(bo);
  if (!backend) return backend.status();
  std::unique_ptr<Engine> e(new Engine());
  e->cpu_ = backend.value().get();
  RunnerOptions ro;
  ro.n_ctx = options.n_ctx;
  ro.n_slots = options.n_slots;
  ro.n_ubatch = options.n_ubatch;
  ro.pad_step = options.pad_step;
  ro.n_blocks = options.n_blocks;
  ro.first_layer = options.first_layer;
  ro.end_layer = options.end_layer;
  INFERD_RETURN_IF_ERROR(e->init(std::move(model), std::move(backend).value(), ro));
  e->options_ = options;
  e->options_.n_ctx = e->runner_options().n_ctx;
  e->options_.end_layer = e->runner_options().end_layer;
  e->options_.n_threads = e->cpu_->n_threads();
  return e;
}

const EngineStats& Engine::stats() const {
  const CpuBackendStats& c = cpu_->stats();
  stats_.forward_calls = runner_stats().forward_calls;
  stats_.tokens = runner_stats().tokens;
  stats_.gemv_passes = c.gemv_passes;
  stats_.gemm_passes = c.gemm_passes;
  stats_.plan_rebuilds = c.plan_rebuilds;
  stats_.arena_bytes = c.arena_bytes;
  stats_.arena_naive_bytes = c.arena_naive_bytes;
  stats_.kv_bytes = c.kv_bytes;
  return stats_;
}

}  // namespace inferd
