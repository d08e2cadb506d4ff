#include "inferd/opencl/cl_engine.h"

namespace inferd::opencl {

Result<std::unique_ptr<ClEngine>> ClEngine::create(std::shared_ptr<const Model> model, std::unique_ptr<Runtime> runtime,
                                                   const ClEngineOptions& options) {
  INFERD_ASSERT(model != nullptr && runtime != nullptr);
  OpenClOptions bo;
  bo.activation_storage = options.activation_storage;
  bo.storage_policy = options.storage_policy;
  bo.activation_type = options.activation_type;
  bo.numerics = options.numerics;
  bo.int_dot = options.int_dot;
  bo.decode_shape = options.decode_shape;
  bo.fuse = options.fuse;
  bo.prefill_tokens = options.prefill_tokens;
  bo.prefill_kernel = options.prefill_kernel;
  bo.attention_chunk = options.attention_chunk;
  bo.replay = options.replay;
  auto backend = OpenClBackend::create(std::move(runtime), bo);
  if (!backend) return backend.status();
  std::unique_ptr<ClEngine> e(new ClEngine());
  e->cl_ = backend.value().get();
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
  e->options_.n_blocks = e->runner_options().n_blocks;
  e->options_.end_layer = e->runner_options().end_layer;
  return e;
}

const ClEngineStats& ClEngine::stats() const {
  const OpenClStats& c = cl_->stats();
  stats_.forward_calls = runner_stats().forward_calls;
  stats_.tokens = runner_stats().tokens;
  stats_.decode_passes = c.decode_passes;
  stats_.prefill_passes = c.prefill_passes;
  stats_.weight_bytes = c.weight_bytes;
  stats_.kv_bytes = c.kv_bytes;
  stats_.activation_bytes = c.activation_bytes;
  stats_.kernels = c.kernels;
  stats_.kernels_collected = c.kernels_collected;
  stats_.launches = c.launches;
  return stats_;
}

std::string ClEngine::describe() const {
  return cl_->describe() + (is_first_stage() && is_last_stage()
                                ? ""
                                : ", layers " + std::to_string(options_.first_layer) + "-" +
                                      std::to_string(options_.end_layer - 1));
}

}  // namespace inferd::opencl
