// inferd/opencl/ops.h — the OpenCL backend's ops, generated per tensor format (issue 5).
//
// Every op is one kernel template (codegen.h) instantiated for the formats (storage and data type)
// of the tensors it is given: the first call with a new combination generates, builds (through the
// Runtime's program caches) and keeps the kernel; later calls only set arguments and enqueue. Ops enqueue and return:
// the Runtime's queue is in order, and download() / Runtime::finish() wait.
//
// Conventions (BHWC, tensor_desc.h): a token is a position x along the width; a row op (rms_norm,
// softmax) reduces over the channels of each (b, x, y); outputs are written in full, padding lanes as
// zeros. Work-group sizes come from the DeviceInfo (reduce_group_size()).
//
// Matmul: y[t][r] = sum_k W[r][k] x[t][k] with x of shape 1x1xTxK and y of shape 1x1xTxR. Weights are
// converted once, at upload, from ggml's row-major blocks into the layout the kernels read: rows in
// slices of 4 (S_O = ceil(R / 4), padded with zero rows), and per (output slice, input slice of 4)
// the 4 x 4 block the kernel dots with one float4 of x (ML Drift's (S_O, S_I, O4, I4) order). Block
// types are indexed by 32-element groups G = K / 32 (a K-quant super-block of 256 is 8 groups, B =
// K / 256 of them):
//   F32   values  float4 [S_O][S_I][4]          the 4 rows' 4 elements
//   F16   values  half4  [S_O][S_I][4]          read with vload_half4 (no cl_khr_fp16 needed)
//   BF16  values  ushort4 [S_O][S_I][4]         the bits; a float is bits << 16
//   Q8_0  quants  char4  [S_O][G][8][4]         scales float4 [S_O][G] (one d per row)
//   Q4_0  quants  ushort4 [S_O][G][8]           component r holds row r's 4 nibbles, element i in
//                                               bits 4i..4i+3; value (q - 8) * d; scales as Q8_0
//   Q4_1  as Q4_0, value q * d + m; mins float4 [S_O][G]
//   Q5_0  quants as Q4_0 (the codes' low nibbles), high_bits ushort [S_O][G][8]: the fifth bit of row
//         r's element i in bit 4r + i; code q = nibble | bit << 4 (0..31), value (q - 16) * d: 5 bits
//         per weight on the device, as in the file
//   Q5_1  as Q5_0, value q * d + m; mins float4 [S_O][G]
//   Q4_K  quants as Q4_0 (nibbles); scales float4 [S_O][B] (d), mins float4 [S_O][B] (dmin),
//         sub_scales char4 [S_O][B][16]: the 8 six-bit scales sc, then the 8 mins mn;
//         value of group s = (d * sc_s) * q - dmin * mn_s
//   Q5_K  as Q4_K, with the codes' (0..31) fifth bits in high_bits as Q5_0's
//   Q6_K  quants as Q4_0 (the low nibbles of the codes 0..63, i.e. of the value + 32), high_bits
//         uint [S_O][G][8]: the two high bits of row r's element i in bits 2 * (4r + i) and up;
//         scales float4 [S_O][B] (d), sub_scales char4 [S_O][B][16]: the int8 scale of each 16
//         elements; value (d * sc) * (q - 32)
//   Q2_K  quants as Q4_0 (the codes 0..3); scales float4 [S_O][B] (d), mins float4 [S_O][B] (dmin),
//         sub_scales char4 [S_O][B][32]: the 16 four-bit scales sc, then the 16 mins mn of the 16-element
//         groups; value (d * sc) * q - dmin * mn
//   Q3_K  quants as Q4_0 (the codes value + 4, 0..7); scales float4 [S_O][B] (d), sub_scales char4
//         [S_O][B][16]: the signed scale sc - 32 of each 16 elements; value (d * sc) * (q - 4)
//   IQ4_NL  quants as Q4_0 (the 4-bit codes); scales as Q8_0; value d * kvalues[q] (weights.cl's table)
//   IQ4_XS  quants as Q4_0; scales float4 [S_O][B] (d), sub_scales char4 [S_O][B][16]: the signed scales
//         ls - 32 of the 8 sub-blocks of 32 (entries 8..15 unused); value (d * ls) * kvalues[q]
// Every code of Q5_0..Q6_K keeps its bits, as in the file: 5.75 bits per weight for Q5_K and 6.6 for Q6_K
// with their scales (the file: 5.5 and 6.6). The 2- and 3-bit codes take a nibble each: 5.25 bits per
// weight for Q2_K (the file: 2.625) and 4.625 for Q3_K (3.4375).
// Two kernels per type, chosen by stage: decode (float: one work-group per output slice, its lanes
// splitting K; exact: a work-item per output slice and token) and prefill (each work-item computes
// one output slice for 4 tokens, reading each weight block once for all of them).
//
// Two numerics (ClEngine's Numerics):
//  * Exact: the CPU engine's float operations in its order, so that a forward pass made of these ops
//    gives the CPU engine's logits bit for bit (on a device with IEEE fp32, a true fma and cl_khr_fp64;
//    PoCL on x86 has all three). Activations are quantized to Q8_0 / Q8_1 blocks (quantize_q8) or,
//    for K-quant weights, Q8_K blocks (quantize_q8_k) byte for byte as kernels/cpu/scalar.cpp does,
//    and matmul_exact() sums what the CPU's integer dot kernels sum: per row 8 float lanes, lane i
//    accumulating block by block, with one fma per block and the block's combined scale d_w * d_a,
//    the integer sum of elements 4i..4i+3 (exact), then ggml's horizontal sum, and the min / offset
//    terms in their own chains (CpuOrder; each type's steps are written in kernels/opencl/matmul_exact.cl;
//    IQ4_NL's one-token pass pairs its blocks into two chains, as ggml's vec_dot, and passes of more
//    tokens keep one, as the CPU engine's GEMM). rms_norm_exact, swiglu_halves_exact and
//    attention_exact follow the CPU engine's row ops (workers/cpu/ops.cpp) likewise, with
//    ggml's expf polynomial instead of the device's exp and divisions and square roots correctly
//    rounded through double. Every program is built with FP_CONTRACT OFF (codegen.h), so a * b + c
//    is two roundings unless the kernel writes fma().
//  * Float: activations are not quantized (float, or half-precision tensors computed in float) and
//    the kernels sum in whatever order is fastest (matmul(), rms_norm(), attention(), ...): within
//    float summation order (and half rounding) of exact arithmetic, not of the CPU engine (whose
//    8-bit activations move logits by tenths). The exact ops refuse half tensors.
//
// Thread safety: an Ops object and its Runtime are used by one thread at a time.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <span>
#include <array>
#include <string>
#include <vector>

#include "inferd/dtype.h"
#include "inferd/graph.h"
#include "inferd/opencl/cl_runtime.h"
#include "inferd/opencl/codegen.h"
#include "inferd/opencl/tensor_desc.h"
#include "inferd/rope_table.h"
#include "inferd/status.h"

namespace inferd::opencl {

class MatmulWeights;

// One argument as KernelArgs set it, kept for a recorded launch (Ops::begin_record).
struct RecordedArg {
  static constexpr size_t kMaxBytes = 16;
  cl_uint index = 0;
  size_t size = 0;
  bool local = false;  // a __local pointer of `size` bytes (no value)
  std::array<unsigned char, kMaxBytes> bytes{};
};

// Binds a generated kernel's arguments in order; the first error is kept and reported by status().
// With a `log`, each argument is also appended there (Ops keeps it for a recorded launch).
class KernelArgs {
 public:
  explicit KernelArgs(cl_kernel kernel, std::vector<RecordedArg>* log = nullptr) : kernel_(kernel), log_(log) {}

  KernelArgs& tensor(const Tensor& t);  // args_per_tensor(t.format()) arguments: its objects and extents
  KernelArgs& buffer(cl_mem mem);        // may be nullptr (an unused __global pointer)
  KernelArgs& local(size_t bytes);       // a __local pointer of `bytes` bytes
  KernelArgs& weights(const MatmulWeights& w);  // its 5 buffers: values, scales, mins, sub_scales, high_bits
  template <typename T>
  KernelArgs& value(const T& v) {
    set(sizeof(T), &v);
    return *this;
  }
  const Status& status() const { return status_; }

 private:
  void set(size_t size, const void* value);

  cl_kernel kernel_;
  std::vector<RecordedArg>* log_;
  cl_uint next_ = 0;
  Status status_;
};

// Weights of one matmul in the kernels' layout (see above). Move-only; owns its device memory.
class MatmulWeights {
 public:
  // Whether upload() converts `type`.
  static bool supports(DType type);
  // Converts `rows` x `k` weights of `type` in ggml's row-major layout (rows of dtype_row_bytes(type, k)
  // bytes) and uploads them. kUnimplemented for other types; kInvalidArgument when k is not a multiple
  // of the type's block size or a dimension is not positive.
  static Result<MatmulWeights> upload(Runtime& rt, DType type, int64_t rows, int64_t k, const void* data);

  DType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t k() const { return k_; }
  int32_t out_slices() const { return static_cast<int32_t>((rows_ + 3) / 4); }
  int32_t in_slices() const { return static_cast<int32_t>((k_ + 3) / 4); }
  size_t device_bytes() const { return device_bytes_; }
  cl_mem values() const { return values_.get(); }
  cl_mem scales() const { return scales_.get(); }  // nullptr for F32 / F16 / BF16
  cl_mem mins() const { return mins_.get(); }      // Q4_1, Q5_1, Q4_K, Q5_K; else nullptr
  cl_mem sub_scales() const { return sub_scales_.get(); }  // K-quants; else nullptr
  cl_mem high_bits() const { return high_bits_.get(); }    // Q5_0, Q5_1, Q5_K, Q6_K; else nullptr
  // The row count kernels::matmul_order_for() decides the exact matmul's order by: the matrix's own, or for
  // matrices stacked into one (each of the same order) the first one's.
  int64_t order_rows() const { return order_rows_ > 0 ? order_rows_ : rows_; }
  void set_order_rows(int64_t rows) { order_rows_ = rows; }

 private:
  MatmulWeights() = default;

  DType type_ = DType::kF32;
  int64_t rows_ = 0, k_ = 0, order_rows_ = 0;
  size_t device_bytes_ = 0;
  ClMem values_, scales_, mins_, sub_scales_, high_bits_;
};

// How matmul_exact() wants a matmul's input for weights of a type: the float activations (F32, F16,
// BF16), quantize_q8()'s Q8 blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) or quantize_q8_k()'s Q8_K blocks
// (Q4_K, Q5_K, Q6_K), as the CPU engine's TypeKernels::act_type says.
enum class MatmulActivations { kFloat, kQ8, kQ8K };
MatmulActivations matmul_activations(DType type);
// Floats per Q8_K block in quantize_q8_k()'s `blocks`: d, then the 16 sums of 16 quants.
inline constexpr int kQ8KBlockFloats = 17;

// The float decode matmul's work-group shape: `slices` output slices (4 weight rows each) per work-group,
// which read each input slice once for all of them, and `ahead` input slices that a lane loads before it
// accumulates them (loads in flight at once). Every shape sums each output in the same order, so gives the
// same bits; which is fastest depends on the device (a GPU's memory wants many loads in flight, a CPU
// device few), so OpenClBackend measures it (cl_backend.h). Written "RxU" ("4x1").
struct DecodeShape {
  int slices = 1;
  int ahead = 1;
  bool operator==(const DecodeShape&) const = default;
  std::string to_string() const;
};
inline constexpr int kMaxDecodeSlices = 8, kMaxDecodeAhead = 8;
inline constexpr int kMaxPrefillTokens = 16, kMaxExactPrefillTokens = 8;

// The float prefill matmul's kernel (Ops::prefill_kernel).
enum class PrefillKernel { kSimple, kTiled };
const char* prefill_kernel_name(PrefillKernel kernel);  // "simple", "tiled"

// "RxU" with R in [1, kMaxDecodeSlices] and U in [1, kMaxDecodeAhead]; kInvalidArgument otherwise.
Result<DecodeShape> parse_decode_shape(std::string_view text);
// The shapes a measurement times: 1x1, 4x1, 8x1, 1x4 (on PoCL 2x2 lost everywhere; BENCHMARKS.md).
std::vector<DecodeShape> decode_shape_candidates();
// The shape used where none is measured or set: 4x1 on CPU devices (measured on PoCL), 1x1 elsewhere.
DecodeShape default_decode_shape(const DeviceInfo& device);

// An RMSNorm folded into the decode matmul that reads its output (Ops::matmul, matmul_swiglu).
struct DecodeNorm {
  const Tensor* weight = nullptr;  // 1x1x1xC
  float eps = 0.0f;
};

// A kernel's device time over the launches a profile saw (Ops::take_profile).
struct KernelTime {
  std::string kernel;  // the kernel's key: its op, variant and storages
  int64_t launches = 0;
  double ms = 0.0;  // CL_PROFILING_COMMAND_START to _END, summed
};
// What a profile saw (Ops::take_profile): the kernels, the longest first, and how the launches reached the
// device. All times from the device's profiling clock.
struct Profile {
  std::vector<KernelTime> kernels;
  int64_t launches = 0;
  double device_ms = 0.0;         // the kernels' times summed
  double gap_ms = 0.0;            // the device idle between one kernel's end and the next one's start, summed
  double enqueue_median_us = 0.0;  // median time between two launches' CL_PROFILING_COMMAND_QUEUED: the host's
                                   // cost of a launch where the host enqueues back to back
};

enum class MatmulVariant { kAuto, kDecode, kPrefill };
const char* matmul_variant_name(MatmulVariant variant);
// kAuto's choice for T tokens: decode below 4 tokens (where the prefill kernel's tile of 4 tokens
// would be mostly empty), prefill from 4 on.
MatmulVariant choose_matmul_variant(int32_t tokens);

// The summation order of the CPU engine's dot products that the exact ops reproduce.
//  kX86     its AVX2 and AVX-512 kernels, which compute the same bits: block types as described
//           above (ggml's AVX2 vec_dot); F32/F16/BF16 weights in two accumulators of 8 lanes over
//           steps of 16 elements, an 8-element step into the first, ggml's horizontal sum of their
//           lane sums, then the last k % 8 products one by one with fma; attention's q.k likewise.
//           (One exception: GCC vectorizes the AVX2 build's tail for F32 weights, whose last k % 8 >= 4
//           products then round as a multiply and an add; no model has such a width.)
//  kScalar  its portable kernels (INFERD_ISA=scalar): every dot product one sequential chain (block
//           types: sum += (d_w * d_a) * isum (+ m_w * s_a) per block, K-quants per super-block
//           sum += d_a * (d * isum - dmin * msum) or (d * d_a) * isum; float types: sum += w * x).
//           The scalar build's GEMM (Q4_0, Q4_1, Q8_0 in passes of 2+ tokens) keeps the kX86 order
//           (kernels/cpu/gemm.h); every other type runs the scalar dot in every pass.
enum class CpuOrder { kX86, kScalar };
const char* cpu_order_name(CpuOrder order);
// The order of the CPU engine in this process: kScalar when kernels::best_isa() is the scalar one.
CpuOrder host_cpu_order();
// The order the CPU engine uses for a matmul with weights of `type` in a pass of `tokens` tokens.
CpuOrder matmul_order(CpuOrder cpu, DType type, int32_t tokens);

// How matmul_exact() forms the integer dot products of 4 weights and 4 activations for the
// 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1):
//  kFloat  OpenCL C's dot() of float4s that hold the integers (exact: every partial sum is an integer
//          below 2^24); any device.
//  kInt8   cl_khr_integer_dot_product's dot(char4, char4) -> int on the int8 values, the packed
//          integer dot units of the GPUs that have them. On a device without the extension the kernel
//          defines the same function in plain int arithmetic, so the variant runs (and is tested) on
//          PoCL too.
// Both give the same integers, hence the same bits; only the speed differs.
enum class IntDot { kFloat, kInt8 };
const char* int_dot_name(IntDot mode);
// kInt8 where the device reports cl_khr_integer_dot_product with 4x8-bit inputs, else kFloat.
IntDot choose_int_dot(const DeviceInfo& info);

enum class RopeMode { kNormal, kNeox };  // llama: adjacent pairs; NeoX (qwen2): halves

// The rotary angles of a step's positions come from inferd/rope_table.h (shared with the CUDA backend).

// The attention of one model, and its KV cache. The cache of one layer is one buffer of IEEE halves
// (llama.cpp's default F16 cache): a pool of n_blocks blocks of graph::kKvBlockTokens (64) positions,
//   [block][k|v][kv_head][64][head_dim]
// A slot's position p lives in block kv_table[slot * blocks_per_slot() + p / 64] at row p % 64
// (TokenPlacement::kv_table, graph.h), so slots may share the blocks of a common prefix.
// rope_kv() writes a pass's new K/V rows in place at their (slot, position); attention() reads them.
struct AttentionGeometry {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  int32_t n_slots = 0, n_ctx = 0;  // the slots and positions per slot the block tables cover
  int32_t n_blocks = 0;            // the cache's blocks
  float rope_base = 10000.0f;
  RopeMode rope_mode = RopeMode::kNormal;

  int32_t n_embd() const { return n_head * head_dim; }
  int32_t n_embd_kv() const { return n_head_kv * head_dim; }
  int32_t blocks_per_slot() const { return graph::kv_blocks_per_slot(n_ctx); }
  // Halves from one block to the next: K and V of every kv head for 64 positions.
  size_t block_halves() const {
    return size_t{2} * static_cast<size_t>(graph::kKvBlockTokens) * static_cast<size_t>(n_embd_kv());
  }
  size_t layer_cache_bytes() const { return static_cast<size_t>(n_blocks) * block_halves() * 2; }
  // kUnimplemented for head sizes the kernels do not handle (head_dim a multiple of 4, of 8 for NeoX,
  // at most 256; n_head a multiple of n_head_kv), kInvalidArgument for non-positive extents.
  Status check() const;
};

// Where the tokens of a pass go: int32 buffers of at least T entries (T the pass's tokens), each
// position in [0, n_ctx) and each slot in [0, n_slots); the rope_table() of their positions
// (T * head_dim floats); and the block tables, n_slots * blocks_per_slot() int32 (graph::StepIO::kv_table),
// whose entries for every position a token writes or reads are in [0, n_blocks). The kernels trust
// them: the engine validates every batch on the host first.
struct TokenPlacement {
  cl_mem positions = nullptr;
  cl_mem slots = nullptr;
  cl_mem rope = nullptr;
  cl_mem kv_table = nullptr;
};

// One projection inside a tensor: channels [4 * first_slice, 4 * first_slice + width) of a 1x1xTxC
// tensor, so that Q, K and V may come from one fused matmul (one tensor, three offsets) or three.
struct TensorSlice {
  const Tensor* tensor = nullptr;
  int32_t first_slice = 0;
};

class Ops {
 public:
  explicit Ops(Runtime& rt);  // `rt` outlives this object
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  // dst = a + b, dst = a * b, dst = silu(gate) * up: all tensors of one shape.
  Status add(const Tensor& a, const Tensor& b, Tensor& dst);
  Status mul(const Tensor& a, const Tensor& b, Tensor& dst);
  Status swiglu(const Tensor& gate, const Tensor& up, Tensor& dst);
  // dst = x / sqrt(mean_c(x^2) + eps) * weight over each group of G channels, weight having shape
  // 1x1x1xG: the whole row (G = C), or each head of it (the Q/K norms: G = head_dim, a multiple of 4
  // dividing C; kUnimplemented for other groups).
  Status rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& dst);
  // Rotary embedding of x = 1 x heads x tokens x head_dim (positions: an int32 buffer of >= tokens
  // entries), angles pos * base^(-2i/head_dim) formed by ggml's recurrence. kNormal needs an even
  // head_dim, kNeox a multiple of 8 (a slice never straddles the halves); kUnimplemented otherwise.
  Status rope(const Tensor& x, cl_mem positions, float base, RopeMode mode, Tensor& dst);
  // dst = softmax over c of (x * scale + mask); mask is B' x H' x W x C with B' and H' either 1
  // (broadcast) or equal to x's. A row masked entirely (-inf) becomes zeros.
  Status softmax(const Tensor& x, const Tensor& mask, float scale, Tensor& dst);
  // y = W x (see the header comment); x is 1x1xTxK, y 1x1xTxR. With a `residual` (y's shape, another
  // tensor) y = residual + W x in one kernel (the graph's matmul_add: one launch fewer per use).
  // With a `norm` (a decode matmul, float numerics) x is read as rms_norm(x, norm.weight, norm.eps) writes it
  // (the whole row, G = C), without the norm's launch and tensor: each work-group sums the row's squares
  // itself (other float sums than rms_norm's kernel).
  Status matmul(const MatmulWeights& w, const Tensor& x, Tensor& y, MatmulVariant variant = MatmulVariant::kAuto,
                const Tensor* residual = nullptr, const DecodeNorm* norm = nullptr);

  // dst = silu(W_gate x) * (W_up x) for a decode step (fewer than 4 tokens), W the stacked gate|up matrix
  // (2F rows) and dst 1x1xTxF, in one launch: the bits of matmul() (kDecode) then swiglu_halves(), without
  // the gate|up tensor. kOutOfRange where the device cannot give the decode kernel's lanes to this one
  // (the caller runs the two instead).
  Status matmul_swiglu(const MatmulWeights& w, const Tensor& x, Tensor& dst, const DecodeNorm* norm = nullptr);
  // The stacked Q|K|V matmul of a decode step (float numerics, W of n_embd + 2 * n_embd_kv rows) with
  // rope_kv() in its store: Q rotated (and scaled by q_scale) to `q_out` as halves, K rotated and V into
  // the cache rows of the tokens' slots and positions, each output plus its `bias` first — rope_kv's bits
  // from matmul()'s sums, without the Q|K|V tensor and rope_kv's launch. Normal RoPE only (a NeoX pair
  // spans two work-groups: kUnimplemented); `norm` as for matmul().
  Status matmul_rope_kv(const MatmulWeights& w, const Tensor& x, const DecodeNorm* norm, const AttentionGeometry& g,
                        cl_mem bias, const TokenPlacement& tokens, cl_mem q_out, cl_mem cache, float q_scale = 0.0f);

  // ---- The forward pass's own ops (ClEngine) ----
  //
  // dst[t] = row rows[t] of the weights, dequantized as the CPU engine's to_float does (q * d, then
  // + m: two roundings), times `scale` where that is not 0 (gemma3's embeddings): the embedding lookup,
  // reading the same converted weights as the tied output projection. dst is 1x1xTxK with K = w.k();
  // `rows` an int32 buffer of >= T row indices in [0, w.rows()) (validated by the caller).
  Status get_rows(const MatmulWeights& w, cl_mem rows, Tensor& dst, float scale = 0.0f);
  // dst[o] = src[rows[o]] for the N tokens of dst (1x1xNxC, src 1x1xTxC, rows in [0, T)): the tokens
  // whose logits are wanted.
  Status gather(const Tensor& src, cl_mem rows, Tensor& dst);
  // dst = silu(gate_up[..., :C]) * gate_up[..., C:], C = dst's channels (a multiple of 4): SwiGLU
  // after one matmul of the concatenated gate and up weights.
  Status swiglu_halves(const Tensor& gate_up, Tensor& dst);
  // dst = gelu(gate) * up and its form over the halves of one gate|up tensor, as the CPU engine's
  // kernels::geglu computes it (ggml's F16 gelu table, uploaded once): the same bits in both numerics.
  Status geglu(const Tensor& gate, const Tensor& up, Tensor& dst);
  Status geglu_halves(const Tensor& gate_up, Tensor& dst);
  // RoPE of the pass's Q and K (positions of `tokens`, rotated by tokens.rope), adding the optional
  // `bias` (Q|K|V, n_embd + 2 * n_embd_kv floats: qwen2) first. Q goes to `q_out` as halves,
  // [T][n_head][head_dim] (rounded as llama.cpp and the CPU engine round attention operands); K and V
  // rows go into the layer's `cache` at their slot and position. T is q's width; q, k and v hold
  // n_embd, n_embd_kv and n_embd_kv channels from their first slices. Exact: the rotation is the CPU
  // engine's (kernels::rope_rotate's fused multiply-adds), every rounding to half to nearest even.
  // q_scale > 0 multiplies rotated Q before its rounding to half (gemma3's and phi3's attention scale,
  // applied to Q as llama.cpp's graphs apply it); the angles are whatever tokens.rope holds (rope_table:
  // the layer's base, frequency scale and factors).
  Status rope_kv(const AttentionGeometry& g, TensorSlice q, TensorSlice k, TensorSlice v, cl_mem bias,
                 const TokenPlacement& tokens, cl_mem q_out, cl_mem cache, float q_scale = 0.0f);
  // Causal attention of T tokens (out: 1x1xTxn_embd) over their slots' cache rows: the KV length is
  // padded to `kv_pad` (a multiple of the engine's pad step, >= every token's position + 1) and the
  // positions past a token's own are masked. One work-group per (token, head), its lanes splitting the
  // positions in an online softmax; without partials the launch shape does not depend on the KV length.
  // Probabilities stay float (llama.cpp rounds them to half; see the kernel).
  // window > 0: a sliding window, only the last `window` positions (the token's own included) attended to.
  // partials (attention_partials_bytes): with attention_chunk() > 0, a pass of at most
  // kMaxSplitAttentionTokens tokens whose kv_pad exceeds a chunk runs split over the positions: a
  // work-group per (head, token, chunk of positions), then one per (head, token) merges the chunks'
  // states (two launches, other float sums than one group's; the shapes depend on kv_pad's bucket).
  Status attention(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad, float scale,
                   cl_mem cache, Tensor& out, int32_t window = 0, cl_mem partials = nullptr);
  // Positions per chunk of the split attention; 0 never splits. Default: 64 on GPUs and accelerators, 0
  // on CPU devices. At most kMaxAttentionChunks chunks: a longer KV takes longer chunks.
  int32_t attention_chunk() const { return attention_chunk_; }
  void set_attention_chunk(int32_t positions);
  static constexpr int32_t kMaxAttentionChunks = 32, kMaxSplitAttentionTokens = 8;
  static size_t attention_partials_bytes(const AttentionGeometry& g);

  // ---- Exact ops: the CPU engine's arithmetic (see the header comment) ----
  //
  // Whether the device can run them: cl_khr_fp64 (double sums and correctly rounded divisions).
  bool exact_supported() const;
  // dst = ops::rms_norm of each row: the squares summed in double in channel order, then
  // scale = 1 / sqrt(float(sum / C) + eps), dst = (x * scale) * weight.
  Status rms_norm_exact(const Tensor& x, const Tensor& weight, float eps, Tensor& dst);
  // swiglu() and swiglu_halves() with kernels::silu: x / (1 + ggml_expf(0 - x)), then times up.
  Status swiglu_exact(const Tensor& gate, const Tensor& up, Tensor& dst);
  Status swiglu_halves_exact(const Tensor& gate_up, Tensor& dst);
  // The activations of a matmul with block weights quantized as the CPU engine quantizes them
  // (kernels/cpu/scalar.cpp quantize_q8_0 / quantize_q8_1, byte for byte; Q8_0's blocks are Q8_1's
  // without s): per token and block of 32 channels, amax, id = 127 / amax, q = rint(x * id) into
  // `quants` (the integers as floats, same shape as x), and (d, s) = (half(amax / 127),
  // half(amax / 127 * sum(q))) as float pairs into `scales` [T][K / 32]. x is 1x1xTxK, K a multiple
  // of 32; `scales` holds >= T * K / 16 floats.
  Status quantize_q8(const Tensor& x, Tensor& quants, cl_mem scales);
  // The activations of a matmul with K-quant weights as kernels/cpu/scalar.cpp's quantize_q8_k (ggml's
  // quantize_row_q8_K_ref), byte for byte: per token and block of 256 channels, the first element of
  // largest magnitude `max` (with its sign), iscale = -127 / max, q = min(rint(x * iscale), 127) into
  // `quants` (as floats, same shape as x), and into `blocks` [T][K / 256][kQ8KBlockFloats] the block's
  // d = 1 / iscale and its 16 sums of 16 quants; a block of zeros is all zeros. K is a multiple of 256.
  Status quantize_q8_k(const Tensor& x, Tensor& quants, cl_mem blocks);
  // y = W x as the CPU engine's dot kernels compute it in `order`. Block types read the quantized
  // input matmul_activations() names (x = its quants, `scales` = quantize_q8()'s scales or
  // quantize_q8_k()'s blocks); float types read the float input (x, `scales` unused). The variant only
  // picks how many tokens a work-item computes: the result is the same for every variant and batch.
  // The block types' integer dots are formed as int_dot() says.
  // With a `residual` (y's shape, another tensor) y = residual + W x, the sum rounded to float before the
  // add as the CPU engine's matmul_add computes it: the bits of matmul_exact() then add().
  Status matmul_exact(const MatmulWeights& w, const Tensor& x, cl_mem scales, Tensor& y, CpuOrder order,
                      MatmulVariant variant = MatmulVariant::kAuto, const Tensor* residual = nullptr);
  // choose_int_dot(device) unless set; set_int_dot(kInt8) forces the variant on any device.
  IntDot int_dot() const { return int_dot_; }
  void set_int_dot(IntDot mode) { int_dot_ = mode; }
  // Tokens per work-item of the prefill matmuls, float and exact (each weight slice dequantized once for
  // them); the same bits for every value. Defaults: float 16 on CPU devices, 4 elsewhere; exact 4.
  int prefill_tokens() const { return prefill_tokens_; }
  void set_prefill_tokens(int tokens);  // 1 to kMaxPrefillTokens
  int exact_prefill_tokens() const { return exact_prefill_tokens_; }
  void set_exact_prefill_tokens(int tokens);  // 1 to kMaxExactPrefillTokens
  // Which float prefill kernel runs: prefill_tokens() tokens per work-item, or tiles of 64 rows x 64 tokens
  // staged in local memory (where the device admits 16 x 16 work-items and 16 KiB); the same order of sums.
  // Default: kSimple (on an NVIDIA H200 the tiled kernel was the slower one).
  PrefillKernel prefill_kernel() const { return prefill_kernel_; }
  void set_prefill_kernel(PrefillKernel kernel) { prefill_kernel_ = kernel; }
  // Kernels enqueued so far (each one launch: what a step costs the host and, on a GPU, in launch gaps).
  int64_t launches() const { return launches_; }
  // Profiling (a Runtime made with RuntimeOptions::profiling): while on, each launch keeps its event;
  // take_profile() waits for them and returns the device time per kernel, the longest first, and forgets
  // them. kUnimplemented where the queue does not profile.
  void set_profiling(bool on);
  Result<Profile> take_profile();

  // A step's launches as recorded (begin_record): each a kernel object of its own with the launch's
  // arguments bound, its work sizes and its key. Move-only; owns its kernel objects.
  class Recording {
   public:
    size_t launches() const { return launches_.size(); }

   private:
    friend class Ops;
    struct Launch {
      ClKernel kernel;
      cl_uint dims = 0;
      std::array<size_t, 3> global{}, local{};
      bool has_local = false;
      const std::string* key = nullptr;
    };
    std::vector<Launch> launches_;
  };
  // Recording (OpenClBackend replays its decode steps; a launch's host cost is then one enqueue): between
  // begin_record() and end_record() each launch runs from a kernel object of its own, made from the same
  // program with the launch's arguments bound, and is kept. replay() enqueues those launches again as
  // they were: the caller guarantees that every argument is the same (the same buffers, shapes and
  // values; what changes from step to step lives in the buffers). end_record() fails where a launch could
  // not be recorded (its recording is then incomplete and must not be replayed).
  void begin_record();
  Result<Recording> end_record();
  Status replay(const Recording& recording);
  // The float decode matmul's work-group shape (DecodeShape); default_decode_shape(device) unless set.
  DecodeShape decode_shape() const { return decode_shape_; }
  void set_decode_shape(DecodeShape shape);
  // attention() as ops::attention_head computes it: q.k as kernels::dot_f32_f16 in `order`, times
  // scale; softmax with ggml's expf, the exponentials summed in 16-position chunks in
  // _mm512_reduce_add_ps's order and the chunk sums in double (kernels::exp_sum); probabilities
  // rounded to half; out[d] as 16 chains of positions j = i (mod 16), reduced as
  // _mm512_reduce_add_ps. `scratch` holds the scores of a launch's (token, head) pairs: at least
  // attention_scratch_bytes(g, 1, kv_pad) bytes; a pass whose tokens do not fit runs in several launches.
  // window as attention()'s; the masked positions are skipped as ops::attention_head skips them.
  Status attention_exact(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad,
                         float scale, cl_mem cache, cl_mem scratch, CpuOrder order, Tensor& out, int32_t window = 0);
  static size_t attention_scratch_bytes(const AttentionGeometry& g, int32_t tokens, int32_t kv_pad) {
    return static_cast<size_t>(tokens) * static_cast<size_t>(g.n_head) * static_cast<size_t>(kv_pad) * sizeof(float);
  }

  // Lanes of a row-reduction work-group (rms_norm, softmax, decode matmul): a power of two picked
  // from the device (64 on GPUs, 16 elsewhere, within its limits).
  size_t reduce_group_size() const { return reduce_group_size_; }
  // Sets the lanes (a power of two, clamped to the device's work-group limit) for tools that time the
  // decode matmul by lane count (inferd-opencl-info --decode-shapes). Another count splits the sums
  // otherwise, so float results change in their last bits; the exact kernels do not use it.
  void set_reduce_group_size(size_t lanes);
  // Kernels generated and built so far.
  size_t kernel_count() const { return kernels_.size(); }

  // Collecting a pass's kernels: between begin_collect() and build_collected() the ops generate the kernels
  // they need but neither build nor launch them (the pass computes nothing; its other commands, e.g. a
  // table upload, do run). build_collected() then builds them all side by side (Runtime::build_programs):
  // a cold start compiles in parallel what it would otherwise compile one by one at first use.
  void begin_collect();
  // Ends collecting. The first build error, naming its kernel; the kernels built before it are kept.
  Status build_collected();
  bool collecting() const { return collecting_; }
  // Kernels the last build_collected() built (0 when the pass needed no new one).
  size_t last_collected() const { return last_collected_; }

 private:
  struct Kernel {
    ClKernel kernel;
    size_t max_group = 0;             // CL_KERNEL_WORK_GROUP_SIZE
    const std::string* key = nullptr;  // its key in kernels_ (profiles name kernels by it)
  };
  struct Profiled {
    const std::string* key;
    ClEvent event;
  };
  // The kernel for `key`, generated from `make()` and built on first use.
  template <typename MakeTemplate>
  Result<Kernel*> kernel(const std::string& key, MakeTemplate make);
  // The reduction work-group size for `k`: reduce_group_size() within the kernel's own limit.
  size_t group_size(const Kernel& k) const;
  Status launch(const Kernel& k, cl_uint dims, const size_t* global, const size_t* local);
  // The arguments of a launch of `k`, logged while recording.
  KernelArgs new_args(const Kernel& k);
  Status record_launch(const Kernel& k, cl_uint dims, const size_t* global, const size_t* local, cl_event* event);
  // Launches a float decode kernel (decode_shape_, `halves` matrix slices per output slice) over
  // `out_slices` output slices and `tokens` tokens with its scratch as the next argument. kOutOfRange where
  // the kernel or local memory does not admit the device's reduction lanes, unless `may_shrink`.
  Status launch_decode(const Kernel& k, KernelArgs& args, int halves, int32_t out_slices, int32_t tokens,
                       bool may_shrink);
  Status binary(const char* op, const char* expr, const char* helpers, const Tensor& a, const Tensor& b, Tensor& dst);
  Status check_norm(const char* op, const Tensor& x, MatmulVariant variant, const DecodeNorm& norm) const;
  struct AttentionSplit {
    int32_t chunk = 0;   // positions per chunk
    int32_t chunks = 0;  // chunks per (token, head); < 2: not split
  };
  AttentionSplit attention_split(int32_t kv_pad, int32_t tokens) const;
  // The float attention kernels' lanes, and their arguments after the first (the output, or the partials
  // and the chunk): Q, the cache, the placement, the geometry, the lanes' and the query's local memory.
  size_t attention_lanes(const Kernel& k, int32_t head_dim) const;
  static void bind_attention(KernelArgs& args, const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens,
                             int32_t kv_pad, float scale, cl_mem cache, int32_t window, size_t lanes);
  Status attention_split_launch(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad,
                                float scale, cl_mem cache, Tensor& out, int32_t window, cl_mem partials,
                                AttentionSplit split);
  // kUnimplemented naming `op` and the device when it cannot run the exact kernels; kInvalidArgument
  // when one of `tensors` is not float32 (the exact ops reproduce the CPU engine's float activations).
  Status require_exact(const char* op, std::initializer_list<const Tensor*> tensors) const;
  // rms_norm() / rms_norm_exact() and swiglu_halves() / swiglu_halves_exact(): one launcher each, the
  // exact or the float kernel.
  Status rms_norm_as(const Tensor& x, const Tensor& weight, float eps, Tensor& dst, bool exact);
  Status swiglu_halves_as(const Tensor& gate_up, Tensor& dst, bool exact);

  // The CPU's F16 gelu table on the device (geglu), uploaded on first use.
  Result<cl_mem> gelu_table();

  Runtime& rt_;
  ClMem gelu_table_;
  IntDot int_dot_ = IntDot::kFloat;
  DecodeShape decode_shape_;
  int64_t launches_ = 0;
  bool profiling_ = false;
  std::vector<Profiled> profiled_;
  bool recording_ = false;
  Status record_status_;
  Recording recording_launches_;
  std::vector<RecordedArg> arg_log_;  // the arguments of the launch being prepared, while recording
  cl_kernel arg_log_kernel_ = nullptr;
  int prefill_tokens_ = 4, exact_prefill_tokens_ = 4;
  int32_t attention_chunk_ = 0;
  PrefillKernel prefill_kernel_ = PrefillKernel::kSimple;
  std::string build_options_;  // kBuildOptions, and correctly rounded float divide/sqrt where the device has it
  size_t reduce_group_size_ = 1;
  std::map<std::string, Kernel> kernels_;
  // Collecting (begin_collect()): the kernels a pass needs, generated but not built yet, and the kernel
  // handed out meanwhile (none: launch() enqueues nothing for it).
  struct Pending {
    std::string key, name, source;
  };
  bool collecting_ = false;
  std::vector<Pending> pending_;
  Kernel collecting_kernel_{ClKernel(), std::numeric_limits<size_t>::max()};
  size_t last_collected_ = 0;
};

}  // namespace inferd::opencl
