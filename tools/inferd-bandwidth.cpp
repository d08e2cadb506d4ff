// inferd-bandwidth — memory read-bandwidth probe.
//
// Decode speed of a quantized model is bounded by how fast the weights stream from DRAM; this tool measures that
// bound on the machine at hand. N threads each stream-read their own contiguous slice of one buffer (default 1 GiB,
// much larger than any cache), with the widest vector loads the CPU supports (AVX-512, AVX2, else scalar; chosen at
// run time, the wide kernels compiled per function with target attributes). Each slice is first written by the
// thread that later reads it, so pages sit on that thread's NUMA node. Every rep reads the whole buffer once; the
// reported GB/s are 1e9 bytes per second over the time from the start barrier to the last thread finishing.
//
// Usage: inferd-bandwidth [--threads N] [--size-mib M] [--reps R] [--kernel auto|avx512|avx2|scalar] [--json]
// Single-threaded program apart from its worker threads, which share nothing but the barrier and read-only buffer.

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/mman.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define INFERD_BW_X86 1
#endif

namespace {

using ReadFn = uint64_t (*)(const uint8_t* p, size_t n);

// Eight independent accumulators so the loads, not an add chain, set the pace.
uint64_t read_scalar(const uint8_t* p, size_t n) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  const size_t words = n / sizeof(uint64_t);
  uint64_t a[8] = {};
  for (size_t i = 0; i + 8 <= words; i += 8) {
    for (int k = 0; k < 8; ++k) a[k] ^= w[i + k];
  }
  uint64_t r = 0;
  for (uint64_t v : a) r ^= v;
  return r;
}

#ifdef INFERD_BW_X86
__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), x);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, x);
  uint64_t r = 0;
  for (uint64_t v : lanes) r ^= v;
  return r;
}
#endif

struct Kernel {
  const char* name;
  ReadFn fn;
};

bool kernel_by_name(std::string_view want, Kernel* out) {
#ifdef INFERD_BW_X86
  __builtin_cpu_init();
  const bool has512 = __builtin_cpu_supports("avx512f");
  const bool has2 = __builtin_cpu_supports("avx2");
  if (want == "avx512" || (want == "auto" && has512)) {
    if (!has512) return false;
    *out = {"avx512", read_avx512};
    return true;
  }
  if (want == "avx2" || (want == "auto" && has2)) {
    if (!has2) return false;
    *out = {"avx2", read_avx2};
    return true;
  }
#endif
  if (want == "scalar" || want == "auto") {
    *out = {"scalar", read_scalar};
    return true;
  }
  return false;
}

struct Options {
  int threads = 0;  // 0: one per hardware thread
  size_t size_mib = 1024;
  int reps = 10;
  std::string kernel = "auto";
  bool json = false;
};

void usage() {
  std::fprintf(stderr,
               "usage: inferd-bandwidth [--threads N] [--size-mib M] [--reps R] "
               "[--kernel auto|avx512|avx2|scalar] [--json]\n");
}

bool parse_positive(const char* s, long max, long* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v <= 0 || v > max) return false;
  *out = v;
  return true;
}

bool parse_args(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    long v = 0;
    if (a == "--json") {
      o->json = true;
    } else if (a == "--threads" && has_value && parse_positive(argv[++i], 4096, &v)) {
      o->threads = static_cast<int>(v);
    } else if (a == "--size-mib" && has_value && parse_positive(argv[++i], 1 << 20, &v)) {
      o->size_mib = static_cast<size_t>(v);
    } else if (a == "--reps" && has_value && parse_positive(argv[++i], 100000, &v)) {
      o->reps = static_cast<int>(v);
    } else if (a == "--kernel" && has_value) {
      o->kernel = argv[++i];
    } else {
      return false;
    }
  }
  return true;
}

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse_args(argc, argv, &opt)) {
    usage();
    return 2;
  }
  if (opt.threads == 0) opt.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Kernel kernel{};
  if (!kernel_by_name(opt.kernel, &kernel)) {
    std::fprintf(stderr, "inferd-bandwidth: kernel '%s' is unknown or not supported by this CPU\n",
                 opt.kernel.c_str());
    return 2;
  }

  // Slices are multiples of 2 MiB (huge-page and vector-loop friendly), so the buffer is rounded up to that.
  constexpr size_t kChunk = size_t{2} << 20;
  const size_t requested = opt.size_mib << 20;
  const size_t per_thread = std::max(kChunk, (requested / opt.threads + kChunk - 1) / kChunk * kChunk);
  const size_t total = per_thread * static_cast<size_t>(opt.threads);
  std::unique_ptr<uint8_t, FreeDeleter> buffer(static_cast<uint8_t*>(std::aligned_alloc(kChunk, total)));
  if (!buffer) {
    std::fprintf(stderr, "inferd-bandwidth: cannot allocate %zu bytes\n", total);
    return 1;
  }
  madvise(buffer.get(), total, MADV_HUGEPAGE);  // a hint; failure only costs TLB misses

  using Clock = std::chrono::steady_clock;
  const int n_threads = opt.threads;
  std::barrier start(n_threads + 1), finish(n_threads + 1);
  std::vector<uint64_t> sink(static_cast<size_t>(n_threads) * 8);  // one cache line per thread
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(n_threads));
  for (int t = 0; t < n_threads; ++t) {
    workers.emplace_back([&, t] {
      uint8_t* slice = buffer.get() + per_thread * static_cast<size_t>(t);
      for (size_t i = 0; i < per_thread; i += sizeof(uint64_t)) {
        const uint64_t v = (i * 0x9E3779B97F4A7C15ull) ^ static_cast<uint64_t>(t);
        std::memcpy(slice + i, &v, sizeof v);
      }
      start.arrive_and_wait();  // initialization done
      for (int r = 0; r < opt.reps; ++r) {
        start.arrive_and_wait();
        sink[static_cast<size_t>(t) * 8] += kernel.fn(slice, per_thread);
        finish.arrive_and_wait();
      }
    });
  }
  start.arrive_and_wait();

  std::vector<double> gbps;
  for (int r = 0; r < opt.reps; ++r) {
    const auto t0 = Clock::now();
    start.arrive_and_wait();
    finish.arrive_and_wait();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    gbps.push_back(static_cast<double>(total) / s / 1e9);
  }
  for (auto& w : workers) w.join();

  uint64_t check = 0;
  for (uint64_t v : sink) check += v;
  std::vector<double> sorted = gbps;
  std::sort(sorted.begin(), sorted.end());
  const double best = sorted.back();
  const size_t m = sorted.size();
  const double median = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);

  if (opt.json) {
    std::printf("{\"threads\":%d,\"bytes\":%zu,\"reps\":%d,\"kernel\":\"%s\",\"best_gbps\":%.3f,"
                "\"median_gbps\":%.3f,\"gbps\":[",
                n_threads, total, opt.reps, kernel.name, best, median);
    for (size_t i = 0; i < gbps.size(); ++i) std::printf("%s%.3f", i ? "," : "", gbps[i]);
    std::printf("],\"checksum\":%llu}\n", static_cast<unsigned long long>(check));
  } else {
    std::printf("threads %d, buffer %.1f MiB, kernel %s, %d reps: best %.2f GB/s, median %.2f GB/s "
                "(checksum %016llx)\n",
                n_threads, static_cast<double>(total) / (1 << 20), kernel.name, opt.reps, best, median,
                static_cast<unsigned long long>(check));
  }
  return 0;
}
