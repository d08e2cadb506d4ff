// inferd-opencl-bench: prefill and decode speed of the OpenCL engine, with inferd-bench's protocol
// (tools/inferd-bench.cpp) so that the two are comparable:
//   prefill: a fresh sequence evaluates a P-token prompt in one pass (tokens/s);
//   decode:  then N tokens are evaluated one per pass (tokens/s), the way generation runs.
// Token ids are pseudo-random with a fixed seed (the same generator as inferd-bench). One warm-up
// round first builds every kernel (or loads it from the program cache), then the median of R rounds.
//
//   inferd-opencl-bench MODEL.gguf [-p 128] [-n 64] [-r 3] [--device SEL] [--storage S] [--float]
//                      [--activations f32|f16] [--storage-choice measure|rule] [--decode-shape RxU]
//                      [--no-fuse] [--prefill-tokens N] [--prefill-kernel simple|tiled] [--profile]
//                      [--attention-chunk N] [--no-replay]
// --storage forces the activations' storage; --storage-choice sets how it is chosen otherwise (default:
// measured on GPUs, cached in the program cache's directory; the rule on CPU devices). The "storage:"
// line says where the storage came from and each candidate's time per decode step.
// --float runs the fast float numerics instead of the default exact ones (ClEngineOptions::numerics);
// --activations forces the activations' data type (f16 needs --float; default: the engine's choice);
// --decode-shape the float decode matmul's work-group shape (ops.h DecodeShape; default: timed with
// --storage-choice measure, 1x1 otherwise); --no-fuse runs matmul_add as a matmul and an add, and the float
// decode's gate|up matmul and SwiGLU apart;
// --prefill-tokens the float prefill matmul's tokens per work-item (default: per device); --prefill-kernel
// its kernel (default: simple); --attention-chunk the float attention's positions per chunk (0: one
// work-group per head and token; default: 64 on GPUs, 0 elsewhere); --no-replay runs every decode step
// through the graph's nodes instead of replaying its recorded launches (OpenClOptions::replay); --profile then runs one more prefill and decode
// with the queue's profiling on and prints wall and device time per pass and the kernels by device time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "inferd/opencl/cl_engine.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace inferd;
using namespace inferd::opencl;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<int32_t> random_tokens(int32_t n, int32_t n_vocab, uint32_t seed) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  uint32_t s = seed;
  for (int32_t& t : out) {
    s = s * 1664525u + 1013904223u;
    t = static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(n_vocab));
  }
  return out;
}

// Sets `out` to the choice named `value`; false when none is.
template <typename T, size_t N, typename NameOf>
bool parse_choice(const char* value, const T (&choices)[N], NameOf name_of, std::optional<T>& out) {
  for (const T& c : choices) {
    if (std::strcmp(value, name_of(c)) == 0) {
      out = c;
      return true;
    }
  }
  return false;
}

// One profiled prefill of `prompt` and `n_gen` profiled decode steps after it: each stage's wall time
// and device time (the kernels' CL_PROFILING_COMMAND_START to _END, summed) per pass, and its kernels by
// device time. Device time well below wall time means the step waits on the host (launches, transfers).
Status print_profile(ClEngine& e, const std::vector<int32_t>& prompt, int32_t n_gen) {
  const auto report = [](const char* stage, int32_t passes, double wall_ms, const Profile& p) {
    std::printf("profile %s: %.3f ms wall, %.3f ms on the device (%.0f%%), device idle between kernels %.3f ms, "
                "%lld launches per pass, the host enqueues one per %.1f us (median)\n",
                stage, wall_ms / passes, p.device_ms / passes, wall_ms > 0 ? 100.0 * p.device_ms / wall_ms : 0.0,
                p.gap_ms / passes, static_cast<long long>(p.launches / passes), p.enqueue_median_us);
    for (size_t i = 0; i < p.kernels.size() && i < 12; ++i) {
      const KernelTime& k = p.kernels[i];
      std::printf("  %-58s %6.1f launches %9.4f ms %5.1f%%\n", k.kernel.c_str(),
                  static_cast<double>(k.launches) / passes, k.ms / passes, p.device_ms > 0 ? 100.0 * k.ms / p.device_ms : 0.0);
    }
  };
  e.clear_slot(0);
  e.set_profiling(true);
  const auto t0 = Clock::now();
  auto p = e.eval(0, prompt);
  if (!p) return p.status();
  const double prefill_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  auto prefill = e.take_profile();
  if (!prefill) return prefill.status();
  int32_t token = static_cast<int32_t>(std::max_element(p->begin(), p->end()) - p->begin());
  const auto t1 = Clock::now();
  for (int32_t i = 0; i < n_gen; ++i) {
    auto d = e.eval(0, std::span<const int32_t>(&token, 1));
    if (!d) return d.status();
    token = static_cast<int32_t>(std::max_element(d->begin(), d->end()) - d->begin());
  }
  const double decode_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
  e.set_profiling(false);
  auto decode = e.take_profile();
  if (!decode) return decode.status();
  report("prefill", 1, prefill_ms, prefill.value());
  report("decode", n_gen, decode_ms, decode.value());
  return Status::ok();
}

int usage() {
  std::fprintf(stderr,
               "usage: inferd-opencl-bench MODEL.gguf [-p PROMPT_TOKENS] [-n GEN_TOKENS] [-r REPETITIONS]\n"
               "                           [--device SELECTOR] [--float]\n"
               "                           [--storage buffer|image_buffer|texture2d|texture3d|texture2d_split]\n"
               "                           [--activations f32|f16] [--storage-choice measure|rule]\n"
               "                           [--decode-shape RxU] [--no-fuse] [--prefill-tokens 1..16]\n"
               "                           [--prefill-kernel simple|tiled] [--attention-chunk N] [--no-replay]\n"
               "                           [--profile]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, device;
  int32_t n_prompt = 128, n_gen = 64, reps = 3;
  bool profile = false;
  ClEngineOptions eo;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "-p" && (v = next())) {
      n_prompt = std::atoi(v);
    } else if (a == "-n" && (v = next())) {
      n_gen = std::atoi(v);
    } else if (a == "-r" && (v = next())) {
      reps = std::atoi(v);
    } else if (a == "--device" && (v = next())) {
      device = v;
    } else if (a == "--storage" && (v = next())) {
      if (!parse_choice(v, kAllStorageTypes, storage_name, eo.activation_storage)) return usage();
    } else if (a == "--storage-choice" && (v = next())) {
      constexpr StoragePolicy kPolicies[] = {StoragePolicy::kMeasure, StoragePolicy::kRule};
      if (!parse_choice(v, kPolicies, storage_policy_name, eo.storage_policy)) return usage();
    } else if (a == "--decode-shape" && (v = next())) {
      auto shape = parse_decode_shape(v);
      if (!shape) return usage();
      eo.decode_shape = shape.value();
    } else if (a == "--activations" && (v = next())) {
      if (!parse_choice(v, kAllDataTypes, data_type_name, eo.activation_type)) return usage();
    } else if (a == "--prefill-kernel" && (v = next())) {
      constexpr PrefillKernel kKernels[] = {PrefillKernel::kSimple, PrefillKernel::kTiled};
      if (!parse_choice(v, kKernels, prefill_kernel_name, eo.prefill_kernel)) return usage();
    } else if (a == "--prefill-tokens" && (v = next())) {
      eo.prefill_tokens = std::atoi(v);
    } else if (a == "--no-fuse") {
      eo.fuse = false;
    } else if (a == "--attention-chunk" && (v = next())) {
      eo.attention_chunk = std::atoi(v);
    } else if (a == "--no-replay") {
      eo.replay = false;
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--float") {
      eo.numerics = Numerics::kFloat;
    } else if (a[0] != '-' && model_path.empty()) {
      model_path = a;
    } else {
      return usage();
    }
  }
  if (model_path.empty() || n_prompt < 1 || n_gen < 1 || reps < 1) return usage();

  auto model = Model::open(model_path);
  if (!model) {
    std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
    return 1;
  }
  RuntimeOptions ro;
  ro.cache_dir = default_cache_dir();
  ro.profiling = profile;
  auto rt = Runtime::create_default(ro, device);
  if (!rt) {
    std::fprintf(stderr, "%s\n", rt.status().to_string().c_str());
    return 1;
  }
  eo.n_ctx = n_prompt + n_gen;
  eo.n_ubatch = std::max(n_prompt, 1);
  const auto t_load = Clock::now();
  auto engine = ClEngine::create(model.value(), std::move(rt).value(), eo);
  if (!engine) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  ClEngine& e = *engine.value();
  std::printf("model:   %s\ndevice:  %s\nupload:  %.2f s\n", model.value()->describe().c_str(), e.describe().c_str(),
              std::chrono::duration<double>(Clock::now() - t_load).count());
  std::printf("storage: %s, decode matmul %s (%s", storage_name(e.activation_storage()), e.decode_shape().to_string().c_str(),
              storage_source_name(e.storage_source()));
  if (e.storage_source() == StorageSource::kMeasured) std::printf(" in %.2f s, kernel builds included", e.storage_measure_ms() / 1e3);
  for (const StorageTrial& t : e.storage_trials()) {
    std::printf("; %s %s %.3f ms/step", storage_name(t.storage), t.decode.to_string().c_str(), t.step_ms);
  }
  std::printf(")\n");

  const std::vector<int32_t> prompt = random_tokens(n_prompt, e.n_vocab(), 42);
  std::vector<double> prefill, decode;
  double first_round_s = 0;
  int64_t decode_launches = 0;
  for (int r = 0; r <= reps; ++r) {  // round 0 warms up (kernel builds)
    e.clear_slot(0);
    const auto t0 = Clock::now();
    auto p = e.eval(0, prompt);
    if (!p) {
      std::fprintf(stderr, "prefill: %s\n", p.status().to_string().c_str());
      return 1;
    }
    const auto t1 = Clock::now();
    const int64_t launches_before = e.stats().launches;
    int32_t token = static_cast<int32_t>(std::max_element(p->begin(), p->end()) - p->begin());
    for (int32_t i = 0; i < n_gen; ++i) {
      auto d = e.eval(0, std::span<const int32_t>(&token, 1));
      if (!d) {
        std::fprintf(stderr, "decode: %s\n", d.status().to_string().c_str());
        return 1;
      }
      token = static_cast<int32_t>(std::max_element(d->begin(), d->end()) - d->begin());
    }
    const auto t2 = Clock::now();
    decode_launches = (e.stats().launches - launches_before) / n_gen;
    if (r == 0) {
      first_round_s = std::chrono::duration<double>(t2 - t0).count();
      continue;
    }
    prefill.push_back(n_prompt / std::chrono::duration<double>(t1 - t0).count());
    decode.push_back(n_gen / std::chrono::duration<double>(t2 - t1).count());
  }
  const ProgramCacheStats& cs = e.runtime().cache_stats();
  std::printf("kernels: %zu (programs: %d compiled, %d from the disk cache; %zu built side by side); first round "
              "(its kernel builds included) %.2f s\n",
              e.stats().kernels, cs.compiled, cs.disk_hits, e.stats().kernels_collected, first_round_s);
  std::printf("memory:  weights %.1f MiB, KV cache %.1f MiB, activations %.1f MiB\n",
              static_cast<double>(e.stats().weight_bytes) / 1048576.0, static_cast<double>(e.stats().kv_bytes) / 1048576.0,
              static_cast<double>(e.stats().activation_bytes) / 1048576.0);
  std::printf("prefill: %d tokens  %8.2f tok/s (median of %d)\n", n_prompt, median(prefill), reps);
  std::printf("decode:  %d tokens  %8.2f tok/s (median of %d), %lld kernel launches per step; %lld steps replayed, "
              "%lld recorded\n",
              n_gen, median(decode), reps, static_cast<long long>(decode_launches),
              static_cast<long long>(e.backend_stats().replayed_steps), static_cast<long long>(e.backend_stats().recorded_steps));
  if (profile) {
    if (Status s = print_profile(e, prompt, n_gen); !s) {
      std::fprintf(stderr, "profile: %s\n", s.to_string().c_str());
      return 1;
    }
  }
  return 0;
}
