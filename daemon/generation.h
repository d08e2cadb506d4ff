// daemon/generation.h — a generation request, and the stream that carries its tokens from the
// supervisor thread (producer) to the RPC thread (consumer).
//
// Slow readers: what a stream holds for its client is bounded. Past kMaxBacklogBytes not taken, the
// stream is backed_up() and the scheduler gives its sequence no further steps (the others go on); the
// client's next take() calls the drain callback, which has the scheduler resume it. The front ends end
// a stream whose client does not accept what is sent within stream-stall-timeout (which cancels it).
//
// Thread safety: GenerationStream is shared by exactly two threads: the supervisor calls push(),
// finish() and reads cancelled(); the RPC thread calls ready(), take() and cancel(). Everything else
// here is plain data.
#pragma once

#include <kj/async.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chat_template.h"
#include "inferd/sampler.h"
#include "inferd/status.h"

namespace inferd::daemon {

struct GenerateParams {
  enum class Input { kPrompt, kMessages, kTokens };
  std::string model;
  Input input = Input::kPrompt;
  std::string prompt;
  std::vector<ChatMessage> messages;
  std::vector<int32_t> tokens;
  SamplingParams sampling;
  uint32_t max_tokens = 256;  // 0: until end of generation or the context is full
  std::vector<std::string> stop;
  bool add_special = true;
  bool parse_special = true;
  bool ignore_eog = false;
  int32_t stream_interval_ms = -1;  // -1: the daemon's stream-interval; else 0..kMaxStreamIntervalMs
  // Each generated token's log-probability and this many most likely alternatives (0..20); -1: none.
  int32_t logprobs = -1;
  // Instead of generating: the prompt's embedding (the last token's hidden state after the output
  // norm, L2-normalized), in GenerateSummary::embedding.
  bool embedding = false;
  // Reuse the KV of the longest cached prefix of the prompt (and let later requests reuse this one's).
  bool cache_prompt = true;
  // ollama's keep_alive for a model loaded by name (seconds; 0: never unload); -1: unchanged.
  double keep_alive_s = -1;
  // Who asks, for fairness between clients: "uid N" (a unix socket's peer, the RPC and the HTTP API
  // alike), a TCP peer's address; "" when unknown (such requests share one client).
  std::string client;
};

// A token and its log-probability (log-softmax of the model's logits, before penalties and temperature).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::string piece;  // its bytes, as the tokenizer decodes it alone (may be part of a UTF-8 character)
};
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first
};

enum class FinishReason { kEndOfGeneration, kMaxTokens, kStop, kContextFull };

struct GenerateSummary {
  FinishReason reason = FinishReason::kEndOfGeneration;
  uint32_t prompt_tokens = 0;
  uint32_t generated_tokens = 0;
  uint64_t seed = 0;
  double queue_ms = 0, time_to_first_token_ms = 0, prompt_ms = 0, generate_ms = 0;
  uint32_t replays = 0;
  uint32_t cached_tokens = 0;    // prompt tokens whose KV came from the prefix cache (not prefilled)
  std::vector<float> embedding;  // GenerateParams::embedding: unit length
};

class GenerationStream {
 public:
  static constexpr size_t kMaxBacklogBytes = 256 << 10;

  struct Batch {
    std::vector<int32_t> tokens;
    std::string text;
    std::vector<TokenLogprobs> logprobs;  // one per token, when the request asked for them
    std::optional<Result<GenerateSummary>> end;  // set once, with the last batch
  };

  // Supervisor thread.
  void push(std::span<const int32_t> tokens, std::string_view text, TokenLogprobs* logprobs = nullptr) {
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.tokens.insert(pending_.tokens.end(), tokens.begin(), tokens.end());
      pending_.text += text;
      backlog_ += tokens.size() * sizeof(int32_t) + text.size();
      if (logprobs != nullptr) {
        backlog_ += sizeof(TokenLogprobs) + logprobs->chosen.piece.size();
        for (const TokenLogprob& t : logprobs->top) backlog_ += sizeof(TokenLogprob) + t.piece.size();
        pending_.logprobs.push_back(std::move(*logprobs));
      }
      if (!waiter_end_only_) waiter = kj::mv(waiter_);
    }
    if (waiter.get() != nullptr) waiter->fulfill();
  }
  void finish(Result<GenerateSummary> end) {
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.end) return;
      pending_.end = std::move(end);
      waiter = kj::mv(waiter_);
    }
    if (waiter.get() != nullptr) waiter->fulfill();
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // RPC thread. ready() resolves when take() has tokens, text or the end; ready(true) only when it has
  // the end (tokens alone do not wake the RPC thread then). One of them is awaited at a time.
  kj::Promise<void> ready(bool end_only = false) {
    std::lock_guard<std::mutex> lock(mu_);
    if (end_only ? pending_.end.has_value() : has_data()) return kj::READY_NOW;
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    waiter_ = kj::mv(paf.fulfiller);
    waiter_end_only_ = end_only;
    return kj::mv(paf.promise);
  }
  Batch take() {
    std::function<void()> drained;
    Batch out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out = std::move(pending_);
      pending_ = Batch{};
      if (backlog_ > kMaxBacklogBytes) drained = on_drain_;
      backlog_ = 0;
    }
    if (drained) drained();
    return out;
  }

  // Supervisor thread: whether the client has left more than kMaxBacklogBytes untaken, and what to do
  // (on the consumer's thread) when it takes them.
  bool backed_up() const {
    std::lock_guard<std::mutex> lock(mu_);
    return backlog_ > kMaxBacklogBytes;
  }
  void set_on_drain(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    on_drain_ = std::move(f);
  }
  void cancel() { cancelled_.store(true, std::memory_order_release); }

 private:
  bool has_data() const { return !pending_.tokens.empty() || !pending_.text.empty() || pending_.end.has_value(); }

  mutable std::mutex mu_;
  Batch pending_;
  size_t backlog_ = 0;  // bytes of pending_ (about)
  std::function<void()> on_drain_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter_;
  bool waiter_end_only_ = false;
  std::atomic<bool> cancelled_{false};
};

}  // namespace inferd::daemon
