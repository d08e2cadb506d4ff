// matmul.h (private to inferd_backend_cpu) — a weight matrix applied to rows of encoded activations,
// on the GEMV (decode) or GEMM (prefill) path, and the fused gate/up matmul with SwiGLU.
//
// Activations are encoded per weight type (TypeKernels::act_type: F32, Q8_0, Q8_1 or Q8_K); a matmul
// reads the encoding its weights consume (act_index()). Both paths give the same bits as
// TypeKernels::dot for every row and token (ARCHITECTURE.md, "Numerics").
// Thread safety: pure functions; callers split rows between threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "inferd/dtype.h"
#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/model.h"

namespace inferd::cpu {

// Activation encodings a matmul may need, indexed by act_index().
inline constexpr int kActKinds = 4;
int act_index(DType act_type);
extern const DType kActTypes[kActKinds];
// The activation encoding weights of `weight_type` consume.
DType act_type_of(DType weight_type);
// Encodes `k` floats into kind `kind` (F32: a copy).
void encode_row(int kind, const float* src, uint8_t* dst, int64_t k);

// The kernels that compute matrix `w` in the process's matmul order (kernels::matmul_order_for(): llama.cpp's
// vec_dot order, or its repacked order for the matrices it repacks), and its GEMM (nullptr: none).
const kernels::TypeKernels* matmul_kernels(const WeightView& w);
kernels::GemmFn matmul_gemm(const WeightView& w);
// Whether matmul_rows() runs w's batches through a GEMM: its layout's, or for an interleaved matrix without
// one, the row layout's on gathered rows.
bool has_gemm(const WeightView& w);

// One weight matrix applied to encoded activations: out[t * out_stride + r] (+)= dot(W[r], act[t]).
struct MatmulJob {
  const WeightView* w;
  uint8_t* const* act;     // per activation kind
  const size_t* act_row_bytes;
  float* out;
  int64_t out_stride;
  bool accumulate;
  const float* bias;       // optional, added to every output row
  // Optional, with accumulate: out = residual + W act, residual laid out like out (out-of-place residual
  // add; with residual == nullptr or == out the add is in place).
  const float* residual = nullptr;
};


// Output columns [r0, r1) for the m activation rows. max_nr = 1 is the GEMV path (each token streams the
// weight rows on its own); kernels::kMaxDotRows the GEMM path, which blocks rows so that a block of
// weights stays in L1/L2 while all token groups pass it.
void matmul_rows(const MatmulJob& j, int64_t m, int max_nr, int64_t r0, int64_t r1);

// h[t][r] = silu(gate[r] . x[t]) * (up[r] . x[t]) for rows [r0, r1); gelu instead of silu when `geglu`.
void gate_up_rows(const WeightView& wg, const WeightView& wu, uint8_t* const* act, const size_t* act_row_bytes,
                  float* h, int64_t m, int max_nr, int64_t n_ff, int64_t r0, int64_t r1, bool geglu = false);

}  // namespace inferd::cpu
