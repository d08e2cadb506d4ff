#include "inferd/opencl/cl_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "inferd/kernels/cpu.h"

namespace inferd::opencl {

namespace {

int32_t round_up(int32_t v, int32_t step) { return (v + step - 1) / step * step; }

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// The GGUF name of a layer's tensor, for messages.
std::string tensor_name(int layer, const char* what) { return "blk." + std::to_string(layer) + "." + what + ".weight"; }

Result<std::unique_ptr<MatmulWeights>> upload_matrix(Runtime& rt, const std::string& name, DType type, int64_t rows,
                                                     int64_t cols, const void* data) {
  if (!MatmulWeights::supports(type)) {
    return make_error(Code::kUnimplemented, "tensor %s has type %s, which the OpenCL backend cannot read yet",
                      name.c_str(), dtype_name(type));
  }
  auto w = MatmulWeights::upload(rt, type, rows, cols, data);
  if (!w) return w.status().with_context(name);
  return std::make_unique<MatmulWeights>(std::move(w).value());
}

Result<std::unique_ptr<MatmulWeights>> upload_view(Runtime& rt, const std::string& name, const WeightView& w) {
  return upload_matrix(rt, name, w.type, w.rows, w.cols, w.data);
}

// Several matrices of one type and width stacked into one (their rows one after the other), as one
// matmul computes them all.
Result<std::unique_ptr<MatmulWeights>> upload_stacked(Runtime& rt, const std::string& name,
                                                      std::initializer_list<const WeightView*> parts) {
  const WeightView& first = **parts.begin();
  int64_t rows = 0;
  for (const WeightView* p : parts) rows += p->rows;
  std::vector<uint8_t> host(static_cast<size_t>(rows) * first.row_bytes);
  size_t at = 0;
  for (const WeightView* p : parts) {
    INFERD_ASSERT(p->type == first.type && p->cols == first.cols && p->row_bytes == first.row_bytes);
    const size_t bytes = static_cast<size_t>(p->rows) * p->row_bytes;
    std::memcpy(host.data() + at, p->data, bytes);
    at += bytes;
  }
  return upload_matrix(rt, name, first.type, rows, first.cols, host.data());
}

// Where MatmulInput puts one quantized encoding of its input (exact numerics): the quants tensor
// and the per-block buffer (Q8: Ops::quantize_q8's scales; Q8_K: Ops::quantize_q8_k's blocks).
struct QuantTarget {
  Tensor* quants = nullptr;
  cl_mem scales = nullptr;
};

// The input of one or more matmuls. Float numerics: x itself. Exact: the float x for float weights,
// its Q8 blocks (Ops::quantize_q8) or Q8_K blocks (Ops::quantize_q8_k) for block weights, each
// computed once on first need, in the CPU engine's order for a pass of `tokens` tokens.
class MatmulInput {
 public:
  // `q8.quants` is null for float numerics; `q8k.quants` when no matrix is a K-quant.
  MatmulInput(Ops& ops, const Tensor& x, QuantTarget q8, QuantTarget q8k, CpuOrder cpu, int32_t tokens)
      : ops_(ops), x_(x), q8_(q8), q8k_(q8k), cpu_(cpu), tokens_(tokens) {}

  Status matmul(const MatmulWeights& w, Tensor& y) {
    if (q8_.quants == nullptr) return ops_.matmul(w, x_, y);
    const CpuOrder order = matmul_order(cpu_, w.type(), tokens_);
    const MatmulActivations kind = matmul_activations(w.type());
    if (kind == MatmulActivations::kFloat) return ops_.matmul_exact(w, x_, nullptr, y, order);
    if (kind == MatmulActivations::kQ8K) {
      INFERD_ASSERT(q8k_.quants != nullptr, "K-quant weights without Q8_K activation buffers");
      if (!q8k_done_) {
        INFERD_RETURN_IF_ERROR(ops_.quantize_q8_k(x_, *q8k_.quants, q8k_.scales));
        q8k_done_ = true;
      }
      return ops_.matmul_exact(w, *q8k_.quants, q8k_.scales, y, order);
    }
    if (!q8_done_) {
      INFERD_RETURN_IF_ERROR(ops_.quantize_q8(x_, *q8_.quants, q8_.scales));
      q8_done_ = true;
    }
    return ops_.matmul_exact(w, *q8_.quants, q8_.scales, y, order);
  }

 private:
  Ops& ops_;
  const Tensor& x_;
  QuantTarget q8_, q8k_;
  CpuOrder cpu_;
  int32_t tokens_;
  bool q8_done_ = false, q8k_done_ = false;
};

}  // namespace

struct ClEngine::Layer {
  std::optional<Tensor> attn_norm, ffn_norm;
  // Q|K|V as one matmul (qkv) when their types agree, else three; gate|up likewise.
  std::unique_ptr<MatmulWeights> qkv, wq, wk, wv, wo;
  std::unique_ptr<MatmulWeights> gate_up, gate, up, down;
  ClMem bias;   // Q|K|V biases (qwen2), else null
  ClMem cache;  // this layer's KV cache (ops.h AttentionGeometry)
};

// Activation tensors for n_ubatch tokens (a pass uses views of its first T tokens) and the per-pass
// buffers. Only the tensors of the chosen matmul grouping exist.
struct ClEngine::Activations {
  std::optional<Tensor> x[2];  // the residual stream, ping-ponged (images cannot be read and written by one kernel)
  std::optional<Tensor> xn, qkv, q, k, v, attn, proj, gate_up, gate, up, h;
  std::optional<Tensor> gathered, gathered_norm;  // the rows whose logits are wanted
  std::optional<Tensor> q8_e, q8_f;                // exact: Q8 quants of matmul inputs of n_embd and n_ff channels
  std::optional<Tensor> q8k_e, q8k_f;              // exact, K-quant weights: their Q8_K quants
  std::optional<Tensor> logits;                    // grows on demand (ensure_logits)
  int32_t logits_capacity = 0;
  ClMem ids, pos, slots, rows;  // int32 per token: token id, position, slot; rows for the gather
  ClMem rope;                   // [n_ubatch][head_dim] floats: rope_table() of the pass's positions
  ClMem q_half;                 // [n_ubatch][n_embd] halves, rope_kv -> attention
  ClMem q8_scales;              // exact: [n_ubatch][max(n_embd, n_ff) / 32] (d, s) of the Q8 quants
  ClMem q8k_blocks;             // exact, K-quants: [n_ubatch][max(n_embd, n_ff) / 256][kQ8KBlockFloats]
  ClMem scores;                 // exact: Ops::attention_exact's scratch
  size_t bytes = 0;
};

namespace {

// A view of the first `width` tokens of `t` (none when `t` is not allocated).
Status token_view(const std::optional<Tensor>& t, int32_t width, std::optional<Tensor>& out) {
  out.reset();
  if (!t) return Status::ok();
  auto v = t->view(Bhwc{1, 1, width, t->shape().c});
  if (!v) return v.status();
  out.emplace(std::move(v).value());
  return Status::ok();
}

}  // namespace

// The activations of one pass: views of the first T tokens of ClEngine::Activations.
struct ClEngine::PassViews {
  std::optional<Tensor> x0, x1, xn, qkv, q, k, v, attn, proj, gate_up, gate, up, h, q8_e, q8_f, q8k_e, q8k_f;

  Status bind(const Activations& a, int32_t t) {
    const std::pair<const std::optional<Tensor>*, std::optional<Tensor>*> pairs[] = {
        {&a.x[0], &x0},       {&a.x[1], &x1},   {&a.xn, &xn},     {&a.qkv, &qkv},
        {&a.q, &q},           {&a.k, &k},       {&a.v, &v},       {&a.attn, &attn},
        {&a.proj, &proj},     {&a.gate_up, &gate_up}, {&a.gate, &gate}, {&a.up, &up},
        {&a.h, &h},           {&a.q8_e, &q8_e}, {&a.q8_f, &q8_f}, {&a.q8k_e, &q8k_e}, {&a.q8k_f, &q8k_f}};
    for (const auto& [from, to] : pairs) INFERD_RETURN_IF_ERROR(token_view(*from, t, *to));
    return Status::ok();
  }
};

const char* numerics_name(Numerics numerics) { return numerics == Numerics::kExact ? "exact" : "float"; }

ClEngine::~ClEngine() = default;

Result<std::unique_ptr<ClEngine>> ClEngine::create(std::shared_ptr<const Model> model, std::unique_ptr<Runtime> runtime,
                                                   const ClEngineOptions& options) {
  INFERD_ASSERT(model != nullptr && runtime != nullptr);
  const ModelConfig& cfg = model->config();
  ClEngineOptions opt = options;
  if (opt.n_ctx == 0) opt.n_ctx = default_context(cfg);
  INFERD_RETURN_IF_ERROR(check_engine_shape(opt.n_ctx, opt.n_slots, opt.n_ubatch, opt.pad_step));
  if (opt.end_layer == 0) opt.end_layer = cfg.n_layer;
  if (opt.first_layer < 0 || opt.first_layer >= opt.end_layer || opt.end_layer > cfg.n_layer) {
    return make_error(Code::kInvalidArgument, "layer range [%d, %d) is not inside the model's %d layers",
                      opt.first_layer, opt.end_layer, cfg.n_layer);
  }
  if (cfg.n_rot != cfg.head_dim) {
    return make_error(Code::kUnimplemented, "partial rotary embeddings (n_rot %d of head_dim %d)", cfg.n_rot,
                      cfg.head_dim);
  }

  std::unique_ptr<ClEngine> e(new ClEngine());
  e->model_ = std::move(model);
  e->rt_ = std::move(runtime);
  e->ops_ = std::make_unique<Ops>(*e->rt_);
  if (opt.int_dot) e->ops_->set_int_dot(*opt.int_dot);
  e->options_ = opt;
  e->numerics_ = opt.numerics;
  e->cpu_order_ = host_cpu_order();
  if (e->numerics_ == Numerics::kExact && !e->ops_->exact_supported()) {
    e->numerics_ = Numerics::kFloat;
    e->numerics_note_ = " (exact needs cl_khr_fp64)";
  }
  AttentionGeometry& g = e->geometry_;
  g.n_head = cfg.n_head;
  g.n_head_kv = cfg.n_head_kv;
  g.head_dim = cfg.head_dim;
  g.n_slots = opt.n_slots;
  g.n_ctx = opt.n_ctx;
  g.rope_base = cfg.rope_base;
  g.rope_mode = cfg.rope_style == RopeStyle::kNeox ? RopeMode::kNeox : RopeMode::kNormal;
  INFERD_RETURN_IF_ERROR(g.check());
  if (g.layer_cache_bytes() > e->rt_->info().max_alloc_bytes) {
    return make_error(Code::kOutOfRange,
                      "a layer's KV cache (%s for %d slots of %d tokens) exceeds the device's largest buffer (%s)",
                      mib(g.layer_cache_bytes()).c_str(), opt.n_slots, opt.n_ctx,
                      mib(e->rt_->info().max_alloc_bytes).c_str());
  }

  // The activations' data type: halves only where the numerics allow them.
  const DeviceInfo& info = e->rt_->info();
  if (opt.activation_type) {
    if (*opt.activation_type == DataType::kFloat16 && e->exact()) {
      return Status(Code::kInvalidArgument,
                    "half-precision activations need float numerics: the exact numerics reproduce the CPU engine's "
                    "float activations");
    }
    e->act_type_ = *opt.activation_type;
  } else {
    e->act_type_ = !e->exact() && info.fp16 ? DataType::kFloat16 : DataType::kFloat32;
  }

  // Storages: every activation in one (the widest decides), the logits on their own.
  const int32_t widest = std::max({cfg.n_embd + 2 * cfg.n_embd_kv(), 2 * cfg.n_ff, cfg.n_embd});
  const Bhwc widest_shape{1, 1, opt.n_ubatch, widest};
  // The residual stream is float in the same storage: with half activations it may be the larger.
  const Bhwc residual_shape{1, 1, opt.n_ubatch, cfg.n_embd};
  if (opt.activation_storage) {
    e->act_storage_ = *opt.activation_storage;
    if (e->act_storage_ == StorageType::kTexture2DSplit) e->act_parts_ = split_parts(info, widest_shape);
    Status fits = TensorDescriptor(widest_shape, e->act_format(e->act_type_)).fits(info);
    if (fits) fits = TensorDescriptor(residual_shape, e->act_format(DataType::kFloat32)).fits(info);
    if (!fits) return fits.with_context("forced activation storage");
    e->storage_notes_ = " (forced)";
  } else {
    // The first storage that holds the widest activation and the float residual stream.
    const TensorSpec tensors[] = {{widest_shape, e->act_type_}, {residual_shape, DataType::kFloat32}};
    auto choice = choose_storage(info, tensors);
    if (!choice) return choice.status();
    e->act_storage_ = choice->storage;
    e->act_parts_ = choice->parts;
    for (const std::string& why : choice->fallbacks) e->storage_notes_ += " (passed over " + why + ")";
  }
  auto logits_choice = choose_storage(info, Bhwc{1, 1, opt.n_ubatch, cfg.n_vocab});
  if (!logits_choice) return logits_choice.status().with_context("logits");
  e->logits_format_ = TensorFormat(logits_choice->storage, DataType::kFloat32, logits_choice->parts);

  INFERD_RETURN_IF_ERROR(e->upload_weights());
  INFERD_RETURN_IF_ERROR(e->allocate_activations());
  e->slot_len_.assign(static_cast<size_t>(opt.n_slots), 0);
  INFERD_RETURN_IF_ERROR(e->rt_->finish());
  return e;
}

Status ClEngine::upload_weights() {
  Runtime& rt = *rt_;
  const Model& m = *model_;
  const ModelConfig& cfg = m.config();
  auto norm = [&](const WeightView& w, const char* name) -> Result<Tensor> {
    auto t = Tensor::allocate(rt, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(w.cols)},
                                                   act_format(DataType::kFloat32)));
    if (!t) return t.status().with_context(name);
    INFERD_RETURN_IF_ERROR(upload(rt, t.value(), std::span<const float>(w.f32(), static_cast<size_t>(w.cols))));
    stats_.weight_bytes += t->desc().data_bytes();
    return t;
  };
  auto count = [&](const std::unique_ptr<MatmulWeights>& w) {
    if (w) stats_.weight_bytes += w->device_bytes();
  };

  const bool first = is_first_stage(), last = is_last_stage();
  if (first || (last && cfg.tied_output)) {
    auto embd = upload_view(rt, "token_embd.weight", m.token_embd());
    if (!embd) return embd.status();
    embedding_ = std::move(embd).value();
    count(embedding_);
  }
  if (last) {
    if (!cfg.tied_output) {
      auto out = upload_view(rt, "output.weight", m.output());
      if (!out) return out.status();
      output_ = std::move(out).value();
      count(output_);
    }
    auto onorm = norm(m.output_norm(), "output_norm.weight");
    if (!onorm) return onorm.status();
    output_norm_ = std::make_unique<Tensor>(std::move(onorm).value());
  }

  layers_.resize(static_cast<size_t>(options_.end_layer - options_.first_layer));
  for (int l = options_.first_layer; l < options_.end_layer; ++l) {
    const LayerWeights& lw = m.layer(l);
    Layer& L = layers_[static_cast<size_t>(l - options_.first_layer)];
    auto an = norm(lw.attn_norm, "attn_norm");
    if (!an) return an.status();
    L.attn_norm.emplace(std::move(an).value());
    auto fn = norm(lw.ffn_norm, "ffn_norm");
    if (!fn) return fn.status();
    L.ffn_norm.emplace(std::move(fn).value());

    auto assign = [&](std::unique_ptr<MatmulWeights>& dst, Result<std::unique_ptr<MatmulWeights>> r) -> Status {
      if (!r) return r.status();
      dst = std::move(r).value();
      count(dst);
      return Status::ok();
    };
    if (lw.wq.type == lw.wk.type && lw.wq.type == lw.wv.type) {
      INFERD_RETURN_IF_ERROR(assign(L.qkv, upload_stacked(rt, tensor_name(l, "attn_q|k|v"), {&lw.wq, &lw.wk, &lw.wv})));
    } else {
      INFERD_RETURN_IF_ERROR(assign(L.wq, upload_view(rt, tensor_name(l, "attn_q"), lw.wq)));
      INFERD_RETURN_IF_ERROR(assign(L.wk, upload_view(rt, tensor_name(l, "attn_k"), lw.wk)));
      INFERD_RETURN_IF_ERROR(assign(L.wv, upload_view(rt, tensor_name(l, "attn_v"), lw.wv)));
    }
    INFERD_RETURN_IF_ERROR(assign(L.wo, upload_view(rt, tensor_name(l, "attn_output"), lw.wo)));
    if (lw.w_gate.type == lw.w_up.type && cfg.n_ff % 4 == 0) {
      INFERD_RETURN_IF_ERROR(
          assign(L.gate_up, upload_stacked(rt, tensor_name(l, "ffn_gate|up"), {&lw.w_gate, &lw.w_up})));
    } else {
      INFERD_RETURN_IF_ERROR(assign(L.gate, upload_view(rt, tensor_name(l, "ffn_gate"), lw.w_gate)));
      INFERD_RETURN_IF_ERROR(assign(L.up, upload_view(rt, tensor_name(l, "ffn_up"), lw.w_up)));
    }
    INFERD_RETURN_IF_ERROR(assign(L.down, upload_view(rt, tensor_name(l, "ffn_down"), lw.w_down)));

    if (lw.bq.present() || lw.bk.present() || lw.bv.present()) {
      const int64_t e = cfg.n_embd, ekv = cfg.n_embd_kv();
      std::vector<float> bias(static_cast<size_t>(e + 2 * ekv), 0.0f);
      if (lw.bq.present()) std::memcpy(bias.data(), lw.bq.f32(), static_cast<size_t>(e) * sizeof(float));
      if (lw.bk.present()) std::memcpy(bias.data() + e, lw.bk.f32(), static_cast<size_t>(ekv) * sizeof(float));
      if (lw.bv.present()) std::memcpy(bias.data() + e + ekv, lw.bv.f32(), static_cast<size_t>(ekv) * sizeof(float));
      auto b = rt.create_buffer(bias.size() * sizeof(float), CL_MEM_READ_ONLY, bias.data());
      if (!b) return b.status();
      L.bias = std::move(b).value();
      stats_.weight_bytes += bias.size() * sizeof(float);
    }
    auto cache = rt.create_buffer(geometry_.layer_cache_bytes());
    if (!cache) return cache.status().with_context("KV cache of layer " + std::to_string(l));
    L.cache = std::move(cache).value();
    stats_.kv_bytes += geometry_.layer_cache_bytes();
  }
  return Status::ok();
}

Status ClEngine::allocate_activations() {
  const ModelConfig& cfg = model_->config();
  act_ = std::make_unique<Activations>();
  Activations& a = *act_;
  const int32_t n = options_.n_ubatch;
  auto tensor_of = [&](std::optional<Tensor>& t, int32_t channels, DataType type) -> Status {
    auto r = Tensor::allocate(*rt_, TensorDescriptor(Bhwc{1, 1, n, channels}, act_format(type)));
    if (!r) return r.status();
    a.bytes += r->desc().data_bytes();
    t.emplace(std::move(r).value());
    return Status::ok();
  };
  auto tensor = [&](std::optional<Tensor>& t, int32_t channels) { return tensor_of(t, channels, act_type_); };
  const int32_t e = cfg.n_embd, ekv = cfg.n_embd_kv(), f = cfg.n_ff;
  // The residual stream stays float whatever the other activations are: it sums every layer's output.
  INFERD_RETURN_IF_ERROR(tensor_of(a.x[0], e, DataType::kFloat32));
  INFERD_RETURN_IF_ERROR(tensor_of(a.x[1], e, DataType::kFloat32));
  INFERD_RETURN_IF_ERROR(tensor(a.xn, e));
  INFERD_RETURN_IF_ERROR(tensor(a.attn, e));
  INFERD_RETURN_IF_ERROR(tensor(a.proj, e));
  INFERD_RETURN_IF_ERROR(tensor(a.h, f));
  if (is_last_stage()) {
    // The gathered rows are the residual stream's: float too, so a token's logits do not depend on
    // whether the others' are wanted.
    INFERD_RETURN_IF_ERROR(tensor_of(a.gathered, e, DataType::kFloat32));
    INFERD_RETURN_IF_ERROR(tensor(a.gathered_norm, e));
  }
  // Each layer may group its matmuls differently (types can vary by layer): tensors for every grouping used.
  bool fused_qkv = false, split_qkv = false, fused_ffn = false, split_ffn = false;
  for (const Layer& L : layers_) {
    (L.qkv ? fused_qkv : split_qkv) = true;
    (L.gate_up ? fused_ffn : split_ffn) = true;
  }
  if (fused_qkv) INFERD_RETURN_IF_ERROR(tensor(a.qkv, e + 2 * ekv));
  if (split_qkv) {
    INFERD_RETURN_IF_ERROR(tensor(a.q, e));
    INFERD_RETURN_IF_ERROR(tensor(a.k, ekv));
    INFERD_RETURN_IF_ERROR(tensor(a.v, ekv));
  }
  // Q8_K encodings only where a matrix is a K-quant (their widths are multiples of 256).
  bool k_quants = false;
  auto note = [&](const std::unique_ptr<MatmulWeights>& w) {
    if (w && matmul_activations(w->type()) == MatmulActivations::kQ8K) k_quants = true;
  };
  note(embedding_);
  note(output_);
  for (const Layer& L : layers_) {
    for (const auto* w : {&L.qkv, &L.wq, &L.wk, &L.wv, &L.wo, &L.gate_up, &L.gate, &L.up, &L.down}) note(*w);
  }
  if (exact()) {
    INFERD_RETURN_IF_ERROR(tensor(a.q8_e, e));
    INFERD_RETURN_IF_ERROR(tensor(a.q8_f, f));
    if (k_quants) {
      INFERD_RETURN_IF_ERROR(tensor(a.q8k_e, e));
      INFERD_RETURN_IF_ERROR(tensor(a.q8k_f, f));
    }
  }
  if (fused_ffn) INFERD_RETURN_IF_ERROR(tensor(a.gate_up, 2 * f));
  if (split_ffn) {
    INFERD_RETURN_IF_ERROR(tensor(a.gate, f));
    INFERD_RETURN_IF_ERROR(tensor(a.up, f));
  }
  auto buffer = [&](ClMem& mem, size_t bytes, cl_mem_flags flags) -> Status {
    auto r = rt_->create_buffer(bytes, flags);
    if (!r) return r.status();
    mem = std::move(r).value();
    a.bytes += bytes;
    return Status::ok();
  };
  const size_t tokens = static_cast<size_t>(n);
  for (ClMem* ints : {&a.ids, &a.pos, &a.slots, &a.rows}) {
    INFERD_RETURN_IF_ERROR(buffer(*ints, tokens * sizeof(cl_int), CL_MEM_READ_ONLY));
  }
  INFERD_RETURN_IF_ERROR(buffer(a.rope, tokens * static_cast<size_t>(cfg.head_dim) * sizeof(float), CL_MEM_READ_ONLY));
  INFERD_RETURN_IF_ERROR(buffer(a.q_half, tokens * static_cast<size_t>(e) * 2, CL_MEM_READ_WRITE));
  if (exact()) {
    INFERD_RETURN_IF_ERROR(
        buffer(a.q8_scales, tokens * static_cast<size_t>(std::max(e, f) / 32) * 2 * sizeof(float), CL_MEM_READ_WRITE));
    if (k_quants) {
      INFERD_RETURN_IF_ERROR(buffer(a.q8k_blocks,
                                    tokens * static_cast<size_t>(std::max(e, f) / 256) * kQ8KBlockFloats * sizeof(float),
                                    CL_MEM_READ_WRITE));
    }
    // The scores of every token of a pass over the whole context, within a budget: a longer pass
    // runs attention in several launches (Ops::attention_exact).
    constexpr size_t kScoresBudget = size_t{64} << 20;
    const int32_t kv_max = round_up(options_.n_ctx, options_.pad_step);
    const size_t per_token = Ops::attention_scratch_bytes(geometry_, 1, kv_max);
    const size_t tokens_fit = std::clamp<size_t>(kScoresBudget / per_token, 1, tokens);
    INFERD_RETURN_IF_ERROR(buffer(a.scores, tokens_fit * per_token, CL_MEM_READ_WRITE));
  }
  stats_.activation_bytes = a.bytes;
  return Status::ok();
}

Status ClEngine::ensure_logits(int32_t n_out) {
  Activations& a = *act_;
  if (n_out <= a.logits_capacity) return Status::ok();
  int32_t capacity = 1;
  while (capacity < n_out) capacity *= 2;
  capacity = std::min(capacity, options_.n_ubatch);
  a.logits.reset();
  if (a.logits_capacity > 0) {
    a.bytes -= TensorDescriptor(Bhwc{1, 1, a.logits_capacity, n_vocab()}, logits_format_).data_bytes();
  }
  a.logits_capacity = 0;
  auto t = Tensor::allocate(*rt_, TensorDescriptor(Bhwc{1, 1, capacity, n_vocab()}, logits_format_));
  if (!t) return t.status().with_context("logits");
  a.bytes += t->desc().data_bytes();
  a.logits.emplace(std::move(t).value());
  a.logits_capacity = capacity;
  stats_.activation_bytes = a.bytes;
  return Status::ok();
}

Result<std::span<const float>> ClEngine::forward(std::span<const BatchToken> batch, std::span<const float> hidden_in) {
  const ModelConfig& cfg = model_->config();
  if (batch.empty() || static_cast<int64_t>(batch.size()) > options_.n_ubatch) {
    return make_error(Code::kInvalidArgument, "a batch must hold 1 to %d tokens, got %zu", options_.n_ubatch,
                      batch.size());
  }
  const bool first = is_first_stage(), last = is_last_stage();
  const size_t hidden_floats = batch.size() * static_cast<size_t>(cfg.n_embd);
  if (!first && hidden_in.size() != hidden_floats) {
    return make_error(Code::kInvalidArgument, "a stage starting at layer %d needs %zu hidden-state floats, got %zu",
                      options_.first_layer, hidden_floats, hidden_in.size());
  }
  if (first && !hidden_in.empty()) {
    return make_error(Code::kInvalidArgument, "a stage starting at layer 0 embeds its tokens; got %zu hidden-state floats",
                      hidden_in.size());
  }
  // Validate everything before touching the device (the kernels trust slots and positions).
  std::vector<int32_t> next = slot_len_;
  int32_t n_out = 0, max_len = 0;
  for (const BatchToken& bt : batch) {
    if (bt.token < 0 || bt.token >= cfg.n_vocab) {
      return make_error(Code::kInvalidArgument, "token id %d is out of range [0, %d)", bt.token, cfg.n_vocab);
    }
    if (bt.slot < 0 || bt.slot >= options_.n_slots) {
      return make_error(Code::kInvalidArgument, "slot %d is out of range [0, %d)", bt.slot, options_.n_slots);
    }
    if (bt.pos >= options_.n_ctx) {
      return make_error(Code::kOutOfRange, "position %d is past the context size %d of slot %d", bt.pos,
                        options_.n_ctx, bt.slot);
    }
    if (bt.pos != next[static_cast<size_t>(bt.slot)]) {
      return make_error(Code::kInvalidArgument, "slot %d: token at position %d, but the sequence continues at %d",
                        bt.slot, bt.pos, next[static_cast<size_t>(bt.slot)]);
    }
    next[static_cast<size_t>(bt.slot)] = bt.pos + 1;
    max_len = std::max(max_len, bt.pos + 1);
    n_out += bt.logits && last ? 1 : 0;
  }
  const int32_t kv_pad = round_up(max_len, options_.pad_step);
  INFERD_RETURN_IF_ERROR(run_pass(batch, hidden_in, kv_pad, n_out));
  slot_len_ = std::move(next);
  stats_.forward_calls++;
  stats_.tokens += static_cast<int64_t>(batch.size());
  (choose_matmul_variant(static_cast<int32_t>(batch.size())) == MatmulVariant::kDecode ? stats_.decode_passes
                                                                                       : stats_.prefill_passes)++;
  stats_.kernels = ops_->kernel_count();
  if (!last) return std::span<const float>(hidden_);
  return std::span<const float>(logits_);
}

Status ClEngine::run_pass(std::span<const BatchToken> batch, std::span<const float> hidden_in, int32_t kv_pad,
                          int32_t n_out) {
  const ModelConfig& cfg = model_->config();
  Activations& a = *act_;
  Ops& ops = *ops_;
  Runtime& rt = *rt_;
  const int32_t t_count = static_cast<int32_t>(batch.size());
  const size_t ints = batch.size() * sizeof(cl_int);

  host_ids_.clear();
  host_pos_.clear();
  host_slots_.clear();
  host_rows_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    host_ids_.push_back(batch[i].token);
    host_pos_.push_back(batch[i].pos);
    host_slots_.push_back(batch[i].slot);
    if (batch[i].logits) host_rows_.push_back(static_cast<int32_t>(i));
  }
  host_rope_ = rope_table(host_pos_, cfg.head_dim, cfg.rope_base);
  // Blocking writes: the host vectors are reused by the next pass.
  INFERD_RETURN_IF_ERROR(rt.write_buffer(a.ids.get(), 0, ints, host_ids_.data()));
  INFERD_RETURN_IF_ERROR(rt.write_buffer(a.pos.get(), 0, ints, host_pos_.data()));
  INFERD_RETURN_IF_ERROR(rt.write_buffer(a.slots.get(), 0, ints, host_slots_.data()));
  INFERD_RETURN_IF_ERROR(rt.write_buffer(a.rope.get(), 0, host_rope_.size() * sizeof(float), host_rope_.data()));
  if (n_out > 0 && n_out < t_count) {
    INFERD_RETURN_IF_ERROR(rt.write_buffer(a.rows.get(), 0, static_cast<size_t>(n_out) * sizeof(cl_int), host_rows_.data()));
  }

  PassViews p;
  INFERD_RETURN_IF_ERROR(p.bind(a, t_count));
  const TokenPlacement tokens{a.pos.get(), a.slots.get(), a.rope.get()};
  const float eps = cfg.rms_eps;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  const int32_t e4 = cfg.n_embd / 4, ekv4 = cfg.n_embd_kv() / 4;
  const bool ex = exact();
  auto rms_norm = [&](const Tensor& x, const Tensor& w, Tensor& dst) {
    return ex ? ops.rms_norm_exact(x, w, eps, dst) : ops.rms_norm(x, w, eps, dst);
  };
  // The input of matmuls: Q8 (Q8_K) quants into q8_e (q8k_e) for n_embd channels or q8_f (q8k_f) for
  // n_ff when exact.
  auto target = [](std::optional<Tensor>& t, const ClMem& scales) {
    return QuantTarget{t ? &*t : nullptr, scales.get()};
  };
  const QuantTarget q8_e = target(p.q8_e, a.q8_scales), q8_f = target(p.q8_f, a.q8_scales);
  const QuantTarget q8k_e = target(p.q8k_e, a.q8k_blocks), q8k_f = target(p.q8k_f, a.q8k_blocks);
  auto input = [&](const Tensor& x, QuantTarget q8, QuantTarget q8k) {
    return MatmulInput(ops, x, q8, q8k, cpu_order_, t_count);
  };

  // Embeddings, or the previous pipeline stage's hidden states (the same floats the CPU engine's
  // residual stream holds there).
  if (is_first_stage()) {
    INFERD_RETURN_IF_ERROR(ops.get_rows(*embedding_, a.ids.get(), *p.x0));
  } else {
    INFERD_RETURN_IF_ERROR(upload(rt, *p.x0, hidden_in).with_context("hidden states"));
  }
  Tensor* cur = &*p.x0;
  Tensor* other = &*p.x1;
  for (int l = options_.first_layer; l < options_.end_layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l - options_.first_layer)];
    auto in_layer = [l](const Status& s) { return s.with_context("layer " + std::to_string(l)); };
    // Attention block.
    INFERD_RETURN_IF_ERROR(rms_norm(*cur, *L.attn_norm, *p.xn));
    MatmulInput attn_in = input(*p.xn, q8_e, q8k_e);
    TensorSlice qs, ks, vs;
    if (L.qkv) {
      INFERD_RETURN_IF_ERROR(in_layer(attn_in.matmul(*L.qkv, *p.qkv)));
      qs = {&*p.qkv, 0};
      ks = {&*p.qkv, e4};
      vs = {&*p.qkv, e4 + ekv4};
    } else {
      INFERD_RETURN_IF_ERROR(in_layer(attn_in.matmul(*L.wq, *p.q)));
      INFERD_RETURN_IF_ERROR(in_layer(attn_in.matmul(*L.wk, *p.k)));
      INFERD_RETURN_IF_ERROR(in_layer(attn_in.matmul(*L.wv, *p.v)));
      qs = {&*p.q, 0};
      ks = {&*p.k, 0};
      vs = {&*p.v, 0};
    }
    INFERD_RETURN_IF_ERROR(
        in_layer(ops.rope_kv(geometry_, qs, ks, vs, L.bias.get(), tokens, a.q_half.get(), L.cache.get())));
    INFERD_RETURN_IF_ERROR(in_layer(
        ex ? ops.attention_exact(geometry_, a.q_half.get(), tokens, kv_pad, kq_scale, L.cache.get(), a.scores.get(),
                                 cpu_order_, *p.attn)
           : ops.attention(geometry_, a.q_half.get(), tokens, kv_pad, kq_scale, L.cache.get(), *p.attn)));
    INFERD_RETURN_IF_ERROR(in_layer(input(*p.attn, q8_e, q8k_e).matmul(*L.wo, *p.proj)));
    INFERD_RETURN_IF_ERROR(ops.add(*cur, *p.proj, *other));
    std::swap(cur, other);
    // FFN block.
    INFERD_RETURN_IF_ERROR(rms_norm(*cur, *L.ffn_norm, *p.xn));
    MatmulInput ffn_in = input(*p.xn, q8_e, q8k_e);
    if (L.gate_up) {
      INFERD_RETURN_IF_ERROR(in_layer(ffn_in.matmul(*L.gate_up, *p.gate_up)));
      INFERD_RETURN_IF_ERROR(ex ? ops.swiglu_halves_exact(*p.gate_up, *p.h) : ops.swiglu_halves(*p.gate_up, *p.h));
    } else {
      INFERD_RETURN_IF_ERROR(in_layer(ffn_in.matmul(*L.gate, *p.gate)));
      INFERD_RETURN_IF_ERROR(in_layer(ffn_in.matmul(*L.up, *p.up)));
      INFERD_RETURN_IF_ERROR(ex ? ops.swiglu_exact(*p.gate, *p.up, *p.h) : ops.swiglu(*p.gate, *p.up, *p.h));
    }
    INFERD_RETURN_IF_ERROR(in_layer(input(*p.h, q8_f, q8k_f).matmul(*L.down, *p.proj)));
    INFERD_RETURN_IF_ERROR(ops.add(*cur, *p.proj, *other));
    std::swap(cur, other);
  }

  if (!is_last_stage()) {  // hand the residual stream on; no output norm, no logits
    hidden_.resize(static_cast<size_t>(t_count) * static_cast<size_t>(cfg.n_embd));
    return download(rt, *cur, hidden_).with_context("hidden states");
  }
  logits_.resize(static_cast<size_t>(n_out) * static_cast<size_t>(cfg.n_vocab));
  if (n_out == 0) return rt.finish();
  // Output: the wanted rows only, normalised and projected; the logits come back to the host.
  std::optional<Tensor> gathered, gathered_norm, quants, quants_k, logits;
  INFERD_RETURN_IF_ERROR(token_view(a.gathered, n_out, gathered));
  INFERD_RETURN_IF_ERROR(token_view(a.gathered_norm, n_out, gathered_norm));
  INFERD_RETURN_IF_ERROR(token_view(a.q8_e, n_out, quants));
  INFERD_RETURN_IF_ERROR(token_view(a.q8k_e, n_out, quants_k));
  const Tensor* rows = cur;
  if (n_out < t_count) {
    INFERD_RETURN_IF_ERROR(ops.gather(*cur, a.rows.get(), *gathered));
    rows = &*gathered;
  }
  INFERD_RETURN_IF_ERROR(rms_norm(*rows, *output_norm_, *gathered_norm));
  INFERD_RETURN_IF_ERROR(ensure_logits(n_out));
  INFERD_RETURN_IF_ERROR(token_view(a.logits, n_out, logits));
  MatmulInput out_in = input(*gathered_norm, target(quants, a.q8_scales), target(quants_k, a.q8k_blocks));
  INFERD_RETURN_IF_ERROR(out_in.matmul(output_ ? *output_ : *embedding_, *logits).with_context("output"));
  return download(rt, *logits, logits_);
}

Result<std::span<const float>> ClEngine::eval(int32_t slot, std::span<const int32_t> tokens, bool all_logits) {
  if (!is_first_stage() || !is_last_stage()) {
    return make_error(Code::kInvalidArgument, "eval() runs whole models; a pipeline stage is driven by forward()");
  }
  if (slot < 0 || slot >= options_.n_slots) {
    return make_error(Code::kInvalidArgument, "slot %d is out of range [0, %d)", slot, options_.n_slots);
  }
  if (tokens.empty()) return make_error(Code::kInvalidArgument, "nothing to evaluate: no tokens");
  const int64_t start = slot_len_[static_cast<size_t>(slot)];
  if (start + static_cast<int64_t>(tokens.size()) > options_.n_ctx) {
    return make_error(Code::kOutOfRange, "%lld tokens after %lld already in slot %d exceed the context size %d",
                      static_cast<long long>(tokens.size()), static_cast<long long>(start), slot, options_.n_ctx);
  }
  const size_t nv = static_cast<size_t>(n_vocab());
  if (all_logits) all_logits_.resize(tokens.size() * nv);
  std::vector<BatchToken> batch;
  std::span<const float> last;
  for (size_t i0 = 0; i0 < tokens.size(); i0 += static_cast<size_t>(options_.n_ubatch)) {
    const size_t i1 = std::min(tokens.size(), i0 + static_cast<size_t>(options_.n_ubatch));
    batch.clear();
    for (size_t i = i0; i < i1; ++i) {
      batch.push_back(BatchToken{tokens[i], slot, static_cast<int32_t>(start + static_cast<int64_t>(i)),
                                 all_logits || i + 1 == tokens.size()});
    }
    auto r = forward(batch);
    if (!r) return r.status();
    if (all_logits) std::copy(r->begin(), r->end(), all_logits_.begin() + static_cast<std::ptrdiff_t>(i0 * nv));
    last = r.value();
  }
  if (all_logits) return std::span<const float>(all_logits_);
  return last;
}

void ClEngine::clear_slot(int32_t slot) { truncate_slot(slot, 0); }

void ClEngine::truncate_slot(int32_t slot, int32_t length) {
  INFERD_ASSERT(slot >= 0 && slot < options_.n_slots);
  INFERD_ASSERT(length >= 0 && length <= slot_len_[static_cast<size_t>(slot)]);
  slot_len_[static_cast<size_t>(slot)] = length;
}

int32_t ClEngine::slot_length(int32_t slot) const {
  INFERD_ASSERT(slot >= 0 && slot < options_.n_slots);
  return slot_len_[static_cast<size_t>(slot)];
}

std::string ClEngine::describe() const {
  const DeviceInfo& d = rt_->info();
  return "OpenCL: " + d.name + " (" + d.vendor + ", driver " + d.driver_version + "), storage: weights=buffer activations=" +
         act_format(act_type_).to_string() + storage_notes_ + " logits=" + logits_format_.to_string() +
         " kv=buffer(f16), numerics " + numerics_name(numerics_) +
         (exact() ? std::string(" (") + cpu_order_name(cpu_order_) + ", " + int_dot_name(ops_->int_dot()) + " dot)"
                  : numerics_note_) +
         ", weights " +
         mib(stats_.weight_bytes) +
         (is_first_stage() && is_last_stage()
              ? ""
              : ", layers " + std::to_string(options_.first_layer) + "-" + std::to_string(options_.end_layer - 1));
}

}  // namespace inferd::opencl
