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
              "__global const float4* wm"};
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
    w_load(wq, ws, wm, so, si, n_si, r);
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
    w_load(wq, ws, wm, so, si, n_si, r);
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

size_t floor_pow2(size_t v) {
  size_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

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
                  [&] { return matmul_template(w.type(), variant, x.storage(), y.storage()); });
  if (!k) return k.status();
  KernelArgs args(k.value()->kernel.get());
  args.tensor(x).tensor(y).buffer(w.values()).buffer(w.scales()).buffer(w.mins());
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

}  // namespace inferd::opencl
