// daemon/scheduler.h — one model's scheduler: admission queue, KV slots, continuous batching, steps in
// flight, replay after a worker's death, and the hang detector.
//
// Scheduling (continuous batching): a step holds one token for every sequence that is decoding, then
// prompt chunks of the sequences still prefilling, up to batch_tokens; queued requests are admitted into
// free slots between steps. Fairness between clients: one client holds at most client_max_queue queue
// places, and a free slot goes to the oldest request of the waiting client that holds the fewest slots
// (so a client that arrives while another fills every slot gets the next one that frees up). A single worker is kept `steps_in_flight` steps ahead: the step after a
// decode step is queued before that step's token is known, naming its input ipc::kTokenSampled, so the
// worker never waits for the supervisor between tokens. Such a step is only queued for a sequence that
// goes on unless the pending token ends it (end of generation, a stop string); if it does, what the step
// computed for it is dropped. Pipeline stages run one step at a time, handed from stage to stage.
//
// KV blocks and the prefix cache (prefix_cache.h): the scheduler allocates every sequence's KV blocks
// and names them in each step. A sequence admitted (or restarted) first takes the longest cached prefix
// of its tokens — full blocks another sequence computed, shared by reference — and prefills only the
// rest; its own blocks are published as they fill, so the next request with the same start (a chat's
// next turn, the same system prompt) finds them. At least one token is always computed (its logits are
// the answer), and a request whose sampling keeps a penalty history (repeat_last_n tokens) computes at
// least those, so the sampler sees every token it would have seen. A worker's death empties the cache.
//
// Recovery: when a worker dies (stage_lost, then replay), every sequence is replayed from position 0 on every stage
// (prompt + the tokens already streamed), its sampler resumed at the same draw, so the client's stream
// goes on with neither duplicated nor missing tokens; a request replayed more than kMaxReplays times
// fails with DISCONNECTED. A step a worker fails fails the requests in it; the steps queued behind it
// are dropped and every other sequence restarts from position 0. A worker that answers a step it was not
// given, or names a token out of range, is killed (StagePort::kill).
//
// The scheduler is deterministic: it acts only when called, reads time from its SchedulerHost and arms
// its one timer (the hang detector) through it, and reaches workers only through StagePorts. The daemon
// plugs in worker processes (supervisor.cpp); unit tests plug in fake workers and a manual clock
// (scheduler_test.cpp) and step it call by call, faults included.
//
// Thread safety: every method runs on one thread (the supervisor's io_context).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chat_template.h"
#include "generation.h"
#include "histogram.h"
#include "inferd/ipc/ring.h"
#include "inferd/status.h"
#include "inferd/tokenizer.h"
#include "prefix_cache.h"
#include "text_output.h"

namespace inferd::daemon {

using SchedulerClock = std::chrono::steady_clock;

// One pipeline stage's worker, as the scheduler drives it.
class StagePort {
 public:
  virtual ~StagePort() = default;
  // A worker is running and ready for steps.
  virtual bool ready() const = 0;
  // The next free submission entry of its ring (nullptr when the ring is full), then publish it.
  virtual ipc::Submission* submission_slot() = 0;
  virtual void publish_submission() = 0;
  // The oldest unread completion (nullptr when none), then release it.
  virtual const ipc::Completion* next_completion() = 0;
  virtual void release_completion() = 0;
  // The worker wrote ring counters no correct worker could have (RingSegment::broken): kill it.
  virtual bool broken() const { return false; }
  // The worker is broken (a malformed answer, a step that hangs): end it. stage_lost() follows.
  virtual void kill() = 0;
  virtual int pid() const = 0;
};

// What the scheduler needs of its surroundings: the time, and one timer.
class SchedulerHost {
 public:
  virtual ~SchedulerHost() = default;
  virtual SchedulerClock::time_point now() const = 0;
  // Calls `fire` once after `delay`, replacing any timer armed before.
  virtual void arm_timer(std::chrono::milliseconds delay, std::function<void()> fire) = 0;
};

struct SchedulerOptions {
  std::string model_id;        // for messages and logs
  uint32_t context_size = 0;   // tokens per sequence
  uint32_t parallel = 1;       // KV slots
  uint32_t batch_tokens = 512;
  uint32_t max_queue = 64;
  uint32_t steps_in_flight = 2;  // per worker, when there is one stage
  // The workers' KV pool in blocks of graph::kKvBlockTokens positions: at least parallel × the blocks of
  // one context (0: exactly that), so a sequence always finds blocks; the rest holds cached prefixes.
  uint32_t kv_blocks = 0;
  uint32_t n_embd = 0;           // floats per embedding (0: the model gives none)
  // Per client (GenerateParams::client): queue places (0: max_queue / 2, at least 1) and KV slots
  // (0: no cap) it may hold. Free slots go to the waiting client that holds the fewest, oldest first.
  uint32_t client_max_queue = 0;
  uint32_t client_max_slots = 0;
  // A step that takes longer than this means the worker hangs (a GPU fault, a deadlock): it is killed
  // and its requests replayed. Far above any real step (512 tokens of an 8B model on 2 cores take ~1 min).
  std::chrono::milliseconds step_timeout = std::chrono::minutes(10);
};

// The queue places one client may hold: client_max_queue, or half of max_queue (at least 1) when 0.
inline uint32_t client_queue_share(uint32_t client_max_queue, uint32_t max_queue) {
  return client_max_queue > 0 ? client_max_queue : std::max<uint32_t>(1, max_queue / 2);
}

inline constexpr uint32_t kMaxReplays = 3;  // a request survives this many worker deaths

struct SchedulerStats {
  uint64_t requests_cancelled = 0;  // by their clients (also counted in requests_done)
  Histogram ttft = ttft_histogram();
  Histogram token_latency = token_latency_histogram();
  uint32_t slots_used = 0;
  uint64_t kv_tokens_used = 0;
  uint32_t requests_active = 0, requests_queued = 0;
  uint64_t requests_done = 0, requests_failed = 0, prompt_tokens = 0, generated_tokens = 0, replays = 0;
  double decode_tokens_per_second = 0;
  double step_compute_us = 0, step_overhead_us = 0;
  PrefixCacheStats cache;
  uint64_t cached_tokens = 0;  // tokens held in cached (evictable) blocks
};

class Scheduler {
 public:
  // `stages` in pipeline order, borrowed; `tokenizer` too.
  Scheduler(SchedulerOptions options, const Tokenizer& tokenizer, ChatFormatter chat, SchedulerHost& host,
            std::vector<StagePort*> stages);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates and tokenizes a request and queues it; its tokens and end arrive on `stream`. Bad input
  // (kInvalidArgument), a prompt the context cannot hold (kOutOfRange) and a full queue (kOverloaded)
  // are returned here and nothing is queued.
  Status enqueue(GenerateParams params, std::shared_ptr<GenerationStream> stream);
  // The checks enqueue() makes before it tokenizes (sampling values, stop strings, room in the queue):
  // the daemon makes them first, so a full queue answers OVERLOADED without tokenizing anything.
  Status admit(const GenerateParams& params) const;
  // The text a prompt or chat request tokenizes to (the messages through the model's chat template).
  Result<std::string> prompt_text(const GenerateParams& params) const;
  // kOverloaded when the queue is full, or `client` holds its share of it.
  Status queue_room(const std::string& client) const;
  // Queues steps until every worker has its share in flight; also admits queued requests and lets
  // cancelled ones go. Call after anything that may free or need a worker.
  void schedule();

  // A stage's worker signalled completions: read them all.
  void on_completion(size_t stage);
  // A stage's worker is gone: the steps in flight are abandoned (the other stages' answers to them are
  // dropped).
  void stage_lost(size_t stage);
  // Its replacement is coming: every sequence starts again from position 0 (its tokens so far are kept,
  // nothing is streamed twice); one replayed more than kMaxReplays times fails with DISCONNECTED.
  void replay(const std::string& why);
  // Fails every request, queued or active, with `why`.
  void fail_all(const Status& why);
  // No further steps (a failed model, a shutdown); requests are failed by fail_all.
  void stop() { stopped_ = true; }

  SchedulerStats stats() const;
  // Requests holding a slot or waiting for one (what stats() counts as active + queued), without the rest.
  size_t in_flight() const { return active_.size() + queue_.size(); }
  size_t steps_in_flight() const { return steps_.size(); }
  // Steps a stage answered, and the tokens of those its answer counted for (not abandoned).
  uint64_t stage_steps(size_t stage) const { return stages_[stage].steps; }
  uint64_t stage_tokens(size_t stage) const { return stages_[stage].tokens; }

 private:
  struct Sequence;
  struct StepEntry {
    uint64_t seq;
    uint32_t chunk;
    bool want;
    bool embedding;  // want: an embedding, not a token
  };
  // What a completion brought one entry of its step.
  struct Answer {
    int32_t token = -1;
    int32_t output = -1;      // index in the completion's outputs
    size_t embd_offset = 0;   // embedding: its first float in the completion
  };
  struct Step {
    uint64_t id = 0;
    std::vector<StepEntry> entries;  // in the submission's seq order
    uint32_t n_tokens = 0;
    SchedulerClock::time_point submitted;
  };
  struct StageState {
    std::deque<uint64_t> in_flight;  // ids of the steps this stage was given and has not answered
    uint64_t steps = 0, tokens = 0;
  };

  size_t depth() const;
  std::deque<std::unique_ptr<Sequence>>::iterator next_admitted();
  bool continues_after_pending(const Sequence& s) const;
  bool schedule_one();
  bool submit_to(size_t stage);
  void arm_hang_detector();
  void restart_sequences();
  // KV blocks: a sequence (re)starting takes the longest cached prefix of its tokens; one that goes on
  // gets blocks for the positions a step writes (false: the step has no room for its table); its full
  // blocks are published as steps complete; its blocks are released when it ends or restarts.
  void take_prefix(Sequence& s);
  bool reserve_blocks(Sequence& s, size_t end, ipc::Submission& sub);
  void publish_blocks(Sequence& s);
  void release_blocks(Sequence& s);
  // A sequence that ends (finished, failed, cancelled) frees its slot and its blocks.
  void leave_slot(Sequence& s);
  void accept_token(Sequence& s, int32_t token, SchedulerClock::time_point now, TokenLogprobs* logprobs);
  void accept_embedding(Sequence& s, std::span<const float> embedding, SchedulerClock::time_point now);
  TokenLogprob token_logprob(int32_t token, float logprob) const;
  void finish(uint64_t id, FinishReason reason);
  void fail_sequence(uint64_t id, const Status& why);

  SchedulerOptions opt_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // the hang detector's callback checks it
  const Tokenizer& tokenizer_;
  ChatFormatter chat_;
  SchedulerHost& host_;
  std::vector<StagePort*> ports_;
  std::vector<StageState> stages_;
  bool stopped_ = false;

  std::deque<std::unique_ptr<Sequence>> queue_;
  std::map<uint64_t, std::unique_ptr<Sequence>> active_;
  std::vector<uint64_t> slots_;  // sequence id per KV slot, 0 = free
  PrefixCache cache_;
  std::deque<Step> steps_;       // in flight, oldest first; at most depth()
  std::unique_ptr<ipc::Submission> submission_;  // the newest step, as sent to each stage
  uint64_t next_seq_id_ = 0, next_step_id_ = 0;
  std::pair<size_t, uint64_t> timed_{0, 0};  // the stage and step the hang detector times
  SchedulerClock::time_point last_completion_;
  uint64_t step_compute_ns_ = 0, step_wall_ns_ = 0, timed_steps_ = 0;  // for the IPC overhead figure
  uint64_t requests_done_ = 0, requests_failed_ = 0, prompt_tokens_ = 0, generated_tokens_ = 0, replays_ = 0;
  uint64_t requests_cancelled_ = 0;
  Histogram ttft_ = ttft_histogram();
  Histogram token_latency_ = token_latency_histogram();
  std::deque<std::pair<SchedulerClock::time_point, uint32_t>> rate_;
};

}  // namespace inferd::daemon
