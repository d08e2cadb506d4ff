#include "scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "inferd/graph.h"

namespace inferd::daemon {
namespace {

using Clock = SchedulerClock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

constexpr uint32_t kBlock = static_cast<uint32_t>(graph::kKvBlockTokens);

// The pool: at least a context's blocks for every slot, so a sequence always finds the blocks it needs.
uint32_t pool_blocks(const SchedulerOptions& o) {
  const uint32_t per_slot = static_cast<uint32_t>(graph::kv_blocks_per_slot(static_cast<int32_t>(o.context_size)));
  return std::max(o.kv_blocks, std::max<uint32_t>(1, o.parallel * per_slot));
}

constexpr uint32_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;

}  // namespace

struct Scheduler::Sequence {
  uint64_t id = 0;
  std::shared_ptr<GenerationStream> stream;
  std::vector<int32_t> history;  // prompt, then generated tokens
  uint32_t n_prompt = 0;
  SamplingParams sampling;
  uint32_t max_tokens = 0;
  bool ignore_eog = false;
  std::string client;      // GenerateParams::client
  int32_t logprobs = -1;   // alternatives per token with its log-probability; -1: none
  bool embedding = false;  // an embedding request: the prompt, then one embedding instead of tokens
  std::vector<float> embedding_out;
  TextOutput text;
  int32_t slot = -1;
  // KV blocks (prefix_cache.h): its table, each referenced once; how many of them are published (or
  // came from the cache); the block that stands for the last of those (the chain to publish under).
  bool cache_prompt = true;
  bool publishing = true;  // false once its chain was evicted from under it
  bool fresh = true;       // its next step starts it afresh (ipc::kSeqFresh)
  std::vector<int32_t> blocks;
  size_t published = 0;
  int32_t chain = PrefixCache::kNone;
  uint32_t cached_tokens = 0;  // taken from the cache when it last (re)started
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

Scheduler::Scheduler(SchedulerOptions options, const Tokenizer& tokenizer, ChatFormatter chat,
                     SchedulerHost& host, std::vector<StagePort*> stages)
    : opt_(std::move(options)),
      tokenizer_(tokenizer),
      chat_(std::move(chat)),
      host_(host),
      ports_(std::move(stages)),
      stages_(ports_.size()),
      slots_(opt_.parallel, 0),
      cache_(pool_blocks(opt_), kBlock),
      submission_(std::make_unique<ipc::Submission>()) {
  INFERD_ASSERT(!ports_.empty());
}

Scheduler::~Scheduler() = default;

namespace {

Status validate_request(const GenerateParams& p, uint32_t n_embd) {
  INFERD_RETURN_IF_ERROR(validate(p.sampling));
  if (p.logprobs < -1 || p.logprobs > static_cast<int32_t>(ipc::kMaxTopLogprobs)) {
    return Status(Code::kInvalidArgument, "top_logprobs must be in [0, " + std::to_string(ipc::kMaxTopLogprobs) +
                                              "], got " + std::to_string(p.logprobs));
  }
  if (p.embedding && (n_embd == 0 || n_embd > ipc::kMaxEmbdFloats)) {
    return Status(Code::kUnimplemented, "this model gives no embeddings (its hidden size " + std::to_string(n_embd) +
                                            " is above " + std::to_string(ipc::kMaxEmbdFloats) + ")");
  }
  if (p.stop.size() > kMaxStopStrings) {
    return Status(Code::kInvalidArgument, "at most " + std::to_string(kMaxStopStrings) + " stop strings");
  }
  for (const auto& s : p.stop) {
    if (s.size() > kMaxStopBytes) {
      return Status(Code::kInvalidArgument, "a stop string is longer than " + std::to_string(kMaxStopBytes) + " bytes");
    }
    if (!is_valid_utf8(s)) return Status(Code::kInvalidArgument, "a stop string is not valid UTF-8");
  }
  return Status::ok();
}

}  // namespace

Status Scheduler::admit(const GenerateParams& p) const {
  INFERD_RETURN_IF_ERROR(validate_request(p, opt_.n_embd));
  return queue_room(p.client);
}

Status Scheduler::queue_room(const std::string& client) const {
  if (queue_.size() >= opt_.max_queue) {
    return Status(Code::kOverloaded, "model " + opt_.model_id + " has " + std::to_string(queue_.size()) +
                                         " requests waiting (max-queue); retry later");
  }
  const size_t share = client_queue_share(opt_.client_max_queue, opt_.max_queue);
  const size_t mine = static_cast<size_t>(std::count_if(queue_.begin(), queue_.end(), [&](const auto& s) { return s->client == client; }));
  if (mine >= share) {
    return Status(Code::kOverloaded, "this client has " + std::to_string(mine) + " requests waiting for model " +
                                         opt_.model_id + " (its share of the queue, client-max-queue); retry later");
  }
  return Status::ok();
}

Result<std::string> Scheduler::prompt_text(const GenerateParams& p) const {
  if (p.input != GenerateParams::Input::kMessages) return p.prompt;
  auto text = chat_.apply(p.messages);
  if (!text) return text;
  if (p.add_special && tokenizer_.add_bos() && tokenizer_.bos() >= 0) {
    drop_leading_bos(*text, tokenizer_.token_text(tokenizer_.bos()));
  }
  return text;
}

Status Scheduler::enqueue(GenerateParams p, std::shared_ptr<GenerationStream> stream) {
  INFERD_RETURN_IF_ERROR(validate_request(p, opt_.n_embd));
  std::vector<int32_t> prompt;
  switch (p.input) {
    case GenerateParams::Input::kPrompt:
      prompt = tokenizer_.encode(p.prompt, p.add_special, p.parse_special);
      break;
    case GenerateParams::Input::kMessages: {
      auto text = prompt_text(p);
      if (!text) return text.status();
      prompt = tokenizer_.encode(text.value(), p.add_special, true);
      break;
    }
    case GenerateParams::Input::kTokens:
      for (size_t i = 0; i < p.tokens.size(); ++i) {
        if (p.tokens[i] < 0 || p.tokens[i] >= tokenizer_.n_vocab()) {
          return Status(Code::kInvalidArgument, "token " + std::to_string(i) + " is " + std::to_string(p.tokens[i]) +
                                                    ", outside the vocabulary [0, " +
                                                    std::to_string(tokenizer_.n_vocab()) + ")");
        }
      }
      prompt = std::move(p.tokens);
      break;
  }
  if (prompt.empty()) return Status(Code::kInvalidArgument, "the prompt is empty");
  if (p.embedding && prompt.size() > opt_.context_size) {
    return Status(Code::kOutOfRange, "the input is " + std::to_string(prompt.size()) + " tokens but model " +
                                         opt_.model_id + "'s context holds " + std::to_string(opt_.context_size));
  }
  if (!p.embedding && prompt.size() >= opt_.context_size) {
    return Status(Code::kOutOfRange, "the prompt is " + std::to_string(prompt.size()) + " tokens but model " +
                                         opt_.model_id + "'s context holds " + std::to_string(opt_.context_size) +
                                         " (the prompt must leave room for at least one generated token)");
  }
  INFERD_RETURN_IF_ERROR(queue_room(p.client));
  auto seq = std::make_unique<Sequence>();
  seq->client = p.client;
  seq->id = ++next_seq_id_;
  seq->stream = std::move(stream);
  seq->n_prompt = static_cast<uint32_t>(prompt.size());
  seq->history = std::move(prompt);
  seq->sampling = p.sampling;
  if (seq->sampling.seed == SamplingParams::kSeedFromClock) {
    seq->sampling.seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    if (seq->sampling.seed == SamplingParams::kSeedFromClock) seq->sampling.seed = 0;
  }
  seq->max_tokens = p.embedding ? 1 : p.max_tokens;  // an embedding is the one answer
  seq->ignore_eog = p.ignore_eog;
  seq->logprobs = p.embedding ? -1 : p.logprobs;
  seq->embedding = p.embedding;
  seq->cache_prompt = p.cache_prompt;
  seq->text = TextOutput(std::move(p.stop));
  seq->t_arrival = host_.now();
  queue_.push_back(std::move(seq));
  schedule();
  return Status::ok();
}

void Scheduler::schedule() {
  while (schedule_one()) {
  }
  arm_hang_detector();
}

// The queued request a free slot goes to: the oldest of the waiting client that holds the fewest slots
// (among those under client_max_slots); end() when none may have one.
std::deque<std::unique_ptr<Scheduler::Sequence>>::iterator Scheduler::next_admitted() {
  std::map<std::string_view, uint32_t> held;
  for (const auto& [id, s] : active_) ++held[s->client];
  auto best = queue_.end();
  uint32_t best_held = 0;
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    const auto h = held.find((*it)->client);
    const uint32_t n = h == held.end() ? 0 : h->second;
    if (opt_.client_max_slots > 0 && n >= opt_.client_max_slots) continue;
    if (best == queue_.end() || n < best_held) {
      best = it;
      best_held = n;
    }
  }
  return best;
}

// Steps a worker holds at once: one per pipeline stage, else the configured number.
size_t Scheduler::depth() const { return ports_.size() == 1 ? opt_.steps_in_flight : 1; }

// Whether a sequence goes on after its pending tokens, unless one of them ends it by its value.
bool Scheduler::continues_after_pending(const Sequence& s) const {
  return (s.max_tokens == 0 || s.n_generated() + s.pending < s.max_tokens) &&
         s.history.size() + s.pending < opt_.context_size;
}

// Builds and submits one step; false when none can start now.
bool Scheduler::schedule_one() {
  if (stopped_ || steps_.size() >= depth()) return false;
  for (size_t i = 0; i < ports_.size(); ++i) {
    if (!ports_[i]->ready() || stages_[i].in_flight.size() >= depth()) return false;
  }
  const auto now = host_.now();
  // Cancelled sequences leave at a step boundary; their slots are free for this very step (a step
  // still in flight may write into such a slot: a sequence admitted now starts it afresh after).
  for (auto it = active_.begin(); it != active_.end();) {
    if (it->second->stream->cancelled()) {
      Sequence& s = *it->second;
      spdlog::info("request {} on {}: cancelled by the client after {} tokens", s.id, opt_.model_id, s.n_generated());
      leave_slot(s);
      ++requests_done_;
      ++requests_cancelled_;
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(queue_, [](const auto& s) { return s->stream->cancelled(); });
  for (size_t slot = 0; slot < slots_.size() && !queue_.empty(); ++slot) {
    if (slots_[slot] != 0) continue;
    const auto next = next_admitted();
    if (next == queue_.end()) break;  // every waiting client holds its cap of slots
    auto seq = std::move(*next);
    queue_.erase(next);
    seq->slot = static_cast<int32_t>(slot);
    seq->t_admitted = now;
    take_prefix(*seq);
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
  sub->n_blocks = 0;
  uint32_t budget = opt_.batch_tokens;
  // Embeddings a completion has room for (ipc::kMaxEmbdFloats floats).
  uint32_t embd_room = opt_.n_embd > 0 ? ipc::kMaxEmbdFloats / opt_.n_embd : 0;
  // Positions of a sequence not sent to the worker yet; the last `pending` are being sampled.
  auto unsent = [](const Sequence& s) { return s.history.size() + s.pending - s.sent(); };
  auto add = [&](Sequence& s) {
    if (budget == 0) return;
    if (s.stream->backed_up()) return;  // its client is not reading: no further steps until it does
    const size_t sent = s.sent();
    uint32_t chunk = 0;
    bool want = false, sampled = false;
    if (sent < s.history.size()) {  // known tokens: a prompt chunk, or a decode step
      INFERD_ASSERT(s.pending == 0, "sequence %llu has %u pending tokens", static_cast<unsigned long long>(s.id),
                    s.pending);
      chunk = static_cast<uint32_t>(std::min<size_t>(s.history.size() - sent, budget));
      want = sent + chunk == s.history.size();
      if (want && s.embedding) {
        if (embd_room == 0) {  // the step has no room for its embedding: the last token waits for the next
          --chunk;
          want = false;
        } else {
          --embd_room;
        }
      }
    } else {  // the token the worker is sampling for it now: queue the step after, ahead
      INFERD_ASSERT(s.pending > 0 && sent + 1 == s.history.size() + s.pending);
      if (!continues_after_pending(s)) return;
      chunk = 1;
      want = sampled = true;
    }
    if (chunk == 0) return;
    if (!reserve_blocks(s, sent + chunk, *sub)) return;  // no room for its table in this step
    ipc::StepSeq& e = sub->seqs[sub->n_seqs];
    e = {};
    e.slot = static_cast<uint32_t>(s.slot);
    e.flags = want ? ipc::kSeqWantToken : 0;
    if (std::exchange(s.fresh, false)) e.flags |= ipc::kSeqFresh;
    e.first_block = sub->n_blocks;
    e.n_blocks = static_cast<uint32_t>(s.blocks.size());
    std::copy(s.blocks.begin(), s.blocks.end(), sub->blocks + sub->n_blocks);
    sub->n_blocks += e.n_blocks;
    if (want && s.embedding) e.flags |= ipc::kSeqWantEmbedding;
    if (want && s.logprobs >= 0) {
      e.flags |= ipc::kSeqWantLogprobs;
      e.top_logprobs = static_cast<uint32_t>(s.logprobs);
    }
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
    step.entries.push_back({s.id, chunk, want, want && s.embedding});
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
  return submit_to(0);
}

// Copies the current step into a stage's ring and wakes its worker. False when the ring has no room:
// at most depth() steps are in flight and depth() <= the ring's capacity, so only a worker that wrote
// a submission counter it should not have can make that happen; it is killed (its steps are then
// abandoned and replayed, as for any worker that dies).
bool Scheduler::submit_to(size_t stage) {
  const ipc::Submission& src = *submission_;
  ipc::Submission* dst = ports_[stage]->submission_slot();
  if (dst == nullptr) {
    spdlog::error("model {}: worker {}'s ring has no room for step {} (it wrote an impossible submission counter); "
                  "killing it",
                  opt_.model_id, ports_[stage]->pid(), src.id);
    ports_[stage]->kill();
    return false;
  }
  dst->id = src.id;
  dst->n_seqs = src.n_seqs;
  dst->n_tokens = src.n_tokens;
  std::memcpy(dst->seqs, src.seqs, sizeof(ipc::StepSeq) * src.n_seqs);
  std::memcpy(dst->tokens, src.tokens, sizeof(ipc::StepToken) * src.n_tokens);
  dst->n_blocks = src.n_blocks;
  std::memcpy(dst->blocks, src.blocks, sizeof(int32_t) * src.n_blocks);
  stages_[stage].in_flight.push_back(src.id);
  ports_[stage]->publish_submission();
  return true;
}

// The hang detector: the worker running the oldest step in flight must finish it within step_timeout of
// when it became that worker's oldest (so a queued step's time starts when the step before it ends, and
// a pipeline stage's when it gets the step). Armed once per step and stage, when that changes
// (schedule() runs after every submission and completion).
void Scheduler::arm_hang_detector() {
  size_t stage = 0;
  while (stage < ports_.size() && stages_[stage].in_flight.empty()) ++stage;
  if (stage == ports_.size()) return;
  const std::pair<size_t, uint64_t> oldest{stage, stages_[stage].in_flight.front()};
  if (oldest == timed_) return;
  timed_ = oldest;
  std::weak_ptr<bool> alive = alive_;
  host_.arm_timer(opt_.step_timeout, [this, alive, oldest] {
    if (alive.expired()) return;  // the scheduler is gone
    const StageState& st = stages_[oldest.first];
    // It has moved on since: the step completed, or its worker died. (A step abandoned because another
    // stage died or a step before it failed is still owed by this worker: a hang in it is a hang.)
    if (st.in_flight.empty() || st.in_flight.front() != oldest.second) return;
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(opt_.step_timeout).count();
    spdlog::error("model {}: worker {} has not finished step {} in {} s; killing it", opt_.model_id,
                  ports_[oldest.first]->pid(), oldest.second, seconds);
    // The requests in the hung step fail rather than being replayed: a hang that their input causes
    // would hang the restarted worker too, step-timeout after step-timeout. The others are replayed.
    for (const Step& step : steps_) {
      if (step.id != oldest.second) continue;
      for (const StepEntry& e : step.entries) {
        fail_sequence(e.seq, Status(Code::kFailed, "the worker did not finish this request's step in " +
                                                       std::to_string(seconds) +
                                                       " s (step-timeout) and was restarted; the request is not "
                                                       "retried, in case it caused the hang"));
      }
    }
    ports_[oldest.first]->kill();
  });
}

void Scheduler::on_completion(size_t stage_index) {
  StagePort& port = *ports_[stage_index];
  StageState& st = stages_[stage_index];
  if (!port.ready()) return;
  while (const ipc::Completion* c = port.next_completion()) {
    if (st.in_flight.empty() || c->id != st.in_flight.front()) {
      spdlog::error("model {}: worker {} answered step {} (it was given {}); killing it", opt_.model_id, port.pid(),
                    c->id, st.in_flight.empty() ? 0 : st.in_flight.front());
      port.kill();  // a worker that answers steps it was not given is broken
      return;
    }
    st.in_flight.pop_front();
    ++st.steps;
    step_compute_ns_ += c->compute_ns;
    if (steps_.empty() || steps_.front().id != c->id) {  // the step was abandoned when another stage died
      port.release_completion();
      continue;
    }
    st.tokens += steps_.front().n_tokens;
    if (c->status != 0) {
      std::string why(c->error, strnlen(c->error, sizeof(c->error)));
      port.release_completion();
      Step step = std::move(steps_.front());
      steps_.pop_front();
      spdlog::error("model {}: step {} failed on worker {}: {}", opt_.model_id, step.id, stage_index, why);
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
    if (stage_index + 1 < ports_.size()) {  // hand the step to the next pipeline stage
      const bool bad = c->n_outputs != 0;
      port.release_completion();
      if (bad) {
        spdlog::error("model {}: pipeline stage {} sampled tokens; killing it", opt_.model_id, stage_index);
        port.kill();
        return;
      }
      if (!submit_to(stage_index + 1)) return;
      continue;
    }
    Step step = std::move(steps_.front());
    steps_.pop_front();
    // Every answer checked against what the step asked before any is used (`c` is a private copy).
    std::vector<Answer> answers(step.entries.size());
    size_t embd_floats = 0;
    bool bad = c->n_outputs > step.entries.size();
    for (uint32_t i = 0; !bad && i < c->n_outputs; ++i) {
      const ipc::StepOutput& o = c->outputs[i];
      if (o.seq >= step.entries.size() || !step.entries[o.seq].want || answers[o.seq].output >= 0) {
        bad = true;
        break;
      }
      const StepEntry& e = step.entries[o.seq];
      Answer& a = answers[o.seq];
      a.output = static_cast<int32_t>(i);
      if (e.embedding) {
        bad = o.token != ipc::kTokenEmbedding;
        a.embd_offset = embd_floats;
        embd_floats += opt_.n_embd;
        continue;
      }
      bad = o.token < 0 || o.token >= tokenizer_.n_vocab() || o.n_top > ipc::kMaxTopLogprobs;
      for (uint32_t k = 0; !bad && k < o.n_top; ++k) {
        bad = c->top[i][k].token < 0 || c->top[i][k].token >= tokenizer_.n_vocab();
      }
      a.token = o.token;
    }
    bad = bad || embd_floats != c->n_embd_floats;
    for (size_t i = 0; !bad && i < step.entries.size(); ++i) bad = step.entries[i].want && answers[i].output < 0;
    if (bad) {
      port.release_completion();
      spdlog::error("model {}: worker sent a malformed completion; killing it", opt_.model_id);
      port.kill();
      return;
    }
    const auto now = host_.now();
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
      publish_blocks(s);
      if (!step.entries[i].want) continue;
      --s.pending;
      const Answer& a = answers[i];
      if (step.entries[i].embedding) {
        accept_embedding(s, std::span<const float>(c->embd + a.embd_offset, opt_.n_embd), now);
        continue;
      }
      ++decoded;
      if (s.logprobs < 0) {
        accept_token(s, a.token, now, nullptr);
        continue;
      }
      const ipc::StepOutput& o = c->outputs[a.output];
      TokenLogprobs lp;
      lp.chosen = token_logprob(a.token, o.logprob);
      const uint32_t n_top = std::min(o.n_top, static_cast<uint32_t>(s.logprobs));
      for (uint32_t k = 0; k < n_top; ++k) lp.top.push_back(token_logprob(c->top[a.output][k].token, c->top[a.output][k].logprob));
      accept_token(s, a.token, now, &lp);
    }
    port.release_completion();
    rate_.push_back({now, decoded});
    while (!rate_.empty() && now - rate_.front().first > std::chrono::seconds(5)) rate_.pop_front();
  }
  if (port.broken()) {
    spdlog::error("model {}: worker {} wrote ring counters out of order; killing it", opt_.model_id, port.pid());
    port.kill();
    return;
  }
  schedule();
}

void Scheduler::stage_lost(size_t stage) {
  stages_[stage].in_flight.clear();
  steps_.clear();  // whatever steps were running are abandoned; the other stages' answers are dropped
}

void Scheduler::replay(const std::string& why) {
  cache_.clear();  // the dead worker's KV is gone
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
}

// Forgets every sequence's in-flight positions and blocks, so the next steps resubmit it from the
// longest prefix still cached (position 0 after a worker's death), starting it afresh: a new sampler at
// the same draw. Every sequence lets its blocks go before any takes a prefix, so they may find each
// other's (and their own) published blocks.
void Scheduler::restart_sequences() {
  for (auto& [id, s] : active_) release_blocks(*s);
  for (auto& [id, s] : active_) take_prefix(*s);
}

void Scheduler::take_prefix(Sequence& s) {
  INFERD_ASSERT(s.blocks.empty());
  s.fed = s.in_flight = 0;
  s.pending = 0;
  s.fresh = true;
  s.publishing = s.cache_prompt;
  s.published = 0;
  s.chain = PrefixCache::kNone;
  s.cached_tokens = 0;
  if (!s.cache_prompt) return;
  // The last token is always computed (its logits are the answer); with a penalty history, every token
  // of the window too, so the worker's sampler sees them.
  size_t limit = s.history.size() - 1;
  const int32_t window = penalty_window(s.sampling);  // the sampler's own rule (sampler.h)
  if (window < 0) return;
  limit = std::min(limit, s.history.size() - std::min(s.history.size(), static_cast<size_t>(window)));
  s.blocks = cache_.match(s.history, limit / kBlock);
  s.published = s.blocks.size();
  if (!s.blocks.empty()) s.chain = s.blocks.back();
  s.fed = s.blocks.size() * kBlock;
  s.cached_tokens = static_cast<uint32_t>(s.fed);
}

bool Scheduler::reserve_blocks(Sequence& s, size_t end, ipc::Submission& sub) {
  const size_t need = (end + kBlock - 1) / kBlock;
  if (sub.n_blocks + std::max(need, s.blocks.size()) > ipc::kMaxStepBlocks) return false;
  while (s.blocks.size() < need) {
    const int32_t b = cache_.allocate();
    // The pool holds a context for every slot and a sequence holds at most one context's blocks.
    INFERD_ASSERT(b != PrefixCache::kNone, "model %s: no free KV block", opt_.model_id.c_str());
    s.blocks.push_back(b);
  }
  return true;
}

void Scheduler::publish_blocks(Sequence& s) {
  while (s.publishing && (s.published + 1) * kBlock <= s.fed) {
    const size_t i = s.published;
    const int32_t got = cache_.publish(s.chain, s.blocks[i],
                                       std::span<const int32_t>(s.history).subspan(i * kBlock, kBlock));
    if (got == PrefixCache::kNone) {  // its chain was evicted: the rest cannot be found anyway
      s.publishing = false;
      break;
    }
    if (got != s.blocks[i]) {
      // Another sequence cached this very prefix first: use its block (the same KV, bit for bit) and let
      // this one go. Steps already queued read the old block; it is written again only by steps queued
      // after them, which the worker runs after them.
      cache_.retain(got);
      cache_.release(std::span<const int32_t>(&s.blocks[i], 1));
      s.blocks[i] = got;
    }
    s.chain = got;
    ++s.published;
  }
}

void Scheduler::leave_slot(Sequence& s) {
  slots_[static_cast<size_t>(s.slot)] = 0;
  release_blocks(s);
}

void Scheduler::release_blocks(Sequence& s) {
  cache_.release(s.blocks);
  s.blocks.clear();
  s.published = 0;
  s.chain = PrefixCache::kNone;
}

TokenLogprob Scheduler::token_logprob(int32_t token, float logprob) const {
  return TokenLogprob{token, logprob, tokenizer_.token_to_piece(token, false)};
}

void Scheduler::accept_embedding(Sequence& s, std::span<const float> embedding, Clock::time_point now) {
  s.has_first = true;
  s.t_first = s.t_last = now;
  double norm = 0;
  for (float v : embedding) norm += static_cast<double>(v) * v;
  norm = std::sqrt(norm);
  s.embedding_out.assign(embedding.begin(), embedding.end());
  if (norm > 0) {
    for (float& v : s.embedding_out) v = static_cast<float>(v / norm);
  }
  finish(s.id, FinishReason::kEndOfGeneration);
}

void Scheduler::accept_token(Sequence& s, int32_t token, Clock::time_point now, TokenLogprobs* logprobs) {
  if (!s.has_first) {
    s.has_first = true;
    s.t_first = now;
  }
  s.t_last = now;
  if (!s.ignore_eog && tokenizer_.is_eog(token)) return finish(s.id, FinishReason::kEndOfGeneration);
  s.history.push_back(token);
  ++generated_tokens_;
  std::string text = s.text.push(tokenizer_.token_to_piece(token, false));
  s.stream->push(std::span<const int32_t>(&token, 1), text, logprobs);
  if (s.text.stopped()) return finish(s.id, FinishReason::kStop);
  if (s.max_tokens != 0 && s.n_generated() >= s.max_tokens) return finish(s.id, FinishReason::kMaxTokens);
  if (s.history.size() >= opt_.context_size) return finish(s.id, FinishReason::kContextFull);
}

void Scheduler::finish(uint64_t id, FinishReason reason) {
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
  sum.cached_tokens = s.cached_tokens;
  sum.embedding = std::move(s.embedding_out);
  static const char* kReasons[] = {"end of generation", "max tokens", "stop string", "context full"};
  spdlog::info("request {} on {}: {} prompt + {} generated tokens, {} | queue {:.1f} ms, first token {:.1f} ms, "
               "{:.1f} tok/s{}",
               s.id, opt_.model_id, sum.prompt_tokens, sum.generated_tokens, kReasons[static_cast<int>(reason)],
               sum.queue_ms, sum.time_to_first_token_ms,
               sum.generate_ms > 0 ? (sum.generated_tokens - 1) * 1000.0 / sum.generate_ms : 0.0,
               s.replays ? ", replayed " + std::to_string(s.replays) + "x" : "");
  if (s.has_first) ttft_.observe(sum.time_to_first_token_ms / 1e3);
  if (sum.generated_tokens > 1 && sum.generate_ms > 0) {
    token_latency_.observe(sum.generate_ms / 1e3 / static_cast<double>(sum.generated_tokens - 1));
  }
  s.stream->finish(sum);
  leave_slot(s);
  prompt_tokens_ += s.n_prompt;
  ++requests_done_;
  active_.erase(it);
}

void Scheduler::fail_sequence(uint64_t id, const Status& why) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  Sequence& s = *it->second;
  spdlog::warn("request {} on {}: {}", s.id, opt_.model_id, why.to_string());
  s.stream->finish(why);
  leave_slot(s);
  ++requests_failed_;
  active_.erase(it);
}

void Scheduler::fail_all(const Status& why) {
  std::vector<uint64_t> ids;
  for (auto& [id, s] : active_) ids.push_back(id);
  for (uint64_t id : ids) fail_sequence(id, why);
  for (auto& s : queue_) {
    s->stream->finish(why);
    ++requests_failed_;
  }
  queue_.clear();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st;
  for (auto& [id, s] : active_) {
    ++st.slots_used;
    st.kv_tokens_used += s->fed;
  }
  st.requests_active = static_cast<uint32_t>(active_.size());
  st.requests_queued = static_cast<uint32_t>(queue_.size());
  st.requests_done = requests_done_;
  st.requests_failed = requests_failed_;
  st.requests_cancelled = requests_cancelled_;
  st.ttft = ttft_;
  st.token_latency = token_latency_;
  st.prompt_tokens = prompt_tokens_;
  st.generated_tokens = generated_tokens_;
  st.replays = replays_;
  st.cache = cache_.stats();
  st.cached_tokens = uint64_t{st.cache.blocks_cached} * kBlock;
  if (timed_steps_ > 0) {
    st.step_compute_us = static_cast<double>(step_compute_ns_) / 1e3 / static_cast<double>(timed_steps_);
    // Clamped: the worker starts a queued step before the supervisor sees the one before complete.
    st.step_overhead_us = std::max(0.0, (static_cast<double>(step_wall_ns_) - static_cast<double>(step_compute_ns_)) /
                                            1e3 / static_cast<double>(timed_steps_));
  }
  if (rate_.size() >= 2) {
    uint64_t n = 0;
    for (size_t i = 1; i < rate_.size(); ++i) n += rate_[i].second;
    const double secs = std::chrono::duration<double>(rate_.back().first - rate_.front().first).count();
    if (secs > 0) st.decode_tokens_per_second = static_cast<double>(n) / secs;
  }
  return st;
}

}  // namespace inferd::daemon
