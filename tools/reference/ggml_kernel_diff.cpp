// ggml-kernel-diff: inferd's CPU kernels against llama.cpp's own, bit for bit, on the same blocks.
//
// Loads libggml-base.so and libggml-cpu.so from a directory (llama-cpp-python's `llama_cpp/lib`, found by
// tools/reference/common.py or given with --lib) with dlopen, so the build does not depend on llama.cpp,
// and for each weight type compares on random data:
//   1. activation quantization: ggml's from_float of the vec_dot type against TypeKernels::quantize_act
//      (byte equality);
//   2. one dot product: ggml's vec_dot against TypeKernels::dot (float bit equality);
//   3. a matmul through ggml's graph (ggml_mul_mat, the path llama.cpp takes for weights in plain CPU
//      buffers) against quantize_act + the engine's matmul (its GEMM from 2 rows on where the type has one,
//      else dot), for 1..64 activation rows: this is where ggml's other kernels (llamafile's tinyBLAS,
//      the tiled K-quant GEMM from 8 rows on) show up. The engine runs its default (repacked) order there,
//      which has Q6_K's tiled order, except for Q4_0 and Q4_K (the vec_dot order; their repacked one is (4)).
//   4. Q4_0 and Q4_K as llama.cpp runs them out of the box: the weight tensor in ggml's CPU repack buffer
//      (repacked to q4_0_8x8 / q4_K_8x8 when it is set), ggml_mul_mat for 1..64 activation rows (its repacked GEMV and GEMM), against
//      the engine's kernels in MatmulOrder::kRepacked (inferd/kernels/cpu.h): the GEMM from 2 rows on, else
//      dot, and dot_x16 on the interleaved layout. Counted in the exit status: that order claims equality.
// Weights are quantized with ggml's own ggml_quantize_chunk. Exit status 0 when everything in (1) and
// (2) is equal; (3) is reported, since ggml itself is not consistent across batch sizes there.
//
// Usage: ggml-kernel-diff --lib DIR [--threads N]
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/dtype.h"
#include "inferd/weight_layout.h"

namespace {

using inferd::DType;
namespace k = inferd::kernels;

// The parts of ggml's C API used here (ggml.h / ggml-cpu.h of llama.cpp; stable for years).
struct GgmlInitParams {
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
struct GgmlTraitsCpu {
  void (*from_float)(const float*, void*, int64_t);
  void (*vec_dot)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
  int vec_dot_type;
  int64_t nrows;
};

struct Ggml {
  void* (*init)(GgmlInitParams);
  void (*free)(void*);
  void* (*new_tensor_2d)(void*, int, int64_t, int64_t);
  void* (*mul_mat)(void*, void*, void*);
  void* (*new_graph)(void*);
  void (*build_forward_expand)(void*, void*);
  void* (*get_data)(void*);
  size_t (*quantize_chunk)(int, const float*, void*, int64_t, int64_t, int64_t, const float*);
  size_t (*row_size)(int, int64_t);
  int (*graph_compute_with_ctx)(void*, void*, int);
  void (*cpu_init)();
  const GgmlTraitsCpu* (*traits_cpu)(int);
  // ggml-backend.h, and ggml-cpu's repack buffer type (a C++ symbol).
  void* (*repack_buft)();
  void* (*buft_alloc_buffer)(void*, size_t);
  void* (*buffer_get_base)(void*);
  int (*tensor_alloc)(void*, void*, void*);
  void (*tensor_set)(void*, const void*, size_t, size_t);
  void (*buffer_free)(void*);
  size_t (*nbytes)(const void*);
  int (*cpu_has_avx512)();  // whether this ggml was built with AVX-512 (then its repack buffer takes Q2_K too)
};

template <typename F>
bool bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) std::fprintf(stderr, "ggml-kernel-diff: %s not found: %s\n", name, dlerror());
  return fn != nullptr;
}

bool load(const std::string& dir, Ggml& g) {
  void* base = dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
  void* cpu = base ? dlopen((dir + "/libggml-cpu.so").c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
  if (cpu == nullptr) {
    std::fprintf(stderr, "ggml-kernel-diff: cannot load ggml from %s: %s\n", dir.c_str(), dlerror());
    return false;
  }
  return bind(base, "ggml_init", g.init) && bind(base, "ggml_free", g.free) &&
         bind(base, "ggml_new_tensor_2d", g.new_tensor_2d) && bind(base, "ggml_mul_mat", g.mul_mat) &&
         bind(base, "ggml_new_graph", g.new_graph) && bind(base, "ggml_build_forward_expand", g.build_forward_expand) &&
         bind(base, "ggml_get_data", g.get_data) && bind(base, "ggml_quantize_chunk", g.quantize_chunk) &&
         bind(base, "ggml_row_size", g.row_size) && bind(cpu, "ggml_graph_compute_with_ctx", g.graph_compute_with_ctx) &&
         bind(cpu, "ggml_cpu_init", g.cpu_init) && bind(cpu, "ggml_get_type_traits_cpu", g.traits_cpu) &&
         bind(cpu, "_Z35ggml_backend_cpu_repack_buffer_typev", g.repack_buft) &&
         bind(base, "ggml_backend_buft_alloc_buffer", g.buft_alloc_buffer) &&
         bind(base, "ggml_backend_buffer_get_base", g.buffer_get_base) &&
         bind(base, "ggml_backend_tensor_alloc", g.tensor_alloc) && bind(base, "ggml_backend_tensor_set", g.tensor_set) &&
         bind(base, "ggml_backend_buffer_free", g.buffer_free) && bind(base, "ggml_nbytes", g.nbytes) &&
         bind(cpu, "ggml_cpu_has_avx512", g.cpu_has_avx512);
}

// y = W x through ggml's graph in `ctx` (x: m rows of k floats); the result lives in ctx.
const float* ggml_matmul(Ggml& g, void* ctx, void* W, const std::vector<float>& x, int64_t k, int m, int threads) {
  void* X = g.new_tensor_2d(ctx, 0 /* F32 */, k, m);
  std::memcpy(g.get_data(X), x.data(), x.size() * sizeof(float));
  void* Y = g.mul_mat(ctx, W, X);
  void* graph = g.new_graph(ctx);
  g.build_forward_expand(graph, Y);
  g.graph_compute_with_ctx(ctx, graph, threads);
  return static_cast<const float*>(g.get_data(Y));
}

// (4): `type` (Q4_0 or Q4_K; ggml_type its ggml type, act_ggml_type its activations') through ggml's repack
// buffer against MatmulOrder::kRepacked; prints one table row, returns whether every output was equal.
bool repacked(Ggml& g, int threads, std::mt19937& rng, DType type, int ggml_type, int act_ggml_type) {
  constexpr int64_t kK = 1024, kRows = 256;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const k::TypeKernels* tk = k::type_kernels(type, k::best_isa(), k::MatmulOrder::kRepacked);
  const size_t w_row = g.row_size(ggml_type, kK), a_row = g.row_size(act_ggml_type, kK);
  std::string cells;
  bool all = true;
  for (int m : {1, 3, 4, 7, 8, 64}) {
    std::vector<float> wm(static_cast<size_t>(kK * kRows)), xm(static_cast<size_t>(kK * m));
    for (float& v : wm) v = normal(rng);
    for (float& v : xm) v = normal(rng);
    std::vector<uint8_t> w(w_row * kRows);
    g.quantize_chunk(ggml_type, wm.data(), w.data(), 0, kRows, kK, nullptr);
    // The weight alone in a no-alloc context, placed in a repack buffer; setting its data repacks it.
    void* wctx = g.init(GgmlInitParams{1u << 20, nullptr, true});
    void* W = g.new_tensor_2d(wctx, ggml_type, kK, kRows);
    void* buf = g.buft_alloc_buffer(g.repack_buft(), g.nbytes(W) + 4096);
    if (buf == nullptr || g.tensor_alloc(buf, W, g.buffer_get_base(buf)) != 0) {
      std::fprintf(stderr, "ggml-kernel-diff: cannot place a tensor in the repack buffer\n");
      return false;
    }
    g.tensor_set(W, w.data(), 0, w.size());
    void* ctx = g.init(GgmlInitParams{64u << 20, nullptr, false});
    const float* y = ggml_matmul(g, ctx, W, xm, kK, m, threads);
    std::vector<uint8_t> acts(a_row * static_cast<size_t>(m));
    for (int t = 0; t < m; ++t) tk->quantize_act(xm.data() + t * kK, acts.data() + t * a_row, kK);
    std::vector<float> ours(static_cast<size_t>(kRows * m)), x16(static_cast<size_t>(kRows * m));
    // As the engine computes it: the order's GEMM for two or more activation rows where there is one (IQ4_NL has
    // none: its dot serves every row), else its dot.
    const k::GemmFn gemm =
        m >= 2 ? k::gemm_kernel_for(type, inferd::WeightLayout::kRows, k::best_isa(), k::MatmulOrder::kRepacked) : nullptr;
    if (gemm != nullptr) {
      gemm({type, kK, w.data(), w_row, 0, kRows, acts.data(), a_row, m, ours.data(), kRows, false, nullptr});
    } else {
      for (int t = 0; t < m; ++t) {
        for (int64_t r = 0; r < kRows; ++r) {
          tk->dot(kK, w.data() + r * w_row, acts.data() + t * a_row, a_row, 1, &ours[t * kRows + r]);
        }
      }
    }
    // dot_x16 (interleaved types) computes one activation row as ggml's GEMV does: Q4_K's rows past m - m % 4 (the
    // others take its GEMM's steps); every row for Q4_0, whose GEMV and GEMM sum alike.
    const bool has_x16 = inferd::interleavable(type) && tk->dot_x16 != nullptr;
    if (has_x16) {
      std::vector<uint8_t> inter(w.size());
      inferd::interleave_groups(type, kK, kRows / inferd::kInterleaveRows, w.data(), inter.data());
      for (int t = 0; t < m; ++t) {
        for (int64_t r = 0; r < kRows; r += inferd::kInterleaveRows) {
          tk->dot_x16(kK, inter.data() + r * w_row, acts.data() + t * a_row, &x16[t * kRows + r]);
        }
      }
    }
    const int first16 = !has_x16 ? m : type == DType::kQ4_K ? m - m % 4 : 0;
    int equal = 0, equal16 = 0;
    for (int64_t i = 0; i < kRows * m; ++i) {
      equal += std::memcmp(&ours[i], &y[i], sizeof(float)) == 0;
      if (i >= first16 * kRows) equal16 += std::memcmp(&x16[i], &y[i], sizeof(float)) == 0;
    }
    const int64_t n16 = (m - first16) * kRows;
    all = all && equal == kRows * m && equal16 == n16;
    char cell[64];
    if (n16 > 0) {
      std::snprintf(cell, sizeof(cell), "%s%.1f%% (x16 %.1f%%)", cells.empty() ? "" : " / ", 100.0 * equal / (m * kRows),
                    100.0 * equal16 / n16);
    } else {
      std::snprintf(cell, sizeof(cell), "%s%.1f%%", cells.empty() ? "" : " / ", 100.0 * equal / (m * kRows));
    }
    cells += cell;
    g.free(ctx);
    g.buffer_free(buf);
    g.free(wctx);
  }
  std::printf("\n%s in ggml's repack buffer (llama.cpp's default) against MatmulOrder::kRepacked, rows 1 / 3 / 4 / 7 / "
              "8 / 64: %s\n", inferd::dtype_name(type), cells.c_str());
  return all;
}

struct TypeCase {
  DType type;
  int ggml_type;  // ggml_type enum value (equal to the GGUF type id)
};
constexpr TypeCase kTypes[] = {{DType::kQ4_0, 2}, {DType::kQ4_1, 3}, {DType::kQ5_0, 6}, {DType::kQ5_1, 7},
                               {DType::kQ8_0, 8}, {DType::kQ4_K, 12}, {DType::kQ5_K, 13}, {DType::kQ6_K, 14},
                               {DType::kQ2_K, 10}, {DType::kQ3_K, 11}, {DType::kIQ4_NL, 20}, {DType::kIQ4_XS, 23}};

}  // namespace

int main(int argc, char** argv) {
  std::string lib;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--lib" && i + 1 < argc) {
      lib = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: ggml-kernel-diff --lib DIR [--threads N]\n");
      return 2;
    }
  }
  Ggml g{};
  if (lib.empty() || !load(lib, g)) return 2;
  g.cpu_init();
  std::printf("inferd kernels: %s; ggml built %s AVX-512\n", k::isa_name(k::best_isa()),
              g.cpu_has_avx512() ? "with" : "without");
  std::printf("| type | act. quantization equal | vec_dot equal | ggml_mul_mat equal, rows 1 / 3 / 7 / 8 / 64 |\n");
  std::printf("|---|---|---|---|\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  bool all_equal = true;
  for (const TypeCase& tc : kTypes) {
    const k::TypeKernels* tk = k::type_kernels(tc.type);
    const GgmlTraitsCpu* wt = g.traits_cpu(tc.ggml_type);
    const GgmlTraitsCpu* at = g.traits_cpu(wt->vec_dot_type);
    constexpr int64_t kK = 1024;
    constexpr int kTrials = 200;
    int quant_equal = 0, dot_equal = 0;
    // Odd trials use a row one block longer than 1024 (for 32-element types an odd block count: kernels that
    // take blocks in pairs finish with a single one).
    const int64_t k_odd = kK + inferd::dtype_info(tc.type)->block_size;
    std::vector<float> wf(k_odd), xf(k_odd);
    std::vector<uint8_t> w(g.row_size(tc.ggml_type, k_odd)), a_ggml(g.row_size(wt->vec_dot_type, k_odd)),
        a_ours(a_ggml.size());
    for (int trial = 0; trial < kTrials; ++trial) {
      const int64_t k = trial % 2 ? k_odd : kK;
      const size_t a_bytes = g.row_size(wt->vec_dot_type, k);
      for (float& v : wf) v = normal(rng);
      for (float& v : xf) v = normal(rng) * static_cast<float>(1 + trial % 3);
      g.quantize_chunk(tc.ggml_type, wf.data(), w.data(), 0, 1, k, nullptr);
      at->from_float(xf.data(), a_ggml.data(), k);
      tk->quantize_act(xf.data(), a_ours.data(), k);
      quant_equal += std::memcmp(a_ggml.data(), a_ours.data(), a_bytes) == 0;
      float s_ggml = 0.0f, s_ours = 0.0f;
      wt->vec_dot(static_cast<int>(k), &s_ggml, 0, w.data(), 0, a_ggml.data(), 0, 1);
      tk->dot(k, w.data(), a_ggml.data(), a_bytes, 1, &s_ours);
      dot_equal += std::memcmp(&s_ggml, &s_ours, sizeof(float)) == 0;
      if (std::getenv("DIFF_VERBOSE") && std::memcmp(&s_ggml, &s_ours, sizeof(float)) != 0)
        std::printf("%s k %lld: ggml %.9g ours %.9g\n", inferd::dtype_name(tc.type), (long long)k, s_ggml, s_ours);
    }
    all_equal = all_equal && quant_equal == kTrials && dot_equal == kTrials;

    std::string mm;
    for (int m : {1, 3, 7, 8, 64}) {
      constexpr int64_t kRows = 256;
      void* ctx = g.init(GgmlInitParams{64u << 20, nullptr, false});
      void* W = g.new_tensor_2d(ctx, tc.ggml_type, kK, kRows);
      std::vector<float> wm(static_cast<size_t>(kK * kRows)), xm(static_cast<size_t>(kK * m));
      for (float& v : wm) v = normal(rng);
      for (float& v : xm) v = normal(rng);
      g.quantize_chunk(tc.ggml_type, wm.data(), g.get_data(W), 0, kRows, kK, nullptr);
      const float* y = ggml_matmul(g, ctx, W, xm, kK, m, threads);
      const size_t w_row = g.row_size(tc.ggml_type, kK);
      // As the engine computes it: the type's GEMM for two or more activation rows where there is one, else dot.
      int equal = 0;
      const size_t a_row = g.row_size(wt->vec_dot_type, kK);
      std::vector<uint8_t> acts(a_row * static_cast<size_t>(m));
      for (int t = 0; t < m; ++t) tk->quantize_act(xm.data() + t * kK, acts.data() + t * a_row, kK);
      std::vector<float> ours(static_cast<size_t>(kRows * m));
      const auto* wdata = static_cast<const uint8_t*>(g.get_data(W));
      // A plain buffer is what llama.cpp multiplies a matrix it does not repack from: the engine's default order
      // for the other types (the tiled order of Q2_K, Q3_K, Q5_K, Q6_K and IQ4_XS from 8 rows on: that of their
      // kRepacked GEMMs, whichever build), the vec_dot order for Q4_0, Q4_K and IQ4_NL, whose repacked orders (4)
      // checks. (A plain Q4_K buffer goes through the tiled GEMM from 8 rows on, as llama.cpp multiplies the Q4_K
      // matrices it cannot repack, those whose row count is not a multiple of 8: the engine keeps the vec_dot order
      // for them, so that column differs.)
      const bool repackable = tc.type == DType::kQ4_0 || tc.type == DType::kQ4_K || tc.type == DType::kIQ4_NL;
      const k::GemmFn gemm = m >= 2 ? k::gemm_kernel_for(tc.type, inferd::WeightLayout::kRows, k::best_isa(),
                                                         repackable ? k::MatmulOrder::kVecDot : k::MatmulOrder::kRepacked)
                                    : nullptr;
      if (gemm != nullptr) {
        gemm({tc.type, kK, wdata, w_row, 0, kRows, acts.data(), a_row, m, ours.data(), kRows, false, nullptr});
      } else {
        for (int t = 0; t < m; ++t) {
          for (int64_t r = 0; r < kRows; ++r) tk->dot(kK, wdata + r * w_row, acts.data() + t * a_row, a_row, 1, &ours[t * kRows + r]);
        }
      }
      for (int64_t i = 0; i < kRows * m; ++i) equal += std::memcmp(&ours[i], &y[i], sizeof(float)) == 0;
      char cell[48];
      std::snprintf(cell, sizeof(cell), "%s%.1f%%", mm.empty() ? "" : " / ", 100.0 * equal / (m * kRows));
      mm += cell;
      g.free(ctx);
    }
    std::printf("| %s | %d/%d | %d/%d | %s |\n", inferd::dtype_name(tc.type), quant_equal, kTrials, dot_equal, kTrials,
                mm.c_str());
  }
  all_equal = repacked(g, threads, rng, DType::kQ4_0, 2, 8 /* Q8_0 */) && all_equal;
  all_equal = repacked(g, threads, rng, DType::kQ4_K, 12, 15 /* Q8_K */) && all_equal;
  all_equal = repacked(g, threads, rng, DType::kIQ4_NL, 20, 8 /* Q8_0 */) && all_equal;
  return all_equal ? 0 : 1;
}
