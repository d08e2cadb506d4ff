// inferd-perplexity: perplexity of a text file, as llama.cpp's llama-perplexity computes it.
//
// The text is tokenized (BOS as the model's metadata says) and split into chunks of --ctx-size tokens,
// each evaluated from an empty KV cache with logits at every position. Two ways to score them:
//   llama (the default: llama-perplexity's figure, comparable with llama.cpp's published ones): whole
//     chunks only (the text needs at least two); each chunk's first token becomes BOS where the model
//     adds one; only the second half of each chunk is scored (positions n/2 .. n-2 predict the next
//     token), so every scored token has at least n/2 tokens of context.
//   all (the protocol of tools/reference/gen_numerics_refs.py): the last chunk may be shorter (a one-token
//     remainder is dropped), tokens as they are, every position but the last of each chunk scored.
// PPL = exp(mean negative log-likelihood), the log-softmax in double as llama.cpp computes it.
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
  std::string method = "llama";
  inferd::cli::Parser p("inferd-perplexity", "Computes the perplexity of a model on a text file.");
  p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
  p.option({"-f", "--file"}, &text_path, "FILE", "text file");
  p.option({"-c", "--ctx-size"}, &n_ctx, "N", "tokens per chunk");
  p.option({"--chunks"}, &max_chunks, "N", "evaluate at most N chunks (0: all)");
  p.option({"--method"}, &method, "llama|all",
           "llama: llama-perplexity's (whole chunks, BOS first, the second half of each scored; default); "
           "all: every position of every chunk scored");
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
  if (method != "llama" && method != "all") {
    std::fprintf(stderr, "error: --method must be llama or all, got '%s'\n", method.c_str());
    return 2;
  }
  const bool llama = method == "llama";
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
  if (llama && n_ids < 2 * static_cast<int64_t>(n_ctx)) {
    std::fprintf(stderr, "error: the text has %zu tokens; llama-perplexity's method needs at least 2 x %d "
                 "(--ctx-size), or use --method all\n", ids.size(), n_ctx);
    return 1;
  }
  int64_t n_chunks = llama ? n_ids / n_ctx : n_ids / n_ctx + (n_ids % n_ctx >= 2 ? 1 : 0);
  if (max_chunks > 0) n_chunks = std::min<int64_t>(n_chunks, max_chunks);
  if (n_chunks == 0) {
    std::fprintf(stderr, "error: the text has %zu tokens; at least 2 are needed\n", ids.size());
    return 1;
  }
  const int32_t bos = session->tokenizer->add_bos() ? session->tokenizer->bos() : -1;
  std::vector<int32_t> chunk_ids;
  double nll = 0.0;
  int64_t scored = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    eng.clear_slot(0);
    const int64_t len = std::min<int64_t>(n_ctx, n_ids - c * n_ctx);
    chunk_ids.assign(ids.begin() + c * n_ctx, ids.begin() + c * n_ctx + len);
    if (llama && bos >= 0) chunk_ids[0] = bos;  // as llama-perplexity: every chunk starts with BOS
    const std::span<const int32_t> chunk(chunk_ids);
    auto logits = eng.eval(0, chunk, /*all_logits=*/true);
    if (!logits) {
      std::fprintf(stderr, "error: %s\n", logits.status().message().c_str());
      return 1;
    }
    for (int64_t i = llama ? len / 2 : 0; i + 1 < len; ++i) {
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
    std::printf("{\"ppl\":%.6f,\"method\":\"%s\",\"tokens\":%zu,\"scored\":%lld,\"chunks\":%lld,\"ctx\":%d,"
                "\"seconds\":%.2f}\n",
                ppl, method.c_str(), ids.size(), static_cast<long long>(scored), static_cast<long long>(n_chunks), n_ctx,
                secs);
  } else {
    std::printf("perplexity %.4f over %lld scored tokens (%lld chunks of %d, method %s) in %.1f s\n", ppl,
                static_cast<long long>(scored), static_cast<long long>(n_chunks), n_ctx, method.c_str(), secs);
  }
  return 0;
}
