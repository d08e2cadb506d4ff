// inferd/model_runner.h — a model (or a pipeline stage of it) on one backend: the forward pass written
// once for every backend.
//
// The runner owns the stage's graph (graph_builder.h, fused for its backend), the backend, and the
// state of the KV slots (each slot's length). forward() validates a batch — token ids, slots,
// positions that continue each slot's sequence, the context size — before anything reaches the
// backend, binds the step's inputs (token ids or the previous stage's hidden states, positions,
// slots, the rows whose logits are wanted) and has the backend compute the graph. eval() feeds a
// token sequence in passes of at most n_ubatch tokens (chunked prefill). The CPU engine (Engine) and
// the OpenCL engine (opencl::ClEngine) are this class with their backend.
//
// KV blocks: the backend's cache is a pool of blocks (graph::kKvBlockTokens positions each) and each
// slot a table of them (graph.h); by default slot s owns its own run of blocks. The daemon's scheduler
// allocates blocks itself (set_slot) and shares the blocks of a common prompt prefix between sequences.
//
// Batches: a batch may mix slots (continuous batching: the decode steps of many sequences in one
// pass) and several tokens of one slot (prefill). Attention runs over the KV length rounded up to
// pad_step (64 or 128), positions past each token's own masked, so shapes change only when a length
// crosses a step.
//
// Pipeline stages: a runner of layers [first_layer, end_layer) that does not start at layer 0 reads
// `hidden_in` (batch.size() x n_embd floats, the previous stage's output) instead of embedding the
// tokens; one that does not end at the last layer returns the hidden states of every token instead
// of logits.
//
// Thread safety: one thread at a time (the backend may use threads of its own).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "inferd/backend.h"
#include "inferd/graph.h"
#include "inferd/model.h"
#include "inferd/status.h"

namespace inferd {

// One token of a batch: which slot it belongs to, its position there, and whether its logits are wanted.
struct BatchToken {
  int32_t token = 0;
  int32_t slot = 0;
  int32_t pos = 0;
  bool logits = false;
};

struct RunnerOptions {
  int32_t n_ctx = 0;       // tokens per slot; 0: default_context(model)
  int32_t n_slots = 1;     // sequences that can be in flight at once
  int32_t n_ubatch = 512;  // most tokens in one forward pass
  int32_t pad_step = 64;   // attention pads the KV length to a multiple of this: 64 or 128
  // KV blocks in the pool (graph::kKvBlockTokens positions each); 0: one run of blocks per slot,
  // n_slots * kv_blocks_per_slot(n_ctx), each slot's table starting as its own run (what a runner
  // driven by position alone needs). A driver that allocates blocks itself sets tables with set_slot().
  int32_t n_blocks = 0;
  // The layers this runner computes, [first_layer, end_layer) (end_layer 0: through the last).
  int32_t first_layer = 0;
  int32_t end_layer = 0;
};

// The limits every backend's runner shares (KV slots, context, pass size, padding step): kInvalidArgument
// naming the first value outside them.
Status check_engine_shape(int32_t n_ctx, int32_t n_slots, int32_t n_ubatch, int32_t pad_step);

struct RunnerStats {
  int64_t forward_calls = 0;
  int64_t tokens = 0;
};

class ModelRunner {
 public:
  // Builds the stage's graph, fuses it for `backend`, checks that the backend supports every node
  // (kUnimplemented naming the first it does not) and prepares the backend.
  static Result<std::unique_ptr<ModelRunner>> create(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                                                     const RunnerOptions& options);
  virtual ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // One forward pass over `batch` (1..n_ubatch tokens). For each slot, the batch's tokens must have
  // consecutive positions starting at the slot's current length (which then grows). Returns the logits
  // of the tokens marked `logits`, in batch order, n_vocab floats each (a stage before the last: the
  // hidden states of every token), valid until the next call.
  // Errors: kInvalidArgument (bad token id / slot / position / hidden_in size), kOutOfRange (past the
  // context); the backend's errors.
  Result<std::span<const float>> forward(std::span<const BatchToken> batch, std::span<const float> hidden_in = {});
  // After forward() on the last stage: the hidden states (after the output norm, n_embd floats each) of
  // the rows whose logits it returned, in the same order; valid until the next call. For embeddings.
  std::span<const float> embeddings() const { return embd_; }

  // Appends `tokens` to `slot` in passes of at most n_ubatch tokens. Returns the logits of the last
  // token, or of every token when `all_logits`. Whole models only (kInvalidArgument for a stage).
  Result<std::span<const float>> eval(int32_t slot, std::span<const int32_t> tokens, bool all_logits = false);

  // Gives `slot` the KV blocks `blocks` (its positions [0, 64), [64, 128), ... in order; at most
  // kv_blocks_per_slot(n_ctx)) and the length `length`: its first `length` positions are already in those
  // blocks (a cached prompt prefix another sequence computed), the next token continues at `length`.
  // kInvalidArgument for a block id outside the pool or a length the blocks or the context cannot hold.
  Status set_slot(int32_t slot, std::span<const int32_t> blocks, int32_t length);
  // Forgets a slot's sequence (its cache rows are simply overwritten later; its blocks stay its own).
  void clear_slot(int32_t slot) { truncate_slot(slot, 0); }
  // Shortens a slot's sequence to `length` tokens (<= current length).
  void truncate_slot(int32_t slot, int32_t length);
  int32_t slot_length(int32_t slot) const;

  bool is_first_stage() const { return runner_options_.first_layer == 0; }
  bool is_last_stage() const { return runner_options_.end_layer == model_->config().n_layer; }
  const Model& model() const { return *model_; }
  int32_t n_vocab() const { return model_->config().n_vocab; }
  int32_t n_blocks() const { return runner_options_.n_blocks; }
  int32_t blocks_per_slot() const { return blocks_per_slot_; }
  // The options in effect (n_ctx and end_layer resolved).
  const RunnerOptions& runner_options() const { return runner_options_; }
  const RunnerStats& runner_stats() const { return runner_stats_; }
  // The stage's graph as the backend runs it (fused), and the backend.
  const graph::Graph& graph() const { return graph_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }

 protected:
  ModelRunner() = default;
  // create()'s work, for classes that add a backend's own accessors (Engine, opencl::ClEngine).
  Status init(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend, const RunnerOptions& options);

 private:
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  RunnerOptions runner_options_;
  RunnerStats runner_stats_;
  graph::Graph graph_;
  std::vector<int32_t> slot_len_, next_len_;
  int32_t blocks_per_slot_ = 0;
  std::vector<int32_t> kv_table_;  // [n_slots][blocks_per_slot_], -1 = none
  // The step's inputs and outputs (reused: no allocation per step).
  std::vector<int32_t> ids_, pos_, slots_, rows_;
  graph::StepIO io_;
  std::vector<float> output_;
  std::vector<float> embd_;
  std::vector<float> all_logits_;
  std::vector<BatchToken> eval_batch_;
};

}  // namespace inferd
