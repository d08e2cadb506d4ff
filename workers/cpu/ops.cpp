#include "inferd/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "inferd/kernels/cpu.h"
#include "inferd/status.h"

namespace inferd::ops {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

float silu(float x) { return kernels::silu(x); }

float round_fp16(float v) { return kernels::fp16_to_fp32(kernels::fp32_to_fp16(v)); }

constexpr int64_t kRoundChunk = 256;

void rope_head(float* x, int64_t head_dim, int32_t pos, float base, RopeStyle style, float freq_scale,
               const float* factors) {
  INFERD_ASSERT(head_dim <= kMaxHeadDim && head_dim % 2 == 0);
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
  float theta = static_cast<float>(pos);
  const int64_t half = head_dim / 2;
  float cos[kMaxHeadDim / 2], sin[kMaxHeadDim / 2];
  for (int64_t i = 0; i < half; ++i) {
    // ggml's rope_yarn(theta / ff) without extrapolation: exact for scale 1 and no factors.
    const float angle = freq_scale * (factors ? theta / factors[i] : theta);
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
    theta *= theta_scale;
  }
  if (style == RopeStyle::kNormal) {
    kernels::rope_rotate(half, cos, sin, x, x + 1, 2);
  } else {
    kernels::rope_rotate(half, cos, sin, x, x + half, 1);
  }
}

void attention_head(const float* q, const KvCache::View& k, const KvCache::View& v, int64_t head_dim, int64_t n_kv,
                    float scale, float* scores, float* out, int64_t kv_start) {
  INFERD_ASSERT(head_dim <= kMaxHeadDim && kv_start >= 0 && kv_start < n_kv);
  // The rows of one KV block are contiguous: the table is read once per block. Runs over [j0, end) never
  // cross a block boundary.
  constexpr int64_t kBlock = graph::kKvBlockTokens;
  auto run_end = [&](int64_t j0) { return std::min((j0 / kBlock + 1) * kBlock, n_kv); };
  float max_s = -std::numeric_limits<float>::infinity();
  for (int64_t j0 = kv_start; j0 < n_kv; j0 = run_end(j0)) {
    kernels::dot_f32_f16_rows(head_dim, q, k.row(j0), head_dim, run_end(j0) - j0, scale, scores + j0);
  }
  for (int64_t j = kv_start; j < n_kv; ++j) max_s = std::max(max_s, scores[j]);
  // The bucket's padded positions [n_kv, kv_pad) and the window's masked ones [0, kv_start) are masked:
  // exp(-inf) = 0 adds nothing to the sum or the output, so they are skipped (exp_sum's chunks are
  // aligned to position 0, as ggml's softmax over the whole row).
  const int64_t c0 = kv_start / 16 * 16;
  std::fill(scores + c0, scores + kv_start, -std::numeric_limits<float>::infinity());
  const float inv = static_cast<float>(1.0 / kernels::exp_sum(n_kv - c0, scores + c0, max_s, scores + c0));

  // KQV as llama.cpp computes it (tinyBLAS over the transposed V cache): out[d] is a 16-lane dot
  // over positions, lane i summing positions j = i (mod 16) in order with fused multiply-adds, the
  // lanes then reduced as _mm512_reduce_add_ps (llama.cpp's AVX2 build: 8 lanes, its horizontal sum;
  // kernels::ggml_order()). Lane i's partial sums for all d form lanes[i].
  // The products f16 * f16 are exact in float, so axpy's multiply-add equals the fused one.
  alignas(64) float lanes[16][kMaxHeadDim];
  for (auto& lane : lanes) std::fill(lane, lane + head_dim, 0.0f);
  // The weights scores[j] * inv rounded to fp16 (ggml's F16 V cache multiplies F16 by F16), a chunk at a time
  // through the vector conversions (the same round-to-nearest-even as round_fp16).
  for (int64_t j0 = kv_start; j0 < n_kv; j0 += kRoundChunk) {
    const int64_t nj = std::min<int64_t>(kRoundChunk, n_kv - j0);
    fp16_t half[kRoundChunk];
    for (int64_t j = j0; j < j0 + nj; ++j) scores[j] *= inv;
    kernels::fp32_to_fp16_row(scores + j0, half, nj);
    kernels::fp16_to_fp32_row(half, scores + j0, nj);
  }
  for (int64_t j0 = kv_start; j0 < n_kv; j0 = run_end(j0)) {
    kernels::axpy_f16_rows(head_dim, scores + j0, v.row(j0), head_dim, run_end(j0) - j0, j0, lanes[0], kMaxHeadDim);
  }
  if (kernels::ggml_order_lanes() == 8) {
    for (int64_t d = 0; d < head_dim; ++d) {
      float c[4];
      for (int i = 0; i < 4; ++i) c[i] = lanes[i + 4][d] + lanes[i][d];
      out[d] = (c[0] + c[2]) + (c[1] + c[3]);
    }
    return;
  }
  for (int64_t d = 0; d < head_dim; ++d) {
    float a[8], b[4];
    for (int i = 0; i < 8; ++i) a[i] = lanes[i + 8][d] + lanes[i][d];
    for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
    out[d] = (b[0] + b[2]) + (b[1] + b[3]);
  }
}

}  // namespace inferd::ops
