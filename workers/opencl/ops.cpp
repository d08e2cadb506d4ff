#include "inferd/opencl/ops.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "inferd/kernels/cpu.h"

namespace inferd::opencl {

// ---- KernelArgs ----------------------------------------------------------------------------------

void KernelArgs::set(size_t size, const void* value) {
  const cl_uint index = next_++;
  if (!status_) return;
  const cl_int err = clSetKernelArg(kernel_, index, size, value);
  if (err != CL_SUCCESS) status_ = cl_error(err, "clSetKernelArg(" + std::to_string(index) + ")");
}

KernelArgs& KernelArgs::tensor(const Tensor& t) {
  const cl_mem mem = t.memory();
  set(sizeof(mem), &mem);
  const Bhwc& s = t.shape();
  const cl_int extents[kArgsPerTensor - 1] = {s.w, s.h, s.slices(), s.b, s.c};
  for (cl_int e : extents) set(sizeof(e), &e);
  return *this;
}

KernelArgs& KernelArgs::buffer(cl_mem mem) {
  set(sizeof(mem), &mem);
  return *this;
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
  for (const Tensor* t : tensors) key += std::string(":") + storage_name(t->storage());
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

KernelTemplate elementwise_template(const std::string& name, const std::string& expr, StorageType a, StorageType b,
                                    StorageType dst) {
  KernelTemplate k;
  k.name = name;
  k.tensors = {{"lhs", a, Access::kRead}, {"rhs", b, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.helpers = "inline float4 inferd_silu(float4 g) { return g / (1.0f + exp(-g)); }\n";
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

KernelTemplate rms_norm_template(StorageType src, StorageType weight, StorageType dst) {
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

KernelTemplate softmax_template(StorageType src, StorageType mask, StorageType dst) {
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
KernelTemplate rope_template(RopeMode mode, StorageType src, StorageType dst) {
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
    case DType::kQ4_0:
    case DType::kQ4_1: return "ushort4";
    default: return nullptr;
  }
}

// w_load(): the 4 rows of output slice `so` at input slice `si`, dequantized, into r[0..3].
std::string weight_loader(DType type) {
  const std::string signature = std::string("inline void w_load(__global const ") + weight_pointer_type(type) +
                                "* wq, __global const float4* ws, __global const float4* wm, int so, int si, int n_si, "
                                "float4* r) {\n";
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
      return signature + R"(  const int blk = so * (n_si / 8) + si / 8;
  const ushort4 p = wq[blk * 8 + si % 8];
  const float4 d = ws[blk];
  r[0] = (inferd_nibbles(p.x) - 8.0f) * d.x;
  r[1] = (inferd_nibbles(p.y) - 8.0f) * d.y;
  r[2] = (inferd_nibbles(p.z) - 8.0f) * d.z;
  r[3] = (inferd_nibbles(p.w) - 8.0f) * d.w;
}
)";
    case DType::kQ4_1:
      return signature + R"(  const int blk = so * (n_si / 8) + si / 8;
  const ushort4 p = wq[blk * 8 + si % 8];
  const float4 d = ws[blk];
  const float4 m = wm[blk];
  r[0] = inferd_nibbles(p.x) * d.x + m.x;
  r[1] = inferd_nibbles(p.y) * d.y + m.y;
  r[2] = inferd_nibbles(p.z) * d.z + m.z;
  r[3] = inferd_nibbles(p.w) * d.w + m.w;
}
)";
    default: return "";
  }
}

constexpr const char* kMatmulHelpers = R"(// The 4 nibbles of v, lowest first, as floats.
inline float4 inferd_nibbles(ushort v) {
  const uint u = v;
  return convert_float4((uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12));
}
// The dot products of the 4 weight rows r with one slice x: one output slice's contribution.
inline float4 inferd_dot4(const float4* r, float4 x) {
  return (float4)(dot(r[0], x), dot(r[1], x), dot(r[2], x), dot(r[3], x));
}
)";

KernelTemplate matmul_template(DType type, MatmulVariant variant, StorageType x, StorageType y) {
  KernelTemplate k;
  k.name = variant == MatmulVariant::kDecode ? "matmul_decode" : "matmul_prefill";
  k.tensors = {{"x", x, Access::kRead}, {"y", y, Access::kWrite}};
  k.params = {std::string("__global const ") + weight_pointer_type(type) + "* wq", "__global const float4* ws",
              "__global const float4* wm", "__global const float* q8_sums"};
  k.helpers = std::string(kMatmulHelpers) + weight_loader(type);
  // Q4_1 with Q8-rounded activations: at each block's first slice, the block's minimum times the
  // activation's block-sum correction (quantize_q8). q8_sums is null otherwise.
  const bool q4_1 = type == DType::kQ4_1;
  auto correction = [&](const std::string& acc, const std::string& token) {
    return q4_1 ? "    if (q8_sums != 0 && si % 8 == 0) " + acc + " += wm[so * (n_si / 8) + si / 8] * q8_sums[" + token +
                      " * (n_si / 8) + si / 8];\n"
                : std::string();
  };
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
    w_load(wq, ws, wm, so, si, n_si, r);
    acc += inferd_dot4(r, $x.Read(t, 0, si));
)" + correction("acc", "t") + R"(  }
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
    w_load(wq, ws, wm, so, si, n_si, r);
    a0 += inferd_dot4(r, $x.Read(t0, 0, si));
    a1 += inferd_dot4(r, $x.Read(t1, 0, si));
    a2 += inferd_dot4(r, $x.Read(t2, 0, si));
    a3 += inferd_dot4(r, $x.Read(t3, 0, si));
)" + correction("a0", "t0") + correction("a1", "t1") + correction("a2", "t2") + correction("a3", "t3") + R"(  }
  $y.Write(a0, t0, 0, so);
  if (t0 + 1 < n_t) $y.Write(a1, t0 + 1, 0, so);
  if (t0 + 2 < n_t) $y.Write(a2, t0 + 2, 0, so);
  if (t0 + 3 < n_t) $y.Write(a3, t0 + 3, 0, so);
)";
  }
  return k;
}

// ---- The forward pass's own kernels ----

KernelTemplate get_rows_template(DType type, StorageType dst) {
  KernelTemplate k;
  k.name = "get_rows";
  k.tensors = {{"dst", dst, Access::kWrite}};
  k.params = {"__global const int* rows", std::string("__global const ") + weight_pointer_type(type) + "* wq",
              "__global const float4* ws", "__global const float4* wm"};
  k.helpers = std::string(kMatmulHelpers) + weight_loader(type);
  // Launched as (T, S): w_load() dequantizes the 4 rows of the row's output slice; one is kept.
  k.body = R"(  const int t = get_global_id(0);
  const int si = get_global_id(1);
  const int row = rows[t];
  float4 r[4];
  w_load(wq, ws, wm, row / 4, si, $dst.Slices(), r);
  $dst.Write(r[row % 4], t, 0, si);
)";
  return k;
}

KernelTemplate gather_template(StorageType src, StorageType dst) {
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

KernelTemplate quantize_q8_template(StorageType src, StorageType dst) {
  KernelTemplate k;
  k.name = "quantize_q8";
  k.tensors = {{"x", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"__global float* sums"};
  // Rounding through half without cl_khr_fp16: store and load through a ushort.
  k.helpers = R"(inline float inferd_round_half(float v) {
  ushort h;
  vstore_half(v, 0, (half*)&h);
  return vload_half(0, (const half*)&h);
}
)";
  // Launched as (T, K / 32): a work-item per block of 8 slices.
  k.body = R"(  const int t = get_global_id(0);
  const int s0 = get_global_id(1) * 8;
  float4 v[8];
  float amax = 0.0f;
  for (int j = 0; j < 8; ++j) {
    v[j] = $x.Read(t, 0, s0 + j);
    const float4 a = fabs(v[j]);
    amax = fmax(amax, fmax(fmax(a.x, a.y), fmax(a.z, a.w)));
  }
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const float d = amax / 127.0f;
  const float d_half = inferd_round_half(d);
  float4 qsum = (float4)(0.0f);
  for (int j = 0; j < 8; ++j) {
    const float4 q = rint(v[j] * id);
    qsum += q;
    $dst.Write(q * d_half, t, 0, s0 + j);
  }
  if (sums != 0) {
    const float sum_q = (qsum.x + qsum.y) + (qsum.z + qsum.w);  // an integer, exact
    sums[t * ($x.Channels() / 32) + get_global_id(1)] = inferd_round_half(d * sum_q) - d_half * sum_q;
  }
)";
  return k;
}

KernelTemplate swiglu_halves_template(StorageType src, StorageType dst) {
  KernelTemplate k;
  k.name = "swiglu_halves";
  k.tensors = {{"gu", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.helpers = "inline float4 inferd_silu(float4 g) { return g / (1.0f + exp(-g)); }\n";
  k.body = R"(  const int t = get_global_id(0);
  const int s = get_global_id(1);
  const float4 g = $gu.Read(t, 0, s);
  const float4 u = $gu.Read(t, 0, s + $dst.Slices());
  $dst.Write(inferd_silu(g) * u, t, 0, s);
)";
  return k;
}

// One work-item per (token, head, unit): a unit is one slice (two rotated pairs) of a head for
// llama's rope, one slice of each half for NeoX's. Q heads come first, then KV heads, whose work-items
// also copy V. Angles as Ops::rope (ggml's recurrence).
KernelTemplate rope_kv_template(RopeMode mode, StorageType q, StorageType k_storage, StorageType v) {
  KernelTemplate k;
  k.name = mode == RopeMode::kNormal ? "rope_kv_normal" : "rope_kv_neox";
  k.tensors = {{"q", q, Access::kRead}, {"k", k_storage, Access::kRead}, {"v", v, Access::kRead}};
  k.params = {"int q_slice", "int k_slice", "int v_slice", "__global const float* bias",
              "__global const int* pos", "__global const int* slot", "int n_head", "int n_head_kv",
              "int head_dim", "int n_ctx", "float theta_scale", "__global half* q_out", "__global half* cache"};
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
  float theta = (float)pos[t];
)";
  if (mode == RopeMode::kNormal) {
    body += R"(  for (int i = 0; i < 2 * s; ++i) theta *= theta_scale;
  const float theta1 = theta * theta_scale;
  float c0, c1;
  const float s0 = sincos(theta, &c0);
  const float s1 = sincos(theta1, &c1);
  float4 x;
  if (is_q) {
    x = $q.Read(t, 0, q_slice + head * hd4 + s) + inferd_bias(bias, head * head_dim + 4 * s);
  } else {
    x = $k.Read(t, 0, k_slice + head * hd4 + s) + inferd_bias(bias, n_embd + head * head_dim + 4 * s);
    const float4 vx = $v.Read(t, 0, v_slice + head * hd4 + s) + inferd_bias(bias, n_embd + n_embd_kv + head * head_dim + 4 * s);
    vstore_half4(vx, s, v_row);
  }
  float4 o;
  o.x = fma(x.x, c0, -(x.y * s0));
  o.y = fma(x.x, s0, x.y * c0);
  o.z = fma(x.z, c1, -(x.w * s1));
  o.w = fma(x.z, s1, x.w * c1);
  vstore_half4(o, s, is_q ? q_row : kv_row);
)";
  } else {
    body += R"(  const int half_s = head_dim / 8;
  for (int i = 0; i < 4 * s; ++i) theta *= theta_scale;
  float4 th;
  th.x = theta;
  th.y = th.x * theta_scale;
  th.z = th.y * theta_scale;
  th.w = th.z * theta_scale;
  float4 c;
  const float4 sn = sincos(th, &c);
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
KernelTemplate attention_template(int32_t head_dim, StorageType out) {
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

  if (type == DType::kF32 || type == DType::kF16) {
    // [S_O][S_I][O4][I4], zero padded in both dimensions.
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

  // Block types: 32 elements per block along k, n_si = 8 * blocks.
  const int64_t n_blocks = k / 32;
  std::vector<float> scales(static_cast<size_t>(n_so * n_blocks * 4), 0.0f);
  std::vector<float> mins(type == DType::kQ4_1 ? scales.size() : 0, 0.0f);
  std::vector<int8_t> q8(type == DType::kQ8_0 ? static_cast<size_t>(n_so * n_blocks * 8 * 16) : 0, 0);
  std::vector<uint16_t> q4(type == DType::kQ8_0 ? 0 : static_cast<size_t>(n_so * n_blocks * 8 * 4), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t so = r / 4, o4 = r % 4;
    const unsigned char* row = bytes + static_cast<size_t>(r) * row_bytes;
    for (int64_t kb = 0; kb < n_blocks; ++kb) {
      const size_t blk = static_cast<size_t>(so * n_blocks + kb);
      const unsigned char* block = row + static_cast<size_t>(kb) * info->block_bytes;
      if (type == DType::kQ8_0) {
        BlockQ8_0 b;
        std::memcpy(&b, block, sizeof(b));
        scales[blk * 4 + static_cast<size_t>(o4)] = kernels::fp16_to_fp32(b.d);
        for (int j = 0; j < 8; ++j) {
          for (int i4 = 0; i4 < 4; ++i4) q8[((blk * 8 + j) * 4 + static_cast<size_t>(o4)) * 4 + i4] = b.qs[j * 4 + i4];
        }
        continue;
      }
      // Q4_0 / Q4_1: element e of a block is the low nibble of qs[e] for e < 16, the high nibble of
      // qs[e - 16] otherwise (ggml's layout).
      const uint8_t* qs;
      if (type == DType::kQ4_0) {
        BlockQ4_0 b;
        std::memcpy(&b, block, sizeof(b));
        scales[blk * 4 + static_cast<size_t>(o4)] = kernels::fp16_to_fp32(b.d);
        qs = block + offsetof(BlockQ4_0, qs);
      } else {
        BlockQ4_1 b;
        std::memcpy(&b, block, sizeof(b));
        scales[blk * 4 + static_cast<size_t>(o4)] = kernels::fp16_to_fp32(b.d);
        mins[blk * 4 + static_cast<size_t>(o4)] = kernels::fp16_to_fp32(b.m);
        qs = block + offsetof(BlockQ4_1, qs);
      }
      for (int j = 0; j < 8; ++j) {
        uint16_t packed = 0;
        for (int i4 = 0; i4 < 4; ++i4) {
          const int e = j * 4 + i4;
          const unsigned nibble = e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
          packed = static_cast<uint16_t>(packed | (nibble << (4 * i4)));
        }
        q4[(blk * 8 + static_cast<size_t>(j)) * 4 + static_cast<size_t>(o4)] = packed;
      }
    }
  }
  INFERD_RETURN_IF_ERROR(upload_vector(scales, w.scales_));
  if (!mins.empty()) INFERD_RETURN_IF_ERROR(upload_vector(mins, w.mins_));
  if (type == DType::kQ8_0) {
    INFERD_RETURN_IF_ERROR(upload_vector(q8, w.values_));
  } else {
    INFERD_RETURN_IF_ERROR(upload_vector(q4, w.values_));
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

// ---- Ops -----------------------------------------------------------------------------------------

Ops::Ops(Runtime& rt) : rt_(rt) {
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

Status Ops::binary(const char* op, const char* expr, const Tensor& a, const Tensor& b, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_same_shape(op, a, b));
  INFERD_RETURN_IF_ERROR(require_same_shape(op, a, dst));
  auto k = kernel(std::string(op) + storage_key({&a, &b, &dst}),
                  [&] { return elementwise_template(op, expr, a.storage(), b.storage(), dst.storage()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(a).tensor(b).tensor(dst);
  INFERD_RETURN_IF_ERROR(args.status());
  const Bhwc& s = dst.shape();
  const size_t global[3] = {static_cast<size_t>(s.w) * static_cast<size_t>(s.b), static_cast<size_t>(s.h),
                            static_cast<size_t>(s.slices())};
  return launch(*k.value(), 3, global, nullptr);
}

Status Ops::add(const Tensor& a, const Tensor& b, Tensor& dst) { return binary("add", "va + vb", a, b, dst); }
Status Ops::mul(const Tensor& a, const Tensor& b, Tensor& dst) { return binary("mul", "va * vb", a, b, dst); }
// silu(0) * 0 = 0 keeps the padding zero.
Status Ops::swiglu(const Tensor& gate, const Tensor& up, Tensor& dst) {
  return binary("swiglu", "inferd_silu(va) * vb", gate, up, dst);
}

Status Ops::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_same_shape("rms_norm", x, dst));
  if (!(weight.shape() == Bhwc{1, 1, 1, x.shape().c})) {
    return make_error(Code::kInvalidArgument, "rms_norm: weight %s for channels %d", weight.shape().to_string().c_str(),
                      x.shape().c);
  }
  auto k = kernel("rms_norm" + storage_key({&x, &weight, &dst}),
                  [&] { return rms_norm_template(x.storage(), weight.storage(), dst.storage()); });
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
                  [&] { return rope_template(mode, x.storage(), dst.storage()); });
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
                  [&] { return softmax_template(x.storage(), mask.storage(), dst.storage()); });
  if (!k) return k.status();
  const size_t lanes = group_size(*k.value());
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(mask).tensor(dst).value(scale).local(lanes * sizeof(float));
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {lanes, static_cast<size_t>(s.b) * static_cast<size_t>(s.w) * static_cast<size_t>(s.h)};
  const size_t local[2] = {lanes, 1};
  return launch(*k.value(), 2, global, local);
}

Status Ops::matmul(const MatmulWeights& w, const Tensor& x, Tensor& y, MatmulVariant variant, cl_mem q8_sums) {
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
                  [&] { return matmul_template(w.type(), variant, x.storage(), y.storage()); });
  if (!k) return k.status();
  if (w.type() != DType::kQ4_1) q8_sums = nullptr;
  if (q8_sums != nullptr) {
    INFERD_RETURN_IF_ERROR(require_bytes(q8_sums, static_cast<size_t>(xs.w) * static_cast<size_t>(w.k() / 32) * sizeof(float),
                                         "matmul q8_sums"));
  }
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(y).buffer(w.values()).buffer(w.scales()).buffer(w.mins()).buffer(q8_sums);
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
                  [&] { return get_rows_template(w.type(), dst.storage()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(dst).buffer(rows).buffer(w.values()).buffer(w.scales()).buffer(w.mins());
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
  auto k = kernel("gather" + storage_key({&src, &dst}), [&] { return gather_template(src.storage(), dst.storage()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(src).tensor(dst).buffer(rows);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::quantize_q8(const Tensor& x, Tensor& dst, cl_mem q8_sums) {
  const Bhwc& s = x.shape();
  if (!is_token_rows(s) || !(dst.shape() == s) || s.c % 32 != 0) {
    return make_error(Code::kInvalidArgument, "quantize_q8: x %s, dst %s (channels must be a multiple of 32)",
                      s.to_string().c_str(), dst.shape().to_string().c_str());
  }
  if (&x == &dst) return Status(Code::kInvalidArgument, "quantize_q8: in place is not supported");
  if (q8_sums != nullptr) {
    INFERD_RETURN_IF_ERROR(
        require_bytes(q8_sums, static_cast<size_t>(s.w) * static_cast<size_t>(s.c / 32) * sizeof(float), "quantize_q8 sums"));
  }
  auto k = kernel("quantize_q8" + storage_key({&x, &dst}), [&] { return quantize_q8_template(x.storage(), dst.storage()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(dst).buffer(q8_sums);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(s.w), static_cast<size_t>(s.c / 32)};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::swiglu_halves(const Tensor& gate_up, Tensor& dst) {
  const Bhwc& s = gate_up.shape();
  const Bhwc& d = dst.shape();
  if (!is_token_rows(s) || !is_token_rows(d) || d.c % 4 != 0 || s.c != 2 * d.c || s.w != d.w) {
    return make_error(Code::kInvalidArgument, "swiglu_halves: gate_up %s, dst %s", s.to_string().c_str(),
                      d.to_string().c_str());
  }
  auto k = kernel("swiglu_halves" + storage_key({&gate_up, &dst}),
                  [&] { return swiglu_halves_template(gate_up.storage(), dst.storage()); });
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
  INFERD_RETURN_IF_ERROR(require_bytes(q_out, t * static_cast<size_t>(g.n_embd()) * 2, "rope_kv q_out"));
  INFERD_RETURN_IF_ERROR(require_bytes(cache, g.layer_cache_bytes(), "rope_kv cache"));
  if (bias != nullptr) {
    INFERD_RETURN_IF_ERROR(
        require_bytes(bias, static_cast<size_t>(g.n_embd() + 2 * g.n_embd_kv()) * sizeof(float), "rope_kv bias"));
  }
  const bool normal = g.rope_mode == RopeMode::kNormal;
  auto kn = kernel(std::string(normal ? "rope_kv_normal" : "rope_kv_neox") + storage_key({q.tensor, k.tensor, v.tensor}),
                   [&] { return rope_kv_template(g.rope_mode, q.tensor->storage(), k.tensor->storage(), v.tensor->storage()); });
  if (!kn) return kn.status();
  // As the CPU reference (ops.cpp rope_head): the float overload of pow.
  const float theta_scale = std::pow(g.rope_base, -2.0f / static_cast<float>(g.head_dim));
  KernelArgs args(kn.value()->kernel.get());
  args.tensor(*q.tensor).tensor(*k.tensor).tensor(*v.tensor);
  args.value(cl_int{q.first_slice}).value(cl_int{k.first_slice}).value(cl_int{v.first_slice}).buffer(bias);
  args.buffer(tokens.positions).buffer(tokens.slots);
  args.value(cl_int{g.n_head}).value(cl_int{g.n_head_kv}).value(cl_int{g.head_dim}).value(cl_int{g.n_ctx});
  args.value(theta_scale).buffer(q_out).buffer(cache);
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
                  [&] { return attention_template(g.head_dim, out.storage()); });
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

}  // namespace inferd::opencl
