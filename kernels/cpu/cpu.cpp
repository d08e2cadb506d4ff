// Run-time ISA selection for inferd/kernels/cpu.h. Compiled for the baseline target: it only calls
// into an ISA's translation unit after checking that the CPU runs that ISA.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "inferd/kernels/cpu.h"
#include "isa_tables.h"

namespace inferd::kernels {
namespace {

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      // Without VNNI the AVX2 kernels are as fast; such CPUs get those.
      return cpu_has(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

Isa detect_best_isa() {
  Isa best = Isa::kScalar;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (cpu_has(isa)) best = isa;
  }
  if (const char* cap = std::getenv("INFERD_ISA")) {
    Isa limit = best;
    if (std::strcmp(cap, "scalar") == 0) limit = Isa::kScalar;
    if (std::strcmp(cap, "avx2") == 0) limit = Isa::kAvx2;
    if (std::strcmp(cap, "avx512") == 0) limit = Isa::kAvx512;
    if (static_cast<int>(limit) < static_cast<int>(best)) best = limit;
  }
  return best;
}

const TypeKernels* table_for(DType type, Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512::type_kernels(type);
    case Isa::kAvx2:
      return avx2::type_kernels(type);
    case Isa::kScalar:
      return scalar::type_kernels(type);
  }
  return nullptr;
}

GgmlOrder detect_ggml_order() {
  const char* env = std::getenv("INFERD_GGML_ORDER");
  return env != nullptr && std::strcmp(env, "avx2") == 0 ? GgmlOrder::kAvx2 : GgmlOrder::kAvx512;
}

MatmulOrder detect_matmul_order() {
  MatmulOrder order = MatmulOrder::kRepacked;  // llama.cpp's out-of-the-box arithmetic
  if (const char* env = std::getenv("INFERD_MATMUL_ORDER")) parse_matmul_order(env, &order);
  return order;
}

std::atomic<int>& matmul_order_setting() {
  static std::atomic<int> order{static_cast<int>(detect_matmul_order())};
  return order;
}

std::atomic<int>& order_setting() {
  static std::atomic<int> order{static_cast<int>(detect_ggml_order())};
  return order;
}

const VectorKernels& vector_for(Isa isa, GgmlOrder order = ggml_order()) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512::vector_kernels(order);
    case Isa::kAvx2:
      return avx2::vector_kernels(order);
    case Isa::kScalar:
      break;
  }
  return scalar::vector_kernels(order);
}

Isa lower(Isa isa) { return static_cast<Isa>(static_cast<int>(isa) - 1); }

// The highest available ISA at or below `isa`.
Isa clamp_available(Isa isa) {
  while (isa != Isa::kScalar && !cpu_has(isa)) isa = lower(isa);
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa best_isa() {
  static const Isa kBest = detect_best_isa();
  return kBest;
}

bool isa_available(Isa isa) { return cpu_has(isa); }

const TypeKernels* type_kernels(DType type, Isa isa) {
  for (Isa i = clamp_available(isa);; i = lower(i)) {
    if (const TypeKernels* t = table_for(type, i)) return t;
    if (i == Isa::kScalar) return nullptr;
  }
}

const VectorKernels& vector_kernels(Isa isa, GgmlOrder order) { return vector_for(clamp_available(isa), order); }

const char* ggml_order_name(GgmlOrder order) { return order == GgmlOrder::kAvx2 ? "avx2" : "avx512"; }
GgmlOrder ggml_order() { return static_cast<GgmlOrder>(order_setting().load(std::memory_order_relaxed)); }
void set_ggml_order(GgmlOrder order) { order_setting().store(static_cast<int>(order), std::memory_order_relaxed); }
const char* matmul_order_name(MatmulOrder order) { return order == MatmulOrder::kRepacked ? "repacked" : "vec_dot"; }
bool parse_matmul_order(const char* name, MatmulOrder* order) {
  for (MatmulOrder o : {MatmulOrder::kVecDot, MatmulOrder::kRepacked}) {
    if (std::strcmp(name, matmul_order_name(o)) == 0) {
      *order = o;
      return true;
    }
  }
  return false;
}
MatmulOrder matmul_order() { return static_cast<MatmulOrder>(matmul_order_setting().load(std::memory_order_relaxed)); }
void set_matmul_order(MatmulOrder order) { matmul_order_setting().store(static_cast<int>(order), std::memory_order_relaxed); }

MatmulOrder matmul_order_for(DType type, int64_t rows, MatmulOrder order) {
  // llama.cpp's x86 repacking with AVX2 (ggml_repack_get_optimal_repack_type): Q4_0 -> q4_0_8x8, Q4_K -> q4_K_8x8
  // and IQ4_NL -> iq4_nl_8x8 when rows % 8 == 0. (It also repacks Q2_K in its AVX-512 build, in an order the engine
  // does not reproduce yet: those matrices keep the vec_dot order.)
  // Q3_K, Q5_K, Q6_K and IQ4_XS (and Q2_K where that build does not repack it) are not repacked but go through its
  // tiled K-quant GEMM from kTiledMinRows activation rows on (gemm.h), the order of their kRepacked GEMMs.
  if (order != MatmulOrder::kRepacked) return MatmulOrder::kVecDot;
  switch (type) {
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kIQ4_NL:
      return rows % 8 == 0 ? MatmulOrder::kRepacked : MatmulOrder::kVecDot;
    case DType::kQ2_K:
      return ggml_order() == GgmlOrder::kAvx2 || rows % 8 != 0 ? MatmulOrder::kRepacked : MatmulOrder::kVecDot;
    case DType::kQ3_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_XS:
      return MatmulOrder::kRepacked;
    default:
      return MatmulOrder::kVecDot;
  }
}

const TypeKernels* type_kernels(DType type, Isa isa, MatmulOrder order) {
  if (order == MatmulOrder::kVecDot) return type_kernels(type, isa);
  // One AVX2 set serves AVX-512 CPUs too (ggml's AVX-512 q4_0_8x8 kernels keep the same order), but for Q4_K's
  // decode GEMV, which has a 512-bit form.
  if (isa == Isa::kAvx512 && cpu_has(Isa::kAvx512)) {
    if (const TypeKernels* t = avx512::repacked_type_kernels(type)) return t;
  }
  if (isa != Isa::kScalar && cpu_has(Isa::kAvx2)) {
    if (const TypeKernels* t = avx2::repacked_type_kernels(type)) return t;
  }
  if (const TypeKernels* t = scalar::repacked_type_kernels(type)) return t;
  return type_kernels(type, isa);  // a type the order does not change
}

int ggml_order_lanes() { return ggml_order() == GgmlOrder::kAvx2 ? 8 : 16; }

float fp16_to_fp32(fp16_t h) { return scalar::fp16_to_fp32(h); }
fp16_t fp32_to_fp16(float f) { return scalar::fp32_to_fp16(f); }

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

void fp16_to_fp32_row(const fp16_t* src, float* dst, int64_t n) {
  vector_for(best_isa()).fp16_to_fp32_row(src, dst, n);
}
void fp32_to_fp16_row(const float* src, fp16_t* dst, int64_t n) {
  vector_for(best_isa()).fp32_to_fp16_row(src, dst, n);
}
float dot_f32_f16(int64_t n, const float* x, const fp16_t* y) {
  return vector_for(best_isa()).dot_f32_f16(n, x, y);
}
void axpy_f16(int64_t n, float a, const fp16_t* x, float* y) { vector_for(best_isa()).axpy_f16(n, a, x, y); }
void dot_f32_f16_rows(int64_t n, const float* x, const fp16_t* y, int64_t stride, int64_t rows, float scale, float* out) {
  vector_for(best_isa()).dot_f32_f16_rows(n, x, y, stride, rows, scale, out);
}
void axpy_f16_rows(int64_t n, const float* a, const fp16_t* x, int64_t stride, int64_t rows, int64_t first,
                   float* lanes, int64_t lane_stride) {
  vector_for(best_isa()).axpy_f16_rows(n, a, x, stride, rows, first, lanes, lane_stride);
}
float dot_f32(int64_t n, const float* x, const float* y) { return vector_for(best_isa()).dot_f32(n, x, y); }
float silu(float x) { return vector_for(best_isa()).silu(x); }
void swiglu(int64_t n, const float* g, const float* u, float* y) { vector_for(best_isa()).swiglu(n, g, u, y); }
// ggml's ggml_table_gelu_f16: gelu at every F16 value, stored as F16.
const fp16_t* gelu_table() {
  static const fp16_t* table = [] {
    static fp16_t t[1 << 16];
    for (uint32_t i = 0; i < (1u << 16); ++i) {
      const float f = fp16_to_fp32(static_cast<fp16_t>(i));
      // ggml_gelu_f32 as GCC builds it with FMA (llama.cpp's x86 builds): 1 + (A * x) * x is contracted.
      const float inner = std::fma(0.044715f * f, f, 1.0f);
      t[i] = fp32_to_fp16(0.5f * f * (1.0f + std::tanh(0.79788456080286535587989211986876f * f * inner)));
    }
    return t;
  }();
  return table;
}

float gelu(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return fp16_to_fp32(gelu_table()[fp32_to_fp16(x)]);
}
void geglu(int64_t n, const float* g, const float* u, float* y) { vector_for(best_isa()).geglu(n, g, u, y); }
double exp_sum(int64_t n, const float* x, float max, float* y) {
  return vector_for(best_isa()).exp_sum(n, x, max, y);
}
void rope_rotate(int64_t n, const float* cos, const float* sin, float* x0, float* x1, int64_t stride) {
  vector_for(best_isa()).rope_rotate(n, cos, sin, x0, x1, stride);
}

}  // namespace inferd::kernels
