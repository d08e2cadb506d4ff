// inferd/kernels/cuda_exact_math.h — the CPU engine's arithmetic, one thread's share at a time, for the
// CUDA backend's exact numerics (kernels/cuda/exact.cu), and for a host test that checks it against the
// CPU kernels on any machine, GPU or not (tests/cuda_exact_math_test.cpp).
//
// Every function compiles for the host and the device (INFERD_HD) and gives the same bits on both:
// float operations one rounding at a time (so this header must be compiled without contraction of
// a * b + c: nvcc -fmad=false, g++ -ffp-contract=off), a fused multiply-add only where the CPU fuses
// (fma_), division and square root correctly rounded, integer dot products of four int8 pairs (dp4a on
// the device) whose sums are exact whatever the order.
//
// The order is the CPU engine's x86 kernels' (AVX2 and AVX-512 share it: kernels/cpu/x86_kernels.inc;
// the OpenCL backend's CpuOrder::kX86):
//  * 32-element block types (Q8_0, Q4_0, Q5_0 against Q8_0 activations; Q4_1, Q5_1 against Q8_1): per
//    weight row 8 float lanes; lane l adds, block by block, fma(d_w * d_a, isum_l, acc_l), isum_l the
//    integer dot of the block's elements 4l..4l+3 (signed values; codes for the types with a minimum,
//    whose m_w * s_a terms form their own fma chain, added last); then hsum8.
//  * K-quants against Q8_K activations: per 256-element super-block, lane l's integer sum over the 8
//    groups of 32 of scale * dot(elements 32s+4l..+3), then per super-block one fma per lane, with the
//    minimum (Q4_K, Q5_K) or offset (Q6_K) terms as x86_kernels.inc's dot_k_min / dot_q6_k_nr.
//  * Float weights (F32, F16, BF16) against float activations: 16 lanes over steps of 16 elements
//    (dot_float), hsum8 of the lane pairs' sums, the last k % 8 products one fma each.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define INFERD_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define INFERD_HD inline
#endif

namespace inferd::cuda::exact {

// ---- Scalars -------------------------------------------------------------------------------------------

INFERD_HD float fma_(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
INFERD_HD float div_(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
INFERD_HD float sqrt_(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
// Round to the nearest integer, ties to even (nearbyint in the default rounding mode).
INFERD_HD float rint_(float a) {
#if defined(__CUDA_ARCH__)
  return rintf(a);
#else
  return std::nearbyint(a);
#endif
}
INFERD_HD float ldexp_(float a, int e) {
#if defined(__CUDA_ARCH__)
  return ldexpf(a, e);
#else
  return std::ldexp(a, e);
#endif
}
INFERD_HD float fabs_(float a) {
#if defined(__CUDA_ARCH__)
  return fabsf(a);
#else
  return std::fabs(a);
#endif
}
INFERD_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}
INFERD_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

// IEEE half to float (exact).
INFERD_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;  // subnormal or zero: exact
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}
// Float to IEEE half, rounded to nearest even (F16C's vcvtps2ph with imm 0, and ggml's).
INFERD_HD uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return static_cast<uint16_t>(sign | (x > 0x7F800000u ? 0x7E00u | ((x >> 13) & 0x3FFu) : 0x7C00u));
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504: infinity
  if (x < 0x38800000u) {                                               // below 2^-14: a subnormal half
    if (x < 0x33000000u) return static_cast<uint16_t>(sign);          // at most 2^-25: zero
    const uint32_t e = x >> 23, m = (x & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (x - 0x38000000u) >> 13;  // rebias the exponent (127 - 15 = 112), keep 10 mantissa bits
  const uint32_t rem = x & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry moves into the exponent, as it should
  return static_cast<uint16_t>(sign | r);
}
INFERD_HD float round_half(float f) { return half_to_float(float_to_half(f)); }
INFERD_HD float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// exp(x) as one lane of ggml_v_expf (kernels/cpu/ggml_math.h expf_lane).
INFERD_HD float expf_lane(float x) {
  const float round = 0x1.8p23f;
  const float z = fma_(x, 0x1.715476p+0f, round);
  const float n = z - round;
  const float b = fma_(-n, 0x1.7f7d1cp-20f, fma_(-n, 0x1.62e4p-1f, x));
  if (fabs_(n) > 192.0f) return n <= 0.0f ? 0.0f : bits_float(0x7F800000u);
  const float u = b * b;
  const float j = fma_(fma_(fma_(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fma_(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                       fma_(0x1.ffffecp-1f, b, 1.0f));
  return ldexp_(j, static_cast<int>(n));
}
// x * sigmoid(x) as ggml_v_silu (silu_lane).
INFERD_HD float silu(float x) { return div_(x, 1.0f + expf_lane(0.0f - x)); }

// The sum of 8 lanes in x86_kernels.inc's hsum order.
INFERD_HD float hsum8(const float* a) {
  float s[4];
  for (int i = 0; i < 4; ++i) s[i] = a[i] + a[i + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}
// The sum of 16 lanes in _mm512_reduce_add_ps's order (ggml_math::reduce16).
INFERD_HD float reduce16(const float* v) {
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// ---- Integer dots ------------------------------------------------------------------------------------

// The dot product of the four signed bytes of a and b.
INFERD_HD int idot4(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), 0);
#else
  int s = 0;
  for (int i = 0; i < 4; ++i) s += static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i));
  return s;
#endif
}
INFERD_HD uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
INFERD_HD uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// ---- Activations, as the CPU engine quantizes them ---------------------------------------------------

// A Q8_0 / Q8_1 block of 32 activations: d = fp16(amax / 127) and s = fp16(d * sum of the quants), as
// floats; the quants 4-byte aligned for the dot units.
struct Q8Block {
  float d, s;
  int8_t qs[32];
};
static_assert(sizeof(Q8Block) == 40, "Q8Block layout");
// A Q8_K block of 256: d = 1 / iscale (float), the 16 sums of 16 quants, the quants.
struct Q8KBlock {
  float d;
  int32_t bsums[16];
  int8_t qs[256];
};
static_assert(sizeof(Q8KBlock) == 324, "Q8KBlock layout");

// ggml's x86 quantize_row_q8_0 / q8_1 of one block of 32 (kernels/cpu: quantize_act for Q8_0 and Q8_1).
INFERD_HD void quantize_q8(const float* x, Q8Block* out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = fabs_(x[i]) > amax ? fabs_(x[i]) : amax;
  const float id = amax != 0.0f ? div_(127.0f, amax) : 0.0f;
  const float d = div_(amax, 127.0f);
  int sum = 0;
  for (int i = 0; i < 32; ++i) {
    const int q = static_cast<int>(rint_(x[i] * id));
    out->qs[i] = static_cast<int8_t>(q);
    sum += q;
  }
  out->d = round_half(d);
  out->s = round_half(d * static_cast<float>(sum));
}

// quantize_row_q8_K_ref of one block of 256: the first element of largest magnitude sets the scale.
INFERD_HD void quantize_q8k(const float* x, Q8KBlock* out) {
  float amax = 0.0f, mx = 0.0f;
  for (int i = 0; i < 256; ++i) {
    if (fabs_(x[i]) > amax) {
      amax = fabs_(x[i]);
      mx = x[i];
    }
  }
  const float iscale = amax != 0.0f ? div_(-127.0f, mx) : 0.0f;
  for (int g = 0; g < 16; ++g) {
    int bsum = 0;
    for (int i = 0; i < 16; ++i) {
      float q = rint_(x[16 * g + i] * iscale);
      q = q < 127.0f ? q : 127.0f;
      out->qs[16 * g + i] = static_cast<int8_t>(static_cast<int>(q));
      bsum += static_cast<int>(q);
    }
    out->bsums[g] = bsum;
  }
  out->d = amax != 0.0f ? div_(1.0f, iscale) : 0.0f;
}

// ---- Weights: GGUF blocks read in place ---------------------------------------------------------------

// GGUF type ids (inferd::DType's values) of the types the exact matmul reads.
enum : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
  kBF16 = 30,
};
INFERD_HD constexpr int block_bytes(uint32_t t) {
  return t == kQ4_0 ? 18 : t == kQ4_1 ? 20 : t == kQ5_0 ? 22 : t == kQ5_1 ? 24 : t == kQ8_0 ? 34 : t == kQ4_K ? 144
         : t == kQ5_K ? 176 : t == kQ6_K ? 210 : 0;
}
INFERD_HD constexpr bool has_min(uint32_t t) { return t == kQ4_1 || t == kQ5_1; }
INFERD_HD constexpr bool is_k_quant(uint32_t t) { return t == kQ4_K || t == kQ5_K || t == kQ6_K; }
INFERD_HD constexpr bool is_float(uint32_t t) { return t == kF32 || t == kF16 || t == kBF16; }

// Spreads the 4 low bits of h to bit 4 of each byte (a 5-bit code's fifth bits).
INFERD_HD uint32_t spread_bits4(uint32_t h) {
  return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

// The 8 integer lane sums of one 32-element block against one Q8 block: isum[l] = dot of elements
// 4l..4l+3 (signed values; for Q4_1 / Q5_1 the unsigned codes).
template <uint32_t T>
INFERD_HD void block_isums(const uint8_t* b, const Q8Block& a, int* isum) {
  const uint32_t* aq = reinterpret_cast<const uint32_t*>(a.qs);
  if constexpr (T == kQ8_0) {
    for (int l = 0; l < 8; ++l) isum[l] = idot4(le32(b + 2 + 4 * l), aq[l]);
  } else {
    constexpr int kQs = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
    uint32_t qh = 0;
    if constexpr (T == kQ5_0) qh = le32(b + 2);
    if constexpr (T == kQ5_1) qh = le32(b + 4);
    for (int l = 0; l < 8; ++l) {
      const uint32_t w = le32(b + kQs + 4 * (l % 4));
      uint32_t codes = (l < 4 ? w : w >> 4) & 0x0F0F0F0Fu;
      if constexpr (T == kQ5_0 || T == kQ5_1) codes |= spread_bits4(qh >> (4 * l));
      int s = idot4(codes, aq[l]);
      if constexpr (T == kQ4_0 || T == kQ5_0) {
        s -= (T == kQ4_0 ? 8 : 16) * idot4(0x01010101u, aq[l]);  // the signed values: code - 8 (16)
      }
      isum[l] = s;
    }
  }
}

// The weight block's scale d_w and, for Q4_1 / Q5_1, its minimum m_w.
template <uint32_t T>
INFERD_HD float block_d(const uint8_t* b) {
  return half_to_float(le16(b));
}
template <uint32_t T>
INFERD_HD float block_m(const uint8_t* b) {
  return half_to_float(le16(b + 2));
}

// Q4_K / Q5_K: the 6-bit scale and minimum of group j (ggml's get_scale_min_k4).
INFERD_HD void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The unsigned codes of elements 32s + 4l .. +3 of a K-quant super-block, as 4 bytes (Q6_K: value + 32).
template <uint32_t T>
INFERD_HD uint32_t k_codes(const uint8_t* b, int s, int l) {
  if constexpr (T == kQ4_K || T == kQ5_K) {
    const int c = s / 2;
    const uint32_t w = le32(b + (T == kQ5_K ? 48 : 16) + 32 * c + 4 * l);
    uint32_t codes = (s % 2 == 0 ? w : w >> 4) & 0x0F0F0F0Fu;
    if constexpr (T == kQ5_K) codes |= ((le32(b + 16 + 4 * l) >> s) & 0x01010101u) << 4;
    return codes;
  } else {  // Q6_K: ql[128], qh[64], scales[16], d
    const int n = s / 4, qd = s % 4;
    const uint32_t ql = le32(b + 64 * n + (qd & 1 ? 32 : 0) + 4 * l);
    const uint32_t qh = le32(b + 128 + 32 * n + 4 * l);
    return ((qd >= 2 ? ql >> 4 : ql) & 0x0F0F0F0Fu) | (((qh >> (2 * qd)) & 0x03030303u) << 4);
  }
}

// One K-quant super-block against one Q8_K block: the 8 lane values the float step multiplies (Q6_K:
// sumi_l - off_l) and the minimum terms (Q4_K: p_0..p_3; Q5_K: their total in p[0]).
template <uint32_t T>
INFERD_HD void k_lanes(const uint8_t* b, const Q8KBlock& a, int* lane, int* p) {
  const uint32_t* aq = reinterpret_cast<const uint32_t*>(a.qs);
  int sc[8], mn[8];
  if constexpr (T == kQ4_K || T == kQ5_K) {
    for (int j = 0; j < 8; ++j) scale_min_k4(j, b + 4, &sc[j], &mn[j]);
  }
  for (int l = 0; l < 8; ++l) {
    int sumi = 0;
    for (int s = 0; s < 8; ++s) {
      const int scale = T == kQ6_K ? static_cast<int>(reinterpret_cast<const int8_t*>(b + 192)[2 * s + l / 4]) : sc[s];
      sumi += scale * idot4(k_codes<T>(b, s, l), aq[8 * s + l]);
    }
    lane[l] = sumi;
  }
  if constexpr (T == kQ6_K) {
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    for (int l = 0; l < 8; ++l) {
      lane[l] -= 32 * (scales[2 * l] * a.bsums[2 * l] + scales[2 * l + 1] * a.bsums[2 * l + 1]);
    }
  } else {
    for (int j = 0; j < 4; ++j) {
      p[j] = mn[2 * j] * (a.bsums[4 * j] + a.bsums[4 * j + 1]) + mn[2 * j + 1] * (a.bsums[4 * j + 2] + a.bsums[4 * j + 3]);
    }
    if constexpr (T == kQ5_K) p[0] = p[0] + p[1] + p[2] + p[3];
  }
}

// A K-quant super-block's d and dmin.
INFERD_HD float k_d(uint32_t t, const uint8_t* b) { return half_to_float(le16(b + (t == kQ6_K ? 208 : 0))); }
INFERD_HD float k_dmin(const uint8_t* b) { return half_to_float(le16(b + 2)); }

// ---- The float steps ---------------------------------------------------------------------------------

// A row's accumulators for one token.
struct RowAcc {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float m[4] = {0, 0, 0, 0};  // block types with a minimum: m[0]; Q4_K: 4 lanes; Q5_K: m[0]
};

// One block of a 32-element block type.
template <uint32_t T>
INFERD_HD void block_step(RowAcc& r, float d_w, float m_w, const Q8Block& a, const int* isum) {
  const float scale = d_w * a.d;
  for (int l = 0; l < 8; ++l) r.lane[l] = fma_(scale, static_cast<float>(isum[l]), r.lane[l]);
  if constexpr (has_min(T)) r.m[0] = fma_(m_w, a.s, r.m[0]);
}
// One lane's step alone (a device thread owns one lane's chain).
INFERD_HD float lane_step(float acc, float scale, int isum) { return fma_(scale, static_cast<float>(isum), acc); }

// One K-quant super-block.
template <uint32_t T>
INFERD_HD void k_step(RowAcc& r, float d, float dmin, const Q8KBlock& a, const int* lane, const int* p) {
  const float scale = a.d * d;
  for (int l = 0; l < 8; ++l) r.lane[l] = fma_(scale, static_cast<float>(lane[l]), r.lane[l]);
  if constexpr (T != kQ6_K) {
    const float neg = -(a.d * dmin);
    if constexpr (T == kQ4_K) {
      for (int j = 0; j < 4; ++j) r.m[j] = fma_(neg, static_cast<float>(p[j]), r.m[j]);
    } else {
      r.m[0] = fma_(neg, static_cast<float>(p[0]), r.m[0]);
    }
  }
}

// The row's result.
template <uint32_t T>
INFERD_HD float finish(const RowAcc& r) {
  const float h = hsum8(r.lane);
  if constexpr (T == kQ4_K) return h + ((r.m[0] + r.m[2]) + (r.m[1] + r.m[3]));
  if constexpr (T == kQ5_K || has_min(T)) return h + r.m[0];
  return h;
}

// Element i of a float-type row, as a float.
template <uint32_t T>
INFERD_HD float float_weight(const uint8_t* row, int64_t i) {
  if constexpr (T == kF32) return bits_float(le32(row + 4 * i));
  if constexpr (T == kF16) return half_to_float(le16(row + 2 * i));
  return bf16_to_float(le16(row + 2 * i));
}

// dot_float: lane l (0..15) of a float-type row's dot with x, over the steps of 16, then (lanes 0..7) one
// step of 8 where at least 8 elements remain.
template <uint32_t T>
INFERD_HD float float_lane(const uint8_t* row, const float* x, int64_t k, int l) {
  float acc = 0.0f;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) acc = fma_(float_weight<T>(row, i + l), x[i + l], acc);
  if (i + 8 <= k && l < 8) acc = fma_(float_weight<T>(row, i + l), x[i + l], acc);
  return acc;
}
// The row's result from its 16 lanes: hsum8 of lane l + lane l + 8, then the last k % 8 products.
template <uint32_t T>
INFERD_HD float float_finish(const float* lanes, const uint8_t* row, const float* x, int64_t k) {
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = lanes[l] + lanes[l + 8];
  float sum = hsum8(v);
  for (int64_t j = k / 8 * 8; j < k; ++j) sum = fma_(float_weight<T>(row, j), x[j], sum);
  return sum;
}

// ---- Element-wise values, as the CPU's to_float computes them (the embedding lookup) ------------------

template <uint32_t T>
INFERD_HD float weight_value(const uint8_t* row, int64_t i) {
  if constexpr (is_float(T)) {
    return float_weight<T>(row, i);
  } else if constexpr (T == kQ8_0) {
    const uint8_t* b = row + (i / 32) * 34;
    return static_cast<float>(static_cast<int8_t>(b[2 + i % 32])) * half_to_float(le16(b));
  } else if constexpr (T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1) {
    const uint8_t* b = row + (i / 32) * block_bytes(T);
    const int e = static_cast<int>(i % 32);
    constexpr int kQs = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
    int q = (b[kQs + e % 16] >> (e < 16 ? 0 : 4)) & 0xF;
    if constexpr (T == kQ5_0 || T == kQ5_1) q |= static_cast<int>((le32(b + (T == kQ5_0 ? 2 : 4)) >> e) & 1u) << 4;
    const float d = half_to_float(le16(b));
    if constexpr (T == kQ4_0) return static_cast<float>(q - 8) * d;
    if constexpr (T == kQ5_0) return static_cast<float>(q - 16) * d;
    return static_cast<float>(q) * d + half_to_float(le16(b + 2));
  } else {
    const uint8_t* b = row + (i / 256) * block_bytes(T);
    const int e = static_cast<int>(i % 256), s = e / 32, l = (e % 32) / 4, c = e % 4;
    const int q = static_cast<int>((k_codes<T>(b, s, l) >> (8 * c)) & 0xFFu);
    if constexpr (T == kQ6_K) {
      const float ds = k_d(T, b) * static_cast<float>(reinterpret_cast<const int8_t*>(b + 192)[e / 16]);
      return ds * static_cast<float>(q - 32);
    } else {
      int sc, mn;
      scale_min_k4(s, b + 4, &sc, &mn);
      const float ds = k_d(T, b) * static_cast<float>(sc), ms = k_dmin(b) * static_cast<float>(mn);
      return static_cast<float>(q) * ds - ms;
    }
  }
}

// ---- Attention ---------------------------------------------------------------------------------------

// q . k of one position as kernels::dot_f32_f16 (x86 dot_f32_with): two accumulators of 8 lanes over
// steps of 16, a step of 8 into the first, hsum8 of their sum, then the rest one product at a time.
// Lane l (0..15) of the steps of 16 and the step of 8:
INFERD_HD float qk_lane(const float* q, const uint16_t* k, int hd, int l) {
  float acc = 0.0f;
  int i = 0;
  for (; i + 16 <= hd; i += 16) acc = fma_(q[i + l], half_to_float(k[i + l]), acc);
  if (i + 8 <= hd && l < 8) acc = fma_(q[i + l], half_to_float(k[i + l]), acc);
  return acc;
}
INFERD_HD float qk_finish(const float* lanes, const float* q, const uint16_t* k, int hd) {
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = lanes[l] + lanes[l + 8];
  float sum = hsum8(v);
  for (int j = hd / 8 * 8; j < hd; ++j) sum = sum + q[j] * half_to_float(k[j]);  // products of halves: exact
  return sum;
}

}  // namespace inferd::cuda::exact
