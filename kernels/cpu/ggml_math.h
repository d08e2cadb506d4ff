// ggml_math.h (private) — one lane of ggml's vectorized expf/silu, its 16-lane float reduction, and
// RoPE's rotation with ggml's fused multiply-adds.
//
// llama.cpp's x86 CPU backend, built with AVX-512, evaluates exp in softmax and silu in SwiGLU with
// ggml_v_expf (a polynomial with _mm512_scalef_ps) and sums 16-lane vectors with GCC's
// _mm512_reduce_add_ps. These are elementwise / fixed-tree operations, so one lane written in scalar
// code gives the same bits as the vector version, provided every std::fma below is a true fused
// multiply-add (it is: hardware FMA in the x86 translation units, correctly rounded libm fmaf in
// the scalar one). Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// Internal linkage: the scalar, AVX2 and AVX-512 translation units each compile their own copy for their
// instruction set (an inline function with external linkage would be merged by the linker, which could
// then run an AVX-512 copy on an AVX2-only CPU).
namespace inferd::kernels::ggml_math {
namespace {

// exp(x) as one lane of ggml_v_expf (AVX-512 variant): |error| <= 1.5 ulp; 0 below about -104,
// +inf above about 88.4.
inline float expf_lane(float x) {
  constexpr float kRound = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, kRound);
  const float n = z - kRound;  // round(x * log2(e)), integral
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  // scalef(j, n) = j * 2^n, correctly rounded (also into the subnormal range), as ldexp.
  return std::ldexp(j, static_cast<int>(n));
}

// x * sigmoid(x) as one lane of ggml_v_silu.
inline float silu_lane(float x) { return x / (1.0f + expf_lane(0.0f - x)); }

inline uint32_t lane_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float lane_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// exp(x) as one lane of ggml_v_expf's AVX2 variant (llama.cpp built without AVX-512): the same reduction
// and polynomial, but the last step is fma(j, 2^n, 2^n) instead of scalef(j + 1, n), so some results
// differ from expf_lane in the last bit; |n| > 126 scales in two steps, |n| > 192 saturates.
inline float expf_lane_avx2(float x) {
  constexpr float kRound = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, kRound);
  const float n = z - kRound;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const uint32_t e = lane_bits(z) << 23;
  const float k = lane_float(e + lane_bits(1.0f));  // 2^n
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, 0x1.ffffecp-1f * b);
  if (!(std::fabs(n) > 126.0f)) return std::fma(k, j, k);
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = lane_float(g + 0x7f000000u);
  if (std::fabs(n) > 192.0f) return s1 * s1;
  const float s2 = lane_float(e - g);
  return std::fma(s2, j, s2) * s1;
}

// x * sigmoid(x) as one lane of ggml_v_silu's AVX2 variant.
inline float silu_lane_avx2(float x) { return x / (1.0f + expf_lane_avx2(0.0f - x)); }

// The sum of 16 floats in _mm512_reduce_add_ps's order: halves, quarters, pairs, then the last two.
inline float reduce16(const float* v) {
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// The sum of 8 floats in the order of ggml's (and tinyBLAS's) AVX2 horizontal sum: the two 128-bit halves
// added, then movehl, then movehdup.
inline float reduce8(const float* v) {
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = v[i + 4] + v[i];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// See kernels::rope_rotate.
inline void rope_rotate(int64_t n, const float* cos, const float* sin, float* x0, float* x1, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = x0[i * stride], b = x1[i * stride];
    x0[i * stride] = std::fma(a, cos[i], -(b * sin[i]));
    x1[i * stride] = std::fma(a, sin[i], b * cos[i]);
  }
}

}  // namespace
}  // namespace inferd::kernels::ggml_math
