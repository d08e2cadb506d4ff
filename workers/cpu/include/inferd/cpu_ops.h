// inferd/cpu_ops.h — the CPU backend's row operations of the llama forward pass, and the reference other
// backends' tests compare with.
//
// Each function works on one row (one token, or one head of one token) so that the backend can
// split work between threads freely. Their floating-point behaviour follows ggml's CPU backend
// (accumulation types and order, half-precision rounding of attention operands) because the
// engine is compared with llama.cpp token by token; where an operation differs from ggml, the
// comment says how.
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "inferd/kv_cache.h"
#include "inferd/model.h"

namespace inferd::ops {

// The largest head size the row operations take (stack buffers are sized by it).
inline constexpr int64_t kMaxHeadDim = 256;

// y = x / sqrt(mean(x^2) + eps) * w; the sum of squares is accumulated in double, as ggml does.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);

// x * sigmoid(x), bit-identical to llama.cpp's AVX-512 ggml_v_silu (kernels::silu).
float silu(float x);

// Rounds through IEEE half precision (llama.cpp rounds attention operands to F16).
float round_fp16(float v);

// Rotates one head of `head_dim` (even, <= 256) values in place for position `pos`: angles by ggml's
// recurrence theta *= base^(-2/head_dim), each divided by factors[i] when given (llama 3.1) and times
// freq_scale (linear RoPE scaling), cosf/sinf, rotation by kernels::rope_rotate.
void rope_head(float* x, int64_t head_dim, int32_t pos, float base, RopeStyle style, float freq_scale = 1.0f,
               const float* factors = nullptr);

// One query head against positions [kv_start, n_kv) of its KV head; the positions before kv_start (a
// sliding window) and past n_kv in the shape bucket (mask padding) are masked, i.e. contribute nothing. `scores` has room for n_kv floats. Writes
// head_dim (<= 256) values to `out`. Bit-identical to llama.cpp without flash attention when `q`
// holds fp16-rounded values: KQ and KQV in tinyBLAS's 16-lane order, softmax with ggml's exp and
// chunked double sum (kernels::exp_sum), probabilities rounded to fp16 before KQV.
void attention_head(const float* q, const KvCache::View& k, const KvCache::View& v, int64_t head_dim, int64_t n_kv,
                    float scale, float* scores, float* out, int64_t kv_start = 0);

}  // namespace inferd::ops
