#include "inferd/opencl/ops.h"

#include <CL/cl_ext.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"

namespace inferd::opencl {

// ---- KernelArgs ----------------------------------------------------------------------------------

void KernelArgs::set(size_t size, const void* value) {
  const cl_uint index = next_++;
  if (!status_) return;
  const cl_int err = clSetKernelArg(kernel_, index, size, value);
  if (err != CL_SUCCESS) status_ = cl_error(err, "clSetKernelArg(" + std::to_string(index) + ")");
}

KernelArgs& KernelArgs::tensor(const Tensor& t) {
  for (int32_t p = 0; p < t.desc().parts(); ++p) {
    const cl_mem mem = t.memory(p);
    set(sizeof(mem), &mem);
  }
  const Bhwc& s = t.shape();
  const cl_int extents[kArgsPerTensor - 1] = {s.w, s.h, s.slices(), s.b, s.c};
  for (cl_int e : extents) set(sizeof(e), &e);
  return *this;
}

KernelArgs& KernelArgs::buffer(cl_mem mem) {
  set(sizeof(mem), &mem);
  return *this;
}

KernelArgs& KernelArgs::weights(const MatmulWeights& w) {
  return buffer(w.values()).buffer(w.scales()).buffer(w.mins()).buffer(w.sub_scales()).buffer(w.high_bits());
}

KernelArgs& KernelArgs::local(size_t bytes) {
  set(bytes, nullptr);
  return *this;
}

// ---- Kernel templates ----------------------------------------------------------------------------
//
// Each function returns the template of one op for given storages; the bodies are written against
// the accessors of codegen.h only, so one text serves every storage.

namespace {

constexpr const char* kBuildOptions = "-cl-std=CL1.2";

std::string storage_key(std::initializer_list<const Tensor*> tensors) {
  std::string key;
  for (const Tensor* t : tensors) {
    key += ':';
    key += t->format().to_string();
  }
  return key;
}

// A tree reduction of `scratch[0 .. get_local_size(0))` into scratch[0] with `op` (a binary
// function-like macro name or function). get_local_size(0) is a power of two; every lane must reach it.
std::string reduce_code(const std::string& op) {
  return "  barrier(CLK_LOCAL_MEM_FENCE);\n"
         "  for (int off = lsz / 2; off > 0; off >>= 1) {\n"
         "    if (lid < off) scratch[lid] = " + op + "(scratch[lid], scratch[lid + off]);\n"
         "    barrier(CLK_LOCAL_MEM_FENCE);\n"
         "  }\n";
}

// The (b, x, y) of this work-group's row, for row ops launched as (lanes, rows).
constexpr const char* kRowPrologue = R"(  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int row = get_global_id(1);
  const int b = row % $src.Batch();
  const int x = (row / $src.Batch()) % $src.Width();
  const int y = row / ($src.Batch() * $src.Width());
  const int n_s = $src.Slices();
)";

// Helpers of every exact kernel. The constants and the order of operations are those of
// kernels/cpu/ggml_math.h and x86_kernels.inc; each line says which function it mirrors.
constexpr const char* kExactHelpers = R"(#pragma OPENCL EXTENSION cl_khr_fp64 : enable
// Float division and square root correctly rounded, as the host's: through double, whose 53 bits
// make rounding twice give the correctly rounded float (OpenCL's float ones may be off by ulps).
inline float inferd_div(float a, float b) { return (float)((double)a / (double)b); }
inline float inferd_sqrt(float a) { return (float)sqrt((double)a); }
// v rounded to IEEE half to nearest even (vstore_half's mode; F16C's), and back.
inline float inferd_round_half(float v) {
  ushort h;
  vstore_half(v, 0, (half*)&h);
  return vload_half(0, (const half*)&h);
}
// exp(x) as one lane of ggml_v_expf (ggml_math::expf_lane).
inline float inferd_expf(float x) {
  const float z = fma(x, 0x1.715476p+0f, 0x1.8p23f);
  const float n = z - 0x1.8p23f;
  const float b = fma(-n, 0x1.7f7d1cp-20f, fma(-n, 0x1.62e4p-1f, x));
  if (fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  const float u = b * b;
  const float j = fma(fma(fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                      fma(0x1.ffffecp-1f, b, 1.0f));
  return ldexp(j, (int)n);
}
// x * sigmoid(x) as ggml_v_silu (ggml_math::silu_lane).
inline float inferd_silu1(float x) { return inferd_div(x, 1.0f + inferd_expf(0.0f - x)); }
inline float4 inferd_silu4(float4 x) {
  return (float4)(inferd_silu1(x.x), inferd_silu1(x.y), inferd_silu1(x.z), inferd_silu1(x.w));
}
// The horizontal sum of 8 float lanes (lo: lanes 0..3, hi: 4..7) in x86_kernels.inc's hsum order.
inline float inferd_hsum8(float4 lo, float4 hi) {
  const float4 s = lo + hi;
  return (s.x + s.z) + (s.y + s.w);
}
// The sum of 16 lanes in _mm512_reduce_add_ps's order (ggml_math::reduce16).
inline float inferd_reduce16(float16 v) {
  const float8 a = v.hi + v.lo;
  const float4 b = a.hi + a.lo;
  return (b.x + b.z) + (b.y + b.w);
}
// Component c (0..3) of v.
inline float inferd_lane(float4 v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
)";

// The float ops' SiLU: the device's exp and division.
constexpr const char* kFloatSilu = "inline float4 inferd_silu(float4 g) { return g / (1.0f + exp(-g)); }\n";

KernelTemplate elementwise_template(const std::string& name, const std::string& expr, const char* helpers,
                                    TensorFormat a, TensorFormat b, TensorFormat dst) {
  KernelTemplate k;
  k.name = name;
  k.tensors = {{"lhs", a, Access::kRead}, {"rhs", b, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.helpers = helpers;
  // Launched as (W * B, H, S): the batch is the fastest-varying part of the first dimension.
  k.body = R"(  const int xb = get_global_id(0);
  const int y = get_global_id(1);
  const int s = get_global_id(2);
  const int b = xb % $dst.Batch();
  const int x = xb / $dst.Batch();
  const float4 va = $lhs.Read(x, y, s, b);
  const float4 vb = $rhs.Read(x, y, s, b);
  $dst.Write()" + expr + R"(, x, y, s, b);
)";
  return k;
}

KernelTemplate rms_norm_template(TensorFormat src, TensorFormat weight, TensorFormat dst) {
  KernelTemplate k;
  k.name = "rms_norm";
  k.tensors = {{"src", src, Access::kRead}, {"weight", weight, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"float eps", "__local float* scratch"};
  k.body = std::string(kRowPrologue) + R"(  float acc = 0.0f;
  for (int s = lid; s < n_s; s += lsz) {
    const float4 v = $src.Read(x, y, s, b);
    acc += dot(v, v);  // padding lanes are zero
  }
  scratch[lid] = acc;
)" + reduce_code("inferd_add") +
           R"(  const float scale = rsqrt(scratch[0] / (float)$src.Channels() + eps);
  for (int s = lid; s < n_s; s += lsz) {
    $dst.Write($src.Read(x, y, s, b) * scale * $weight.Read(0, 0, s), x, y, s, b);
  }
)";
  k.helpers = "inline float inferd_add(float a, float b) { return a + b; }\n";
  return k;
}

KernelTemplate softmax_template(TensorFormat src, TensorFormat mask, TensorFormat dst) {
  KernelTemplate k;
  k.name = "softmax";
  k.tensors = {{"src", src, Access::kRead}, {"mask", mask, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"float scale", "__local float* scratch"};
  k.helpers = R"(inline float inferd_add(float a, float b) { return a + b; }
// Lanes past the row's `c` channels (the last slice's padding) become -inf: they must not count.
inline float4 inferd_mask_lanes(float4 v, int s, int c) {
  const int n = c - 4 * s;
  if (n < 4) v.w = -INFINITY;
  if (n < 3) v.z = -INFINITY;
  if (n < 2) v.y = -INFINITY;
  return v;
}
)";
  k.body = std::string(kRowPrologue) + R"(  const int c = $src.Channels();
  const int my = $mask.Height() == 1 ? 0 : y;
  const int mb = $mask.Batch() == 1 ? 0 : b;
  float m = -INFINITY;
  for (int s = lid; s < n_s; s += lsz) {
    const float4 v = inferd_mask_lanes($src.Read(x, y, s, b) * scale + $mask.Read(x, my, s, mb), s, c);
    m = fmax(m, fmax(fmax(v.x, v.y), fmax(v.z, v.w)));
  }
  scratch[lid] = m;
)" + reduce_code("fmax") +
           R"(  const float row_max = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // every lane has read scratch[0] before it is reused
  const bool empty = row_max == -INFINITY;  // the whole row is masked
  float sum = 0.0f;
  for (int s = lid; s < n_s && !empty; s += lsz) {
    const float4 v = inferd_mask_lanes($src.Read(x, y, s, b) * scale + $mask.Read(x, my, s, mb), s, c);
    const float4 e = exp(v - row_max);
    sum += (e.x + e.y) + (e.z + e.w);
  }
  scratch[lid] = sum;
)" + reduce_code("inferd_add") +
           R"(  const float inv = empty ? 0.0f : 1.0f / scratch[0];
  for (int s = lid; s < n_s; s += lsz) {
    const float4 v = inferd_mask_lanes($src.Read(x, y, s, b) * scale + $mask.Read(x, my, s, mb), s, c);
    $dst.Write(empty ? (float4)(0.0f) : exp(v - row_max) * inv, x, y, s, b);
  }
)";
  return k;
}

// Angles follow ggml's recurrence theta_i = pos * ts * ts * ... (i factors, rounded after each
// multiplication) rather than pos * pow(ts, i): the same floats as the CPU reference, so that only
// sin and cos differ.
KernelTemplate rope_template(RopeMode mode, TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = mode == RopeMode::kNormal ? "rope_normal" : "rope_neox";
  k.tensors = {{"src", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"__global const int* pos", "float theta_scale"};
  if (mode == RopeMode::kNormal) {
    // One work-item per slice: pairs (0,1) and (2,3) of the slice, i.e. pair indices 2s and 2s + 1.
    k.body = R"(  const int x = get_global_id(0);
  const int y = get_global_id(1);
  const int s = get_global_id(2);
  float theta = (float)pos[x];
  for (int i = 0; i < 2 * s; ++i) theta *= theta_scale;
  const float theta1 = theta * theta_scale;
  float c0, c1;
  const float s0 = sincos(theta, &c0);
  const float s1 = sincos(theta1, &c1);
  const float4 v = $src.Read(x, y, s);
  float4 o;
  o.x = fma(v.x, c0, -(v.y * s0));
  o.y = fma(v.x, s0, v.y * c0);
  o.z = fma(v.z, c1, -(v.w * s1));
  o.w = fma(v.z, s1, v.w * c1);
  $dst.Write(o, x, y, s);
)";
  } else {
    // One work-item per slice of the first half: pairs p = 4s + lane rotate (x[p], x[p + half]).
    k.body = R"(  const int x = get_global_id(0);
  const int y = get_global_id(1);
  const int s = get_global_id(2);
  const int half_s = $src.Channels() / 8;  // slices per half
  float theta = (float)pos[x];
  for (int i = 0; i < 4 * s; ++i) theta *= theta_scale;
  float4 t;
  t.x = theta;
  t.y = t.x * theta_scale;
  t.z = t.y * theta_scale;
  t.w = t.z * theta_scale;
  float4 c;
  const float4 sn = sincos(t, &c);
  const float4 lo = $src.Read(x, y, s);
  const float4 hi = $src.Read(x, y, s + half_s);
  $dst.Write(fma(lo, c, -(hi * sn)), x, y, s);
  $dst.Write(fma(lo, sn, hi * c), x, y, s + half_s);
)";
  }
  return k;
}

// ---- Matmul ----

const char* weight_pointer_type(DType type) {
  switch (type) {
    case DType::kF32: return "float4";
    case DType::kF16: return "half";
    case DType::kQ8_0: return "char4";
    case DType::kBF16:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return "ushort4";
    default: return nullptr;
  }
}

bool is_k_quant(DType type) { return type == DType::kQ4_K || type == DType::kQ5_K || type == DType::kQ6_K; }

// The bits of a code past its low nibble, kept in the high-bits plane (MatmulWeights::high_bits):
// 1 for the 5-bit types, 2 for Q6_K, 0 for the others (Q8_0 keeps whole bytes, the rest nibbles).
int high_bits_per_code(DType type) {
  switch (type) {
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ5_K: return 1;
    case DType::kQ6_K: return 2;
    default: return 0;
  }
}
// The element of the high-bits plane: 16 bits (4 rows x 4 weights x 1 bit) for the 5-bit codes,
// 32 (x 2 bits) for Q6_K's 6-bit ones; unused (but bound) for the other types.
const char* high_bits_type(DType type) { return high_bits_per_code(type) == 2 ? "uint" : "ushort"; }
// The statement loading the high bits of slice `index` into h (none for the types without them).
std::string load_high_bits(DType type, const std::string& index) {
  return high_bits_per_code(type) == 0 ? "" : "  const uint h = wh[" + index + "];\n";
}

// The parameters every weight-reading kernel takes, in KernelArgs::weights() order.
std::vector<std::string> weight_params(DType type) {
  return {std::string("__global const ") + weight_pointer_type(type) + "* wq", "__global const float4* ws",
          "__global const float4* wm", "__global const char4* wsub",
          std::string("__global const ") + high_bits_type(type) + "* wh"};
}

// Row r's 4 codes at the loaded slice (ushort4 p of low nibbles; uint h of high bits, see
// load_high_bits) as uint4: the nibbles, with one more bit (the 5-bit types) or two (Q6_K).
std::string codes_u(DType type, int r) {
  const std::string lane = std::string("p.") + "xyzw"[r];
  switch (high_bits_per_code(type)) {
    case 1: return "inferd_code5_u(" + lane + ", h, " + std::to_string(r) + ")";
    case 2: return "inferd_code6_u(" + lane + ", h, " + std::to_string(r) + ")";
    default: return "convert_uint4(inferd_nibbles(" + lane + "))";
  }
}

// The 32-element block types whose quants are packed nibbles (Q4_0, Q4_1) or nibbles plus a plane of
// fifth bits (Q5_0, Q5_1): row r's 4 codes as float4 (IntDot::kFloat) or char4 (kInt8).
std::string packed_codes(DType type, IntDot form, int r) {
  const bool int8 = form == IntDot::kInt8;
  if (high_bits_per_code(type) > 0) return std::string(int8 ? "convert_char4(" : "convert_float4(") + codes_u(type, r) + ")";
  return std::string(int8 ? "inferd_nibbles_c(p." : "inferd_nibbles(p.") + "xyzw"[r] + ")";
}
// The code of value 0 of those types without a min (Q4_0: 8, Q5_0: 16); 0 for those with one.
int code_zero(DType type) { return type == DType::kQ4_0 ? 8 : type == DType::kQ5_0 ? 16 : 0; }
bool has_min(DType type) { return type == DType::kQ4_1 || type == DType::kQ5_1; }

// w_load(): the 4 rows of output slice `so` at input slice `si`, dequantized as the CPU engine's
// to_float (kernels/cpu/scalar.cpp) computes them, into r[0..3].
std::string weight_loader(DType type) {
  const std::string signature = std::string("inline void w_load(__global const ") + weight_pointer_type(type) +
                                "* wq, __global const float4* ws, __global const float4* wm, __global const char4* "
                                "wsub, __global const " + high_bits_type(type) +
                                "* wh, int so, int si, int n_si, float4* r) {\n";
  // The 32-element group of (so, si), the K-quant super-block holding it, and the group within it.
  const std::string k_prologue = R"(  const int g = so * (n_si / 8) + si / 8;
  const int sb = so * (n_si / 64) + si / 64;
)";
  switch (type) {
    case DType::kF32:
      return signature + R"(  const int base = (so * n_si + si) * 4;
  r[0] = wq[base];
  r[1] = wq[base + 1];
  r[2] = wq[base + 2];
  r[3] = wq[base + 3];
}
)";
    case DType::kF16:
      return signature + R"(  const int base = (so * n_si + si) * 4;
  r[0] = vload_half4(base, wq);
  r[1] = vload_half4(base + 1, wq);
  r[2] = vload_half4(base + 2, wq);
  r[3] = vload_half4(base + 3, wq);
}
)";
    case DType::kBF16:
      return signature + R"(  const int base = (so * n_si + si) * 4;
  r[0] = as_float4(convert_uint4(wq[base]) << 16);
  r[1] = as_float4(convert_uint4(wq[base + 1]) << 16);
  r[2] = as_float4(convert_uint4(wq[base + 2]) << 16);
  r[3] = as_float4(convert_uint4(wq[base + 3]) << 16);
}
)";
    case DType::kQ8_0:
      return signature + R"(  const int blk = so * (n_si / 8) + si / 8;
  const int base = (blk * 8 + si % 8) * 4;
  const float4 d = ws[blk];
  r[0] = convert_float4(wq[base]) * d.x;
  r[1] = convert_float4(wq[base + 1]) * d.y;
  r[2] = convert_float4(wq[base + 2]) * d.z;
  r[3] = convert_float4(wq[base + 3]) * d.w;
}
)";
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1: {  // (code - zero) * d, or code * d + m for the types with a min
      const bool min = has_min(type);
      std::string body = signature + "  const int blk = so * (n_si / 8) + si / 8;\n" +
                         "  const ushort4 p = wq[blk * 8 + si % 8];\n" + load_high_bits(type, "blk * 8 + si % 8") +
                         "  const float4 d = ws[blk];\n" +
                         (min ? "  const float4 m = wm[blk];\n" : "");
      for (int r = 0; r < 4; ++r) {
        const std::string code = packed_codes(type, IntDot::kFloat, r), lane = std::string(".") + "xyzw"[r];
        body += "  r[" + std::to_string(r) + "] = " +
                (min ? code + " * d" + lane + " + m" + lane
                     : "(" + code + " - " + std::to_string(code_zero(type)) + ".0f) * d" + lane) +
                ";\n";
      }
      return body + "}\n";
    }
    case DType::kQ4_K:  // q4_k_to_float: ds * q - ms, ds = d * sc, ms = dmin * mn
    case DType::kQ5_K: {
      std::string body = signature + k_prologue + "  const ushort4 p = wq[g * 8 + si % 8];\n" +
                         load_high_bits(type, "g * 8 + si % 8") +
                         "  const float4 ds = ws[sb] * convert_float4(wsub[sb * 16 + g % 8]);\n"
                         "  const float4 ms = wm[sb] * convert_float4(wsub[sb * 16 + 8 + g % 8]);\n";
      for (int r = 0; r < 4; ++r) {
        const std::string lane = std::string(".") + "xyzw"[r];
        body += "  r[" + std::to_string(r) + "] = convert_float4(" + codes_u(type, r) + ") * ds" + lane +
                " - ms" + lane + ";\n";
      }
      return body + "}\n";
    }
    case DType::kQ6_K: {  // q6_k_to_float: (d * sc) * (q - 32), sc the scale of the 16 elements
      std::string body = signature + k_prologue + "  const ushort4 p = wq[g * 8 + si % 8];\n" +
                         load_high_bits(type, "g * 8 + si % 8") +
                         "  const float4 ds = ws[sb] * convert_float4(wsub[sb * 16 + (si % 64) / 4]);\n";
      for (int r = 0; r < 4; ++r) {
        const std::string lane = std::string(".") + "xyzw"[r];
        body += "  r[" + std::to_string(r) + "] = ds" + lane + " * (convert_float4(" + codes_u(type, r) +
                ") - 32.0f);\n";
      }
      return body + "}\n";
    }
    default: return "";
  }
}

constexpr const char* kMatmulHelpers = R"(// The 4 nibbles of v, lowest first, as floats.
inline float4 inferd_nibbles(ushort v) {
  const uint u = v;
  return convert_float4((uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12));
}
// The four 5-bit codes of row r (Q5_0, Q5_1, Q5_K): its nibbles v and its fifth bits, bits 4r..4r+3 of h.
inline uint4 inferd_code5_u(ushort v, uint h, int r) {
  const uint u = v, b = h >> (4 * r);
  return (uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12) |
         (((uint4)(b, b >> 1, b >> 2, b >> 3) & 1u) << 4);
}
// The four 6-bit codes of row r (Q6_K): its nibbles v and its two high bits each, bits 8r..8r+7 of h.
inline uint4 inferd_code6_u(ushort v, uint h, int r) {
  const uint u = v, b = h >> (8 * r);
  return (uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12) |
         (((uint4)(b, b >> 2, b >> 4, b >> 6) & 3u) << 4);
}
// The dot products of the 4 weight rows r with one slice x: one output slice's contribution.
inline float4 inferd_dot4(const float4* r, float4 x) {
  return (float4)(dot(r[0], x), dot(r[1], x), dot(r[2], x), dot(r[3], x));
}
)";

KernelTemplate matmul_template(DType type, MatmulVariant variant, TensorFormat x, TensorFormat y) {
  KernelTemplate k;
  k.name = variant == MatmulVariant::kDecode ? "matmul_decode" : "matmul_prefill";
  k.tensors = {{"x", x, Access::kRead}, {"y", y, Access::kWrite}};
  k.params = weight_params(type);
  k.helpers = std::string(kMatmulHelpers) + weight_loader(type);
  if (variant == MatmulVariant::kDecode) {
    // Launched as (lanes * S_O, T) with work-groups (lanes, 1): a group per (output slice, token).
    k.params.push_back("__local float4* scratch");
    k.body = R"(  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int so = get_group_id(0);
  const int t = get_global_id(1);
  const int n_si = $x.Slices();
  float4 r[4];
  float4 acc = (float4)(0.0f);
  for (int si = lid; si < n_si; si += lsz) {
    w_load(wq, ws, wm, wsub, wh, so, si, n_si, r);
    acc += inferd_dot4(r, $x.Read(t, 0, si));
  }
  scratch[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int off = lsz / 2; off > 0; off >>= 1) {
    if (lid < off) scratch[lid] += scratch[lid + off];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) $y.Write(scratch[0], t, 0, so);
)";
  } else {
    // Launched as (S_O, ceil(T / 4)): a work-item per (output slice, 4 tokens). Tokens past T read
    // the last token (in bounds) and are not written.
    k.body = R"(  const int so = get_global_id(0);
  const int t0 = get_global_id(1) * 4;
  const int n_t = $x.Width();
  const int n_si = $x.Slices();
  const int t1 = min(t0 + 1, n_t - 1), t2 = min(t0 + 2, n_t - 1), t3 = min(t0 + 3, n_t - 1);
  float4 r[4];
  float4 a0 = (float4)(0.0f), a1 = (float4)(0.0f), a2 = (float4)(0.0f), a3 = (float4)(0.0f);
  for (int si = 0; si < n_si; ++si) {
    w_load(wq, ws, wm, wsub, wh, so, si, n_si, r);
    a0 += inferd_dot4(r, $x.Read(t0, 0, si));
    a1 += inferd_dot4(r, $x.Read(t1, 0, si));
    a2 += inferd_dot4(r, $x.Read(t2, 0, si));
    a3 += inferd_dot4(r, $x.Read(t3, 0, si));
  }
  $y.Write(a0, t0, 0, so);
  if (t0 + 1 < n_t) $y.Write(a1, t0 + 1, 0, so);
  if (t0 + 2 < n_t) $y.Write(a2, t0 + 2, 0, so);
  if (t0 + 3 < n_t) $y.Write(a3, t0 + 3, 0, so);
)";
  }
  return k;
}

// ---- The forward pass's own kernels ----

KernelTemplate get_rows_template(DType type, TensorFormat dst) {
  KernelTemplate k;
  k.name = "get_rows";
  k.tensors = {{"dst", dst, Access::kWrite}};
  k.params = weight_params(type);
  k.params.insert(k.params.begin(), "__global const int* rows");
  k.helpers = std::string(kMatmulHelpers) + weight_loader(type);
  // Launched as (T, S): w_load() dequantizes the 4 rows of the row's output slice; one is kept.
  k.body = R"(  const int t = get_global_id(0);
  const int si = get_global_id(1);
  const int row = rows[t];
  float4 r[4];
  w_load(wq, ws, wm, wsub, wh, row / 4, si, $dst.Slices(), r);
  $dst.Write(r[row % 4], t, 0, si);
)";
  return k;
}

KernelTemplate gather_template(TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = "gather";
  k.tensors = {{"src", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"__global const int* rows"};
  k.body = R"(  const int o = get_global_id(0);
  const int s = get_global_id(1);
  $dst.Write($src.Read(rows[o], 0, s), o, 0, s);
)";
  return k;
}

// silu(gate) * up over the halves of one gate|up tensor; `exact`: kernels::silu's operations
// (kExactHelpers' inferd_silu4), else the float form.
KernelTemplate swiglu_halves_template(TensorFormat src, TensorFormat dst, bool exact) {
  KernelTemplate k;
  k.name = exact ? "swiglu_halves_exact" : "swiglu_halves";
  k.tensors = {{"gu", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.helpers = exact ? kExactHelpers : kFloatSilu;
  k.body = std::string(R"(  const int t = get_global_id(0);
  const int s = get_global_id(1);
  const float4 g = $gu.Read(t, 0, s);
  const float4 u = $gu.Read(t, 0, s + $dst.Slices());
  $dst.Write()") + (exact ? "inferd_silu4" : "inferd_silu") + R"((g) * u, t, 0, s);
)";
  return k;
}

// One work-item per (token, head, unit): a unit is one slice (two rotated pairs) of a head for
// llama's rope, one slice of each half for NeoX's. Q heads come first, then KV heads, whose work-items
// also copy V. The cos and sin come from the host (rope_table: the CPU engine's own values); the
// rotation is kernels::rope_rotate's: a' = fma(a, cos, -(b * sin)), b' = fma(a, sin, b * cos).
KernelTemplate rope_kv_template(RopeMode mode, TensorFormat q, TensorFormat k_storage, TensorFormat v) {
  KernelTemplate k;
  k.name = mode == RopeMode::kNormal ? "rope_kv_normal" : "rope_kv_neox";
  k.tensors = {{"q", q, Access::kRead}, {"k", k_storage, Access::kRead}, {"v", v, Access::kRead}};
  k.params = {"int q_slice", "int k_slice", "int v_slice", "__global const float* bias",
              "__global const int* pos", "__global const int* slot", "__global const float* rope", "int n_head",
              "int n_head_kv", "int head_dim", "int n_ctx", "__global half* q_out", "__global half* cache"};
  k.helpers = R"(// The bias of channels [c, c + 4) of Q|K|V, or 0.
inline float4 inferd_bias(__global const float* bias, int c) {
  return bias != 0 ? vload4(0, bias + c) : (float4)(0.0f);
}
)";
  std::string body = R"(  const int t = get_global_id(0);
  const int hh = get_global_id(1);
  const int s = get_global_id(2);
  const int hd4 = head_dim / 4;
  const int n_embd = n_head * head_dim, n_embd_kv = n_head_kv * head_dim;
  const bool is_q = hh < n_head;
  const int head = is_q ? hh : hh - n_head;
  __global half* kv_row = cache + ((((size_t)slot[t] * 2) * n_head_kv + head) * n_ctx + pos[t]) * head_dim;
  __global half* v_row = kv_row + (size_t)n_head_kv * n_ctx * head_dim;
  __global half* q_row = q_out + ((size_t)t * n_head + head) * head_dim;
  __global const float* trig = rope + (size_t)t * head_dim;  // (cos, sin) of the token's head_dim / 2 angles
)";
  if (mode == RopeMode::kNormal) {
    body += R"(  const float4 cs = vload4(s, trig);  // angles 2s and 2s + 1
  float4 x;
  if (is_q) {
    x = $q.Read(t, 0, q_slice + head * hd4 + s) + inferd_bias(bias, head * head_dim + 4 * s);
  } else {
    x = $k.Read(t, 0, k_slice + head * hd4 + s) + inferd_bias(bias, n_embd + head * head_dim + 4 * s);
    const float4 vx = $v.Read(t, 0, v_slice + head * hd4 + s) + inferd_bias(bias, n_embd + n_embd_kv + head * head_dim + 4 * s);
    vstore_half4(vx, s, v_row);
  }
  float4 o;
  o.x = fma(x.x, cs.x, -(x.y * cs.y));
  o.y = fma(x.x, cs.y, x.y * cs.x);
  o.z = fma(x.z, cs.z, -(x.w * cs.w));
  o.w = fma(x.z, cs.w, x.w * cs.z);
  vstore_half4(o, s, is_q ? q_row : kv_row);
)";
  } else {
    body += R"(  const int half_s = head_dim / 8;
  const float4 t0 = vload4(2 * s, trig), t1 = vload4(2 * s + 1, trig);  // angles 4s .. 4s + 3
  const float4 c = (float4)(t0.x, t0.z, t1.x, t1.z);
  const float4 sn = (float4)(t0.y, t0.w, t1.y, t1.w);
  float4 lo, hi;
  if (is_q) {
    lo = $q.Read(t, 0, q_slice + head * hd4 + s) + inferd_bias(bias, head * head_dim + 4 * s);
    hi = $q.Read(t, 0, q_slice + head * hd4 + s + half_s) + inferd_bias(bias, head * head_dim + 4 * (s + half_s));
  } else {
    const int kb = n_embd + head * head_dim, vb = n_embd + n_embd_kv + head * head_dim;
    lo = $k.Read(t, 0, k_slice + head * hd4 + s) + inferd_bias(bias, kb + 4 * s);
    hi = $k.Read(t, 0, k_slice + head * hd4 + s + half_s) + inferd_bias(bias, kb + 4 * (s + half_s));
    vstore_half4($v.Read(t, 0, v_slice + head * hd4 + s) + inferd_bias(bias, vb + 4 * s), s, v_row);
    vstore_half4($v.Read(t, 0, v_slice + head * hd4 + s + half_s) + inferd_bias(bias, vb + 4 * (s + half_s)),
                 s + half_s, v_row);
  }
  __global half* out = is_q ? q_row : kv_row;
  vstore_half4(fma(lo, c, -(hi * sn)), s, out);
  vstore_half4(fma(lo, sn, hi * c), s + half_s, out);
)";
  }
  k.body = body;
  return k;
}

// Launched as (lanes * n_head, T) in work-groups of (lanes, 1); lane j takes positions j, j + lanes,
// ... with an online softmax (running maximum m, sum l, and the weighted sum of V rows), then the
// lanes' states are rescaled to the group's maximum and summed in local memory. One pass over K and
// V. Probabilities stay float: llama.cpp rounds them to half before KQV, which needs the row's sum
// first (a second pass over K); tried, it did not change the agreement with the CPU engine measurably
// (whose 8-bit activations dominate the difference; cl_engine_test.cpp).
KernelTemplate attention_template(int32_t head_dim, TensorFormat out) {
  KernelTemplate k;
  k.name = "attention";
  k.tensors = {{"out", out, Access::kWrite}};
  k.params = {"__global const half* q", "__global const half* cache", "__global const int* pos",
              "__global const int* slot", "int n_head", "int n_head_kv", "int n_ctx", "int kv_pad", "float scale",
              "__local float* lane_sum", "__local float4* lane_acc"};
  k.helpers = "#define HD4 " + std::to_string(head_dim / 4) + "  // slices per head\n";
  k.body = R"(  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int h = get_group_id(0);
  const int t = get_global_id(1);
  const int end = min(kv_pad, pos[t] + 1);  // positions past the token's own are masked
  const int g = h / (n_head / n_head_kv);
  const size_t hd = HD4 * 4;
  __global const half* kc = cache + (((size_t)slot[t] * 2 * n_head_kv + g) * n_ctx) * hd;
  __global const half* vc = kc + (size_t)n_head_kv * n_ctx * hd;
  __global const half* qp = q + ((size_t)t * n_head + h) * hd;
  float4 qv[HD4], acc[HD4];
  for (int i = 0; i < HD4; ++i) {
    qv[i] = vload_half4(i, qp);
    acc[i] = (float4)(0.0f);
  }
  float m = -INFINITY, l = 0.0f;
  for (int p = lid; p < end; p += lsz) {
    __global const half* kr = kc + (size_t)p * hd;
    float sc = 0.0f;
    for (int i = 0; i < HD4; ++i) sc += dot(qv[i], vload_half4(i, kr));
    sc *= scale;
    const float m_new = fmax(m, sc);
    const float corr = exp(m - m_new);  // 0 on the lane's first position (m = -inf)
    const float e = exp(sc - m_new);
    l = l * corr + e;
    __global const half* vr = vc + (size_t)p * hd;
    for (int i = 0; i < HD4; ++i) acc[i] = acc[i] * corr + e * vload_half4(i, vr);
    m = m_new;
  }
  lane_sum[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  float mx = -INFINITY;
  for (int j = 0; j < lsz; ++j) mx = fmax(mx, lane_sum[j]);
  const float f = m == -INFINITY ? 0.0f : exp(m - mx);  // a lane without positions adds nothing
  barrier(CLK_LOCAL_MEM_FENCE);  // every lane has read the maxima
  lane_sum[lid] = l * f;
  for (int i = 0; i < HD4; ++i) lane_acc[lid * HD4 + i] = acc[i] * f;
  barrier(CLK_LOCAL_MEM_FENCE);
  float total = 0.0f;
  for (int j = 0; j < lsz; ++j) total += lane_sum[j];
  const float inv = 1.0f / total;  // > 0: position 0 is never masked
  for (int i = lid; i < HD4; i += lsz) {
    float4 o = (float4)(0.0f);
    for (int j = 0; j < lsz; ++j) o += lane_acc[j * HD4 + i];
    $out.Write(o * inv, t, 0, h * HD4 + i);
  }
)";
  return k;
}

// ---- Exact kernels (ops.h: the CPU engine's arithmetic) ----

KernelTemplate rms_norm_exact_template(TensorFormat src, TensorFormat weight, TensorFormat dst) {
  KernelTemplate k;
  k.name = "rms_norm_exact";
  k.tensors = {{"src", src, Access::kRead}, {"weight", weight, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"float eps", "__local float* scratch"};
  k.helpers = kExactHelpers;
  // One lane sums the row: the order of a double sum matters as much as a float one's.
  k.body = std::string(kRowPrologue) + R"(  if (lid == 0) {
    double sum = 0.0;  // ops::rms_norm: float squares, summed in double in channel order
    for (int s = 0; s < n_s; ++s) {
      const float4 v = $src.Read(x, y, s, b);  // padding lanes add +0
      sum += (double)(v.x * v.x);
      sum += (double)(v.y * v.y);
      sum += (double)(v.z * v.z);
      sum += (double)(v.w * v.w);
    }
    const float mean = (float)(sum / (double)$src.Channels());
    scratch[0] = inferd_div(1.0f, inferd_sqrt(mean + eps));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const float scale = scratch[0];
  for (int s = lid; s < n_s; s += lsz) {
    $dst.Write($src.Read(x, y, s, b) * scale * $weight.Read(0, 0, s), x, y, s, b);
  }
)";
  return k;
}

// Launched as (T, K / 32): a work-item per block (kernels/cpu/scalar.cpp quantize_q8_1).
KernelTemplate quantize_q8_template(TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = "quantize_q8";
  k.tensors = {{"x", src, Access::kRead}, {"quants", dst, Access::kWrite}};
  k.params = {"__global float2* scales"};
  k.helpers = kExactHelpers;
  k.body = R"(  const int t = get_global_id(0);
  const int blk = get_global_id(1);
  float4 v[8];
  float amax = 0.0f;
  for (int j = 0; j < 8; ++j) {
    v[j] = $x.Read(t, 0, 8 * blk + j);
    const float4 a = fabs(v[j]);
    amax = fmax(fmax(fmax(fmax(amax, a.x), a.y), a.z), a.w);
  }
  const float id = amax != 0.0f ? inferd_div(127.0f, amax) : 0.0f;
  const float d = inferd_div(amax, 127.0f);
  float sum = 0.0f;  // of integers, below 2^13: exact
  for (int j = 0; j < 8; ++j) {
    const float4 q = rint(v[j] * id);  // to nearest even, as nearbyint
    sum += (q.x + q.y) + (q.z + q.w);
    $quants.Write(q, t, 0, 8 * blk + j);
  }
  scales[t * ($x.Channels() / 32) + blk] = (float2)(inferd_round_half(d), inferd_round_half(d * sum));
)";
  return k;
}

// w_int() / w_int8(): the integer quants of the 4 rows of block `blk` (so * blocks + b) at its slice l,
// as floats (IntDot::kFloat) or as char4 (kInt8): the signed values, or the codes of the types with a min.
std::string weight_int_loader(DType type, IntDot form) {
  const bool int8 = form == IntDot::kInt8;
  const std::string vec = int8 ? "char4" : "float4";
  const std::string signature = std::string("inline void ") + (int8 ? "w_int8" : "w_int") + "(__global const " +
                                weight_pointer_type(type) + "* wq, __global const " + high_bits_type(type) +
                                "* wh, int blk, int l, " + vec +
                                "* r) {\n";
  switch (type) {
    case DType::kQ8_0: {
      const std::string cvt = int8 ? "" : "convert_float4";  // stored as char4 already
      std::string body = signature + "  const int base = (blk * 8 + l) * 4;\n";
      for (int r = 0; r < 4; ++r) {
        body += "  r[" + std::to_string(r) + "] = " + cvt + "(wq[base + " + std::to_string(r) + "]);\n";
      }
      return body + "}\n";
    }
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:    // the signed values
    case DType::kQ5_1: {  // the codes
      const int zero = code_zero(type);
      const std::string offset = zero == 0 ? "" : int8 ? " - (char4)(" + std::to_string(zero) + ")"
                                                        : " - " + std::to_string(zero) + ".0f";
      std::string body = signature + "  const ushort4 p = wq[blk * 8 + l];\n";
      body += load_high_bits(type, "blk * 8 + l");
      for (int r = 0; r < 4; ++r) body += "  r[" + std::to_string(r) + "] = " + packed_codes(type, form, r) + offset + ";\n";
      return body + "}\n";
    }
    default: return "";
  }
}

// The int8 form of the block types' integer dots (IntDot::kInt8), with w_int8() (weight_int_loader):
// inferd_idot() is cl_khr_integer_dot_product's dot(char4, char4) where the host saw the device
// report 4x8-bit inputs (INFERD_NATIVE_IDOT, defined by the generator; the extension alone may offer
// only the packed form), else the same sum in int arithmetic.
constexpr const char* kIntDotHelpers = R"(#ifdef INFERD_NATIVE_IDOT
#pragma OPENCL EXTENSION cl_khr_integer_dot_product : enable
inline int inferd_idot(char4 a, char4 b) { return dot(a, b); }
#else
inline int inferd_idot(char4 a, char4 b) {
  const int4 p = convert_int4(a) * convert_int4(b);
  return (p.x + p.y) + (p.z + p.w);
}
#endif
// The 4 nibbles of v, lowest first, as char4.
inline char4 inferd_nibbles_c(ushort v) {
  const uint u = v;
  return convert_char4((uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12));
}
)";

// The block types' slice dot, as the matmul bodies spell it: WVEC r[4]; W_SLICE(wq, blk, l, r);
// XVEC xv = X_SLICE(quants); IDOT(r[i], xv) is the float of the integer dot.
std::string int_dot_macros(IntDot mode) {
  if (mode == IntDot::kInt8) {
    return "#define WVEC char4\n#define XVEC char4\n#define W_SLICE(wq, blk, l, r) w_int8(wq, wh, blk, l, r)\n"
           "#define X_SLICE(v) convert_char4(v)\n#define IDOT(w, x) ((float)inferd_idot(w, x))\n";
  }
  return "#define WVEC float4\n#define XVEC float4\n#define W_SLICE(wq, blk, l, r) w_int(wq, wh, blk, l, r)\n"
         "#define X_SLICE(v) (v)\n#define IDOT(w, x) dot(w, x)\n";
}

KernelTemplate matmul_exact_k_template(DType type, CpuOrder order, int tokens_per_item, TensorFormat x, TensorFormat y);

// The exact matmul. A work-item computes output slice so (4 rows) for TT tokens; the launch is
// (S_O, ceil(T / TT)), tokens past T read the last token (in bounds) and are not written.
//
// 32-element block types (Q8_0, Q4_0, Q5_0 against Q8_0; Q4_1, Q5_1 against Q8_1), kX86
// (dot_signed_q8_0, dot_unsigned_q8_1): per row 8 lanes; lane l of block b adds
// fma(d_w * d_a, isum, acc) where isum, the integer dot of the block's elements 4l..4l+3 (slice l;
// weights as signed values, or as codes for the types with a min), is computed by dot() in float:
// every product and partial sum is an integer below 2^24, so any order gives it exactly. Then hsum,
// and for Q4_1 / Q5_1 the min chain fma(m_w, s_a, acc_min) added last.
// The same, kScalar (scalar dot_x_q8_0 / dot_x_q8_1): sum += (d_w * d_a) * isum (+ m_w * s_a) per block.
// F32 / F16 / BF16: the float input, as dot_float (kX86) or dot_float_weights (kScalar).
// K-quants: matmul_exact_k_template.
KernelTemplate matmul_exact_template(DType type, CpuOrder order, int tokens_per_item, TensorFormat x, TensorFormat y,
                                     IntDot int_dot, bool native_int_dot) {
  if (is_k_quant(type)) return matmul_exact_k_template(type, order, tokens_per_item, x, y);
  KernelTemplate k;
  k.name = "matmul_exact";
  k.tensors = {{"x", x, Access::kRead}, {"y", y, Access::kWrite}};
  k.params = weight_params(type);
  k.params.push_back("__global const float2* xs");
  const bool blocks = matmul_activations(type) == MatmulActivations::kQ8;
  const bool q4_1 = has_min(type);  // a min term
  k.helpers = "#define TT " + std::to_string(tokens_per_item) + "  // tokens per work-item\n" + kExactHelpers +
              kMatmulHelpers;
  if (!blocks) {
    k.helpers += weight_loader(type);
  } else if (int_dot == IntDot::kInt8) {
    k.helpers += std::string(native_int_dot ? "#define INFERD_NATIVE_IDOT 1\n" : "") + kIntDotHelpers +
                 weight_int_loader(type, int_dot) + int_dot_macros(int_dot);
  } else {
    k.helpers += weight_int_loader(type, int_dot) + int_dot_macros(int_dot);
  }
  std::string body = R"(  const int so = get_global_id(0);
  const int t0 = get_global_id(1) * TT;
  const int n_t = $x.Width();
  int tt[TT];
  for (int i = 0; i < TT; ++i) tt[i] = min(t0 + i, n_t - 1);
)";
  if (blocks && order == CpuOrder::kX86) {
    body += R"(  const int n_b = $x.Slices() / 8;
  float acc[TT][4][8];
  float4 acc_min[TT];
  for (int i = 0; i < TT; ++i) {
    acc_min[i] = (float4)(0.0f);
    for (int r = 0; r < 4; ++r) {
      for (int l = 0; l < 8; ++l) acc[i][r][l] = 0.0f;
    }
  }
  for (int b = 0; b < n_b; ++b) {
    const int blk = so * n_b + b;
    float4 sc[TT];
    for (int i = 0; i < TT; ++i) sc[i] = ws[blk] * xs[tt[i] * n_b + b].x;  // d_w * d_a, per row
    for (int l = 0; l < 8; ++l) {
      WVEC r[4];
      W_SLICE(wq, blk, l, r);
      for (int i = 0; i < TT; ++i) {
        const XVEC xv = X_SLICE($x.Read(tt[i], 0, 8 * b + l));
        acc[i][0][l] = fma(sc[i].x, IDOT(r[0], xv), acc[i][0][l]);
        acc[i][1][l] = fma(sc[i].y, IDOT(r[1], xv), acc[i][1][l]);
        acc[i][2][l] = fma(sc[i].z, IDOT(r[2], xv), acc[i][2][l]);
        acc[i][3][l] = fma(sc[i].w, IDOT(r[3], xv), acc[i][3][l]);
      }
    }
)";
    if (q4_1) {
      body += "    for (int i = 0; i < TT; ++i) acc_min[i] = fma(wm[blk], (float4)(xs[tt[i] * n_b + b].y), acc_min[i]);\n";
    }
    body += R"(  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) {
    float4 o;
    o.x = inferd_hsum8(vload4(0, acc[i][0]), vload4(1, acc[i][0]));
    o.y = inferd_hsum8(vload4(0, acc[i][1]), vload4(1, acc[i][1]));
    o.z = inferd_hsum8(vload4(0, acc[i][2]), vload4(1, acc[i][2]));
    o.w = inferd_hsum8(vload4(0, acc[i][3]), vload4(1, acc[i][3]));
)";
    body += q4_1 ? "    $y.Write(o + acc_min[i], t0 + i, 0, so);\n  }\n" : "    $y.Write(o, t0 + i, 0, so);\n  }\n";
  } else if (blocks) {
    body += R"(  const int n_b = $x.Slices() / 8;
  float4 sum[TT];
  for (int i = 0; i < TT; ++i) sum[i] = (float4)(0.0f);
  for (int b = 0; b < n_b; ++b) {
    const int blk = so * n_b + b;
    float4 isum[TT];
    for (int i = 0; i < TT; ++i) isum[i] = (float4)(0.0f);
    for (int l = 0; l < 8; ++l) {
      WVEC r[4];
      W_SLICE(wq, blk, l, r);
      for (int i = 0; i < TT; ++i) {
        const XVEC xv = X_SLICE($x.Read(tt[i], 0, 8 * b + l));
        isum[i] += (float4)(IDOT(r[0], xv), IDOT(r[1], xv), IDOT(r[2], xv), IDOT(r[3], xv));  // integers: exact
      }
    }
    for (int i = 0; i < TT; ++i) {
      const float2 a = xs[tt[i] * n_b + b];
)";
    body += q4_1 ? "      sum[i] = sum[i] + (ws[blk] * a.x * isum[i] + wm[blk] * a.y);\n"
                 : "      sum[i] = sum[i] + ws[blk] * a.x * isum[i];\n";
    body += R"(    }
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) $y.Write(sum[i], t0 + i, 0, so);
)";
  } else if (order == CpuOrder::kX86) {
    // dot_float: acc0 = (a0, a1) and acc1 = (a2, a3), 8 lanes each, over steps of 16 elements.
    body += R"(  const int k = $x.Channels();
  const int n_si = $x.Slices();
  float4 a0[TT][4], a1[TT][4], a2[TT][4], a3[TT][4];
  for (int i = 0; i < TT; ++i) {
    for (int r = 0; r < 4; ++r) a0[i][r] = a1[i][r] = a2[i][r] = a3[i][r] = (float4)(0.0f);
  }
  int e = 0;
  for (; e + 16 <= k; e += 16) {
    const int s = e / 4;
    float4 w0[4], w1[4], w2[4], w3[4];
    w_load(wq, ws, wm, wsub, wh, so, s, n_si, w0);
    w_load(wq, ws, wm, wsub, wh, so, s + 1, n_si, w1);
    w_load(wq, ws, wm, wsub, wh, so, s + 2, n_si, w2);
    w_load(wq, ws, wm, wsub, wh, so, s + 3, n_si, w3);
    for (int i = 0; i < TT; ++i) {
      const float4 x0 = $x.Read(tt[i], 0, s), x1 = $x.Read(tt[i], 0, s + 1);
      const float4 x2 = $x.Read(tt[i], 0, s + 2), x3 = $x.Read(tt[i], 0, s + 3);
      for (int r = 0; r < 4; ++r) {
        a0[i][r] = fma(w0[r], x0, a0[i][r]);
        a1[i][r] = fma(w1[r], x1, a1[i][r]);
        a2[i][r] = fma(w2[r], x2, a2[i][r]);
        a3[i][r] = fma(w3[r], x3, a3[i][r]);
      }
    }
  }
  if (e + 8 <= k) {
    const int s = e / 4;
    float4 w0[4], w1[4];
    w_load(wq, ws, wm, wsub, wh, so, s, n_si, w0);
    w_load(wq, ws, wm, wsub, wh, so, s + 1, n_si, w1);
    for (int i = 0; i < TT; ++i) {
      const float4 x0 = $x.Read(tt[i], 0, s), x1 = $x.Read(tt[i], 0, s + 1);
      for (int r = 0; r < 4; ++r) {
        a0[i][r] = fma(w0[r], x0, a0[i][r]);
        a1[i][r] = fma(w1[r], x1, a1[i][r]);
      }
    }
    e += 8;
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) {
    float o[4];
    for (int r = 0; r < 4; ++r) o[r] = inferd_hsum8(a0[i][r] + a2[i][r], a1[i][r] + a3[i][r]);
    for (int f = e; f < k; ++f) {  // the last k % 8 products, one fma each (GCC contracts the tail)
      float4 w[4];
      w_load(wq, ws, wm, wsub, wh, so, f / 4, n_si, w);
      const float xf = inferd_lane($x.Read(tt[i], 0, f / 4), f % 4);
      for (int r = 0; r < 4; ++r) o[r] = fma(inferd_lane(w[r], f % 4), xf, o[r]);
    }
    $y.Write((float4)(o[0], o[1], o[2], o[3]), t0 + i, 0, so);
  }
)";
  } else {
    body += R"(  const int k = $x.Channels();
  const int n_si = $x.Slices();
  float4 sum[TT];
  for (int i = 0; i < TT; ++i) sum[i] = (float4)(0.0f);
  for (int s = 0; s < n_si; ++s) {
    float4 w[4];
    w_load(wq, ws, wm, wsub, wh, so, s, n_si, w);
    const int n = min(4, k - 4 * s);
    for (int i = 0; i < TT; ++i) {
      const float4 xv = $x.Read(tt[i], 0, s);
      for (int c = 0; c < n; ++c) {
        const float4 column = (float4)(inferd_lane(w[0], c), inferd_lane(w[1], c), inferd_lane(w[2], c),
                                       inferd_lane(w[3], c));
        sum[i] = sum[i] + column * inferd_lane(xv, c);
      }
    }
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) $y.Write(sum[i], t0 + i, 0, so);
)";
  }
  k.body = body;
  return k;
}

// w_code(): the integer codes of the 4 rows at slice l of 32-element group g (so * G + group).
std::string weight_code_loader(DType type) {
  std::string body = std::string("inline void w_code(__global const ") + weight_pointer_type(type) +
                     "* wq, __global const " + high_bits_type(type) + "* wh, int g, int l, int4* r) {\n" +
                     "  const ushort4 p = wq[g * 8 + l];\n" +
                     load_high_bits(type, "g * 8 + l");
  for (int r = 0; r < 4; ++r) {
    body += "  r[" + std::to_string(r) + "] = convert_int4(" + codes_u(type, r) + ");\n";
  }
  return body + "}\n";
}

// The exact matmul of K-quant weights against quantize_q8_k()'s blocks (`xk`: d_a and the 16 sums
// bsum_g of 16 quants a), per 256-element super-block of a row, the integers exact (int):
//   sumi_l = sum over the 8 groups s of 32 of sc(s, l) * sum_{e = 4l..4l+3} q[32s + e] * a[32s + e],
//            l = 0..7, with the unsigned codes q (Q6_K: value + 32) and sc(s, l) = sc_s for Q4_K / Q5_K,
//            the scale of the 16 elements that hold them for Q6_K (scales[2s + l / 4]);
//   p_j    = mn_2j * (bsum_4j + bsum_4j+1) + mn_2j+1 * (bsum_4j+2 + bsum_4j+3), j = 0..3 (Q4_K, Q5_K);
//   off_l  = 32 * (sc_2l * bsum_2l + sc_2l+1 * bsum_2l+1) (Q6_K: the -32 of the values).
// kX86 (x86_kernels.inc), per super-block:
//   Q4_K / Q5_K (dot_k_min, k_min_float_step): acc_l = fma(d_a * d, (float)sumi_l, acc_l); with
//     neg = -(d_a * dmin), Q4_K accm_j = fma(neg, (float)p_j, accm_j), Q5_K summs = fma(neg,
//     (float)(p_0 + p_1 + p_2 + p_3), summs); at the end (k_min_result) y = hsum(acc) +
//     ((accm_0 + accm_2) + (accm_1 + accm_3)), resp. y = hsum(acc) + summs.
//   Q6_K (dot_q6_k_nr, q6_k_float_step): acc_l = fma(d * d_a, (float)(sumi_l - off_l), acc_l); y = hsum(acc).
// kScalar (scalar.cpp dot_kq_min, dot_q6_k), with isum = sum_l sumi_l:
//   Q4_K / Q5_K: y = y + d_a * (d * (float)isum - dmin * (float)(p_0 + p_1 + p_2 + p_3))
//   Q6_K:        y = y + (d * d_a) * (float)(isum - sum_l off_l)
// (float)n of an int rounds to nearest even in both: Q6_K's totals may pass 2^24.
KernelTemplate matmul_exact_k_template(DType type, CpuOrder order, int tokens_per_item, TensorFormat x, TensorFormat y) {
  KernelTemplate k;
  k.name = "matmul_exact_k";
  k.tensors = {{"x", x, Access::kRead}, {"y", y, Access::kWrite}};
  k.params = weight_params(type);
  k.params.push_back("__global const float* xk");
  const bool q6 = type == DType::kQ6_K;
  const bool x86 = order == CpuOrder::kX86;
  k.helpers = "#define TT " + std::to_string(tokens_per_item) + "  // tokens per work-item\n" +
              "#define Q8K_FLOATS " + std::to_string(kQ8KBlockFloats) + "\n" + kExactHelpers + kMatmulHelpers +
              weight_code_loader(type) + R"(inline int inferd_idot(int4 a, int4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
inline int inferd_ilane(int4 v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
)";
  std::string body = R"(  const int so = get_global_id(0);
  const int t0 = get_global_id(1) * TT;
  const int n_t = $x.Width();
  int tt[TT];
  for (int i = 0; i < TT; ++i) tt[i] = min(t0 + i, n_t - 1);
  const int n_b = $x.Slices() / 64;  // super-blocks per row
  float acc[TT][4][8];   // kX86: the 8 lanes per row
  float accm[TT][4][4];  // kX86 Q4_K: the min lanes
  float sum[TT][4];      // kX86 Q5_K: the min chain; kScalar: the row's sum
  for (int i = 0; i < TT; ++i) {
    for (int r = 0; r < 4; ++r) {
      sum[i][r] = 0.0f;
      for (int l = 0; l < 8; ++l) acc[i][r][l] = 0.0f;
      for (int j = 0; j < 4; ++j) accm[i][r][j] = 0.0f;
    }
  }
  for (int b = 0; b < n_b; ++b) {
    const int blk = so * n_b + b;
    int sumi[TT][4][8];
    for (int i = 0; i < TT; ++i) {
      for (int r = 0; r < 4; ++r) {
        for (int l = 0; l < 8; ++l) sumi[i][r][l] = 0;
      }
    }
    for (int s = 0; s < 8; ++s) {
      for (int l = 0; l < 8; ++l) {
        int4 w[4];
        w_code(wq, wh, blk * 8 + s, l, w);
)";
  body += q6 ? "        const int4 sc = convert_int4(wsub[blk * 16 + 2 * s + l / 4]);\n"
             : "        const int4 sc = convert_int4(wsub[blk * 16 + s]);\n";
  body += R"(        for (int i = 0; i < TT; ++i) {
          const int4 a = convert_int4($x.Read(tt[i], 0, 64 * b + 8 * s + l));
          sumi[i][0][l] += sc.x * inferd_idot(w[0], a);
          sumi[i][1][l] += sc.y * inferd_idot(w[1], a);
          sumi[i][2][l] += sc.z * inferd_idot(w[2], a);
          sumi[i][3][l] += sc.w * inferd_idot(w[3], a);
        }
      }
    }
    int4 ssc[16];  // Q4_K / Q5_K: sc_0..7, mn_0..7; Q6_K: the 16 scales
    for (int g = 0; g < 16; ++g) ssc[g] = convert_int4(wsub[blk * 16 + g]);
    const float4 d = ws[blk];
)";
  if (!q6) body += "    const float4 dmin = wm[blk];\n";
  body += R"(    for (int i = 0; i < TT; ++i) {
      __global const float* xb = xk + (tt[i] * n_b + b) * Q8K_FLOATS;
      const float da = xb[0];
      int bs[16];
      for (int g = 0; g < 16; ++g) bs[g] = (int)xb[1 + g];
      for (int r = 0; r < 4; ++r) {
        const float dr = inferd_lane(d, r);
)";
  if (q6) {
    body += R"(        int off[8];
        for (int l = 0; l < 8; ++l) {
          off[l] = 32 * (inferd_ilane(ssc[2 * l], r) * bs[2 * l] + inferd_ilane(ssc[2 * l + 1], r) * bs[2 * l + 1]);
        }
)";
    body += x86 ? R"(        const float scale = dr * da;
        for (int l = 0; l < 8; ++l) acc[i][r][l] = fma(scale, (float)(sumi[i][r][l] - off[l]), acc[i][r][l]);
)"
                : R"(        int isum = 0;
        for (int l = 0; l < 8; ++l) isum += sumi[i][r][l] - off[l];
        sum[i][r] = sum[i][r] + (dr * da) * (float)isum;
)";
  } else {
    body += R"(        int p[4];
        for (int j = 0; j < 4; ++j) {
          p[j] = inferd_ilane(ssc[8 + 2 * j], r) * (bs[4 * j] + bs[4 * j + 1]) +
                 inferd_ilane(ssc[9 + 2 * j], r) * (bs[4 * j + 2] + bs[4 * j + 3]);
        }
)";
    if (!x86) {
      body += R"(        int isum = 0;
        for (int l = 0; l < 8; ++l) isum += sumi[i][r][l];
        const float msum = (float)(p[0] + p[1] + p[2] + p[3]);
        sum[i][r] = sum[i][r] + da * (dr * (float)isum - inferd_lane(dmin, r) * msum);
)";
    } else {
      body += "        const float neg = -(da * inferd_lane(dmin, r));\n";
      body += type == DType::kQ4_K
                  ? "        for (int j = 0; j < 4; ++j) accm[i][r][j] = fma(neg, (float)p[j], accm[i][r][j]);\n"
                  : "        sum[i][r] = fma(neg, (float)(p[0] + p[1] + p[2] + p[3]), sum[i][r]);\n";
      body += R"(        const float scale = da * dr;
        for (int l = 0; l < 8; ++l) acc[i][r][l] = fma(scale, (float)sumi[i][r][l], acc[i][r][l]);
)";
    }
  }
  body += R"(      }
    }
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) {
    float o[4];
    for (int r = 0; r < 4; ++r) {
)";
  if (!x86) {
    body += "      o[r] = sum[i][r];\n";
  } else if (q6) {
    body += "      o[r] = inferd_hsum8(vload4(0, acc[i][r]), vload4(1, acc[i][r]));\n";
  } else if (type == DType::kQ4_K) {
    body += "      o[r] = inferd_hsum8(vload4(0, acc[i][r]), vload4(1, acc[i][r])) +\n"
            "             ((accm[i][r][0] + accm[i][r][2]) + (accm[i][r][1] + accm[i][r][3]));\n";
  } else {
    body += "      o[r] = inferd_hsum8(vload4(0, acc[i][r]), vload4(1, acc[i][r])) + sum[i][r];\n";
  }
  body += R"(    }
    $y.Write((float4)(o[0], o[1], o[2], o[3]), t0 + i, 0, so);
  }
)";
  k.body = body;
  return k;
}

// Launched as (T, K / 256): a work-item per block (kernels/cpu/scalar.cpp quantize_q8_k).
KernelTemplate quantize_q8_k_template(TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = "quantize_q8_k";
  k.tensors = {{"x", src, Access::kRead}, {"quants", dst, Access::kWrite}};
  k.params = {"__global float* blocks"};
  k.helpers = std::string("#define Q8K_FLOATS ") + std::to_string(kQ8KBlockFloats) + "\n" + kExactHelpers;
  k.body = R"(  const int t = get_global_id(0);
  const int blk = get_global_id(1);
  __global float* out = blocks + (t * ($x.Channels() / 256) + blk) * Q8K_FLOATS;
  float amax = 0.0f, mx = 0.0f;  // the first element of largest magnitude, and it with its sign
  for (int j = 0; j < 64; ++j) {
    const float4 v = $x.Read(t, 0, 64 * blk + j);
    for (int c = 0; c < 4; ++c) {
      const float e = inferd_lane(v, c);
      if (fabs(e) > amax) {
        amax = fabs(e);
        mx = e;
      }
    }
  }
  const float iscale = amax != 0.0f ? inferd_div(-127.0f, mx) : 0.0f;
  for (int g = 0; g < 16; ++g) {
    float bsum = 0.0f;  // of integers below 2^12: exact
    for (int j = 0; j < 4; ++j) {
      // nearest_int(iscale * x) is rint (the 1.5 * 2^23 trick rounds to even), clamped at 127.
      const float4 q = fmin(rint($x.Read(t, 0, 64 * blk + 4 * g + j) * iscale), 127.0f) + 0.0f;
      bsum += (q.x + q.y) + (q.z + q.w);
      $quants.Write(q, t, 0, 64 * blk + 4 * g + j);
    }
    out[1 + g] = bsum;
  }
  out[0] = amax != 0.0f ? inferd_div(1.0f, iscale) : 0.0f;
)";
  return k;
}

// q.k of one position as kernels::dot_f32_f16 computes it. The products of halves are exact in
// float, so fma and a * b + c agree; only the order of the sums matters.
std::string qk_helper(CpuOrder order) {
  if (order == CpuOrder::kScalar) {
    return R"(inline float inferd_qk(const float4* qv, __global const half* kr) {
  float sum = 0.0f;
  for (int s = 0; s < HD4; ++s) {
    const float4 p = qv[s] * vload_half4(s, kr);
    sum = (((sum + p.x) + p.y) + p.z) + p.w;
  }
  return sum;
}
)";
  }
  return R"(// dot_f32_with: two accumulators of 8 lanes over steps of 16, an 8-element step into the first,
// hsum of their sum, then the last 4 products (head_dim % 8 == 4) one by one.
inline float inferd_qk(const float4* qv, __global const half* kr) {
  float4 a0 = (float4)(0.0f), a1 = (float4)(0.0f), a2 = (float4)(0.0f), a3 = (float4)(0.0f);
  int s = 0;
  for (; s + 4 <= HD4; s += 4) {
    a0 = fma(qv[s], vload_half4(s, kr), a0);
    a1 = fma(qv[s + 1], vload_half4(s + 1, kr), a1);
    a2 = fma(qv[s + 2], vload_half4(s + 2, kr), a2);
    a3 = fma(qv[s + 3], vload_half4(s + 3, kr), a3);
  }
  if (s + 2 <= HD4) {
    a0 = fma(qv[s], vload_half4(s, kr), a0);
    a1 = fma(qv[s + 1], vload_half4(s + 1, kr), a1);
    s += 2;
  }
  float sum = inferd_hsum8(a0 + a2, a1 + a3);
  if (s < HD4) {
    const float4 p = qv[s] * vload_half4(s, kr);
    sum = (((sum + p.x) + p.y) + p.z) + p.w;
  }
  return sum;
}
)";
}

// Launched as (lanes * n_head, tokens of this launch) in work-groups of (lanes, 1): a group per
// (token, head), as ops::attention_head. The scores of the group's positions go to `scores` (its
// own row of kv_pad floats), become exponentials and then half-rounded probabilities in place; the
// lanes split the positions for q.k and the exponentials, 16-position chunks for their sums (lane 0
// adding the chunk sums in double in order, `lanes` chunks a round), and (chain, d) pairs for KQV.
KernelTemplate attention_exact_template(int32_t head_dim, CpuOrder order, TensorFormat out) {
  KernelTemplate k;
  k.name = "attention_exact";
  k.tensors = {{"out", out, Access::kWrite}};
  k.params = {"__global const half* q",  "__global const half* cache", "__global const int* pos",
              "__global const int* slot", "int first_token",            "int n_head",
              "int n_head_kv",            "int n_ctx",                  "int kv_pad",
              "float scale",              "__global float* scores",     "__local float* scratch",
              "__local float* chains"};
  k.helpers = "#define HD4 " + std::to_string(head_dim / 4) + "  // slices per head\n" + kExactHelpers +
              qk_helper(order);
  k.body = R"(  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int h = get_group_id(0);
  const int tl = get_group_id(1);
  const int t = first_token + tl;
  const int n_kv = pos[t] + 1;  // positions past the token's own are masked
  const int g = h / (n_head / n_head_kv);
  const size_t hd = HD4 * 4;
  __global const half* kc = cache + (((size_t)slot[t] * 2 * n_head_kv + g) * n_ctx) * hd;
  __global const half* vc = kc + (size_t)n_head_kv * n_ctx * hd;
  __global const half* qp = q + ((size_t)t * n_head + h) * hd;
  __global float* sc = scores + ((size_t)tl * n_head + h) * kv_pad;
  float4 qv[HD4];
  for (int i = 0; i < HD4; ++i) qv[i] = vload_half4(i, qp);
  float m = -INFINITY;
  for (int p = lid; p < n_kv; p += lsz) {
    const float s = inferd_qk(qv, kc + (size_t)p * hd) * scale;
    sc[p] = s;
    m = fmax(m, s);
  }
  scratch[lid] = m;
)" + reduce_code("fmax") + R"(  const float mx = scratch[0];
  // Every lane has read scratch[0] before it is reused, and every score is visible to every lane.
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  // kernels::exp_sum: 16-position chunks (the last padded with zeros), each reduced as
  // _mm512_reduce_add_ps, the chunk sums added in double in chunk order.
  const int n_chunks = (n_kv + 15) / 16;
  double total = 0.0;  // lane 0's
  for (int first = 0; first < n_chunks; first += lsz) {
    const int c = first + lid;
    float cs = 0.0f;
    if (c < n_chunks) {
      float e[16];
      for (int l = 0; l < 16; ++l) {
        const int p = 16 * c + l;
        e[l] = p < n_kv ? inferd_expf(sc[p] - mx) : 0.0f;
        if (p < n_kv) sc[p] = e[l];
      }
      cs = inferd_reduce16(vload16(0, e));
    }
    scratch[lid] = cs;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
      const int n = min(lsz, n_chunks - first);
      for (int i = 0; i < n; ++i) total += (double)scratch[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) scratch[0] = (float)(1.0 / total);
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  const float inv = scratch[0];
  for (int p = lid; p < n_kv; p += lsz) sc[p] = inferd_round_half(sc[p] * inv);  // as llama.cpp before KQV
  barrier(CLK_GLOBAL_MEM_FENCE);
  // KQV: chain i of dimension d sums positions j = i (mod 16) in order (tinyBLAS's 16 lanes); the
  // products of two halves are exact.
  for (int c = lid; c < 16 * HD4 * 4; c += lsz) {
    const int i = c / (HD4 * 4), d = c % (HD4 * 4);
    float acc = 0.0f;
    for (int j = i; j < n_kv; j += 16) acc = fma(sc[j], vload_half(d, vc + (size_t)j * hd), acc);
    chains[c] = acc;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = lid; s < HD4; s += lsz) {
    float o[4];
    for (int l = 0; l < 4; ++l) {
      float v[16];
      for (int i = 0; i < 16; ++i) v[i] = chains[i * HD4 * 4 + 4 * s + l];
      o[l] = inferd_reduce16(vload16(0, v));
    }
    $out.Write((float4)(o[0], o[1], o[2], o[3]), t, 0, h * HD4 + s);
  }
)";
  return k;
}

size_t floor_pow2(size_t v) {
  size_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// Bytes of a buffer (kInvalidArgument for nullptr), for checking the caller's buffers' sizes.
Result<size_t> buffer_bytes(cl_mem mem, const char* what) {
  if (mem == nullptr) return make_error(Code::kInvalidArgument, "%s: no buffer", what);
  size_t bytes = 0;
  INFERD_CL_RETURN_IF_ERROR(clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof(bytes), &bytes, nullptr));
  return bytes;
}

Status require_bytes(cl_mem mem, size_t needed, const char* what) {
  auto bytes = buffer_bytes(mem, what);
  if (!bytes) return bytes.status();
  if (bytes.value() < needed) {
    return make_error(Code::kInvalidArgument, "%s: a buffer of %zu bytes, %zu needed", what, bytes.value(), needed);
  }
  return Status::ok();
}

bool is_token_rows(const Bhwc& s) { return s.b == 1 && s.h == 1; }

Status require_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() == b.shape()) return Status::ok();
  return make_error(Code::kInvalidArgument, "%s: shapes %s and %s differ", op, a.shape().to_string().c_str(),
                    b.shape().to_string().c_str());
}

// One weight block as the kernels read it (ops.h's layouts): the codes of its elements in order,
// its scale d, its min (Q4_1, Q5_1) or min scale dmin (Q4_K, Q5_K), and a K-quant's sub-block scales.
struct DecodedBlock {
  int codes[256];
  float d = 0.0f, m = 0.0f;
  int8_t sub[16] = {};
};

template <typename Block>
Block read_block(const unsigned char* p) {
  Block b;
  std::memcpy(&b, p, sizeof(b));
  return b;
}

// Q5_0 / Q5_1: nibble | fifth bit << 4, element j < 16 the low nibble of qs[j], else the high of qs[j - 16].
template <typename Block>
void decode_q5(const Block& b, int offset, int* codes) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof(qh));
  for (int j = 0; j < 16; ++j) {
    codes[j] = static_cast<int>((b.qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - offset;
    codes[j + 16] = static_cast<int>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset;
  }
}

// Q4_K / Q5_K: the 8 six-bit scales into sub[0..7] and mins into sub[8..15] (ggml's get_scale_min_k4).
void decode_k4_scales(const uint8_t* q, int8_t* sub) {
  for (int j = 0; j < 8; ++j) {
    const int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    const int mn = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    sub[j] = static_cast<int8_t>(sc);
    sub[8 + j] = static_cast<int8_t>(mn);
  }
}

// Q4_K / Q5_K (qh: Q5_K's fifth bits, else null): chunk c of 32 bytes holds group 2c in its low
// nibbles and group 2c + 1 in its high nibbles, whose fifth bits are bits 2c and 2c + 1 of qh[l].
template <typename Block>
void decode_k_min(const Block& b, const uint8_t* qh, DecodedBlock& out) {
  out.d = kernels::fp16_to_fp32(b.d);
  out.m = kernels::fp16_to_fp32(b.dmin);
  decode_k4_scales(b.scales, out.sub);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int h0 = qh != nullptr ? ((qh[l] >> (2 * c)) & 1) << 4 : 0;
      const int h1 = qh != nullptr ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
      out.codes[64 * c + l] = (b.qs[32 * c + l] & 0x0F) | h0;
      out.codes[64 * c + 32 + l] = (b.qs[32 * c + l] >> 4) | h1;
    }
  }
}

void decode_block(DType type, const unsigned char* p, DecodedBlock& out) {
  switch (type) {
    case DType::kQ8_0: {
      const auto b = read_block<BlockQ8_0>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      for (int j = 0; j < 32; ++j) out.codes[j] = b.qs[j];
      return;
    }
    case DType::kQ4_0:
    case DType::kQ4_1: {  // element e < 16: the low nibble of qs[e]; else the high nibble of qs[e - 16]
      const uint8_t* qs;
      if (type == DType::kQ4_0) {
        const auto b = read_block<BlockQ4_0>(p);
        out.d = kernels::fp16_to_fp32(b.d);
        qs = p + offsetof(BlockQ4_0, qs);
      } else {
        const auto b = read_block<BlockQ4_1>(p);
        out.d = kernels::fp16_to_fp32(b.d);
        out.m = kernels::fp16_to_fp32(b.m);
        qs = p + offsetof(BlockQ4_1, qs);
      }
      for (int j = 0; j < 16; ++j) {
        out.codes[j] = qs[j] & 0x0F;
        out.codes[j + 16] = qs[j] >> 4;
      }
      return;
    }
    case DType::kQ5_0: {
      const auto b = read_block<BlockQ5_0>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      decode_q5(b, 16, out.codes);
      return;
    }
    case DType::kQ5_1: {
      const auto b = read_block<BlockQ5_1>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      out.m = kernels::fp16_to_fp32(b.m);
      decode_q5(b, 0, out.codes);
      return;
    }
    case DType::kQ4_K: return decode_k_min(read_block<BlockQ4_K>(p), nullptr, out);
    case DType::kQ5_K: {
      const auto b = read_block<BlockQ5_K>(p);
      return decode_k_min(b, b.qh, out);
    }
    case DType::kQ6_K: {  // the codes are the values + 32 (ggml's dequantize_row_q6_K without the - 32)
      const auto b = read_block<BlockQ6_K>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      std::memcpy(out.sub, b.scales, sizeof(out.sub));
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = b.ql + 64 * half;
        const uint8_t* qh = b.qh + 32 * half;
        int* c = out.codes + 128 * half;
        for (int l = 0; l < 32; ++l) {
          c[l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
          c[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
          c[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
          c[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
      }
      return;
    }
    default: INFERD_ASSERT(false, "decode_block: not a block type of the kernels");
  }
}

}  // namespace

// ---- MatmulWeights -------------------------------------------------------------------------------

bool MatmulWeights::supports(DType type) { return weight_pointer_type(type) != nullptr; }

Result<MatmulWeights> MatmulWeights::upload(Runtime& rt, DType type, int64_t rows, int64_t k, const void* data) {
  if (!supports(type)) {
    return make_error(Code::kUnimplemented, "matmul weights of type %s are not supported by the OpenCL backend",
                      dtype_name(type));
  }
  const DTypeInfo* info = dtype_info(type);
  INFERD_ASSERT(info != nullptr);
  if (rows <= 0 || k <= 0 || k % info->block_size != 0 || rows > (int64_t{1} << 30) || k > (int64_t{1} << 30)) {
    return make_error(Code::kInvalidArgument, "matmul weights %lld x %lld of type %s: bad shape",
                      static_cast<long long>(rows), static_cast<long long>(k), dtype_name(type));
  }
  MatmulWeights w;
  w.type_ = type;
  w.rows_ = rows;
  w.k_ = k;
  const int64_t n_so = w.out_slices(), n_si = w.in_slices();
  const size_t row_bytes = dtype_row_bytes(type, k);
  const auto* bytes = static_cast<const unsigned char*>(data);

  auto upload_vector = [&](const auto& host, ClMem& out) -> Status {
    const size_t n = host.size() * sizeof(host[0]);
    auto mem = rt.create_buffer(n, CL_MEM_READ_ONLY, host.data());
    if (!mem) return mem.status();
    out = std::move(mem.value());
    w.device_bytes_ += n;
    return Status::ok();
  };

  if (type == DType::kF32 || type == DType::kF16 || type == DType::kBF16) {
    // [S_O][S_I][O4][I4], zero padded in both dimensions; F16 and BF16 as their 16 bits.
    const size_t n = static_cast<size_t>(n_so * n_si * 16);
    auto element = [&](int64_t r, int64_t c, void* out, size_t size) {
      std::memcpy(out, bytes + static_cast<size_t>(r) * row_bytes + static_cast<size_t>(c) * size, size);
    };
    auto layout = [&](auto zero) {
      std::vector<decltype(zero)> host(n, zero);
      for (int64_t so = 0; so < n_so; ++so) {
        for (int64_t si = 0; si < n_si; ++si) {
          for (int64_t o4 = 0; o4 < 4; ++o4) {
            for (int64_t i4 = 0; i4 < 4; ++i4) {
              const int64_t r = so * 4 + o4, c = si * 4 + i4;
              if (r < rows && c < k) {
                element(r, c, &host[static_cast<size_t>(((so * n_si + si) * 4 + o4) * 4 + i4)], sizeof(zero));
              }
            }
          }
        }
      }
      return host;
    };
    if (type == DType::kF32) {
      INFERD_RETURN_IF_ERROR(upload_vector(layout(0.0f), w.values_));
    } else {
      INFERD_RETURN_IF_ERROR(upload_vector(layout(fp16_t{0}), w.values_));
    }
    return w;
  }

  // Block types, in 32-element groups along k (n_si = 8 * groups); a K-quant block is 8 groups.
  const int64_t n_groups = k / 32;
  const int64_t groups_per_block = info->block_size / 32;
  const int64_t n_blocks = k / info->block_size;
  // Every block type but Q8_0 keeps its codes' low nibbles; the 5- and 6-bit types add a plane of
  // their high bits: per (group, slice of 4) one ushort (bit 4 * row + i) or, for Q6_K, one uint
  // (bits 2 * (4 * row + i) and up).
  const int high_bits = high_bits_per_code(type);
  const bool nibbles = type != DType::kQ8_0;
  const bool k_quant = is_k_quant(type);
  const bool has_mins = type == DType::kQ4_1 || type == DType::kQ5_1 || type == DType::kQ4_K || type == DType::kQ5_K;
  const size_t per_row_block = static_cast<size_t>(n_so * n_blocks) * 4;
  std::vector<float> scales(per_row_block, 0.0f);
  std::vector<float> mins(has_mins ? per_row_block : 0, 0.0f);
  std::vector<int8_t> sub(k_quant ? per_row_block * 16 : 0, 0);
  std::vector<int8_t> q8(nibbles ? 0 : static_cast<size_t>(n_so * n_groups * 8 * 16), 0);
  std::vector<uint16_t> q4(nibbles ? static_cast<size_t>(n_so * n_groups * 8 * 4) : 0, 0);
  std::vector<uint32_t> high(high_bits > 0 ? static_cast<size_t>(n_so * n_groups * 8) : 0, 0);
  DecodedBlock dec;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t so = r / 4, o4 = r % 4;
    const unsigned char* row = bytes + static_cast<size_t>(r) * row_bytes;
    for (int64_t kb = 0; kb < n_blocks; ++kb) {
      const size_t blk = static_cast<size_t>(so * n_blocks + kb);
      decode_block(type, row + static_cast<size_t>(kb) * info->block_bytes, dec);
      scales[blk * 4 + static_cast<size_t>(o4)] = dec.d;
      if (has_mins) mins[blk * 4 + static_cast<size_t>(o4)] = dec.m;
      if (k_quant) {
        for (size_t j = 0; j < 16; ++j) sub[(blk * 16 + j) * 4 + static_cast<size_t>(o4)] = dec.sub[j];
      }
      for (int64_t gl = 0; gl < groups_per_block; ++gl) {
        const size_t g = static_cast<size_t>(so * n_groups + kb * groups_per_block + gl);
        const int* codes = dec.codes + 32 * gl;
        for (size_t j = 0; j < 8; ++j) {
          if (nibbles) {
            uint16_t packed = 0;
            for (size_t i4 = 0; i4 < 4; ++i4) {
              // Q5_0's decoded values are code - 16; the device keeps the code (0..31).
              const int code = codes[4 * j + i4] + (type == DType::kQ5_0 ? 16 : 0);
              packed = static_cast<uint16_t>(packed | ((code & 15) << (4 * i4)));
              if (high_bits > 0) {
                const auto hi = static_cast<uint32_t>(code >> 4);
                high[g * 8 + j] |= hi << (high_bits * (4 * o4 + static_cast<int64_t>(i4)));
              }
            }
            q4[(g * 8 + j) * 4 + static_cast<size_t>(o4)] = packed;
          } else {
            for (size_t i4 = 0; i4 < 4; ++i4) {
              q8[((g * 8 + j) * 4 + static_cast<size_t>(o4)) * 4 + i4] = static_cast<int8_t>(codes[4 * j + i4]);
            }
          }
        }
      }
    }
  }
  INFERD_RETURN_IF_ERROR(upload_vector(scales, w.scales_));
  if (!mins.empty()) INFERD_RETURN_IF_ERROR(upload_vector(mins, w.mins_));
  if (!sub.empty()) INFERD_RETURN_IF_ERROR(upload_vector(sub, w.sub_scales_));
  if (high_bits == 2) {
    INFERD_RETURN_IF_ERROR(upload_vector(high, w.high_bits_));
  } else if (high_bits == 1) {
    INFERD_RETURN_IF_ERROR(upload_vector(std::vector<uint16_t>(high.begin(), high.end()), w.high_bits_));
  }
  if (nibbles) {
    INFERD_RETURN_IF_ERROR(upload_vector(q4, w.values_));
  } else {
    INFERD_RETURN_IF_ERROR(upload_vector(q8, w.values_));
  }
  return w;
}

Status AttentionGeometry::check() const {
  if (n_head < 1 || n_head_kv < 1 || head_dim < 1 || n_slots < 1 || n_ctx < 1) {
    return make_error(Code::kInvalidArgument, "attention: heads %d/%d, head_dim %d, %d slots of %d positions", n_head,
                      n_head_kv, head_dim, n_slots, n_ctx);
  }
  if (n_head % n_head_kv != 0) {
    return make_error(Code::kUnimplemented, "attention: %d query heads do not group over %d KV heads", n_head, n_head_kv);
  }
  const int32_t multiple = rope_mode == RopeMode::kNeox ? 8 : 4;
  if (head_dim % multiple != 0 || head_dim > 256) {
    return make_error(Code::kUnimplemented, "attention: head_dim %d is not a multiple of %d up to 256 (%s rope)",
                      head_dim, multiple, rope_mode == RopeMode::kNeox ? "NeoX" : "llama");
  }
  return Status::ok();
}

const char* matmul_variant_name(MatmulVariant variant) {
  switch (variant) {
    case MatmulVariant::kAuto: return "auto";
    case MatmulVariant::kDecode: return "decode";
    case MatmulVariant::kPrefill: return "prefill";
  }
  return "?";
}

MatmulVariant choose_matmul_variant(int32_t tokens) {
  return tokens < 4 ? MatmulVariant::kDecode : MatmulVariant::kPrefill;
}

const char* cpu_order_name(CpuOrder order) { return order == CpuOrder::kX86 ? "x86" : "scalar"; }

CpuOrder host_cpu_order() {
  return kernels::best_isa() == kernels::Isa::kScalar ? CpuOrder::kScalar : CpuOrder::kX86;
}

CpuOrder matmul_order(CpuOrder cpu, DType type, int32_t tokens) {
  if (cpu == CpuOrder::kX86) return CpuOrder::kX86;
  // The scalar build: its GEMM (passes of 2+ tokens; Q4_0, Q4_1, Q8_0) sums in the lane order.
  const bool gemm = kernels::gemm_kernel(type, kernels::Isa::kScalar) != nullptr;
  return gemm && tokens > 1 ? CpuOrder::kX86 : CpuOrder::kScalar;
}

MatmulActivations matmul_activations(DType type) {
  switch (type) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return MatmulActivations::kFloat;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return MatmulActivations::kQ8K;
    default: return MatmulActivations::kQ8;
  }
}

// The angles of ops::rope_head, with the same calls in the same order (so the same libm results).
std::vector<float> rope_table(std::span<const int32_t> positions, int32_t head_dim, float base) {
  INFERD_ASSERT(head_dim > 0 && head_dim % 2 == 0, "rope_table: head_dim must be positive and even");
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
  std::vector<float> table(positions.size() * static_cast<size_t>(head_dim));
  size_t at = 0;
  for (int32_t pos : positions) {
    float theta = static_cast<float>(pos);
    for (int32_t i = 0; i < head_dim / 2; ++i) {
      table[at++] = std::cos(theta);
      table[at++] = std::sin(theta);
      theta *= theta_scale;
    }
  }
  return table;
}

// ---- Ops -----------------------------------------------------------------------------------------

const char* int_dot_name(IntDot mode) { return mode == IntDot::kInt8 ? "int8" : "float"; }

IntDot choose_int_dot(const DeviceInfo& info) {
  constexpr uint32_t kInput4x8Bit = CL_DEVICE_INTEGER_DOT_PRODUCT_INPUT_4x8BIT_KHR;  // dot(char4, char4)
  return info.integer_dot_product && (info.integer_dot_product_caps & kInput4x8Bit) != 0 ? IntDot::kInt8
                                                                                        : IntDot::kFloat;
}

Ops::Ops(Runtime& rt) : rt_(rt), int_dot_(choose_int_dot(rt.info())) {
  const DeviceInfo& info = rt.info();
  const size_t wanted = info.type == DeviceType::kGpu ? 64 : 16;
  const size_t limit = std::min(info.max_work_group_size, info.max_work_item_sizes[0]);
  // The decode matmul keeps one float4 per lane in local memory.
  const size_t by_local = info.local_mem_bytes > 0 ? static_cast<size_t>(info.local_mem_bytes / 16) : wanted;
  reduce_group_size_ = floor_pow2(std::max<size_t>(1, std::min({wanted, limit, by_local})));
}

template <typename MakeTemplate>
Result<Ops::Kernel*> Ops::kernel(const std::string& key, MakeTemplate make) {
  if (auto it = kernels_.find(key); it != kernels_.end()) return &it->second;
  auto generated = generate_kernel(make());
  if (!generated) return generated.status();
  auto program = rt_.build_program(generated->source, kBuildOptions);
  if (!program) return program.status().with_context(key);
  cl_int err = CL_SUCCESS;
  Kernel k;
  k.kernel.reset(clCreateKernel(program.value(), generated->name.c_str(), &err));
  if (err != CL_SUCCESS) return cl_error(err, "clCreateKernel(" + generated->name + ")");
  INFERD_CL_RETURN_IF_ERROR(clGetKernelWorkGroupInfo(k.kernel.get(), rt_.device(), CL_KERNEL_WORK_GROUP_SIZE,
                                                     sizeof(k.max_group), &k.max_group, nullptr));
  return &kernels_.emplace(key, std::move(k)).first->second;
}

size_t Ops::group_size(const Kernel& k) const {
  return floor_pow2(std::max<size_t>(1, std::min(reduce_group_size_, k.max_group)));
}

Status Ops::launch(const Kernel& k, cl_uint dims, const size_t* global, const size_t* local) {
  for (cl_uint d = 0; d < dims; ++d) {
    if (global[d] == 0) return Status::ok();  // nothing to do (cannot happen for valid shapes)
  }
  INFERD_CL_RETURN_IF_ERROR(
      clEnqueueNDRangeKernel(rt_.queue(), k.kernel.get(), dims, nullptr, global, local, 0, nullptr, nullptr));
  return Status::ok();
}

Status Ops::binary(const char* op, const char* expr, const char* helpers, const Tensor& a, const Tensor& b,
                   Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_same_shape(op, a, b));
  INFERD_RETURN_IF_ERROR(require_same_shape(op, a, dst));
  auto k = kernel(std::string(op) + storage_key({&a, &b, &dst}),
                  [&] { return elementwise_template(op, expr, helpers, a.format(), b.format(), dst.format()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(a).tensor(b).tensor(dst);
  INFERD_RETURN_IF_ERROR(args.status());
  const Bhwc& s = dst.shape();
  const size_t global[3] = {static_cast<size_t>(s.w) * static_cast<size_t>(s.b), static_cast<size_t>(s.h),
                            static_cast<size_t>(s.slices())};
  return launch(*k.value(), 3, global, nullptr);
}

Status Ops::add(const Tensor& a, const Tensor& b, Tensor& dst) { return binary("add", "va + vb", "", a, b, dst); }
Status Ops::mul(const Tensor& a, const Tensor& b, Tensor& dst) { return binary("mul", "va * vb", "", a, b, dst); }
// silu(0) * 0 = 0 keeps the padding zero.
Status Ops::swiglu(const Tensor& gate, const Tensor& up, Tensor& dst) {
  return binary("swiglu", "inferd_silu(va) * vb", kFloatSilu, gate, up, dst);
}
Status Ops::swiglu_exact(const Tensor& gate, const Tensor& up, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_exact("swiglu_exact", {&gate, &up, &dst}));
  return binary("swiglu_exact", "inferd_silu4(va) * vb", kExactHelpers, gate, up, dst);
}

Status Ops::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& dst) {
  return rms_norm_as(x, weight, eps, dst, false);
}

Status Ops::rms_norm_as(const Tensor& x, const Tensor& weight, float eps, Tensor& dst, bool exact) {
  const char* op = exact ? "rms_norm_exact" : "rms_norm";
  INFERD_RETURN_IF_ERROR(require_same_shape(op, x, dst));
  if (!(weight.shape() == Bhwc{1, 1, 1, x.shape().c})) {
    return make_error(Code::kInvalidArgument, "%s: weight %s for channels %d", op, weight.shape().to_string().c_str(),
                      x.shape().c);
  }
  auto k = kernel(op + storage_key({&x, &weight, &dst}), [&] {
    return exact ? rms_norm_exact_template(x.format(), weight.format(), dst.format())
                 : rms_norm_template(x.format(), weight.format(), dst.format());
  });
  if (!k) return k.status();
  const size_t lanes = group_size(*k.value());
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(weight).tensor(dst).value(eps).local(lanes * sizeof(float));
  INFERD_RETURN_IF_ERROR(args.status());
  const Bhwc& s = x.shape();
  const size_t global[2] = {lanes, static_cast<size_t>(s.b) * static_cast<size_t>(s.w) * static_cast<size_t>(s.h)};
  const size_t local[2] = {lanes, 1};
  return launch(*k.value(), 2, global, local);
}

Status Ops::rope(const Tensor& x, cl_mem positions, float base, RopeMode mode, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_same_shape("rope", x, dst));
  const Bhwc& s = x.shape();
  if (s.b != 1) return make_error(Code::kUnimplemented, "rope: batch %d > 1", s.b);
  if (mode == RopeMode::kNormal && s.c % 2 != 0) {
    return make_error(Code::kUnimplemented, "rope: head_dim %d is odd", s.c);
  }
  if (mode == RopeMode::kNeox && s.c % 8 != 0) {
    return make_error(Code::kUnimplemented, "rope (neox): head_dim %d is not a multiple of 8", s.c);
  }
  if (&x == &dst) return Status(Code::kInvalidArgument, "rope: in place is not supported");
  size_t pos_bytes = 0;
  INFERD_CL_RETURN_IF_ERROR(clGetMemObjectInfo(positions, CL_MEM_SIZE, sizeof(pos_bytes), &pos_bytes, nullptr));
  if (pos_bytes < static_cast<size_t>(s.w) * sizeof(cl_int)) {
    return make_error(Code::kInvalidArgument, "rope: %zu bytes of positions for %d tokens", pos_bytes, s.w);
  }
  auto k = kernel(std::string(mode == RopeMode::kNormal ? "rope_normal" : "rope_neox") + storage_key({&x, &dst}),
                  [&] { return rope_template(mode, x.format(), dst.format()); });
  if (!k) return k.status();
  // As the CPU reference (ops.cpp rope_head): the float overload of pow.
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(s.c));
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(dst).buffer(positions).value(theta_scale);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t slices = mode == RopeMode::kNormal ? static_cast<size_t>(s.slices()) : static_cast<size_t>(s.c / 8);
  const size_t global[3] = {static_cast<size_t>(s.w), static_cast<size_t>(s.h), slices};
  return launch(*k.value(), 3, global, nullptr);
}

Status Ops::softmax(const Tensor& x, const Tensor& mask, float scale, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_same_shape("softmax", x, dst));
  const Bhwc& s = x.shape();
  const Bhwc& m = mask.shape();
  if (m.w != s.w || m.c != s.c || (m.h != 1 && m.h != s.h) || (m.b != 1 && m.b != s.b)) {
    return make_error(Code::kInvalidArgument, "softmax: mask %s does not broadcast to %s", m.to_string().c_str(),
                      s.to_string().c_str());
  }
  auto k = kernel("softmax" + storage_key({&x, &mask, &dst}),
                  [&] { return softmax_template(x.format(), mask.format(), dst.format()); });
  if (!k) return k.status();
  const size_t lanes = group_size(*k.value());
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(mask).tensor(dst).value(scale).local(lanes * sizeof(float));
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {lanes, static_cast<size_t>(s.b) * static_cast<size_t>(s.w) * static_cast<size_t>(s.h)};
  const size_t local[2] = {lanes, 1};
  return launch(*k.value(), 2, global, local);
}

Status Ops::matmul(const MatmulWeights& w, const Tensor& x, Tensor& y, MatmulVariant variant) {
  const Bhwc& xs = x.shape();
  const Bhwc& ys = y.shape();
  if (xs.b != 1 || xs.h != 1 || xs.c != w.k() || !(ys == Bhwc{1, 1, xs.w, static_cast<int32_t>(w.rows())})) {
    return make_error(Code::kInvalidArgument, "matmul: weights %lld x %lld, x %s, y %s",
                      static_cast<long long>(w.rows()), static_cast<long long>(w.k()), xs.to_string().c_str(),
                      ys.to_string().c_str());
  }
  if (variant == MatmulVariant::kAuto) variant = choose_matmul_variant(xs.w);
  auto k = kernel(std::string("matmul_") + matmul_variant_name(variant) + "_" + dtype_name(w.type()) +
                      storage_key({&x, &y}),
                  [&] { return matmul_template(w.type(), variant, x.format(), y.format()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(y).weights(w);
  if (variant == MatmulVariant::kDecode) {
    const size_t lanes = group_size(*k.value());
    args.local(lanes * 16);
    INFERD_RETURN_IF_ERROR(args.status());
    const size_t global[2] = {lanes * static_cast<size_t>(w.out_slices()), static_cast<size_t>(xs.w)};
    const size_t local[2] = {lanes, 1};
    return launch(*k.value(), 2, global, local);
  }
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(w.out_slices()), static_cast<size_t>((xs.w + 3) / 4)};
  return launch(*k.value(), 2, global, nullptr);
}


Status Ops::get_rows(const MatmulWeights& w, cl_mem rows, Tensor& dst) {
  const Bhwc& d = dst.shape();
  if (!is_token_rows(d) || d.c != w.k()) {
    return make_error(Code::kInvalidArgument, "get_rows: weights %lld x %lld, dst %s", static_cast<long long>(w.rows()),
                      static_cast<long long>(w.k()), d.to_string().c_str());
  }
  INFERD_RETURN_IF_ERROR(require_bytes(rows, static_cast<size_t>(d.w) * sizeof(cl_int), "get_rows rows"));
  auto k = kernel(std::string("get_rows_") + dtype_name(w.type()) + storage_key({&dst}),
                  [&] { return get_rows_template(w.type(), dst.format()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(dst).buffer(rows).weights(w);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::gather(const Tensor& src, cl_mem rows, Tensor& dst) {
  const Bhwc& s = src.shape();
  const Bhwc& d = dst.shape();
  if (!is_token_rows(s) || !is_token_rows(d) || s.c != d.c || d.w > s.w) {
    return make_error(Code::kInvalidArgument, "gather: src %s, dst %s", s.to_string().c_str(), d.to_string().c_str());
  }
  INFERD_RETURN_IF_ERROR(require_bytes(rows, static_cast<size_t>(d.w) * sizeof(cl_int), "gather rows"));
  auto k = kernel("gather" + storage_key({&src, &dst}), [&] { return gather_template(src.format(), dst.format()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(src).tensor(dst).buffer(rows);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::swiglu_halves(const Tensor& gate_up, Tensor& dst) { return swiglu_halves_as(gate_up, dst, false); }

Status Ops::swiglu_halves_as(const Tensor& gate_up, Tensor& dst, bool exact) {
  const char* op = exact ? "swiglu_halves_exact" : "swiglu_halves";
  const Bhwc& s = gate_up.shape();
  const Bhwc& d = dst.shape();
  if (!is_token_rows(s) || !is_token_rows(d) || d.c % 4 != 0 || s.c != 2 * d.c || s.w != d.w) {
    return make_error(Code::kInvalidArgument, "%s: gate_up %s, dst %s", op, s.to_string().c_str(),
                      d.to_string().c_str());
  }
  auto k = kernel(op + storage_key({&gate_up, &dst}),
                  [&] { return swiglu_halves_template(gate_up.format(), dst.format(), exact); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(gate_up).tensor(dst);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::rope_kv(const AttentionGeometry& g, TensorSlice q, TensorSlice k, TensorSlice v, cl_mem bias,
                    const TokenPlacement& tokens, cl_mem q_out, cl_mem cache) {
  INFERD_RETURN_IF_ERROR(g.check());
  if (q.tensor == nullptr || k.tensor == nullptr || v.tensor == nullptr) {
    return Status(Code::kInvalidArgument, "rope_kv: missing Q, K or V");
  }
  const int32_t t_count = q.tensor->shape().w;
  const int32_t hd4 = g.head_dim / 4;
  const struct {
    TensorSlice slice;
    int32_t slices;
    const char* name;
  } parts[] = {{q, g.n_head * hd4, "Q"}, {k, g.n_head_kv * hd4, "K"}, {v, g.n_head_kv * hd4, "V"}};
  for (const auto& p : parts) {
    const Bhwc& s = p.slice.tensor->shape();
    if (!is_token_rows(s) || s.w != t_count || p.slice.first_slice < 0 || s.c % 4 != 0 ||
        p.slice.first_slice + p.slices > s.slices()) {
      return make_error(Code::kInvalidArgument, "rope_kv: %s is %s from slice %d, %d slices of %d tokens needed",
                        p.name, s.to_string().c_str(), p.slice.first_slice, p.slices, t_count);
    }
  }
  const size_t t = static_cast<size_t>(t_count);
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.positions, t * sizeof(cl_int), "rope_kv positions"));
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.slots, t * sizeof(cl_int), "rope_kv slots"));
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.rope, t * static_cast<size_t>(g.head_dim) * sizeof(float), "rope_kv rope"));
  INFERD_RETURN_IF_ERROR(require_bytes(q_out, t * static_cast<size_t>(g.n_embd()) * 2, "rope_kv q_out"));
  INFERD_RETURN_IF_ERROR(require_bytes(cache, g.layer_cache_bytes(), "rope_kv cache"));
  if (bias != nullptr) {
    INFERD_RETURN_IF_ERROR(
        require_bytes(bias, static_cast<size_t>(g.n_embd() + 2 * g.n_embd_kv()) * sizeof(float), "rope_kv bias"));
  }
  const bool normal = g.rope_mode == RopeMode::kNormal;
  auto kn = kernel(std::string(normal ? "rope_kv_normal" : "rope_kv_neox") + storage_key({q.tensor, k.tensor, v.tensor}),
                   [&] { return rope_kv_template(g.rope_mode, q.tensor->format(), k.tensor->format(), v.tensor->format()); });
  if (!kn) return kn.status();
  KernelArgs args(kn.value()->kernel.get());
  args.tensor(*q.tensor).tensor(*k.tensor).tensor(*v.tensor);
  args.value(cl_int{q.first_slice}).value(cl_int{k.first_slice}).value(cl_int{v.first_slice}).buffer(bias);
  args.buffer(tokens.positions).buffer(tokens.slots).buffer(tokens.rope);
  args.value(cl_int{g.n_head}).value(cl_int{g.n_head_kv}).value(cl_int{g.head_dim}).value(cl_int{g.n_ctx});
  args.buffer(q_out).buffer(cache);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t units = static_cast<size_t>(normal ? g.head_dim / 4 : g.head_dim / 8);
  const size_t global[3] = {t, static_cast<size_t>(g.n_head + g.n_head_kv), units};
  return launch(*kn.value(), 3, global, nullptr);
}

Status Ops::attention(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad, float scale,
                      cl_mem cache, Tensor& out) {
  INFERD_RETURN_IF_ERROR(g.check());
  const Bhwc& o = out.shape();
  if (!is_token_rows(o) || o.c != g.n_embd()) {
    return make_error(Code::kInvalidArgument, "attention: out %s for %d heads of %d", o.to_string().c_str(), g.n_head,
                      g.head_dim);
  }
  if (kv_pad < 1) return make_error(Code::kInvalidArgument, "attention: kv_pad %d", kv_pad);
  const size_t t = static_cast<size_t>(o.w);
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.positions, t * sizeof(cl_int), "attention positions"));
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.slots, t * sizeof(cl_int), "attention slots"));
  INFERD_RETURN_IF_ERROR(require_bytes(q, t * static_cast<size_t>(g.n_embd()) * 2, "attention q"));
  INFERD_RETURN_IF_ERROR(require_bytes(cache, g.layer_cache_bytes(), "attention cache"));
  auto k = kernel("attention_hd" + std::to_string(g.head_dim) + storage_key({&out}),
                  [&] { return attention_template(g.head_dim, out.format()); });
  if (!k) return k.status();
  // Lanes within the kernel's limit and half the local memory: each keeps a float and a head.
  const size_t per_lane = sizeof(float) + static_cast<size_t>(g.head_dim) * sizeof(float);
  const uint64_t local = rt_.info().local_mem_bytes;
  size_t lanes = group_size(*k.value());
  while (lanes > 1 && local > 0 && lanes * per_lane > local / 2) lanes /= 2;
  KernelArgs args(k.value()->kernel.get());
  args.tensor(out).buffer(q).buffer(cache).buffer(tokens.positions).buffer(tokens.slots);
  args.value(cl_int{g.n_head}).value(cl_int{g.n_head_kv}).value(cl_int{g.n_ctx}).value(cl_int{kv_pad}).value(scale);
  args.local(lanes * sizeof(float)).local(lanes * static_cast<size_t>(g.head_dim) * sizeof(float));
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {lanes * static_cast<size_t>(g.n_head), t};
  const size_t local_size[2] = {lanes, 1};
  return launch(*k.value(), 2, global, local_size);
}

// ---- Exact ops ----

bool Ops::exact_supported() const { return rt_.info().fp64; }

Status Ops::require_exact(const char* op, std::initializer_list<const Tensor*> tensors) const {
  if (!exact_supported()) {
    return make_error(Code::kUnimplemented, "%s: the exact kernels need cl_khr_fp64, which %s lacks", op,
                      rt_.info().name.c_str());
  }
  for (const Tensor* t : tensors) {
    if (t->format().data_type != DataType::kFloat32) {
      return make_error(Code::kInvalidArgument, "%s: a %s tensor; the exact kernels reproduce float activations", op,
                        t->desc().to_string().c_str());
    }
  }
  return Status::ok();
}

Status Ops::rms_norm_exact(const Tensor& x, const Tensor& weight, float eps, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_exact("rms_norm_exact", {&x, &weight, &dst}));
  return rms_norm_as(x, weight, eps, dst, true);
}

Status Ops::swiglu_halves_exact(const Tensor& gate_up, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_exact("swiglu_halves_exact", {&gate_up, &dst}));
  return swiglu_halves_as(gate_up, dst, true);
}

Status Ops::quantize_q8(const Tensor& x, Tensor& quants, cl_mem scales) {
  INFERD_RETURN_IF_ERROR(require_exact("quantize_q8", {&x, &quants}));
  const Bhwc& s = x.shape();
  if (!is_token_rows(s) || !(quants.shape() == s) || s.c % 32 != 0) {
    return make_error(Code::kInvalidArgument, "quantize_q8: x %s, quants %s (channels must be a multiple of 32)",
                      s.to_string().c_str(), quants.shape().to_string().c_str());
  }
  if (&x == &quants) return Status(Code::kInvalidArgument, "quantize_q8: in place is not supported");
  INFERD_RETURN_IF_ERROR(
      require_bytes(scales, static_cast<size_t>(s.w) * static_cast<size_t>(s.c / 32) * 2 * sizeof(float), "quantize_q8 scales"));
  auto k = kernel("quantize_q8" + storage_key({&x, &quants}),
                  [&] { return quantize_q8_template(x.format(), quants.format()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(quants).buffer(scales);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(s.w), static_cast<size_t>(s.c / 32)};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::quantize_q8_k(const Tensor& x, Tensor& quants, cl_mem blocks) {
  INFERD_RETURN_IF_ERROR(require_exact("quantize_q8_k", {&x, &quants}));
  const Bhwc& s = x.shape();
  if (!is_token_rows(s) || !(quants.shape() == s) || s.c % 256 != 0) {
    return make_error(Code::kInvalidArgument, "quantize_q8_k: x %s, quants %s (channels must be a multiple of 256)",
                      s.to_string().c_str(), quants.shape().to_string().c_str());
  }
  if (&x == &quants) return Status(Code::kInvalidArgument, "quantize_q8_k: in place is not supported");
  INFERD_RETURN_IF_ERROR(require_bytes(
      blocks, static_cast<size_t>(s.w) * static_cast<size_t>(s.c / 256) * kQ8KBlockFloats * sizeof(float),
      "quantize_q8_k blocks"));
  auto k = kernel("quantize_q8_k" + storage_key({&x, &quants}),
                  [&] { return quantize_q8_k_template(x.format(), quants.format()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(quants).buffer(blocks);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(s.w), static_cast<size_t>(s.c / 256)};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::matmul_exact(const MatmulWeights& w, const Tensor& x, cl_mem scales, Tensor& y, CpuOrder order,
                         MatmulVariant variant) {
  INFERD_RETURN_IF_ERROR(require_exact("matmul_exact", {&x, &y}));
  const Bhwc& xs = x.shape();
  const Bhwc& ys = y.shape();
  if (xs.b != 1 || xs.h != 1 || xs.c != w.k() || !(ys == Bhwc{1, 1, xs.w, static_cast<int32_t>(w.rows())})) {
    return make_error(Code::kInvalidArgument, "matmul_exact: weights %lld x %lld, x %s, y %s",
                      static_cast<long long>(w.rows()), static_cast<long long>(w.k()), xs.to_string().c_str(),
                      ys.to_string().c_str());
  }
  const MatmulActivations kind = matmul_activations(w.type());
  const bool blocks = kind != MatmulActivations::kFloat;
  if (kind == MatmulActivations::kQ8) {
    INFERD_RETURN_IF_ERROR(require_bytes(
        scales, static_cast<size_t>(xs.w) * static_cast<size_t>(w.k() / 32) * 2 * sizeof(float), "matmul_exact scales"));
  } else if (kind == MatmulActivations::kQ8K) {
    INFERD_RETURN_IF_ERROR(require_bytes(
        scales, static_cast<size_t>(xs.w) * static_cast<size_t>(w.k() / 256) * kQ8KBlockFloats * sizeof(float),
        "matmul_exact Q8_K blocks"));
  }
  if (variant == MatmulVariant::kAuto) variant = choose_matmul_variant(xs.w);
  const int tokens_per_item = variant == MatmulVariant::kDecode ? 1 : 4;
  const IntDot int_dot = kind == MatmulActivations::kQ8 ? int_dot_ : IntDot::kFloat;  // block types only
  // The extension's dot(char4, char4) where the device has it; emulated where the variant is forced.
  const bool native = int_dot == IntDot::kInt8 && choose_int_dot(rt_.info()) == IntDot::kInt8;
  auto k = kernel(std::string("matmul_exact_") + matmul_variant_name(variant) + "_" + dtype_name(w.type()) + "_" +
                      cpu_order_name(order) + "_" + int_dot_name(int_dot) + (native ? "_native" : "") +
                      storage_key({&x, &y}),
                  [&] {
                    return matmul_exact_template(w.type(), order, tokens_per_item, x.format(), y.format(), int_dot,
                                                 native);
                  });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(y).weights(w).buffer(blocks ? scales : nullptr);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t items = static_cast<size_t>((xs.w + tokens_per_item - 1) / tokens_per_item);
  const size_t global[2] = {static_cast<size_t>(w.out_slices()), items};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::attention_exact(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad,
                            float scale, cl_mem cache, cl_mem scratch, CpuOrder order, Tensor& out) {
  INFERD_RETURN_IF_ERROR(require_exact("attention_exact", {&out}));
  INFERD_RETURN_IF_ERROR(g.check());
  const Bhwc& o = out.shape();
  if (!is_token_rows(o) || o.c != g.n_embd()) {
    return make_error(Code::kInvalidArgument, "attention_exact: out %s for %d heads of %d", o.to_string().c_str(),
                      g.n_head, g.head_dim);
  }
  if (kv_pad < 1) return make_error(Code::kInvalidArgument, "attention_exact: kv_pad %d", kv_pad);
  const size_t t = static_cast<size_t>(o.w);
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.positions, t * sizeof(cl_int), "attention_exact positions"));
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.slots, t * sizeof(cl_int), "attention_exact slots"));
  INFERD_RETURN_IF_ERROR(require_bytes(q, t * static_cast<size_t>(g.n_embd()) * 2, "attention_exact q"));
  INFERD_RETURN_IF_ERROR(require_bytes(cache, g.layer_cache_bytes(), "attention_exact cache"));
  auto scratch_bytes = buffer_bytes(scratch, "attention_exact scratch");
  if (!scratch_bytes) return scratch_bytes.status();
  const size_t per_token = attention_scratch_bytes(g, 1, kv_pad);
  if (scratch_bytes.value() < per_token) {
    return make_error(Code::kInvalidArgument, "attention_exact: %zu bytes of scratch, %zu needed for one token",
                      scratch_bytes.value(), per_token);
  }
  auto k = kernel("attention_exact_hd" + std::to_string(g.head_dim) + "_" + cpu_order_name(order) + storage_key({&out}),
                  [&] { return attention_exact_template(g.head_dim, order, out.format()); });
  if (!k) return k.status();
  const size_t lanes = group_size(*k.value());
  const size_t per_launch = std::min(t, scratch_bytes.value() / per_token);
  for (size_t first = 0; first < t; first += per_launch) {
    const size_t n = std::min(per_launch, t - first);
    KernelArgs args(k.value()->kernel.get());
    args.tensor(out).buffer(q).buffer(cache).buffer(tokens.positions).buffer(tokens.slots);
    args.value(static_cast<cl_int>(first)).value(cl_int{g.n_head}).value(cl_int{g.n_head_kv}).value(cl_int{g.n_ctx});
    args.value(cl_int{kv_pad}).value(scale).buffer(scratch);
    args.local(lanes * sizeof(float)).local(size_t{16} * static_cast<size_t>(g.head_dim) * sizeof(float));
    INFERD_RETURN_IF_ERROR(args.status());
    const size_t global[2] = {lanes * static_cast<size_t>(g.n_head), n};
    const size_t local_size[2] = {lanes, 1};
    INFERD_RETURN_IF_ERROR(launch(*k.value(), 2, global, local_size));
  }
  return Status::ok();
}

}  // namespace inferd::opencl
