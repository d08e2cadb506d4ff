// inferd-cuda-bandwidth — the GPU's memory bandwidth, and the decode GEMV's weight read against it.
//
// Three measurements on one device, each the best and median of --reps timed runs (CUDA events):
//   read   a kernel reads a --size-mib buffer with 16-byte loads (cuda::read_probe): the read bandwidth a
//          decode step can hope for;
//   copy   cudaMemcpy device to device of half the buffer (bytes read + bytes written);
//   gemv   the backend's float GEMV (cuda::matmul_path, one token) on weight matrices of a decode step's
//          shapes and types, its bytes of weights over its time: staged (the default, rows through
//          shared memory with 16-byte loads), unstaged (path 3) and, for Q4_0 and Q8_0, the integer GEMV
//          on 8-bit inputs (cuda::matmul_q8: dp4a), alternating;
//   paths  the float GEMV and the integer GEMV against the tensor-core GEMM by tokens per step: where prefill-sized steps
//          would do better on tensor cores (the backend uses one path for every step, for batch
//          invariance; this shows what that costs).
// The weight matrices hold pseudo-random blocks (timing does not depend on the values).
//
// Usage: inferd-cuda-bandwidth [--device N] [--size-mib M] [--reps R] [--json]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "inferd/kernels/cuda.h"

namespace {

namespace cu = inferd::cuda;

#define CHECK(expr)                                                                                   \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "inferd-cuda-bandwidth: %s: %s\n", #expr, cudaGetErrorString(e_));          \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

struct Stat {
  double best = 0, median = 0;
};

// Runs `fn` (which enqueues work on `s`) reps times; returns the times in seconds.
template <class Fn>
std::vector<double> time_runs(cudaStream_t s, int reps, Fn fn, bool warm_up = true) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  if (warm_up) {
    fn();
    CHECK(cudaStreamSynchronize(s));
  }
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a, s));
    fn();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return t;
}

Stat rate(std::vector<double> t, double bytes) {
  std::sort(t.begin(), t.end());
  return {bytes / t.front() / 1e9, bytes / t[t.size() / 2] / 1e9};
}

struct TypeInfo {
  cu::WType type;
  const char* name;
  int64_t block_values, block_bytes;
};

}  // namespace

int main(int argc, char** argv) {
  int device = 0, reps = 20;
  size_t size_mib = 4096;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "inferd-cuda-bandwidth: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") {
      device = std::atoi(next());
    } else if (a == "--size-mib") {
      size_mib = std::strtoull(next(), nullptr, 10);
    } else if (a == "--reps") {
      reps = std::atoi(next());
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: inferd-cuda-bandwidth [--device N] [--size-mib M] [--reps R] [--json]\n");
      return 2;
    }
  }
  // The largest GEMV matrix (Q8_0, 14336 x 4096: 59.5 MiB) and the tensor-core comparison's fit in 64 MiB.
  if (reps < 1 || size_mib < 64) {
    std::fprintf(stderr, "inferd-cuda-bandwidth: --reps >= 1 and --size-mib >= 64\n");
    return 2;
  }
  int n_dev = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n_dev); e != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "inferd-cuda-bandwidth: no CUDA device: %s\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 1;
  }
  CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  const size_t bytes = size_mib << 20;
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&buf, bytes));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&sink), sizeof(uint32_t)));
  CHECK(cudaMemset(buf, 0x5A, bytes));
  const int blocks = prop.multiProcessorCount * 4;
  const Stat read = rate(time_runs(s, reps, [&] { CHECK(cu::read_probe(buf, bytes, blocks, sink, s)); }),
                         static_cast<double>(bytes));
  const size_t half = bytes / 2;
  const Stat copy = rate(time_runs(s, reps,
                                   [&] {
                                     CHECK(cudaMemcpyAsync(static_cast<char*>(buf) + half, buf, half,
                                                           cudaMemcpyDeviceToDevice, s));
                                   }),
                         2.0 * static_cast<double>(half));
  if (!json) {
    std::printf("device   %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30));
    std::printf("read     %zu MiB, 16-byte loads: best %.1f GB/s, median %.1f GB/s\n", size_mib, read.best,
                read.median);
    std::printf("copy     %zu MiB device to device: best %.1f GB/s, median %.1f GB/s (read + written)\n",
                size_mib / 2, copy.best, copy.median);
  }

  // The decode GEMV on an 8B model's shapes (rows x cols): attention output, FFN up, FFN down.
  const TypeInfo types[] = {{cu::WType::kQ4_0, "q4_0", 32, 18},
                            {cu::WType::kQ8_0, "q8_0", 32, 34},
                            {cu::WType::kQ4_K, "q4_k", 256, 144},
                            {cu::WType::kQ6_K, "q6_k", 256, 210}};
  const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
  float *x = nullptr, *y = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&x), 14336 * sizeof(float)));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&y), 14336 * sizeof(float)));
  {
    std::vector<float> hx(14336);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    CHECK(cudaMemcpy(x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  // The same input as 8-bit codes for the integer GEMV, per row width.
  void* xq = nullptr;
  CHECK(cudaMalloc(&xq, cu::q8_input_bytes(1, 14336)));
  // Pseudo-random bytes for the weights (scales included: no value changes the kernels' time).
  {
    std::vector<uint8_t> h(64 << 20);
    uint32_t st = 12345;
    for (auto& b : h) {
      st = st * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(st >> 24);
    }
    for (size_t off = 0; off < bytes; off += h.size()) {
      CHECK(cudaMemcpy(static_cast<char*>(buf) + off, h.data(), std::min(h.size(), bytes - off),
                       cudaMemcpyHostToDevice));
    }
  }
  if (json) {
    std::printf("{\"device\":\"%s\",\"read_gbs\":%.1f,\"copy_gbs\":%.1f,\"gemv\":[", prop.name, read.best, copy.best);
  }
  bool first = true;
  for (const TypeInfo& t : types) {
    for (const auto& shape : shapes) {
      cu::Matrix w;
      w.type = t.type;
      w.rows = shape[0];
      w.cols = shape[1];
      w.row_bytes = static_cast<size_t>(shape[1] / t.block_values * t.block_bytes);
      const size_t wbytes = w.row_bytes * static_cast<size_t>(w.rows);
      // As many copies as the buffer holds, used in turn: every run reads from HBM, not from L2.
      const size_t copies = std::max<size_t>(1, bytes / ((wbytes + 255) / 256 * 256));
      size_t at = 0;
      // Path 1: staged, 3: unstaged, -1: the integer GEMV.
      auto run = [&](int path) {
        w.data = static_cast<char*>(buf) + (at++ % copies) * ((wbytes + 255) / 256 * 256);
        CHECK(path < 0 ? cu::matmul_q8(w, xq, 1, nullptr, nullptr, y, s)
                       : cu::matmul_path(path, w, x, 1, nullptr, nullptr, y, s));
      };
      w.data = buf;
      const bool integer = cu::q8_gemv_applies(w);
      if (integer) CHECK(cu::quantize_q8_input(x, 1, w.cols, xq, s));
      // kLaunches launches per timing, queued behind a spinning kernel so that they run back to back.
      constexpr int kLaunches = 16;
      auto timed = [&](int path) {
        CHECK(cu::spin(2000000, s));  // ~1 ms: longer than enqueueing kLaunches kernels
        return time_runs(
            s, 1,
            [&] {
              for (int j = 0; j < kLaunches; ++j) run(path);
            },
            false)[0];
      };
      std::vector<double> staged, unstaged, q8;
      timed(1);
      timed(3);  // warm-up
      if (integer) timed(-1);
      for (int i = 0; i < reps; ++i) {
        staged.push_back(timed(1));
        unstaged.push_back(timed(3));
        if (integer) q8.push_back(timed(-1));
      }
      const double timed_bytes = static_cast<double>(wbytes) * kLaunches;
      const Stat st = rate(staged, timed_bytes), un = rate(unstaged, timed_bytes);
      const Stat iq = integer ? rate(q8, timed_bytes) : Stat{};
      if (json) {
        std::printf("%s{\"type\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"staged_gbs\":%.1f,\"unstaged_gbs\":%.1f,"
                    "\"q8_gbs\":%.1f}",
                    first ? "" : ",", t.name, static_cast<long long>(w.rows), static_cast<long long>(w.cols),
                    st.median, un.median, iq.median);
      } else {
        std::printf("gemv     %-5s %5lld x %-5lld (%6.1f MiB): staged %7.1f GB/s (%4.1f%% of read), unstaged %7.1f GB/s"
                    " (%4.1f%%)",
                    t.name, static_cast<long long>(w.rows), static_cast<long long>(w.cols),
                    static_cast<double>(wbytes) / (1 << 20), st.median, 100.0 * st.median / read.best, un.median,
                    100.0 * un.median / read.best);
        if (integer) std::printf(", integer %7.1f GB/s (%4.1f%%)", iq.median, 100.0 * iq.median / read.best);
        std::printf("\n");
      }
      first = false;
    }
  }
  if (json) std::printf("]");

  // The stage-aware crossover: the float GEMV against tensor cores on the FFN-up shape (Q4_0, 14336 x 4096)
  // by tokens per step.
  {
    constexpr int64_t kRows = 14336, kCols = 4096, kMaxTokens = 512;
    float *xs = nullptr, *ys = nullptr;
    CHECK(cudaMalloc(reinterpret_cast<void**>(&xs), kMaxTokens * kCols * sizeof(float)));
    CHECK(cudaMalloc(reinterpret_cast<void**>(&ys), kMaxTokens * kRows * sizeof(float)));
    CHECK(cudaMemset(xs, 0, kMaxTokens * kCols * sizeof(float)));
    void* xsq = nullptr;
    CHECK(cudaMalloc(&xsq, cu::q8_input_bytes(kMaxTokens, kCols)));
    cu::Matrix w;
    w.type = cu::WType::kQ4_0;
    w.rows = kRows;
    w.cols = kCols;
    w.row_bytes = kCols / 32 * 18;
    w.data = buf;
    if (json) std::printf(",\"paths\":[");
    bool first_path = true;
    for (int32_t tokens : {1, 2, 4, 8, 16, 32, 64, 128, 512}) {
      CHECK(cu::quantize_q8_input(xs, tokens, kCols, xsq, s));
      // Path 1: the float GEMV, 2: tensor cores, -1: the integer GEMV (its input quantized once).
      auto timed = [&](int path) {
        CHECK(cu::spin(2000000, s));
        return time_runs(
                   s, 1,
                   [&] {
                     for (int j = 0; j < 8; ++j) {
                       CHECK(path < 0 ? cu::matmul_q8(w, xsq, tokens, nullptr, nullptr, ys, s)
                                      : cu::matmul_path(path, w, xs, tokens, nullptr, nullptr, ys, s));
                     }
                   },
                   false)[0] /
               8;
      };
      timed(1);
      timed(2);
      timed(-1);
      std::vector<double> g, tc, iq;
      for (int i = 0; i < std::max(3, reps / 4); ++i) {
        g.push_back(timed(1));
        tc.push_back(timed(2));
        iq.push_back(timed(-1));
      }
      std::sort(g.begin(), g.end());
      std::sort(tc.begin(), tc.end());
      std::sort(iq.begin(), iq.end());
      const double gm = g[g.size() / 2] * 1e6, tm = tc[tc.size() / 2] * 1e6, im = iq[iq.size() / 2] * 1e6;
      if (json) {
        std::printf("%s{\"tokens\":%d,\"gemv_us\":%.1f,\"tensor_cores_us\":%.1f,\"q8_gemv_us\":%.1f}",
                    first_path ? "" : ",", tokens, gm, tm, im);
      } else {
        std::printf("paths    q4_0 14336 x 4096, %3d tokens: gemv %8.1f us, integer gemv %8.1f us, tensor cores %8.1f us"
                    " (%s)\n",
                    tokens, gm, im, tm, std::min(gm, im) <= tm ? (im <= gm ? "integer gemv" : "gemv") : "tensor cores");
      }
      first_path = false;
    }
    if (json) std::printf("]");
    CHECK(cudaFree(xs));
    CHECK(cudaFree(ys));
    CHECK(cudaFree(xsq));
  }
  if (json) std::printf("}\n");
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  CHECK(cudaFree(xq));
  CHECK(cudaFree(buf));
  CHECK(cudaFree(sink));
  CHECK(cudaStreamDestroy(s));
  return 0;
}
