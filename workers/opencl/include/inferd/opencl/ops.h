// inferd/opencl/ops.h — the OpenCL backend's ops, generated per storage (issue 5).
//
// Every op is one kernel template (codegen.h) instantiated for the storages of the tensors it is
// given: the first call with a new combination generates, builds (through the Runtime's program
// caches) and keeps the kernel; later calls only set arguments and enqueue. Ops enqueue and return:
// the Runtime's queue is in order, and download() / Runtime::finish() wait.
//
// Conventions (BHWC, tensor_desc.h): a token is a position x along the width; a row op (rms_norm,
// softmax) reduces over the channels of each (b, x, y); outputs are written in full, padding lanes as
// zeros. Work-group sizes come from the DeviceInfo (reduce_group_size()).
//
// Matmul: y[t][r] = sum_k W[r][k] x[t][k] with x of shape 1x1xTxK and y of shape 1x1xTxR. Weights are
// converted once, at upload, from ggml's row-major blocks into the layout the kernels read: rows in
// slices of 4 (S_O = ceil(R / 4), padded with zero rows), and per (output slice, input slice of 4)
// the 4 x 4 block the kernel dots with one float4 of x (ML Drift's (S_O, S_I, O4, I4) order):
//   F32   values  float4 [S_O][S_I][4]          the 4 rows' 4 elements
//   F16   values  half4  [S_O][S_I][4]          read with vload_half4 (no cl_khr_fp16 needed)
//   Q8_0  quants  char4  [S_O][K/32][8][4]      scales float4 [S_O][K/32] (one d per row)
//   Q4_0  quants  ushort4 [S_O][K/32][8]        component r holds row r's 4 nibbles, element i in
//                                               bits 4i..4i+3; value (q - 8) * d; scales as Q8_0
//   Q4_1  as Q4_0, value q * d + m; mins float4 [S_O][K/32]
// Two kernels per type, chosen by stage: decode (GEMV: one work-group per output slice, its lanes
// split K and reduce in local memory) and prefill (each work-item computes one output slice for 4
// tokens, reading each weight block once for all of them).
//
// Thread safety: an Ops object and its Runtime are used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "inferd/kernels/dtype.h"
#include "inferd/opencl/cl_runtime.h"
#include "inferd/opencl/codegen.h"
#include "inferd/opencl/tensor_desc.h"
#include "inferd/status.h"

namespace inferd::opencl {

// Binds a generated kernel's arguments in order; the first error is kept and reported by status().
class KernelArgs {
 public:
  explicit KernelArgs(cl_kernel kernel) : kernel_(kernel) {}

  KernelArgs& tensor(const Tensor& t);  // kArgsPerTensor arguments: memory and extents
  KernelArgs& buffer(cl_mem mem);        // may be nullptr (an unused __global pointer)
  KernelArgs& local(size_t bytes);       // a __local pointer of `bytes` bytes
  template <typename T>
  KernelArgs& value(const T& v) {
    set(sizeof(T), &v);
    return *this;
  }
  const Status& status() const { return status_; }

 private:
  void set(size_t size, const void* value);

  cl_kernel kernel_;
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
  cl_mem scales() const { return scales_.get(); }  // nullptr for F32 / F16
  cl_mem mins() const { return mins_.get(); }      // nullptr except Q4_1

 private:
  MatmulWeights() = default;

  DType type_ = DType::kF32;
  int64_t rows_ = 0, k_ = 0;
  size_t device_bytes_ = 0;
  ClMem values_, scales_, mins_;
};

enum class MatmulVariant { kAuto, kDecode, kPrefill };
const char* matmul_variant_name(MatmulVariant variant);
// kAuto's choice for T tokens: decode below 4 tokens (where the prefill kernel's tile of 4 tokens
// would be mostly empty), prefill from 4 on.
MatmulVariant choose_matmul_variant(int32_t tokens);

enum class RopeMode { kNormal, kNeox };  // llama: adjacent pairs; NeoX (qwen2): halves

class Ops {
 public:
  explicit Ops(Runtime& rt);  // `rt` outlives this object
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  // dst = a + b, dst = a * b, dst = silu(gate) * up: all tensors of one shape.
  Status add(const Tensor& a, const Tensor& b, Tensor& dst);
  Status mul(const Tensor& a, const Tensor& b, Tensor& dst);
  Status swiglu(const Tensor& gate, const Tensor& up, Tensor& dst);
  // dst = x / sqrt(mean_c(x^2) + eps) * weight; weight has shape 1x1x1xC.
  Status rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& dst);
  // Rotary embedding of x = 1 x heads x tokens x head_dim (positions: an int32 buffer of >= tokens
  // entries), angles pos * base^(-2i/head_dim) formed by ggml's recurrence. kNormal needs an even
  // head_dim, kNeox a multiple of 8 (a slice never straddles the halves); kUnimplemented otherwise.
  Status rope(const Tensor& x, cl_mem positions, float base, RopeMode mode, Tensor& dst);
  // dst = softmax over c of (x * scale + mask); mask is B' x H' x W x C with B' and H' either 1
  // (broadcast) or equal to x's. A row masked entirely (-inf) becomes zeros.
  Status softmax(const Tensor& x, const Tensor& mask, float scale, Tensor& dst);
  // y = W x (see the header comment); x is 1x1xTxK, y 1x1xTxR.
  Status matmul(const MatmulWeights& w, const Tensor& x, Tensor& y, MatmulVariant variant = MatmulVariant::kAuto);

  // Lanes of a row-reduction work-group (rms_norm, softmax, decode matmul): a power of two picked
  // from the device (64 on GPUs, 16 elsewhere, within its limits).
  size_t reduce_group_size() const { return reduce_group_size_; }
  // Kernels generated and built so far.
  size_t kernel_count() const { return kernels_.size(); }

 private:
  struct Kernel {
    ClKernel kernel;
    size_t max_group = 0;  // CL_KERNEL_WORK_GROUP_SIZE
  };
  // The kernel for `key`, generated from `make()` and built on first use.
  template <typename MakeTemplate>
  Result<Kernel*> kernel(const std::string& key, MakeTemplate make);
  // The reduction work-group size for `k`: reduce_group_size() within the kernel's own limit.
  size_t group_size(const Kernel& k) const;
  Status launch(const Kernel& k, cl_uint dims, const size_t* global, const size_t* local);
  Status binary(const char* op, const char* expr, const Tensor& a, const Tensor& b, Tensor& dst);

  Runtime& rt_;
  size_t reduce_group_size_ = 1;
  std::map<std::string, Kernel> kernels_;
};

}  // namespace inferd::opencl
