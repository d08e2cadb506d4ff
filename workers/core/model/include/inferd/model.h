// inferd/model.h — a model's hyper-parameters and weight views. Supported architectures: llama (and
// mistral, which GGUF files write as llama), qwen2 (Q/K/V biases), qwen3 (per-head Q/K RMSNorm) and
// gemma3 (scaled embeddings, Q/K norms, norms after attention and FFN, GeGLU, sliding-window layers
// with their own RoPE base, tied output).
//
// A Model borrows its weights from a GgufFile mapping (zero-copy: each WeightView points into the
// mapped file) and keeps the file alive through a shared_ptr. Loading validates every tensor the
// forward pass will touch — presence, type, shape — so the forward pass itself never checks input.
// Thread safety: immutable after load; share freely between threads and engines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inferd/gguf.h"
#include "inferd/dtype.h"
#include "inferd/weight_layout.h"
#include "inferd/status.h"

namespace inferd {

enum class RopeStyle { kNormal, kNeox };  // llama: adjacent pairs; qwen2 (NeoX): halves
enum class FfnActivation { kSilu, kGeluTanh };  // the gated FFN: SwiGLU, or GeGLU (gelu's tanh approximation)

struct ModelConfig {
  std::string arch;         // "llama", "qwen2", "qwen3" or "gemma3"
  std::string name;         // general.name, for display
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;
  int32_t n_embd = 0;
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;     // attention.key_length, else n_embd / n_head
  int32_t n_rot = 0;        // rope dimensions (== head_dim for these architectures)
  int32_t n_ff = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  RopeStyle rope_style = RopeStyle::kNormal;
  bool tied_output = false; // output projection reuses token_embd
  float rope_freq_scale = 1.0f;  // linear RoPE scaling: positions times this (1 / rope.scaling.factor)
  FfnActivation ffn_act = FfnActivation::kSilu;
  float embd_scale = 1.0f;  // the embeddings are multiplied by this (gemma3: sqrt(n_embd))
  float attn_scale = 0.0f;  // q.k scale (0: 1 / sqrt(head_dim))
  bool qk_norm = false;     // RMSNorm over each Q and K head before RoPE (qwen3, gemma3)
  bool post_norms = false;  // RMSNorm on the attention and FFN outputs before their residual adds (gemma3)
  // Sliding-window attention (gemma3): layer l attends to the last swa_window positions when
  // l % swa_pattern < swa_pattern - 1, with RoPE base rope_base_swa and no RoPE scaling there.
  int32_t swa_window = 0, swa_pattern = 0;
  float rope_base_swa = 10000.0f;

  int32_t n_embd_kv() const { return n_head_kv * head_dim; }
  int32_t n_embd_q() const { return n_head * head_dim; }  // may differ from n_embd (gemma3)
  bool layer_swa(int32_t l) const { return swa_window > 0 && swa_pattern > 0 && l % swa_pattern < swa_pattern - 1; }
  float layer_rope_base(int32_t l) const { return layer_swa(l) ? rope_base_swa : rope_base; }
  float layer_rope_freq_scale(int32_t l) const { return layer_swa(l) ? 1.0f : rope_freq_scale; }
  float kq_scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / __builtin_sqrtf(static_cast<float>(head_dim)); }
};

// The context a model gets when none is asked for: min(its training context, 4096).
int32_t default_context(const ModelConfig& config);

// A 2-D weight matrix (`rows` x `cols`, cols contiguous) or a 1-D vector (rows == 1). In the row layout
// (GGUF's) row r is the row_bytes at row(r). An interleaved matrix (WeightLayout::kInterleaved16, from a
// weights segment) has the same size, but row(r) is only meaningful for r a multiple of 16 (where its
// group starts); read a single row with read_row(), or whole groups with the kernels that know the layout.
struct WeightView {
  const uint8_t* data = nullptr;
  DType type = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  WeightLayout layout = WeightLayout::kRows;

  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  bool interleaved() const { return layout != WeightLayout::kRows; }
  // Row r in the row layout, into dst (row_bytes bytes); a copy only where the matrix is interleaved, else
  // the row itself.
  const uint8_t* read_row(int64_t r, uint8_t* dst) const {
    if (!interleaved()) return row(r);
    copy_row(type, layout, cols, data, r, dst);
    return dst;
  }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  bool present() const { return data != nullptr; }
};

struct LayerWeights {
  WeightView attn_norm, wq, wk, wv, wo;
  WeightView bq, bk, bv;  // qwen2 only (absent otherwise)
  WeightView q_norm, k_norm;  // qk_norm: head_dim vectors
  WeightView attn_post_norm, ffn_post_norm;  // post_norms
  WeightView ffn_norm, w_gate, w_up, w_down;
};

class Model {
 public:
  // Validates metadata and tensors of an opened file. Errors name the file and the offending key/tensor.
  static Result<std::shared_ptr<const Model>> load(std::shared_ptr<const gguf::GgufFile> file);
  static Result<std::shared_ptr<const Model>> open(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const gguf::GgufFile& file() const { return *file_; }
  std::shared_ptr<const gguf::GgufFile> file_ptr() const { return file_; }

  const WeightView& token_embd() const { return token_embd_; }
  const WeightView& output_norm() const { return output_norm_; }
  const WeightView& output() const { return output_; }
  // llama 3.1's per-dimension RoPE frequency factors (rope_freqs.weight, head_dim / 2 floats), or absent.
  const WeightView& rope_freqs() const { return rope_freqs_; }
  const LayerWeights& layer(int i) const { return layers_[static_cast<size_t>(i)]; }

  // Bytes of all weight tensors the forward pass reads.
  size_t weight_bytes() const { return weight_bytes_; }
  // A one-line description: arch, size, types.
  std::string describe() const;

 private:
  Model() = default;

  std::shared_ptr<const gguf::GgufFile> file_;
  ModelConfig config_;
  WeightView token_embd_, output_norm_, output_, rope_freqs_;
  std::vector<LayerWeights> layers_;
  size_t weight_bytes_ = 0;
};

}  // namespace inferd
