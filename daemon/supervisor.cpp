#include "supervisor.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "chat_template.h"
#include "inferd/ipc/backend_name.h"
#include "inferd/ipc/hidden_exchange.h"
#include "inferd/ipc/ring.h"
#include "inferd/ipc/weights_segment.h"
#include "inferd/model.h"
#include "inferd/tokenizer.h"
#include "text_output.h"
#include "worker_process.h"

namespace inferd::daemon {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

constexpr uint32_t kMaxReplays = 3;        // a request survives this many worker deaths
constexpr uint32_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr auto kShutdownGrace = std::chrono::seconds(5);
// A step that takes longer than this means the worker hangs (a GPU fault, a deadlock): it is killed and
// its requests replayed. Far above any real step (512 tokens of an 8B model on 2 cores take ~1 min).
constexpr auto kStepTimeout = std::chrono::minutes(10);

// RssAnon and RssShmem of a process, from /proc.
std::pair<uint64_t, uint64_t> process_memory(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  uint64_t anon = 0, shmem = 0;
  while (in >> key) {
    uint64_t kb = 0;
    if (key == "RssAnon:" && in >> kb) anon = kb * 1024;
    else if (key == "RssShmem:" && in >> kb) shmem = kb * 1024;
    in.ignore(1 << 20, '\n');
  }
  return {anon, shmem};
}

std::string basename_id(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0) base.resize(base.size() - 5);
  return base;
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == ':';
  });
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// ModelHost: one loaded model — its weights, tokenizer, scheduler and worker.
//
// Scheduling (continuous batching): a step holds one token for every sequence that is decoding, then
// prompt chunks of the sequences still prefilling, up to batch_tokens; queued requests are admitted
// into free slots between steps. A single worker is kept `steps-in-flight` steps ahead (default 2):
// the step after a decode step is queued before that step's token is known, naming its input
// ipc::kTokenSampled, so the worker never waits for the supervisor between tokens. Such a step is
// only queued for a sequence that will go on unless the pending token ends it (end of generation, a
// stop string); if it does, what the step computed for it is dropped. Pipeline stages run one step at
// a time. After a worker dies,
// every sequence it held is replayed on the restarted worker from position 0 (prompt + the tokens
// already streamed), with its sampler resumed at the same draw, so the client's stream goes on with
// neither duplicated nor missing tokens. A request replayed more than kMaxReplays times fails.

struct Sequence {
  uint64_t id = 0;
  std::shared_ptr<GenerationStream> stream;
  std::vector<int32_t> history;  // prompt, then generated tokens
  uint32_t n_prompt = 0;
  SamplingParams sampling;
  uint32_t max_tokens = 0;
  bool ignore_eog = false;
  TextOutput text;
  int32_t slot = -1;
  size_t fed = 0;        // tokens of history in the worker's KV cache
  size_t in_flight = 0;  // positions after `fed` in steps not completed yet (the last ones may be
                         // tokens still being sampled)
  uint32_t pending = 0;  // tokens asked of in-flight steps and not received yet
  uint32_t replays = 0;
  Clock::time_point t_arrival, t_admitted, t_first, t_last;
  bool has_first = false;

  uint32_t n_generated() const { return static_cast<uint32_t>(history.size()) - n_prompt; }
  size_t sent() const { return fed + in_flight; }
};

class ModelHost {
 public:
  // One pipeline stage: a worker process running layers [first_layer, end_layer).
  struct Stage {
    uint32_t index = 0, first_layer = 0, end_layer = 0;
    std::string backend;  // "cpu", "opencl:1", ...: LoadSpec::stage_backends[index], else LoadSpec::backend
    std::shared_ptr<WorkerProcess> worker;
    WorkerReady ready_info;
    std::deque<uint64_t> in_flight;  // ids of the steps this worker was given and has not answered
    bool ever_ready = false;
    std::optional<Clock::time_point> crashed_at;
    std::deque<Clock::time_point> crashes;
    Clock::time_point started;
    uint32_t restarts = 0;
    double last_restart_ms = 0;
    uint64_t steps = 0, tokens = 0;
  };

  ModelHost(Supervisor& sup, LoadSpec spec, uint64_t serial) : sup_(sup), spec_(std::move(spec)), serial_(serial) {}
  ~ModelHost() {
    if (loader_.joinable()) loader_.join();
  }

  const LoadSpec& spec() const { return spec_; }
  uint64_t serial() const { return serial_; }  // unique per load, so a late result finds its own host
  ModelState state() const { return state_; }
  std::thread& loader() { return loader_; }

  // Lays the model out on its pipeline stages; kInvalidArgument for a bad layer split.
  Status attach(std::shared_ptr<const ipc::WeightsSegment> weights, std::shared_ptr<const Model> model,
                std::unique_ptr<Tokenizer> tokenizer, double load_ms) {
    weights_ = std::move(weights);
    weights_huge_page_bytes_ = weights_->huge_page_bytes();
    model_ = std::move(model);
    tokenizer_ = std::move(tokenizer);
    const ModelConfig& c = model_->config();
    n_ctx_ = spec_.context_size ? spec_.context_size : static_cast<uint32_t>(default_context(c));
    auto tmpl = weights_->gguf()->get_string("tokenizer.chat_template");
    chat_template_ = detect_chat_template(tmpl ? tmpl.value() : std::string_view());
    load_ms_ = load_ms;
    slots_.assign(spec_.parallel, 0);
    std::vector<uint32_t> bounds = {0};
    for (uint32_t b : spec_.layer_split) {
      if (b <= bounds.back() || b >= static_cast<uint32_t>(c.n_layer)) {
        return Status(Code::kInvalidArgument, "layer split must be increasing first layers inside (0, " +
                                                  std::to_string(c.n_layer) + "), got " + std::to_string(b));
      }
      bounds.push_back(b);
    }
    bounds.push_back(static_cast<uint32_t>(c.n_layer));
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      Stage st;
      st.index = static_cast<uint32_t>(i);
      st.first_layer = bounds[i];
      st.end_layer = bounds[i + 1];
      st.backend = spec_.stage_backends.empty() ? spec_.backend : spec_.stage_backends[i];
      stages_.push_back(std::move(st));
      if (i + 2 < bounds.size()) {
        auto x = ipc::HiddenExchange::create(static_cast<uint32_t>(c.n_embd), spec_.batch_tokens);
        if (!x) return x.status();
        exchanges_.push_back(std::move(x).value());
      }
    }
    submission_ = std::make_unique<ipc::Submission>();
    return Status::ok();
  }

  // Starts the workers; `ready` is called once, with OK when all are ready or the reason they are not.
  void start(std::function<void(Status)> ready) {
    first_ready_ = std::move(ready);
    for (Stage& st : stages_) spawn_worker(st);
  }

  // ---- requests -------------------------------------------------------------------------------

  Status enqueue(GenerateParams p, std::shared_ptr<GenerationStream> stream) {
    if (state_ == ModelState::kLoading) return Status(Code::kFailed, "model " + spec_.id + " is still loading");
    if (state_ == ModelState::kFailed) {
      return Status(Code::kFailed, "model " + spec_.id + " failed (" + failure_ + "); unload it and load it again");
    }
    INFERD_RETURN_IF_ERROR(validate(p.sampling));
    if (p.stop.size() > kMaxStopStrings) {
      return Status(Code::kInvalidArgument, "at most " + std::to_string(kMaxStopStrings) + " stop strings");
    }
    for (const auto& s : p.stop) {
      if (s.size() > kMaxStopBytes) {
        return Status(Code::kInvalidArgument, "a stop string is longer than " + std::to_string(kMaxStopBytes) + " bytes");
      }
    }
    std::vector<int32_t> prompt;
    switch (p.input) {
      case GenerateParams::Input::kPrompt:
        prompt = tokenizer_->encode(p.prompt, p.add_special, p.parse_special);
        break;
      case GenerateParams::Input::kMessages: {
        auto text = apply_chat_template(chat_template_, p.messages);
        if (!text) return text.status();
        prompt = tokenizer_->encode(text.value(), p.add_special, true);
        break;
      }
      case GenerateParams::Input::kTokens:
        for (size_t i = 0; i < p.tokens.size(); ++i) {
          if (p.tokens[i] < 0 || p.tokens[i] >= tokenizer_->n_vocab()) {
            return Status(Code::kInvalidArgument, "token " + std::to_string(i) + " is " + std::to_string(p.tokens[i]) +
                                                      ", outside the vocabulary [0, " +
                                                      std::to_string(tokenizer_->n_vocab()) + ")");
          }
        }
        prompt = std::move(p.tokens);
        break;
    }
    if (prompt.empty()) return Status(Code::kInvalidArgument, "the prompt is empty");
    if (prompt.size() >= n_ctx_) {
      return Status(Code::kOutOfRange, "the prompt is " + std::to_string(prompt.size()) + " tokens but model " +
                                           spec_.id + "'s context holds " + std::to_string(n_ctx_) +
                                           " (the prompt must leave room for at least one generated token)");
    }
    if (queue_.size() >= spec_.max_queue) {
      return Status(Code::kOverloaded, "model " + spec_.id + " has " + std::to_string(queue_.size()) +
                                           " requests waiting (max-queue); retry later");
    }
    auto seq = std::make_unique<Sequence>();
    seq->id = ++next_seq_id_;
    seq->stream = std::move(stream);
    seq->n_prompt = static_cast<uint32_t>(prompt.size());
    seq->history = std::move(prompt);
    seq->sampling = p.sampling;
    if (seq->sampling.seed == SamplingParams::kSeedFromClock) {
      seq->sampling.seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
      if (seq->sampling.seed == SamplingParams::kSeedFromClock) seq->sampling.seed = 0;
    }
    seq->max_tokens = p.max_tokens;
    seq->ignore_eog = p.ignore_eog;
    seq->text = TextOutput(std::move(p.stop));
    seq->t_arrival = Clock::now();
    queue_.push_back(std::move(seq));
    schedule();
    return Status::ok();
  }

  // Queues steps until every worker has its share in flight (see "Scheduling" above).
  void schedule() {
    while (schedule_one()) {
    }
    arm_hang_detector();
  }

  // Steps a worker holds at once: one per pipeline stage, else the configured number.
  size_t depth() const { return stages_.size() == 1 ? sup_.config().steps_in_flight : 1; }

  // Whether a sequence goes on after its pending tokens, unless one of them ends it by its value.
  bool continues_after_pending(const Sequence& s) const {
    return (s.max_tokens == 0 || s.n_generated() + s.pending < s.max_tokens) && s.history.size() + s.pending < n_ctx_;
  }

  // Builds and submits one step; false when none can start now.
  bool schedule_one() {
    if (state_ == ModelState::kFailed || shutting_down_ || steps_.size() >= depth()) return false;
    for (const Stage& st : stages_) {
      if (!st.worker || !st.worker->ready() || st.in_flight.size() >= depth()) return false;
    }
    const auto now = Clock::now();
    // Cancelled sequences leave at a step boundary; their slots are free for this very step (a step
    // still in flight may write into such a slot: a sequence admitted now starts it afresh after).
    for (auto it = active_.begin(); it != active_.end();) {
      if (it->second->stream->cancelled()) {
        Sequence& s = *it->second;
        spdlog::info("request {} on {}: cancelled by the client after {} tokens", s.id, spec_.id, s.n_generated());
        slots_[static_cast<size_t>(s.slot)] = 0;
        ++requests_done_;
        it = active_.erase(it);
      } else {
        ++it;
      }
    }
    std::erase_if(queue_, [](const auto& s) { return s->stream->cancelled(); });
    for (size_t slot = 0; slot < slots_.size() && !queue_.empty(); ++slot) {
      if (slots_[slot] != 0) continue;
      auto seq = std::move(queue_.front());
      queue_.pop_front();
      seq->slot = static_cast<int32_t>(slot);
      seq->t_admitted = now;
      slots_[slot] = seq->id;
      active_.emplace(seq->id, std::move(seq));
    }
    if (active_.empty()) return false;

    ipc::Submission* sub = submission_.get();
    Step step;
    step.id = next_step_id_ + 1;
    sub->id = step.id;
    sub->n_seqs = 0;
    sub->n_tokens = 0;
    uint32_t budget = spec_.batch_tokens;
    // Positions of a sequence not sent to the worker yet; the last `pending` are being sampled.
    auto unsent = [](const Sequence& s) { return s.history.size() + s.pending - s.sent(); };
    auto add = [&](Sequence& s) {
      if (budget == 0) return;
      const size_t sent = s.sent();
      uint32_t chunk = 0;
      bool want = false, sampled = false;
      if (sent < s.history.size()) {  // known tokens: a prompt chunk, or a decode step
        INFERD_ASSERT(s.pending == 0);
        chunk = static_cast<uint32_t>(std::min<size_t>(s.history.size() - sent, budget));
        want = sent + chunk == s.history.size();
      } else {  // the token the worker is sampling for it now: queue the step after, ahead
        INFERD_ASSERT(s.pending > 0 && sent + 1 == s.history.size() + s.pending);
        if (!continues_after_pending(s)) return;
        chunk = 1;
        want = sampled = true;
      }
      if (chunk == 0) return;
      ipc::StepSeq& e = sub->seqs[sub->n_seqs];
      e = {};
      e.slot = static_cast<uint32_t>(s.slot);
      e.flags = want ? ipc::kSeqWantToken : 0;
      e.n_sampled = s.n_generated() + s.pending;
      e.seed = s.sampling.seed;
      e.temperature = s.sampling.temperature;
      e.top_p = s.sampling.top_p;
      e.min_p = s.sampling.min_p;
      e.repeat_penalty = s.sampling.repeat_penalty;
      e.frequency_penalty = s.sampling.frequency_penalty;
      e.presence_penalty = s.sampling.presence_penalty;
      e.top_k = s.sampling.top_k;
      e.repeat_last_n = s.sampling.repeat_last_n;
      for (uint32_t i = 0; i < chunk; ++i) {
        ipc::StepToken& t = sub->tokens[sub->n_tokens++];
        t.token = sampled ? ipc::kTokenSampled : s.history[sent + i];
        t.pos = static_cast<int32_t>(sent + i);
        t.seq = sub->n_seqs;
      }
      step.entries.push_back({s.id, chunk, want});
      s.in_flight += chunk;
      if (want) ++s.pending;
      ++sub->n_seqs;
      budget -= chunk;
    };
    // Decoding sequences first (one token each), then prompt chunks in admission order.
    for (auto& [id, s] : active_) {
      if (unsent(*s) == 1) add(*s);
    }
    for (auto& [id, s] : active_) {
      if (budget == 0) break;
      if (unsent(*s) > 1) add(*s);
    }
    if (sub->n_tokens == 0) return false;
    next_step_id_ = step.id;
    step.n_tokens = sub->n_tokens;
    step.submitted = now;
    steps_.push_back(std::move(step));
    submit_to(stages_.front());
    return true;
  }

  // Copies the current step into a stage's ring and wakes its worker; arms the hang detector.
  void submit_to(Stage& st) {
    const ipc::Submission& src = *submission_;
    ipc::Submission* dst = st.worker->ring().submission_slot();
    INFERD_ASSERT(dst != nullptr);  // at most depth() steps in flight, depth() <= the ring's capacity
    dst->id = src.id;
    dst->n_seqs = src.n_seqs;
    dst->n_tokens = src.n_tokens;
    std::memcpy(dst->seqs, src.seqs, sizeof(ipc::StepSeq) * src.n_seqs);
    std::memcpy(dst->tokens, src.tokens, sizeof(ipc::StepToken) * src.n_tokens);
    st.in_flight.push_back(src.id);
    st.worker->ring().publish_submission();
    st.worker->notify_submission();
  }

  // The hang detector: the worker running the oldest step in flight must finish it within kStepTimeout
  // of when it became that worker's oldest (so a queued step's time starts when the step before it
  // ends, and a pipeline stage's when it gets the step). Armed once per step and stage, when that
  // changes (schedule() runs after every submission and completion).
  void arm_hang_detector() {
    auto st = std::find_if(stages_.begin(), stages_.end(),
                           [](const Stage& s) { return s.worker && !s.in_flight.empty(); });
    if (st == stages_.end()) return;
    const std::pair<uint32_t, uint64_t> oldest{st->index, st->in_flight.front()};
    if (oldest == timed_) return;
    timed_ = oldest;
    if (!step_timer_) step_timer_ = std::make_unique<asio::steady_timer>(sup_.io());
    step_timer_->expires_after(kStepTimeout);
    std::weak_ptr<WorkerProcess> weak = st->worker;
    const uint64_t step_id = oldest.second;
    step_timer_->async_wait([this, weak, step_id](std::error_code ec) {
      auto w = weak.lock();
      if (ec || !w || steps_.empty() || steps_.front().id > step_id) return;  // it has moved on since
      spdlog::error("model {}: worker {} has not finished step {} in {} s; killing it", spec_.id, w->pid(), step_id,
                    std::chrono::duration_cast<std::chrono::seconds>(kStepTimeout).count());
      w->kill();
    });
  }

  void on_completion(Stage& st) {
    if (!st.worker) return;
    const ipc::RingSegment& ring = st.worker->ring();
    while (const ipc::Completion* c = ring.next_completion()) {
      if (st.in_flight.empty() || c->id != st.in_flight.front()) {
        spdlog::error("model {}: worker {} answered step {} (it was given {}); killing it", spec_.id, st.worker->pid(),
                      c->id, st.in_flight.empty() ? 0 : st.in_flight.front());
        st.worker->kill();  // a worker that answers steps it was not given is broken
        return;
      }
      st.in_flight.pop_front();
      ++st.steps;
      step_compute_ns_ += c->compute_ns;
      if (steps_.empty() || steps_.front().id != c->id) {  // the step was abandoned when another stage died
        ring.release_completion();
        continue;
      }
      st.tokens += steps_.front().n_tokens;
      if (c->status != 0) {
        std::string why(c->error, strnlen(c->error, sizeof(c->error)));
        ring.release_completion();
        Step step = std::move(steps_.front());
        steps_.pop_front();
        spdlog::error("model {}: step {} failed on worker {}: {}", spec_.id, step.id, st.index, why);
        for (const auto& e : step.entries) fail_sequence(e.seq, Status(Code::kFailed, "the worker failed: " + why));
        if (!steps_.empty()) {
          // The steps queued after it continue from its positions and sampled tokens, so the worker
          // will refuse or miscompute them: their answers are dropped and every other sequence starts
          // again from position 0 (its tokens so far are kept; nothing is streamed twice).
          steps_.clear();
          restart_sequences();
        }
        continue;
      }
      if (st.index + 1 < stages_.size()) {  // hand the step to the next pipeline stage
        bool bad = c->n_outputs != 0;
        ring.release_completion();
        if (bad) {
          spdlog::error("model {}: pipeline stage {} sampled tokens; killing it", spec_.id, st.index);
          st.worker->kill();
          return;
        }
        submit_to(stages_[st.index + 1]);
        continue;
      }
      Step step = std::move(steps_.front());
      steps_.pop_front();
      std::vector<int32_t> tokens(step.entries.size(), -1);
      bool bad = c->n_outputs > step.entries.size();
      for (uint32_t i = 0; !bad && i < c->n_outputs; ++i) {
        const ipc::StepOutput& o = c->outputs[i];
        if (o.seq >= step.entries.size() || !step.entries[o.seq].want || o.token < 0 ||
            o.token >= tokenizer_->n_vocab()) {
          bad = true;
        } else {
          tokens[o.seq] = o.token;
        }
      }
      for (size_t i = 0; !bad && i < step.entries.size(); ++i) bad = step.entries[i].want && tokens[i] < 0;
      ring.release_completion();
      if (bad) {
        spdlog::error("model {}: worker sent a malformed completion; killing it", spec_.id);
        st.worker->kill();
        return;
      }
      const auto now = Clock::now();
      // The worker's time on this step: from when it could start it (submitted, or the step before done).
      const auto began = std::max(step.submitted, last_completion_);
      last_completion_ = now;
      step_wall_ns_ += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - began).count());
      ++timed_steps_;
      uint32_t decoded = 0;
      for (size_t i = 0; i < step.entries.size(); ++i) {
        auto it = active_.find(step.entries[i].seq);
        if (it == active_.end()) continue;  // cancelled or failed meanwhile
        Sequence& s = *it->second;
        s.fed += step.entries[i].chunk;
        s.in_flight -= step.entries[i].chunk;
        if (step.entries[i].want) {
          --s.pending;
          ++decoded;
          accept_token(s, tokens[i], now);
        }
      }
      rate_.push_back({now, decoded});
      while (!rate_.empty() && now - rate_.front().first > std::chrono::seconds(5)) rate_.pop_front();
    }
    schedule();
  }

  // Forgets every sequence's in-flight positions, so the next steps resubmit it from position 0 (which
  // clears its KV slot and recreates its sampler at the same draw).
  void restart_sequences() {
    for (auto& [id, s] : active_) {
      s->fed = s->in_flight = 0;
      s->pending = 0;
    }
  }

  void accept_token(Sequence& s, int32_t token, Clock::time_point now) {
    if (!s.has_first) {
      s.has_first = true;
      s.t_first = now;
    }
    s.t_last = now;
    if (!s.ignore_eog && tokenizer_->is_eog(token)) return finish(s.id, FinishReason::kEndOfGeneration);
    s.history.push_back(token);
    ++generated_tokens_;
    std::string text = s.text.push(tokenizer_->token_to_piece(token, false));
    s.stream->push(std::span<const int32_t>(&token, 1), text);
    if (s.text.stopped()) return finish(s.id, FinishReason::kStop);
    if (s.max_tokens != 0 && s.n_generated() >= s.max_tokens) return finish(s.id, FinishReason::kMaxTokens);
    if (s.history.size() >= n_ctx_) return finish(s.id, FinishReason::kContextFull);
  }

  void finish(uint64_t id, FinishReason reason) {
    auto it = active_.find(id);
    INFERD_ASSERT(it != active_.end());
    Sequence& s = *it->second;
    std::string tail = s.text.finish();
    if (!tail.empty()) s.stream->push({}, tail);
    GenerateSummary sum;
    sum.reason = reason;
    sum.prompt_tokens = s.n_prompt;
    sum.generated_tokens = s.n_generated();
    sum.seed = s.sampling.seed;
    sum.queue_ms = ms_between(s.t_arrival, s.t_admitted);
    sum.time_to_first_token_ms = s.has_first ? ms_between(s.t_arrival, s.t_first) : 0;
    sum.prompt_ms = s.has_first ? ms_between(s.t_admitted, s.t_first) : 0;
    sum.generate_ms = s.has_first ? ms_between(s.t_first, s.t_last) : 0;
    sum.replays = s.replays;
    static const char* kReasons[] = {"end of generation", "max tokens", "stop string", "context full"};
    spdlog::info("request {} on {}: {} prompt + {} generated tokens, {} | queue {:.1f} ms, first token {:.1f} ms, "
                 "{:.1f} tok/s{}",
                 s.id, spec_.id, sum.prompt_tokens, sum.generated_tokens, kReasons[static_cast<int>(reason)],
                 sum.queue_ms, sum.time_to_first_token_ms,
                 sum.generate_ms > 0 ? (sum.generated_tokens - 1) * 1000.0 / sum.generate_ms : 0.0,
                 s.replays ? ", replayed " + std::to_string(s.replays) + "x" : "");
    s.stream->finish(sum);
    slots_[static_cast<size_t>(s.slot)] = 0;
    prompt_tokens_ += s.n_prompt;
    ++requests_done_;
    active_.erase(it);
  }

  void fail_sequence(uint64_t id, const Status& why) {
    auto it = active_.find(id);
    if (it == active_.end()) return;
    Sequence& s = *it->second;
    spdlog::warn("request {} on {}: {}", s.id, spec_.id, why.to_string());
    s.stream->finish(why);
    slots_[static_cast<size_t>(s.slot)] = 0;
    ++requests_failed_;
    active_.erase(it);
  }

  void fail_all(const Status& why) {
    std::vector<uint64_t> ids;
    for (auto& [id, s] : active_) ids.push_back(id);
    for (uint64_t id : ids) fail_sequence(id, why);
    for (auto& s : queue_) {
      s->stream->finish(why);
      ++requests_failed_;
    }
    queue_.clear();
  }

  // ---- worker life ----------------------------------------------------------------------------


  void spawn_worker(Stage& st) {
    WorkerSpec ws;
    ws.worker_path = sup_.config().worker_path;
    ws.backend = st.backend;
    ws.model_id = spec_.id;
    ws.weights_fd = weights_->fd();
    ws.hidden_in_fd = st.index > 0 ? exchanges_[st.index - 1]->fd() : -1;
    ws.hidden_out_fd = st.index + 1 < stages_.size() ? exchanges_[st.index]->fd() : -1;
    ws.context_size = n_ctx_;
    ws.slots = spec_.parallel;
    ws.threads = spec_.threads;
    ws.batch_tokens = spec_.batch_tokens;
    ws.pad_step = spec_.pad_step;
    ws.first_layer = st.first_layer;
    ws.end_layer = st.end_layer;
    const uint32_t index = st.index;
    WorkerProcess::Events ev;
    ev.on_ready = [this, index](const WorkerReady& r) { on_ready(stages_[index], r); };
    ev.on_completion = [this, index] { on_completion(stages_[index]); };
    ev.on_exit = [this, index](std::string why) { on_exit(stages_[index], std::move(why)); };
    st.in_flight.clear();
    auto w = WorkerProcess::spawn(sup_.io(), ws, std::move(ev));
    if (!w) {
      spdlog::error("model {}: cannot start worker {}: {}", spec_.id, st.index, w.status().to_string());
      fail_backend(st, w.status().message());
      return;
    }
    st.worker = std::move(w).value();
    spdlog::info("model {}: worker {} (layers {}-{}) started as pid {}", spec_.id, st.index, st.first_layer,
                 st.end_layer - 1, st.worker->pid());
  }

  bool all_ready() const {
    return std::all_of(stages_.begin(), stages_.end(), [](const Stage& s) { return s.worker && s.worker->ready(); });
  }

  void on_ready(Stage& st, const WorkerReady& r) {
    st.ready_info = r;
    st.started = Clock::now();
    st.ever_ready = true;
    if (st.crashed_at) {
      st.last_restart_ms = ms_between(*st.crashed_at, Clock::now());
      st.crashed_at.reset();
      spdlog::info("model {}: worker {} back as pid {} in {:.1f} ms; replaying {} requests", spec_.id, st.index,
                   st.worker->pid(), st.last_restart_ms, active_.size());
    } else {
      spdlog::info("model {}: worker {} ready ({}, KV {:.1f} MiB) in {:.1f} ms", spec_.id, st.index, r.device,
                   r.kv_bytes / 1048576.0, r.start_ms);
    }
    if (!all_ready()) return;
    state_ = ModelState::kReady;
    if (first_ready_) std::exchange(first_ready_, nullptr)(Status::ok());
    schedule();
  }

  void on_exit(Stage& st, std::string why) {
    // Runs inside the WorkerProcess's handler: the old worker must outlive this call.
    auto dead = st.worker;
    asio::post(sup_.io(), [dead] {});
    st.worker.reset();
    st.in_flight.clear();
    if (shutting_down_) {
      spdlog::info("model {}: worker {} (pid {}) {}", spec_.id, st.index, dead->pid(), why);
      if (on_stopped_ && std::none_of(stages_.begin(), stages_.end(), [](const Stage& s) { return s.worker != nullptr; })) {
        std::exchange(on_stopped_, nullptr)();
      }
      return;
    }
    if (state_ == ModelState::kFailed) {  // a failed model's workers are not restarted
      spdlog::info("model {}: worker {} (pid {}) {}", spec_.id, st.index, dead->pid(), why);
      return;
    }
    spdlog::error("model {}: worker {} (pid {}) {}", spec_.id, st.index, dead->pid(), why);
    steps_.clear();  // whatever steps were running are abandoned; the other stages' answers are dropped
    if (first_ready_ || !st.ever_ready) {  // it never became ready: the load fails
      state_ = ModelState::kFailed;
      failure_ = "worker could not start: " + why;
      for (Stage& other : stages_) {
        if (other.worker) other.worker->kill();
      }
      if (first_ready_) std::exchange(first_ready_, nullptr)(Status(Code::kFailed, failure_));
      return;
    }
    const auto now = Clock::now();
    st.crashed_at = now;
    st.crashes.push_back(now);
    const auto window = std::chrono::duration<double>(sup_.config().restart_window_s);
    while (!st.crashes.empty() && now - st.crashes.front() > window) st.crashes.pop_front();
    if (st.crashes.size() > sup_.config().max_restarts) {
      fail_backend(st, "its worker crashed " + std::to_string(st.crashes.size()) + " times in " +
                           std::to_string(static_cast<int>(sup_.config().restart_window_s)) + " s (last: " + why + ")");
      return;
    }
    // Every sequence is replayed from position 0 on every stage (the restarted worker's cache is empty).
    restart_sequences();
    std::vector<uint64_t> give_up;
    for (auto& [id, s] : active_) {
      if (++s->replays > kMaxReplays) give_up.push_back(id);
    }
    for (uint64_t id : give_up) {
      fail_sequence(id, Status(Code::kDisconnected, "the worker died " + std::to_string(kMaxReplays + 1) +
                                                        " times during this request (last: " + why + "); retry"));
    }
    replays_ += active_.size();
    ++st.restarts;
    state_ = ModelState::kRecovering;
    spawn_worker(st);
  }

  void fail_backend(const Stage& st, const std::string& why) {
    state_ = ModelState::kFailed;
    failure_ = "backend " + st.backend + (stages_.size() > 1 ? " of stage " + std::to_string(st.index) : "") +
               " failed: " + why;
    spdlog::error("model {}: {}", spec_.id, failure_);
    for (Stage& other : stages_) {  // the other pipeline stages have nothing left to do
      if (other.worker) other.worker->request_shutdown();
    }
    fail_all(Status(Code::kDisconnected, "model " + spec_.id + ": " + failure_));
    if (first_ready_) std::exchange(first_ready_, nullptr)(Status(Code::kFailed, failure_));
  }

  // Fails every request, asks the workers to exit and calls `stopped` once they have (or were killed).
  void shutdown(const Status& why, std::function<void()> stopped) {
    shutting_down_ = true;
    fail_all(why);
    if (first_ready_) std::exchange(first_ready_, nullptr)(why);
    if (std::none_of(stages_.begin(), stages_.end(), [](const Stage& s) { return s.worker != nullptr; })) {
      asio::post(sup_.io(), std::move(stopped));
      return;
    }
    on_stopped_ = std::move(stopped);
    kill_timer_ = std::make_unique<asio::steady_timer>(sup_.io(), kShutdownGrace);
    std::vector<std::weak_ptr<WorkerProcess>> weak;
    for (Stage& st : stages_) {
      if (!st.worker) continue;
      st.worker->request_shutdown();
      weak.push_back(st.worker);
    }
    kill_timer_->async_wait([weak](std::error_code ec) {
      if (ec) return;
      for (auto& w : weak) {
        if (auto p = w.lock()) p->kill();
      }
    });
  }

  // ---- reporting ------------------------------------------------------------------------------

  ModelInfoData info() const {
    ModelInfoData m;
    m.id = spec_.id;
    m.path = spec_.path;
    m.state = state_;
    m.context_size = n_ctx_;
    m.parallel = spec_.parallel;
    m.load_ms = load_ms_;
    m.chat_template = chat_template_name(chat_template_);
    if (!model_) return m;
    const ModelConfig& c = model_->config();
    m.name = c.name;
    m.arch = c.arch;
    m.description = model_->describe();
    m.vocab_size = static_cast<uint32_t>(c.n_vocab);
    m.weights_bytes = weights_->size();
    m.weights_huge_page_bytes = weights_huge_page_bytes_;
    for (const Stage& st : stages_) {
      PlacementStageInfo p;
      p.worker = st.index;
      p.backend = st.backend;
      p.first_layer = st.first_layer;
      p.end_layer = st.end_layer;
      p.embeddings = st.index == 0;
      p.output = st.index + 1 == stages_.size();
      m.placement.push_back(p);
      if (!m.placement_summary.empty()) m.placement_summary += " | ";
      m.placement_summary += st.backend + ":" + std::to_string(st.index) + " layers " +
                             std::to_string(st.first_layer) + "-" + std::to_string(st.end_layer - 1) +
                             (p.embeddings ? " + embeddings" : "") + (p.output ? " + output" : "");

      WorkerInfoData w;
      w.index = st.index;
      w.backend = st.backend;
      w.restarts = st.restarts;
      w.last_restart_ms = st.last_restart_ms;
      w.steps = st.steps;
      w.tokens = st.tokens;
      w.device = st.ready_info.device;
      if (st.worker) {
        w.pid = static_cast<uint32_t>(st.worker->pid());
        w.state = st.worker->ready() ? "ready" : (st.restarts ? "restarting" : "starting");
        auto [anon, shmem] = process_memory(st.worker->pid());
        w.rss_bytes = anon;
        w.shared_bytes = shmem;
        if (st.worker->ready()) w.uptime_ms = static_cast<uint64_t>(ms_between(st.started, Clock::now()));
      } else {
        w.state = state_ == ModelState::kFailed ? "failed" : "stopped";
      }
      m.workers.push_back(w);
    }
    return m;
  }

  ModelStatusData status() const {
    ModelStatusData st;
    st.info = info();
    for (const Stage& s : stages_) st.kv_bytes += s.ready_info.kv_bytes;
    for (auto& [id, s] : active_) {
      ++st.slots_used;
      st.kv_tokens_used += s->fed;
    }
    st.requests_active = static_cast<uint32_t>(active_.size());
    st.requests_queued = static_cast<uint32_t>(queue_.size());
    st.requests_done = requests_done_;
    st.requests_failed = requests_failed_;
    st.prompt_tokens = prompt_tokens_;
    st.generated_tokens = generated_tokens_;
    st.replays = replays_;
    if (timed_steps_ > 0) {
      st.step_compute_us = step_compute_ns_ / 1e3 / static_cast<double>(timed_steps_);
      // Clamped: the worker starts a queued step before the supervisor sees the one before complete.
      st.step_overhead_us = std::max(0.0, (static_cast<double>(step_wall_ns_) - static_cast<double>(step_compute_ns_)) /
                                              1e3 / static_cast<double>(timed_steps_));
    }
    if (rate_.size() >= 2) {
      uint64_t n = 0;
      for (size_t i = 1; i < rate_.size(); ++i) n += rate_[i].second;
      double secs = std::chrono::duration<double>(rate_.back().first - rate_.front().first).count();
      if (secs > 0) st.decode_tokens_per_second = n / secs;
    }
    return st;
  }

  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

 private:
  struct StepEntry {
    uint64_t seq;
    uint32_t chunk;
    bool want;
  };
  struct Step {
    uint64_t id = 0;
    std::vector<StepEntry> entries;  // in the submission's seq order
    uint32_t n_tokens = 0;
    Clock::time_point submitted;
  };

  Supervisor& sup_;
  LoadSpec spec_;
  uint64_t serial_;
  ModelState state_ = ModelState::kLoading;
  std::string failure_;
  std::thread loader_;
  std::shared_ptr<const ipc::WeightsSegment> weights_;
  uint64_t weights_huge_page_bytes_ = 0;  // read once at attach (smaps)
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate chat_template_ = ChatTemplate::kChatml;
  uint32_t n_ctx_ = 0;
  double load_ms_ = 0;

  std::vector<Stage> stages_;  // pipeline order; sized once in attach() (handlers index into it)
  std::vector<std::unique_ptr<ipc::HiddenExchange>> exchanges_;  // between stage i and i + 1
  std::unique_ptr<ipc::Submission> submission_;  // the newest step, as sent to each stage
  std::function<void(Status)> first_ready_;
  std::function<void()> on_stopped_;
  std::unique_ptr<asio::steady_timer> kill_timer_;
  std::unique_ptr<asio::steady_timer> step_timer_;  // the hang detector of the oldest step in flight
  std::pair<uint32_t, uint64_t> timed_{0, 0};        // the stage and step it times
  bool shutting_down_ = false;

  std::deque<std::unique_ptr<Sequence>> queue_;
  std::map<uint64_t, std::unique_ptr<Sequence>> active_;
  std::vector<uint64_t> slots_;  // sequence id per KV slot, 0 = free
  std::deque<Step> steps_;  // in flight, oldest first; at most depth()
  uint64_t next_seq_id_ = 0, next_step_id_ = 0;
  Clock::time_point last_completion_;
  uint64_t step_compute_ns_ = 0, step_wall_ns_ = 0, timed_steps_ = 0;  // for the IPC overhead figure
  uint64_t requests_done_ = 0, requests_failed_ = 0, prompt_tokens_ = 0, generated_tokens_ = 0, replays_ = 0;
  std::deque<std::pair<Clock::time_point, uint32_t>> rate_;
};

// ------------------------------------------------------------------------------------------------
// Supervisor

Supervisor::Supervisor(DaemonConfig config)
    : config_(std::move(config)), work_(asio::make_work_guard(io_)), started_(Clock::now()) {}

Supervisor::~Supervisor() = default;

void Supervisor::run() { io_.run(); }

void Supervisor::stop() {
  if (stopping_) return;
  stopping_ = true;
  auto remaining = std::make_shared<size_t>(models_.size() + retiring_.size());
  auto done_one = [this, remaining] {
    if (--*remaining == 0) {
      work_.reset();
      io_.stop();
    }
  };
  if (*remaining == 0) {
    work_.reset();
    io_.stop();
    return;
  }
  for (auto& [id, host] : models_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
  for (auto& host : retiring_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
}

ModelHost* Supervisor::find(const std::string& id) const {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
}

void Supervisor::load(LoadSpec spec, std::shared_ptr<LoadProgressSink> progress,
                      std::function<void(Result<ModelInfoData>)> done) {
  auto fail = [&](Code code, const std::string& why) { done(Status(code, why)); };
  if (stopping_) return fail(Code::kDisconnected, "the daemon is shutting down");
  if (spec.path.empty() || spec.path[0] != '/') {
    return fail(Code::kInvalidArgument, "model path must be absolute, got '" + spec.path + "'");
  }
  if (spec.id.empty()) spec.id = basename_id(spec.path);
  if (!valid_id(spec.id)) {
    return fail(Code::kInvalidArgument, "model id '" + spec.id + "' must be 1-128 characters of A-Z a-z 0-9 . _ - :");
  }
  if (models_.count(spec.id)) return fail(Code::kInvalidArgument, "a model with id '" + spec.id + "' is already loaded");
  if (spec.backend.empty()) spec.backend = "cpu";
  // "opencl" or "opencl:N" (device N): the worker checks N against the devices it finds.
  auto check_backend = [](const std::string& name) -> Status {
    const auto backend = ipc::parse_backend_name(name);
    const bool opencl = backend && backend->family == "opencl";
#ifdef INFERD_HAVE_OPENCL
    const bool opencl_built = true;
#else
    const bool opencl_built = false;
#endif
    if ((backend && backend->family == "cuda") || (opencl && !opencl_built)) {
      return Status(Code::kUnimplemented, "backend '" + name + "' is not available in this build of inferd");
    }
    if (name != "cpu" && !opencl) {
      return Status(Code::kInvalidArgument, "unknown backend '" + name + "' (cpu, cuda, opencl, opencl:N)");
    }
    return Status::ok();
  };
  if (Status s = check_backend(spec.backend); !s) return done(s);
  if (!spec.stage_backends.empty()) {
    if (spec.stage_backends.size() != spec.layer_split.size() + 1) {
      return fail(Code::kInvalidArgument, "stage backends name " + std::to_string(spec.stage_backends.size()) +
                                              " backends for " + std::to_string(spec.layer_split.size() + 1) +
                                              " pipeline stages (layer split + 1)");
    }
    for (size_t i = 0; i < spec.stage_backends.size(); ++i) {
      if (Status s = check_backend(spec.stage_backends[i]); !s) {
        return done(s.with_context("stage " + std::to_string(i)));
      }
    }
  }
  if (spec.parallel == 0) spec.parallel = config_.default_parallel;
  if (spec.parallel > ipc::kMaxStepSeqs) {
    return fail(Code::kInvalidArgument, "parallel must be in [1, " + std::to_string(ipc::kMaxStepSeqs) + "]");
  }
  if (spec.context_size == 0) spec.context_size = config_.default_context;
  if (spec.context_size != 0 && (spec.context_size < 16 || spec.context_size > 131072)) {
    return fail(Code::kInvalidArgument, "context size must be in [16, 131072]");
  }
  if (spec.threads == 0) spec.threads = config_.threads;
  if (spec.threads > 1024) return fail(Code::kInvalidArgument, "threads must be at most 1024");
  if (spec.batch_tokens == 0) spec.batch_tokens = 512;
  if (spec.batch_tokens > ipc::kMaxStepTokens) {
    return fail(Code::kInvalidArgument, "batch tokens must be in [1, " + std::to_string(ipc::kMaxStepTokens) + "]");
  }
  if (spec.pad_step == 0) spec.pad_step = 64;
  if (spec.pad_step != 64 && spec.pad_step != 128) return fail(Code::kInvalidArgument, "pad step must be 64 or 128");
  if (spec.max_queue == 0) spec.max_queue = config_.max_queue;

  const uint64_t serial = ++load_serial_;
  auto host_ptr = std::make_unique<ModelHost>(*this, spec, serial);
  ModelHost* host = host_ptr.get();
  models_.emplace(spec.id, std::move(host_ptr));
  spdlog::info("loading {} as {} ({} slots, context {}, {} threads)", spec.path, spec.id, spec.parallel,
               spec.context_size ? std::to_string(spec.context_size) : std::string("default"),
               spec.threads ? std::to_string(spec.threads) : std::string("all"));
  const auto t0 = Clock::now();
  std::string id = spec.id;
  // The copy into shared memory runs on its own thread; the result comes back to this io_context.
  host->loader() = std::thread([this, spec, progress, done, t0, id, serial]() mutable {
    if (progress) progress->update("copying", 0, 1);
    auto weights = ipc::WeightsSegment::create(spec.path, [&](uint64_t d, uint64_t t) {
      if (progress) progress->update("copying", d, t);
    });
    Result<std::shared_ptr<const Model>> model = Status(Code::kFailed, "not loaded");
    Result<std::unique_ptr<Tokenizer>> tokenizer = Status(Code::kFailed, "not loaded");
    if (weights) {
      if (progress) progress->update("validating", 0, 1);
      model = Model::load(weights.value()->gguf());
      if (model) tokenizer = Tokenizer::from_gguf(*weights.value()->gguf());
    }
    auto shared = std::make_shared<std::tuple<decltype(weights), decltype(model), decltype(tokenizer)>>(
        std::move(weights), std::move(model), std::move(tokenizer));
    asio::post(io_, [this, shared, progress, done, t0, id, serial] {
      auto& [w, m, t] = *shared;
      ModelHost* h = find(id);
      if (!h || h->serial() != serial) return done(Status(Code::kFailed, "model " + id + " was unloaded while loading"));
      Status err = !w ? w.status() : !m ? m.status() : !t ? t.status() : Status::ok();
      if (!err) {
        spdlog::error("load of {} failed: {}", id, err.to_string());
        models_.erase(id);  // joins the loader thread, which has nothing left to do
        return done(err);
      }
      Status laid_out = h->attach(std::move(w).value(), std::move(m).value(), std::move(t).value(),
                                  ms_between(t0, Clock::now()));
      if (!laid_out) {
        models_.erase(id);
        return done(laid_out);
      }
      if (progress) progress->update("starting workers", 0, 1);
      h->start([this, h, done, progress, id](Status s) {
        if (!s) {
          spdlog::error("load of {} failed: {}", id, s.to_string());
          if (ModelHost* again = find(id); again == h) {
            auto node = models_.extract(id);
            auto* raw = node.mapped().get();
            retiring_.push_back(std::move(node.mapped()));
            raw->shutdown(s, [this, raw] { std::erase_if(retiring_, [raw](auto& r) { return r.get() == raw; }); });
          }
          return done(s);
        }
        if (progress) progress->update("starting workers", 1, 1);
        spdlog::info("model {} ready: {}", id, h->info().description);
        done(h->info());
      });
    });
  });
}

Status Supervisor::unload(const std::string& id) {
  auto it = models_.find(id);
  if (it == models_.end()) return Status(Code::kNotFound, "no model with id '" + id + "' is loaded");
  ModelHost* raw = it->second.get();
  retiring_.push_back(std::move(it->second));
  models_.erase(it);
  spdlog::info("unloading {}", id);
  raw->shutdown(Status(Code::kFailed, "model " + id + " was unloaded"),
                [this, raw] { std::erase_if(retiring_, [raw](auto& r) { return r.get() == raw; }); });
  return Status::ok();
}

std::vector<ModelInfoData> Supervisor::list() const {
  std::vector<ModelInfoData> out;
  for (auto& [id, host] : models_) out.push_back(host->info());
  return out;
}

DaemonStatusData Supervisor::status() const {
  DaemonStatusData st;
  st.version = INFERD_VERSION;
  st.pid = static_cast<uint32_t>(::getpid());
  st.uptime_ms = static_cast<uint64_t>(ms_between(started_, Clock::now()));
  st.socket_path = config_.socket_path;
  for (auto& [id, host] : models_) st.models.push_back(host->status());
  st.connections = connections_;
  st.requests_total = requests_total_;
  st.requests_rejected = requests_rejected_;
  st.rss_bytes = process_memory(::getpid()).first;
  return st;
}

Result<std::vector<int32_t>> Supervisor::tokenize(const std::string& model, const std::string& text, bool add_special,
                                                  bool parse_special) const {
  ModelHost* h = find(model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + model + "' is loaded");
  if (!h->tokenizer()) return Status(Code::kFailed, "model " + model + " is still loading");
  return h->tokenizer()->encode(text, add_special, parse_special);
}

Result<std::string> Supervisor::detokenize(const std::string& model, const std::vector<int32_t>& tokens) const {
  ModelHost* h = find(model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + model + "' is loaded");
  if (!h->tokenizer()) return Status(Code::kFailed, "model " + model + " is still loading");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= h->tokenizer()->n_vocab()) {
      return Status(Code::kInvalidArgument, "token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                                                ", outside the vocabulary");
    }
  }
  return h->tokenizer()->decode(tokens, false);
}

Status Supervisor::generate(GenerateParams params, std::shared_ptr<GenerationStream> stream) {
  ++requests_total_;
  ModelHost* h = find(params.model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + params.model + "' is loaded");
  Status s = h->enqueue(std::move(params), std::move(stream));
  if (s.code() == Code::kOverloaded) ++requests_rejected_;
  return s;
}

void Supervisor::kick(const std::string& model) {
  if (ModelHost* h = find(model)) h->schedule();
}

}  // namespace inferd::daemon
