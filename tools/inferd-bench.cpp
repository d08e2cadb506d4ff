// inferd-bench: prefill and decode speed of the CPU engine, like llama.cpp's llama-bench.
//   prefill: a fresh sequence evaluates a P-token prompt in one pass (tokens/s);
//   decode:  then N tokens are evaluated one per pass (tokens/s), the way generation runs.
// Token ids are pseudo-random with a fixed seed (content does not change the work done).
// --paths measures both matmul paths (GEMV, GEMM) on the same shapes to show each is faster where used.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/session.h"
#include "inferd/backend_names.h"
#include "inferd/backend_registry.h"
#include "inferd/engine.h"
#include "inferd/model_runner.h"
#include "inferd/kernels/cpu.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

long rss_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long v = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') v = std::strtol(line + n + 1, nullptr, 10);
  }
  std::fclose(f);
  return v;
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

// The protocol above on a registered backend other than the CPU engine (a ModelRunner on it).
int bench_backend(const std::shared_ptr<const inferd::Model>& model, const std::string& name, int32_t n_prompt,
                  int32_t n_gen, int32_t reps, int32_t n_ctx, bool json, const std::string& model_path) {
  if (inferd::Status ok = inferd::check_backend_name(name); !ok) {
    std::fprintf(stderr, "error: %s\n", ok.message().c_str());
    return 2;
  }
  const auto parsed = inferd::parse_backend_name(name);
  const inferd::BackendFactory* factory = inferd::find_backend(parsed->family);
  if (factory == nullptr) {
    std::fprintf(stderr, "error: backend %s is not built\n", parsed->family.c_str());
    return 2;
  }
  inferd::BackendConfig config;
  config.device = parsed->device;
  auto backend = inferd::create_backend(*factory, config);
  if (!backend) {
    std::fprintf(stderr, "error: %s\n", backend.status().to_string().c_str());
    return 1;
  }
  inferd::RunnerOptions ro;
  ro.n_ctx = n_ctx > 0 ? n_ctx : n_prompt + n_gen + 1;
  ro.n_ubatch = std::max(512, n_prompt);
  const auto t_load = Clock::now();
  auto runner = inferd::ModelRunner::create(model, std::move(backend).value(), ro);
  if (!runner) {
    std::fprintf(stderr, "error: %s\n", runner.status().to_string().c_str());
    return 1;
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  inferd::ModelRunner& r = *runner.value();
  const std::vector<int32_t> prompt = random_tokens(n_prompt, r.n_vocab(), 42);
  const std::vector<int32_t> gen = random_tokens(std::max(n_gen, 1), r.n_vocab(), 7);
  (void)r.eval(0, std::span<const int32_t>(prompt.data(), std::min<size_t>(prompt.size(), 8)));
  (void)r.eval(0, std::span<const int32_t>(gen.data(), 1));
  std::vector<double> pp, tg;
  for (int rep = 0; rep < reps; ++rep) {
    r.clear_slot(0);
    auto t0 = Clock::now();
    auto res = r.eval(0, prompt);
    if (!res) {
      std::fprintf(stderr, "error: %s\n", res.status().to_string().c_str());
      return 1;
    }
    pp.push_back(n_prompt / std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    for (int32_t i = 0; i < n_gen; ++i) {
      auto d = r.eval(0, std::span<const int32_t>(&gen[static_cast<size_t>(i)], 1));
      if (!d) {
        std::fprintf(stderr, "error: %s\n", d.status().to_string().c_str());
        return 1;
      }
    }
    if (n_gen > 0) tg.push_back(n_gen / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double pp_med = median(pp), tg_med = median(tg);
  const double gb = static_cast<double>(model->weight_bytes()) / 1e9;
  const inferd::BackendMemory mem = r.backend().memory();
  if (json) {
    std::printf("{\"model\":\"%s\",\"backend\":\"%s\",\"weights_bytes\":%zu,\"n_prompt\":%d,\"n_gen\":%d,"
                "\"prefill_tps\":%.2f,\"decode_tps\":%.2f,\"decode_weight_gbps\":%.2f,\"load_s\":%.3f,"
                "\"device_weight_bytes\":%zu,\"kv_bytes\":%zu,\"activation_bytes\":%zu}\n",
                model_path.c_str(), name.c_str(), model->weight_bytes(), n_prompt, n_gen, pp_med, tg_med, tg_med * gb,
                load_s, mem.weights, mem.kv, mem.activations);
  } else {
    std::printf("model    %s\n", model->describe().c_str());
    std::printf("backend  %s\n", r.backend().describe().c_str());
    std::printf("load     %.2f s (weights to the device, KV cache, buffers)\n", load_s);
    std::printf("prefill  %6d tokens  %9.2f tok/s\n", n_prompt, pp_med);
    std::printf("decode   %6d tokens  %9.2f tok/s  (%.1f GB/s of weights)\n", n_gen, tg_med, tg_med * gb);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = inferd::cli::default_model_path();
  int32_t n_prompt = 128, n_gen = 64, reps = 3, n_threads = 0, n_ctx = 0;
  bool json = false, paths = false;
  inferd::cli::Parser p("inferd-bench", "Measures prefill and decode tokens/s of the CPU engine.");
  p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
  p.option({"-p", "--n-prompt"}, &n_prompt, "N", "prompt tokens for prefill");
  p.option({"-n", "--n-gen"}, &n_gen, "N", "tokens to decode");
  p.option({"-r", "--repetitions"}, &reps, "N", "repetitions (the median is reported)");
  p.option({"-t", "--threads"}, &n_threads, "N", "threads (0: all CPUs)");
  p.option({"-c", "--ctx-size"}, &n_ctx, "N", "context size (0: prompt + gen)");
  std::string weights = "shm";
  p.option({"--weights"}, &weights, "shm|mmap", inferd::cli::kWeightsHelp);
  p.flag({"--paths"}, &paths, "compare the GEMV and GEMM matmul paths per batch size");
  p.flag({"--json"}, &json, "print one JSON object");
  std::string backend = "cpu";
  p.option({"--backend"}, &backend, "NAME[:N]",
           "the backend (cpu, cuda[:N], opencl[:N]): a GPU backend runs the same protocol through the model graph");
  if (int rc = inferd::cli::parse_or_exit(p, argc, argv); rc >= 0) return rc;
  const auto weights_source = inferd::cli::parse_weights_source(weights);
  if (!weights_source) {
    std::fprintf(stderr, "error: %s\n", weights_source.status().message().c_str());
    return 2;
  }
  if (n_prompt < 1 || n_gen < 0 || reps < 1) {
    std::fprintf(stderr, "error: need --n-prompt >= 1, --n-gen >= 0, --repetitions >= 1\n");
    return 2;
  }

  auto loaded = inferd::cli::open_model(model_path, weights_source.value());
  if (!loaded) {
    std::fprintf(stderr, "error: %s\n", loaded.status().message().c_str());
    return 1;
  }
  const std::shared_ptr<const inferd::Model>& model = loaded->model;
  if (backend != "cpu") return bench_backend(model, backend, n_prompt, n_gen, reps, n_ctx, json, model_path);
  inferd::EngineOptions eo;
  eo.n_threads = n_threads;
  eo.n_ctx = n_ctx > 0 ? n_ctx : n_prompt + n_gen + 1;
  eo.n_ubatch = std::max(512, n_prompt);
  auto engine = inferd::Engine::create(model, eo);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", engine.status().message().c_str());
    return 1;
  }
  inferd::Engine& eng = *engine.value();
  const std::vector<int32_t> prompt = random_tokens(n_prompt, eng.n_vocab(), 42);
  const std::vector<int32_t> gen = random_tokens(std::max(n_gen, 1), eng.n_vocab(), 7);

  // Warm-up: touches the weights once (page cache, TLB) and builds the plans.
  (void)eng.eval(0, std::span<const int32_t>(prompt.data(), std::min<size_t>(prompt.size(), 8)));
  (void)eng.eval(0, std::span<const int32_t>(gen.data(), 1));

  std::vector<double> pp, tg;
  for (int r = 0; r < reps; ++r) {
    eng.clear_slot(0);
    auto t0 = Clock::now();
    auto res = eng.eval(0, prompt);
    if (!res) {
      std::fprintf(stderr, "error: %s\n", res.status().message().c_str());
      return 1;
    }
    pp.push_back(n_prompt / std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    for (int32_t i = 0; i < n_gen; ++i) {
      auto d = eng.eval(0, std::span<const int32_t>(&gen[static_cast<size_t>(i)], 1));
      if (!d) {
        std::fprintf(stderr, "error: %s\n", d.status().message().c_str());
        return 1;
      }
    }
    if (n_gen > 0) tg.push_back(n_gen / std::chrono::duration<double>(Clock::now() - t0).count());
  }

  struct PathRow {
    int m;
    double gemv, gemm;
  };
  std::vector<PathRow> path_rows;
  if (paths) {
    for (int m : {1, 2, 4, 8, 16, 64, 128}) {
      if (m > n_prompt) break;
      PathRow row{m, 0, 0};
      for (inferd::MatmulPath path : {inferd::MatmulPath::kGemv, inferd::MatmulPath::kGemm}) {
        eng.force_matmul_path(&path);
        std::vector<double> rates;
        for (int r = 0; r < reps; ++r) {
          eng.clear_slot(0);
          auto t0 = Clock::now();
          (void)eng.eval(0, std::span<const int32_t>(prompt.data(), static_cast<size_t>(m)));
          rates.push_back(m / std::chrono::duration<double>(Clock::now() - t0).count());
        }
        (path == inferd::MatmulPath::kGemv ? row.gemv : row.gemm) = median(rates);
      }
      eng.force_matmul_path(nullptr);
      path_rows.push_back(row);
    }
  }

  const inferd::EngineStats& st = eng.stats();
  const double pp_med = median(pp), tg_med = median(tg);
  const double gb = static_cast<double>(model->weight_bytes()) / 1e9;
  if (json) {
    std::printf("{\"model\":\"%s\",\"weights_bytes\":%zu,\"threads\":%d,\"isa\":\"%s\",\"n_prompt\":%d,\"n_gen\":%d,"
                "\"matmul_order\":\"%s\",\"prefill_tps\":%.2f,\"decode_tps\":%.2f,\"decode_weight_gbps\":%.2f,\"plan_rebuilds\":%lld,"
                "\"arena_bytes\":%zu,\"kv_bytes\":%zu,\"vm_rss_kib\":%ld,\"rss_anon_kib\":%ld,\"rss_file_kib\":%ld,"
                "\"weights\":\"%s\",\"huge_page_bytes\":%llu",
                model_path.c_str(), model->weight_bytes(), eng.options().n_threads,
                inferd::kernels::isa_name(inferd::kernels::best_isa()), n_prompt, n_gen,
                inferd::kernels::matmul_order_name(inferd::kernels::matmul_order()), pp_med, tg_med, tg_med * gb,
                static_cast<long long>(st.plan_rebuilds), st.arena_bytes, st.kv_bytes, rss_kib("VmRSS"),
                rss_kib("RssAnon"), rss_kib("RssFile"), weights.c_str(),
                static_cast<unsigned long long>(loaded->segment ? loaded->segment->huge_page_bytes() : 0));
    if (paths) {
      std::printf(",\"paths\":[");
      for (size_t i = 0; i < path_rows.size(); ++i) {
        std::printf("%s{\"tokens\":%d,\"gemv_tps\":%.2f,\"gemm_tps\":%.2f}", i ? "," : "", path_rows[i].m,
                    path_rows[i].gemv, path_rows[i].gemm);
      }
      std::printf("]");
    }
    std::printf("}\n");
  } else {
    std::printf("model    %s\n", eng.model().describe().c_str());
    std::printf("threads  %d, isa %s, %s matmul order\n", eng.options().n_threads,
                inferd::kernels::isa_name(inferd::kernels::best_isa()),
                inferd::kernels::matmul_order_name(inferd::kernels::matmul_order()));
    std::printf("prefill  %6d tokens  %9.2f tok/s\n", n_prompt, pp_med);
    std::printf("decode   %6d tokens  %9.2f tok/s  (%.1f GB/s of weights)\n", n_gen, tg_med, tg_med * gb);
    std::printf("plans    %lld rebuilds, arena %.2f MiB (%.2f MiB without sharing), KV cache %.1f MiB\n",
                static_cast<long long>(st.plan_rebuilds), st.arena_bytes / 1048576.0, st.arena_naive_bytes / 1048576.0,
                st.kv_bytes / 1048576.0);
    std::printf("memory   VmRSS %ld KiB (anon %ld, file %ld, shmem %ld); weights in %s\n", rss_kib("VmRSS"),
                rss_kib("RssAnon"), rss_kib("RssFile"), rss_kib("RssShmem"), loaded->describe_weights().c_str());
    for (const PathRow& r : path_rows) {
      std::printf("path     %4d tokens: GEMV %9.2f tok/s  GEMM %9.2f tok/s  -> %s\n", r.m, r.gemv, r.gemm,
                  inferd::choose_matmul_path(r.m) == inferd::MatmulPath::kGemv ? "GEMV used" : "GEMM used");
    }
  }
  return 0;
}
