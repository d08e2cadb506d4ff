#include "step_logic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

namespace inferd::worker {
namespace {

constexpr int32_t kVocab = 8;

struct FakeSlots {
  std::vector<int32_t> length = std::vector<int32_t>(4, 0);
  std::vector<int> cleared;
  struct Assigned {
    int32_t slot;
    std::vector<int32_t> blocks;
    int32_t length;
    bool operator==(const Assigned&) const = default;
  };
  std::vector<Assigned> assigned;
  StepLogic::Slots slots() {
    return {[this](int32_t s) { return length[static_cast<size_t>(s)]; },
            [this](int32_t s) {
              cleared.push_back(s);
              length[static_cast<size_t>(s)] = 0;
            },
            [this](int32_t s, std::span<const int32_t> blocks, int32_t len) {
              assigned.push_back({s, std::vector<int32_t>(blocks.begin(), blocks.end()), len});
              length[static_cast<size_t>(s)] = len;
              return Status::ok();
            }};
  }
};

// A submission of one sequence in `slot` with tokens at positions [pos, pos + n).
std::unique_ptr<ipc::Submission> one_seq(uint32_t slot, int32_t pos, uint32_t n, float temperature = 0.0f) {
  auto sub = std::make_unique<ipc::Submission>();
  sub->id = 1;
  sub->n_seqs = 1;
  sub->seqs[0] = {};
  sub->seqs[0].slot = slot;
  sub->seqs[0].flags = ipc::kSeqWantToken;
  sub->seqs[0].seed = 42;
  sub->seqs[0].temperature = temperature;
  sub->seqs[0].top_k = 40;
  sub->seqs[0].top_p = 1.0f;
  sub->seqs[0].min_p = 0.0f;
  sub->seqs[0].repeat_penalty = 1.0f;
  sub->seqs[0].repeat_last_n = 64;
  sub->n_tokens = n;
  for (uint32_t i = 0; i < n; ++i) sub->tokens[i] = {static_cast<int32_t>(i % kVocab), pos + static_cast<int32_t>(i), 0};
  return sub;
}

StepLogic make() { return StepLogic({4, 16, 32, kVocab}, true); }

TEST(StepLogic, BuildsTheBatchAndSamplesTheLastTokenOfEachSequence) {
  StepLogic logic = make();
  FakeSlots fs;
  auto sub = one_seq(2, 0, 3);
  ASSERT_TRUE(logic.begin(*sub, fs.slots()).is_ok());
  EXPECT_EQ(fs.cleared, std::vector<int>{2});  // position 0: the slot starts afresh
  ASSERT_EQ(logic.batch().size(), 3u);
  EXPECT_FALSE(logic.batch()[0].logits);
  EXPECT_TRUE(logic.batch()[2].logits);
  EXPECT_EQ(logic.batch()[1].slot, 2);
  std::vector<float> logits(kVocab, 0.0f);
  logits[5] = 3.0f;
  ipc::Completion out{};
  logic.sample(*sub, logits, {}, out);
  ASSERT_EQ(out.n_outputs, 1u);
  EXPECT_EQ(out.outputs[0].seq, 0u);
  EXPECT_EQ(out.outputs[0].token, 5);  // greedy
}

// A vocabulary smaller than the embedding (padded rows): the sampler never picks a padded row, however
// large its logit.
TEST(StepLogic, NeverSamplesPastTheVocabulary) {
  StepLogic logic({4, 16, 32, kVocab, kVocab - 3}, true);
  EXPECT_EQ(logic.sample_vocab(), kVocab - 3);
  FakeSlots fs;
  for (float temperature : {0.0f, 1.5f}) {
    auto sub = one_seq(1, 0, 2, temperature);
    ASSERT_TRUE(logic.begin(*sub, fs.slots()).is_ok());
    std::vector<float> logits(kVocab, 0.0f);
    logits[kVocab - 1] = 50.0f;  // a padded row
    logits[2] = 1.0f;
    ipc::Completion out{};
    logic.sample(*sub, logits, {}, out);
    ASSERT_EQ(out.n_outputs, 1u);
    EXPECT_LT(out.outputs[0].token, kVocab - 3) << "temperature " << temperature;
    if (temperature == 0.0f) {
      EXPECT_EQ(out.outputs[0].token, 2);
    }
  }
}

// Log-probabilities are the log-softmax of the raw logits over the vocabulary the sampler may pick:
// the sampled token's, and the n best (ties: the lower id first), most likely first.
TEST(StepLogic, ReportsLogprobsOfTheSampledTokenAndTheBestAlternatives) {
  StepLogic logic({4, 16, 32, kVocab, kVocab - 1}, true);  // the last row is padding
  FakeSlots fs;
  auto sub = one_seq(0, 0, 2);
  sub->seqs[0].flags |= ipc::kSeqWantLogprobs;
  sub->seqs[0].top_logprobs = 3;
  sub->seqs[0].repeat_penalty = 1.5f;  // penalties change the draw, not the reported distribution
  ASSERT_TRUE(logic.begin(*sub, fs.slots()).is_ok());
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, std::nanf(""), 0.0f, 99.0f};
  double z = 0;
  for (int i = 0; i < kVocab - 1; ++i) z += std::isnan(logits[i]) ? 0.0 : std::exp(static_cast<double>(logits[i]));
  auto lp = [&](int i) { return static_cast<float>(logits[i] - std::log(z)); };
  ipc::Completion out{};
  logic.sample(*sub, logits, {}, out);
  ASSERT_EQ(out.n_outputs, 1u);
  const ipc::StepOutput& o = out.outputs[0];
  EXPECT_EQ(o.token, 3);  // greedy on the penalized logits: token 1 was in the prompt, so 3 wins
  EXPECT_NEAR(o.logprob, lp(3), 1e-6);
  ASSERT_EQ(o.n_top, 3u);
  EXPECT_EQ(out.top[0][0].token, 1);  // 1 and 3 tie: the lower id first
  EXPECT_EQ(out.top[0][1].token, 3);
  EXPECT_EQ(out.top[0][2].token, 4);
  EXPECT_NEAR(out.top[0][0].logprob, lp(1), 1e-6);
  EXPECT_NEAR(out.top[0][2].logprob, lp(4), 1e-6);
  // Asked for none: only the sampled token's.
  auto again = one_seq(1, 0, 1);
  again->seqs[0].flags |= ipc::kSeqWantLogprobs;
  ASSERT_TRUE(logic.begin(*again, fs.slots()).is_ok());
  ipc::Completion out2{};
  logic.sample(*again, logits, {}, out2);
  EXPECT_EQ(out2.outputs[0].n_top, 0u);
  EXPECT_NEAR(out2.outputs[0].logprob, lp(1), 1e-6);
}

// An embedding: the row's hidden state (n_embd floats) goes into the completion instead of a token, and
// the sequence samples nothing.
TEST(StepLogic, AnEmbeddingIsTheRowsHiddenStateInsteadOfAToken) {
  constexpr int32_t kEmbd = 3;
  StepLogic logic({4, 16, 32, kVocab, 0, kEmbd}, true);
  FakeSlots fs;
  auto sub = std::make_unique<ipc::Submission>(*one_seq(0, 0, 2));
  sub->n_seqs = 2;
  sub->seqs[1] = sub->seqs[0];
  sub->seqs[1].slot = 1;
  sub->seqs[0].flags |= ipc::kSeqWantEmbedding;
  sub->tokens[2] = {4, 0, 1};
  sub->n_tokens = 3;
  ASSERT_TRUE(logic.begin(*sub, fs.slots()).is_ok());
  std::vector<float> logits(2 * kVocab, 0.0f);
  logits[kVocab + 6] = 1.0f;
  const std::vector<float> embd = {1, 2, 3, 4, 5, 6};
  ipc::Completion out{};
  logic.sample(*sub, logits, embd, out);
  ASSERT_EQ(out.n_outputs, 2u);
  EXPECT_EQ(out.outputs[0].token, ipc::kTokenEmbedding);
  EXPECT_EQ(out.outputs[1].token, 6);
  ASSERT_EQ(out.n_embd_floats, 3u);
  EXPECT_EQ(std::vector<float>(out.embd, out.embd + 3), (std::vector<float>{1, 2, 3}));
  // A step asking for more embeddings than a completion holds is refused.
  StepLogic wide({4, 16, 32, kVocab, 0, static_cast<int32_t>(ipc::kMaxEmbdFloats)}, true);
  sub->seqs[1].flags |= ipc::kSeqWantEmbedding;
  const Status st = wide.begin(*sub, fs.slots());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("embeddings need"), std::string::npos) << st.to_string();
  // More alternatives than the completion holds is a malformed submission.
  auto many = one_seq(0, 0, 1);
  many->seqs[0].flags |= ipc::kSeqWantLogprobs;
  many->seqs[0].top_logprobs = ipc::kMaxTopLogprobs + 1;
  EXPECT_EQ(logic.begin(*many, fs.slots()).code(), Code::kInvalidArgument);
}

TEST(StepLogic, MalformedSubmissionsAreErrorsNotCrashes) {
  struct Case {
    const char* what;
    void (*damage)(ipc::Submission&);
    Code code;
  };
  const Case cases[] = {
      {"no sequences", [](ipc::Submission& s) { s.n_seqs = 0; }, Code::kInvalidArgument},
      {"too many sequences", [](ipc::Submission& s) { s.n_seqs = ipc::kMaxStepSeqs + 1; }, Code::kInvalidArgument},
      {"no tokens", [](ipc::Submission& s) { s.n_tokens = 0; }, Code::kInvalidArgument},
      {"more tokens than a pass", [](ipc::Submission& s) { s.n_tokens = 17; }, Code::kInvalidArgument},
      {"slot out of range", [](ipc::Submission& s) { s.seqs[0].slot = 4; }, Code::kInvalidArgument},
      {"token names a missing sequence", [](ipc::Submission& s) { s.tokens[1].seq = 3; }, Code::kInvalidArgument},
      {"token id out of the vocabulary", [](ipc::Submission& s) { s.tokens[0].token = kVocab; }, Code::kInvalidArgument},
      {"negative token id", [](ipc::Submission& s) { s.tokens[0].token = -2; }, Code::kInvalidArgument},
      {"the sampled token at position 0", [](ipc::Submission& s) { s.tokens[0].token = ipc::kTokenSampled; },
       Code::kInvalidArgument},
      {"positions not consecutive", [](ipc::Submission& s) { s.tokens[2].pos = 7; }, Code::kInvalidArgument},
      {"continues past the slot's length", [](ipc::Submission& s) { for (uint32_t i = 0; i < s.n_tokens; ++i) s.tokens[i].pos += 5; },
       Code::kInvalidArgument},
      {"invalid sampling", [](ipc::Submission& s) { s.seqs[0].temperature = std::nanf(""); }, Code::kInvalidArgument},
  };
  for (const Case& c : cases) {
    StepLogic logic = make();
    FakeSlots fs;
    auto sub = one_seq(1, 0, 3);
    c.damage(*sub);
    Status st = logic.begin(*sub, fs.slots());
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st.to_string();
  }
  // A slot used twice in one step.
  StepLogic logic = make();
  FakeSlots fs;
  auto sub = one_seq(1, 0, 2);
  sub->n_seqs = 2;
  sub->seqs[1] = sub->seqs[0];
  sub->tokens[1].seq = 1;
  EXPECT_EQ(logic.begin(*sub, fs.slots()).code(), Code::kInvalidArgument);
}

TEST(StepLogic, ContextEndAndUnstartedSlots) {
  StepLogic logic = make();
  FakeSlots fs;
  fs.length[0] = 31;
  auto full = one_seq(0, 31, 2);  // positions 31 and 32 in a 32-token context
  EXPECT_EQ(logic.begin(*full, fs.slots()).code(), Code::kOutOfRange);
  fs.length[3] = 4;
  auto cont = one_seq(3, 4, 1);  // continuing a slot whose sequence this worker never started
  EXPECT_EQ(logic.begin(*cont, fs.slots()).code(), Code::kInvalidArgument);
}

// A step queued ahead names its input ipc::kTokenSampled: the worker feeds the token the slot sampled
// last, once; anything else that names it is refused.
TEST(StepLogic, StepsAheadFeedTheTokenTheSlotSampledLast) {
  StepLogic logic = make();
  FakeSlots fs;
  std::vector<float> logits(kVocab, 0.0f);
  logits[6] = 1.0f;
  auto ahead = one_seq(1, 3, 1);
  ahead->tokens[0].token = ipc::kTokenSampled;
  fs.length[1] = 3;
  EXPECT_EQ(logic.begin(*ahead, fs.slots()).code(), Code::kInvalidArgument);  // nothing sampled yet

  auto prompt = one_seq(1, 0, 3);
  ASSERT_TRUE(logic.begin(*prompt, fs.slots()).is_ok());
  ipc::Completion out{};
  logic.sample(*prompt, logits, {}, out);
  ASSERT_EQ(out.outputs[0].token, 6);
  fs.length[1] = 3;
  ASSERT_TRUE(logic.begin(*ahead, fs.slots()).is_ok());
  ASSERT_EQ(logic.batch().size(), 1u);
  EXPECT_EQ(logic.batch()[0].token, 6);
  EXPECT_EQ(logic.batch()[0].pos, 3);
  logic.sample(*ahead, logits, {}, out);  // samples the next one
  ASSERT_TRUE(logic.begin(*ahead, fs.slots()).is_ok());
  EXPECT_EQ(logic.begin(*ahead, fs.slots()).code(), Code::kInvalidArgument);  // fed once only

  // Only a sequence's first token in a step can be the sampled one.
  logic.sample(*ahead, logits, {}, out);
  auto second = one_seq(1, 3, 2);
  second->tokens[1].token = ipc::kTokenSampled;
  EXPECT_EQ(logic.begin(*second, fs.slots()).code(), Code::kInvalidArgument);
  // A sequence restarted at position 0 forgets what its slot sampled.
  ASSERT_TRUE(logic.begin(*prompt, fs.slots()).is_ok());
  fs.length[1] = 3;
  EXPECT_EQ(logic.begin(*ahead, fs.slots()).code(), Code::kInvalidArgument);

  // A pipeline stage before the last samples nothing, so it has nothing to continue from.
  StepLogic stage({4, 16, 32, kVocab}, false);
  ASSERT_TRUE(stage.begin(*prompt, fs.slots()).is_ok());
  fs.length[1] = 3;
  EXPECT_EQ(stage.begin(*ahead, fs.slots()).code(), Code::kInvalidArgument);
}

// A sequence restarted with n_sampled = k draws what the uninterrupted sampler drew at draw k.
TEST(StepLogic, ReplayedSequenceResumesItsRandomDraws) {
  std::vector<float> logits(kVocab);
  for (int i = 0; i < kVocab; ++i) logits[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i);
  FakeSlots fs;
  StepLogic a = make();
  auto first = one_seq(0, 0, 1, 0.9f);
  ASSERT_TRUE(a.begin(*first, fs.slots()).is_ok());
  std::vector<int32_t> drawn;
  for (int k = 0; k < 6; ++k) {
    auto sub = one_seq(0, k, 1, 0.9f);
    sub->tokens[0].token = 3;
    fs.length[0] = k;
    ASSERT_TRUE(a.begin(*sub, fs.slots()).is_ok());
    ipc::Completion out{};
    a.sample(*sub, logits, {}, out);
    drawn.push_back(out.outputs[0].token);
  }
  // Replay: the same 4 tokens from position 0 in one step, sampler skipped by 3 draws.
  StepLogic b = make();
  FakeSlots fb;
  auto replay = one_seq(0, 0, 4, 0.9f);
  for (uint32_t i = 0; i < 4; ++i) replay->tokens[i].token = 3;
  replay->seqs[0].n_sampled = 3;
  ASSERT_TRUE(b.begin(*replay, fb.slots()).is_ok());
  ipc::Completion out{};
  b.sample(*replay, logits, {}, out);
  EXPECT_EQ(out.outputs[0].token, drawn[3]);
}

// A step names each sequence's KV blocks; a fresh sequence (kSeqFresh) starts after its cached prefix,
// a continuing one keeps its length. Blocks a step does not hold, or positions past them, are refused.
TEST(StepLogic, SlotsGetTheBlocksTheStepNamesAndFreshSequencesStartAfterTheirCachedPrefix) {
  StepLogic logic = StepLogic({4, 16, 256, kVocab}, true);
  FakeSlots fs;
  auto sub = one_seq(1, 128, 3);
  sub->seqs[0].flags |= ipc::kSeqFresh;
  sub->n_blocks = 4;
  sub->blocks[0] = 9;  // another sequence's
  sub->blocks[1] = 7;
  sub->blocks[2] = 5;
  sub->blocks[3] = 3;
  sub->seqs[0].first_block = 1;
  sub->seqs[0].n_blocks = 3;
  ASSERT_TRUE(logic.begin(*sub, fs.slots()).is_ok());
  ASSERT_EQ(fs.assigned.size(), 1u);
  EXPECT_EQ(fs.assigned[0], (FakeSlots::Assigned{1, {7, 5, 3}, 128}));
  EXPECT_TRUE(fs.cleared.empty());
  EXPECT_EQ(logic.batch()[0].pos, 128);

  // Continuing: the slot keeps its length (the fake's 128) and gets the (same or longer) table.
  auto next = one_seq(1, 128, 2);
  next->n_blocks = 3;
  next->blocks[0] = 7;
  next->blocks[1] = 5;
  next->blocks[2] = 3;
  next->seqs[0].n_blocks = 3;
  fs.assigned.clear();
  ASSERT_TRUE(logic.begin(*next, fs.slots()).is_ok());
  EXPECT_EQ(fs.assigned[0], (FakeSlots::Assigned{1, {7, 5, 3}, 128}));

  auto refused = [&](ipc::Submission& bad) { return logic.begin(bad, fs.slots()).code() == Code::kInvalidArgument; };
  auto past = one_seq(1, 190, 3);  // positions 190..192, but 3 blocks hold 0..191
  past->seqs[0].flags |= ipc::kSeqFresh;
  past->n_blocks = 3;
  past->seqs[0].n_blocks = 3;
  EXPECT_TRUE(refused(*past));
  auto outside = one_seq(1, 0, 1);
  outside->n_blocks = 2;
  outside->seqs[0].first_block = 1;
  outside->seqs[0].n_blocks = 2;  // blocks[1..3) of 2
  EXPECT_TRUE(refused(*outside));
  auto no_blocks = one_seq(1, 64, 1);  // fresh after a prefix, but no blocks to hold it
  no_blocks->seqs[0].flags |= ipc::kSeqFresh;
  EXPECT_TRUE(refused(*no_blocks));
  auto sampled = one_seq(1, 64, 1);  // a fresh sequence has no sampled token to continue from
  sampled->seqs[0].flags |= ipc::kSeqFresh;
  sampled->n_blocks = 2;
  sampled->seqs[0].n_blocks = 2;
  sampled->tokens[0].token = ipc::kTokenSampled;
  EXPECT_TRUE(refused(*sampled));
}

}  // namespace
}  // namespace inferd::worker
