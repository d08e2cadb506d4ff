// gemm_internal.h (private) — the per-ISA GEMM entry points that gemm.cpp dispatches between.
//
// Each ISA's GEMM lives in its own translation unit compiled with that ISA's flags (gemm.cmake);
// only gemm.cpp, compiled for the baseline, decides at run time which of them may be called.
// Thread safety: pure functions.
#pragma once

#include "inferd/kernels/gemm.h"

namespace inferd::kernels {

namespace gemm_scalar {
// The numerics contract of gemm.h written out lane by lane; the reference every SIMD GEMM equals.
void gemm(const GemmArgs& args);
// MatmulOrder::kRepacked's GEMMs on the row layout, written out as their definitions: Q4_K's, and that of the
// types llama.cpp sends through its tiled K-quant GEMM (scalar::tiled_dot(): Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS).
void gemm_q4_k_repacked(const GemmArgs& args);
void gemm_tiled(const GemmArgs& args);
}  // namespace gemm_scalar

namespace gemm_avx2 {
// AVX2 + FMA + F16C (no AVX-512): Q4_0, Q4_1 and Q8_0; nullptr for other types.
GemmFn kernel(DType type);
// The MatmulOrder::kRepacked GEMMs (Q4_0 and Q4_K, both layouts, and IQ4_NL; on AVX2 and AVX-512 CPUs); nullptr for
// other types.
GemmFn repacked_kernel(DType type);
}  // namespace gemm_avx2

namespace gemm_avx2_k {
// AVX2 + FMA + F16C: Q2_K to Q6_K and IQ4_XS, bit-identical to the AVX2 dot kernels; nullptr for other types.
GemmFn kernel(DType type);
// llama.cpp's tiled K-quant GEMM (MatmulOrder::kRepacked from kTiledMinRows activation rows on) for Q2_K, Q3_K,
// Q5_K, Q6_K and IQ4_XS, on AVX2 and AVX-512 CPUs alike (exact integers, then the same float steps as on every
// ISA), for any m; nullptr for other types.
GemmFn tiled_kernel(DType type);
}  // namespace gemm_avx2_k

namespace gemm_avx512 {
// nullptr when the type has no AVX-512 GEMM.
GemmFn kernel(DType type);
// The MatmulOrder::kRepacked GEMMs with AVX-512 VNNI (gemm_avx512_repacked.cpp: Q4_0, Q4_K and Q6_K, both layouts),
// equal bit for bit to the AVX2 ones; nullptr for other types.
GemmFn repacked_kernel(DType type);
}  // namespace gemm_avx512

namespace gemm_avx512_k {
// Q4_K, Q5_K and Q6_K; nullptr for other types.
GemmFn kernel(DType type);
}  // namespace gemm_avx512_k

}  // namespace inferd::kernels
