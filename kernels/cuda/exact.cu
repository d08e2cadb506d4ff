// The CUDA backend's exact kernels (inferd/kernels/cuda.h, "Exact numerics"): the CPU engine's arithmetic
// on the GPU, each thread doing its share of it with the functions of inferd/kernels/cuda_exact_math.h.
// This file is compiled with -fmad=false: no a * b + c is contracted into a fused multiply-add unless
// written as one (fma_), as on the CPU.
//
// Work split (the order of every float operation is the CPU's; only who does it changes):
//  * matmul, 32-element block types: a warp per (weight row, up to kTT tokens). For each chunk of 32
//    blocks, thread j forms block j's integer lane sums (dp4a) for each token and the block's scales
//    into shared memory; then thread 8t + l runs lane l's fma chain of token t over the chunk (and
//    thread 8t, token t's minimum chain). The chains are the only serial part: 8 fmas per block.
//  * matmul, K-quants: the same over 256-element super-blocks (the minimum chains of Q4_K on threads
//    8t + 0..3).
//  * matmul, float weights: a half-warp per (row, token), thread l running lane l of dot_float.
//  * attention: a block per (head, token): one thread per position for q.k, 16-position chunks for the
//    exponentials, thread 0 summing the chunk sums in double, (chain, dimension) pairs for KQV.
//  * RMS norm: a block per row, thread 0 summing the squares in double in order.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "inferd/kernels/cuda.h"
#include "inferd/kernels/cuda_exact_math.h"

namespace inferd::cuda {

namespace {

using namespace exact;

constexpr int kWarps = 4;  // warps per block of the matmul kernels: a row each
constexpr int kTT = 4;     // tokens per warp (prefill); decode steps use 1

int div_up(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }
unsigned grid_1d(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)); }

__global__ void quantize_q8_exact_kernel(const float* x, int64_t k, int32_t rows, Q8Block* out) {
  const int64_t nb = k / 32;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * nb;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    quantize_q8(x + (i / nb) * k + (i % nb) * 32, out + i);
  }
}

__global__ void quantize_q8k_exact_kernel(const float* x, int64_t k, int32_t rows, Q8KBlock* out) {
  const int64_t nb = k / 256;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * nb;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    quantize_q8k(x + (i / nb) * k + (i % nb) * 256, out + i);
  }
}

// Copies `bytes` (a multiple of 16) from `src` to `dst` (both 16-byte aligned) with the warp's 16-byte
// loads: the matmuls stage their weight blocks through shared memory so that a warp's reads are whole
// memory transactions, none depending on another, instead of each thread's byte loads of its own block.
__device__ __forceinline__ void warp_stage(const uint8_t* src, int64_t bytes, uint8_t* dst, int lane) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  for (int64_t i = lane; i < bytes / 16; i += 32) d[i] = __ldg(s + i);
}

// y[t][r] = residual[t][r] + v, or v + bias[r] (+0.0f without one), as the CPU's matmul stores it.
__device__ __forceinline__ void store(float v, int64_t t, int64_t r, int64_t n, const float* bias, const float* residual,
                                      float* y) {
  const size_t at = static_cast<size_t>(t) * n + r;
  y[at] = residual != nullptr ? residual[at] + v : v + (bias != nullptr ? bias[r] : 0.0f);
}

// Staged: the launcher found the rows 16-byte aligned with no padding (see launch_quantized).
template <uint32_t T, int TT, bool Staged>
__global__ void __launch_bounds__(kWarps * 32)
    matmul_blocks_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n, int64_t k,
                         const Q8Block* __restrict__ a, int32_t tokens, const float* bias, const float* residual,
                         float* y) {
  __shared__ float s_dw[kWarps][32], s_mw[kWarps][32];
  __shared__ int s_is[kWarps][TT][32][8];
  __shared__ __align__(16) uint8_t s_w[kWarps][Staged ? 32 * block_bytes(T) : 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= n) return;  // a whole warp: no block-level barrier below
  const int t0 = blockIdx.y * TT;
  const int nt = min(TT, tokens - t0);
  const int64_t nb = k / 32;
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  const Q8Block* at = a + static_cast<size_t>(t0) * nb;
  // Chain thread: token ct, lane cl (threads 8 * TT and up have none).
  const int ct = lane / 8, cl = lane % 8;
  float acc = 0.0f, acc_min = 0.0f;
  for (int64_t c0 = 0; c0 < nb; c0 += 32) {
    const int nc = nb - c0 < 32 ? static_cast<int>(nb - c0) : 32;
    if constexpr (Staged) {
      warp_stage(row + static_cast<size_t>(c0) * block_bytes(T), static_cast<int64_t>(nc) * block_bytes(T),
                 s_w[warp], lane);
      __syncwarp();
    }
    if (lane < nc) {
      const uint8_t* blk = Staged ? s_w[warp] + lane * block_bytes(T)
                                  : row + static_cast<size_t>(c0 + lane) * block_bytes(T);
      s_dw[warp][lane] = block_d<T>(blk);
      if constexpr (has_min(T)) s_mw[warp][lane] = block_m<T>(blk);
      for (int t = 0; t < nt; ++t) block_isums<T>(blk, at[t * nb + c0 + lane], s_is[warp][t][lane]);
    }
    __syncwarp();
    if (ct < nt) {
      const Q8Block* ab = at + ct * nb + c0;
      for (int j = 0; j < nc; ++j) {
        acc = lane_step(acc, s_dw[warp][j] * ab[j].d, s_is[warp][ct][j][cl]);
        if constexpr (has_min(T)) {
          if (cl == 0) acc_min = fma_(s_mw[warp][j], ab[j].s, acc_min);
        }
      }
    }
    __syncwarp();
  }
  RowAcc ra;
  for (int l = 0; l < 8; ++l) ra.lane[l] = __shfl_sync(0xFFFFFFFFu, acc, (lane & ~7) + l);
  ra.m[0] = acc_min;
  if (cl == 0 && ct < nt) store(finish<T>(ra), t0 + ct, r, n, bias, residual, y);
}

// Staged: as matmul_blocks_kernel's, 16 super-blocks at a time (static shared memory is 48 KiB).
constexpr int kKStage = 16;
template <uint32_t T, int TT, bool Staged>
__global__ void __launch_bounds__(kWarps * 32)
    matmul_k_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n, int64_t k,
                    const Q8KBlock* __restrict__ a, int32_t tokens, const float* bias, const float* residual,
                    float* y) {
  __shared__ float s_d[kWarps][32], s_dmin[kWarps][32];
  __shared__ int s_lane[kWarps][TT][32][8];
  __shared__ int s_p[kWarps][TT][32][4];
  __shared__ __align__(16) uint8_t s_w[kWarps][Staged ? kKStage * block_bytes(T) : 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= n) return;
  const int t0 = blockIdx.y * TT;
  const int nt = min(TT, tokens - t0);
  const int64_t nb = k / 256;
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  const Q8KBlock* at = a + static_cast<size_t>(t0) * nb;
  const int ct = lane / 8, cl = lane % 8;
  float acc = 0.0f, acc_m = 0.0f;  // lane cl's chain; Q4_K: min lane cl (< 4); Q5_K: the min chain (cl 0)
  for (int64_t c0 = 0; c0 < nb; c0 += 32) {
    const int nc = nb - c0 < 32 ? static_cast<int>(nb - c0) : 32;
    for (int h = 0; h < nc; h += Staged ? kKStage : 32) {
      const int h_end = Staged ? min(h + kKStage, nc) : nc;
      if constexpr (Staged) {
        __syncwarp();  // the previous half is read
        warp_stage(row + static_cast<size_t>(c0 + h) * block_bytes(T), static_cast<int64_t>(h_end - h) * block_bytes(T),
                   s_w[warp], lane);
        __syncwarp();
      }
      if (lane >= h && lane < h_end) {
        const uint8_t* blk = Staged ? s_w[warp] + (lane - h) * block_bytes(T)
                                    : row + static_cast<size_t>(c0 + lane) * block_bytes(T);
        s_d[warp][lane] = k_d(T, blk);
        if constexpr (T != kQ6_K) s_dmin[warp][lane] = k_dmin(blk);
        for (int t = 0; t < nt; ++t) {
          k_lanes<T>(blk, at[t * nb + c0 + lane], s_lane[warp][t][lane], s_p[warp][t][lane]);
        }
      }
    }
    __syncwarp();
    if (ct < nt) {
      const Q8KBlock* ab = at + ct * nb + c0;
      for (int j = 0; j < nc; ++j) {
        const float da = ab[j].d;
        acc = lane_step(acc, da * s_d[warp][j], s_lane[warp][ct][j][cl]);
        if constexpr (T == kQ4_K) {
          if (cl < 4) acc_m = fma_(-(da * s_dmin[warp][j]), static_cast<float>(s_p[warp][ct][j][cl]), acc_m);
        } else if constexpr (T == kQ5_K) {
          if (cl == 0) acc_m = fma_(-(da * s_dmin[warp][j]), static_cast<float>(s_p[warp][ct][j][0]), acc_m);
        }
      }
    }
    __syncwarp();
  }
  RowAcc ra;
  for (int l = 0; l < 8; ++l) ra.lane[l] = __shfl_sync(0xFFFFFFFFu, acc, (lane & ~7) + l);
  for (int j = 0; j < 4; ++j) ra.m[j] = __shfl_sync(0xFFFFFFFFu, acc_m, (lane & ~7) + j);
  if (cl == 0 && ct < nt) store(finish<T>(ra), t0 + ct, r, n, bias, residual, y);
}

// A half-warp per (row, token): thread l of the half runs lane l of dot_float.
template <uint32_t T>
__global__ void __launch_bounds__(kWarps * 32)
    matmul_float_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n, int64_t k,
                        const float* __restrict__ x, int32_t tokens, const float* bias, const float* residual,
                        float* y) {
  const int half = threadIdx.x / 16, l = threadIdx.x % 16;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + half / 2;
  const int t = blockIdx.y * 2 + half % 2;
  const bool active = r < n && t < tokens;
  const uint8_t* row = w + static_cast<size_t>(active ? r : 0) * row_bytes;
  const float* xt = x + static_cast<size_t>(active ? t : 0) * k;
  const float acc = active ? float_lane<T>(row, xt, k, l) : 0.0f;
  float lanes[16];
  for (int i = 0; i < 16; ++i) lanes[i] = __shfl_sync(0xFFFFFFFFu, acc, (threadIdx.x % 32 & ~15) + i);
  if (active && l == 0) store(float_finish<T>(lanes, row, xt, k), t, r, n, bias, residual, y);
}

template <uint32_t T>
__global__ void get_rows_exact_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t k, const int32_t* ids,
                                      int32_t count, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count * k;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = weight_value<T>(w + static_cast<size_t>(ids[i / k]) * row_bytes, i % k);
  }
}

// ops::rms_norm: float squares summed in double in order, scale = 1 / sqrt(mean + eps), y = (x * scale) * w.
__global__ void rms_norm_exact_kernel(const float* x, const float* w, int64_t cols, float eps, float* y) {
  __shared__ float s_scale;
  const float* xr = x + static_cast<size_t>(blockIdx.x) * cols;
  float* yr = y + static_cast<size_t>(blockIdx.x) * cols;
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int64_t i = 0; i < cols; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(cols));
    s_scale = div_(1.0f, sqrt_(mean + eps));
  }
  __syncthreads();
  const float scale = s_scale;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
}

__global__ void swiglu_exact_kernel(const float* g, const float* u, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = silu(g[i]) * u[i];
  }
}

constexpr int kAttnThreads = 128;

// ops::attention_head for token t0 + blockIdx.y, query head blockIdx.x. scores: this launch's scratch,
// [token][head][n_ctx] floats. The cache is KvLayout's pool of blocks: position p of the token's slot is
// row p & 63 of block blocks[p >> 6].
__global__ void __launch_bounds__(kAttnThreads)
    attention_exact_kernel(KvLayout kv, int32_t n_head, const float* q, const int32_t* pos, const int32_t* slot,
                           const int32_t* table, int32_t t0, float scale, float q_scale, int32_t window,
                           const uint16_t* cache, float* scores, float* out) {
  __shared__ float s_q[256];
  __shared__ float s_red[kAttnThreads];
  __shared__ float s_chains[16 * 256];
  __shared__ float s_inv;
  const int h = blockIdx.x, tl = blockIdx.y, t = t0 + tl, tid = threadIdx.x;
  const int hd = kv.head_dim;
  const int n_kv = pos[t] + 1;  // positions past the token's own are masked
  const int start = window > 0 ? max(0, n_kv - window) : 0;  // and those before a sliding window
  const int g = h / (n_head / kv.n_head_kv);
  static_assert(kKvBlockTokens == 64, "rows are found as p >> 6 and p & 63");
  const int32_t* blocks = table + static_cast<size_t>(slot[t]) * kv.blocks_per_slot;  // the slot's block table
  const size_t stride = static_cast<size_t>(kv.n_head_kv) * kKvBlockTokens * hd;      // block to block
  const uint16_t* kc = cache + static_cast<size_t>(g) * kKvBlockTokens * hd;          // head g's rows in block 0
  const uint16_t* vc = kc + static_cast<size_t>(kv.n_blocks) * stride;                // [k|v]: the V half
  float* sc = scores + (static_cast<size_t>(tl) * n_head + h) * kv.n_ctx;
  // Q meets the F16 K cache as F16, scaled first where the attention scales Q itself (q_as_half).
  for (int d = tid; d < hd; d += kAttnThreads) {
    const float qd = q[(static_cast<size_t>(t) * n_head + h) * hd + d];
    s_q[d] = round_half(q_scale > 0.0f ? __fmul_rn(qd, q_scale) : qd);
  }
  __syncthreads();
  float m = -INFINITY;
  for (int p = start + tid; p < n_kv; p += kAttnThreads) {
    const uint16_t* kr = kc + static_cast<size_t>(blocks[p >> 6]) * stride + static_cast<size_t>(p & 63) * hd;
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = qk_lane(s_q, kr, hd, l);
    const float s = qk_finish(lanes, s_q, kr, hd) * scale;
    sc[p] = s;
    m = fmaxf(m, s);
  }
  s_red[tid] = m;
  __syncthreads();
  for (int off = kAttnThreads / 2; off > 0; off >>= 1) {
    if (tid < off) s_red[tid] = fmaxf(s_red[tid], s_red[tid + off]);
    __syncthreads();
  }
  const float mx = s_red[0];
  __syncthreads();  // every thread has read the maximum before s_red is reused
  // kernels::exp_sum: 16-position chunks (the last padded with zeros), each reduced as
  // _mm512_reduce_add_ps, the chunk sums added in double in chunk order.
  const int n_chunks = (n_kv + 15) / 16;
  double total = 0.0;  // thread 0's
  for (int first = 0; first < n_chunks; first += kAttnThreads) {
    const int c = first + tid;
    float cs = 0.0f;
    if (c < n_chunks) {
      float e[16];
      for (int l = 0; l < 16; ++l) {
        const int p = 16 * c + l;
        const bool in = p >= start && p < n_kv;  // chunks aligned to position 0, as exp_sum's
        e[l] = in ? expf_lane(sc[p] - mx) : 0.0f;
        if (in) sc[p] = e[l];
      }
      cs = reduce16(e);
    }
    s_red[tid] = cs;
    __syncthreads();
    if (tid == 0) {
      const int nn = min(kAttnThreads, n_chunks - first);
      for (int i = 0; i < nn; ++i) total += static_cast<double>(s_red[i]);
    }
    __syncthreads();
  }
  if (tid == 0) s_inv = static_cast<float>(1.0 / total);
  __syncthreads();
  const float inv = s_inv;
  for (int p = start + tid; p < n_kv; p += kAttnThreads) sc[p] = round_half(sc[p] * inv);  // as llama.cpp before KQV
  __syncthreads();
  // KQV: chain i of dimension d sums positions j = i (mod 16) in order (tinyBLAS's 16 lanes), a block of
  // 64 positions (4 of the chain's) at a time; products of two halves are exact.
  for (int c = tid; c < 16 * hd; c += kAttnThreads) {
    const int i = c / hd, d = c % hd;
    float acc = 0.0f;
    for (int b0 = 0; b0 < n_kv; b0 += kKvBlockTokens) {
      const uint16_t* vb = vc + static_cast<size_t>(blocks[b0 >> 6]) * stride + d;
      const int end = min(n_kv - b0, kKvBlockTokens);
      for (int j = i; j < end; j += 16) {
        if (b0 + j >= start) acc = fma_(sc[b0 + j], half_to_float(vb[static_cast<size_t>(j) * hd]), acc);
      }
    }
    s_chains[c] = acc;
  }
  __syncthreads();
  for (int d = tid; d < hd; d += kAttnThreads) {
    float v[16];
    for (int i = 0; i < 16; ++i) v[i] = s_chains[i * hd + d];
    out[(static_cast<size_t>(t) * n_head + h) * hd + d] = reduce16(v);
  }
}

// Whether a matrix's rows can be staged with 16-byte loads: 16-byte aligned, no padding between rows.
bool stageable(const Matrix& w, int64_t block_values, int64_t bytes_per_block) {
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0 &&
         w.row_bytes == static_cast<size_t>(w.cols / block_values * bytes_per_block);
}

// A quantized matmul: matmul_blocks_kernel (32-element blocks) or matmul_k_kernel (K-quants), a token per
// warp for a decode step and kTT otherwise, its blocks staged where the rows allow it.
template <uint32_t T>
cudaError_t launch_quantized(const Matrix& w, const void* a, int32_t tokens, const float* bias, const float* residual,
                             float* y, cudaStream_t stream) {
  const unsigned gx = static_cast<unsigned>(div_up(w.rows, kWarps));
  const auto* w8 = static_cast<const uint8_t*>(w.data);
  const auto launch = [&](auto tt, auto staged) {
    constexpr int TT = decltype(tt)::value;
    constexpr bool kStaged = decltype(staged)::value;
    const dim3 grid(gx, static_cast<unsigned>(div_up(tokens, TT)));
    if constexpr (is_k_quant(T)) {
      matmul_k_kernel<T, TT, kStaged><<<grid, kWarps * 32, 0, stream>>>(
          w8, w.row_bytes, w.rows, w.cols, static_cast<const Q8KBlock*>(a), tokens, bias, residual, y);
    } else {
      matmul_blocks_kernel<T, TT, kStaged><<<grid, kWarps * 32, 0, stream>>>(
          w8, w.row_bytes, w.rows, w.cols, static_cast<const Q8Block*>(a), tokens, bias, residual, y);
    }
  };
  const bool staged = stageable(w, is_k_quant(T) ? 256 : 32, block_bytes(T));
  const auto with_tt = [&](auto tt) { staged ? launch(tt, std::true_type()) : launch(tt, std::false_type()); };
  tokens == 1 ? with_tt(std::integral_constant<int, 1>()) : with_tt(std::integral_constant<int, kTT>());
  return cudaGetLastError();
}

template <uint32_t T>
cudaError_t launch_float(const Matrix& w, const float* x, int32_t tokens, const float* bias, const float* residual,
                         float* y, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(div_up(w.rows, kWarps)), static_cast<unsigned>(div_up(tokens, 2)));
  matmul_float_kernel<T><<<grid, kWarps * 32, 0, stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows,
                                                             w.cols, x, tokens, bias, residual, y);
  return cudaGetLastError();
}

template <uint32_t T>
cudaError_t launch_get_rows(const Matrix& w, const int32_t* ids, int32_t n, float* out, cudaStream_t stream) {
  get_rows_exact_kernel<T><<<grid_1d(static_cast<int64_t>(n) * w.cols), 256, 0, stream>>>(
      static_cast<const uint8_t*>(w.data), w.row_bytes, w.cols, ids, n, out);
  return cudaGetLastError();
}

}  // namespace

size_t exact_activation_bytes(WType type, int32_t rows, int64_t k) {
  switch (act_quant_for(type)) {
    case ActQuant::kQ8: return static_cast<size_t>(rows) * static_cast<size_t>(k / 32) * sizeof(Q8Block);
    case ActQuant::kQ8K: return static_cast<size_t>(rows) * static_cast<size_t>(k / 256) * sizeof(Q8KBlock);
    case ActQuant::kNone: return 0;
  }
  return 0;
}

cudaError_t quantize_exact(ActQuant kind, const float* x, int32_t rows, int64_t k, void* out, cudaStream_t stream) {
  if (kind == ActQuant::kQ8) {
    quantize_q8_exact_kernel<<<grid_1d(rows * (k / 32)), 256, 0, stream>>>(x, k, rows, static_cast<Q8Block*>(out));
  } else if (kind == ActQuant::kQ8K) {
    quantize_q8k_exact_kernel<<<grid_1d(rows * (k / 256)), 256, 0, stream>>>(x, k, rows, static_cast<Q8KBlock*>(out));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t matmul_exact(const Matrix& w, const void* act, int32_t tokens, const float* bias, const float* residual,
                         float* y, cudaStream_t stream) {
  const auto* x = static_cast<const float*>(act);
  switch (w.type) {
    case WType::kF32: return launch_float<kF32>(w, x, tokens, bias, residual, y, stream);
    case WType::kF16: return launch_float<kF16>(w, x, tokens, bias, residual, y, stream);
    case WType::kBF16: return launch_float<kBF16>(w, x, tokens, bias, residual, y, stream);
    case WType::kQ8_0: return launch_quantized<kQ8_0>(w, act, tokens, bias, residual, y, stream);
    case WType::kQ4_0: return launch_quantized<kQ4_0>(w, act, tokens, bias, residual, y, stream);
    case WType::kQ4_1: return launch_quantized<kQ4_1>(w, act, tokens, bias, residual, y, stream);
    case WType::kQ5_0: return launch_quantized<kQ5_0>(w, act, tokens, bias, residual, y, stream);
    case WType::kQ5_1: return launch_quantized<kQ5_1>(w, act, tokens, bias, residual, y, stream);
    case WType::kQ4_K: return launch_quantized<kQ4_K>(w, act, tokens, bias, residual, y, stream);
    case WType::kQ5_K: return launch_quantized<kQ5_K>(w, act, tokens, bias, residual, y, stream);
    case WType::kQ6_K: return launch_quantized<kQ6_K>(w, act, tokens, bias, residual, y, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t get_rows_exact(const Matrix& w, const int32_t* ids, int32_t n, float* out, cudaStream_t stream) {
  switch (w.type) {
    case WType::kF32: return launch_get_rows<kF32>(w, ids, n, out, stream);
    case WType::kF16: return launch_get_rows<kF16>(w, ids, n, out, stream);
    case WType::kBF16: return launch_get_rows<kBF16>(w, ids, n, out, stream);
    case WType::kQ8_0: return launch_get_rows<kQ8_0>(w, ids, n, out, stream);
    case WType::kQ4_0: return launch_get_rows<kQ4_0>(w, ids, n, out, stream);
    case WType::kQ4_1: return launch_get_rows<kQ4_1>(w, ids, n, out, stream);
    case WType::kQ5_0: return launch_get_rows<kQ5_0>(w, ids, n, out, stream);
    case WType::kQ5_1: return launch_get_rows<kQ5_1>(w, ids, n, out, stream);
    case WType::kQ4_K: return launch_get_rows<kQ4_K>(w, ids, n, out, stream);
    case WType::kQ5_K: return launch_get_rows<kQ5_K>(w, ids, n, out, stream);
    case WType::kQ6_K: return launch_get_rows<kQ6_K>(w, ids, n, out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t rms_norm_exact(const float* x, const float* w, int32_t rows, int64_t cols, float eps, float* y,
                           cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  rms_norm_exact_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, w, cols, eps, y);
  return cudaGetLastError();
}

cudaError_t swiglu_exact(const float* gate, const float* up, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  swiglu_exact_kernel<<<grid_1d(n), 256, 0, stream>>>(gate, up, n, y);
  return cudaGetLastError();
}

size_t attention_exact_scratch_floats(const KvLayout& kv, int32_t n_head, int32_t tokens) {
  return static_cast<size_t>(tokens) * static_cast<size_t>(n_head) * static_cast<size_t>(kv.n_ctx);
}

cudaError_t attention_exact(const KvLayout& kv, int32_t n_head, const float* q, const int32_t* pos, const int32_t* slot,
                            const int32_t* table, int32_t tokens, float scale, float q_scale, int32_t window,
                            const uint16_t* cache, float* scratch, int32_t scratch_tokens, float* out,
                            cudaStream_t stream) {
  if (kv.head_dim > 256 || scratch_tokens < 1) return cudaErrorInvalidValue;
  for (int32_t t0 = 0; t0 < tokens; t0 += scratch_tokens) {
    const int32_t nt = std::min(scratch_tokens, tokens - t0);
    attention_exact_kernel<<<dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(nt)), kAttnThreads, 0, stream>>>(
        kv, n_head, q, pos, slot, table, t0, scale, q_scale, window, cache, scratch, out);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace inferd::cuda
