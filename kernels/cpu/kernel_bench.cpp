// inferd-kernel-bench: single-thread GB/s of weight data streamed by TypeKernels::dot.
//
// A 5632 x 2048 weight matrix (about 6-12 MB quantized, larger than this CPU's L2 and its share of
// L3) is multiplied with nr = 1 and nr = 4 activation rows, once per ISA. With --ggml PATH
// (libggml-cpu.so) it also times llama.cpp's own vec_dot for the same types, nr = 1, in-process.
#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "inferd/kernels/cpu.h"

namespace {

using inferd::DType;
using namespace inferd::kernels;

constexpr int64_t kCols = 2048;
constexpr int64_t kRows = 5632;
constexpr int kReps = 7;

std::vector<uint8_t> make_weights(DType type) {
  const size_t row_bytes = inferd::dtype_row_bytes(type, kCols);
  std::vector<uint8_t> w(row_bytes * kRows);
  std::mt19937 rng(1);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  // Random quants; every fp16 scale/min word set to 0x2000 (~0.0078) so no NaN/inf reaches the
  // float path.
  const inferd::DTypeInfo* info = inferd::dtype_info(type);
  const inferd::fp16_t s = 0x2000;
  for (size_t off = 0; off < w.size(); off += info->block_bytes) {
    switch (type) {
      case DType::kQ6_K:
        std::memcpy(&w[off + offsetof(inferd::BlockQ6_K, d)], &s, 2);
        break;
      case DType::kQ4_1:
      case DType::kQ4_K:
        std::memcpy(&w[off + 2], &s, 2);
        std::memcpy(&w[off], &s, 2);
        break;
      default:
        std::memcpy(&w[off], &s, 2);
        break;
    }
  }
  return w;
}

template <typename F>
double best_seconds(F&& f) {
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

// llama.cpp's CPU type traits (ggml-cpu.h), for --ggml.
using GgmlVecDot = void (*)(int n, float* s, size_t bs, const void* x, size_t bx, const void* y, size_t by,
                            int nrc);
using GgmlFromFloat = void (*)(const float* x, void* y, int64_t k);
struct GgmlTraitsCpu {
  GgmlFromFloat from_float;
  GgmlVecDot vec_dot;
  int vec_dot_type;
  int64_t nrows;
};
using GgmlGetTraits = const GgmlTraitsCpu* (*)(int type);

}  // namespace

int main(int argc, char** argv) {
  GgmlGetTraits ggml_traits = nullptr;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--ggml") == 0) {
      void* lib = dlopen(argv[i + 1], RTLD_NOW | RTLD_LOCAL);
      if (!lib) {
        std::fprintf(stderr, "cannot load %s: %s\n", argv[i + 1], dlerror());
        return 1;
      }
      if (auto init = reinterpret_cast<void (*)()>(dlsym(lib, "ggml_cpu_init"))) init();
      ggml_traits = reinterpret_cast<GgmlGetTraits>(dlsym(lib, "ggml_get_type_traits_cpu"));
    }
  }
  std::printf("matrix %lld x %lld, single thread, best of %d; GB/s of weight bytes\n",
              static_cast<long long>(kRows), static_cast<long long>(kCols), kReps);
  std::printf("%-6s %-7s %10s %10s\n", "type", "isa", "nr=1", "nr=4");
  std::vector<float> x(kCols * kMaxDotRows);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  std::vector<float> out(kRows * kMaxDotRows);
  volatile float sink = 0.0f;
  for (DType type : {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const std::vector<uint8_t> w = make_weights(type);
    const size_t row_bytes = inferd::dtype_row_bytes(type, kCols);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_available(isa)) continue;
      const TypeKernels* k = type_kernels(type, isa);
      const size_t stride = inferd::dtype_row_bytes(k->act_type, kCols);
      std::vector<uint8_t> act(stride * kMaxDotRows);
      for (int r = 0; r < kMaxDotRows; ++r) k->quantize_act(x.data() + r * kCols, act.data() + r * stride, kCols);
      double gbs[2];
      int idx = 0;
      for (int nr : {1, 4}) {
        const double s = best_seconds([&] {
          for (int64_t row = 0; row < kRows; ++row) {
            k->dot(kCols, w.data() + row * row_bytes, act.data(), stride, nr, &out[row * kMaxDotRows]);
          }
        });
        sink = sink + out[0];
        gbs[idx++] = static_cast<double>(w.size()) / s / 1e9;
      }
      std::printf("%-6s %-7s %10.2f %10.2f\n", inferd::dtype_name(type), isa_name(isa), gbs[0], gbs[1]);
    }
    if (ggml_traits) {
      const GgmlTraitsCpu* t = ggml_traits(static_cast<int>(type));
      const TypeKernels* k = type_kernels(type, Isa::kScalar);
      const size_t stride = inferd::dtype_row_bytes(k->act_type, kCols);
      std::vector<uint8_t> act(stride);
      ggml_traits(t->vec_dot_type)->from_float(x.data(), act.data(), kCols);
      const double s = best_seconds([&] {
        for (int64_t row = 0; row < kRows; ++row) {
          t->vec_dot(static_cast<int>(kCols), &out[row], 0, w.data() + row * row_bytes, 0, act.data(), 0, 1);
        }
      });
      sink = sink + out[0];
      std::printf("%-6s %-7s %10.2f %10s\n", inferd::dtype_name(type), "ggml", w.size() / s / 1e9, "-");
    }
  }
  return 0;
}
