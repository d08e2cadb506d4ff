#include "inferd/model_runner.h"

#include <algorithm>

#include "inferd/graph_builder.h"

namespace inferd {

namespace {

int32_t round_up(int32_t v, int32_t step) { return (v + step - 1) / step * step; }

}  // namespace

Status check_engine_shape(int32_t n_ctx, int32_t n_slots, int32_t n_ubatch, int32_t pad_step) {
  if (n_ctx < 1 || n_ctx > (1 << 20)) {
    return make_error(Code::kInvalidArgument, "n_ctx must be in [1, 1048576], got %d", n_ctx);
  }
  if (n_slots < 1 || n_slots > 1024) {
    return make_error(Code::kInvalidArgument, "n_slots must be in [1, 1024], got %d", n_slots);
  }
  if (n_ubatch < 1 || n_ubatch > 8192) {
    return make_error(Code::kInvalidArgument, "n_ubatch must be in [1, 8192], got %d", n_ubatch);
  }
  if (pad_step != 64 && pad_step != 128) {
    return make_error(Code::kInvalidArgument, "pad_step must be 64 or 128, got %d", pad_step);
  }
  return Status::ok();
}

ModelRunner::~ModelRunner() = default;

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(std::shared_ptr<const Model> model,
                                                         std::unique_ptr<Backend> backend, const RunnerOptions& options) {
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  INFERD_RETURN_IF_ERROR(r->init(std::move(model), std::move(backend), options));
  return r;
}

Status ModelRunner::init(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                         const RunnerOptions& options) {
  INFERD_ASSERT(model != nullptr && backend != nullptr);
  const ModelConfig& cfg = model->config();
  RunnerOptions opt = options;
  if (opt.n_ctx == 0) opt.n_ctx = default_context(cfg);
  INFERD_RETURN_IF_ERROR(check_engine_shape(opt.n_ctx, opt.n_slots, opt.n_ubatch, opt.pad_step));
  const int32_t per_slot = graph::kv_blocks_per_slot(opt.n_ctx);
  const int64_t own_runs = static_cast<int64_t>(per_slot) * opt.n_slots;
  if (opt.n_blocks == 0) opt.n_blocks = static_cast<int32_t>(std::min<int64_t>(own_runs, 1 << 24));
  if (opt.n_blocks < 1 || opt.n_blocks > (1 << 24)) {
    return make_error(Code::kInvalidArgument, "n_blocks must be in [1, 16777216], got %d", opt.n_blocks);
  }
  if (opt.end_layer == 0) opt.end_layer = cfg.n_layer;
  auto g = graph::build_forward(*model, opt.first_layer, opt.end_layer);
  if (!g) return g.status();
  graph::Graph graph = std::move(g).value();
  const Backend& be = *backend;
  graph::fuse(graph, [&be](const graph::Graph& gr, const graph::Node& n) { return be.supports(gr, n); });
  INFERD_RETURN_IF_ERROR(graph.validate().with_context("the graph fused for backend " + std::string(backend->family())));
  for (const graph::Node& n : graph.nodes()) {
    if (!backend->supports(graph, n)) {
      return Status(Code::kUnimplemented, std::string("backend ") + std::string(backend->family()) + " cannot run " +
                                              graph::op_name(n.op) + " (" + graph.tensor(n.out[0]).name + ")");
    }
  }
  INFERD_RETURN_IF_ERROR(
      backend->prepare(graph, BackendShape{opt.n_slots, opt.n_ctx, opt.n_ubatch, opt.pad_step, opt.n_blocks}));
  model_ = std::move(model);
  backend_ = std::move(backend);
  runner_options_ = opt;
  graph_ = std::move(graph);
  slot_len_.assign(static_cast<size_t>(opt.n_slots), 0);
  next_len_ = slot_len_;
  blocks_per_slot_ = per_slot;
  kv_table_.resize(static_cast<size_t>(own_runs));
  for (int64_t i = 0; i < own_runs; ++i) kv_table_[static_cast<size_t>(i)] = i < opt.n_blocks ? static_cast<int32_t>(i) : -1;
  io_.kv_table = kv_table_;
  const size_t n = static_cast<size_t>(opt.n_ubatch);
  ids_.reserve(n);
  pos_.reserve(n);
  slots_.reserve(n);
  rows_.reserve(n);
  io_.inputs.assign(graph_.inputs().size(), graph::HostTensor{});
  // The logits (or a stage's hidden states) and, on the last stage, the normalized hidden states.
  io_.outputs.clear();
  for (graph::TensorId id : graph_.outputs()) {
    INFERD_ASSERT(id == graph_.io.logits || id == graph_.io.hidden_out || id == graph_.io.embd,
                  "graph output %s is not bound", graph_.tensor(id).name.c_str());
    io_.outputs.push_back(id == graph_.io.embd ? &embd_ : &output_);
  }
  return Status::ok();
}

Result<std::span<const float>> ModelRunner::forward(std::span<const BatchToken> batch, std::span<const float> hidden_in) {
  const RunnerOptions& opt = runner_options_;
  const ModelConfig& cfg = model_->config();
  if (batch.empty() || static_cast<int64_t>(batch.size()) > opt.n_ubatch) {
    return make_error(Code::kInvalidArgument, "a batch must hold 1 to %d tokens, got %zu", opt.n_ubatch, batch.size());
  }
  const bool first = is_first_stage(), last = is_last_stage();
  const size_t hidden_floats = batch.size() * static_cast<size_t>(cfg.n_embd);
  if (!first && hidden_in.size() != hidden_floats) {
    return make_error(Code::kInvalidArgument, "a stage starting at layer %d needs %zu hidden-state floats, got %zu",
                      opt.first_layer, hidden_floats, hidden_in.size());
  }
  if (first && !hidden_in.empty()) {
    return make_error(Code::kInvalidArgument, "a stage starting at layer 0 embeds its tokens; got %zu hidden-state floats",
                      hidden_in.size());
  }
  // Validate everything before anything reaches the backend (its kernels trust slots and positions).
  std::copy(slot_len_.begin(), slot_len_.end(), next_len_.begin());
  int32_t n_out = 0, max_len = 0;
  for (const BatchToken& bt : batch) {
    if (bt.token < 0 || bt.token >= cfg.n_vocab) {
      return make_error(Code::kInvalidArgument, "token id %d is out of range [0, %d)", bt.token, cfg.n_vocab);
    }
    if (bt.slot < 0 || bt.slot >= opt.n_slots) {
      return make_error(Code::kInvalidArgument, "slot %d is out of range [0, %d)", bt.slot, opt.n_slots);
    }
    if (bt.pos >= opt.n_ctx) {
      return make_error(Code::kOutOfRange, "position %d is past the context size %d of slot %d", bt.pos, opt.n_ctx,
                        bt.slot);
    }
    int32_t& next = next_len_[static_cast<size_t>(bt.slot)];
    if (bt.pos != next) {
      return make_error(Code::kInvalidArgument, "slot %d: token at position %d, but the sequence continues at %d",
                        bt.slot, bt.pos, next);
    }
    // The blocks of the slot's earlier positions are valid (set_slot, earlier steps); this one's must be.
    if (kv_table_[static_cast<size_t>(bt.slot) * static_cast<size_t>(blocks_per_slot_) +
                  static_cast<size_t>(bt.pos / graph::kKvBlockTokens)] < 0) {
      return make_error(Code::kInvalidArgument, "slot %d has no KV block for position %d", bt.slot, bt.pos);
    }
    next = bt.pos + 1;
    max_len = std::max(max_len, bt.pos + 1);
    n_out += bt.logits && last ? 1 : 0;
  }

  ids_.clear();
  pos_.clear();
  slots_.clear();
  rows_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    ids_.push_back(batch[i].token);
    pos_.push_back(batch[i].pos);
    slots_.push_back(batch[i].slot);
    if (batch[i].logits && last) rows_.push_back(static_cast<int32_t>(i));
  }
  io_.shape = graph::StepShape{static_cast<int32_t>(batch.size()), n_out, round_up(max_len, opt.pad_step)};
  const std::vector<graph::TensorId>& inputs = graph_.inputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const graph::TensorId id = inputs[i];
    graph::HostTensor& h = io_.inputs[i];
    if (id == graph_.io.token_ids) {
      h = {ids_.data(), ids_.size()};
    } else if (id == graph_.io.positions) {
      h = {pos_.data(), pos_.size()};
    } else if (id == graph_.io.slots) {
      h = {slots_.data(), slots_.size()};
    } else if (id == graph_.io.out_rows) {
      h = {rows_.data(), rows_.size()};
    } else if (id == graph_.io.hidden_in) {
      h = {hidden_in.data(), hidden_in.size()};
    } else {
      INFERD_ASSERT(false, "graph input %s is not bound", graph_.tensor(id).name.c_str());
    }
  }
  INFERD_RETURN_IF_ERROR(backend_->compute(graph_, io_));
  slot_len_.swap(next_len_);
  runner_stats_.forward_calls++;
  runner_stats_.tokens += static_cast<int64_t>(batch.size());
  return std::span<const float>(output_);
}

Result<std::span<const float>> ModelRunner::eval(int32_t slot, std::span<const int32_t> tokens, bool all_logits) {
  const RunnerOptions& opt = runner_options_;
  if (!is_first_stage() || !is_last_stage()) {
    return make_error(Code::kInvalidArgument, "eval() runs whole models; a pipeline stage is driven by forward()");
  }
  if (slot < 0 || slot >= opt.n_slots) {
    return make_error(Code::kInvalidArgument, "slot %d is out of range [0, %d)", slot, opt.n_slots);
  }
  if (tokens.empty()) return make_error(Code::kInvalidArgument, "nothing to evaluate: no tokens");
  const int64_t start = slot_len_[static_cast<size_t>(slot)];
  if (start + static_cast<int64_t>(tokens.size()) > opt.n_ctx) {
    return make_error(Code::kOutOfRange, "%lld tokens after %lld already in slot %d exceed the context size %d",
                      static_cast<long long>(tokens.size()), static_cast<long long>(start), slot, opt.n_ctx);
  }
  const size_t nv = static_cast<size_t>(n_vocab());
  if (all_logits) all_logits_.resize(tokens.size() * nv);
  std::span<const float> last;
  for (size_t i0 = 0; i0 < tokens.size(); i0 += static_cast<size_t>(opt.n_ubatch)) {
    const size_t i1 = std::min(tokens.size(), i0 + static_cast<size_t>(opt.n_ubatch));
    eval_batch_.clear();
    for (size_t i = i0; i < i1; ++i) {
      eval_batch_.push_back(BatchToken{tokens[i], slot, static_cast<int32_t>(start + static_cast<int64_t>(i)),
                                       all_logits || i + 1 == tokens.size()});
    }
    auto r = forward(eval_batch_);
    if (!r) return r.status();
    if (all_logits) std::copy(r->begin(), r->end(), all_logits_.begin() + static_cast<std::ptrdiff_t>(i0 * nv));
    last = r.value();
  }
  if (all_logits) return std::span<const float>(all_logits_);
  return last;
}

Status ModelRunner::set_slot(int32_t slot, std::span<const int32_t> blocks, int32_t length) {
  const RunnerOptions& opt = runner_options_;
  if (slot < 0 || slot >= opt.n_slots) {
    return make_error(Code::kInvalidArgument, "slot %d is out of range [0, %d)", slot, opt.n_slots);
  }
  if (blocks.size() > static_cast<size_t>(blocks_per_slot_)) {
    return make_error(Code::kInvalidArgument, "slot %d: %zu KV blocks, but a slot has at most %d", slot, blocks.size(),
                      blocks_per_slot_);
  }
  for (int32_t b : blocks) {
    if (b < 0 || b >= opt.n_blocks) {
      return make_error(Code::kInvalidArgument, "slot %d: KV block %d is outside the pool [0, %d)", slot, b, opt.n_blocks);
    }
  }
  if (length < 0 || length > opt.n_ctx || static_cast<int64_t>(length) > static_cast<int64_t>(blocks.size()) * graph::kKvBlockTokens) {
    return make_error(Code::kInvalidArgument, "slot %d: a length of %d does not fit its %zu KV blocks", slot, length,
                      blocks.size());
  }
  int32_t* row = &kv_table_[static_cast<size_t>(slot) * static_cast<size_t>(blocks_per_slot_)];
  std::copy(blocks.begin(), blocks.end(), row);
  std::fill(row + blocks.size(), row + blocks_per_slot_, -1);
  slot_len_[static_cast<size_t>(slot)] = length;
  return Status::ok();
}

void ModelRunner::truncate_slot(int32_t slot, int32_t length) {
  INFERD_ASSERT(slot >= 0 && slot < runner_options_.n_slots);
  INFERD_ASSERT(length >= 0 && length <= slot_len_[static_cast<size_t>(slot)]);
  slot_len_[static_cast<size_t>(slot)] = length;
}

int32_t ModelRunner::slot_length(int32_t slot) const {
  INFERD_ASSERT(slot >= 0 && slot < runner_options_.n_slots);
  return slot_len_[static_cast<size_t>(slot)];
}

}  // namespace inferd
