// Engine tests on the real default model: the two matmul paths, continuous batching across slots and
// mask padding must all give the same logits as the plain one-sequence evaluation; bad batches fail
// with clear errors.
#include "inferd/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "inferd/gguf.h"
#include "inferd/weight_layout.h"

namespace inferd {
namespace {

const char* kModel = INFERD_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "model not found: " << kModel << " (run scripts/setup.sh)";
    auto m = Model::open(kModel);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = m.value();
  }
  std::unique_ptr<Engine> make(int n_slots = 1, int n_threads = 2, int n_ctx = 512) {
    EngineOptions o;
    o.n_slots = n_slots;
    o.n_threads = n_threads;
    o.n_ctx = n_ctx;
    auto e = Engine::create(model_, o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return std::move(e).value();
  }
  std::shared_ptr<const Model> model_;
};

// Tokens of "The quick brown fox jumps over the lazy dog. The capital of France is" in SmolLM2's vocab.
const std::vector<int32_t> kPrompt = {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 378, 3575, 282, 4649, 314};

int argmax(std::span<const float> v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST_F(EngineTest, PrefillEqualsTokenByToken) {
  auto a = make();
  auto b = make();
  auto all = a->eval(0, kPrompt, /*all_logits=*/true);
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  const size_t nv = static_cast<size_t>(a->n_vocab());
  std::vector<float> prefill(all->begin(), all->end());
  EXPECT_EQ(a->stats().gemm_passes, 1);
  for (size_t i = 0; i < kPrompt.size(); ++i) {
    auto r = b->eval(0, std::span<const int32_t>(&kPrompt[i], 1));
    ASSERT_TRUE(r.is_ok());
    std::span<const float> p(prefill.data() + i * nv, nv);
    EXPECT_LT(max_abs_diff(*r, p), 2e-3f) << "position " << i;
    EXPECT_EQ(argmax(*r), argmax(p)) << "position " << i;
  }
  EXPECT_EQ(b->stats().gemv_passes, static_cast<int64_t>(kPrompt.size()));
  // " Paris" is the answer a working model gives.
  EXPECT_EQ(argmax(std::span<const float>(prefill.data() + (kPrompt.size() - 1) * nv, nv)), 7042);
}

TEST_F(EngineTest, BothMatmulPathsAgree) {
  auto a = make();
  auto b = make();
  const MatmulPath gemv = MatmulPath::kGemv;
  b->force_matmul_path(&gemv);
  auto ra = a->eval(0, kPrompt);
  ASSERT_TRUE(ra.is_ok());
  std::vector<float> la(ra->begin(), ra->end());
  auto rb = b->eval(0, kPrompt);
  ASSERT_TRUE(rb.is_ok());
  EXPECT_LT(max_abs_diff(la, *rb), 2e-3f);
}

TEST_F(EngineTest, ContinuousBatchingMatchesSeparateRuns) {
  auto solo = make(1);
  std::vector<std::vector<float>> expected;
  const std::vector<int32_t> other = {19556, 905, 28, 451, 314};  // "Hello world, this is"
  for (const auto* seq : {&kPrompt, &other}) {
    solo->clear_slot(0);
    auto r = solo->eval(0, *seq);
    ASSERT_TRUE(r.is_ok());
    expected.emplace_back(r->begin(), r->end());
  }
  // Two slots: prefill slot 0 except its last token, then feed both sequences token by token in one batch.
  auto eng = make(2);
  ASSERT_TRUE(eng->eval(0, std::span<const int32_t>(kPrompt.data(), kPrompt.size() - other.size())).is_ok());
  std::vector<float> last0, last1;
  for (size_t i = 0; i < other.size(); ++i) {
    const size_t p0 = kPrompt.size() - other.size() + i;
    BatchToken batch[2] = {{kPrompt[p0], 0, static_cast<int32_t>(p0), true},
                           {other[i], 1, static_cast<int32_t>(i), true}};
    auto r = eng->forward(batch);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const size_t nv = static_cast<size_t>(eng->n_vocab());
    last0.assign(r->begin(), r->begin() + static_cast<std::ptrdiff_t>(nv));
    last1.assign(r->begin() + static_cast<std::ptrdiff_t>(nv), r->end());
  }
  EXPECT_LT(max_abs_diff(last0, expected[0]), 2e-3f);
  EXPECT_LT(max_abs_diff(last1, expected[1]), 2e-3f);
}

TEST_F(EngineTest, PlanRebuiltOnlyWhenLengthCrossesPaddingStep) {
  auto eng = make(1, 2, 256);
  std::vector<int32_t> one = {504};
  for (int i = 0; i < 130; ++i) ASSERT_TRUE(eng->eval(0, one).is_ok());
  // Lengths 1..130 with step 64: buckets 64, 128, 192 -> three plans.
  EXPECT_EQ(eng->stats().plan_rebuilds, 3);
  EXPECT_GT(eng->stats().arena_naive_bytes, eng->stats().arena_bytes);
}

TEST_F(EngineTest, BadBatchesAreRejected) {
  auto eng = make(1, 1, 16);
  BatchToken bad_token[1] = {{1 << 30, 0, 0, true}};
  EXPECT_EQ(eng->forward(bad_token).status().code(), Code::kInvalidArgument);
  BatchToken bad_slot[1] = {{1, 3, 0, true}};
  EXPECT_EQ(eng->forward(bad_slot).status().code(), Code::kInvalidArgument);
  BatchToken gap[1] = {{1, 0, 5, true}};
  EXPECT_EQ(eng->forward(gap).status().code(), Code::kInvalidArgument);
  std::vector<int32_t> too_long(17, 504);
  auto r = eng->eval(0, too_long);
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
  EXPECT_NE(r.status().message().find("context"), std::string::npos) << r.status().message();
  EXPECT_EQ(eng->slot_length(0), 0);  // nothing was written
  EXPECT_TRUE(eng->eval(0, std::vector<int32_t>(16, 504)).is_ok());
  EXPECT_EQ(eng->eval(0, std::vector<int32_t>(1, 504)).status().code(), Code::kOutOfRange);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// Two pipeline stages (layers [0, 13) and [13, 30)) chained by their hidden states give the whole
// model's logits bit for bit, in prefill and in decode.
TEST_F(EngineTest, PipelineStagesEqualTheWholeModel) {
  auto whole = make();
  auto stage = [&](int first, int end) {
    EngineOptions o;
    o.n_slots = 1;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.first_layer = first;
    o.end_layer = end;
    auto e = Engine::create(model_, o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return std::move(e).value();
  };
  auto a = stage(0, 13), b = stage(13, 30);
  EXPECT_TRUE(a->is_first_stage() && !a->is_last_stage());
  EXPECT_TRUE(!b->is_first_stage() && b->is_last_stage());
  EXPECT_LT(a->stats().kv_bytes, whole->stats().kv_bytes);

  std::vector<BatchToken> batch;
  for (size_t i = 0; i < kPrompt.size(); ++i) batch.push_back({kPrompt[i], 0, static_cast<int32_t>(i), true});
  auto ref = whole->forward(batch);
  ASSERT_TRUE(ref.is_ok());
  std::vector<float> expect(ref->begin(), ref->end());
  auto h = a->forward(batch);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  ASSERT_EQ(h->size(), kPrompt.size() * static_cast<size_t>(model_->config().n_embd));
  std::vector<float> hidden(h->begin(), h->end());
  auto got = b->forward(batch, hidden);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), expect.size());
  EXPECT_TRUE(std::equal(got->begin(), got->end(), expect.begin())) << "prefill logits differ";

  // One decode step.
  std::vector<BatchToken> one = {{7042, 0, static_cast<int32_t>(kPrompt.size()), true}};
  auto r1 = whole->forward(one);
  ASSERT_TRUE(r1.is_ok());
  std::vector<float> e1(r1->begin(), r1->end());
  auto h1 = a->forward(one);
  ASSERT_TRUE(h1.is_ok());
  std::vector<float> hid1(h1->begin(), h1->end());
  auto g1 = b->forward(one, hid1);
  ASSERT_TRUE(g1.is_ok());
  EXPECT_TRUE(std::equal(g1->begin(), g1->end(), e1.begin())) << "decode logits differ";

  // Misuse is an error value: a later stage without hidden states, a bad layer range.
  EXPECT_EQ(b->forward(one).status().code(), Code::kInvalidArgument);
  EngineOptions bad;
  bad.first_layer = 10;
  bad.end_layer = 40;
  EXPECT_EQ(Engine::create(model_, bad).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// A slot reused after clear_slot() computes exactly what a fresh engine computes: nothing of the
// previous sequence (its K/V rows are still in the cache) may leak into attention.
TEST_F(EngineTest, ReusedSlotEqualsFreshEngine) {
  auto used = make();
  std::vector<int32_t> other;
  for (int i = 0; i < 100; ++i) other.push_back(1000 + (i * 37) % 5000);
  ASSERT_TRUE(used->eval(0, other).is_ok());
  used->clear_slot(0);
  auto fresh = make();
  for (size_t n : {kPrompt.size(), size_t{1}}) {
    std::span<const int32_t> p(kPrompt.data(), n);
    auto a = used->eval(0, p, true);
    ASSERT_TRUE(a.is_ok());
    std::vector<float> va(a->begin(), a->end());
    auto b = fresh->eval(0, p, true);
    ASSERT_TRUE(b.is_ok());
    EXPECT_TRUE(std::equal(va.begin(), va.end(), b->begin())) << n << " tokens";
    used->clear_slot(0);
    fresh->clear_slot(0);
  }
  // Token by token (the decode path) after the reuse as well.
  for (size_t i = 0; i < kPrompt.size(); ++i) {
    auto a = used->eval(0, std::span<const int32_t>(&kPrompt[i], 1));
    ASSERT_TRUE(a.is_ok());
    std::vector<float> va(a->begin(), a->end());
    auto b = fresh->eval(0, std::span<const int32_t>(&kPrompt[i], 1));
    ASSERT_TRUE(b.is_ok());
    EXPECT_TRUE(std::equal(va.begin(), va.end(), b->begin())) << "decode position " << i;
  }
}

// The KV cache is a pool of blocks: a slot whose blocks are scattered over the pool computes what a slot
// with its own run computes, bit for bit; a sequence that starts on another's blocks (a shared prompt
// prefix: set_slot with the prefix's length) computes only the rest and gets the same logits.
TEST_F(EngineTest, ScatteredAndSharedKvBlocksEqualTheSlotsOwnRun) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(kPrompt[static_cast<size_t>(i) % kPrompt.size()] + i % 7);
  auto plain = make(/*n_slots=*/1, 2, /*n_ctx=*/256);
  auto want = plain->eval(0, prompt, /*all_logits=*/true);
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  const std::vector<float> all(want->begin(), want->end());
  const size_t nv = static_cast<size_t>(plain->n_vocab());

  EngineOptions o;
  o.n_slots = 2;
  o.n_threads = 2;
  o.n_ctx = 256;
  o.n_blocks = 12;
  auto e = Engine::create(model_, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  Engine& eng = *e.value();
  const std::vector<int32_t> first = {7, 2, 10};
  ASSERT_TRUE(eng.set_slot(0, first, 0).is_ok());
  auto got = eng.eval(0, prompt, /*all_logits=*/true);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_TRUE(std::equal(all.begin(), all.end(), got->begin()));

  // Slot 1 shares blocks 7 and 2 (positions 0-127) and computes positions 128-149 in block 4.
  const std::vector<int32_t> shared = {7, 2, 4};
  ASSERT_TRUE(eng.set_slot(1, shared, 128).is_ok());
  auto rest = eng.eval(1, std::span<const int32_t>(prompt).subspan(128), /*all_logits=*/true);
  ASSERT_TRUE(rest.is_ok()) << rest.status().to_string();
  EXPECT_TRUE(std::equal(rest->begin(), rest->end(), all.begin() + static_cast<std::ptrdiff_t>(128 * nv)));

  // Bad tables are errors: a block outside the pool, a length its blocks cannot hold, a position past them.
  EXPECT_EQ(eng.set_slot(1, std::vector<int32_t>{12}, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(eng.set_slot(1, std::vector<int32_t>{1}, 65).code(), Code::kInvalidArgument);
  ASSERT_TRUE(eng.set_slot(1, std::vector<int32_t>{1}, 64).is_ok());
  EXPECT_EQ(eng.eval(1, std::span<const int32_t>(prompt).first(1)).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// The gemma3 and qwen3 layouts on the committed synthetic models (tools/reference/make_synthetic_gguf.py):
// gemma3-small has a 128-position sliding window on five of its six layers, Q/K norms, post norms and
// GeGLU; qwen3-small has Q/K norms and 128-wide heads on a 128-wide model (Q is 512 wide); llama3-small has
// Llama 3.1's RoPE frequency factors (rope_freqs.weight).
class ArchTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto m = Model::open(std::string(INFERD_TEST_DATA_DIR) + "/models/" + GetParam());
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = m.value();
  }
  std::unique_ptr<Engine> make(int first = 0, int end = 0) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.first_layer = first;
    o.end_layer = end;
    auto e = Engine::create(model_, o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return std::move(e).value();
  }
  std::shared_ptr<const Model> model_;
};

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 7919 + 13) % 49000 + 17;
  return t;
}

// One prefill of 300 tokens (past gemma3-small's window of 128) equals 300 decode steps, bit for bit:
// the window is applied the same way in both paths.
TEST_P(ArchTest, PrefillEqualsTokenByTokenPastTheWindow) {
  const std::vector<int32_t> tokens = some_tokens(300);
  auto a = make();
  auto b = make();
  auto all = a->eval(0, tokens, /*all_logits=*/true);
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  const size_t nv = static_cast<size_t>(a->n_vocab());
  std::vector<float> prefill(all->begin(), all->end());
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto r = b->eval(0, std::span<const int32_t>(&tokens[i], 1));
    ASSERT_TRUE(r.is_ok());
    ASSERT_TRUE(std::equal(r->begin(), r->end(), prefill.begin() + static_cast<std::ptrdiff_t>(i * nv)))
        << "position " << i;
  }
}

TEST_P(ArchTest, PipelineStagesEqualTheWholeModel) {
  const std::vector<int32_t> tokens = some_tokens(200);
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.push_back({tokens[i], 0, static_cast<int32_t>(i), true});
  auto whole = make();
  auto ref = whole->forward(batch);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  std::vector<float> expect(ref->begin(), ref->end());
  auto a = make(0, 3), b = make(3, 6);
  auto h = a->forward(batch);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  std::vector<float> hidden(h->begin(), h->end());
  auto got = b->forward(batch, hidden);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_TRUE(std::equal(got->begin(), got->end(), expect.begin()));
}

INSTANTIATE_TEST_SUITE_P(SyntheticModels, ArchTest,
                         ::testing::Values("gemma3-small.gguf", "qwen3-small.gguf", "llama3-small.gguf"),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param).substr(0, 5) + "small"; });

TEST(Gemma3Config, ReadFromTheFile) {
  auto m = Model::open(std::string(INFERD_TEST_DATA_DIR) + "/models/gemma3-small.gguf");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_embd_q(), 512);
  EXPECT_EQ(c.ffn_act, FfnActivation::kGeluTanh);
  EXPECT_TRUE(c.qk_norm && c.post_norms && c.tied_output);
  EXPECT_FLOAT_EQ(c.embd_scale, std::sqrt(128.0f));
  // Layers 0-4 slide over 128 positions with RoPE base 10000; layer 5 is global with the file's base.
  for (int l = 0; l < 5; ++l) EXPECT_TRUE(c.layer_swa(l)) << l;
  EXPECT_FALSE(c.layer_swa(5));
  EXPECT_EQ(c.layer_rope_base(0), 10000.0f);
  EXPECT_EQ(c.layer_rope_base(5), 1000000.0f);
  EXPECT_EQ(c.swa_window, 128);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// A model whose matrices are interleaved as a weights segment stores them (WeightLayout::kInterleaved16),
// built in memory from the file: the same GGUF image with every interleavable 2-D matrix permuted.
std::shared_ptr<const Model> interleaved_model(const std::string& path, int* n_interleaved) {
  auto plain = gguf::GgufFile::open(path);
  EXPECT_TRUE(plain) << plain.status().to_string();
  if (!plain) return nullptr;
  const gguf::GgufFile& f = *plain.value();
  struct Aligned {
    uint8_t* p = nullptr;
    ~Aligned() { std::free(p); }
  };
  auto image = std::make_shared<Aligned>();
  image->p = static_cast<uint8_t*>(std::aligned_alloc(64, (f.file_size() + 63) / 64 * 64));
  std::memcpy(image->p, f.data(), f.file_size());
  std::vector<WeightLayout> layouts;
  *n_interleaved = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const bool inter = t.n_dims == 2 && layout_fits(WeightLayout::kInterleaved16, t.type, t.ne[1], t.ne[0]);
    layouts.push_back(inter ? WeightLayout::kInterleaved16 : WeightLayout::kRows);
    if (!inter) continue;
    ++*n_interleaved;
    interleave_groups(t.type, t.ne[0], t.ne[1] / kInterleaveRows, t.data, image->p + (t.data - f.data()));
  }
  auto file = gguf::GgufFile::from_memory(image->p, f.file_size(), path + " (interleaved)", image, layouts);
  EXPECT_TRUE(file) << file.status().to_string();
  if (!file) return nullptr;
  auto model = Model::load(std::shared_ptr<const gguf::GgufFile>(std::move(file).value()));
  EXPECT_TRUE(model) << model.status().to_string();
  return model ? model.value() : nullptr;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Interleaving changes where the bytes are, not one bit of the results: prefill (the GEMM path), decode
// (the GEMV path, token by token and with a batch forced onto it) and the embedding lookup of a tied
// output give the row layout's logits exactly. Covers Q4_1 (the default model), Q4_0 and Q8_0 next to
// K-quants (mixed-small), fused Q|K|V and gate|up matrices split at group boundaries (phi3-small),
// GeGLU (gemma3-small) and Q5_0 next to Q4_K, Q6_K and a tied Q8_0 output (Gemma 3 270M's Q4_K_M file).
TEST(InterleavedWeights, GiveTheRowLayoutsLogitsBitForBit) {
  for (const std::string& path : {std::string(kModel), std::string(INFERD_SOURCE_DIR "/tests/data/models/mixed-small.gguf"),
                                 std::string(INFERD_SOURCE_DIR "/tests/data/models/phi3-small.gguf"),
                                 std::string(INFERD_SOURCE_DIR "/tests/data/models/gemma3-small.gguf"),
                                 std::string(INFERD_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf")}) {
    SCOPED_TRACE(path);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path << " (run scripts/setup.sh)";
    auto rows = Model::open(path);
    ASSERT_TRUE(rows) << rows.status().to_string();
    int n_interleaved = 0;
    std::shared_ptr<const Model> inter = interleaved_model(path, &n_interleaved);
    ASSERT_NE(inter, nullptr);
    EXPECT_GT(n_interleaved, 0);
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 256;
    const MatmulPath gemv = MatmulPath::kGemv;
    for (bool force_gemv : {false, true}) {
      auto a = Engine::create(rows.value(), o);
      auto b = Engine::create(inter, o);
      ASSERT_TRUE(a && b);
      if (force_gemv) {
        a.value()->force_matmul_path(&gemv);
        b.value()->force_matmul_path(&gemv);
      }
      const int32_t n_vocab = a.value()->n_vocab();
      std::vector<int32_t> prompt;
      for (size_t i = 0; i < kPrompt.size(); ++i) prompt.push_back(kPrompt[i] % n_vocab);
      auto la = a.value()->eval(0, prompt, /*all_logits=*/true);
      ASSERT_TRUE(la) << la.status().to_string();
      std::vector<float> want(la->begin(), la->end());
      auto lb = b.value()->eval(0, prompt, /*all_logits=*/true);
      ASSERT_TRUE(lb) << lb.status().to_string();
      EXPECT_TRUE(same_bits(want, *lb)) << "prefill, forced GEMV " << force_gemv;
      for (int32_t tok : {17, 4, 900}) {
        auto da = a.value()->eval(0, std::span<const int32_t>(&tok, 1));
        ASSERT_TRUE(da);
        std::vector<float> d(da->begin(), da->end());
        auto db = b.value()->eval(0, std::span<const int32_t>(&tok, 1));
        ASSERT_TRUE(db);
        EXPECT_TRUE(same_bits(d, *db)) << "decode of " << tok;
      }
    }
  }
}

}  // namespace
}  // namespace inferd
