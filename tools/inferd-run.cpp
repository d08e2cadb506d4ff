// inferd-run: prompt -> streamed text, in-process (no daemon), like llama.cpp's llama-cli -p.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/session.h"
#include "chat_template.h"
#include "inferd/engine.h"
#include "inferd/sampler.h"
#include "inferd/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The model's own chat template (Jinja), or its architecture's built-in format when the file stores none:
// what the daemon does for a request's messages.
inferd::Result<std::string> chat_prompt(const inferd::gguf::GgufFile& file, const inferd::Tokenizer& tk,
                                        const std::string& arch, const std::string& system, const std::string& user) {
  using inferd::daemon::ChatFormatter;
  std::string tmpl;
  if (file.has_key("tokenizer.chat_template")) {
    auto t = file.get_string("tokenizer.chat_template");
    if (t) tmpl = std::string(t.value());
  }
  auto text = [&](int32_t id) { return id >= 0 ? std::string(tk.token_text(id)) : std::string(); };
  const ChatFormatter f = tmpl.empty() ? ChatFormatter::builtin(inferd::daemon::detect_chat_template({}, arch))
                                       : ChatFormatter::jinja(tmpl, text(tk.bos()), text(tk.eos()));
  std::vector<inferd::daemon::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", user});
  auto out = f.apply(messages);
  if (!out) return out;
  if (tk.add_bos()) inferd::daemon::drop_leading_bos(*out, text(tk.bos()));  // one BOS, as the daemon gives
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = inferd::cli::default_model_path(), prompt, system;
  int32_t n_predict = 128, n_threads = 0, n_ctx = 2048;
  bool chat = false, quiet = false, no_special = false;
  inferd::SamplingParams sp;
  sp.seed = inferd::SamplingParams::kSeedFromClock;
  inferd::cli::Parser p("inferd-run", "Generates text from a prompt with a GGUF model, streaming it to stdout.");
  p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
  p.option({"-p", "--prompt"}, &prompt, "TEXT", "prompt");
  p.flag({"--chat"}, &chat, "wrap the prompt in the model's chat template (the file's Jinja template)");
  p.option({"--system"}, &system, "TEXT", "system message for --chat");
  p.option({"-n", "--n-predict"}, &n_predict, "N", "tokens to generate");
  p.option({"-t", "--threads"}, &n_threads, "N", "threads (0: all CPUs)");
  p.option({"-c", "--ctx-size"}, &n_ctx, "N", "context size");
  std::string weights = "shm";
  p.option({"--weights"}, &weights, "shm|mmap", inferd::cli::kWeightsHelp);
  p.option({"--temp"}, &sp.temperature, "T", "temperature (0: greedy)");
  p.option({"--top-k"}, &sp.top_k, "K", "top-k (0: off)");
  p.option({"--top-p"}, &sp.top_p, "P", "top-p (1: off)");
  p.option({"--min-p"}, &sp.min_p, "P", "min-p (0: off)");
  p.option({"--repeat-penalty"}, &sp.repeat_penalty, "R", "repetition penalty (1: off)");
  p.option({"--repeat-last-n"}, &sp.repeat_last_n, "N", "penalty window (-1: all)");
  p.option({"--frequency-penalty"}, &sp.frequency_penalty, "F", "frequency penalty");
  p.option({"--presence-penalty"}, &sp.presence_penalty, "F", "presence penalty");
  p.option({"-s", "--seed"}, &sp.seed, "N", "random seed (default: from the clock)");
  p.flag({"--no-special"}, &no_special, "do not parse special-token texts in the prompt");
  p.flag({"-q", "--quiet"}, &quiet, "no timings on stderr");
  if (int rc = inferd::cli::parse_or_exit(p, argc, argv); rc >= 0) return rc;
  const auto weights_source = inferd::cli::parse_weights_source(weights);
  if (!weights_source) {
    std::fprintf(stderr, "error: %s\n", weights_source.status().message().c_str());
    return 2;
  }

  if (inferd::Status s = inferd::validate(sp); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  if (n_predict < 0) {
    std::fprintf(stderr, "error: --n-predict must be >= 0\n");
    return 2;
  }
  inferd::EngineOptions eo;
  eo.n_ctx = n_ctx;
  eo.n_threads = n_threads;
  auto session = inferd::cli::open_session(model_path, weights_source.value(), eo, /*with_tokenizer=*/true);
  if (!session) {
    std::fprintf(stderr, "error: %s\n", session.status().message().c_str());
    return 1;
  }
  if (chat) {
    auto formatted = chat_prompt(session->loaded.model->file(), *session->tokenizer,
                                 session->loaded.model->config().arch, system, prompt);
    if (!formatted) {
      std::fprintf(stderr, "error: %s\n", formatted.status().message().c_str());
      return 2;
    }
    prompt = formatted.value();
  }
  inferd::Engine& eng = *session->engine;
  const inferd::Tokenizer& tk = *session->tokenizer;

  std::vector<int32_t> ids = tk.encode(prompt, /*add_special=*/true, /*parse_special=*/!no_special);
  if (ids.empty()) {
    std::fprintf(stderr, "error: the prompt is empty\n");
    return 2;
  }
  if (static_cast<int64_t>(ids.size()) + n_predict > eng.options().n_ctx) {
    std::fprintf(stderr, "error: prompt (%zu tokens) + %d to generate exceed the context size %d (use -c)\n",
                 ids.size(), n_predict, eng.options().n_ctx);
    return 2;
  }
  inferd::Sampler sampler(sp, eng.n_vocab());
  for (int32_t id : ids) sampler.accept(id);
  if (!chat) std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);

  const auto t0 = Clock::now();
  auto logits = eng.eval(0, ids);
  if (!logits) {
    std::fprintf(stderr, "\nerror: %s\n", logits.status().message().c_str());
    return 1;
  }
  const double t_prompt = seconds_since(t0);
  inferd::Utf8Stream stream;
  int n_gen = 0;
  const auto t1 = Clock::now();
  while (n_gen < n_predict) {
    const int32_t next = sampler.sample(logits.value());
    sampler.accept(next);
    ++n_gen;
    if (tk.is_eog(next)) break;
    std::string text = stream.push(tk.token_to_piece(next));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (n_gen == n_predict) break;
    logits = eng.eval(0, std::span<const int32_t>(&next, 1));
    if (!logits) {
      std::fprintf(stderr, "\nerror: %s\n", logits.status().message().c_str());
      return 1;
    }
  }
  std::string rest = stream.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  const double t_gen = seconds_since(t1);
  if (!quiet) {
    std::fprintf(stderr, "\ninferd-run: %s\n", eng.model().describe().c_str());
    std::fprintf(stderr, "inferd-run: prompt %zu tokens in %.1f ms (%.1f tok/s); generated %d tokens in %.1f ms "
                 "(%.1f tok/s); threads %d; seed %llu\n",
                 ids.size(), t_prompt * 1e3, static_cast<double>(ids.size()) / t_prompt, n_gen, t_gen * 1e3,
                 n_gen / t_gen, eng.options().n_threads, static_cast<unsigned long long>(sampler.seed()));
  }
  return 0;
}
