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

// The repacked order's scalar GEMMs, whose activation rows take different definitions by their place in the batch:
// row t of g through dot_for(t) (TypeKernels::dot's signature), stored as the GemmArgs ask. Row layout.
template <typename DotFor>
void gemm_by_rows(const GemmArgs& g, DotFor dot_for) {
  INFERD_ASSERT(g.k % kQK_K == 0 && g.layout == WeightLayout::kRows, "the scalar repacked GEMMs read the row layout");
  for (int64_t t = 0; t < g.m; ++t) {
    const auto dot = dot_for(t);
    const uint8_t* act = g.act + static_cast<size_t>(t) * g.act_stride;
    float* out = g.out + t * g.out_stride;
    for (int64_t r = g.r0; r < g.r1; ++r) {
      float v;
      dot(g.k, g.w + static_cast<size_t>(r) * g.w_row_bytes, act, 0, 1, &v);
      if (g.accumulate) {
        out[r] += v;
      } else {
        out[r] = g.bias != nullptr ? v + g.bias[r] : v;
      }
    }
  }
}

// MatmulOrder::kRepacked, Q4_K: llama.cpp's q4_K_8x8 GEMM steps for the activation rows before m - m % 4, its
// GEMV's (the repacked dot) for the rest.
void gemm_q4_k_repacked(const GemmArgs& g) {
  INFERD_ASSERT(g.type == DType::kQ4_K, "this GEMM is Q4_K's");
  const int64_t m4 = g.m - g.m % 4;
  const auto gemv = scalar::repacked_type_kernels(DType::kQ4_K)->dot;
  gemm_by_rows(g, [&](int64_t t) { return t < m4 ? &scalar::dot_q4_k_repacked_gemm : gemv; });
}

// MatmulOrder::kRepacked for the types llama.cpp sends through its tiled K-quant GEMM: vec_dot's order (the scalar
// dot) below kTiledMinRows activation rows, the tiled GEMM's from there.
void gemm_tiled(const GemmArgs& g) {
  const scalar::DotFn tiled = scalar::tiled_dot(g.type);
  INFERD_ASSERT(tiled != nullptr, "%s has no tiled order", dtype_name(g.type));
  const scalar::DotFn vec_dot = scalar::type_kernels(g.type)->dot;
  gemm_by_rows(g, [&](int64_t) { return g.m >= kTiledMinRows ? tiled : vec_dot; });
}

}  // namespace gemm_scalar

namespace {

// MatmulOrder::kRepacked for the types llama.cpp sends through its tiled K-quant GEMM, on AVX2 and AVX-512 CPUs:
// the tiled GEMM from kTiledMinRows activation rows on (exact integers and the same float steps on every ISA, so
// one AVX2 kernel serves both), below that the vec_dot order's GEMM of kIsa, as llama.cpp does.
template <DType kType, Isa kIsa>
void gemm_tiled_simd(const GemmArgs& g) {
  const GemmFn fn = g.m >= kTiledMinRows ? gemm_avx2_k::tiled_kernel(kType) : gemm_kernel_for(kType, g.layout, kIsa);
  fn(g);
}

template <Isa kIsa>
GemmFn tiled_gemm(DType type) {
  switch (type) {
    case DType::kQ2_K:
      return &gemm_tiled_simd<DType::kQ2_K, kIsa>;
    case DType::kQ3_K:
      return &gemm_tiled_simd<DType::kQ3_K, kIsa>;
    case DType::kQ5_K:
      return &gemm_tiled_simd<DType::kQ5_K, kIsa>;
    case DType::kQ6_K:
      return &gemm_tiled_simd<DType::kQ6_K, kIsa>;
    case DType::kIQ4_XS:
      return &gemm_tiled_simd<DType::kIQ4_XS, kIsa>;
    default:
      return nullptr;
  }
}

}  // namespace

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
  if (layout != WeightLayout::kRows && !interleavable(type)) return nullptr;
  if (isa == Isa::kScalar || !isa_available(Isa::kAvx2)) {
    // Q4_K's and the tiled types' orders depend on the batch: the scalar ISA needs their GEMMs too (Q4_0's is the
    // same for every row, so its dot serves).
    if (layout != WeightLayout::kRows) return nullptr;
    if (type == DType::kQ4_K) return &gemm_scalar::gemm_q4_k_repacked;
    return scalar::tiled_dot(type) != nullptr ? &gemm_scalar::gemm_tiled : nullptr;
  }
  const bool avx512 = isa == Isa::kAvx512 && isa_available(Isa::kAvx512);
  if (avx512) {
    if (GemmFn fn = gemm_avx512::repacked_kernel(type)) return fn;  // Q6_K's tiled GEMM among them
  }
  if (GemmFn fn = avx512 ? tiled_gemm<Isa::kAvx512>(type) : tiled_gemm<Isa::kAvx2>(type)) return fn;
  if (GemmFn fn = gemm_avx2::repacked_kernel(type)) return fn;
  return gemm_kernel_for(type, layout, isa);  // a type the order does not change
}

}  // namespace inferd::kernels
