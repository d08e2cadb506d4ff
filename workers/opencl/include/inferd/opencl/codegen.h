// inferd/opencl/codegen.h — coordinate translation at code-generation time (ML Drift).
//
// A kernel is written once against logical tensors, and the generator rewrites every access into the
// indexing of the storage chosen for each tensor before clBuildProgram. The generated source is plain
// OpenCL C 1.2: no run-time dispatch, no cost.
//
// Template syntax (inside KernelTemplate::body; `t` is one of KernelTemplate::tensors):
//   $t.Read(x, y, s)           float4 at width x, height y, slice s, batch 0
//   $t.Read(x, y, s, b)        ... and batch b
//   $t.Write(v, x, y, s)       stores the float4 v (a statement); also with a fifth argument b
//   $t.Width()  $t.Height()  $t.Slices()  $t.Batch()  $t.Channels()     the logical extents (int)
// Arguments are arbitrary OpenCL C expressions (commas inside parentheses or brackets are fine) and
// may contain accessors themselves; each is parenthesised once where it is substituted. Reads of
// coordinates outside the tensor are undefined, as in OpenCL: kernels bound-check.
//
// Translation per storage (w, h, s, b: the tensor's extents; i = ((S*h + Y)*w + X)*b + B):
//   kBuffer       __global float* t            Read: vload4(i, t)             Write: vstore4(v, i, t)
//   kBuffer f16   __global half* t             Read: vload_half4(i, t)        Write: vstore_half4_rte(v, i, t)
//   kImageBuffer  image1d_buffer_t t           Read: read_imagef(t, i)        Write: write_imagef(t, i, v)
//   kTexture2D    image2d_t t                  Read: read_imagef(t, smp, (int2)(X*b + B, Y*s + S))
//                                              Write: write_imagef(t, (int2)(X*b + B, Y*s + S), v)
//   kTexture3D    image3d_t t                  Read: read_imagef(t, smp, (int4)(X*b + B, Y, S, 0))
//                                              Write: write_imagef(t, (int4)(X*b + B, Y, S, 0), v)
//                                              (the program enables cl_khr_3d_image_writes)
//   kTexture2DSplit  image2d_t t_0 .. t_{P-1}     Read: inferd_read_split<P>(t_0, .., (t_s + P-1)/P, X*b + B, Y, S)
//                                              Write: inferd_write_split<P>(..., v); the helpers pick the
//                                              part S / Sp and read or write (x, Y*Sp + S % Sp) in it
// (Images of either data type are read and written as float4: the image's channel type converts.)
// A half tensor is thus read and written as float4 too: only the accessors' translation depends on
// the data type (for buffers), not the kernel's text, and none needs cl_khr_fp16.
// Images are declared __read_only or __write_only by the tensor's Access; reading a write-only tensor
// or writing a read-only one is rejected.
//
// Every program starts with #pragma OPENCL FP_CONTRACT OFF: a * b + c rounds twice unless the kernel
// writes fma() (the exact kernels of ops.h depend on it).
//
// Kernel parameters: for each tensor in order, args_per_tensor(format) arguments
//   (memory, int t_w, int t_h, int t_s, int t_b, int t_c), a split texture's parts in place of memory
// then KernelTemplate::params verbatim. KernelArgs (ops.h) binds them.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "inferd/opencl/tensor_desc.h"
#include "inferd/status.h"

namespace inferd::opencl {

enum class Access { kRead, kWrite };

struct TensorParam {
  std::string name;  // an OpenCL C identifier; also the prefix of its extent parameters
  TensorFormat format;  // storage and data type
  Access access = Access::kRead;
};

struct KernelTemplate {
  std::string name;                  // the __kernel function's name
  std::vector<TensorParam> tensors;  // the virtualized tensors, in parameter order
  std::vector<std::string> params;   // further parameters, verbatim ("float eps", "__local float* scratch")
  std::string helpers;               // plain OpenCL C emitted before the kernel (no accessors)
  std::string body;                  // the kernel's statements, with accessors
};

inline constexpr int kArgsPerTensor = 6;
// A tensor's kernel arguments: its objects (one, or a kTexture2DSplit's parts) and 5 extents.
inline constexpr int args_per_tensor(const TensorFormat& f) { return kArgsPerTensor - 1 + f.parts; }

struct GeneratedKernel {
  std::string name;
  std::string source;  // a complete program holding this one kernel
  int first_param_arg = 0;  // index of KernelTemplate::params[0] among the kernel's arguments
};

// kInvalidArgument (with the offset in the body) for an unknown tensor or method, a wrong number of
// arguments, an unterminated call, a read of a write-only or a write of a read-only tensor, accessors
// in `helpers`, or names that are not identifiers.
Result<GeneratedKernel> generate_kernel(const KernelTemplate& kernel);

}  // namespace inferd::opencl
