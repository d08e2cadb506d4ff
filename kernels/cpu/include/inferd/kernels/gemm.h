// inferd/kernels/gemm.h — prefill matrix multiplication for the quantized weight types (all but Q5_1).
//
// One call computes a block of y[t][r] = dot(W[r], X[t]) for a row range of a quantized weight
// matrix and m activation rows, reading the mapped weights in place (no repacking). It replaces
// m / kMaxDotRows calls of TypeKernels::dot per row during prefill.
//
// Numerics: every output is bit-identical to ggml's x86 ggml_vec_dot_<type>_q8_* for that row and
// activation row (and so to this library's dot kernels, which follow the same order): per 32-element
// block, 8 float lanes accumulate acc_i = fma(d_w * d_a, float(int_i), acc_i), where int_i is the
// exact integer dot of elements 4i..4i+3; the lanes reduce as s = ((a0+a4) + (a2+a6)) +
// ((a1+a5) + (a3+a7)); Q4_1 adds summs = fma(m_w, s_a, summs) (accumulated block by block) last.
// The 256-element super-block types (Q2_K to Q6_K, IQ4_XS) and IQ4_NL follow their dot kernels the same way
// (gemm_avx512_k.cpp, gemm_avx2_k.cpp, gemm_avx2.cpp): the results equal that ISA's TypeKernels::dot bit
// for bit (IQ4_NL: llamafile's block order, see gemm_avx2.cpp).
// (That is MatmulOrder::kVecDot; gemm_kernel_for(..., MatmulOrder) also gives Q4_0's and Q4_K's GEMMs in
// llama.cpp's repacked orders, inferd/kernels/cpu.h.)
// Only the integer work is reorganised (tiles of rows x activation rows; u8 x s8 products with
// AVX-512 VNNI, or with AVX2's maddubs where no pair of products can saturate).
// ISAs: Q4_0/Q4_1/Q5_0/Q8_0 have an AVX-512 VNNI GEMM and an AVX2 + FMA + F16C one (gemm_avx2.cpp, also
// what an AVX-512 request gets on a CPU without AVX-512); so do Q4_K, Q5_K and Q6_K (gemm_avx512_k.cpp,
// gemm_avx2_k.cpp). Q2_K, Q3_K, IQ4_NL and IQ4_XS have one AVX2 GEMM for both ISAs (their dot kernels have
// the same 8 lanes on both). Q5_1 and the float types have none (TypeKernels::dot with several rows).
//
// Thread safety: kernels are pure apart from a thread-local scratch buffer; one call runs on the
// calling thread only, and calls on different threads (e.g. disjoint row ranges) are independent.
#pragma once

#include <cstddef>
#include <cstdint>

#include "inferd/kernels/cpu.h"
#include "inferd/dtype.h"
#include "inferd/weight_layout.h"

namespace inferd::kernels {

// out[t * out_stride + r] (+)= dot(W row r, activation row t) for r in [r0, r1), t in [0, m).
// W rows are `w_row_bytes` apart, k elements each (k a multiple of 32), type `type`; activation rows
// (already quantized to type_kernels(type)->act_type: Q8_0 for Q4_0/Q8_0, Q8_1 for Q4_1) are
// `act_stride` bytes apart. If `accumulate`, adds to out; else stores (plus bias[r] if bias is set).
struct GemmArgs {
  DType type;
  int64_t k;
  const uint8_t* w;
  size_t w_row_bytes;
  int64_t r0, r1;
  const uint8_t* act;
  size_t act_stride;
  int64_t m;
  float* out;
  int64_t out_stride;
  bool accumulate;
  const float* bias;
  // How W's blocks are arranged (inferd/weight_layout.h). kInterleaved16: r0 a multiple of 16, W's row count
  // too (w is the matrix's first byte, w_row_bytes its row size); gemm_kernel_for() says which kernels read it.
  WeightLayout layout = WeightLayout::kRows;
};
using GemmFn = void (*)(const GemmArgs&);

// The GEMM for weights of `type` on `isa` (clamped to what this CPU runs); nullptr when there is no
// GEMM for the type on that ISA (the caller then uses TypeKernels::dot).
GemmFn gemm_kernel(DType type, Isa isa);
inline GemmFn gemm_kernel(DType type) { return gemm_kernel(type, best_isa()); }
// The GEMM for weights of `type` stored as `layout`: gemm_kernel() for the row layout; for interleaved
// weights the AVX-512 and AVX2 GEMMs of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K (nullptr otherwise, e.g.
// on the scalar ISA: the caller gathers rows).
GemmFn gemm_kernel_for(DType type, WeightLayout layout, Isa isa);
inline GemmFn gemm_kernel_for(DType type, WeightLayout layout) { return gemm_kernel_for(type, layout, best_isa()); }
// MatmulOrder::kRepacked sums a Q2_K, Q3_K, Q5_K, Q6_K or IQ4_XS matmul of at least this many activation rows as
// llama.cpp's tiled K-quant GEMM does (per 256-element super-block the exact integer totals, then one float step:
// inferd/kernels/cpu.h); fewer rows keep the vec_dot order, as in llama.cpp.
inline constexpr int64_t kTiledMinRows = 8;

// The GEMM that computes a matrix of `type` in `order` (as matmul_order_for() gives it, inferd/kernels/cpu.h):
// gemm_kernel_for() for kVecDot; for kRepacked the GEMMs of Q4_0 and Q4_K in that order (either layout; AVX2, or
// AVX-512 VNNI where isa asks for it and the CPU has it; any m >= 1), and of the tiled types (the tiled GEMM from
// kTiledMinRows rows, the vec_dot order's GEMM of `isa` below). Q4_0's equals type_kernels(kQ4_0, isa,
// kRepacked)->dot bit for bit; Q4_K's equals that dot for the last m % 4 activation rows and llama.cpp's GEMM steps
// for the others (cpu.h); IQ4_NL's (AVX2, on both ISAs) equals its dot in that order. On the scalar ISA: the scalar
// definitions of Q4_K and the tiled types on the row layout, else nullptr.
GemmFn gemm_kernel_for(DType type, WeightLayout layout, Isa isa, MatmulOrder order);

}  // namespace inferd::kernels
