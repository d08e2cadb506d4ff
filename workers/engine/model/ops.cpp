#include "ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "inferd/kernels/cpu.h"

namespace inferd::ops {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float round_fp16(float v) { return kernels::fp16_to_fp32(kernels::fp32_to_fp16(v)); }

void rope_head(float* x, int64_t head_dim, int32_t pos, float base, RopeStyle style) {
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
  float theta = static_cast<float>(pos);
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = std::cos(theta), s = std::sin(theta);
    const int64_t i0 = style == RopeStyle::kNormal ? 2 * i : i;
    const int64_t i1 = style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * c - x1 * s;
    x[i1] = x0 * s + x1 * c;
    theta *= theta_scale;
  }
}

void attention_head(const float* q, const KvCache::View& k, const KvCache::View& v, int64_t head_dim, int64_t n_kv,
                    int64_t kv_pad, float scale, float* scores, float* out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float max_s = kNegInf;
  for (int64_t j = 0; j < n_kv; ++j) {
    scores[j] = kernels::dot_f32_f16(head_dim, q, k.row(j)) * scale;
    max_s = std::max(max_s, scores[j]);
  }
  for (int64_t j = n_kv; j < kv_pad; ++j) scores[j] = kNegInf;
  double sum = 0.0;
  for (int64_t j = 0; j < kv_pad; ++j) {
    const float e = scores[j] == kNegInf ? 0.0f : std::exp(scores[j] - max_s);
    scores[j] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t j = 0; j < n_kv; ++j) kernels::axpy_f16(head_dim, round_fp16(scores[j] * inv), v.row(j), out);
}

}  // namespace inferd::ops
