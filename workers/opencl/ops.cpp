#include "inferd/opencl/ops.h"

#include <CL/cl_ext.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/kernels/opencl_sources.h"

namespace inferd::opencl {

// ---- KernelArgs ----------------------------------------------------------------------------------

void KernelArgs::set(size_t size, const void* value) {
  const cl_uint index = next_++;
  if (!status_ || kernel_ == nullptr) return;  // no kernel: Ops is collecting
  const cl_int err = clSetKernelArg(kernel_, index, size, value);
  if (err != CL_SUCCESS) status_ = cl_error(err, "clSetKernelArg(" + std::to_string(index) + ")");
  if (log_ != nullptr) {
    RecordedArg a;
    a.index = index;
    a.size = size;
    a.local = value == nullptr;
    if (!a.local) {
      INFERD_ASSERT(size <= RecordedArg::kMaxBytes, "a kernel argument of %zu bytes", size);
      std::memcpy(a.bytes.data(), value, size);
    }
    log_->push_back(a);
  }
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
// the accessors of codegen.h only, so one text serves every storage. The OpenCL C text is in
// kernels/opencl/*.cl: these functions join its sections, whose notes there say how each kernel is
// launched and what it computes.

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

// One file of kernels/opencl: file("section") is a section's text, file("section", {{"name", value}})
// the text with its placeholders @name@ filled (inferd/kernels/opencl_sources.h).
struct ClFile {
  const char* name;
  std::string_view operator()(std::string_view section) const { return kernels::opencl_section(name, section); }
  std::string operator()(std::string_view section,
                         std::initializer_list<std::pair<std::string_view, std::string_view>> values) const {
    return kernels::opencl_section(name, section, values);
  }
};
constexpr ClFile kHelpersCl{"helpers.cl"};
constexpr ClFile kElementwiseCl{"elementwise.cl"};
constexpr ClFile kNormCl{"norm.cl"};
constexpr ClFile kRopeKvCl{"rope_kv.cl"};
constexpr ClFile kAttentionCl{"attention.cl"};
constexpr ClFile kQuantizeCl{"quantize.cl"};
constexpr ClFile kWeightsCl{"weights.cl"};
constexpr ClFile kMatmulFloatCl{"matmul_float.cl"};
constexpr ClFile kMatmulExactCl{"matmul_exact.cl"};

std::string join(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

// The tree reduction of `scratch` into scratch[0] with `op` (helpers.cl).
std::string reduce_code(std::string_view op) { return kHelpersCl("reduce", {{"op", op}}); }

KernelTemplate elementwise_template(const std::string& name, const std::string& expr, const char* helpers,
                                    TensorFormat a, TensorFormat b, TensorFormat dst) {
  KernelTemplate k;
  k.name = name;
  k.tensors = {{"lhs", a, Access::kRead}, {"rhs", b, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.helpers = helpers;
  k.body = kElementwiseCl("binary", {{"expr", expr}});
  return k;
}

KernelTemplate rms_norm_template(TensorFormat src, TensorFormat weight, TensorFormat dst) {
  KernelTemplate k;
  k.name = "rms_norm";
  k.tensors = {{"src", src, Access::kRead}, {"weight", weight, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"int group_slices", "float eps", "__local float* scratch"};
  k.body = join({kNormCl("group_prologue"), kNormCl("rms_norm.sum_squares"), reduce_code("inferd_add"),
                 kNormCl("rms_norm.scale")});
  k.helpers = kNormCl("add");
  return k;
}

KernelTemplate softmax_template(TensorFormat src, TensorFormat mask, TensorFormat dst) {
  KernelTemplate k;
  k.name = "softmax";
  k.tensors = {{"src", src, Access::kRead}, {"mask", mask, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"float scale", "__local float* scratch"};
  k.helpers = kNormCl("softmax.helpers");
  k.body = join({kHelpersCl("row_prologue"), kNormCl("softmax.max"), reduce_code("fmax"), kNormCl("softmax.sum"),
                 reduce_code("inferd_add"), kNormCl("softmax.normalize")});
  return k;
}

KernelTemplate rope_template(RopeMode mode, TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = mode == RopeMode::kNormal ? "rope_normal" : "rope_neox";
  k.tensors = {{"src", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"__global const int* pos", "float theta_scale"};
  k.body = kRopeKvCl(mode == RopeMode::kNormal ? "rope.normal" : "rope.neox");
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
    case DType::kQ6_K:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS: return "ushort4";
    default: return nullptr;
  }
}

// The 256-element types with sub-block scales (MatmulWeights::sub_scales), read by matmul_exact.cl's k.*.
bool is_k_quant(DType type) {
  switch (type) {
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_XS: return true;
    default: return false;
  }
}
// Sub-block scale entries (char4, one per row) per super-block: Q2_K's 16 scales and 16 mins, else 16
// (Q4_K / Q5_K: 8 scales and 8 mins; Q6_K, Q3_K: 16 scales; IQ4_XS: 8 scales, 8 unused).
int sub_scales_per_block(DType type) { return type == DType::kQ2_K ? 32 : 16; }

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

// The parameters every weight-reading kernel takes, in KernelArgs::weights() order.
std::vector<std::string> weight_params(DType type) {
  return {std::string("__global const ") + weight_pointer_type(type) + "* wq", "__global const float4* ws",
          "__global const float4* wm", "__global const char4* wsub",
          std::string("__global const ") + high_bits_type(type) + "* wh"};
}

bool has_min(DType type) { return type == DType::kQ4_1 || type == DType::kQ5_1; }

// weights.cl's loader `loader` ("w_load", "w_int", "w_int8", "w_code") of `type`.
std::string_view weight_loader(const char* loader, DType type) {
  return kWeightsCl(std::string(loader) + "." + dtype_name(type));
}

// The matmul kernels write each output as $y.Write(INFERD_OUT(v, t, s), t, 0, s): v itself, or with a
// residual tensor `res` (the graph's matmul_add) v + res[t, s] as a separate float add after v is rounded to
// float, which is how the CPU engine adds it (the same bits as an add kernel on y).
std::string define_out(bool residual) {
  return residual ? "#define INFERD_OUT(inferd_v, inferd_t, inferd_s) ((inferd_v) + $res.Read((inferd_t), 0, (inferd_s)))\n"
                  : "#define INFERD_OUT(inferd_v, inferd_t, inferd_s) (inferd_v)\n";
}

// Adds the residual tensor to a matmul template's tensors, and INFERD_OUT to its body.
void with_residual(KernelTemplate& k, const std::optional<TensorFormat>& residual) {
  if (residual) k.tensors.push_back({"res", *residual, Access::kRead});
  k.body = define_out(residual.has_value()) + k.body;
}

// The prefill kernel tiled in local memory (matmul_float.cl's prefill_tiled): 16 output slices x 64 tokens
// per work-group of 16 x 16, two tiles of 512 float4s.
constexpr int kTiledPrefill = 0;  // matmul_template's prefill_tokens for the tiled kernel
constexpr size_t kTileGroup = 16, kTileTokens = 64, kTileFloat4s = 512;

// The float decode matmul (matmul_float.cl's decode) in `shape`: y = W x (+ residual), or with `swiglu`
// y = silu(gate) * up of a stacked gate|up W (Ops::matmul_swiglu).
// rope_kv's bias, placement and destination parameters, in the order rope_kv.cl's kernel and the decode
// kernel's rope_kv store take them after their own (bind_rope_kv binds them).
std::vector<std::string> rope_kv_params() {
  return {"__global const float* bias", "__global const int* pos", "__global const int* slot",
          "__global const float* rope", "int n_head", "int n_head_kv", "int head_dim",
          "__global const int* kv_table", "int bps", "__global half* q_out", "__global half* cache", "float q_scale"};
}

// What a float decode kernel's store writes: y = W x (+ residual), silu(gate) * up of a stacked gate|up W
// (Ops::matmul_swiglu), or rope_kv's outputs of a stacked Q|K|V W (Ops::matmul_rope_kv; no y tensor).
enum class DecodeStore { kPlain, kSwiglu, kRopeKv };

// `norm`: the format of an RMSNorm's weight folded into the loads of x (Ops::DecodeNorm).
KernelTemplate decode_template(DType type, TensorFormat x, std::optional<TensorFormat> y, DecodeShape shape,
                               DecodeStore store, const std::optional<TensorFormat>& residual,
                               const std::optional<TensorFormat>& norm = std::nullopt) {
  const bool swiglu = store == DecodeStore::kSwiglu;
  KernelTemplate k;
  k.name = swiglu ? "matmul_decode_swiglu" : store == DecodeStore::kRopeKv ? "matmul_decode_rope_kv" : "matmul_decode";
  k.tensors = {{"x", x, Access::kRead}};
  if (y) k.tensors.push_back({"y", *y, Access::kWrite});
  if (norm) k.tensors.push_back({"nw", *norm, Access::kRead});
  k.params = weight_params(type);
  if (norm) k.params.push_back("float eps");
  if (store == DecodeStore::kRopeKv) {
    for (std::string& p : rope_kv_params()) k.params.push_back(std::move(p));
  }
  k.params.push_back("__local float4* scratch");
  k.helpers = join({kWeightsCl("codes"), weight_loader("w_load", type), swiglu ? kHelpersCl("float_silu") : "",
                    store == DecodeStore::kRopeKv ? kRopeKvCl("rope_kv.helpers") : ""});
  const std::string slices = std::to_string(shape.slices);
  const std::string store_text = swiglu                               ? kMatmulFloatCl("decode.store_swiglu", {{"slices", slices}})
                                 : store == DecodeStore::kRopeKv ? std::string(kMatmulFloatCl("decode.store_rope_kv"))
                                                                 : std::string(kMatmulFloatCl("decode.store"));
  k.body = kMatmulFloatCl("decode", {{"slices", slices},
                                     {"ahead", std::to_string(shape.ahead)},
                                     {"halves", swiglu ? "2" : "1"},
                                     {"norm", norm ? std::string(kMatmulFloatCl("decode.norm")) : std::string()}}) +
           store_text;
  k.body = std::string(norm ? "#define INFERD_X(inferd_si) ($x.Read(t, 0, (inferd_si)) * inferd_scale * $nw.Read(0, 0, (inferd_si)))\n"
                            : "#define INFERD_X(inferd_si) $x.Read(t, 0, (inferd_si))\n") +
           (y ? "#define INFERD_N_SO $y.Slices()\n" : "#define INFERD_N_SO ((n_head + 2 * n_head_kv) * (head_dim / 4))\n") +
           k.body;
  if (store == DecodeStore::kPlain) with_residual(k, residual);
  return k;
}

// `shape`: the decode kernel's work-group shape; `prefill_tokens`: the prefill kernel's tokens per work-item,
// or kTiledPrefill.
KernelTemplate matmul_template(DType type, MatmulVariant variant, TensorFormat x, TensorFormat y, DecodeShape shape,
                               int prefill_tokens, const std::optional<TensorFormat>& residual) {
  if (variant == MatmulVariant::kDecode) return decode_template(type, x, y, shape, DecodeStore::kPlain, residual);
  KernelTemplate k;
  k.name = "matmul_prefill";
  k.tensors = {{"x", x, Access::kRead}, {"y", y, Access::kWrite}};
  k.params = weight_params(type);
  k.helpers = join({kWeightsCl("codes"), weight_loader("w_load", type)});
  if (prefill_tokens == kTiledPrefill) {
    k.params.push_back("__local float4* wtile");
    k.params.push_back("__local float4* xtile");
    k.body = kMatmulFloatCl("prefill_tiled");
  } else {
    k.body = kMatmulFloatCl("prefill", {{"tt", std::to_string(prefill_tokens)}});
  }
  with_residual(k, residual);
  return k;
}

// ---- The forward pass's own kernels ----

KernelTemplate get_rows_template(DType type, TensorFormat dst) {
  KernelTemplate k;
  k.name = "get_rows";
  k.tensors = {{"dst", dst, Access::kWrite}};
  k.params = weight_params(type);
  k.params.insert(k.params.begin(), "__global const int* rows");
  k.params.push_back("float scale");
  k.helpers = join({kWeightsCl("codes"), weight_loader("w_load", type)});
  k.body = kMatmulFloatCl("get_rows");
  return k;
}

KernelTemplate gather_template(TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = "gather";
  k.tensors = {{"src", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"__global const int* rows"};
  k.body = kElementwiseCl("gather");
  return k;
}

// `exact`: kernels::silu's operations (helpers.cl's exact_helpers), else the float form.
KernelTemplate swiglu_halves_template(TensorFormat src, TensorFormat dst, bool exact) {
  KernelTemplate k;
  k.name = exact ? "swiglu_halves_exact" : "swiglu_halves";
  k.tensors = {{"gu", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.helpers = kHelpersCl(exact ? "exact_helpers" : "float_silu");
  k.body = kElementwiseCl("swiglu_halves", {{"silu", exact ? "inferd_silu4" : "inferd_silu"}});
  return k;
}

// gelu(gate) * up from the CPU's F16 gelu table (elementwise.cl's geglu): two tensors, or the halves of one.
KernelTemplate geglu_template(TensorFormat gate, TensorFormat up, TensorFormat dst) {
  KernelTemplate k;
  k.name = "geglu";
  k.tensors = {{"gate", gate, Access::kRead}, {"up", up, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"__global const ushort* gelu"};
  k.helpers = kElementwiseCl("geglu.helpers");
  k.body = kElementwiseCl("geglu");
  return k;
}

KernelTemplate geglu_halves_template(TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = "geglu_halves";
  k.tensors = {{"gu", src, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"__global const ushort* gelu"};
  k.helpers = kElementwiseCl("geglu.helpers");
  k.body = kElementwiseCl("geglu_halves");
  return k;
}

KernelTemplate rope_kv_template(RopeMode mode, TensorFormat q, TensorFormat k_storage, TensorFormat v) {
  KernelTemplate k;
  k.name = mode == RopeMode::kNormal ? "rope_kv_normal" : "rope_kv_neox";
  k.tensors = {{"q", q, Access::kRead}, {"k", k_storage, Access::kRead}, {"v", v, Access::kRead}};
  k.params = {"int q_slice", "int k_slice", "int v_slice"};
  for (std::string& p : rope_kv_params()) k.params.push_back(std::move(p));
  k.helpers = kRopeKvCl("rope_kv.helpers");
  k.body = join({kRopeKvCl("rope_kv.head"), kRopeKvCl(mode == RopeMode::kNormal ? "rope_kv.normal" : "rope_kv.neox")});
  return k;
}

std::string define_hd4(int32_t head_dim) {
  return kAttentionCl("define_hd4", {{"hd4", std::to_string(head_dim / 4)}});
}

KernelTemplate attention_template(int32_t head_dim, TensorFormat out) {
  KernelTemplate k;
  k.name = "attention";
  k.tensors = {{"out", out, Access::kWrite}};
  k.params = {"__global const half* q", "__global const half* cache", "__global const int* pos",
              "__global const int* slot", "__global const int* kv_table", "int bps", "int n_head", "int n_head_kv",
              "int kv_pad", "float scale", "int window", "__local float* lane_sum", "__local float4* lane_acc",
              "__local float4* q_local"};
  k.helpers = define_hd4(head_dim);
  k.body = join({kAttentionCl("attention.head"), kAttentionCl("attention.all"), kAttentionCl("attention.positions"),
                 kAttentionCl("attention.store")});
  return k;
}

KernelTemplate attention_part_template(int32_t head_dim) {
  KernelTemplate k;
  k.name = "attention_part";
  k.params = {"__global float4* part", "int chunk", "__global const half* q", "__global const half* cache",
              "__global const int* pos", "__global const int* slot", "__global const int* kv_table", "int bps",
              "int n_head", "int n_head_kv", "int kv_pad", "float scale", "int window",
              "__local float* lane_sum", "__local float4* lane_acc", "__local float4* q_local"};
  k.helpers = define_hd4(head_dim);
  k.body = join({kAttentionCl("attention.head"), kAttentionCl("attention_part.chunk"),
                 kAttentionCl("attention.positions"), kAttentionCl("attention_part.store")});
  return k;
}

KernelTemplate attention_merge_template(int32_t head_dim, TensorFormat out) {
  KernelTemplate k;
  k.name = "attention_merge";
  k.tensors = {{"out", out, Access::kWrite}};
  k.params = {"__global const float4* part", "int n_head", "int n_chunks"};
  k.helpers = define_hd4(head_dim);
  k.body = kAttentionCl("attention_merge");
  return k;
}

// ---- Exact kernels (ops.h: the CPU engine's arithmetic) ----

KernelTemplate rms_norm_exact_template(TensorFormat src, TensorFormat weight, TensorFormat dst) {
  KernelTemplate k;
  k.name = "rms_norm_exact";
  k.tensors = {{"src", src, Access::kRead}, {"weight", weight, Access::kRead}, {"dst", dst, Access::kWrite}};
  k.params = {"int group_slices", "float eps", "__local float* scratch"};
  k.helpers = kHelpersCl("exact_helpers");
  k.body = join({kNormCl("group_prologue"), kNormCl("rms_norm_exact")});
  return k;
}

KernelTemplate quantize_q8_template(TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = "quantize_q8";
  k.tensors = {{"x", src, Access::kRead}, {"quants", dst, Access::kWrite}};
  k.params = {"__global float2* scales"};
  k.helpers = kHelpersCl("exact_helpers");
  k.body = kQuantizeCl("quantize_q8");
  return k;
}

std::string define_tt(int tokens_per_item) {
  return kMatmulExactCl("define_tt", {{"tt", std::to_string(tokens_per_item)}});
}

std::string define_q8k_floats() {
  return kQuantizeCl("define_q8k_floats", {{"floats", std::to_string(kQ8KBlockFloats)}});
}

KernelTemplate matmul_exact_k_template(DType type, CpuOrder order, int tokens_per_item, TensorFormat x, TensorFormat y,
                                       bool repacked, const std::optional<TensorFormat>& residual);

// Whether the exact matmul of `type` in `order` for a pass of `tokens` sums IQ4_NL's blocks in pairs
// (ggml's vec_dot, which the CPU engine runs for one token; more go through its GEMM's single chain).
bool iq4nl_pairs(DType type, CpuOrder order, int32_t tokens) {
  return type == DType::kIQ4_NL && order == CpuOrder::kX86 && tokens == 1;
}

// The exact matmul (matmul_exact.cl says what each variant sums in which order). `native_int_dot`:
// IntDot::kInt8 through the device's dot(char4, char4); `pairs`: iq4nl_pairs().
KernelTemplate matmul_exact_template(DType type, CpuOrder order, int tokens_per_item, TensorFormat x, TensorFormat y,
                                     IntDot int_dot, bool native_int_dot, bool pairs, bool repacked,
                                     const std::optional<TensorFormat>& residual) {
  if (is_k_quant(type)) return matmul_exact_k_template(type, order, tokens_per_item, x, y, repacked, residual);
  KernelTemplate k;
  k.name = "matmul_exact";
  k.tensors = {{"x", x, Access::kRead}, {"y", y, Access::kWrite}};
  k.params = weight_params(type);
  k.params.push_back("__global const float2* xs");
  const bool blocks = matmul_activations(type) == MatmulActivations::kQ8;
  const bool q4_1 = has_min(type);  // a min term
  k.helpers = join({define_tt(tokens_per_item), kHelpersCl("exact_helpers"), kWeightsCl("codes")});
  if (!blocks) {
    k.helpers += weight_loader("w_load", type);
  } else if (int_dot == IntDot::kInt8) {
    k.helpers += join({native_int_dot ? kMatmulExactCl("int_dot.native") : "", kMatmulExactCl("int_dot.helpers"),
                       weight_loader("w_int8", type), kMatmulExactCl("int_dot.int8")});
  } else {
    k.helpers += join({weight_loader("w_int", type), kMatmulExactCl("int_dot.float")});
  }
  const ClFile& cl = kMatmulExactCl;
  if (pairs) {
    k.body = join({cl("head"), cl("iq4nl_x86")});
  } else if (repacked) {
    k.body = join({cl("head"), cl("q8_scalar"), cl("q8_repacked.sum"), cl("q8_scalar.write")});
  } else if (blocks && order == CpuOrder::kX86) {
    k.body = join({cl("head"), cl("q8_x86"), q4_1 ? cl("q8_x86.min_chain") : "", cl("q8_x86.hsum"),
                   cl(q4_1 ? "q8_x86.write_with_min" : "q8_x86.write")});
  } else if (blocks) {
    k.body = join({cl("head"), cl("q8_scalar"), cl(q4_1 ? "q8_scalar.sum_with_min" : "q8_scalar.sum"),
                   cl("q8_scalar.write")});
  } else {
    k.body = join({cl("head"), cl(order == CpuOrder::kX86 ? "float_x86" : "float_scalar")});
  }
  with_residual(k, residual);
  return k;
}

// The exact matmul of K-quant weights against quantize_q8_k()'s blocks (matmul_exact.cl's k.*).
KernelTemplate matmul_exact_k_template(DType type, CpuOrder order, int tokens_per_item, TensorFormat x, TensorFormat y,
                                       bool repacked, const std::optional<TensorFormat>& residual) {
  // MatmulOrder::kRepacked: Q4_K's repacked order, or llama.cpp's tiled K-quant GEMM (the other K-quants, IQ4_XS).
  const bool tiled = repacked && type != DType::kQ4_K;
  KernelTemplate k;
  k.name = "matmul_exact_k";
  k.tensors = {{"x", x, Access::kRead}, {"y", y, Access::kWrite}};
  k.params = weight_params(type);
  k.params.push_back("__global const float* xk");
  const bool q6 = type == DType::kQ6_K;
  const bool q2 = type == DType::kQ2_K;
  const bool signed_values = type == DType::kQ3_K || type == DType::kIQ4_XS;  // no min, no offset
  const bool groups16 = q6 || q2 || type == DType::kQ3_K;                     // a scale per 16 elements
  const bool x86 = order == CpuOrder::kX86;
  const ClFile& cl = kMatmulExactCl;
  k.helpers = join({define_tt(tokens_per_item), define_q8k_floats(), kHelpersCl("exact_helpers"), kWeightsCl("codes"),
                    weight_loader("w_code", type),
                    cl("k.subs", {{"subs", std::to_string(sub_scales_per_block(type))}}), cl("k.helpers")});
  const bool has_dmin = !q6 && !signed_values;
  std::string body = join({cl("head"), cl("k.sums"), cl(groups16 ? "k.scale_q6" : "k.scale"),
                           cl(repacked && !tiled ? "k.dots_repacked" : "k.dots"),  // the tiled branch's vec_dot order needs the lanes
                           has_dmin ? cl("k.dmin") : "", cl("k.rows")});
  // The vec_dot order's steps (the tiled order's below kTiledMinRows tokens).
  std::string vec_dot;
  if (q6 || signed_values) {
    body += cl(q6 ? "k.q6_offsets" : "k.no_offsets");
    vec_dot = cl(x86 ? "k.q6_x86" : "k.q6_scalar");
  } else if (q2) {
    vec_dot = cl(x86 ? "k.q2_x86" : "k.q2_scalar");
  } else {
    body += cl("k.mins");
    if (!x86) {
      vec_dot = cl("k.mins_scalar");
    } else {
      vec_dot = join({cl("k.mins_x86"), cl(type == DType::kQ4_K ? "k.mins_x86_q4_k" : "k.mins_x86_q5_k"), cl("k.acc_x86")});
    }
  }
  const char* out = !x86                          ? "k.out_scalar"
                    : q6 || q2 || signed_values     ? "k.out_q6"
                    : type == DType::kQ4_K          ? "k.out_q4_k"
                                                    : "k.out_q5_k";
  if (tiled) {
    // llama.cpp's tiled K-quant GEMM from kTiledMinRows tokens on (a branch uniform over the launch), the vec_dot
    // order below.
    const char* step = q6 || signed_values ? "k.tiled" : q2 ? "k.tiled_q2" : "k.tiled_mins";
    body += join({"        if (n_t >= TILED_MIN_ROWS) {\n", cl(step), "        } else {\n", vec_dot, "        }\n"});
    k.helpers += "#define TILED_MIN_ROWS " + std::to_string(kernels::kTiledMinRows) + "\n";
    k.body = body + join({cl("k.out"), "      if (n_t >= TILED_MIN_ROWS) {\n", cl("k.out_scalar"), "      } else {\n",
                          cl(out), "      }\n", cl("k.write")});
  } else if (repacked) {
    k.body = body + join({cl("k.mins_repacked"), cl("k.out"), cl("k.out_repacked"), cl("k.write")});
  } else {
    k.body = body + join({vec_dot, cl("k.out"), cl(out), cl("k.write")});
  }
  with_residual(k, residual);
  return k;
}

KernelTemplate quantize_q8_k_template(TensorFormat src, TensorFormat dst) {
  KernelTemplate k;
  k.name = "quantize_q8_k";
  k.tensors = {{"x", src, Access::kRead}, {"quants", dst, Access::kWrite}};
  k.params = {"__global float* blocks"};
  k.helpers = join({define_q8k_floats(), kHelpersCl("exact_helpers")});
  k.body = kQuantizeCl("quantize_q8_k");
  return k;
}

KernelTemplate attention_exact_template(int32_t head_dim, CpuOrder order, TensorFormat out) {
  KernelTemplate k;
  k.name = "attention_exact";
  k.tensors = {{"out", out, Access::kWrite}};
  k.params = {"__global const half* q",  "__global const half* cache",       "__global const int* pos",
              "__global const int* slot", "__global const int* kv_table",    "int bps",
              "int first_token",          "int n_head",                      "int n_head_kv",
              "int kv_pad",               "float scale",                     "int window",
              "__global float* scores",
              "__local float* scratch",   "__local float* chains"};
  k.helpers = join({define_hd4(head_dim), kHelpersCl("exact_helpers"),
                    kAttentionCl(order == CpuOrder::kScalar ? "qk.scalar" : "qk.x86")});
  k.body = join({kAttentionCl("attention_exact.scores"), reduce_code("fmax"), kAttentionCl("attention_exact.kqv")});
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

// The block tables' bytes (TokenPlacement::kv_table).
size_t table_bytes(const AttentionGeometry& g) {
  return static_cast<size_t>(g.n_slots) * static_cast<size_t>(g.blocks_per_slot()) * sizeof(cl_int);
}
// The buffers rope_kv reads and writes for `tokens` tokens, checked against the geometry (`op` names the caller).
Status check_rope_kv_buffers(const char* op, const AttentionGeometry& g, size_t tokens, cl_mem bias,
                             const TokenPlacement& placement, cl_mem q_out, cl_mem cache) {
  const std::string o(op);
  INFERD_RETURN_IF_ERROR(require_bytes(placement.positions, tokens * sizeof(cl_int), (o + " positions").c_str()));
  INFERD_RETURN_IF_ERROR(require_bytes(placement.slots, tokens * sizeof(cl_int), (o + " slots").c_str()));
  INFERD_RETURN_IF_ERROR(
      require_bytes(placement.rope, tokens * static_cast<size_t>(g.head_dim) * sizeof(float), (o + " rope").c_str()));
  INFERD_RETURN_IF_ERROR(require_bytes(placement.kv_table, table_bytes(g), (o + " KV table").c_str()));
  INFERD_RETURN_IF_ERROR(require_bytes(q_out, tokens * static_cast<size_t>(g.n_embd()) * 2, (o + " q_out").c_str()));
  INFERD_RETURN_IF_ERROR(require_bytes(cache, g.layer_cache_bytes(), (o + " cache").c_str()));
  if (bias == nullptr) return Status::ok();
  return require_bytes(bias, static_cast<size_t>(g.n_embd() + 2 * g.n_embd_kv()) * sizeof(float), (o + " bias").c_str());
}

// Binds rope_kv_params().
void bind_rope_kv(KernelArgs& args, const AttentionGeometry& g, cl_mem bias, const TokenPlacement& placement,
                  cl_mem q_out, cl_mem cache, float q_scale) {
  args.buffer(bias).buffer(placement.positions).buffer(placement.slots).buffer(placement.rope);
  args.value(cl_int{g.n_head}).value(cl_int{g.n_head_kv}).value(cl_int{g.head_dim});
  args.buffer(placement.kv_table).value(cl_int{g.blocks_per_slot()}).buffer(q_out).buffer(cache).value(q_scale);
}

// rope_kv.cl and attention.cl find a position's row as p >> 6 and p & 63.
static_assert(graph::kKvBlockTokens == 64, "the KV kernels hard-code blocks of 64 positions");

bool is_token_rows(const Bhwc& s) { return s.b == 1 && s.h == 1; }

// A gated activation over the halves of one gate|up tensor: dst has half its channels (a multiple of 4).
Status require_halves(const char* op, const Tensor& gate_up, const Tensor& dst) {
  const Bhwc& s = gate_up.shape();
  const Bhwc& d = dst.shape();
  if (is_token_rows(s) && is_token_rows(d) && d.c % 4 == 0 && s.c == 2 * d.c && s.w == d.w) return Status::ok();
  return make_error(Code::kInvalidArgument, "%s: gate_up %s, dst %s", op, s.to_string().c_str(), d.to_string().c_str());
}

Status require_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() == b.shape()) return Status::ok();
  return make_error(Code::kInvalidArgument, "%s: shapes %s and %s differ", op, a.shape().to_string().c_str(),
                    b.shape().to_string().c_str());
}

// A matmul's residual (none, or y's shape in another tensor: a kernel never reads what it writes).
Status check_residual(const char* op, const Tensor& y, const Tensor* residual) {
  if (residual == nullptr) return Status::ok();
  INFERD_RETURN_IF_ERROR(require_same_shape(op, y, *residual));
  if (residual->memory(0) == y.memory(0)) {
    return make_error(Code::kInvalidArgument, "%s: the residual is the output's own memory", op);
  }
  return Status::ok();
}

// One weight block as the kernels read it (ops.h's layouts): the codes of its elements in order,
// its scale d, its min (Q4_1, Q5_1) or min scale dmin (Q4_K, Q5_K), and a K-quant's sub-block scales.
struct DecodedBlock {
  int codes[256];
  float d = 0.0f, m = 0.0f;
  int8_t sub[32] = {};
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
      std::memcpy(out.sub, b.scales, sizeof(b.scales));
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
    case DType::kQ2_K: {  // codes 0..3, chunk c of 32 bytes holding groups 4c'..: ggml's dequantize_row_q2_K
      const auto b = read_block<BlockQ2_K>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      out.m = kernels::fp16_to_fp32(b.dmin);
      for (int g = 0; g < 16; ++g) {
        out.sub[g] = static_cast<int8_t>(b.scales[g] & 0xF);
        out.sub[16 + g] = static_cast<int8_t>(b.scales[g] >> 4);
      }
      for (int c = 0; c < 2; ++c) {
        for (int j = 0; j < 4; ++j) {
          for (int l = 0; l < 32; ++l) out.codes[128 * c + 32 * j + l] = (b.qs[32 * c + l] >> (2 * j)) & 3;
        }
      }
      return;
    }
    case DType::kQ3_K: {  // codes value + 4 (0..7), scales sc - 32: ggml's dequantize_row_q3_K
      const auto b = read_block<BlockQ3_K>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      int sc[16];
      q3_k_scales(b, sc);
      for (int g = 0; g < 16; ++g) out.sub[g] = static_cast<int8_t>(sc[g] - 32);
      for (int c = 0; c < 2; ++c) {
        for (int j = 0; j < 4; ++j) {
          const int bit = 4 * c + j;
          for (int l = 0; l < 32; ++l) {
            const int low = (b.qs[32 * c + l] >> (2 * j)) & 3;
            out.codes[128 * c + 32 * j + l] = low + (((b.hmask[l] >> bit) & 1) ? 4 : 0);
          }
        }
      }
      return;
    }
    case DType::kIQ4_NL: {  // the 4-bit codes (indices into the non-linear values), as Q4_0's nibbles
      const auto b = read_block<BlockIQ4_NL>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      for (int j = 0; j < 16; ++j) {
        out.codes[j] = b.qs[j] & 0x0F;
        out.codes[j + 16] = b.qs[j] >> 4;
      }
      return;
    }
    case DType::kIQ4_XS: {  // the codes of 8 sub-blocks of 32, each with its scale ls - 32
      const auto b = read_block<BlockIQ4_XS>(p);
      out.d = kernels::fp16_to_fp32(b.d);
      for (int s = 0; s < 8; ++s) {
        out.sub[s] = static_cast<int8_t>((((b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0F) | (((b.scales_h >> (2 * s)) & 3) << 4)) - 32);
        for (int j = 0; j < 16; ++j) {
          out.codes[32 * s + j] = b.qs[16 * s + j] & 0x0F;
          out.codes[32 * s + 16 + j] = b.qs[16 * s + j] >> 4;
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
  const bool has_mins = type == DType::kQ4_1 || type == DType::kQ5_1 || type == DType::kQ4_K || type == DType::kQ5_K ||
                        type == DType::kQ2_K;
  const size_t per_row_block = static_cast<size_t>(n_so * n_blocks) * 4;
  const size_t n_sub = static_cast<size_t>(sub_scales_per_block(type));
  std::vector<float> scales(per_row_block, 0.0f);
  std::vector<float> mins(has_mins ? per_row_block : 0, 0.0f);
  std::vector<int8_t> sub(k_quant ? per_row_block * n_sub : 0, 0);
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
        for (size_t j = 0; j < n_sub; ++j) sub[(blk * n_sub + j) * 4 + static_cast<size_t>(o4)] = dec.sub[j];
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
  if (n_head < 1 || n_head_kv < 1 || head_dim < 1 || n_slots < 1 || n_ctx < 1 || n_blocks < 1) {
    return make_error(Code::kInvalidArgument,
                      "attention: heads %d/%d, head_dim %d, %d slots of %d positions, %d KV blocks", n_head, n_head_kv,
                      head_dim, n_slots, n_ctx, n_blocks);
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

const char* prefill_kernel_name(PrefillKernel kernel) { return kernel == PrefillKernel::kTiled ? "tiled" : "simple"; }

std::string DecodeShape::to_string() const { return std::to_string(slices) + "x" + std::to_string(ahead); }

Result<DecodeShape> parse_decode_shape(std::string_view text) {
  auto number = [](std::string_view digits, int max, int& out) {
    if (digits.empty() || digits.size() > 2) return false;
    out = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return out >= 1 && out <= max;
  };
  const size_t x = text.find('x');
  DecodeShape shape;
  if (x == std::string_view::npos || !number(text.substr(0, x), kMaxDecodeSlices, shape.slices) ||
      !number(text.substr(x + 1), kMaxDecodeAhead, shape.ahead)) {
    return make_error(Code::kInvalidArgument, "decode shape '%.*s': expected RxU, R in [1, %d], U in [1, %d]",
                      static_cast<int>(text.size()), text.data(), kMaxDecodeSlices, kMaxDecodeAhead);
  }
  return shape;
}

std::vector<DecodeShape> decode_shape_candidates() { return {{1, 1}, {4, 1}, {8, 1}, {1, 4}}; }

DecodeShape default_decode_shape(const DeviceInfo& device) {
  // A CPU device (PoCL) gains from reading the input once for more rows (16-55% on an 8B-shaped projection);
  // a GPU is measured (OpenClBackend): there 4x fewer work-groups may leave compute units idle.
  return device.type == DeviceType::kCpu ? DecodeShape{4, 1} : DecodeShape{1, 1};
}

constexpr size_t kGpuNormLanes = 256;

void Ops::set_reduce_group_size(size_t lanes) {
  const DeviceInfo& info = rt_.info();
  const size_t limit = std::min(info.max_work_group_size, info.max_work_item_sizes[0]);
  reduce_group_size_ = floor_pow2(std::max<size_t>(1, std::min(lanes, limit)));
}

void Ops::set_decode_shape(DecodeShape shape) {
  INFERD_ASSERT(shape.slices >= 1 && shape.slices <= kMaxDecodeSlices && shape.ahead >= 1 &&
                    shape.ahead <= kMaxDecodeAhead,
                "decode shape %s out of range", shape.to_string().c_str());
  decode_shape_ = shape;
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
    case DType::kQ6_K:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_XS: return MatmulActivations::kQ8K;
    default: return MatmulActivations::kQ8;
  }
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
  // The exact kernels divide and take square roots correctly rounded, as the host does: with the
  // device's correctly rounded float operations where it offers them (helpers.cl's inferd_div and
  // inferd_sqrt), else through double. (NVIDIA's double route measured ulps off the host's.)
  build_options_ = kBuildOptions;
  if (info.fp32_correct_div_sqrt) build_options_ += " -cl-fp32-correctly-rounded-divide-sqrt -DINFERD_CR_DIVIDE_SQRT=1";
  const size_t wanted = info.type == DeviceType::kGpu ? 64 : 16;
  const size_t limit = std::min(info.max_work_group_size, info.max_work_item_sizes[0]);
  // The decode matmul keeps one float4 per lane in local memory.
  const size_t by_local = info.local_mem_bytes > 0 ? static_cast<size_t>(info.local_mem_bytes / 16) : wanted;
  reduce_group_size_ = floor_pow2(std::max<size_t>(1, std::min({wanted, limit, by_local})));
  decode_shape_ = default_decode_shape(info);
  // Tokens per float prefill work-item: on a CPU device (PoCL) more tokens per dequantized weight slice
  // pays (SmolLM2 prefill, 128 tokens: 59 -> 77 tok/s with 16; BENCHMARKS.md); a GPU keeps 4 until measured
  // there, and tiles in local memory instead (PoCL: the simple kernel with 16 was faster). The exact
  // prefill keeps its 4 everywhere: 8 was 15% faster on PoCL but took twice as long to compile (32
  // accumulators per token), and on a GPU would spill registers.
  prefill_tokens_ = info.type == DeviceType::kCpu ? 16 : 4;
  // A GPU's decode attention is split over the positions (a step's few (token, head) pairs would leave it
  // idle); a CPU device has work-groups enough without.
  attention_chunk_ = info.type == DeviceType::kCpu ? 0 : 64;
  // The tiled prefill kernel lost to the simple one on an NVIDIA H200 (pp512: 10.8k vs 13.3k tok/s on a
  // SmolLM2-shaped model, 421 vs 638 on an 8B-shaped one; BENCHMARKS.md): simple everywhere by default.
  prefill_kernel_ = PrefillKernel::kSimple;
}

void Ops::set_prefill_tokens(int tokens) {
  INFERD_ASSERT(tokens >= 1 && tokens <= kMaxPrefillTokens, "prefill tokens %d out of [1, %d]", tokens,
                kMaxPrefillTokens);
  prefill_tokens_ = tokens;
}

void Ops::set_exact_prefill_tokens(int tokens) {
  INFERD_ASSERT(tokens >= 1 && tokens <= kMaxExactPrefillTokens, "exact prefill tokens %d out of [1, %d]", tokens,
                kMaxExactPrefillTokens);
  exact_prefill_tokens_ = tokens;
}

namespace {
// The kernel `name` of `program` and its work-group limit.
Status make_kernel(cl_program program, const std::string& name, cl_device_id device, ClKernel& kernel, size_t& max_group) {
  cl_int err = CL_SUCCESS;
  kernel.reset(clCreateKernel(program, name.c_str(), &err));
  if (err != CL_SUCCESS) return cl_error(err, "clCreateKernel(" + name + ")");
  INFERD_CL_RETURN_IF_ERROR(
      clGetKernelWorkGroupInfo(kernel.get(), device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(max_group), &max_group, nullptr));
  return Status::ok();
}
}  // namespace

template <typename MakeTemplate>
Result<Ops::Kernel*> Ops::kernel(const std::string& key, MakeTemplate make) {
  if (collecting_) {  // nothing launches, not even the kernels built already
    const bool seen = kernels_.count(key) != 0 ||
                      std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.key == key; });
    if (!seen) {
      auto generated = generate_kernel(make());
      if (!generated) return generated.status();
      pending_.push_back(Pending{key, generated->name, std::move(generated->source)});
    }
    return &collecting_kernel_;
  }
  if (auto it = kernels_.find(key); it != kernels_.end()) return &it->second;
  auto generated = generate_kernel(make());
  if (!generated) return generated.status();
  auto program = rt_.build_program(generated->source, build_options_);
  if (!program) return program.status().with_context(key);
  Kernel k;
  INFERD_RETURN_IF_ERROR(make_kernel(program.value(), generated->name, rt_.device(), k.kernel, k.max_group));
  auto it = kernels_.emplace(key, std::move(k)).first;
  it->second.key = &it->first;
  return &it->second;
}

void Ops::begin_collect() {
  INFERD_ASSERT(!collecting_, "already collecting");
  collecting_ = true;
  pending_.clear();
}

Status Ops::build_collected() {
  INFERD_ASSERT(collecting_, "build_collected() without begin_collect()");
  collecting_ = false;
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  last_collected_ = pending.size();
  std::vector<std::string> sources;
  sources.reserve(pending.size());
  for (const Pending& p : pending) sources.push_back(p.source);
  std::vector<Result<cl_program>> programs = rt_.build_programs(sources, build_options_);
  for (size_t i = 0; i < pending.size(); ++i) {
    if (!programs[i]) return programs[i].status().with_context(pending[i].key);
    Kernel k;
    INFERD_RETURN_IF_ERROR(make_kernel(programs[i].value(), pending[i].name, rt_.device(), k.kernel, k.max_group));
    auto it = kernels_.emplace(pending[i].key, std::move(k)).first;
    it->second.key = &it->first;
  }
  return Status::ok();
}

size_t Ops::group_size(const Kernel& k) const {
  return floor_pow2(std::max<size_t>(1, std::min(reduce_group_size_, k.max_group)));
}

Status Ops::launch(const Kernel& k, cl_uint dims, const size_t* global, const size_t* local) {
  if (&k == &collecting_kernel_) return Status::ok();  // collecting: nothing is computed
  for (cl_uint d = 0; d < dims; ++d) {
    if (global[d] == 0) return Status::ok();  // nothing to do (cannot happen for valid shapes)
  }
  cl_event event = nullptr;
  if (recording_) {
    INFERD_RETURN_IF_ERROR(record_launch(k, dims, global, local, profiling_ ? &event : nullptr));
  } else {
    INFERD_CL_RETURN_IF_ERROR(clEnqueueNDRangeKernel(rt_.queue(), k.kernel.get(), dims, nullptr, global, local, 0,
                                                     nullptr, profiling_ ? &event : nullptr));
  }
  if (event != nullptr) profiled_.push_back(Profiled{k.key, ClEvent(event)});
  ++launches_;
  return Status::ok();
}

KernelArgs Ops::new_args(const Kernel& k) {
  arg_log_.clear();
  arg_log_kernel_ = k.kernel.get();
  return KernelArgs(k.kernel.get(), recording_ ? &arg_log_ : nullptr);
}

// The launch runs from its own kernel object, as a replay will run it: an argument the log lacks shows
// now (CL_INVALID_KERNEL_ARGS), not in a later step.
Status Ops::record_launch(const Kernel& k, cl_uint dims, const size_t* global, const size_t* local, cl_event* event) {
  Status st;
  if (arg_log_kernel_ != k.kernel.get()) st = Status(Code::kFailed, "a launch whose arguments were not logged");
  cl_program program = nullptr;
  char name[256] = {};
  if (st) {
    cl_int err = clGetKernelInfo(k.kernel.get(), CL_KERNEL_PROGRAM, sizeof(program), &program, nullptr);
    if (err == CL_SUCCESS) err = clGetKernelInfo(k.kernel.get(), CL_KERNEL_FUNCTION_NAME, sizeof(name), name, nullptr);
    if (err != CL_SUCCESS) st = cl_error(err, "clGetKernelInfo");
  }
  Recording::Launch l;
  if (st) {
    cl_int err = CL_SUCCESS;
    l.kernel.reset(clCreateKernel(program, name, &err));
    if (err != CL_SUCCESS) st = cl_error(err, "clCreateKernel");
  }
  for (size_t i = 0; st && i < arg_log_.size(); ++i) {
    const RecordedArg& a = arg_log_[i];
    const cl_int err = clSetKernelArg(l.kernel.get(), a.index, a.size, a.local ? nullptr : a.bytes.data());
    if (err != CL_SUCCESS) st = cl_error(err, "clSetKernelArg (recording)");
  }
  if (!st) {  // the step still runs, from the shared kernel; the recording is void
    if (record_status_) record_status_ = st;
    INFERD_CL_RETURN_IF_ERROR(
        clEnqueueNDRangeKernel(rt_.queue(), k.kernel.get(), dims, nullptr, global, local, 0, nullptr, event));
    return Status::ok();
  }
  l.dims = dims;
  l.has_local = local != nullptr;
  for (cl_uint d = 0; d < dims; ++d) {
    l.global[d] = global[d];
    if (local != nullptr) l.local[d] = local[d];
  }
  l.key = k.key;
  INFERD_CL_RETURN_IF_ERROR(clEnqueueNDRangeKernel(rt_.queue(), l.kernel.get(), dims, nullptr, l.global.data(),
                                                   l.has_local ? l.local.data() : nullptr, 0, nullptr, event));
  recording_launches_.launches_.push_back(std::move(l));
  return Status::ok();
}

void Ops::begin_record() {
  INFERD_ASSERT(!recording_ && !collecting_, "begin_record() while recording or collecting");
  recording_ = true;
  record_status_ = Status::ok();
  recording_launches_ = Recording();
}

Result<Ops::Recording> Ops::end_record() {
  INFERD_ASSERT(recording_, "end_record() without begin_record()");
  recording_ = false;
  arg_log_.clear();
  Recording r = std::move(recording_launches_);
  recording_launches_ = Recording();
  if (!record_status_) return record_status_;
  return r;
}

Status Ops::replay(const Recording& recording) {
  for (const Recording::Launch& l : recording.launches_) {
    cl_event event = nullptr;
    INFERD_CL_RETURN_IF_ERROR(clEnqueueNDRangeKernel(rt_.queue(), l.kernel.get(), l.dims, nullptr, l.global.data(),
                                                     l.has_local ? l.local.data() : nullptr, 0, nullptr,
                                                     profiling_ ? &event : nullptr));
    if (event != nullptr) profiled_.push_back(Profiled{l.key, ClEvent(event)});
    ++launches_;
  }
  return Status::ok();
}

void Ops::set_profiling(bool on) { profiling_ = on; }

Result<Profile> Ops::take_profile() {
  std::vector<Profiled> profiled = std::move(profiled_);
  profiled_.clear();
  std::map<std::string, KernelTime> by_kernel;
  Profile out;
  std::vector<double> enqueue_us;
  cl_ulong last_queued = 0, last_end = 0;
  for (const Profiled& p : profiled) {
    const cl_event e = p.event.get();
    INFERD_CL_RETURN_IF_ERROR(clWaitForEvents(1, &e));
    cl_ulong queued = 0, start = 0, end = 0;
    const cl_int err = clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_QUEUED, sizeof(queued), &queued, nullptr);
    if (err == CL_PROFILING_INFO_NOT_AVAILABLE) {
      return Status(Code::kUnimplemented, "take_profile: the queue was made without profiling");
    }
    INFERD_CL_RETURN_IF_ERROR(err);
    INFERD_CL_RETURN_IF_ERROR(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof(start), &start, nullptr));
    INFERD_CL_RETURN_IF_ERROR(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof(end), &end, nullptr));
    const std::string name = p.key != nullptr ? *p.key : "?";
    KernelTime& t = by_kernel[name];
    t.kernel = name;
    ++t.launches;
    t.ms += static_cast<double>(end - start) / 1e6;
    if (out.launches > 0) {
      if (queued > last_queued) enqueue_us.push_back(static_cast<double>(queued - last_queued) / 1e3);
      if (start > last_end) out.gap_ms += static_cast<double>(start - last_end) / 1e6;
    }
    last_queued = queued;
    last_end = std::max(last_end, end);
    ++out.launches;
    out.device_ms += static_cast<double>(end - start) / 1e6;
  }
  if (!enqueue_us.empty()) {
    std::nth_element(enqueue_us.begin(), enqueue_us.begin() + static_cast<std::ptrdiff_t>(enqueue_us.size() / 2), enqueue_us.end());
    out.enqueue_median_us = enqueue_us[enqueue_us.size() / 2];
  }
  out.kernels.reserve(by_kernel.size());
  for (auto& [name, t] : by_kernel) out.kernels.push_back(std::move(t));
  std::sort(out.kernels.begin(), out.kernels.end(), [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
  return out;
}

Status Ops::binary(const char* op, const char* expr, const char* helpers, const Tensor& a, const Tensor& b,
                   Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_same_shape(op, a, b));
  INFERD_RETURN_IF_ERROR(require_same_shape(op, a, dst));
  auto k = kernel(std::string(op) + storage_key({&a, &b, &dst}),
                  [&] { return elementwise_template(op, expr, helpers, a.format(), b.format(), dst.format()); });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
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
  return binary("swiglu", "inferd_silu(va) * vb", kHelpersCl("float_silu").data(), gate, up, dst);
}
Status Ops::swiglu_exact(const Tensor& gate, const Tensor& up, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_exact("swiglu_exact", {&gate, &up, &dst}));
  return binary("swiglu_exact", "inferd_silu4(va) * vb", kHelpersCl("exact_helpers").data(), gate, up, dst);
}

Status Ops::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& dst) {
  return rms_norm_as(x, weight, eps, dst, false);
}

Status Ops::rms_norm_as(const Tensor& x, const Tensor& weight, float eps, Tensor& dst, bool exact) {
  const char* op = exact ? "rms_norm_exact" : "rms_norm";
  INFERD_RETURN_IF_ERROR(require_same_shape(op, x, dst));
  const Bhwc& ws = weight.shape();
  if (ws.b != 1 || ws.h != 1 || ws.w != 1 || ws.c < 1 || x.shape().c % ws.c != 0) {
    return make_error(Code::kInvalidArgument, "%s: weight %s for channels %d", op, ws.to_string().c_str(), x.shape().c);
  }
  const int32_t groups = x.shape().c / ws.c;
  if (groups > 1 && ws.c % 4 != 0) {
    return make_error(Code::kUnimplemented, "%s: groups of %d channels (not a multiple of 4)", op, ws.c);
  }
  auto k = kernel(op + storage_key({&x, &weight, &dst}), [&] {
    return exact ? rms_norm_exact_template(x.format(), weight.format(), dst.format())
                 : rms_norm_template(x.format(), weight.format(), dst.format());
  });
  if (!k) return k.status();
  // A decode step normalizes one row per launch: on a GPU the float kernel takes 256 lanes (a 64-lane
  // group of an H200 took 7-13 us for a row of 576-4096; BENCHMARKS.md). The exact kernel keeps its lanes.
  const size_t lanes = !exact && rt_.info().type != DeviceType::kCpu
                           ? floor_pow2(std::max<size_t>(1, std::min<size_t>(kGpuNormLanes, k.value()->max_group)))
                           : group_size(*k.value());
  KernelArgs args = new_args(*k.value());
  const cl_int group_slices = (ws.c + 3) / 4;
  args.tensor(x).tensor(weight).tensor(dst).value(group_slices).value(eps).local(lanes * sizeof(float));
  INFERD_RETURN_IF_ERROR(args.status());
  const Bhwc& s = x.shape();
  const size_t global[2] = {lanes, static_cast<size_t>(s.b) * static_cast<size_t>(s.w) * static_cast<size_t>(s.h) *
                                       static_cast<size_t>(groups)};
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
  KernelArgs args = new_args(*k.value());
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
  KernelArgs args = new_args(*k.value());
  args.tensor(x).tensor(mask).tensor(dst).value(scale).local(lanes * sizeof(float));
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {lanes, static_cast<size_t>(s.b) * static_cast<size_t>(s.w) * static_cast<size_t>(s.h)};
  const size_t local[2] = {lanes, 1};
  return launch(*k.value(), 2, global, local);
}

Status Ops::matmul(const MatmulWeights& w, const Tensor& x, Tensor& y, MatmulVariant variant, const Tensor* residual,
                   const DecodeNorm* norm) {
  const Bhwc& xs = x.shape();
  const Bhwc& ys = y.shape();
  if (xs.b != 1 || xs.h != 1 || xs.c != w.k() || !(ys == Bhwc{1, 1, xs.w, static_cast<int32_t>(w.rows())})) {
    return make_error(Code::kInvalidArgument, "matmul: weights %lld x %lld, x %s, y %s",
                      static_cast<long long>(w.rows()), static_cast<long long>(w.k()), xs.to_string().c_str(),
                      ys.to_string().c_str());
  }
  if (variant == MatmulVariant::kAuto) variant = choose_matmul_variant(xs.w);
  INFERD_RETURN_IF_ERROR(check_residual("matmul", y, residual));
  if (norm != nullptr) INFERD_RETURN_IF_ERROR(check_norm("matmul", x, variant, *norm));
  const DecodeShape shape = decode_shape_;
  // The tiled prefill where chosen and the device admits its work-group and tiles.
  const DeviceInfo& info = rt_.info();
  const bool tiled = variant == MatmulVariant::kPrefill && prefill_kernel_ == PrefillKernel::kTiled &&
                     info.max_work_group_size >= kTileGroup * kTileGroup &&
                     info.max_work_item_sizes[0] >= kTileGroup && info.max_work_item_sizes[1] >= kTileGroup &&
                     (info.local_mem_bytes == 0 || info.local_mem_bytes >= 2 * kTileFloat4s * 16);
  const int prefill_tokens = tiled ? kTiledPrefill : prefill_tokens_;
  const std::optional<TensorFormat> res = residual ? std::optional(residual->format()) : std::nullopt;
  auto k = kernel(std::string("matmul_") + matmul_variant_name(variant) + "_" + dtype_name(w.type()) +
                      (variant == MatmulVariant::kDecode ? "_" + shape.to_string()
                       : tiled                           ? std::string("_tiled")
                                                         : "_t" + std::to_string(prefill_tokens_)) +
                      storage_key({&x, &y}) + (norm ? "+norm" + storage_key({norm->weight}) : "") +
                      (residual ? "+res" + storage_key({residual}) : ""),
                  [&] {
                    if (norm) {
                      return decode_template(w.type(), x.format(), y.format(), shape, DecodeStore::kPlain, res,
                                             norm->weight->format());
                    }
                    return matmul_template(w.type(), variant, x.format(), y.format(), shape, prefill_tokens, res);
                  });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(x).tensor(y);
  if (norm) args.tensor(*norm->weight);
  if (residual) args.tensor(*residual);
  args.weights(w);
  if (norm) args.value(norm->eps);
  if (variant == MatmulVariant::kDecode) {
    // The 1x1 shape alone may fall back to fewer lanes, as before shapes existed.
    return launch_decode(*k.value(), args, 1, w.out_slices(), xs.w, shape == DecodeShape{});
  }
  if (tiled && k.value()->max_group >= kTileGroup * kTileGroup) {
    args.local(kTileFloat4s * 16).local(kTileFloat4s * 16);
    INFERD_RETURN_IF_ERROR(args.status());
    const size_t slice_tiles = (static_cast<size_t>(w.out_slices()) + kTileGroup - 1) / kTileGroup;
    const size_t token_tiles = (static_cast<size_t>(xs.w) + kTileTokens - 1) / kTileTokens;
    const size_t global[2] = {kTileGroup * slice_tiles, kTileGroup * token_tiles};
    const size_t local[2] = {kTileGroup, kTileGroup};
    return launch(*k.value(), 2, global, local);
  }
  if (tiled) {
    return make_error(Code::kOutOfRange, "matmul: the tiled prefill kernel admits %zu work-items per group, %zu needed",
                      k.value()->max_group, kTileGroup * kTileGroup);
  }
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(w.out_slices()),
                            static_cast<size_t>((xs.w + prefill_tokens_ - 1) / prefill_tokens_)};
  return launch(*k.value(), 2, global, nullptr);
}


Status Ops::check_norm(const char* op, const Tensor& x, MatmulVariant variant, const DecodeNorm& norm) const {
  const Bhwc& ns = norm.weight != nullptr ? norm.weight->shape() : Bhwc{};
  if (variant != MatmulVariant::kDecode || norm.weight == nullptr || !(ns == Bhwc{1, 1, 1, x.shape().c})) {
    return make_error(Code::kInvalidArgument, "%s: a norm folded into a %s matmul, weight %s for x %s", op,
                      matmul_variant_name(variant), ns.to_string().c_str(), x.shape().to_string().c_str());
  }
  return Status::ok();
}

Status Ops::matmul_swiglu(const MatmulWeights& w, const Tensor& x, Tensor& dst, const DecodeNorm* norm) {
  const Bhwc& xs = x.shape();
  const Bhwc& ds = dst.shape();
  if (xs.b != 1 || xs.h != 1 || xs.c != w.k() || !is_token_rows(ds) || ds.w != xs.w || ds.c % 4 != 0 ||
      int64_t{2} * ds.c != w.rows() || choose_matmul_variant(xs.w) != MatmulVariant::kDecode) {
    return make_error(Code::kInvalidArgument, "matmul_swiglu: weights %lld x %lld, x %s, dst %s (a decode step)",
                      static_cast<long long>(w.rows()), static_cast<long long>(w.k()), xs.to_string().c_str(),
                      ds.to_string().c_str());
  }
  if (norm != nullptr) INFERD_RETURN_IF_ERROR(check_norm("matmul_swiglu", x, MatmulVariant::kDecode, *norm));
  const DecodeShape shape = decode_shape_;
  auto k = kernel(std::string("matmul_swiglu_") + dtype_name(w.type()) + "_" + shape.to_string() + storage_key({&x, &dst}) +
                      (norm ? "+norm" + storage_key({norm->weight}) : ""),
                  [&] {
                    return decode_template(w.type(), x.format(), dst.format(), shape, DecodeStore::kSwiglu, std::nullopt,
                                           norm ? std::optional(norm->weight->format()) : std::nullopt);
                  });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(x).tensor(dst);
  if (norm) args.tensor(*norm->weight);
  args.weights(w);
  if (norm) args.value(norm->eps);
  return launch_decode(*k.value(), args, 2, ds.slices(), xs.w, false);
}

Status Ops::matmul_rope_kv(const MatmulWeights& w, const Tensor& x, const DecodeNorm* norm, const AttentionGeometry& g,
                           cl_mem bias, const TokenPlacement& tokens, cl_mem q_out, cl_mem cache, float q_scale) {
  INFERD_RETURN_IF_ERROR(g.check());
  const Bhwc& xs = x.shape();
  const int64_t qkv = int64_t{g.n_embd()} + 2 * int64_t{g.n_embd_kv()};
  if (xs.b != 1 || xs.h != 1 || xs.c != w.k() || w.rows() != qkv || choose_matmul_variant(xs.w) != MatmulVariant::kDecode) {
    return make_error(Code::kInvalidArgument, "matmul_rope_kv: weights %lld x %lld, x %s (Q|K|V of %lld rows, a decode step)",
                      static_cast<long long>(w.rows()), static_cast<long long>(w.k()), xs.to_string().c_str(),
                      static_cast<long long>(qkv));
  }
  if (g.rope_mode != RopeMode::kNormal) {
    return Status(Code::kUnimplemented, "matmul_rope_kv: NeoX RoPE pairs channels of other work-groups");
  }
  if (norm != nullptr) INFERD_RETURN_IF_ERROR(check_norm("matmul_rope_kv", x, MatmulVariant::kDecode, *norm));
  INFERD_RETURN_IF_ERROR(
      check_rope_kv_buffers("matmul_rope_kv", g, static_cast<size_t>(xs.w), bias, tokens, q_out, cache));
  const DecodeShape shape = decode_shape_;
  auto k = kernel(std::string("matmul_rope_kv_") + dtype_name(w.type()) + "_" + shape.to_string() + storage_key({&x}) +
                      (norm ? "+norm" + storage_key({norm->weight}) : ""),
                  [&] {
                    return decode_template(w.type(), x.format(), std::nullopt, shape, DecodeStore::kRopeKv, std::nullopt,
                                           norm ? std::optional(norm->weight->format()) : std::nullopt);
                  });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(x);
  if (norm) args.tensor(*norm->weight);
  args.weights(w);
  if (norm) args.value(norm->eps);
  bind_rope_kv(args, g, bias, tokens, q_out, cache, q_scale);
  return launch_decode(*k.value(), args, 1, w.out_slices(), xs.w, false);
}

Status Ops::launch_decode(const Kernel& k, KernelArgs& args, int halves, int32_t out_slices, int32_t tokens,
                          bool may_shrink) {
  // Lanes: the same for every shape and kernel (the lanes split each sum, so another count gives other
  // bits): the device's reduction group, which the kernel and its scratch (lanes * R * H float4s of local
  // memory) must admit.
  const DecodeShape shape = decode_shape_;
  const size_t per_lane = 16 * static_cast<size_t>(shape.slices * halves);
  size_t lanes = reduce_group_size_;
  const uint64_t local_bytes = rt_.info().local_mem_bytes;
  const bool fits = lanes <= k.max_group && (local_bytes == 0 || lanes * per_lane <= local_bytes);
  if (!fits && may_shrink) {
    lanes = group_size(k);
  } else if (!fits || lanes < static_cast<size_t>(shape.slices)) {
    return make_error(Code::kOutOfRange,
                      "decode matmul of shape %s needs %zu lanes and %zu bytes of local memory; the kernel allows %zu "
                      "lanes, the device has %llu bytes",
                      shape.to_string().c_str(), lanes, lanes * per_lane, k.max_group,
                      static_cast<unsigned long long>(local_bytes));
  }
  args.local(lanes * per_lane);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t groups = (static_cast<size_t>(out_slices) + shape.slices - 1) / shape.slices;
  const size_t global[2] = {lanes * groups, static_cast<size_t>(tokens)};
  const size_t local[2] = {lanes, 1};
  return launch(k, 2, global, local);
}

Status Ops::get_rows(const MatmulWeights& w, cl_mem rows, Tensor& dst, float scale) {
  const Bhwc& d = dst.shape();
  if (!is_token_rows(d) || d.c != w.k()) {
    return make_error(Code::kInvalidArgument, "get_rows: weights %lld x %lld, dst %s", static_cast<long long>(w.rows()),
                      static_cast<long long>(w.k()), d.to_string().c_str());
  }
  INFERD_RETURN_IF_ERROR(require_bytes(rows, static_cast<size_t>(d.w) * sizeof(cl_int), "get_rows rows"));
  auto k = kernel(std::string("get_rows_") + dtype_name(w.type()) + storage_key({&dst}),
                  [&] { return get_rows_template(w.type(), dst.format()); });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(dst).buffer(rows).weights(w).value(scale);
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
  KernelArgs args = new_args(*k.value());
  args.tensor(src).tensor(dst).buffer(rows);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::swiglu_halves(const Tensor& gate_up, Tensor& dst) { return swiglu_halves_as(gate_up, dst, false); }

Result<cl_mem> Ops::gelu_table() {
  if (!gelu_table_) {
    auto b = rt_.create_buffer(sizeof(fp16_t) << 16, CL_MEM_READ_ONLY, kernels::gelu_table());
    if (!b) return b.status();
    gelu_table_ = std::move(b).value();
  }
  return gelu_table_.get();
}

Status Ops::geglu(const Tensor& gate, const Tensor& up, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_same_shape("geglu", gate, up));
  INFERD_RETURN_IF_ERROR(require_same_shape("geglu", gate, dst));
  const Bhwc& d = dst.shape();
  if (!is_token_rows(d)) return make_error(Code::kInvalidArgument, "geglu: dst %s", d.to_string().c_str());
  auto table = gelu_table();
  if (!table) return table.status();
  auto k = kernel("geglu" + storage_key({&gate, &up, &dst}),
                  [&] { return geglu_template(gate.format(), up.format(), dst.format()); });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(gate).tensor(up).tensor(dst).buffer(table.value());
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::geglu_halves(const Tensor& gate_up, Tensor& dst) {
  INFERD_RETURN_IF_ERROR(require_halves("geglu_halves", gate_up, dst));
  const Bhwc& d = dst.shape();
  auto table = gelu_table();
  if (!table) return table.status();
  auto k = kernel("geglu_halves" + storage_key({&gate_up, &dst}),
                  [&] { return geglu_halves_template(gate_up.format(), dst.format()); });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(gate_up).tensor(dst).buffer(table.value());
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::swiglu_halves_as(const Tensor& gate_up, Tensor& dst, bool exact) {
  const char* op = exact ? "swiglu_halves_exact" : "swiglu_halves";
  INFERD_RETURN_IF_ERROR(require_halves(op, gate_up, dst));
  const Bhwc& d = dst.shape();
  auto k = kernel(op + storage_key({&gate_up, &dst}),
                  [&] { return swiglu_halves_template(gate_up.format(), dst.format(), exact); });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(gate_up).tensor(dst);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(d.w), static_cast<size_t>(d.slices())};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::rope_kv(const AttentionGeometry& g, TensorSlice q, TensorSlice k, TensorSlice v, cl_mem bias,
                    const TokenPlacement& tokens, cl_mem q_out, cl_mem cache, float q_scale) {
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
  INFERD_RETURN_IF_ERROR(check_rope_kv_buffers("rope_kv", g, t, bias, tokens, q_out, cache));
  const bool normal = g.rope_mode == RopeMode::kNormal;
  auto kn = kernel(std::string(normal ? "rope_kv_normal" : "rope_kv_neox") + storage_key({q.tensor, k.tensor, v.tensor}),
                   [&] { return rope_kv_template(g.rope_mode, q.tensor->format(), k.tensor->format(), v.tensor->format()); });
  if (!kn) return kn.status();
  KernelArgs args = new_args(*kn.value());
  args.tensor(*q.tensor).tensor(*k.tensor).tensor(*v.tensor);
  args.value(cl_int{q.first_slice}).value(cl_int{k.first_slice}).value(cl_int{v.first_slice});
  bind_rope_kv(args, g, bias, tokens, q_out, cache, q_scale);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t units = static_cast<size_t>(normal ? g.head_dim / 4 : g.head_dim / 8);
  const size_t global[3] = {t, static_cast<size_t>(g.n_head + g.n_head_kv), units};
  return launch(*kn.value(), 3, global, nullptr);
}

Status Ops::attention(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad, float scale,
                      cl_mem cache, Tensor& out, int32_t window, cl_mem partials) {
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
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.kv_table, table_bytes(g), "attention KV table"));
  INFERD_RETURN_IF_ERROR(require_bytes(q, t * static_cast<size_t>(g.n_embd()) * 2, "attention q"));
  INFERD_RETURN_IF_ERROR(require_bytes(cache, g.layer_cache_bytes(), "attention cache"));
  const AttentionSplit split = attention_split(kv_pad, static_cast<int32_t>(t));
  if (partials != nullptr && split.chunks > 1) {
    INFERD_RETURN_IF_ERROR(require_bytes(partials, attention_partials_bytes(g), "attention partials"));
    return attention_split_launch(g, q, tokens, kv_pad, scale, cache, out, window, partials, split);
  }
  auto k = kernel("attention_hd" + std::to_string(g.head_dim) + storage_key({&out}),
                  [&] { return attention_template(g.head_dim, out.format()); });
  if (!k) return k.status();
  const size_t lanes = attention_lanes(*k.value(), g.head_dim);
  KernelArgs args = new_args(*k.value());
  args.tensor(out);
  bind_attention(args, g, q, tokens, kv_pad, scale, cache, window, lanes);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {lanes * static_cast<size_t>(g.n_head), t};
  const size_t local_size[2] = {lanes, 1};
  return launch(*k.value(), 2, global, local_size);
}

size_t Ops::attention_lanes(const Kernel& k, int32_t head_dim) const {
  // Within the kernel's limit and half the local memory: each lane keeps a float and a head.
  const size_t per_lane = sizeof(float) + static_cast<size_t>(head_dim) * sizeof(float);
  const uint64_t local = rt_.info().local_mem_bytes;
  size_t lanes = group_size(k);
  while (lanes > 1 && local > 0 && lanes * per_lane > local / 2) lanes /= 2;
  return lanes;
}

void Ops::bind_attention(KernelArgs& args, const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens,
                         int32_t kv_pad, float scale, cl_mem cache, int32_t window, size_t lanes) {
  args.buffer(q).buffer(cache).buffer(tokens.positions).buffer(tokens.slots);
  args.buffer(tokens.kv_table).value(cl_int{g.blocks_per_slot()});
  args.value(cl_int{g.n_head}).value(cl_int{g.n_head_kv}).value(cl_int{kv_pad}).value(scale).value(cl_int{window});
  args.local(lanes * sizeof(float)).local(lanes * static_cast<size_t>(g.head_dim) * sizeof(float));
  args.local(static_cast<size_t>(g.head_dim) * sizeof(float));  // the query
}

void Ops::set_attention_chunk(int32_t positions) {
  INFERD_ASSERT(positions >= 0, "attention chunk %d", positions);
  attention_chunk_ = positions;
}

size_t Ops::attention_partials_bytes(const AttentionGeometry& g) {
  return static_cast<size_t>(kMaxSplitAttentionTokens) * static_cast<size_t>(g.n_head) * kMaxAttentionChunks *
         (static_cast<size_t>(g.head_dim / 4) + 1) * 4 * sizeof(float);
}

Ops::AttentionSplit Ops::attention_split(int32_t kv_pad, int32_t tokens) const {
  if (attention_chunk_ <= 0 || tokens > kMaxSplitAttentionTokens || kv_pad <= attention_chunk_) return {};
  int32_t chunk = attention_chunk_;
  if ((kv_pad + chunk - 1) / chunk > kMaxAttentionChunks) chunk = (kv_pad + kMaxAttentionChunks - 1) / kMaxAttentionChunks;
  return AttentionSplit{chunk, (kv_pad + chunk - 1) / chunk};
}

Status Ops::attention_split_launch(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad,
                                   float scale, cl_mem cache, Tensor& out, int32_t window, cl_mem partials,
                                   AttentionSplit split) {
  const size_t t = static_cast<size_t>(out.shape().w);
  auto part = kernel("attention_part_hd" + std::to_string(g.head_dim), [&] { return attention_part_template(g.head_dim); });
  if (!part) return part.status();
  auto merge = kernel("attention_merge_hd" + std::to_string(g.head_dim) + storage_key({&out}),
                      [&] { return attention_merge_template(g.head_dim, out.format()); });
  if (!merge) return merge.status();
  const size_t lanes = attention_lanes(*part.value(), g.head_dim);
  {
    KernelArgs args = new_args(*part.value());
    args.buffer(partials).value(cl_int{split.chunk});
    bind_attention(args, g, q, tokens, kv_pad, scale, cache, window, lanes);
    INFERD_RETURN_IF_ERROR(args.status());
    const size_t global[3] = {lanes * static_cast<size_t>(g.n_head), t, static_cast<size_t>(split.chunks)};
    const size_t local_size[3] = {lanes, 1, 1};
    INFERD_RETURN_IF_ERROR(launch(*part.value(), 3, global, local_size));
  }
  KernelArgs args = new_args(*merge.value());
  args.tensor(out).buffer(partials).value(cl_int{g.n_head}).value(cl_int{split.chunks});
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t merge_lanes = std::min(floor_pow2(static_cast<size_t>(std::max(1, g.head_dim / 4))), group_size(*merge.value()));
  const size_t global[2] = {merge_lanes * static_cast<size_t>(g.n_head), t};
  const size_t local_size[2] = {merge_lanes, 1};
  return launch(*merge.value(), 2, global, local_size);
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
  KernelArgs args = new_args(*k.value());
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
  KernelArgs args = new_args(*k.value());
  args.tensor(x).tensor(quants).buffer(blocks);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t global[2] = {static_cast<size_t>(s.w), static_cast<size_t>(s.c / 256)};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::matmul_exact(const MatmulWeights& w, const Tensor& x, cl_mem scales, Tensor& y, CpuOrder order,
                         MatmulVariant variant, const Tensor* residual) {
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
  const int tokens_per_item = variant == MatmulVariant::kDecode ? 1 : exact_prefill_tokens_;
  const IntDot int_dot = kind == MatmulActivations::kQ8 ? int_dot_ : IntDot::kFloat;  // block types only
  // The extension's dot(char4, char4) where the device has it; emulated where the variant is forced.
  const bool native = int_dot == IntDot::kInt8 && choose_int_dot(rt_.info()) == IntDot::kInt8;
  // The matrices the CPU engine sums in llama.cpp's repacked order (kernels::MatmulOrder).
  const bool repacked = kernels::matmul_order_for(w.type(), w.order_rows()) == kernels::MatmulOrder::kRepacked;
  const bool pairs = !repacked && iq4nl_pairs(w.type(), order, xs.w);
  INFERD_RETURN_IF_ERROR(check_residual("matmul_exact", y, residual));
  if (residual) INFERD_RETURN_IF_ERROR(require_exact("matmul_exact", {residual}));
  const std::optional<TensorFormat> res = residual ? std::optional(residual->format()) : std::nullopt;
  auto k = kernel(std::string("matmul_exact_") + matmul_variant_name(variant) + "_" + dtype_name(w.type()) + "_" +
                      cpu_order_name(order) + "_" + int_dot_name(int_dot) + (native ? "_native" : "") +
                      (pairs ? "_pairs" : "") + (repacked ? "_repacked" : "") + "_t" + std::to_string(tokens_per_item) +
                      storage_key({&x, &y}) +
                      (residual ? "+res" + storage_key({residual}) : ""),
                  [&] {
                    return matmul_exact_template(w.type(), order, tokens_per_item, x.format(), y.format(), int_dot,
                                                 native, pairs, repacked, res);
                  });
  if (!k) return k.status();
  KernelArgs args = new_args(*k.value());
  args.tensor(x).tensor(y);
  if (residual) args.tensor(*residual);
  args.weights(w).buffer(blocks ? scales : nullptr);
  INFERD_RETURN_IF_ERROR(args.status());
  const size_t items = static_cast<size_t>((xs.w + tokens_per_item - 1) / tokens_per_item);
  const size_t global[2] = {static_cast<size_t>(w.out_slices()), items};
  return launch(*k.value(), 2, global, nullptr);
}

Status Ops::attention_exact(const AttentionGeometry& g, cl_mem q, const TokenPlacement& tokens, int32_t kv_pad,
                            float scale, cl_mem cache, cl_mem scratch, CpuOrder order, Tensor& out,
                            int32_t window) {
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
  INFERD_RETURN_IF_ERROR(require_bytes(tokens.kv_table, table_bytes(g), "attention_exact KV table"));
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
    KernelArgs args = new_args(*k.value());
    args.tensor(out).buffer(q).buffer(cache).buffer(tokens.positions).buffer(tokens.slots);
    args.buffer(tokens.kv_table).value(cl_int{g.blocks_per_slot()});
    args.value(static_cast<cl_int>(first)).value(cl_int{g.n_head}).value(cl_int{g.n_head_kv});
    args.value(cl_int{kv_pad}).value(scale).value(cl_int{window}).buffer(scratch);
    args.local(lanes * sizeof(float)).local(size_t{16} * static_cast<size_t>(g.head_dim) * sizeof(float));
    INFERD_RETURN_IF_ERROR(args.status());
    const size_t global[2] = {lanes * static_cast<size_t>(g.n_head), n};
    const size_t local_size[2] = {lanes, 1};
    INFERD_RETURN_IF_ERROR(launch(*k.value(), 2, global, local_size));
  }
  return Status::ok();
}

}  // namespace inferd::opencl
