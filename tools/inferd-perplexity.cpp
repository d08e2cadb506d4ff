// inferd-perplexity: perplexity of a text file, like llama.cpp's llama-perplexity.
//
// Protocol (the same as tools/reference/gen_numerics_refs.py, so figures compare with llama.cpp's):
// the text is tokenized (BOS as the model's metadata says) and split into chunks of --ctx-size tokens
// (the last one may be shorter; a one-token remainder is dropped); each chunk is evaluated from an
// empty KV cache with logits at every position; every position but the last of each chunk scores the
// next token. PPL = exp(mean negative log-likelihood).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/session.h"
#include "inferd/engine.h"
#include "inferd/tokenizer.h"

int main(int argc, char** argv) {
  std::string model_path = inferd::cli::default_model_path(), text_path;
  int32_t n_ctx = 512, n_threads = 0, max_chunks = 0;
  bool json = false;
  inferd::cli::Parser p("inferd-perplexity", "Computes the perplexity of a model on a text file.");
  p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
  p.option({"-f", "--file"}, &text_path, "FILE", "text file");
  p.option({"-c", "--ctx-size"}, &n_ctx, "N", "tokens per chunk");
  p.option({"--chunks"}, &max_chunks, "N", "evaluate at most N chunks (0: all)");
  p.option({"-t", "--threads"}, &n_threads, "N", "threads (0: all CPUs)");
  std::string weights = "shm";
  p.option({"--weights"}, &weights, "shm|mmap", inferd::cli::kWeightsHelp);
  p.flag({"--json"}, &json, "print one JSON object");
  if (int rc = inferd::cli::parse_or_exit(p, argc, argv); rc >= 0) return rc;
  const auto weights_source = inferd::cli::parse_weights_source(weights);
  if (!weights_source) {
    std::fprintf(stderr, "error: %s\n", weights_source.status().message().c_str());
    return 2;
  }
  if (text_path.empty()) {
    std::fprintf(stderr, "error: -f FILE is required\n");
    return 2;
  }
  if (n_ctx < 2) {
    std::fprintf(stderr, "error: --ctx-size must be >= 2\n");
    return 2;
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "error: cannot read %s\n", text_path.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  inferd::EngineOptions eo;
  eo.n_ctx = n_ctx;
  eo.n_threads = n_threads;
  eo.n_ubatch = n_ctx;
  auto session = inferd::cli::open_session(model_path, weights_source.value(), eo, /*with_tokenizer=*/true);
  if (!session) {
    std::fprintf(stderr, "error: %s\n", session.status().message().c_str());
    return 1;
  }
  inferd::Engine& eng = *session->engine;
  const std::vector<int32_t> ids = session->tokenizer->encode(text, /*add_special=*/true, /*parse_special=*/false);
  const size_t nv = static_cast<size_t>(eng.n_vocab());
  const int64_t n_ids = static_cast<int64_t>(ids.size());
  int64_t n_chunks = n_ids / n_ctx + (n_ids % n_ctx >= 2 ? 1 : 0);
  if (max_chunks > 0) n_chunks = std::min<int64_t>(n_chunks, max_chunks);
  if (n_chunks == 0) {
    std::fprintf(stderr, "error: the text has %zu tokens; at least 2 are needed\n", ids.size());
    return 1;
  }
  double nll = 0.0;
  int64_t scored = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    eng.clear_slot(0);
    const int64_t len = std::min<int64_t>(n_ctx, n_ids - c * n_ctx);
    std::span<const int32_t> chunk(ids.data() + c * n_ctx, static_cast<size_t>(len));
    auto logits = eng.eval(0, chunk, /*all_logits=*/true);
    if (!logits) {
      std::fprintf(stderr, "error: %s\n", logits.status().message().c_str());
      return 1;
    }
    for (int64_t i = 0; i + 1 < len; ++i) {
      const float* row = logits->data() + static_cast<size_t>(i) * nv;
      float mx = row[0];
      for (size_t v = 1; v < nv; ++v) mx = std::max(mx, row[v]);
      double sum = 0.0;
      for (size_t v = 0; v < nv; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
      const double logp = static_cast<double>(row[chunk[static_cast<size_t>(i) + 1]] - mx) - std::log(sum);
      nll -= logp;
      ++scored;
    }
    if (!json) {
      std::fprintf(stderr, "[%lld/%lld] running ppl %.4f\n", static_cast<long long>(c + 1),
                   static_cast<long long>(n_chunks), std::exp(nll / static_cast<double>(scored)));
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ppl = std::exp(nll / static_cast<double>(scored));
  if (json) {
    std::printf("{\"ppl\":%.6f,\"tokens\":%zu,\"scored\":%lld,\"chunks\":%lld,\"ctx\":%d,\"seconds\":%.2f}\n", ppl,
                ids.size(), static_cast<long long>(scored), static_cast<long long>(n_chunks), n_ctx, secs);
  } else {
    std::printf("perplexity %.4f over %lld scored tokens (%lld chunks of %d) in %.1f s\n", ppl,
                static_cast<long long>(scored), static_cast<long long>(n_chunks), n_ctx, secs);
  }
  return 0;
}
