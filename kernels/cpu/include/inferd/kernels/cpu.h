// inferd/kernels/cpu.h — CPU kernels: dequantization, activation quantization, dot products.
//
// Every kernel exists once as a portable scalar reference and, where it pays, as AVX2 and AVX-512
// (VNNI where present) variants. `type_kernels(type, isa)` returns the table for one weight type and
// one instruction set; `best_isa()` is what this CPU runs. Tests compare every variant with the
// scalar reference (cpu_test.cpp).
//
// Matmul convention (as ggml): a weight matrix W has `rows` rows of `k` elements, stored row-major
// in its own type; activations X have `k` columns. y[t][r] = dot(W[r], X[t]).
// Weights are never converted: a dot product reads the quantized weight row directly and multiplies
// it with an activation row that was quantized once to `act_type` (Q8_0, Q8_1 or Q8_K), exactly
// like ggml's vec_dot_type, which keeps results close to llama.cpp's.
//
// Thread safety: all functions are pure; tables are immutable after first use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "inferd/dtype.h"

namespace inferd::kernels {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* isa_name(Isa isa);

// The best instruction set this CPU supports and this build compiled.
// INFERD_ISA=scalar|avx2|avx512 in the environment caps it (for benchmarks and debugging).
Isa best_isa();
// Whether this CPU can run `isa` (tests iterate over the ones that are).
bool isa_available(Isa isa);

// Maximum number of activation rows one `dot` call handles (the GEMM micro-kernel's width).
constexpr int kMaxDotRows = 4;

struct TypeKernels {
  DType type;       // weight type
  DType act_type;   // the type activations are quantized to for `dot` (kF32 for float weights)
  // Converts `n` elements (a multiple of the block size) of this type to float.
  void (*to_float)(const void* src, float* dst, int64_t n);
  // Quantizes `n` floats (a multiple of act_type's block size) to act_type (a plain copy for kF32).
  void (*quantize_act)(const float* src, void* dst, int64_t n);
  // out[r] = dot(w_row, act_row r) for r < nr (1..kMaxDotRows); k elements; activation rows are
  // `act_stride` bytes apart. Reads each weight block once for all nr rows.
  void (*dot)(int64_t k, const void* w_row, const void* act, size_t act_stride, int nr, float* out);
  // The decode shape: out[r] = dot(weight row r, act) for 4 consecutive weight rows (`w_row_bytes`
  // apart) and one activation row. Four independent accumulation chains instead of one; each row's
  // operations are exactly `dot`'s (nr = 1), so the results are bit-identical. nullptr: use `dot`.
  void (*dot_w4)(int64_t k, const void* w_rows, size_t w_row_bytes, const void* act, float* out) = nullptr;
  // The decode shape on interleaved weights (WeightLayout::kInterleaved16, inferd/weight_layout.h):
  // out[j] = dot(row j of the 16-row group at `group`, act) for j < 16, each bit-identical to `dot` (nr = 1)
  // on that row. nullptr where the type has no interleaved form or this ISA no kernel for it (callers
  // then gather rows with copy_row()).
  void (*dot_x16)(int64_t k, const void* group, const void* act, float* out) = nullptr;
  // dot_x16 over n (1..kMaxX16Groups) consecutive groups `group_bytes` apart: out[16 g + j] is dot_x16's out[j]
  // for group g, the same bits. What the kernel derives from the activation alone (a block's sum, its scale as
  // float) it derives once for all n groups. nullptr: call dot_x16 per group.
  void (*dot_x16_groups)(int64_t k, const void* groups, size_t group_bytes, int n, const void* act,
                         float* out) = nullptr;
};
// The most groups one dot_x16_groups call takes (256 rows).
constexpr int kMaxX16Groups = 16;

// Kernels for weight type `type` on `isa`; nullptr when the type has no kernels.
// If `isa` has no specialised variant for the type, the next lower one is returned.
const TypeKernels* type_kernels(DType type, Isa isa);
inline const TypeKernels* type_kernels(DType type) { return type_kernels(type, best_isa()); }

// ---- Which of llama.cpp's matmul configurations the quantized matmuls follow -------------------
// kRepacked (the default): llama.cpp's x86 default (with AVX2) for the matrices it repacks, Q4_0 and Q4_K matrices
// with a row count that is a multiple of 8 (ggml's q4_0_8x8 and q4_K_8x8 GEMV and GEMM, the same orders on AVX2
// and AVX-512). Q4_0: per 32-element block one exact integer dot n_b = sum_j w_j a_j (the weight's -8 included),
// and acc = fma(float(n_b), d_w * d_a, acc) block after block from acc = 0: no lanes, no final reduction, the
// same result for every batch size. Q4_K: the exact integers n = sum_s sc_s * isum_s and
// m = sum_s mn_s * (bsum_2s + bsum_2s+1), acc = fma(float(n), d_w * d_a, acc), accm = fma(float(m),
// dmin_w * d_a, accm), result acc - accm; per super-block for one activation row (the kernels of
// type_kernels(), llama.cpp's GEMV), per pair of sub-blocks for the first m - m % 4 rows of an m-row GEMM
// (llama.cpp's GEMM; the rest of the batch as its GEMV). Q3_K, Q5_K, Q6_K and IQ4_XS (any row count; llama.cpp's
// tiled K-quant GEMM, the same in its AVX2 and AVX-512 builds): vec_dot's order below kTiledMinRows activation
// rows (gemm.h), from there per super-block the exact totals n = sum_s sc_s * isum_s (and for Q5_K
// m = sum_s mn_s * bsum_s) and y = fma(float(n) * d_w, d_a, y), resp. y = fma(fma(-dmin_w, float(m),
// d_w * float(n)), d_a, y). Q2_K the same (with its min) where the llama.cpp build that the float order follows
// (ggml_order(), below) does not repack it: its AVX2 build, or a row count that is not a multiple of 8. These need a
// third to a half of the vector work of the vec_dot order. IQ4_NL matrices with a multiple of 8 rows: Q4_0's order
// with its non-linear values (llama.cpp's iq4_nl_8x8 shares q4_0_8x8's kernels). Other matrices (Q2_K where the
// AVX-512 build repacks it) keep the vec_dot order.
// kVecDot: every matmul sums as ggml's vec_dot kernels do (llama.cpp run with --no-repack and
// GGML_CPU_TILED_MM=0), the one order CUDA's exact mode reproduces (OpenCL's follows either); the kernels of
// type_kernels().
// INFERD_MATMUL_ORDER=vec_dot|repacked in the environment selects one (worker processes inherit it);
// set_matmul_order() in tests and tools.
enum class MatmulOrder : int { kVecDot = 0, kRepacked = 1 };
const char* matmul_order_name(MatmulOrder order);  // "vec_dot", "repacked"
// Parses a matmul_order_name(); false for anything else.
bool parse_matmul_order(const char* name, MatmulOrder* order);
MatmulOrder matmul_order();
// Sets the process-wide order (tests and tools; call before any computation, not concurrently with it).
void set_matmul_order(MatmulOrder order);
// Sets the order for its lifetime and restores the previous one (tests and tools, as set_matmul_order()).
class ScopedMatmulOrder {
 public:
  explicit ScopedMatmulOrder(MatmulOrder order) : saved_(matmul_order()) { set_matmul_order(order); }
  ~ScopedMatmulOrder() { set_matmul_order(saved_); }
  ScopedMatmulOrder(const ScopedMatmulOrder&) = delete;
  ScopedMatmulOrder& operator=(const ScopedMatmulOrder&) = delete;

 private:
  MatmulOrder saved_;
};
// The order a matrix of `rows` rows of `type` is computed in under `order`: kRepacked only for the
// matrices llama.cpp repacks (above).
MatmulOrder matmul_order_for(DType type, int64_t rows, MatmulOrder order);
inline MatmulOrder matmul_order_for(DType type, int64_t rows) { return matmul_order_for(type, rows, matmul_order()); }
// The kernels that compute a matrix of `type` in `order` (as returned by matmul_order_for()): type_kernels()
// for kVecDot; for kRepacked, Q4_0's, Q4_K's and IQ4_NL's kernels in that order (AVX2 on AVX2 and AVX-512 CPUs;
// Q4_0's and IQ4_NL's dot_w4 nullptr, IQ4_NL's dot_x16 too), the vec_dot kernels of the tiled types (their decode).
const TypeKernels* type_kernels(DType type, Isa isa, MatmulOrder order);

// ---- Half precision and small vector helpers used by attention ---------------------------------
float fp16_to_fp32(fp16_t h);
fp16_t fp32_to_fp16(float f);  // round to nearest even, as F16C
float bf16_to_fp32(uint16_t h);
void fp16_to_fp32_row(const fp16_t* src, float* dst, int64_t n);
void fp32_to_fp16_row(const float* src, fp16_t* dst, int64_t n);

// sum_i x[i] * float(y[i])
float dot_f32_f16(int64_t n, const float* x, const fp16_t* y);
// y[i] += a * float(x[i])
void axpy_f16(int64_t n, float a, const fp16_t* x, float* y);
// sum_i x[i] * y[i]
float dot_f32(int64_t n, const float* x, const float* y);
// Attention's inner loops, one dispatch for many rows (each row exactly as the one-row kernel computes it):
// out[r] = dot_f32_f16(n, x, y + r * stride) * scale, for r < rows;
void dot_f32_f16_rows(int64_t n, const float* x, const fp16_t* y, int64_t stride, int64_t rows, float scale, float* out);
// axpy_f16(n, a[r], x + r * stride, lanes + ((first + r) % L) * lane_stride), for r < rows in order (the L
// chains of attention's KQV; L = ggml_order_lanes()).
void axpy_f16_rows(int64_t n, const float* a, const fp16_t* x, int64_t stride, int64_t rows, int64_t first,
                   float* lanes, int64_t lane_stride);

// The transcendental row operations of llama.cpp's CPU backend (its AVX-512 or AVX2 build: ggml_order()),
// reproduced bit for bit on every ISA (the vector code is elementwise, so a lane of it is a scalar function):
// x * sigmoid(x) as ggml_v_silu. Callers with whole rows should prefer swiglu().
float silu(float x);
// y[i] = silu(g[i]) * u[i] (ggml_vec_swiglu_f32 for rows whose length is a multiple of 16).
void swiglu(int64_t n, const float* g, const float* u, float* y);
// gelu (tanh approximation) as ggml's CPU backend computes it: 0 for x <= -10, x for x >= 10, else
// its F16 table of 0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) at x rounded to F16, widened back.
float gelu(float x);
// The table gelu() and geglu() read: ggml's gelu at each of the 65536 F16 values (indexed by the bits),
// as F16 (for backends that compute GeGLU as the CPU does).
const fp16_t* gelu_table();
// y[i] = gelu(g[i]) * u[i] (ggml_vec_geglu_f32).
void geglu(int64_t n, const float* g, const float* u, float* y);
// y[i] = exp(x[i] - max) for i < n; returns sum_i y[i] in ggml_vec_soft_max_f32's order: each
// 16-element chunk (the last one padded with zeros) reduced as _mm512_reduce_add_ps (the AVX2 order:
// 8-element chunks, reduced as its horizontal sum), the chunk sums accumulated in double.
double exp_sum(int64_t n, const float* x, float max, float* y);
// RoPE's rotation of n pairs (a, b) = (x0[i * stride], x1[i * stride]) by angles with cos[i], sin[i]:
// a' = fma(a, cos, -(b * sin)), b' = fma(a, sin, b * cos) -- the fused forms GCC gives ggml's
// `x0*cos - x1*sin` and `x0*sin + x1*cos` when it builds them with FMA.
void rope_rotate(int64_t n, const float* cos, const float* sin, float* x0, float* x1, int64_t stride);

// ---- Which llama.cpp build the float order follows ------------------------------------------
// llama.cpp's CPU backend sums attention's dot products (tinyBLAS over F16), its softmax and its SiLU with
// vectors as wide as the ISA it was compiled for: 16 lanes and ggml_v_expf's AVX-512 variant when built
// with AVX-512, 8 lanes and the AVX2 variant otherwise. The engine reproduces either order on every ISA
// (the AVX-512 order on an AVX2 CPU too): kAvx512 is the default, everywhere (the GPU backends' exact
// modes reproduce it); INFERD_GGML_ORDER=avx2 in the environment selects the other, for comparisons with a
// llama.cpp built for a CPU without AVX-512. Affects silu, swiglu, exp_sum, dot_f32_f16_rows and
// axpy_f16_rows (and attention's lane count: ggml_order_lanes()).
enum class GgmlOrder : int { kAvx512 = 0, kAvx2 = 1 };
const char* ggml_order_name(GgmlOrder order);
GgmlOrder ggml_order();
// Sets the process-wide order (tests and tools; call before any computation, not concurrently with it).
void set_ggml_order(GgmlOrder order);
// Attention's KQV lanes in the current order: 16 (kAvx512) or 8 (kAvx2).
int ggml_order_lanes();

// The helpers above for one instruction set (the free functions use best_isa()); tests and
// benchmarks compare them across ISAs. dot_f32_f16, axpy_f16 and dot_f32 may differ from the scalar
// ones in float summation order; the fp16 conversions, silu, swiglu, exp_sum, rope_rotate and geglu are
// bit-identical on every ISA.
struct VectorKernels {
  Isa isa;
  void (*fp16_to_fp32_row)(const fp16_t* src, float* dst, int64_t n);
  void (*fp32_to_fp16_row)(const float* src, fp16_t* dst, int64_t n);
  float (*dot_f32_f16)(int64_t n, const float* x, const fp16_t* y);
  void (*axpy_f16)(int64_t n, float a, const fp16_t* x, float* y);
  float (*dot_f32)(int64_t n, const float* x, const float* y);
  float (*silu)(float x);
  void (*swiglu)(int64_t n, const float* g, const float* u, float* y);
  double (*exp_sum)(int64_t n, const float* x, float max, float* y);
  void (*rope_rotate)(int64_t n, const float* cos, const float* sin, float* x0, float* x1, int64_t stride);
  void (*dot_f32_f16_rows)(int64_t n, const float* x, const fp16_t* y, int64_t stride, int64_t rows, float scale,
                           float* out);
  void (*axpy_f16_rows)(int64_t n, const float* a, const fp16_t* x, int64_t stride, int64_t rows, int64_t first,
                        float* lanes, int64_t lane_stride);
  // geglu(): the gate rounded to half (the x86 kernels: 8 at a time with F16C), the table, times up.
  void (*geglu)(int64_t n, const float* g, const float* u, float* y);
};
// The helpers of `isa` in `order` (default: the current ggml_order()), or of the next lower available ISA
// when `isa` is not available.
const VectorKernels& vector_kernels(Isa isa, GgmlOrder order);
inline const VectorKernels& vector_kernels(Isa isa) { return vector_kernels(isa, ggml_order()); }

}  // namespace inferd::kernels
