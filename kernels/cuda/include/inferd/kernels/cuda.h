// inferd/kernels/cuda.h — the CUDA kernels of the CUDA backend (workers/cuda), as host functions that
// enqueue them on a stream.
//
// Every function is asynchronous on `stream` and returns the launch's cudaError_t (a device error of an
// earlier kernel may surface here or at the next synchronization). Pointers are device pointers unless
// named host_. Activations are row-major float matrices (rows x cols, cols contiguous); weights are the
// GGUF's own blocks, read in place by the kernels (no conversion at upload): a matrix of n rows of k
// columns, each row `row_bytes` long.
//
// Matmuls: a GEMV that reads each weight row once for all of a step's tokens, in float, whose result
// for a token does not depend on the other tokens of the step (batch-invariant: decode equals prefill,
// continuous batching and replays after a worker restart reproduce a sequence bit for bit); and a
// tensor-core tile kernel (WMMA, fp16 inputs, fp32 accumulation) that dequantizes weight tiles into
// shared memory, batch-invariant too when every step uses it. A step never mixes the two.
//
// Thread safety: stateless; launches on one stream are ordered.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace inferd::cuda {

// Weight types the kernels read: GGUF's type ids (inferd::DType's values).
enum class WType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};
bool wtype_supported(uint32_t type_id);

struct Matrix {
  WType type = WType::kF32;
  // The rows, one after another; readable up to the next multiple of 16 bytes past the last row's end
  // (the GEMV reads whole 16-byte vectors; a cudaMalloc of the size rounded up to 16 provides it).
  const void* data = nullptr;
  size_t row_bytes = 0;
  int64_t rows = 0;  // n
  int64_t cols = 0;  // k
};

// y[t][r] = dot(x[t], W[r]) (+ bias[r]) (+ residual[t][r]) for t < tokens, r < W.rows.
// x: tokens x W.cols; y, residual: tokens x W.rows (residual may equal y: added in the store).
cudaError_t matmul(const Matrix& w, const float* x, int32_t tokens, const float* bias, const float* residual, float* y,
                   cudaStream_t stream);
// The same with the path chosen (0 or 1: the GEMV, 2: tensor cores, 3: the GEMV reading its rows from global
// memory run by run instead of staging them through shared memory with 16-byte loads: the same bits,
// kept to measure the difference).
cudaError_t matmul_path(int path, const Matrix& w, const float* x, int32_t tokens, const float* bias,
                        const float* residual, float* y, cudaStream_t stream);

// Fused GEMVs for decode steps (float numerics): several matmuls in one launch, each output the same bits
// as matmul() gives it (path 1). They apply (fused_gemv_applies) to steps of at most 8 tokens on a
// 16-byte aligned matrix whose rows are whole blocks without padding and a multiple of 8 values wide (every
// model's matrices), with x 16-byte aligned.
inline constexpr int kMaxFused = 3;
bool fused_gemv_applies(const Matrix& w, const float* x, int32_t tokens);
struct MatmulOut {
  Matrix w;
  const float* bias = nullptr;
  float* y = nullptr;
};
// outs[i].y = x outs[i].w^T (+ bias) for `count` (<= kMaxFused) matrices of one type and width on one
// input (attention's Q, K and V).
cudaError_t matmul_many(const MatmulOut* outs, int count, const float* x, int32_t tokens, cudaStream_t stream);
// y = act(x Wg^T) * (x Wu^T) (SwiGLU: silu; GeGLU: gelu from `gelu_table`, see geglu()), Wg and Wu of one
// type and shape: matmul() twice then swiglu() / geglu(), in one launch.
enum class Glu : uint8_t { kSilu, kGelu };
cudaError_t matmul_glu(Glu act, const Matrix& wg, const Matrix& wu, const float* x, int32_t tokens,
                       const uint16_t* gelu_table, float* y, cudaStream_t stream);

// The GEMV on 8-bit inputs (float numerics with q8 matmul inputs, llama.cpp's MMVQ arithmetic): inputs
// quantized per 32 values as the CPU engine's q8_0 (codes and an fp16-rounded scale) and dotted with the
// weights' codes by dp4a, each 32 values' integer dot scaled once in float. It reads Q4_0, Q4_1, Q8_0 and
// Q4_K matrices whose rows are a multiple of 64 values (of 256 for Q4_K; every model's) with no padding,
// 16-byte aligned (q8_gemv_applies); steps of any size, a token's result independent of the others (decode
// equals prefill bit for bit). Other types keep quantize_activations() and the float GEMV. (Q4_K's inputs
// are quantized per 32 values here, not per 256 as the CPU engine's Q8_K: the integer GEMV is float
// numerics, not the CPU's arithmetic.)
//
// The input of `rows` rows of k values (q8_input_bytes): [rows][k] int8 codes, then per row k / 32 pairs
// (float scale, int32 sum of the block's codes). out: 16-byte aligned.
size_t q8_input_bytes(int32_t rows, int64_t k);
cudaError_t quantize_q8_input(const float* x, int32_t rows, int64_t k, void* out, cudaStream_t stream);
bool q8_gemv_type(WType type);  // a type the integer GEMV reads
bool q8_gemv_applies(const Matrix& w);
// matmul(), matmul_many() and matmul_glu() on quantize_q8_input's output for `tokens` rows (xq's row count:
// the input of a step, not of part of it).
cudaError_t matmul_q8(const Matrix& w, const void* xq, int32_t tokens, const float* bias, const float* residual,
                      float* y, cudaStream_t stream);
cudaError_t matmul_many_q8(const MatmulOut* outs, int count, const void* xq, int32_t tokens, cudaStream_t stream);
cudaError_t matmul_glu_q8(Glu act, const Matrix& wg, const Matrix& wu, const void* xq, int32_t tokens,
                          const uint16_t* gelu_table, float* y, cudaStream_t stream);

// How the CPU engine quantizes a matmul's activations for a weight type (ggml's vec_dot_type): 8-bit
// blocks of 32 with an fp16 scale (Q8_0 / Q8_1, for the 32-value block types), 8-bit blocks of 256
// with a float scale (Q8_K, for the K-quants), or not at all (float weights).
enum class ActQuant : uint8_t { kNone, kQ8, kQ8K };
ActQuant act_quant_for(WType type);
// y = x with every value replaced by its 8-bit quantization, dequantized (q * d), computed as the CPU
// engine computes it (ggml's x86 quantize_row_q8_0 / q8_1: d = fp16(amax / 127), q = round-to-even(x *
// 127 / amax); quantize_row_q8_K_ref: the signed max, -127 / max, q <= 127). The matmuls then read y:
// llama.cpp's CUDA matmuls quantize activations the same way (q8_1), and the logits follow the CPU's.
// x, y: rows x k floats, k a multiple of the block; y may equal x.
cudaError_t quantize_activations(ActQuant kind, const float* x, int32_t rows, int64_t k, float* y,
                                 cudaStream_t stream);

// out[i] = row ids[i] of W, dequantized to floats (the embedding lookup).
cudaError_t get_rows(const Matrix& w, const int32_t* ids, int32_t n, float* out, cudaStream_t stream);
// out[i] = src row rows[i] (floats, cols wide).
cudaError_t gather(const float* src, int64_t cols, const int32_t* rows, int32_t n, float* out, cudaStream_t stream);

cudaError_t rms_norm(const float* x, const float* w, int32_t rows, int64_t cols, float eps, float* y,
                     cudaStream_t stream);
// rms_norm(), and y quantized for the integer GEMV into xq (quantize_q8_input(y, rows, cols, xq)'s bytes) in
// the same launch: the norm before Q/K/V and before gate/up feeds them without a quantizing kernel.
cudaError_t rms_norm_q8(const float* x, const float* w, int32_t rows, int64_t cols, float eps, float* y, void* xq,
                        cudaStream_t stream);
cudaError_t add(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream);
cudaError_t swiglu(const float* gate, const float* up, int64_t n, float* y, cudaStream_t stream);
// y = x * s (gemma3's embedding scale): one rounding, as the CPU's.
cudaError_t scale(const float* x, int64_t n, float s, float* y, cudaStream_t stream);
// y = gelu(gate) * up as kernels::geglu computes it, from `gelu_table` (kernels::gelu_table() on the device:
// 65536 halves): the same bits in both numerics.
cudaError_t geglu(const float* gate, const float* up, int64_t n, const uint16_t* gelu_table, float* y,
                  cudaStream_t stream);

// RoPE of `tokens` rows of n_heads heads of head_dim floats: y = x rotated by the angles in `table`
// ([tokens][head_dim / 2] (cos, sin) pairs, computed on the host as the CPU computes them). neox: rotate
// (i, i + head_dim/2) pairs, else (2i, 2i + 1). y may equal x.
cudaError_t rope(const float* x, int32_t tokens, int32_t n_heads, int32_t head_dim, const float* table, bool neox,
                 float* y, cudaStream_t stream);

// Positions per KV block (graph::kKvBlockTokens; the kernels find a row with shifts and masks).
inline constexpr int32_t kKvBlockTokens = 64;

// A layer's KV cache: halves, a pool of n_blocks blocks of kKvBlockTokens positions,
//   [k|v][block][kv_head][64][head_dim].
// A slot's position p is row p % 64 of block table[slot * blocks_per_slot + p / 64], `table` being the
// step's block tables on the device ([n_slots][blocks_per_slot] int32, graph::StepIO::kv_table); its
// entries for the positions a step writes or reads are in [0, n_blocks). n_ctx (positions per slot)
// sizes attention_exact's scratch.
struct KvLayout {
  int32_t n_blocks = 0, blocks_per_slot = 0, n_ctx = 0, n_head_kv = 0, head_dim = 0;
  size_t half_elems() const {
    return size_t{2} * static_cast<size_t>(n_blocks) * static_cast<size_t>(n_head_kv) * kKvBlockTokens *
           static_cast<size_t>(head_dim);
  }
};
// Writes the K and V rows (tokens x n_head_kv*head_dim floats) at each token's position and slot.
cudaError_t kv_write(const KvLayout& kv, const float* k, const float* v, const int32_t* pos, const int32_t* slot,
                     const int32_t* table, int32_t tokens, uint16_t* cache, cudaStream_t stream);
// Causal attention of each token's n_head query heads over positions [0, pos] of its slot (GQA: query
// head h reads kv head h / (n_head / n_head_kv)), softmax(q k^T * scale) v. Split over the KV length
// within a block with an online softmax (flash-decoding's split-K), the partial results merged in
// shared memory. head_dim: a multiple of 32, at most 256. q_scale > 0 multiplies Q first (gemma3's and
// phi3's attention scale, as llama.cpp applies it; then scale is 1); window > 0: only positions
// (pos - window, pos] are attended to (a sliding window).
cudaError_t attention(const KvLayout& kv, int32_t n_head, const float* q, const int32_t* pos, const int32_t* slot,
                      const int32_t* table, int32_t tokens, float scale, float q_scale, int32_t window,
                      const uint16_t* cache, float* out, cudaStream_t stream);


// The same attention split over the positions (flash-decoding): a token's KV blocks of 64 positions go to
// kAttentionSplits parts in turn (the k-th block of its range to part k % kAttentionSplits), each part a
// thread block that
// loads a group of key and value rows at once, then the parts are merged; a decode step's few tokens
// then occupy n_head * kAttentionSplits thread blocks instead of n_head, and a part's loads are not
// waited on position by position. The parts and sums follow the token's own positions only: a token's
// result does not depend on its step (batch-invariant), though it differs from attention()'s in rounding.
// Scratch: attention_split_scratch_floats(n_head, head_dim, scratch_tokens) floats; longer steps run in
// launches of scratch_tokens tokens.
inline constexpr int32_t kAttentionSplits = 16;
size_t attention_split_scratch_floats(int32_t n_head, int32_t head_dim, int32_t tokens);
cudaError_t attention_split(const KvLayout& kv, int32_t n_head, const float* q, const int32_t* pos, const int32_t* slot,
                            const int32_t* table, int32_t tokens, float scale, float q_scale, int32_t window,
                            const uint16_t* cache, float* scratch, int32_t scratch_tokens, float* out,
                            cudaStream_t stream);

// A read of `bytes` (a multiple of 16, p 16-byte aligned) with 16-byte loads over `blocks` blocks of 512
// threads: the device's read bandwidth, which a decode GEMV is measured against (inferd-cuda-bandwidth).
cudaError_t read_probe(const void* p, size_t bytes, int blocks, uint32_t* sink, cudaStream_t stream);
// One thread busy for `cycles` clock cycles: launches enqueued behind it start back to back, so that a
// timing of short kernels measures the kernels and not the host's launch rate.
cudaError_t spin(long long cycles, cudaStream_t stream);

// ---- Exact numerics (exact.cu) -------------------------------------------------------------------------
// The CPU engine's arithmetic, operation for operation in its x86 kernels' order
// (inferd/kernels/cuda_exact_math.h): a forward pass of these kernels gives the CPU engine's logits bit
// for bit. Matmul inputs are quantized as the CPU quantizes them (Q8_0 / Q8_1 blocks for the 32-element
// block types, Q8_K for the K-quants; float weights read float inputs) and dotted with dp4a; every float
// chain is the CPU's.

// Bytes of the quantized form of `rows` rows of k activations for weights of `type` (0 for float weights).
size_t exact_activation_bytes(WType type, int32_t rows, int64_t k);
// x (rows x k floats) quantized as the CPU engine quantizes it for `kind` (kQ8 or kQ8K) into `out`.
cudaError_t quantize_exact(ActQuant kind, const float* x, int32_t rows, int64_t k, void* out, cudaStream_t stream);
// y[t][r] = dot(act[t], W[r]) as the CPU computes it, + bias[r], or residual[t][r] + it. act: the output of
// quantize_exact for the weight's act_quant_for(), or the float input for float weights.
cudaError_t matmul_exact(const Matrix& w, const void* act, int32_t tokens, const float* bias, const float* residual,
                         float* y, cudaStream_t stream);
// The embedding lookup with the CPU's to_float arithmetic.
cudaError_t get_rows_exact(const Matrix& w, const int32_t* ids, int32_t n, float* out, cudaStream_t stream);
cudaError_t rms_norm_exact(const float* x, const float* w, int32_t rows, int64_t cols, float eps, float* y,
                           cudaStream_t stream);
cudaError_t swiglu_exact(const float* gate, const float* up, int64_t n, float* y, cudaStream_t stream);
// ops::attention_head per (token, head), Q scaled (q_scale > 0) and rounded to half as the CPU's
// q_as_half, the window's masked positions skipped as the CPU skips them. Scratch:
// attention_exact_scratch_floats(kv, n_head, scratch_tokens) floats; longer steps run in launches of
// scratch_tokens tokens. head_dim at most 256.
size_t attention_exact_scratch_floats(const KvLayout& kv, int32_t n_head, int32_t tokens);
cudaError_t attention_exact(const KvLayout& kv, int32_t n_head, const float* q, const int32_t* pos, const int32_t* slot,
                            const int32_t* table, int32_t tokens, float scale, float q_scale, int32_t window,
                            const uint16_t* cache, float* scratch, int32_t scratch_tokens, float* out,
                            cudaStream_t stream);

}  // namespace inferd::cuda
