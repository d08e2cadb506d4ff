// GEMM dispatch and the scalar reference for inferd/kernels/gemm.h. Compiled for the baseline
// target: the AVX2 and AVX-512 translation units are only entered after isa_available() said yes.
#include "inferd/kernels/gemm.h"

#include <cmath>
#include <cstring>

#include "gemm_internal.h"
#include "inferd/status.h"
#include "isa_tables.h"

namespace inferd::kernels {
namespace gemm_scalar {
namespace {

// The 8 lane sums int_i = sum of w[j] * a[j] over j in 4i..4i+3 for one 32-element block; `w`
// holds the weight quants as signed values (Q4_0: q - 8; Q4_1: q; Q8_0: q).
void lane_sums(const int* w, const int8_t* a, int32_t out[8]) {
  for (int i = 0; i < 8; ++i) {
    int32_t s = 0;
    for (int j = 4 * i; j < 4 * i + 4; ++j) s += w[j] * a[j];
    out[i] = s;
  }
}

// Element order of a 4-bit block: the low nibbles are elements 0..15, the high nibbles 16..31.
void unpack_q4(const uint8_t* qs, int offset, int* w) {
  for (int j = 0; j < 16; ++j) {
    w[j] = (qs[j] & 0x0F) - offset;
    w[j + 16] = (qs[j] >> 4) - offset;
  }
}

float reduce_lanes(const float acc[8]) {
  float r[4];
  for (int j = 0; j < 4; ++j) r[j] = acc[j + 4] + acc[j];
  return (r[0] + r[2]) + (r[1] + r[3]);
}

template <DType kType>
float dot_contract(int64_t nb, const uint8_t* w_row, const uint8_t* act_row) {
  const float* half = scalar::fp16_table();
  float acc[8] = {};
  float summs = 0.0f;
  int w[32];
  int32_t isum[8];
  for (int64_t b = 0; b < nb; ++b) {
    float scale;
    if constexpr (kType == DType::kQ4_1) {
      const auto& wb = reinterpret_cast<const BlockQ4_1*>(w_row)[b];
      const auto& ab = reinterpret_cast<const BlockQ8_1*>(act_row)[b];
      unpack_q4(wb.qs, 0, w);
      lane_sums(w, ab.qs, isum);
      scale = half[wb.d] * half[ab.d];
      summs = std::fma(half[wb.m], half[ab.s], summs);
    } else {
      const auto& ab = reinterpret_cast<const BlockQ8_0*>(act_row)[b];
      if constexpr (kType == DType::kQ4_0) {
        const auto& wb = reinterpret_cast<const BlockQ4_0*>(w_row)[b];
        unpack_q4(wb.qs, 8, w);
        scale = half[wb.d] * half[ab.d];
      } else {
        const auto& wb = reinterpret_cast<const BlockQ8_0*>(w_row)[b];
        for (int j = 0; j < 32; ++j) w[j] = wb.qs[j];
        scale = half[wb.d] * half[ab.d];
      }
      lane_sums(w, ab.qs, isum);
    }
    for (int i = 0; i < 8; ++i) acc[i] = std::fma(scale, static_cast<float>(isum[i]), acc[i]);
  }
  float result = reduce_lanes(acc);
  if constexpr (kType == DType::kQ4_1) result = result + summs;
  return result;
}

template <DType kType>
void gemm_type(const GemmArgs& g) {
  const int64_t nb = g.k / 32;
  for (int64_t t = 0; t < g.m; ++t) {
    const uint8_t* act_row = g.act + static_cast<size_t>(t) * g.act_stride;
    float* out = g.out + t * g.out_stride;
    for (int64_t r = g.r0; r < g.r1; ++r) {
      const float v = dot_contract<kType>(nb, g.w + static_cast<size_t>(r) * g.w_row_bytes, act_row);
      if (g.accumulate) {
        out[r] += v;
      } else {
        out[r] = g.bias != nullptr ? v + g.bias[r] : v;
      }
    }
  }
}

}  // namespace

void gemm(const GemmArgs& g) {
  INFERD_ASSERT(g.k % 32 == 0, "k must be a multiple of 32");
  INFERD_ASSERT(g.layout == WeightLayout::kRows, "the scalar GEMM reads the row layout only");
  switch (g.type) {
    case DType::kQ4_0:
      return gemm_type<DType::kQ4_0>(g);
    case DType::kQ4_1:
      return gemm_type<DType::kQ4_1>(g);
    case DType::kQ8_0:
      return gemm_type<DType::kQ8_0>(g);
    default:
      INFERD_ASSERT(false, "gemm_scalar: unsupported type");
  }
}

// MatmulOrder::kRepacked, Q4_K, row layout: llama.cpp's q4_K_8x8 GEMM for the activation rows before
// m - m % 4 (per pair of sub-blocks the exact integers n = sc_2j * isum_2j + sc_2j+1 * isum_2j+1 and
// m = mn_2j * asum_2j + mn_2j+1 * asum_2j+1, acc = fma(float(n), d_w * d_a, acc), accm = fma(float(m),
// dmin_w * d_a, accm)), its GEMV for the rest (the same per super-block); the result acc - accm. The definition
// the AVX2 GEMM equals bit for bit.
void gemm_q4_k_repacked(const GemmArgs& g) {
  INFERD_ASSERT(g.type == DType::kQ4_K && g.k % kQK_K == 0 && g.layout == WeightLayout::kRows,
                "the scalar repacked GEMM is Q4_K's, on the row layout");
  const float* half = scalar::fp16_table();
  const int64_t nb = g.k / kQK_K;
  const int64_t m4 = g.m - g.m % 4;
  for (int64_t t = 0; t < g.m; ++t) {
    const auto* a = reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(t) * g.act_stride);
    const int steps = t < m4 ? 4 : 1;  // float steps per super-block
    float* out = g.out + t * g.out_stride;
    for (int64_t r = g.r0; r < g.r1; ++r) {
      const auto* w = reinterpret_cast<const BlockQ4_K*>(g.w + static_cast<size_t>(r) * g.w_row_bytes);
      float acc = 0.0f, accm = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* q = w[b].scales;
        const float dd = half[w[b].d] * a[b].d, ddmin = half[w[b].dmin] * a[b].d;
        int n = 0, m = 0;
        for (int s = 0; s < 8; ++s) {
          // ggml's get_scale_min_k4.
          const int sc = s < 4 ? q[s] & 63 : (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
          const int mn = s < 4 ? q[s + 4] & 63 : (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
          int isum = 0;
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = w[b].qs[32 * (s / 2) + l];
            isum += (s % 2 == 0 ? byte & 15 : byte >> 4) * a[b].qs[32 * s + l];
          }
          n += sc * isum;
          m += mn * (a[b].bsums[2 * s] + a[b].bsums[2 * s + 1]);
          if ((s + 1) % (8 / steps) == 0) {
            acc = std::fma(static_cast<float>(n), dd, acc);
            accm = std::fma(static_cast<float>(m), ddmin, accm);
            n = m = 0;
          }
        }
      }
      const float v = acc - accm;
      if (g.accumulate) {
        out[r] += v;
      } else {
        out[r] = g.bias != nullptr ? v + g.bias[r] : v;
      }
    }
  }
}

// MatmulOrder::kRepacked, Q6_K, row layout: below kTiledMinRows activation rows the vec_dot order (the scalar
// dot); from there llama.cpp's tiled K-quant GEMM: per super-block the exact total t = sum_e sc_(e/16) * q_e * a_e
// (q_e = code - 32), y = fma(float(t) * d_w, d_a, y), super-block after super-block from 0. The definition the
// AVX2 and AVX-512 GEMMs equal bit for bit.
void gemm_q6_k_repacked(const GemmArgs& g) {
  INFERD_ASSERT(g.type == DType::kQ6_K && g.k % kQK_K == 0 && g.layout == WeightLayout::kRows,
                "the scalar repacked Q6_K GEMM is on the row layout");
  const TypeKernels* tk = scalar::type_kernels(DType::kQ6_K);
  const float* half = scalar::fp16_table();
  const int64_t nb = g.k / kQK_K;
  for (int64_t t = 0; t < g.m; ++t) {
    const uint8_t* act = g.act + static_cast<size_t>(t) * g.act_stride;
    const auto* a = reinterpret_cast<const BlockQ8_K*>(act);
    float* out = g.out + t * g.out_stride;
    for (int64_t r = g.r0; r < g.r1; ++r) {
      const uint8_t* row = g.w + static_cast<size_t>(r) * g.w_row_bytes;
      float y = 0.0f;
      if (g.m < kTiledMinRows) {
        tk->dot(g.k, row, act, 0, 1, &y);
      } else {
        const auto* w = reinterpret_cast<const BlockQ6_K*>(row);
        for (int64_t b = 0; b < nb; ++b) {
          int total = 0;
          for (int n = 0; n < 2; ++n) {  // ggml's element order: halves of 128, four runs of 32 in each
            const uint8_t* ql = w[b].ql + 64 * n;
            const uint8_t* qh = w[b].qh + 32 * n;
            for (int l = 0; l < 32; ++l) {
              const int q[4] = {((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32,
                                ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32,
                                ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32,
                                ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32};
              for (int j = 0; j < 4; ++j) {
                const int e = 128 * n + 32 * j + l;
                total += w[b].scales[e / 16] * q[j] * a[b].qs[e];
              }
            }
          }
          y = std::fma(static_cast<float>(total) * half[w[b].d], a[b].d, y);
        }
      }
      if (g.accumulate) {
        out[r] += y;
      } else {
        out[r] = g.bias != nullptr ? y + g.bias[r] : y;
      }
    }
  }
}

}  // namespace gemm_scalar

GemmFn gemm_kernel(DType type, Isa isa) {
  if (type == DType::kQ4_K || type == DType::kQ5_K || type == DType::kQ6_K) {
    // No scalar reference of their own: each SIMD kernel is checked against its ISA's dot kernel.
    if (isa == Isa::kAvx512 && isa_available(Isa::kAvx512)) return gemm_avx512_k::kernel(type);
    // AVX2, or AVX-512 asked for on a CPU without it.
    if (isa != Isa::kScalar && isa_available(Isa::kAvx2)) return gemm_avx2_k::kernel(type);
    return nullptr;
  }
  if (type == DType::kQ2_K || type == DType::kQ3_K || type == DType::kIQ4_XS) {
    // The AVX2 GEMM on AVX2 and AVX-512 CPUs alike: both ISAs' dot kernels have its 8 lanes and float steps.
    return isa != Isa::kScalar && isa_available(Isa::kAvx2) ? gemm_avx2_k::kernel(type) : nullptr;
  }
  if (type == DType::kIQ4_NL) {
    // The AVX2 GEMM on AVX2 and AVX-512 CPUs alike: both ISAs' dot kernels have its lanes (its
    // single-accumulator order is llamafile's, see gemm_avx2.cpp).
    return isa != Isa::kScalar && isa_available(Isa::kAvx2) ? gemm_avx2::kernel(type) : nullptr;
  }
  if (type == DType::kQ5_0) {
    // No scalar GEMM of its own (its dot kernels are the reference): AVX-512 VNNI or AVX2.
    if (isa == Isa::kAvx512 && isa_available(Isa::kAvx512)) return gemm_avx512::kernel(type);
    return isa != Isa::kScalar && isa_available(Isa::kAvx2) ? gemm_avx2::kernel(type) : nullptr;
  }
  if (type != DType::kQ4_0 && type != DType::kQ4_1 && type != DType::kQ8_0) return nullptr;
  if (isa == Isa::kAvx512 && isa_available(Isa::kAvx512)) return gemm_avx512::kernel(type);
  if (isa == Isa::kScalar) return &gemm_scalar::gemm;
  // AVX2, or AVX-512 asked for on a CPU without it.
  if (isa_available(Isa::kAvx2)) return gemm_avx2::kernel(type);
  return nullptr;
}

GemmFn gemm_kernel_for(DType type, WeightLayout layout, Isa isa) {
  if (layout == WeightLayout::kRows) return gemm_kernel(type, isa);
  if (!interleavable(type) || isa == Isa::kScalar) return nullptr;
  return gemm_kernel(type, isa);  // the AVX-512 and AVX2 GEMMs of the interleavable types read both layouts
}

GemmFn gemm_kernel_for(DType type, WeightLayout layout, Isa isa, MatmulOrder order) {
  if (order == MatmulOrder::kVecDot) return gemm_kernel_for(type, layout, isa);
  if (isa == Isa::kScalar || !isa_available(Isa::kAvx2)) {
    // Q4_K's and Q6_K's orders depend on the batch: the scalar ISA needs their GEMMs too (Q4_0's is the same for
    // every row, so its dot serves).
    if (layout != WeightLayout::kRows) return nullptr;
    if (type == DType::kQ4_K) return &gemm_scalar::gemm_q4_k_repacked;
    return type == DType::kQ6_K ? &gemm_scalar::gemm_q6_k_repacked : nullptr;
  }
  if (isa == Isa::kAvx512 && isa_available(Isa::kAvx512)) {
    if (GemmFn fn = gemm_avx512::repacked_kernel(type)) return fn;
  }
  if (GemmFn fn = gemm_avx2_k::repacked_kernel(type)) return fn;
  if (GemmFn fn = gemm_avx2::repacked_kernel(type)) return fn;
  return gemm_kernel_for(type, layout, isa);  // a type the order does not change
}

}  // namespace inferd::kernels
