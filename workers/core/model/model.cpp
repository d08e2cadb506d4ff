#include "inferd/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <utility>


namespace inferd {
namespace {

// Reads `arch.suffix` as u32, or returns `fallback` when absent and `required` is false.
Result<uint32_t> arch_u32(const gguf::GgufFile& f, const std::string& arch, const char* suffix, bool required,
                          uint32_t fallback = 0) {
  std::string key = arch + "." + suffix;
  if (!f.has_key(key)) {
    if (required) return make_error(Code::kCorrupt, "%s: missing metadata key %s", f.path().c_str(), key.c_str());
    return fallback;
  }
  return f.get_u32(key);
}

Result<float> arch_f32(const gguf::GgufFile& f, const std::string& arch, const char* suffix, float fallback) {
  std::string key = arch + "." + suffix;
  if (!f.has_key(key)) return fallback;
  return f.get_f32(key);
}

class TensorBinder {
 public:
  explicit TensorBinder(const gguf::GgufFile& f) : f_(f) {}

  // Binds tensor `name` with GGUF shape ne = {cols, rows} (rows == 1 for vectors).
  Status bind(const std::string& name, int64_t cols, int64_t rows, bool required, WeightView* out) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (t == nullptr) {
      if (!required) return Status::ok();
      return make_error(Code::kCorrupt, "%s: missing tensor %s", f_.path().c_str(), name.c_str());
    }
    const int64_t want_dims = rows == 1 ? 1 : 2;
    const int64_t t_rows = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->ne[0] != cols || t_rows != rows || (t->n_dims > want_dims && t->ne[2] * t->ne[3] != 1)) {
      return make_error(Code::kCorrupt, "%s: tensor %s has shape [%lld, %lld], expected [%lld, %lld]",
                        f_.path().c_str(), name.c_str(), static_cast<long long>(t->ne[0]),
                        static_cast<long long>(t_rows), static_cast<long long>(cols), static_cast<long long>(rows));
    }
    if (rows == 1 && t->type != DType::kF32) {
      return make_error(Code::kUnimplemented, "%s: tensor %s has type %s; vectors must be F32", f_.path().c_str(),
                        name.c_str(), dtype_name(t->type));
    }
    if (rows > 1 && !dtype_info(t->type)->weight_type) {
      return make_error(Code::kUnimplemented, "%s: tensor %s has type %s, which inferd cannot compute with",
                        f_.path().c_str(), name.c_str(), dtype_name(t->type));
    }
    out->data = t->data;
    out->type = t->type;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = dtype_row_bytes(t->type, cols);
    out->layout = t->layout;
    bytes_ += t->nbytes;
    return Status::ok();
  }

  size_t bytes() const { return bytes_; }

 private:
  const gguf::GgufFile& f_;
  size_t bytes_ = 0;
};

// Splits a bound matrix into consecutive row ranges, each a matrix of its own (the parts of a fused
// tensor): part i is the next parts[i].first rows. An interleaved matrix splits only at multiples of 16
// rows (its groups); a segment that interleaved one splitting elsewhere is refused (kUnimplemented),
// naming the way out.
Status split_rows(const gguf::GgufFile& f, const std::string& name, const WeightView& w,
                  std::initializer_list<std::pair<int64_t, WeightView*>> parts) {
  int64_t r0 = 0;
  for (const auto& [n, out] : parts) {
    INFERD_ASSERT(n > 0 && r0 + n <= w.rows, "row range outside the matrix");
    if (w.layout == WeightLayout::kInterleaved16 && (r0 % kInterleaveRows != 0 || n % kInterleaveRows != 0)) {
      return make_error(Code::kUnimplemented,
                        "%s: tensor %s is interleaved in groups of 16 rows but splits at row %lld (%lld rows); "
                        "load it with INFERD_WEIGHTS_LAYOUT=rows",
                        f.path().c_str(), name.c_str(), static_cast<long long>(r0), static_cast<long long>(n));
    }
    *out = w;
    out->data = w.data + static_cast<size_t>(r0) * w.row_bytes;
    out->rows = n;
    r0 += n;
  }
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<const Model>> Model::open(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  if (!file) return file.status();
  return load(std::shared_ptr<const gguf::GgufFile>(std::move(file).value()));
}

Result<std::shared_ptr<const Model>> Model::load(std::shared_ptr<const gguf::GgufFile> file) {
  const gguf::GgufFile& f = *file;
  std::shared_ptr<Model> m(new Model());
  m->file_ = file;
  ModelConfig& c = m->config_;

  auto arch = f.get_string("general.architecture");
  if (!arch) return arch.status();
  c.arch = std::string(arch.value());
  if (c.arch == "llama") {
    c.rope_style = RopeStyle::kNormal;
  } else if (c.arch == "qwen2") {
    c.rope_style = RopeStyle::kNeox;
  } else if (c.arch == "qwen3") {
    c.rope_style = RopeStyle::kNeox;
    c.qk_norm = true;
  } else if (c.arch == "gemma3") {
    c.rope_style = RopeStyle::kNeox;
    c.qk_norm = true;
    c.post_norms = true;
    c.ffn_act = FfnActivation::kGeluTanh;
  } else if (c.arch == "phi3") {
    c.rope_style = RopeStyle::kNeox;
  } else {
    return make_error(Code::kUnimplemented,
                      "%s: architecture '%s' is not supported (supported: llama, mistral as llama, qwen2, qwen3, gemma3, "
                      "phi3)",
                      f.path().c_str(), c.arch.c_str());
  }
  if (f.has_key("general.name")) {
    auto name = f.get_string("general.name");
    if (name) c.name = std::string(name.value());
  }

  struct U32Field {
    const char* key;
    int32_t* dst;
    bool required;
  };
  const U32Field fields[] = {
      {"embedding_length", &c.n_embd, true},     {"block_count", &c.n_layer, true},
      {"attention.head_count", &c.n_head, true}, {"feed_forward_length", &c.n_ff, true},
      {"context_length", &c.n_ctx_train, false},
  };
  for (const U32Field& fld : fields) {
    auto v = arch_u32(f, c.arch, fld.key, fld.required);
    if (!v) return v.status();
    if (v.value() > (1u << 24)) {
      return make_error(Code::kCorrupt, "%s: %s.%s = %u is out of range", f.path().c_str(), c.arch.c_str(), fld.key,
                        v.value());
    }
    *fld.dst = static_cast<int32_t>(v.value());
  }
  auto n_head_kv = arch_u32(f, c.arch, "attention.head_count_kv", false, static_cast<uint32_t>(c.n_head));
  if (!n_head_kv) return n_head_kv.status();
  c.n_head_kv = static_cast<int32_t>(n_head_kv.value());
  auto eps = arch_f32(f, c.arch, "attention.layer_norm_rms_epsilon", 1e-5f);
  if (!eps) return eps.status();
  c.rms_eps = eps.value();
  auto base = arch_f32(f, c.arch, "rope.freq_base", 10000.0f);
  if (!base) return base.status();
  c.rope_base = base.value();

  if (c.n_embd <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_ff <= 0 || c.n_head_kv <= 0 ||
      c.n_head % c.n_head_kv != 0 ||
      (c.n_embd % c.n_head != 0 && !f.has_key(c.arch + ".attention.key_length"))) {
    return make_error(Code::kCorrupt,
                      "%s: inconsistent hyper-parameters (n_embd %d, n_head %d, n_head_kv %d, n_layer %d, n_ff %d)",
                      f.path().c_str(), c.n_embd, c.n_head, c.n_head_kv, c.n_layer, c.n_ff);
  }
  auto key_length = arch_u32(f, c.arch, "attention.key_length", false, static_cast<uint32_t>(c.n_embd / c.n_head));
  if (!key_length) return key_length.status();
  auto value_length = arch_u32(f, c.arch, "attention.value_length", false, key_length.value());
  if (!value_length) return value_length.status();
  if (key_length.value() == 0 || key_length.value() > 4096 || value_length.value() != key_length.value()) {
    return make_error(Code::kUnimplemented, "%s: attention key length %u and value length %u are not supported",
                      f.path().c_str(), key_length.value(), value_length.value());
  }
  c.head_dim = static_cast<int32_t>(key_length.value());
  if (static_cast<int64_t>(c.n_head) * c.head_dim > (1 << 24)) {
    return make_error(Code::kCorrupt, "%s: %d heads of %d values are out of range", f.path().c_str(), c.n_head,
                      c.head_dim);
  }
  auto n_rot = arch_u32(f, c.arch, "rope.dimension_count", false, static_cast<uint32_t>(c.head_dim));
  if (!n_rot) return n_rot.status();
  c.n_rot = static_cast<int32_t>(n_rot.value());
  if (c.n_rot != c.head_dim || c.head_dim % 2 != 0) {
    return make_error(Code::kUnimplemented, "%s: rope over %d of %d head dimensions is not supported",
                      f.path().c_str(), c.n_rot, c.head_dim);
  }
  if (c.rms_eps <= 0.0f || !(c.rope_base > 0.0f)) {
    return make_error(Code::kCorrupt, "%s: invalid rms epsilon %g or rope base %g", f.path().c_str(),
                      static_cast<double>(c.rms_eps), static_cast<double>(c.rope_base));
  }
  // RoPE scaling, as the metadata says (llama.cpp's reading: the type defaults to linear, the factor
  // is rope.scaling.factor, else rope.scale_linear; 0 or 1 means none).
  std::string scaling = "linear";
  if (f.has_key(c.arch + ".rope.scaling.type")) {
    auto t = f.get_string(c.arch + ".rope.scaling.type");
    if (!t) return t.status();
    scaling = std::string(t.value());
  }
  float factor = 0.0f;
  for (const char* key : {"rope.scaling.factor", "rope.scale_linear"}) {
    if (factor != 0.0f) break;
    auto v = arch_f32(f, c.arch, key, 0.0f);
    if (!v) return v.status();
    factor = v.value();
  }
  if (!(factor >= 0.0f) || factor > 1e6f) {
    return make_error(Code::kCorrupt, "%s: invalid rope scaling factor %g", f.path().c_str(), static_cast<double>(factor));
  }
  if (scaling != "none" && factor != 0.0f && factor != 1.0f) {
    if (scaling != "linear") {
      return make_error(Code::kUnimplemented, "%s: rope scaling '%s' is not supported (supported: none, linear)",
                        f.path().c_str(), scaling.c_str());
    }
    c.rope_freq_scale = 1.0f / factor;
  }
  if (c.arch == "gemma3") {
    // Gemma 3 (llama.cpp's reading): embeddings times sqrt(n_embd); every sixth layer global, the others
    // a sliding window with RoPE base 10000; q.k scaled by 1/sqrt(head_dim), except the 27B model
    // (62 layers), which scales by 1/sqrt(n_embd / n_head).
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    auto window = arch_u32(f, c.arch, "attention.sliding_window", false, 0);
    if (!window) return window.status();
    if (window.value() > 0) {
      c.swa_window = static_cast<int32_t>(std::min<uint32_t>(window.value(), 1u << 24));
      c.swa_pattern = 6;
      c.rope_base_swa = 10000.0f;
    }
    c.attn_scale = c.n_layer == 62 ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head))
                                   : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    auto softcap = arch_f32(f, c.arch, "final_logit_softcapping", 0.0f);
    if (!softcap) return softcap.status();
    if (softcap.value() != 0.0f) {
      return make_error(Code::kUnimplemented, "%s: final logit soft-capping is not supported", f.path().c_str());
    }
  }

  if (c.arch == "phi3") {
    // Phi-3 (llama.cpp's reading): Q is scaled by 1/sqrt(head_dim) before the product; its sliding window is
    // ignored (llama.cpp disables it for this architecture). LongRoPE files (the 128k models) are refused.
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
      if (f.find_tensor(name) != nullptr) {
        return make_error(Code::kUnimplemented, "%s: Phi-3 LongRoPE (%s, the 128k-context models) is not supported",
                          f.path().c_str(), name);
      }
    }
  }

  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) return make_error(Code::kCorrupt, "%s: missing tensor token_embd.weight", f.path().c_str());
  if (embd->n_dims < 2 || embd->ne[1] <= 0 || embd->ne[1] > (1 << 24)) {
    return make_error(Code::kCorrupt, "%s: token_embd.weight has an invalid shape", f.path().c_str());
  }
  c.n_vocab = static_cast<int32_t>(embd->ne[1]);

  TensorBinder b(f);
  const int64_t e = c.n_embd, eq = c.n_embd_q(), ekv = c.n_embd_kv(), ff = c.n_ff, nv = c.n_vocab, hd = c.head_dim;
  INFERD_RETURN_IF_ERROR(b.bind("token_embd.weight", e, nv, true, &m->token_embd_));
  INFERD_RETURN_IF_ERROR(b.bind("output_norm.weight", e, 1, true, &m->output_norm_));
  INFERD_RETURN_IF_ERROR(b.bind("output.weight", e, nv, false, &m->output_));
  // llama 3.1/3.2's RoPE scaling: one frequency divisor per rotated pair (ggml's freq_factors).
  INFERD_RETURN_IF_ERROR(b.bind("rope_freqs.weight", c.n_rot / 2, 1, false, &m->rope_freqs_));
  if (m->rope_freqs_.present()) {
    for (int64_t i = 0; i < c.n_rot / 2; ++i) {
      const float v = m->rope_freqs_.f32()[i];
      if (!(v > 0.0f) || !std::isfinite(v)) {
        return make_error(Code::kCorrupt, "%s: rope_freqs.weight[%lld] = %g is not a positive factor", f.path().c_str(),
                          static_cast<long long>(i), static_cast<double>(v));
      }
    }
  }
  if (!m->output_.present()) {
    m->output_ = m->token_embd_;
    c.tied_output = true;
  }
  m->layers_.resize(static_cast<size_t>(c.n_layer));
  for (int i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = m->layers_[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    INFERD_RETURN_IF_ERROR(b.bind(p + "attn_norm.weight", e, 1, true, &l.attn_norm));
    if (f.find_tensor(p + "attn_qkv.weight") != nullptr) {
      // Fused Q, K and V (phi3): one matrix whose rows are Q's, then K's, then V's; bound as three row ranges.
      WeightView qkv;
      INFERD_RETURN_IF_ERROR(b.bind(p + "attn_qkv.weight", e, eq + 2 * ekv, true, &qkv));
      INFERD_RETURN_IF_ERROR(split_rows(f, p + "attn_qkv.weight", qkv, {{eq, &l.wq}, {ekv, &l.wk}, {ekv, &l.wv}}));
    } else {
      INFERD_RETURN_IF_ERROR(b.bind(p + "attn_q.weight", e, eq, true, &l.wq));
      INFERD_RETURN_IF_ERROR(b.bind(p + "attn_k.weight", e, ekv, true, &l.wk));
      INFERD_RETURN_IF_ERROR(b.bind(p + "attn_v.weight", e, ekv, true, &l.wv));
    }
    INFERD_RETURN_IF_ERROR(b.bind(p + "attn_output.weight", eq, e, true, &l.wo));
    const bool biases = c.arch == "qwen2";
    INFERD_RETURN_IF_ERROR(b.bind(p + "attn_q.bias", eq, 1, biases, &l.bq));
    INFERD_RETURN_IF_ERROR(b.bind(p + "attn_k.bias", ekv, 1, biases, &l.bk));
    INFERD_RETURN_IF_ERROR(b.bind(p + "attn_v.bias", ekv, 1, biases, &l.bv));
    if (c.qk_norm) {
      INFERD_RETURN_IF_ERROR(b.bind(p + "attn_q_norm.weight", hd, 1, true, &l.q_norm));
      INFERD_RETURN_IF_ERROR(b.bind(p + "attn_k_norm.weight", hd, 1, true, &l.k_norm));
    }
    if (c.post_norms) {
      INFERD_RETURN_IF_ERROR(b.bind(p + "post_attention_norm.weight", e, 1, true, &l.attn_post_norm));
      INFERD_RETURN_IF_ERROR(b.bind(p + "post_ffw_norm.weight", e, 1, true, &l.ffn_post_norm));
    }
    INFERD_RETURN_IF_ERROR(b.bind(p + "ffn_norm.weight", e, 1, true, &l.ffn_norm));
    if (f.find_tensor(p + "ffn_gate.weight") == nullptr && c.arch == "phi3") {
      // Fused gate and up (phi3): ffn_up holds 2 * n_ff rows, the gate's first (ggml_swiglu's first half).
      WeightView gate_up;
      INFERD_RETURN_IF_ERROR(b.bind(p + "ffn_up.weight", e, 2 * ff, true, &gate_up));
      INFERD_RETURN_IF_ERROR(split_rows(f, p + "ffn_up.weight", gate_up, {{ff, &l.w_gate}, {ff, &l.w_up}}));
    } else {
      INFERD_RETURN_IF_ERROR(b.bind(p + "ffn_gate.weight", e, ff, true, &l.w_gate));
      INFERD_RETURN_IF_ERROR(b.bind(p + "ffn_up.weight", e, ff, true, &l.w_up));
    }
    INFERD_RETURN_IF_ERROR(b.bind(p + "ffn_down.weight", ff, e, true, &l.w_down));
  }
  m->weight_bytes_ = b.bytes();
  return std::shared_ptr<const Model>(std::move(m));
}

int32_t default_context(const ModelConfig& config) {
  return std::min(config.n_ctx_train > 0 ? config.n_ctx_train : 4096, 4096);
}

std::string Model::describe() const {
  std::map<std::string, int> types;
  auto count = [&](const WeightView& w) {
    if (w.present() && w.rows > 1) types[dtype_name(w.type)]++;
  };
  count(token_embd_);
  if (!config_.tied_output) count(output_);
  for (const LayerWeights& l : layers_) {
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) count(*w);
  }
  std::string t;
  for (const auto& [name, n] : types) t += (t.empty() ? "" : ", ") + std::to_string(n) + "x" + name;
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s (%s): %d layers, n_embd %d, %d/%d heads, ffn %d, vocab %d, %.1f MiB weights [%s]",
                config_.name.empty() ? "unnamed" : config_.name.c_str(), config_.arch.c_str(), config_.n_layer,
                config_.n_embd, config_.n_head, config_.n_head_kv, config_.n_ff, config_.n_vocab,
                static_cast<double>(weight_bytes_) / (1024.0 * 1024.0), t.c_str());
  return buf;
}

}  // namespace inferd
