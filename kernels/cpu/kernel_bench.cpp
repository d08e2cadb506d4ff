// inferd-kernel-bench: single-thread GB/s of weight data streamed by TypeKernels::dot.
//
// A 5632 x 2048 weight matrix (about 6-12 MB quantized, larger than this CPU's L2 and its share of
// L3) is multiplied with nr = 1 and nr = 4 activation rows, once per ISA. With --ggml PATH
// (libggml-cpu.so) it also times llama.cpp's own vec_dot for the same types, nr = 1, in-process.
//
// --pages: the decode GEMV streaming a 300000 x 2048 matrix (345 MB of Q4_0) from a memfd, as the workers
// read the weights segment, in the row layout (dot_w4) and interleaved (dot_x16), for Q4_0, Q4_1, Q5_0, Q8_0,
// Q4_K, Q5_K and Q6_K on AVX2 and AVX-512, once with 4 KiB pages and once after MADV_COLLAPSE into 2 MiB pages; single
// thread, each pass reads every byte once (out of cache: larger than the L2 and this VM's share of L3).
//
// --cached: the same decode GEMVs over a 128 x 2048 interleaved matrix (140-280 KB) that stays in L2, passed over
// 400 times per timing: the kernels' arithmetic rate, which decides the decode wherever memory gives more.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/weight_layout.h"

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
      case DType::kQ5_K:
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

// One pass of the decode GEMV over `rows` rows of `type` at `w` (row layout: dot_w4; interleaved: dot_x16, or
// dot_x16_groups kMaxX16Groups groups at a time where the type has it, as the engine calls them).
void one_pass(DType type, inferd::WeightLayout layout, const TypeKernels* k, const uint8_t* w, int64_t rows,
              const uint8_t* act, float* out) {
  const size_t row_bytes = inferd::dtype_row_bytes(type, kCols);
  if (layout == inferd::WeightLayout::kRows) {
    for (int64_t r = 0; r < rows; r += 4) k->dot_w4(kCols, w + r * row_bytes, row_bytes, act, out + r);
    return;
  }
  constexpr int64_t kChunk = 16 * kMaxX16Groups;
  for (int64_t r = 0; r < rows; r += k->dot_x16_groups != nullptr ? kChunk : 16) {
    if (k->dot_x16_groups == nullptr) {
      k->dot_x16(kCols, w + r * row_bytes, act, out + r);
    } else {
      const int n = static_cast<int>(std::min<int64_t>(kChunk, rows - r) / 16);
      k->dot_x16_groups(kCols, w + r * row_bytes, 16 * row_bytes, n, act, out + r);
    }
  }
}

// GB/s of weights of one_pass, best of kReps.
double stream(DType type, inferd::WeightLayout layout, const TypeKernels* k, const uint8_t* w, int64_t rows,
              const uint8_t* act, float* out) {
  const size_t row_bytes = inferd::dtype_row_bytes(type, kCols);
  const double s = best_seconds([&] { one_pass(type, layout, k, w, rows, act, out); });
  return static_cast<double>(rows) * row_bytes / s / 1e9;
}

// The decode GEMV benchmarks' types (those with an interleaved form) and activation row.
constexpr DType kGemvTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ8_0,
                                DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
std::vector<float> gemv_activation() {
  std::vector<float> x(kCols);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  return x;
}

int bench_pages() {
  constexpr size_t kHuge = size_t{2} << 20;
  constexpr int64_t kStreamRows = 300000;  // x 1152 B = 345 MB of Q4_0
  const std::vector<float> x = gemv_activation();
  std::vector<float> out(kStreamRows);
  std::printf("decode GEMV, %lld x %lld from a memfd, single thread, best of %d; GB/s of weights\n",
              static_cast<long long>(kStreamRows), static_cast<long long>(kCols), kReps);
  std::printf("%-6s %-7s %-14s %12s %12s\n", "type", "isa", "layout", "4 KiB pages", "2 MiB pages");
  for (DType type : kGemvTypes) {
    const size_t row_bytes = inferd::dtype_row_bytes(type, kCols);
    const size_t bytes = static_cast<size_t>(kStreamRows) * row_bytes;
    const size_t mapped = (bytes + kHuge - 1) / kHuge * kHuge;
    // 64 rows of random quants, repeated; the interleaved copy interleaves the 64 rows (4 groups).
    const std::vector<uint8_t> rows64 = [&] {
      std::vector<uint8_t> r = make_weights(type);
      r.resize(row_bytes * 64);
      return r;
    }();
    std::vector<uint8_t> groups4(rows64.size());
    inferd::interleave_groups(type, kCols, 4, rows64.data(), groups4.data());
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_available(isa)) continue;
      // The kernels of the environment's matmul order (INFERD_MATMUL_ORDER, inferd/kernels/cpu.h).
      const TypeKernels* k = type_kernels(type, isa, matmul_order_for(type, kStreamRows));
      std::vector<uint8_t> act(inferd::dtype_row_bytes(k->act_type, kCols));
      k->quantize_act(x.data(), act.data(), kCols);
      for (inferd::WeightLayout layout : {inferd::WeightLayout::kRows, inferd::WeightLayout::kInterleaved16}) {
        if (layout == inferd::WeightLayout::kInterleaved16 && k->dot_x16 == nullptr) continue;
        if (layout == inferd::WeightLayout::kRows && k->dot_w4 == nullptr) continue;
        double gbs[2] = {0, 0};
        for (bool huge : {false, true}) {
          const int fd = memfd_create("inferd-kernel-bench", MFD_CLOEXEC);
          if (fd < 0 || ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
            std::perror("memfd");
            return 1;
          }
          // A 2 MiB-aligned mapping, as ipc::WeightsSegment makes.
          void* reserved = mmap(nullptr, mapped + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (reserved == MAP_FAILED) {
            std::perror("mmap");
            close(fd);
            return 1;
          }
          auto* reserve = static_cast<uint8_t*>(reserved);
          auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(reserve) + kHuge - 1) & ~uintptr_t{kHuge - 1});
          void* mapped_w = mmap(base, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
          if (mapped_w == MAP_FAILED) {
            std::perror("mmap");
            munmap(reserve, mapped + kHuge);
            close(fd);
            return 1;
          }
          auto* w = static_cast<uint8_t*>(mapped_w);
          const std::vector<uint8_t>& pattern = layout == inferd::WeightLayout::kRows ? rows64 : groups4;
          for (size_t off = 0; off < bytes; off += pattern.size()) {
            std::memcpy(w + off, pattern.data(), std::min(pattern.size(), bytes - off));
          }
          if (huge) {
            madvise(w, mapped, MADV_HUGEPAGE);
            if (madvise(w, mapped, 25 /* MADV_COLLAPSE, Linux 6.1 */) != 0) std::printf("(2 MiB pages refused)\n");
          }
          const int64_t rows = kStreamRows / 64 * 64;
          gbs[huge ? 1 : 0] = stream(type, layout, k, w, rows, act.data(), out.data());
          munmap(reserve, mapped + kHuge);
          close(fd);
        }
        std::printf("%-6s %-7s %-14s %12.2f %12.2f\n", inferd::dtype_name(type), isa_name(isa),
                    inferd::weight_layout_name(layout), gbs[0], gbs[1]);
      }
    }
  }
  return 0;
}

int bench_cached() {
  constexpr int64_t kCachedRows = 128;
  constexpr int kPasses = 400;
  const std::vector<float> x = gemv_activation();
  std::vector<float> out(kCachedRows);
  std::printf("decode GEMV, %lld x %lld interleaved, in L2, single thread, %d passes, best of %d; GB/s of weights\n",
              static_cast<long long>(kCachedRows), static_cast<long long>(kCols), kPasses, kReps);
  std::printf("%-6s %-7s %10s\n", "type", "isa", "GB/s");
  for (DType type : kGemvTypes) {
    const size_t row_bytes = inferd::dtype_row_bytes(type, kCols);
    std::vector<uint8_t> rows = make_weights(type);
    rows.resize(row_bytes * kCachedRows);
    std::vector<uint8_t> groups(rows.size());
    inferd::interleave_groups(type, kCols, kCachedRows / 16, rows.data(), groups.data());
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_available(isa)) continue;
      const TypeKernels* k = type_kernels(type, isa, matmul_order_for(type, kCachedRows));
      if (k->dot_x16 == nullptr) continue;
      std::vector<uint8_t> act(inferd::dtype_row_bytes(k->act_type, kCols));
      k->quantize_act(x.data(), act.data(), kCols);
      one_pass(type, inferd::WeightLayout::kInterleaved16, k, groups.data(), kCachedRows, act.data(), out.data());
      const double s = best_seconds([&] {
        for (int pass = 0; pass < kPasses; ++pass) {
          one_pass(type, inferd::WeightLayout::kInterleaved16, k, groups.data(), kCachedRows, act.data(), out.data());
        }
      });
      const double gbs = static_cast<double>(kPasses) * static_cast<double>(kCachedRows) * row_bytes / s / 1e9;
      std::printf("%-6s %-7s %10.2f\n", inferd::dtype_name(type), isa_name(isa), gbs);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--pages") == 0) return bench_pages();
    if (std::strcmp(argv[i], "--cached") == 0) return bench_cached();
  }
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
