// Portable reference kernels: every type, every helper. The SIMD variants are tested against these.
//
// Integer dot products are exact per block; the per-block float combination follows ggml's generic
// vec_dot_*: sum += (d_w * d_a) * int_sum (+ m_w * s_a for the _1 types).
#include <cmath>
#include <cstring>

#include "ggml_math.h"
#include "inferd/status.h"
#include "isa_tables.h"

namespace inferd::kernels::scalar {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

float h2f(fp16_t h) { return fp16_to_fp32(h); }

// ---- Activation quantizers (ggml's CPU quantize_row_q8_0 / q8_1 on x86, quantize_row_q8_K_ref) ----
// Q8_0/Q8_1 follow ggml's AVX path, which llama.cpp uses for activations, not quantize_row_q8_*_ref:
// the multiplier is 127 / amax (not 1 / d) and x * id rounds to nearest even (not away from zero).

float q8_multiplier(float amax) { return amax != 0.0f ? 127.0f / amax : 0.0f; }

void quantize_q8_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float id = q8_multiplier(amax);
    y[b].d = fp32_to_fp16(amax / 127.0f);
    for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
  }
}

void quantize_q8_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t b = 0; b < n / kQK8_1; ++b, x += kQK8_1) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_1; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = q8_multiplier(amax);
    y[b].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < kQK8_1; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += y[b].qs[j];
    }
    y[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

// Round half to even via the 1.5*2^23 trick, as ggml's nearest_int.
int nearest_int(float f) {
  const float v = f + 12582912.0f;
  return static_cast<int>(float_bits(v) & 0x007fffff) - 0x00400000;
}

void quantize_q8_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[b].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[b].qs[g * 16 + j];
      y[b].bsums[g] = static_cast<int16_t>(sum);
    }
    y[b].d = 1.0f / iscale;
  }
}

void copy_f32(const float* x, void* dst, int64_t n) { std::memcpy(dst, x, sizeof(float) * n); }

// ---- Dequantizers: each decodes one block to integer quants (+ scales) ------------------------

// Fills q[32] with the signed quants of a 32-block; returns nothing, scales are read by callers.
void decode_q4_0(const BlockQ4_0& b, int q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = (b.qs[j] & 0x0F) - 8;
    q[j + 16] = (b.qs[j] >> 4) - 8;
  }
}

void decode_q4_1(const BlockQ4_1& b, int q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = b.qs[j] & 0x0F;
    q[j + 16] = b.qs[j] >> 4;
  }
}

template <typename Block>
void decode_q5(const Block& b, int q[32], int offset) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof(qh));
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> j) & 1) << 4;
    const int h1 = ((qh >> (j + 16)) & 1) << 4;
    q[j] = ((b.qs[j] & 0x0F) | h0) - offset;
    q[j + 16] = ((b.qs[j] >> 4) | h1) - offset;
  }
}

void get_scale_min_k4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K / Q5_K: 256 unsigned quants plus 8 (scale, min) pairs of 32 elements each.
void decode_q4_k(const BlockQ4_K& b, int q[256], int sc[8], int mn[8]) {
  for (int j = 0; j < 8; ++j) get_scale_min_k4(j, b.scales, &sc[j], &mn[j]);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = b.qs[32 * c + l] & 0x0F;
      q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
  }
}

void decode_q5_k(const BlockQ5_K& b, int q[256], int sc[8], int mn[8]) {
  for (int j = 0; j < 8; ++j) get_scale_min_k4(j, b.scales, &sc[j], &mn[j]);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int h0 = (b.qh[l] >> (2 * c)) & 1;
      const int h1 = (b.qh[l] >> (2 * c + 1)) & 1;
      q[64 * c + l] = (b.qs[32 * c + l] & 0x0F) | (h0 << 4);
      q[64 * c + 32 + l] = (b.qs[32 * c + l] >> 4) | (h1 << 4);
    }
  }
}

// Q6_K: 256 signed quants (-32..31); the scale of element e is scales[e / 16].
void decode_q6_k(const BlockQ6_K& b, int q[256]) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    int* out = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      out[l] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      out[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    }
  }
}

// Q2_K: 256 unsigned quants (0..3); element e belongs to 16-element group e / 16, whose byte scales[g]
// holds the scale (low nibble) and the min (high nibble).
void decode_q2_k(const BlockQ2_K& b, int q[256]) {
  for (int c = 0; c < 2; ++c) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) q[128 * c + 32 * j + l] = (b.qs[32 * c + l] >> (2 * j)) & 3;
    }
  }
}

// Q3_K: 256 signed quants (-4..3): two low bits from qs, minus 4 where the hmask bit is clear.
void decode_q3_k(const BlockQ3_K& b, int q[256]) {
  for (int c = 0; c < 2; ++c) {
    for (int j = 0; j < 4; ++j) {
      const int bit = 4 * c + j;
      for (int l = 0; l < 32; ++l) {
        q[128 * c + 32 * j + l] = ((b.qs[32 * c + l] >> (2 * j)) & 3) - (((b.hmask[l] >> bit) & 1) ? 0 : 4);
      }
    }
  }
}

void decode_iq4_nl(const BlockIQ4_NL& b, int q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4nlValues[b.qs[j] & 0x0F];
    q[j + 16] = kIq4nlValues[b.qs[j] >> 4];
  }
}

// IQ4_XS: 256 non-linear quants and 8 signed sub-block scales of 32.
void decode_iq4_xs(const BlockIQ4_XS& b, int q[256], int sc[8]) {
  for (int s = 0; s < 8; ++s) {
    sc[s] = (((b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0F) | (((b.scales_h >> (2 * s)) & 3) << 4)) - 32;
    for (int j = 0; j < 16; ++j) {
      q[32 * s + j] = kIq4nlValues[b.qs[16 * s + j] & 0x0F];
      q[32 * s + 16 + j] = kIq4nlValues[b.qs[16 * s + j] >> 4];
    }
  }
}

// ---- to_float ------------------------------------------------------------------------------

void f32_to_float(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, sizeof(float) * n); }

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const fp16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = h2f(s[i]);
}

void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bits_float(static_cast<uint32_t>(s[i]) << 16);
}

void q8_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = b[i].qs[j] * d;
  }
}

void q4_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  int q[32];
  for (int64_t i = 0; i < n / 32; ++i) {
    decode_q4_0(b[i], q);
    const float d = h2f(b[i].d);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = q[j] * d;
  }
}

void q4_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  int q[32];
  for (int64_t i = 0; i < n / 32; ++i) {
    decode_q4_1(b[i], q);
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = q[j] * d + m;
  }
}

void q5_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  int q[32];
  for (int64_t i = 0; i < n / 32; ++i) {
    decode_q5(b[i], q, 16);
    const float d = h2f(b[i].d);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = q[j] * d;
  }
}

void q5_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  int q[32];
  for (int64_t i = 0; i < n / 32; ++i) {
    decode_q5(b[i], q, 0);
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = q[j] * d + m;
  }
}

void q4_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  int q[256], sc[8], mn[8];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    decode_q4_k(b[i], q, sc, mn);
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      const float ds = d * sc[s], ms = dmin * mn[s];
      for (int l = 0; l < 32; ++l) dst[i * kQK_K + 32 * s + l] = ds * q[32 * s + l] - ms;
    }
  }
}

void q5_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_K*>(src);
  int q[256], sc[8], mn[8];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    decode_q5_k(b[i], q, sc, mn);
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      const float ds = d * sc[s], ms = dmin * mn[s];
      for (int l = 0; l < 32; ++l) dst[i * kQK_K + 32 * s + l] = ds * q[32 * s + l] - ms;
    }
  }
}

void q6_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  int q[256];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    decode_q6_k(b[i], q);
    const float d = h2f(b[i].d);
    for (int e = 0; e < kQK_K; ++e) dst[i * kQK_K + e] = d * b[i].scales[e / 16] * q[e];
  }
}

void q2_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ2_K*>(src);
  int q[256];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    decode_q2_k(b[i], q);
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * static_cast<float>(b[i].scales[g] & 0xF), ml = dmin * static_cast<float>(b[i].scales[g] >> 4);
      for (int l = 0; l < 16; ++l) dst[i * kQK_K + 16 * g + l] = dl * q[16 * g + l] - ml;
    }
  }
}

void q3_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ3_K*>(src);
  int q[256], sc[16];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    decode_q3_k(b[i], q);
    q3_k_scales(b[i], sc);
    const float d = h2f(b[i].d);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * static_cast<float>(sc[g] - 32);
      for (int l = 0; l < 16; ++l) dst[i * kQK_K + 16 * g + l] = dl * q[16 * g + l];
    }
  }
}

void iq4_nl_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_NL*>(src);
  int q[32];
  for (int64_t i = 0; i < n / kQK4_NL; ++i) {
    decode_iq4_nl(b[i], q);
    const float d = h2f(b[i].d);
    for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * q[j];
  }
}

void iq4_xs_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_XS*>(src);
  int q[256], sc[8];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    decode_iq4_xs(b[i], q, sc);
    const float d = h2f(b[i].d);
    for (int s = 0; s < 8; ++s) {
      const float dl = d * static_cast<float>(sc[s]);
      for (int j = 0; j < 32; ++j) dst[i * kQK_K + 32 * s + j] = dl * q[32 * s + j];
    }
  }
}

// ---- dot -----------------------------------------------------------------------------------

template <typename Elem, float (*kLoad)(Elem)>
void dot_float_weights(int64_t k, const void* w_row, const void* act, size_t act_stride, int nr,
                       float* out) {
  const auto* w = static_cast<const Elem*>(w_row);
  for (int r = 0; r < nr; ++r) {
    const auto* x = reinterpret_cast<const float*>(static_cast<const char*>(act) + r * act_stride);
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) sum += kLoad(w[i]) * x[i];
    out[r] = sum;
  }
}

float load_f32(float v) { return v; }
float load_f16(fp16_t v) { return h2f(v); }
float load_bf16(uint16_t v) { return bits_float(static_cast<uint32_t>(v) << 16); }

const char* act_row(const void* act, size_t stride, int r) {
  return static_cast<const char*>(act) + static_cast<size_t>(r) * stride;
}

// 32-element weight blocks against Q8_0 activations: sum += d_w * d_a * isum; with kRepacked (MatmulOrder::kRepacked,
// cpu.h) its definition instead, sum = fma(float(isum), d_w * d_a, sum).
template <typename Block, void (*kDecode)(const Block&, int*), bool kRepacked = false>
void dot_x_q8_0(int64_t k, const void* w_row, const void* act, size_t act_stride, int nr, float* out) {
  const auto* w = static_cast<const Block*>(w_row);
  float sum[kMaxDotRows] = {};
  int q[32];
  for (int64_t i = 0; i < k / 32; ++i) {
    kDecode(w[i], q);
    const float dw = h2f(w[i].d);
    for (int r = 0; r < nr; ++r) {
      const auto& a = reinterpret_cast<const BlockQ8_0*>(act_row(act, act_stride, r))[i];
      int isum = 0;
      for (int j = 0; j < 32; ++j) isum += q[j] * a.qs[j];
      if constexpr (kRepacked) {
        sum[r] = std::fma(static_cast<float>(isum), dw * h2f(a.d), sum[r]);
      } else {
        sum[r] += dw * h2f(a.d) * static_cast<float>(isum);
      }
    }
  }
  for (int r = 0; r < nr; ++r) out[r] = sum[r];
}

// 32-element weight blocks with a min against Q8_1: sum += d_w * d_a * isum + m_w * s_a.
template <typename Block, void (*kDecode)(const Block&, int*)>
void dot_x_q8_1(int64_t k, const void* w_row, const void* act, size_t act_stride, int nr, float* out) {
  const auto* w = static_cast<const Block*>(w_row);
  float sum[kMaxDotRows] = {};
  int q[32];
  for (int64_t i = 0; i < k / 32; ++i) {
    kDecode(w[i], q);
    const float dw = h2f(w[i].d), mw = h2f(w[i].m);
    for (int r = 0; r < nr; ++r) {
      const auto& a = reinterpret_cast<const BlockQ8_1*>(act_row(act, act_stride, r))[i];
      int isum = 0;
      for (int j = 0; j < 32; ++j) isum += q[j] * a.qs[j];
      sum[r] += dw * h2f(a.d) * static_cast<float>(isum) + mw * h2f(a.s);
    }
  }
  for (int r = 0; r < nr; ++r) out[r] = sum[r];
}

void decode_q8_0(const BlockQ8_0& b, int q[32]) {
  for (int j = 0; j < 32; ++j) q[j] = b.qs[j];
}
void decode_q5_0(const BlockQ5_0& b, int q[32]) { decode_q5(b, q, 16); }
void decode_q5_1(const BlockQ5_1& b, int q[32]) { decode_q5(b, q, 0); }

// One super-block of llama.cpp's tiled K-quant GEMM with a min (ggml-cpu/tiled: fnmadd then fmadd, the same on its
// AVX2 and AVX-512 builds): the exact integers n = sum sc * isum and m = sum mn * bsum, the weight's d and dmin,
// the activation's d_a.
inline float tiled_step(float d, float dmin, int n, int m, float d_a, float sum) {
  return std::fma(std::fma(-dmin, static_cast<float>(m), d * static_cast<float>(n)), d_a, sum);
}

// Q4_K / Q5_K against Q8_K: sum += d_a * (d_w * sum_s sc_s * isum_s - dmin_w * sum_s mn_s * asum_s). With
// kSteps > 0 (MatmulOrder::kRepacked, cpu.h) llama.cpp's repacked order instead: kSteps times per super-block
// (1: its GEMV, 4: its GEMM, once per pair of sub-blocks) the two integers n = sum sc_s * isum_s and
// m = sum mn_s * asum_s over the step's sub-blocks, acc = fma(float(n), d_w * d_a, acc),
// accm = fma(float(m), dmin_w * d_a, accm); the result acc - accm. kTiled (MatmulOrder::kRepacked from
// kTiledMinRows activation rows on, gemm.h): llama.cpp's tiled K-quant GEMM, per super-block
// sum = fma(fma(-dmin_w, float(m), d_w * float(n)), d_a, sum) with n and m over the whole super-block.
template <typename Block, void (*kDecode)(const Block&, int*, int*, int*), int kSteps = 0, bool kTiled = false>
void dot_kq_min(int64_t k, const void* w_row, const void* act, size_t act_stride, int nr, float* out) {
  const auto* w = static_cast<const Block*>(w_row);
  float sum[kMaxDotRows] = {};
  [[maybe_unused]] float sum_m[kMaxDotRows] = {};
  int q[256], sc[8], mn[8];
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    kDecode(w[i], q, sc, mn);
    const float d = h2f(w[i].d), dmin = h2f(w[i].dmin);
    for (int r = 0; r < nr; ++r) {
      const auto& a = reinterpret_cast<const BlockQ8_K*>(act_row(act, act_stride, r))[i];
      int isum = 0, msum = 0;
      for (int s = 0; s < 8; ++s) {
        int t = 0;
        for (int l = 0; l < 32; ++l) t += q[32 * s + l] * a.qs[32 * s + l];
        isum += sc[s] * t;
        msum += mn[s] * (a.bsums[2 * s] + a.bsums[2 * s + 1]);
        if constexpr (kSteps > 0) {
          if ((s + 1) % (8 / kSteps) == 0) {
            sum[r] = std::fma(static_cast<float>(isum), d * a.d, sum[r]);
            sum_m[r] = std::fma(static_cast<float>(msum), dmin * a.d, sum_m[r]);
            isum = msum = 0;
          }
        }
      }
      if constexpr (kTiled) {
        sum[r] = tiled_step(d, dmin, isum, msum, a.d, sum[r]);
      } else if constexpr (kSteps == 0) {
        sum[r] += a.d * (d * static_cast<float>(isum) - dmin * static_cast<float>(msum));
      }
    }
  }
  for (int r = 0; r < nr; ++r) out[r] = kSteps > 0 ? sum[r] - sum_m[r] : sum[r];
}


// Q2_K against Q8_K: sum += d_a * (d_w * sum_g sc_g * isum_g - dmin_w * sum_g mn_g * bsum_g); kTiled: tiled_step().
template <bool kTiled = false>
void dot_q2_k_in(int64_t k, const void* w_row, const void* act, size_t act_stride, int nr, float* out) {
  const auto* w = static_cast<const BlockQ2_K*>(w_row);
  float sum[kMaxDotRows] = {};
  int q[256];
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    decode_q2_k(w[i], q);
    const float d = h2f(w[i].d), dmin = h2f(w[i].dmin);
    for (int r = 0; r < nr; ++r) {
      const auto& a = reinterpret_cast<const BlockQ8_K*>(act_row(act, act_stride, r))[i];
      int isum = 0, msum = 0;
      for (int g = 0; g < 16; ++g) {
        int t = 0;
        for (int l = 0; l < 16; ++l) t += q[16 * g + l] * a.qs[16 * g + l];
        isum += (w[i].scales[g] & 0xF) * t;
        msum += (w[i].scales[g] >> 4) * a.bsums[g];
      }
      if constexpr (kTiled) {
        sum[r] = tiled_step(d, dmin, isum, msum, a.d, sum[r]);
      } else {
        sum[r] += a.d * (d * static_cast<float>(isum) - dmin * static_cast<float>(msum));
      }
    }
  }
  for (int r = 0; r < nr; ++r) out[r] = sum[r];
}

// Q3_K, Q6_K and IQ4_XS against Q8_K: sum += d_w * d_a * sum_g sc_g * isum_g over groups of kGroup elements
// with signed integer scales (kDecode gives the quants and the scales). kTiled (MatmulOrder::kRepacked from
// kTiledMinRows activation rows on, gemm.h): llama.cpp's tiled K-quant GEMM instead, sum = fma(float(isum) * d_w,
// d_a, sum).
template <typename Block, int kGroup, void (*kDecode)(const Block&, int*, int*), bool kTiled = false>
void dot_kq_scaled(int64_t k, const void* w_row, const void* act, size_t act_stride, int nr, float* out) {
  const auto* w = static_cast<const Block*>(w_row);
  float sum[kMaxDotRows] = {};
  int q[kQK_K], sc[kQK_K / kGroup];
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    kDecode(w[i], q, sc);
    const float d = h2f(w[i].d);
    for (int r = 0; r < nr; ++r) {
      const auto& a = reinterpret_cast<const BlockQ8_K*>(act_row(act, act_stride, r))[i];
      int isum = 0;
      for (int g = 0; g < kQK_K / kGroup; ++g) {
        int t = 0;
        for (int l = 0; l < kGroup; ++l) t += q[kGroup * g + l] * a.qs[kGroup * g + l];
        isum += sc[g] * t;
      }
      if constexpr (kTiled) {
        sum[r] = std::fma(static_cast<float>(isum) * d, a.d, sum[r]);
      } else {
        sum[r] += d * a.d * static_cast<float>(isum);
      }
    }
  }
  for (int r = 0; r < nr; ++r) out[r] = sum[r];
}

void decode_q3_k_scaled(const BlockQ3_K& b, int q[256], int sc[16]) {
  decode_q3_k(b, q);
  q3_k_scales(b, sc);
  for (int g = 0; g < 16; ++g) sc[g] -= 32;
}
void decode_q6_k_scaled(const BlockQ6_K& b, int q[256], int sc[16]) {
  decode_q6_k(b, q);
  for (int g = 0; g < 16; ++g) sc[g] = b.scales[g];
}

void dot_q2_k(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) { dot_q2_k_in(k, w, a, s, nr, o); }
void dot_q3_k(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_scaled<BlockQ3_K, 16, decode_q3_k_scaled>(k, w, a, s, nr, o);
}
void dot_q6_k(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_scaled<BlockQ6_K, 16, decode_q6_k_scaled>(k, w, a, s, nr, o);
}
void dot_iq4_xs(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_scaled<BlockIQ4_XS, 32, decode_iq4_xs>(k, w, a, s, nr, o);
}

void dot_iq4_nl(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_0<BlockIQ4_NL, decode_iq4_nl>(k, w, a, s, nr, o);
}
void dot_q4_0(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_0<BlockQ4_0, decode_q4_0>(k, w, a, s, nr, o);
}
void dot_q5_0(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_0<BlockQ5_0, decode_q5_0>(k, w, a, s, nr, o);
}
void dot_q8_0(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_0<BlockQ8_0, decode_q8_0>(k, w, a, s, nr, o);
}
void dot_q4_1(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_1<BlockQ4_1, decode_q4_1>(k, w, a, s, nr, o);
}
void dot_q5_1(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_1<BlockQ5_1, decode_q5_1>(k, w, a, s, nr, o);
}
void dot_q4_k(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_min<BlockQ4_K, decode_q4_k>(k, w, a, s, nr, o);
}
void dot_q5_k(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_min<BlockQ5_K, decode_q5_k>(k, w, a, s, nr, o);
}

void dot_q4_0_repacked(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_0<BlockQ4_0, decode_q4_0, true>(k, w, a, s, nr, o);
}
void dot_iq4_nl_repacked(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_x_q8_0<BlockIQ4_NL, decode_iq4_nl, true>(k, w, a, s, nr, o);
}

void dot_q4_k_repacked(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_min<BlockQ4_K, decode_q4_k, 1>(k, w, a, s, nr, o);
}

constexpr TypeKernels kRepackedQ4_0 = {DType::kQ4_0, DType::kQ8_0, q4_0_to_float, quantize_q8_0, dot_q4_0_repacked};
constexpr TypeKernels kRepackedQ4_K = {DType::kQ4_K, DType::kQ8_K, q4_k_to_float, quantize_q8_k, dot_q4_k_repacked};
constexpr TypeKernels kRepackedIQ4_NL = {DType::kIQ4_NL, DType::kQ8_0, iq4_nl_to_float, quantize_q8_0,
                                         dot_iq4_nl_repacked};

constexpr TypeKernels kTables[] = {
    {DType::kF32, DType::kF32, f32_to_float, copy_f32, dot_float_weights<float, load_f32>},
    {DType::kF16, DType::kF32, f16_to_float, copy_f32, dot_float_weights<fp16_t, load_f16>},
    {DType::kBF16, DType::kF32, bf16_to_float, copy_f32, dot_float_weights<uint16_t, load_bf16>},
    {DType::kQ8_0, DType::kQ8_0, q8_0_to_float, quantize_q8_0, dot_q8_0},
    {DType::kQ4_0, DType::kQ8_0, q4_0_to_float, quantize_q8_0, dot_q4_0},
    {DType::kQ5_0, DType::kQ8_0, q5_0_to_float, quantize_q8_0, dot_q5_0},
    {DType::kQ4_1, DType::kQ8_1, q4_1_to_float, quantize_q8_1, dot_q4_1},
    {DType::kQ5_1, DType::kQ8_1, q5_1_to_float, quantize_q8_1, dot_q5_1},
    {DType::kQ4_K, DType::kQ8_K, q4_k_to_float, quantize_q8_k, dot_q4_k},
    {DType::kQ5_K, DType::kQ8_K, q5_k_to_float, quantize_q8_k, dot_q5_k},
    {DType::kQ6_K, DType::kQ8_K, q6_k_to_float, quantize_q8_k, dot_q6_k},
    {DType::kQ2_K, DType::kQ8_K, q2_k_to_float, quantize_q8_k, dot_q2_k},
    {DType::kQ3_K, DType::kQ8_K, q3_k_to_float, quantize_q8_k, dot_q3_k},
    {DType::kIQ4_NL, DType::kQ8_0, iq4_nl_to_float, quantize_q8_0, dot_iq4_nl},
    {DType::kIQ4_XS, DType::kQ8_K, iq4_xs_to_float, quantize_q8_k, dot_iq4_xs},
};

// ---- Vector helpers ------------------------------------------------------------------------

void fp16_row_to_f32(const fp16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

void f32_row_to_fp16(const float* src, fp16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

float dot_f32_f16_impl(int64_t n, const float* x, const fp16_t* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * fp16_to_fp32(y[i]);
  return sum;
}

void axpy_f16_impl(int64_t n, float a, const fp16_t* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_fp32(x[i]);
}

void dot_f32_f16_rows_impl(int64_t n, const float* x, const fp16_t* y, int64_t stride, int64_t rows, float scale,
                           float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = dot_f32_f16_impl(n, x, y + r * stride) * scale;
}

// axpy into the L chains of attention's KQV: 16 (llama.cpp's AVX-512 build) or 8 (its AVX2 build).
template <int L>
void axpy_f16_rows_impl(int64_t n, const float* a, const fp16_t* x, int64_t stride, int64_t rows, int64_t first,
                        float* lanes, int64_t lane_stride) {
  for (int64_t r = 0; r < rows; ++r) axpy_f16_impl(n, a[r], x + r * stride, lanes + ((first + r) % L) * lane_stride);
}

float dot_f32_impl(int64_t n, const float* x, const float* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

// The lanes of the two float orders (GgmlOrder): ggml_v_expf/silu's AVX-512 variant and 16-lane chunks
// reduced as _mm512_reduce_add_ps, or its AVX2 variant and 8-lane chunks reduced as its horizontal sum.
template <float (*kSilu)(float)>
void swiglu_impl(int64_t n, const float* g, const float* u, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = kSilu(g[i]) * u[i];
}

template <int L, float (*kExp)(float), float (*kReduce)(const float*)>
double exp_sum_impl(int64_t n, const float* x, float max, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; i += L) {
    float chunk[L] = {};
    const int64_t m = n - i < L ? n - i : L;
    for (int64_t l = 0; l < m; ++l) chunk[l] = y[i + l] = kExp(x[i + l] - max);
    sum += static_cast<double>(kReduce(chunk));
  }
  return sum;
}

// kernels::geglu: gelu() times up, and 0 (not 0 * up) where gelu is 0 by definition (-10 and below).
void geglu_impl(int64_t n, const float* g, const float* u, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] <= -10.0f ? 0.0f : gelu(g[i]) * u[i];
}

float silu_avx512_order(float x) { return ggml_math::silu_lane(x); }
float silu_avx2_order(float x) { return ggml_math::silu_lane_avx2(x); }

constexpr VectorKernels kVector = {
    Isa::kScalar,          fp16_row_to_f32,       f32_row_to_fp16,
    dot_f32_f16_impl,      axpy_f16_impl,         dot_f32_impl,
    silu_avx512_order,     swiglu_impl<silu_avx512_order>,
    exp_sum_impl<16, ggml_math::expf_lane, ggml_math::reduce16>,
    ggml_math::rope_rotate, dot_f32_f16_rows_impl, axpy_f16_rows_impl<16>, geglu_impl};

constexpr VectorKernels kVectorAvx2Order = {
    Isa::kScalar,          fp16_row_to_f32,       f32_row_to_fp16,
    dot_f32_f16_impl,      axpy_f16_impl,         dot_f32_impl,
    silu_avx2_order,       swiglu_impl<silu_avx2_order>,
    exp_sum_impl<8, ggml_math::expf_lane_avx2, ggml_math::reduce8>,
    ggml_math::rope_rotate, dot_f32_f16_rows_impl, axpy_f16_rows_impl<8>, geglu_impl};

}  // namespace

// IEEE half -> float, exact. NaNs keep their payload and come back quiet, as F16C's vcvtph2ps.
float fp16_to_fp32(fp16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-24f;  // zero or subnormal: exact
    return bits_float(sign | float_bits(mag));
  }
  if (exp == 31) return bits_float(sign | 0x7f800000 | (man != 0 ? 0x400000u : 0u) | (man << 13));
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

// Float -> IEEE half, round to nearest even; overflow gives infinity; NaNs keep the top payload
// bits and come back quiet, as F16C's vcvtps2ph.
fp16_t fp32_to_fp16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t ax = x & 0x7fffffff;
  if (ax >= 0x7f800000) {
    return static_cast<fp16_t>(ax == 0x7f800000 ? sign | 0x7c00 : sign | 0x7e00 | ((ax >> 13) & 0x3ff));
  }
  if (ax >= 0x47800000) return static_cast<fp16_t>(sign | 0x7c00);  // >= 65536
  if (ax < 0x38800000) {  // |f| < 2^-14: the result is subnormal or zero
    if (ax <= 0x33000000) return static_cast<fp16_t>(sign);  // <= 2^-25 rounds (to even) to zero
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return static_cast<fp16_t>(sign | r);
  }
  uint32_t base = (ax >> 13) - (112u << 10);
  const uint32_t rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (base & 1))) ++base;  // a carry into the exponent is right
  return static_cast<fp16_t>(sign | (base < 0x7c00 ? base : 0x7c00));
}

const float* fp16_table() {
  static const float* const kTable = [] {
    auto* table = new float[1 << 16];  // lives as long as the process
    for (uint32_t h = 0; h < (1u << 16); ++h) table[h] = fp16_to_fp32(static_cast<fp16_t>(h));
    return table;
  }();
  return kTable;
}

const TypeKernels* type_kernels(DType type) {
  for (const TypeKernels& t : kTables) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

const VectorKernels& vector_kernels(GgmlOrder order) { return order == GgmlOrder::kAvx2 ? kVectorAvx2Order : kVector; }

void dot_q4_k_repacked_gemm(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_min<BlockQ4_K, decode_q4_k, 4>(k, w, a, s, nr, o);
}
void dot_q2_k_tiled(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_q2_k_in<true>(k, w, a, s, nr, o);
}
void dot_q3_k_tiled(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_scaled<BlockQ3_K, 16, decode_q3_k_scaled, true>(k, w, a, s, nr, o);
}
void dot_q5_k_tiled(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_min<BlockQ5_K, decode_q5_k, 0, true>(k, w, a, s, nr, o);
}
void dot_q6_k_tiled(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_scaled<BlockQ6_K, 16, decode_q6_k_scaled, true>(k, w, a, s, nr, o);
}
void dot_iq4_xs_tiled(int64_t k, const void* w, const void* a, size_t s, int nr, float* o) {
  dot_kq_scaled<BlockIQ4_XS, 32, decode_iq4_xs, true>(k, w, a, s, nr, o);
}

DotFn tiled_dot(DType type) {
  switch (type) {
    case DType::kQ2_K: return &dot_q2_k_tiled;
    case DType::kQ3_K: return &dot_q3_k_tiled;
    case DType::kQ5_K: return &dot_q5_k_tiled;
    case DType::kQ6_K: return &dot_q6_k_tiled;
    case DType::kIQ4_XS: return &dot_iq4_xs_tiled;
    default: return nullptr;
  }
}

const TypeKernels* repacked_type_kernels(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return &kRepackedQ4_0;
    case DType::kQ4_K:
      return &kRepackedQ4_K;
    case DType::kIQ4_NL:
      return &kRepackedIQ4_NL;
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::scalar
