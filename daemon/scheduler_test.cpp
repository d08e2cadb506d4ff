// The scheduler stepped call by call against fake workers and a manual clock: no processes, no sleeps.
#include "scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "inferd/gguf.h"

namespace inferd::daemon {
namespace {

// A worker as the scheduler sees it: steps it was given (oldest first) and answers the test writes.
class FakeStage final : public StagePort {
 public:
  bool up = true;
  bool killed = false;
  size_t capacity = 4;  // ring entries
  std::deque<ipc::Submission> given;
  std::deque<ipc::Completion> answers;

  bool ready() const override { return up; }
  ipc::Submission* submission_slot() override { return given.size() < capacity ? &slot_ : nullptr; }
  void publish_submission() override { given.push_back(slot_); }
  const ipc::Completion* next_completion() override { return answers.empty() ? nullptr : &answers.front(); }
  void release_completion() override { answers.pop_front(); }
  void kill() override {
    killed = true;
    up = false;
  }
  int pid() const override { return 4242; }

  uint32_t n_embd = 4;  // floats per embedding the fake worker writes

  // Answers the oldest step: token `token + seq` for every sequence that wants one (a last stage), or
  // no tokens (a stage before the last). A sequence that asks for logprobs gets -0.25 and alternatives
  // token + seq + 1, + 2, ... with -1, -2, ...; one that asks for an embedding gets {seq + 3, seq + 4, 0, ...}.
  ipc::Submission answer(int32_t token, bool samples = true) {
    EXPECT_FALSE(given.empty());
    ipc::Submission s = given.front();
    given.pop_front();
    ipc::Completion c{};
    c.id = s.id;
    for (uint32_t i = 0; samples && i < s.n_seqs; ++i) {
      if (!(s.seqs[i].flags & ipc::kSeqWantToken)) continue;
      const uint32_t index = c.n_outputs++;
      ipc::StepOutput& o = c.outputs[index];
      o = {};
      o.seq = i;
      if (s.seqs[i].flags & ipc::kSeqWantEmbedding) {
        o.token = ipc::kTokenEmbedding;
        float* e = c.embd + c.n_embd_floats;
        std::fill(e, e + n_embd, 0.0f);
        e[0] = static_cast<float>(i + 3);
        e[1] = static_cast<float>(i + 4);
        c.n_embd_floats += n_embd;
        continue;
      }
      o.token = token + static_cast<int32_t>(i);
      if (s.seqs[i].flags & ipc::kSeqWantLogprobs) {
        o.logprob = -0.25f;
        o.n_top = s.seqs[i].top_logprobs;
        for (uint32_t k = 0; k < o.n_top; ++k) c.top[index][k] = {o.token + 1 + static_cast<int32_t>(k), -1.0f - k};
      }
    }
    answers.push_back(c);
    return s;
  }
  // Fails the oldest step with `why`.
  void fail(const char* why) {
    ipc::Completion c{};
    c.id = given.front().id;
    given.pop_front();
    c.status = static_cast<int32_t>(Code::kFailed);
    std::snprintf(c.error, sizeof(c.error), "%s", why);
    answers.push_back(c);
  }

 private:
  ipc::Submission slot_{};
};

class ManualHost final : public SchedulerHost {
 public:
  SchedulerClock::time_point t = SchedulerClock::time_point(std::chrono::seconds(1000));
  std::function<void()> timer;
  std::chrono::milliseconds delay{0};

  SchedulerClock::time_point now() const override { return t; }
  void arm_timer(std::chrono::milliseconds d, std::function<void()> fire) override {
    delay = d;
    timer = std::move(fire);
  }
  void fire() {
    ASSERT_TRUE(timer);
    auto f = std::exchange(timer, nullptr);
    t += delay;
    f();
  }
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = gguf::GgufFile::open(INFERD_TEST_DATA_DIR "/models/mixed-small.gguf");
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto tok = Tokenizer::from_gguf(*file.value());
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    tokenizer_ = std::move(tok).value();
  }
  static void TearDownTestSuite() { tokenizer_.reset(); }

  void make(size_t n_stages = 1, uint32_t parallel = 2, uint32_t max_queue = 4, uint32_t steps_in_flight = 2,
            uint32_t client_max_slots = 0) {
    stages_.clear();
    std::vector<StagePort*> ports;
    for (size_t i = 0; i < n_stages; ++i) {
      stages_.push_back(std::make_unique<FakeStage>());
      ports.push_back(stages_.back().get());
    }
    SchedulerOptions o;
    o.model_id = "m";
    o.context_size = context_;
    o.parallel = parallel;
    o.batch_tokens = batch_tokens_;
    o.kv_blocks = kv_blocks_;
    o.max_queue = max_queue;
    o.steps_in_flight = steps_in_flight;
    o.step_timeout = std::chrono::milliseconds(1000);
    o.n_embd = n_embd_;
    o.client_max_slots = client_max_slots;
    for (auto& st : stages_) st->n_embd = n_embd_;
    sched_ = std::make_unique<Scheduler>(o, *tokenizer_, ChatFormatter::builtin(ChatTemplate::kChatml), host_, ports);
  }

  // A request for `prompt` (token ids), `max_tokens` greedy tokens, from `client`.
  std::shared_ptr<GenerationStream> request(std::vector<int32_t> prompt, uint32_t max_tokens, Status* status = nullptr,
                                            std::string client = "") {
    GenerateParams p;
    p.client = std::move(client);
    p.model = "m";
    p.input = GenerateParams::Input::kTokens;
    p.tokens = std::move(prompt);
    p.max_tokens = max_tokens;
    p.ignore_eog = true;
    auto stream = std::make_shared<GenerationStream>();
    Status s = sched_->enqueue(std::move(p), stream);
    if (status) {
      *status = s;
    } else {
      EXPECT_TRUE(s.is_ok()) << s.to_string();
    }
    return stream;
  }

  FakeStage& stage(size_t i = 0) { return *stages_[i]; }

  static std::vector<int32_t> tokens_of(const ipc::Submission& s) {
    std::vector<int32_t> out;
    for (uint32_t i = 0; i < s.n_tokens; ++i) out.push_back(s.tokens[i].token);
    return out;
  }

  // Answers every step until no step is left (each sequence that asks gets token 100 + its index).
  void answer_all() {
    while (!stage().given.empty()) {
      stage().answer(100);
      sched_->on_completion(0);
    }
  }
  // The block ids a submission names for its sequence `seq`.
  static std::vector<int32_t> blocks_of(const ipc::Submission& s, uint32_t seq = 0) {
    return std::vector<int32_t>(s.blocks + s.seqs[seq].first_block, s.blocks + s.seqs[seq].first_block + s.seqs[seq].n_blocks);
  }

  static std::unique_ptr<Tokenizer> tokenizer_;
  uint32_t context_ = 64, batch_tokens_ = 16, kv_blocks_ = 0;
  uint32_t n_embd_ = 4;
  ManualHost host_;
  std::vector<std::unique_ptr<FakeStage>> stages_;
  std::unique_ptr<Scheduler> sched_;
};

std::unique_ptr<Tokenizer> SchedulerTest::tokenizer_;

// An embedding request: the prompt with the last token asking for its embedding, nothing queued ahead,
// and the answer normalized to unit length; it generates no token.
TEST_F(SchedulerTest, AnEmbeddingIsThePromptsLastHiddenStateNormalized) {
  make();
  GenerateParams p;
  p.model = "m";
  p.input = GenerateParams::Input::kTokens;
  p.tokens = {10, 11, 12};
  p.embedding = true;
  auto stream = std::make_shared<GenerationStream>();
  ASSERT_TRUE(sched_->enqueue(p, stream).is_ok());
  ASSERT_EQ(stage().given.size(), 1u);  // no step ahead: an embedding is the one answer
  const ipc::Submission& sub = stage().given[0];
  EXPECT_EQ(sub.seqs[0].flags, ipc::kSeqWantToken | ipc::kSeqWantEmbedding | ipc::kSeqFresh);
  stage().answer(100);
  sched_->on_completion(0);
  GenerationStream::Batch b = stream->take();
  EXPECT_TRUE(b.tokens.empty());
  ASSERT_TRUE(b.end.has_value() && b.end->is_ok());
  EXPECT_EQ(b.end->value().prompt_tokens, 3u);
  EXPECT_EQ(b.end->value().generated_tokens, 0u);
  EXPECT_EQ(b.end->value().embedding, (std::vector<float>{0.6f, 0.8f, 0.0f, 0.0f}));  // {3, 4, 0, 0} / 5
  EXPECT_FALSE(stage().killed);
  EXPECT_TRUE(stage().given.empty());
  // A prompt may fill the whole context (nothing is generated after it); one token more may not.
  p.tokens.assign(64, 5);
  EXPECT_TRUE(sched_->enqueue(p, std::make_shared<GenerationStream>()).is_ok());
  p.tokens.assign(65, 5);
  EXPECT_EQ(sched_->enqueue(p, std::make_shared<GenerationStream>()).code(), Code::kOutOfRange);
}

// A completion holds kMaxEmbdFloats floats: a step asks for at most that many embeddings, the other
// sequences' last token waits for the next step.
TEST_F(SchedulerTest, AStepAsksForNoMoreEmbeddingsThanACompletionHolds) {
  n_embd_ = ipc::kMaxEmbdFloats / 2;
  make(1, /*parallel=*/3, 8);
  std::vector<std::shared_ptr<GenerationStream>> streams;
  stage().up = false;  // all three queued before the first step is built
  for (int i = 0; i < 3; ++i) {
    GenerateParams p;
    p.model = "m";
    p.input = GenerateParams::Input::kTokens;
    p.tokens = {10, 11};
    p.embedding = true;
    streams.push_back(std::make_shared<GenerationStream>());
    ASSERT_TRUE(sched_->enqueue(p, streams.back()).is_ok());
  }
  stage().up = true;
  sched_->schedule();
  ASSERT_GE(stage().given.size(), 1u);
  EXPECT_EQ(stage().given[0].n_seqs, 3u);
  uint32_t asked = 0;
  for (uint32_t i = 0; i < stage().given[0].n_seqs; ++i) asked += (stage().given[0].seqs[i].flags & ipc::kSeqWantEmbedding) != 0;
  EXPECT_EQ(asked, 2u);
  while (!stage().given.empty()) {
    stage().answer(100);
    sched_->on_completion(0);
  }
  for (auto& s : streams) {
    GenerationStream::Batch b = s->take();
    ASSERT_TRUE(b.end.has_value() && b.end->is_ok());
    EXPECT_EQ(b.end->value().embedding.size(), ipc::kMaxEmbdFloats / 2);
  }
  EXPECT_FALSE(stage().killed);
}

// Logprobs travel from the completion to the stream with each token's text; a worker that answers
// an embedding with the wrong number of floats is killed.
TEST_F(SchedulerTest, LogprobsReachTheStreamAndMalformedEmbeddingsKillTheWorker) {
  make();
  GenerateParams p;
  p.model = "m";
  p.input = GenerateParams::Input::kTokens;
  p.tokens = {10, 11};
  p.max_tokens = 1;
  p.ignore_eog = true;
  p.logprobs = 2;
  auto stream = std::make_shared<GenerationStream>();
  ASSERT_TRUE(sched_->enqueue(p, stream).is_ok());
  EXPECT_TRUE(stage().given[0].seqs[0].flags & ipc::kSeqWantLogprobs);
  EXPECT_EQ(stage().given[0].seqs[0].top_logprobs, 2u);
  stage().answer(100);
  sched_->on_completion(0);
  GenerationStream::Batch b = stream->take();
  ASSERT_EQ(b.logprobs.size(), 1u);
  EXPECT_EQ(b.logprobs[0].chosen.token, 100);
  EXPECT_EQ(b.logprobs[0].chosen.logprob, -0.25f);
  EXPECT_EQ(b.logprobs[0].chosen.piece, tokenizer_->token_to_piece(100, false));
  ASSERT_EQ(b.logprobs[0].top.size(), 2u);
  EXPECT_EQ(b.logprobs[0].top[1].token, 102);
  EXPECT_EQ(b.logprobs[0].top[1].logprob, -2.0f);
  // Out-of-range top_logprobs are refused before anything is queued.
  p.logprobs = 21;
  EXPECT_EQ(sched_->enqueue(p, std::make_shared<GenerationStream>()).code(), Code::kInvalidArgument);

  GenerateParams e;
  e.model = "m";
  e.input = GenerateParams::Input::kTokens;
  e.tokens = {10, 11};
  e.embedding = true;
  auto estream = std::make_shared<GenerationStream>();
  ASSERT_TRUE(sched_->enqueue(e, estream).is_ok());
  stage().n_embd = 3;  // one float short
  stage().answer(100);
  sched_->on_completion(0);
  EXPECT_TRUE(stage().killed);
}

// One client holds at most half of the queue (client-max-queue's default); another still gets in.
TEST_F(SchedulerTest, OneClientHoldsAtMostItsShareOfTheQueue) {
  make(1, /*parallel=*/1, /*max_queue=*/4);
  request({10}, 50, nullptr, "uid 1");  // admitted
  request({10}, 50, nullptr, "uid 1");  // queued
  request({10}, 50, nullptr, "uid 1");  // queued: its share (2 of 4)
  Status st;
  request({10}, 50, &st, "uid 1");
  EXPECT_EQ(st.code(), Code::kOverloaded);
  EXPECT_NE(st.message().find("client-max-queue"), std::string::npos) << st.to_string();
  request({10}, 50, &st, "uid 2");
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(sched_->stats().requests_queued, 3u);
}

// A free slot goes to the waiting client holding the fewest slots, not to the oldest request: a client
// that arrives after another has queued many is served next.
TEST_F(SchedulerTest, AFreeSlotGoesToTheWaitingClientHoldingTheFewest) {
  make(1, /*parallel=*/2, /*max_queue=*/8);
  stage().up = false;  // everything queued before the first admission
  auto a1 = request({10}, 2, nullptr, "uid 1");
  auto a2 = request({11}, 2, nullptr, "uid 1");
  auto a3 = request({12}, 2, nullptr, "uid 1");
  auto b1 = request({13}, 2, nullptr, "uid 2");  // the newest
  stage().up = true;
  sched_->schedule();
  EXPECT_EQ(sched_->stats().requests_active, 2u);
  ASSERT_FALSE(stage().given.empty());
  // The first step prefills a1 and b1 (uid 2 held no slot), not a2.
  EXPECT_EQ(tokens_of(stage().given.front()), (std::vector<int32_t>{10, 13}));
  // When a slot frees up, uid 1 and uid 2 hold one each: a2, the oldest, is next.
  std::vector<int32_t> firsts;
  while (!stage().given.empty()) {
    const ipc::Submission s = stage().answer(100);
    for (uint32_t i = 0; i < s.n_tokens; ++i) {
      if (s.tokens[i].pos == 0) firsts.push_back(s.tokens[i].token);
    }
    sched_->on_completion(0);
  }
  EXPECT_EQ(firsts, (std::vector<int32_t>{10, 13, 11, 12}));
  for (auto* s : {&a1, &a2, &a3, &b1}) {
    GenerationStream::Batch b = (*s)->take();
    ASSERT_TRUE(b.end.has_value() && b.end->is_ok());
  }
}

// client-max-slots caps one client's slots even when others are free.
TEST_F(SchedulerTest, ClientMaxSlotsCapsOneClientsSlots) {
  make(1, /*parallel=*/3, /*max_queue=*/8, 2, /*client_max_slots=*/1);
  stage().up = false;
  request({10}, 5, nullptr, "uid 1");
  request({10}, 5, nullptr, "uid 1");
  request({10}, 5, nullptr, "uid 2");
  stage().up = true;
  sched_->schedule();
  EXPECT_EQ(sched_->stats().requests_active, 2u);  // one of uid 1's, uid 2's; a slot stays free
  EXPECT_EQ(sched_->stats().requests_queued, 1u);
}

// A worker whose ring says it is full when the scheduler kept room for the step (a hostile worker wrote
// its submission counter) is killed, not trusted, and the daemon does not abort.
TEST_F(SchedulerTest, ARingWithoutRoomItShouldHaveKillsTheWorker) {
  make();
  stage().capacity = 0;  // what a worker's impossible sub_tail looks like from here
  auto stream = request({10, 11}, 3);
  EXPECT_TRUE(stage().killed);
  sched_->stage_lost(0);
  sched_->replay("killed");
  stage().capacity = 4;
  stage().killed = false;
  stage().up = true;
  sched_->schedule();
  while (!stage().given.empty()) {
    stage().answer(100);
    sched_->on_completion(0);
  }
  GenerationStream::Batch b = stream->take();
  ASSERT_TRUE(b.end.has_value() && b.end->is_ok());
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{100, 100, 100}));
}

// A client that does not take its tokens: past GenerationStream::kMaxBacklogBytes its sequence gets no
// further steps (the others go on); taking the backlog calls the drain callback, and it resumes.
TEST_F(SchedulerTest, ASlowReadersSequenceWaitsForItsClientAndOthersGoOn) {
  make(1, /*parallel=*/2, 4, /*steps_in_flight=*/1);
  auto slow = request({10}, 4);
  auto fast = request({11}, 4);
  bool drained = false;
  slow->set_on_drain([&] { drained = true; });
  slow->push({}, std::string(GenerationStream::kMaxBacklogBytes + 1, 'x'));  // what it has not read
  ASSERT_TRUE(slow->backed_up());
  auto seqs_in = [](const ipc::Submission& s) { return s.n_seqs; };
  // Step 1 was built before the backlog (prefill of both); from then on only `fast` gets steps.
  for (int i = 0; i < 6 && !stage().given.empty(); ++i) {
    const ipc::Submission s = stage().answer(100);
    if (i > 0) {
      EXPECT_EQ(seqs_in(s), 1u) << "step " << i;
    }
    sched_->on_completion(0);
  }
  GenerationStream::Batch f = fast->take();
  ASSERT_TRUE(f.end.has_value() && f.end->is_ok());
  EXPECT_EQ(f.tokens.size(), 4u);
  EXPECT_FALSE(slow->take().text.empty());  // the client reads: its backlog goes
  EXPECT_TRUE(drained);
  sched_->schedule();  // what the drain callback asks for
  while (!stage().given.empty()) {
    stage().answer(100);
    sched_->on_completion(0);
  }
  GenerationStream::Batch b = slow->take();
  ASSERT_TRUE(b.end.has_value() && b.end->is_ok());
  EXPECT_EQ(b.end->value().generated_tokens, 4u);
}

TEST_F(SchedulerTest, APromptIsPrefilledThenDecodedWithAStepQueuedAhead) {
  make();
  auto stream = request({10, 11, 12}, 3);
  // The prompt, and at once the step after it, whose input is the token the worker is sampling.
  ASSERT_EQ(stage().given.size(), 2u);
  const ipc::Submission prefill = stage().given[0];
  EXPECT_EQ(tokens_of(prefill), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(prefill.tokens[0].pos, 0);
  EXPECT_TRUE(prefill.seqs[0].flags & ipc::kSeqWantToken);
  const ipc::Submission ahead = stage().given[1];
  EXPECT_EQ(tokens_of(ahead), std::vector<int32_t>{ipc::kTokenSampled});
  EXPECT_EQ(ahead.tokens[0].pos, 3);
  EXPECT_EQ(ahead.seqs[0].n_sampled, 1u);

  stage().answer(100);
  sched_->on_completion(0);
  EXPECT_EQ(stream->take().tokens, std::vector<int32_t>{100});
  ASSERT_EQ(stage().given.size(), 2u);  // the next step ahead is queued
  stage().answer(101);
  sched_->on_completion(0);
  ASSERT_EQ(stage().given.size(), 1u);  // the third token ends it: nothing queued after it
  stage().answer(102);
  sched_->on_completion(0);
  GenerationStream::Batch b = stream->take();
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{101, 102}));
  ASSERT_TRUE(b.end.has_value());
  ASSERT_TRUE(b.end->is_ok());
  EXPECT_EQ(b.end->value().reason, FinishReason::kMaxTokens);
  EXPECT_EQ(b.end->value().generated_tokens, 3u);
  EXPECT_TRUE(stage().given.empty());
  EXPECT_EQ(sched_->stats().requests_done, 1u);
}

TEST_F(SchedulerTest, ContinuousBatchingDecodesFirstThenPromptChunks) {
  make(1, 2, 4, /*steps_in_flight=*/1);
  auto a = request({1, 2, 3}, 4);
  stage().answer(50);
  auto b = request({4, 5, 6, 7, 8}, 4);  // admitted while a decodes
  sched_->on_completion(0);
  ASSERT_EQ(stage().given.size(), 1u);
  const ipc::Submission s = stage().given.front();
  ASSERT_EQ(s.n_seqs, 2u);
  EXPECT_EQ(tokens_of(s), (std::vector<int32_t>{50, 4, 5, 6, 7, 8}));  // a's decode token, then b's prompt
  EXPECT_EQ(s.seqs[0].slot, 0u);
  EXPECT_EQ(s.seqs[1].slot, 1u);
  EXPECT_EQ(s.tokens[0].pos, 3);
  EXPECT_EQ(s.tokens[1].pos, 0);
}

TEST_F(SchedulerTest, AWorkersDeathReplaysEverySequenceFromPositionZero) {
  make(1, 1, 4, 1);
  auto stream = request({10, 11}, 4);
  stage().answer(100);
  sched_->on_completion(0);
  stage().answer(101);
  sched_->on_completion(0);
  EXPECT_EQ(stream->take().tokens, (std::vector<int32_t>{100, 101}));
  ASSERT_EQ(stage().given.size(), 1u);  // the third token's step, lost with the worker
  stage().up = false;
  stage().given.clear();
  sched_->stage_lost(0);
  sched_->replay("killed by the test");
  stage().up = true;  // the restarted worker
  sched_->schedule();
  ASSERT_EQ(stage().given.size(), 1u);
  const ipc::Submission s = stage().given.front();
  EXPECT_EQ(tokens_of(s), (std::vector<int32_t>{10, 11, 100, 101}));  // prompt + streamed tokens
  EXPECT_EQ(s.tokens[0].pos, 0);
  EXPECT_EQ(s.seqs[0].n_sampled, 2u);  // the sampler resumes after two draws
  stage().answer(102);
  sched_->on_completion(0);
  stage().answer(103);
  sched_->on_completion(0);
  GenerationStream::Batch b = stream->take();
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{102, 103}));  // neither duplicated nor missing
  ASSERT_TRUE(b.end && b.end->is_ok());
  EXPECT_EQ(b.end->value().replays, 1u);
  EXPECT_EQ(sched_->stats().replays, 1u);
}

TEST_F(SchedulerTest, ARequestThatLosesItsWorkerTooOftenFails) {
  make(1, 1, 4, 1);
  auto stream = request({10, 11}, 8);
  for (uint32_t i = 0; i <= kMaxReplays; ++i) {
    stage().given.clear();
    sched_->stage_lost(0);
    sched_->replay("killed by the test");
    sched_->schedule();
  }
  GenerationStream::Batch b = stream->take();
  ASSERT_TRUE(b.end.has_value());
  EXPECT_EQ(b.end->status().code(), Code::kDisconnected);
  EXPECT_NE(b.end->status().message().find("killed by the test"), std::string::npos);
  EXPECT_EQ(sched_->stats().requests_failed, 1u);
}

TEST_F(SchedulerTest, AFailedStepFailsItsRequestsAndTheOthersStartAgain) {
  make(1, 2, 4, 2);
  auto a = request({1, 2}, 4);
  // Two steps in flight for a: the prompt, and the one ahead. The first fails in the worker.
  ASSERT_EQ(stage().given.size(), 2u);
  stage().fail("injected fault");
  sched_->on_completion(0);
  GenerationStream::Batch ea = a->take();
  ASSERT_TRUE(ea.end.has_value());
  EXPECT_EQ(ea.end->status().code(), Code::kFailed);
  EXPECT_NE(ea.end->status().message().find("injected fault"), std::string::npos);
  // The step queued behind it is dropped; a new request runs normally from position 0.
  stage().answer(7);
  sched_->on_completion(0);
  auto b = request({3, 4}, 1);
  ASSERT_FALSE(stage().given.empty());
  EXPECT_EQ(stage().given.back().tokens[0].pos, 0);
  stage().answer(60);
  sched_->on_completion(0);
  GenerationStream::Batch eb = b->take();
  EXPECT_EQ(eb.tokens, std::vector<int32_t>{60});
  ASSERT_TRUE(eb.end && eb.end->is_ok());
}

TEST_F(SchedulerTest, TheHangDetectorKillsAWorkerThatDoesNotAnswer) {
  make(1, 1, 4, 1);
  auto stream = request({1, 2}, 2);
  ASSERT_TRUE(host_.timer);
  EXPECT_EQ(host_.delay, std::chrono::milliseconds(1000));
  host_.fire();
  EXPECT_TRUE(stage().killed);
  // The request in the hung step fails (it may be what hangs the worker); it is not replayed.
  GenerationStream::Batch b = stream->take();
  ASSERT_TRUE(b.end.has_value());
  ASSERT_FALSE(b.end->is_ok());
  EXPECT_NE(b.end->status().message().find("step-timeout"), std::string::npos) << b.end->status().to_string();
}

TEST_F(SchedulerTest, TheHangDetectorLeavesAWorkerThatMovedOn) {
  make(1, 1, 4, 1);
  auto stream = request({1, 2}, 2);
  auto stale = host_.timer;  // armed for the first step
  stage().answer(5);
  sched_->on_completion(0);  // re-armed for the second
  stale();
  EXPECT_FALSE(stage().killed);
}

// Regression: a step abandoned because the one before it failed is still owed by the worker; a worker
// that hangs in it must be killed, not waited for forever.
TEST_F(SchedulerTest, TheHangDetectorKillsAWorkerHungOnAnAbandonedStep) {
  make(1, 1, 4, 2);
  auto a = request({1, 2}, 8);
  ASSERT_EQ(stage().given.size(), 2u);  // the prompt, and the step ahead
  stage().fail("injected fault");
  sched_->on_completion(0);  // a fails; the step ahead is abandoned but still in the worker
  auto b = request({3, 4}, 8);  // a new step goes in behind it
  ASSERT_TRUE(host_.timer);
  host_.fire();  // the worker never answers the abandoned step
  EXPECT_TRUE(stage().killed);
}

TEST_F(SchedulerTest, TheHangDetectorOfAGoneSchedulerDoesNothing) {
  make(1, 1, 4, 1);
  request({1, 2}, 2);
  auto timer = host_.timer;
  FakeStage* s = &stage();
  sched_.reset();
  timer();
  EXPECT_FALSE(s->killed);
}

TEST_F(SchedulerTest, AMalformedAnswerKillsTheWorker) {
  make(1, 1, 4, 1);
  request({1, 2}, 2);
  stage().answer(tokenizer_->n_vocab());  // outside the vocabulary
  sched_->on_completion(0);
  EXPECT_TRUE(stage().killed);

  make(1, 1, 4, 1);
  request({1, 2}, 2);
  ipc::Completion c{};
  c.id = 99;  // a step it was not given
  stage().answers.push_back(c);
  sched_->on_completion(0);
  EXPECT_TRUE(stage().killed);
}

TEST_F(SchedulerTest, AFullQueueIsOverloadedAndBadRequestsAreRefused) {
  make(1, 1, /*max_queue=*/1, 1);
  request({1}, 4);  // active
  request({2}, 4);  // queued
  Status s;
  request({3}, 4, &s);
  EXPECT_EQ(s.code(), Code::kOverloaded);
  request(std::vector<int32_t>(64, 1), 4, &s);
  EXPECT_EQ(s.code(), Code::kOutOfRange);  // no room for a generated token
  request({}, 4, &s);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  request({-1}, 4, &s);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  GenerateParams bad_stop;  // a stop string that is not UTF-8 could match inside a character's bytes
  bad_stop.model = "m";
  bad_stop.input = GenerateParams::Input::kTokens;
  bad_stop.tokens = {5};
  bad_stop.stop.emplace_back("ok");
  bad_stop.stop.emplace_back(1, static_cast<char>(0xBD));
  EXPECT_EQ(sched_->enqueue(bad_stop, std::make_shared<GenerationStream>()).code(), Code::kInvalidArgument);
}

TEST_F(SchedulerTest, ACancelledRequestLeavesAtAStepBoundaryAndFreesItsSlot) {
  make(1, 1, 4, 1);
  auto a = request({1, 2}, 8);
  auto b = request({3, 4}, 1);  // waits for the slot
  a->cancel();
  stage().answer(9);
  sched_->on_completion(0);
  ASSERT_EQ(stage().given.size(), 1u);
  EXPECT_EQ(tokens_of(stage().given.front()), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(stage().given.front().seqs[0].slot, 0u);
}

TEST_F(SchedulerTest, PipelineStagesHandEachStepOn) {
  make(/*n_stages=*/2, 1, 4, 2);
  auto stream = request({1, 2, 3}, 1);
  ASSERT_EQ(stage(0).given.size(), 1u);  // one step at a time through a pipeline
  EXPECT_TRUE(stage(1).given.empty());
  stage(0).answer(0, /*samples=*/false);
  sched_->on_completion(0);
  ASSERT_EQ(stage(1).given.size(), 1u);
  EXPECT_EQ(tokens_of(stage(1).given.front()), (std::vector<int32_t>{1, 2, 3}));
  stage(1).answer(77);
  sched_->on_completion(1);
  GenerationStream::Batch b = stream->take();
  EXPECT_EQ(b.tokens, std::vector<int32_t>{77});
  ASSERT_TRUE(b.end && b.end->is_ok());
  // A stage before the last that samples is broken.
  auto again = request({4}, 1);
  stage(0).answer(5, /*samples=*/true);
  sched_->on_completion(0);
  EXPECT_TRUE(stage(0).killed);
}

// The prefix cache: a request that begins with another's tokens takes that one's published blocks and
// starts after them (kSeqFresh at position 128: two full blocks); one that opts out, or that arrives
// after a worker's death, starts at position 0.
TEST_F(SchedulerTest, ARequestWithACachedPrefixPrefillsOnlyTheRest) {
  context_ = 512;
  batch_tokens_ = 256;
  make(1, 2, 4);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(5 + i % 50);
  auto a = request(prompt, 2);
  ASSERT_FALSE(stage().given.empty());
  const std::vector<int32_t> a_blocks = blocks_of(stage().given[0]);
  ASSERT_EQ(a_blocks.size(), 3u);  // positions 0-149
  EXPECT_EQ(stage().given[0].tokens[0].pos, 0);
  answer_all();
  GenerationStream::Batch ab = a->take();
  ASSERT_TRUE(ab.end.has_value() && ab.end->is_ok());
  EXPECT_EQ(ab.end->value().cached_tokens, 0u);

  std::vector<int32_t> next(prompt.begin(), prompt.begin() + 130);
  next.insert(next.end(), {9, 9, 9});
  auto b = request(next, 1);
  ASSERT_EQ(stage().given.size(), 1u);
  const ipc::Submission& sub = stage().given[0];
  EXPECT_EQ(sub.n_tokens, 5u);  // positions 128-132
  EXPECT_EQ(sub.tokens[0].pos, 128);
  EXPECT_NE(sub.seqs[0].flags & ipc::kSeqFresh, 0u);
  const std::vector<int32_t> b_blocks = blocks_of(sub);
  ASSERT_EQ(b_blocks.size(), 3u);
  EXPECT_EQ(b_blocks[0], a_blocks[0]);  // shared, not copied
  EXPECT_EQ(b_blocks[1], a_blocks[1]);
  answer_all();
  GenerationStream::Batch bb = b->take();
  ASSERT_TRUE(bb.end.has_value() && bb.end->is_ok());
  EXPECT_EQ(bb.end->value().cached_tokens, 128u);
  EXPECT_EQ(bb.end->value().prompt_tokens, 133u);
  const SchedulerStats st = sched_->stats();
  EXPECT_EQ(st.cache.hits, 1u);
  EXPECT_EQ(st.cache.hit_tokens, 128u);
  EXPECT_EQ(st.cache.blocks_used, 0u);
  EXPECT_GE(st.cache.blocks_cached, 2u);

  // Opting out: from position 0, in blocks of its own.
  GenerateParams p;
  p.model = "m";
  p.input = GenerateParams::Input::kTokens;
  p.tokens = next;
  p.max_tokens = 1;
  p.cache_prompt = false;
  auto c = std::make_shared<GenerationStream>();
  ASSERT_TRUE(sched_->enqueue(p, c).is_ok());
  EXPECT_EQ(stage().given[0].tokens[0].pos, 0);
  EXPECT_NE(blocks_of(stage().given[0])[0], a_blocks[0]);
  answer_all();

  // A worker's death takes its KV with it: nothing is found afterwards.
  sched_->stage_lost(0);
  sched_->replay("test");
  EXPECT_EQ(sched_->stats().cache.blocks_cached, 0u);
  auto d = request(next, 1);
  EXPECT_EQ(stage().given[0].tokens[0].pos, 0);
  answer_all();
}

// A sampler with a penalty history must see the window's tokens: they are computed, not taken.
TEST_F(SchedulerTest, APenaltyWindowIsComputedNotTakenFromTheCache) {
  context_ = 512;
  batch_tokens_ = 256;
  make(1, 1, 4);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(5 + i % 50);
  request(prompt, 1);
  answer_all();
  GenerateParams p;
  p.model = "m";
  p.input = GenerateParams::Input::kTokens;
  p.tokens = prompt;
  p.max_tokens = 1;
  p.sampling.repeat_penalty = 1.1f;
  p.sampling.repeat_last_n = 64;
  ASSERT_TRUE(sched_->enqueue(p, std::make_shared<GenerationStream>()).is_ok());
  EXPECT_EQ(stage().given[0].tokens[0].pos, 64);  // 150 - 64 = 86 may be taken: one block
  answer_all();
  p.sampling.repeat_last_n = -1;  // the whole history: nothing is taken
  ASSERT_TRUE(sched_->enqueue(p, std::make_shared<GenerationStream>()).is_ok());
  EXPECT_EQ(stage().given[0].tokens[0].pos, 0);
  answer_all();
}

// The pool is fixed: a request that needs blocks evicts the least recently used cached ones, and the
// tables never name a block outside the pool.
TEST_F(SchedulerTest, CachedBlocksAreEvictedWhenTheBudgetNeedsThem) {
  context_ = 128;  // two blocks per slot
  batch_tokens_ = 256;
  make(1, 1, 4);  // a pool of two blocks
  std::vector<int32_t> a(100, 7), b(100, 8);
  request(a, 1);
  answer_all();
  EXPECT_EQ(sched_->stats().cache.blocks_cached, 1u);
  request(b, 1);
  for (int32_t id : blocks_of(stage().given[0])) EXPECT_TRUE(id == 0 || id == 1);
  answer_all();
  EXPECT_EQ(sched_->stats().cache.evictions, 1u);
  request(a, 1);  // evicted: from position 0
  EXPECT_EQ(stage().given[0].tokens[0].pos, 0);
  answer_all();
  request(a, 1);  // and cached again
  EXPECT_EQ(stage().given[0].tokens[0].pos, 64);
  answer_all();
}

}  // namespace
}  // namespace inferd::daemon
