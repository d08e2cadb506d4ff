// isa_tables.h (private) — the per-ISA kernel tables that cpu.cpp dispatches between.
//
// Each ISA lives in its own translation unit compiled with that ISA's flags (see CMakeLists.txt);
// only cpu.cpp, compiled for the baseline, decides at run time which of them may be called.
// Thread safety: tables are constant.
#pragma once

#include "inferd/kernels/cpu.h"

namespace inferd::kernels {

namespace scalar {
// nullptr when the type has no kernels. Every weight type has a scalar table.
const TypeKernels* type_kernels(DType type);
const VectorKernels& vector_kernels(GgmlOrder order);
// Bit-exact software fp16 conversions (the reference the SIMD ones must equal).
float fp16_to_fp32(fp16_t h);
fp16_t fp32_to_fp16(float f);
// All 65536 halves as floats (256 KiB, built on first use): a scale conversion in a hot loop becomes
// a load instead of a conversion competing with the dot product for the vector ports.
const float* fp16_table();
// The MatmulOrder::kRepacked kernels (cpu.h): Q4_0's, Q4_K's and IQ4_NL's dot in that order, written out as its
// definition (the reference the AVX2 kernels equal bit for bit); nullptr for other types.
const TypeKernels* repacked_type_kernels(DType type);
// The activation rows of a batch whose values in that order are not those of repacked_type_kernels()' dot (the
// definitions of gemm.cpp's scalar GEMMs): Q4_K's in llama.cpp's GEMM (the first m - m % 4 of m rows), and in its
// tiled K-quant GEMM (batches of kTiledMinRows rows and more) those of Q2_K, Q3_K, Q5_K, Q6_K and IQ4_XS
// (tiled_dot(); nullptr for other types; llama.cpp's tiled GEMM also takes the Q4_K matrices it cannot repack, whose
// row count is not a multiple of 8: the engine keeps those in the vec_dot order).
using DotFn = void (*)(int64_t k, const void* w, const void* act, size_t stride, int nr, float* out);
void dot_q4_k_repacked_gemm(int64_t k, const void* w, const void* act, size_t stride, int nr, float* out);
DotFn tiled_dot(DType type);
}  // namespace scalar

namespace avx2 {
// nullptr when AVX2 has no specialised kernels for the type.
const TypeKernels* type_kernels(DType type);
const VectorKernels& vector_kernels(GgmlOrder order);
// The MatmulOrder::kRepacked kernels (repacked_avx2.cpp): Q4_0's dot and dot_x16, Q4_K's dot, dot_w4 and
// dot_x16, IQ4_NL's dot; nullptr for other types.
const TypeKernels* repacked_type_kernels(DType type);
// Q4_K's kernels in that order (x86_kernels.inc, AVX2 build only), for repacked_type_kernels().
void dot_q4_k_repacked(int64_t k, const void* w, const void* act, size_t stride, int nr, float* out);
void dot_w4_q4_k_repacked(int64_t k, const void* w_rows, size_t row_bytes, const void* act, float* out);
void dot_x16_q4_k_repacked(int64_t k, const void* group, const void* act, float* out);
}  // namespace avx2

namespace avx512 {
const TypeKernels* type_kernels(DType type);
const VectorKernels& vector_kernels(GgmlOrder order);
// The MatmulOrder::kRepacked kernels with a 512-bit form (x86_interleaved.inc): Q4_0's and Q4_K's dot_x16 (their
// other kernels avx2::repacked_type_kernels()'); nullptr for other types.
const TypeKernels* repacked_type_kernels(DType type);
}  // namespace avx512

}  // namespace inferd::kernels
