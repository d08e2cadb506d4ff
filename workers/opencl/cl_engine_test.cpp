// ClEngine on the real default model (SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding), against
// the CPU engine: teacher-forced top-1 agreement over a page of English text, and the engine's own
// consistency — prefill against token-by-token decode and chunked prefill, two slots interleaved in
// one batch against separate runs, and every activation storage against the default one. Skips
// without an OpenCL device or without the model.
//
// With the default exact numerics (ops.h) the OpenCL engine computes the CPU engine's float
// operations in its order, so the logits are the CPU engine's bit for bit: the tests assert equality,
// and print agreement and the largest logit difference ("[cl-engine] ..." lines). The float numerics
// keep activations in float where the CPU engine quantizes them to 8 bits for its matmuls, so their
// logits differ by quantization noise and are compared by teacher-forced top-1 agreement and against
// a float reference instead.
#include "inferd/opencl/cl_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "inferd/engine.h"
#include "inferd/gguf.h"
#include "inferd/kernels/cpu.h"
#include "inferd/kernels/quantize.h"
#include "inferd/tokenizer.h"
#include "inferd/cpu_ops.h"  // the CPU backend's row operations, the reference
#include "test_device.h"
#include "inferd/backend_factory.h"
#include "inferd/kernels/test_weights.h"

namespace inferd {
const BackendFactory& opencl_backend_factory();  // cl_factory.cpp (the worker finds it by name in the registry)
}  // namespace inferd

namespace inferd::opencl {
namespace {

const char* kModel = INFERD_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
const char* kText = INFERD_TEST_DATA_DIR "/text/english.txt";
constexpr int32_t kAgreementTokens = 320;  // >= 256 positions, as issue 5 asks

using Clock = std::chrono::steady_clock;

int argmax(std::span<const float> v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

class ClEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    auto m = Model::open(kModel);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = m.value();
  }
  static void TearDownTestSuite() { model_.reset(); }

  void SetUp() override {
    std::string why;
    if (inferd::opencl::testing::test_runtime(&why) == nullptr) GTEST_SKIP() << "no OpenCL device: " << why;
    if (model_ == nullptr) GTEST_SKIP() << "model not found: " << kModel << " (run scripts/setup.sh)";
  }

  const std::shared_ptr<const Model>& model() const { return model_; }

  // An engine on the test device (INFERD_OPENCL_DEVICE), on its own Runtime. Float activations
  // unless asked otherwise (the thresholds of the float numerics were measured with them; a device
  // with cl_khr_fp16 would otherwise pick halves).
  std::unique_ptr<ClEngine> make(int32_t n_slots = 1, std::optional<StorageType> storage = std::nullopt,
                                 Numerics numerics = Numerics::kExact,
                                 std::optional<DataType> activation_type = DataType::kFloat32) {
    auto rt = testing::new_test_runtime();
    EXPECT_TRUE(rt.is_ok()) << rt.status().to_string();
    if (!rt) return nullptr;
    ClEngineOptions o;
    o.n_ctx = 512;
    o.n_slots = n_slots;
    o.activation_storage = storage;
    o.numerics = numerics;
    o.activation_type = activation_type;
    auto e = ClEngine::create(model(), std::move(rt).value(), o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (!e) return nullptr;
    std::printf("[cl-engine] %s\n", e.value()->describe().c_str());
    return std::move(e).value();
  }

  // The CPU engine's logits of every position of `tokens` (2 threads; empty on a failure, reported).
  std::vector<float> cpu_logits(std::span<const int32_t> tokens, int32_t n_ctx = 512) const {
    EngineOptions co;
    co.n_ctx = n_ctx;
    co.n_threads = 2;
    auto cpu = Engine::create(model(), co);
    EXPECT_TRUE(cpu.is_ok()) << cpu.status().to_string();
    if (!cpu) return {};
    auto logits = cpu.value()->eval(0, tokens, /*all_logits=*/true);
    EXPECT_TRUE(logits.is_ok()) << logits.status().to_string();
    if (!logits) return {};
    return std::vector<float>(logits->begin(), logits->end());
  }

  std::vector<int32_t> text_tokens(size_t n) const {
    std::ifstream in(kText);
    std::stringstream ss;
    ss << in.rdbuf();
    auto tok = Tokenizer::from_gguf(model()->file());
    EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
    if (!tok) return {};
    std::vector<int32_t> ids = tok.value()->encode(ss.str(), /*add_special=*/true, /*parse_special=*/false);
    EXPECT_GE(ids.size(), n) << kText << " is too short";
    ids.resize(std::min(ids.size(), n));
    return ids;
  }

  inline static std::shared_ptr<const Model> model_;  // shared by the suite's tests (loaded once)
};

// The forward pass of one sequence in float on the host, with the OpenCL engine's numerics (float
// activations): weights dequantized exactly, Q, K and V rounded to half, softmax in double. Whole
// sequence at once, layer by layer (each weight row is dequantized once for every token).
std::vector<float> float_reference(const Model& m, std::span<const int32_t> tokens) {
  const ModelConfig& c = m.config();
  const int64_t E = c.n_embd, Ekv = c.n_embd_kv(), hd = c.head_dim;
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto at = [](std::vector<float>& v, int64_t i) -> float& { return v[static_cast<size_t>(i)]; };
  // y[t][r] = W[r] . x[t] (+ bias[r]) for every token; x is n x w.cols, y n x w.rows.
  auto matmul = [&](const WeightView& w, const std::vector<float>& x, std::vector<float>& y, const WeightView* bias) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    y.assign(static_cast<size_t>(n * w.rows), 0.0f);
    const kernels::TypeKernels* tk = kernels::type_kernels(w.type, kernels::Isa::kScalar);
    for (int64_t r = 0; r < w.rows; ++r) {
      tk->to_float(w.row(r), row.data(), w.cols);
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = &x[static_cast<size_t>(t * w.cols)];
        float part[8] = {};
        for (int64_t i = 0; i < w.cols; ++i) part[i % 8] += row[static_cast<size_t>(i)] * xt[i];
        float sum = 0.0f;
        for (float p : part) sum += p;
        at(y, t * w.rows + r) = sum + (bias != nullptr && bias->present() ? bias->f32()[r] : 0.0f);
      }
    }
  };
  auto norm = [&](const std::vector<float>& x, const WeightView& w, std::vector<float>& y) {
    y.resize(x.size());
    for (int64_t t = 0; t < n; ++t) ops::rms_norm(&x[static_cast<size_t>(t * E)], w.f32(), &y[static_cast<size_t>(t * E)], E, c.rms_eps);
  };
  std::vector<float> x(static_cast<size_t>(n * E)), xn, q, k, v, attn(x.size()), o, g, u;
  for (int64_t t = 0; t < n; ++t) {
    kernels::type_kernels(m.token_embd().type, kernels::Isa::kScalar)
        ->to_float(m.token_embd().row(tokens[static_cast<size_t>(t)]), &x[static_cast<size_t>(t * E)], E);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = m.layer(l);
    norm(x, lw.attn_norm, xn);
    matmul(lw.wq, xn, q, &lw.bq);
    matmul(lw.wk, xn, k, &lw.bk);
    matmul(lw.wv, xn, v, &lw.bv);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < c.n_head; ++h) ops::rope_head(&at(q, t * E + h * hd), hd, static_cast<int32_t>(t), c.rope_base, c.rope_style);
      for (int64_t h = 0; h < c.n_head_kv; ++h) ops::rope_head(&at(k, t * Ekv + h * hd), hd, static_cast<int32_t>(t), c.rope_base, c.rope_style);
    }
    for (float& f : q) f = ops::round_fp16(f);
    for (float& f : k) f = ops::round_fp16(f);
    for (float& f : v) f = ops::round_fp16(f);
    const int64_t group = c.n_head / c.n_head_kv;
    std::vector<double> p(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < c.n_head; ++h) {
        const int64_t kvh = h / group;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int64_t i = 0; i < hd; ++i) dot += double{at(q, t * E + h * hd + i)} * at(k, j * Ekv + kvh * hd + i);
          p[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= t; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
        for (int64_t i = 0; i < hd; ++i) {
          double acc = 0.0;
          for (int64_t j = 0; j <= t; ++j) acc += p[static_cast<size_t>(j)] * at(v, j * Ekv + kvh * hd + i);
          at(attn, t * E + h * hd + i) = static_cast<float>(acc / sum);
        }
      }
    }
    matmul(lw.wo, attn, o, nullptr);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    norm(x, lw.ffn_norm, xn);
    matmul(lw.w_gate, xn, g, nullptr);
    matmul(lw.w_up, xn, u, nullptr);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(g[i] / (1.0 + std::exp(-double{g[i]})) * u[i]);
    matmul(lw.w_down, g, o, nullptr);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  norm(x, m.output_norm(), xn);
  std::vector<float> logits;
  matmul(m.output(), xn, logits, nullptr);
  return logits;
}

// The float numerics compute what they mean to compute: a float forward pass on the host with the
// same numerics agrees with them up to float summation order, at every position. (The CPU engine,
// whose 8-bit activations move logits by up to ~1.5, is printed for comparison.)
// Exact numerics reproduce the CPU engine in its default float order (llama.cpp's AVX-512 build). With the other
// order (INFERD_GGML_ORDER=avx2) selected, an exact request runs float numerics and says why.
TEST_F(ClEngineTest, ExactNumericsNeedTheDefaultFloatOrder) {
  struct OrderScope {
    kernels::GgmlOrder saved = kernels::ggml_order();
    OrderScope() { kernels::set_ggml_order(kernels::GgmlOrder::kAvx2); }
    ~OrderScope() { kernels::set_ggml_order(saved); }
  } order;
  auto cl = make(1, std::nullopt, Numerics::kExact);
  ASSERT_NE(cl, nullptr);
  EXPECT_EQ(cl->numerics(), Numerics::kFloat);
  EXPECT_NE(cl->describe().find("INFERD_GGML_ORDER=avx2"), std::string::npos) << cl->describe();
}

TEST_F(ClEngineTest, FloatNumericsMatchAFloatReference) {
  constexpr int32_t kTokens = 64;
  const std::vector<int32_t> tokens = text_tokens(kTokens);
  ASSERT_EQ(tokens.size(), static_cast<size_t>(kTokens));
  const std::vector<float> ref = float_reference(*model(), tokens);
  auto cl = make(1, std::nullopt, Numerics::kFloat);
  ASSERT_NE(cl, nullptr);
  auto got = cl->eval(0, tokens, /*all_logits=*/true);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const std::vector<float> cpu_ref = cpu_logits(tokens, 128);
  ASSERT_FALSE(cpu_ref.empty());
  const size_t nv = static_cast<size_t>(cl->n_vocab());
  int cl_same = 0, cpu_same = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int want = argmax(std::span<const float>(ref).subspan(i * nv, nv));
    cl_same += argmax(got->subspan(i * nv, nv)) == want;
    cpu_same += argmax(std::span<const float>(cpu_ref).subspan(i * nv, nv)) == want;
  }
  const float d_cl = max_abs_diff(got.value(), ref), d_cpu = max_abs_diff(cpu_ref, ref);
  std::printf("[cl-engine] against a float reference over %d positions: OpenCL top-1 %d/%d, max |logit diff| %.2e; "
              "CPU engine top-1 %d/%d, max |logit diff| %.2e\n",
              kTokens, cl_same, kTokens, static_cast<double>(d_cl), cpu_same, kTokens, static_cast<double>(d_cpu));
  EXPECT_LT(d_cl, 5e-2f);
  EXPECT_EQ(cl_same, kTokens);
}

// Issue 5's measure: with the same (teacher-forced) context at every position, how often the OpenCL
// engine's next token is the CPU engine's (>= 99% asked). The CPU engine rounds activations to 8 bits
// before its matmuls, and that rounding is discontinuous: any difference in float summation order
// flips a few roundings and moves logits by tenths, enough to reorder the near-ties a 135M model has
// at a few percent of positions (the float numerics agree at 307 of these 320 positions, 95.9%; the
// CPU engine's own scalar and AVX-512 kernels at 313). So the exact numerics reproduce the CPU
// engine's arithmetic instead, in the order of this process's CPU kernels, and the logits must be
// equal: 100%, max |logit diff| 0. A device that cannot run them (no cl_khr_fp64) runs the float
// numerics, which are held to the floor the float numerics reach (93%).
TEST_F(ClEngineTest, TeacherForcedTop1AgreesWithTheCpuEngine) {
  const std::vector<int32_t> tokens = text_tokens(kAgreementTokens);
  ASSERT_EQ(tokens.size(), static_cast<size_t>(kAgreementTokens));
  const std::vector<float> ref = cpu_logits(tokens);
  ASSERT_FALSE(ref.empty());

  auto cl = make();
  ASSERT_NE(cl, nullptr);
  const auto t0 = Clock::now();
  auto got = cl->eval(0, tokens, /*all_logits=*/true);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  const size_t nv = static_cast<size_t>(cl->n_vocab());
  int agree = 0;
  float max_diff = 0.0f;
  double sum_diff = 0.0;
  int first_disagreement = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::span<const float> a = got->subspan(i * nv, nv), b = std::span<const float>(ref).subspan(i * nv, nv);
    if (argmax(a) == argmax(b)) {
      ++agree;
    } else if (first_disagreement < 0) {
      first_disagreement = static_cast<int>(i);
    }
    const float d = max_abs_diff(a, b);
    max_diff = std::max(max_diff, d);
    sum_diff += d;
  }
  const double agreement = static_cast<double>(agree) / static_cast<double>(tokens.size());
  std::printf("[cl-engine] teacher-forced top-1 agreement with the CPU engine (%s numerics, CPU kernels %s): "
              "%d/%zu = %.2f%%, max |logit diff| %.4g, mean per-position max %.4g, first disagreement at %d; "
              "%zu-token prefill in %.2f s\n",
              numerics_name(cl->numerics()), kernels::isa_name(kernels::best_isa()), agree, tokens.size(),
              100.0 * agreement, static_cast<double>(max_diff), sum_diff / static_cast<double>(tokens.size()),
              first_disagreement, tokens.size(), seconds);
  if (cl->numerics() == Numerics::kExact) {
    EXPECT_GE(agreement, 0.99);
    EXPECT_EQ(max_diff, 0.0f) << "the exact numerics differ from the CPU engine";
  } else {
    EXPECT_GE(agreement, 0.93);
  }
  EXPECT_EQ(cl->stats().prefill_passes, 1);
}

// One pass of 70 tokens (prefill kernels, KV length padded to 128), the same tokens one at a time
// (decode kernels, padding steps 64 then 128) and in chunks of 5, 30 and 35 (reading the cache
// written by earlier passes) give the same logits: exactly with the exact numerics (as the CPU
// engine, whose GEMV and GEMM compute the same bits), up to float summation order with the float
// ones (their decode and prefill matmuls sum in different orders; measured 4e-2 at most over 30
// layers). Both numerics run.
class ClEngineNumericsTest : public ClEngineTest, public ::testing::WithParamInterface<Numerics> {};

// Whether the logits of a token cannot depend on the batch it is in: the exact numerics in the x86
// order. The CPU engine's scalar build (INFERD_ISA=scalar) sums one-token passes in another order
// than larger ones, moving logits by up to ~3, and the exact numerics reproduce that too: the batch
// tests below skip there.
bool batch_invariant(const ClEngine& cl) {
  return cl.numerics() == Numerics::kExact && cl.cpu_order() == CpuOrder::kX86;
}
#define SKIP_IF_SCALAR_EXACT(cl)                                                                    \
  if ((cl).numerics() == Numerics::kExact && !batch_invariant(cl))                                  \
  GTEST_SKIP() << "the exact numerics follow the CPU engine's scalar build, whose one-token passes " \
                  "sum in another order"

TEST_P(ClEngineNumericsTest, PrefillMatchesTokenByTokenAndChunks) {
  const std::vector<int32_t> tokens = text_tokens(70);
  ASSERT_EQ(tokens.size(), 70u);
  auto cl = make(/*n_slots=*/3, std::nullopt, GetParam());
  ASSERT_NE(cl, nullptr);
  SKIP_IF_SCALAR_EXACT(*cl);
  const size_t nv = static_cast<size_t>(cl->n_vocab());

  auto one = cl->eval(0, tokens, /*all_logits=*/true);
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  const std::vector<float> prefill(one->begin(), one->end());

  std::vector<float> stepwise;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto r = cl->eval(1, std::span<const int32_t>(&tokens[i], 1));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    stepwise.insert(stepwise.end(), r->begin(), r->end());
  }
  std::vector<float> chunked;
  size_t at = 0;
  for (size_t n : {5u, 30u, 35u}) {
    auto r = cl->eval(2, std::span<const int32_t>(&tokens[at], n), /*all_logits=*/true);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    chunked.insert(chunked.end(), r->begin(), r->end());
    at += n;
  }
  EXPECT_EQ(cl->slot_length(0), 70);
  EXPECT_EQ(cl->slot_length(1), 70);
  EXPECT_GE(cl->stats().decode_passes, 70);
  // Every kernel of these passes was built side by side before the first pass of its shape ran.
  EXPECT_EQ(cl->stats().kernels_collected, cl->stats().kernels);

  float max_step = 0.0f, max_chunk = 0.0f;
  int same_step = 0, same_chunk = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto p = std::span<const float>(prefill).subspan(i * nv, nv);
    const auto s = std::span<const float>(stepwise).subspan(i * nv, nv);
    const auto c = std::span<const float>(chunked).subspan(i * nv, nv);
    max_step = std::max(max_step, max_abs_diff(p, s));
    max_chunk = std::max(max_chunk, max_abs_diff(p, c));
    same_step += argmax(p) == argmax(s);
    same_chunk += argmax(p) == argmax(c);
  }
  std::printf("[cl-engine] %s numerics, prefill vs token-by-token: max |diff| %.2e, top-1 equal %d/70; vs chunks: "
              "%.2e, %d/70\n",
              numerics_name(cl->numerics()), static_cast<double>(max_step), same_step, static_cast<double>(max_chunk),
              same_chunk);
  if (batch_invariant(*cl)) {
    EXPECT_EQ(max_step, 0.0f);
    EXPECT_EQ(max_chunk, 0.0f);
  }
  EXPECT_LT(max_step, 1e-1f);
  EXPECT_LT(max_chunk, 1e-1f);
  EXPECT_GE(same_step, 69);
  EXPECT_GE(same_chunk, 69);
}

// Continuous batching: the prompts of two slots in one batch, then decode steps of both slots in one
// batch each, give each slot the logits it gets when run alone (exactly with the exact numerics).
TEST_P(ClEngineNumericsTest, TwoSlotsInterleavedEqualSeparateRuns) {
  const std::vector<int32_t> text = text_tokens(60);
  ASSERT_EQ(text.size(), 60u);
  const std::vector<int32_t> prompt[2] = {{text.begin(), text.begin() + 23}, {text.begin() + 23, text.begin() + 40}};
  const std::vector<int32_t> follow[2] = {{text.begin() + 40, text.begin() + 50}, {text.begin() + 50, text.begin() + 60}};
  auto cl = make(/*n_slots=*/2, std::nullopt, GetParam());
  ASSERT_NE(cl, nullptr);
  SKIP_IF_SCALAR_EXACT(*cl);
  const size_t nv = static_cast<size_t>(cl->n_vocab());

  // Alone: the prompt's last logits, then one step per follow-up token.
  std::vector<float> alone[2];
  for (int s = 0; s < 2; ++s) {
    auto r = cl->eval(s, prompt[s]);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    alone[s].assign(r->begin(), r->end());
    for (int32_t t : follow[s]) {
      auto d = cl->eval(s, std::span<const int32_t>(&t, 1));
      ASSERT_TRUE(d.is_ok()) << d.status().to_string();
      alone[s].insert(alone[s].end(), d->begin(), d->end());
    }
  }

  // Together.
  cl->clear_slot(0);
  cl->clear_slot(1);
  std::vector<float> together[2];
  std::vector<BatchToken> batch;
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0; i < prompt[s].size(); ++i) {
      batch.push_back(BatchToken{prompt[s][i], s, static_cast<int32_t>(i), i + 1 == prompt[s].size()});
    }
  }
  auto r = cl->forward(batch);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2 * nv);
  for (int s = 0; s < 2; ++s) together[s].assign(r->begin() + static_cast<std::ptrdiff_t>(s * nv), r->begin() + static_cast<std::ptrdiff_t>((s + 1) * nv));
  for (size_t i = 0; i < follow[0].size(); ++i) {
    // Slot 1 first this time: batch order must not matter.
    const BatchToken step[2] = {{follow[1][i], 1, static_cast<int32_t>(prompt[1].size() + i), true},
                                {follow[0][i], 0, static_cast<int32_t>(prompt[0].size() + i), true}};
    auto d = cl->forward(step);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    together[1].insert(together[1].end(), d->begin(), d->begin() + static_cast<std::ptrdiff_t>(nv));
    together[0].insert(together[0].end(), d->begin() + static_cast<std::ptrdiff_t>(nv), d->end());
  }
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(together[s].size(), alone[s].size());
    const float d = max_abs_diff(together[s], alone[s]);
    std::printf("[cl-engine] %s numerics, slot %d interleaved vs alone: max |diff| %.2e\n",
                numerics_name(cl->numerics()), s, static_cast<double>(d));
    EXPECT_LT(d, 1e-3f);
    if (batch_invariant(*cl)) {
      EXPECT_EQ(d, 0.0f);
    }
    for (size_t i = 0; i < alone[s].size() / nv; ++i) {
      EXPECT_EQ(argmax(std::span<const float>(together[s]).subspan(i * nv, nv)),
                argmax(std::span<const float>(alone[s]).subspan(i * nv, nv)))
          << "slot " << s << " step " << i;
    }
  }
}

// Every storage the generator emits, forced for the activations, computes the same forward pass as
// the buffer storage (prefill and decode kernels both), exactly with the exact numerics.
TEST_P(ClEngineNumericsTest, EveryActivationStorageGivesTheSameLogits) {
  const std::vector<int32_t> tokens = text_tokens(12);
  ASSERT_EQ(tokens.size(), 12u);
  std::vector<float> reference;
  for (StorageType storage : kAllStorageTypes) {
    auto cl = make(1, storage, GetParam());
    if (cl == nullptr) continue;  // make() reported why
    std::vector<float> logits;
    auto p = cl->eval(0, std::span<const int32_t>(tokens.data(), 9), /*all_logits=*/true);
    ASSERT_TRUE(p.is_ok()) << storage_name(storage) << ": " << p.status().to_string();
    logits.assign(p->begin(), p->end());
    for (size_t i = 9; i < tokens.size(); ++i) {
      auto d = cl->eval(0, std::span<const int32_t>(&tokens[i], 1));
      ASSERT_TRUE(d.is_ok()) << storage_name(storage) << ": " << d.status().to_string();
      logits.insert(logits.end(), d->begin(), d->end());
    }
    EXPECT_EQ(cl->activation_storage(), storage);
    if (reference.empty()) {
      reference = std::move(logits);
      continue;
    }
    const float d = max_abs_diff(logits, reference);
    std::printf("[cl-engine] %s numerics, activations in %s vs buffer: max |diff| %.2e\n",
                numerics_name(cl->numerics()), storage_name(storage), static_cast<double>(d));
    EXPECT_LT(d, 1e-3f) << storage_name(storage);
    if (cl->numerics() == Numerics::kExact) {
      EXPECT_EQ(d, 0.0f) << storage_name(storage);
    }
  }
}

// Half-precision activations (float numerics; the residual stream stays float), in every storage:
// the same forward pass as float activations up to half rounding (prefill and decode kernels), and
// over a page of text the next token of the float activations (teacher-forced) nearly everywhere,
// and the CPU engine's at the float numerics' own rate.
TEST_F(ClEngineTest, HalfActivationsAgreeWithFloatActivations) {
  const std::vector<int32_t> tokens = text_tokens(kAgreementTokens);
  ASSERT_EQ(tokens.size(), static_cast<size_t>(kAgreementTokens));
  auto run = [&](ClEngine& cl, size_t n, size_t prefill) {
    std::vector<float> logits;
    auto p = cl.eval(0, std::span<const int32_t>(tokens.data(), prefill), /*all_logits=*/true);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    if (!p) return logits;
    logits.assign(p->begin(), p->end());
    for (size_t i = prefill; i < n; ++i) {
      auto d = cl.eval(0, std::span<const int32_t>(&tokens[i], 1));
      EXPECT_TRUE(d.is_ok()) << d.status().to_string();
      if (!d) return logits;
      logits.insert(logits.end(), d->begin(), d->end());
    }
    return logits;
  };
  const size_t nv = static_cast<size_t>(model()->config().n_vocab);
  auto top1 = [&](const std::vector<float>& a, const std::vector<float>& b) {
    int same = 0;
    for (size_t i = 0; i < a.size() / nv && i < b.size() / nv; ++i) {
      same += argmax(std::span<const float>(a).subspan(i * nv, nv)) == argmax(std::span<const float>(b).subspan(i * nv, nv));
    }
    return same;
  };

  // Every storage, 9 tokens of prefill then 3 of decode.
  auto f32 = make(1, StorageType::kBuffer, Numerics::kFloat, DataType::kFloat32);
  ASSERT_NE(f32, nullptr);
  const std::vector<float> short_ref = run(*f32, 12, 9);
  for (StorageType storage : kAllStorageTypes) {
    auto cl = make(1, storage, Numerics::kFloat, DataType::kFloat16);
    if (cl == nullptr) continue;  // make() reported why
    EXPECT_EQ(cl->activation_type(), DataType::kFloat16);
    const std::string shown = std::string("activations=") + storage_name(storage);
    const size_t at = cl->describe().find(shown);
    ASSERT_NE(at, std::string::npos) << cl->describe();
    const std::string rest = cl->describe().substr(at + shown.size());
    EXPECT_EQ(rest.substr(0, rest.find(' ')).find("(f16)"), rest.find("(f16)")) << cl->describe();
    EXPECT_NE(rest.substr(0, rest.find(' ')).find("(f16)"), std::string::npos) << cl->describe();
    const std::vector<float> logits = run(*cl, 12, 9);
    const float d = max_abs_diff(logits, short_ref);
    std::printf("[cl-engine] half activations in %s vs float activations: max |logit diff| %.3f, top-1 %d/12\n",
                storage_name(storage), static_cast<double>(d), top1(logits, short_ref));
    EXPECT_LT(d, 0.25f) << storage_name(storage);  // measured 0.04 on PoCL
    EXPECT_GE(top1(logits, short_ref), 11) << storage_name(storage);
  }

  // A page of text in one prefill, against the float activations and the CPU engine.
  auto half = make(1, StorageType::kBuffer, Numerics::kFloat, DataType::kFloat16);
  ASSERT_NE(half, nullptr);
  const std::vector<float> got = run(*half, tokens.size(), tokens.size());
  // Only the last token's logits (what a generate asks for): the same as the last row of all of
  // them up to the output matmul's summation order (decode kernel for one row, prefill for 320):
  // the gathered rows are the float residual stream's, not rounded to half.
  half->clear_slot(0);
  auto last = half->eval(0, tokens, /*all_logits=*/false);
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  const float d_last = max_abs_diff(last.value(), std::span<const float>(got).subspan(got.size() - nv, nv));
  std::printf("[cl-engine] half activations, last token's logits alone vs with all: max |diff| %.2e\n",
              static_cast<double>(d_last));
  EXPECT_LT(d_last, 1e-3f);
  f32->clear_slot(0);
  const std::vector<float> ref = run(*f32, tokens.size(), tokens.size());
  const std::vector<float> cpu_ref = cpu_logits(tokens);
  ASSERT_FALSE(cpu_ref.empty());
  const int vs_float = top1(got, ref), vs_cpu = top1(got, cpu_ref), float_vs_cpu = top1(ref, cpu_ref);
  std::printf("[cl-engine] half activations, teacher-forced top-1 over %zu positions: %d with float activations "
              "(max |logit diff| %.3f); %d with the CPU engine (float activations: %d)\n",
              tokens.size(), vs_float, static_cast<double>(max_abs_diff(got, ref)), vs_cpu, float_vs_cpu);
  EXPECT_GE(vs_float, static_cast<int>(0.97 * static_cast<double>(tokens.size())));
  EXPECT_GE(vs_cpu, static_cast<int>(0.93 * static_cast<double>(tokens.size())));
}

// Halves are chosen only where they pay and allowed only where the numerics allow them: the exact
// numerics refuse them with a clear error; unset, a device without cl_khr_fp16 keeps floats.
TEST_F(ClEngineTest, HalfActivationsNeedFloatNumerics) {
  auto rt = testing::new_test_runtime();
  ASSERT_TRUE(rt.is_ok()) << rt.status().to_string();
  const bool fp16 = rt.value()->info().fp16;
  ClEngineOptions o;
  o.n_ctx = 64;
  o.activation_type = DataType::kFloat16;
  auto e = ClEngine::create(model(), std::move(rt).value(), o);
  if (e.is_ok()) {
    // Only a device without cl_khr_fp64 gets here: it runs the float numerics, where halves are fine.
    EXPECT_EQ(e.value()->numerics(), Numerics::kFloat);
  } else {
    EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
    EXPECT_NE(e.status().message().find("half-precision activations need float numerics"), std::string::npos)
        << e.status().message();
  }
  auto cl = make(1, std::nullopt, Numerics::kFloat, std::nullopt);
  ASSERT_NE(cl, nullptr);
  EXPECT_EQ(cl->activation_type(), fp16 ? DataType::kFloat16 : DataType::kFloat32) << cl->describe();
}

INSTANTIATE_TEST_SUITE_P(Numerics, ClEngineNumericsTest, ::testing::Values(Numerics::kExact, Numerics::kFloat),
                         [](const ::testing::TestParamInfo<Numerics>& param) {
                           return std::string(param.param == Numerics::kExact ? "Exact" : "Float");
                         });

// Bad batches are error values, and nothing reaches the device (the slot does not move).
TEST_F(ClEngineTest, RejectsBadBatches) {
  auto cl = make(/*n_slots=*/2);
  ASSERT_NE(cl, nullptr);
  const BatchToken bad_token[] = {{cl->n_vocab(), 0, 0, true}};
  EXPECT_EQ(cl->forward(bad_token).status().code(), Code::kInvalidArgument);
  const BatchToken bad_slot[] = {{1, 2, 0, true}};
  EXPECT_EQ(cl->forward(bad_slot).status().code(), Code::kInvalidArgument);
  const BatchToken gap[] = {{1, 0, 1, true}};
  EXPECT_EQ(cl->forward(gap).status().code(), Code::kInvalidArgument);
  const BatchToken past[] = {{1, 0, 512, true}};
  EXPECT_EQ(cl->forward(past).status().code(), Code::kOutOfRange);
  EXPECT_EQ(cl->forward({}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(cl->slot_length(0), 0);
  const BatchToken ok[] = {{1, 0, 0, true}};
  EXPECT_TRUE(cl->forward(ok).is_ok());
  EXPECT_EQ(cl->slot_length(0), 1);
}

// The float numerics against the CPU engine: near, not equal (see TeacherForcedTop1AgreesWithTheCpuEngine).
TEST_F(ClEngineTest, FloatNumericsAgreeWithTheCpuEngine) {
  const std::vector<int32_t> tokens = text_tokens(128);
  ASSERT_EQ(tokens.size(), 128u);
  const std::vector<float> cpu_ref = cpu_logits(tokens, 256);
  ASSERT_FALSE(cpu_ref.empty());
  const std::span<const float> ref(cpu_ref);
  auto cl = make(1, std::nullopt, Numerics::kFloat);
  ASSERT_NE(cl, nullptr);
  auto got = cl->eval(0, tokens, /*all_logits=*/true);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const size_t nv = static_cast<size_t>(cl->n_vocab());
  int agree = 0;
  for (size_t i = 0; i < tokens.size(); ++i) agree += argmax(got->subspan(i * nv, nv)) == argmax(ref.subspan(i * nv, nv));
  std::printf("[cl-engine] float numerics: teacher-forced top-1 agreement with the CPU engine %d/%zu, max |logit diff| %.3f\n",
              agree, tokens.size(), static_cast<double>(max_abs_diff(got.value(), ref)));
  EXPECT_GE(agree, static_cast<int>(0.93 * static_cast<double>(tokens.size())));
}

// ---- Synthetic models ---------------------------------------------------------------------------
//
// A GGUF (version 3) built in memory: metadata, then tensors of random values in the given types.
class GgufBuilder {
 public:
  void u32(const std::string& key, uint32_t v) {
    key_header(key, 4);
    put(v);
    ++n_kv_;
  }
  void f32(const std::string& key, float v) {
    key_header(key, 6);
    put(v);
    ++n_kv_;
  }
  void str(const std::string& key, const std::string& v) {
    key_header(key, 8);
    put_string(v);
    ++n_kv_;
  }
  // A rows x cols tensor (ggml's ne = {cols, rows}; a vector when rows == 1) of random values
  // around `center`, in `type`.
  void tensor(const std::string& name, DType type, int64_t cols, int64_t rows, uint32_t seed, float center = 0.0f,
              float spread = 0.3f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(center - spread, center + spread);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    std::vector<uint8_t> data(static_cast<size_t>(rows) * row_bytes, 0);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = dist(rng);
      uint8_t* dst = &data[static_cast<size_t>(r) * row_bytes];
      // K-quant rows are random blocks of about the same spread (test_weights.h); other types stay zero.
      if (kernels::testing::can_encode_weights(type)) {
        kernels::testing::encode_weight_row(type, row.data(), cols, seed * 7919u + static_cast<uint32_t>(r), spread, dst);
      }
    }
    put_string_to(infos_, name);
    const uint32_t dims = rows == 1 ? 1 : 2;
    put_to(infos_, dims);
    put_to(infos_, static_cast<uint64_t>(cols));
    if (dims == 2) put_to(infos_, static_cast<uint64_t>(rows));
    put_to(infos_, static_cast<uint32_t>(type));
    put_to(infos_, static_cast<uint64_t>(data_.size()));
    data_.insert(data_.end(), data.begin(), data.end());
    data_.resize((data_.size() + 31) / 32 * 32, 0);
    ++n_tensors_;
  }
  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out;
    put_to(out, uint32_t{0x46554747});  // "GGUF"
    put_to(out, uint32_t{3});
    put_to(out, n_tensors_);
    put_to(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    out.insert(out.end(), infos_.begin(), infos_.end());
    out.resize((out.size() + 31) / 32 * 32, 0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

 private:
  template <typename T>
  static void put_to(std::vector<uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  static void put_string_to(std::vector<uint8_t>& out, const std::string& s) {
    put_to(out, static_cast<uint64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  template <typename T>
  void put(T v) {
    put_to(kv_, v);
  }
  void put_string(const std::string& s) { put_string_to(kv_, s); }
  void key_header(const std::string& key, uint32_t type) {
    put_string(key);
    put(type);
  }

  std::vector<uint8_t> kv_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

struct TinyLayerTypes {
  DType q, k, v, o, gate, up, down;
};

// A two-layer model: n_embd 64, 4 heads of 16 over 2 KV heads, n_ff `n_ff`, 50 tokens.
std::shared_ptr<const Model> tiny_model(const std::string& arch, DType embd, std::optional<DType> output,
                                        const TinyLayerTypes (&layers)[2], int64_t n_ff = 96) {
  const int64_t e = 64, ekv = 32, nv = 50;
  GgufBuilder b;
  b.str("general.architecture", arch);
  b.str("general.name", "tiny " + arch);
  b.u32(arch + ".embedding_length", static_cast<uint32_t>(e));
  b.u32(arch + ".block_count", 2);
  b.u32(arch + ".attention.head_count", 4);
  b.u32(arch + ".attention.head_count_kv", 2);
  b.u32(arch + ".feed_forward_length", static_cast<uint32_t>(n_ff));
  b.u32(arch + ".context_length", 128);
  b.f32(arch + ".rope.freq_base", 10000.0f);
  uint32_t seed = 1;
  b.tensor("token_embd.weight", embd, e, nv, seed++, 0.0f, 1.0f);
  b.tensor("output_norm.weight", DType::kF32, e, 1, seed++, 1.0f, 0.1f);
  if (output) b.tensor("output.weight", *output, e, nv, seed++);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const TinyLayerTypes& t = layers[l];
    b.tensor(p + "attn_norm.weight", DType::kF32, e, 1, seed++, 1.0f, 0.1f);
    b.tensor(p + "attn_q.weight", t.q, e, e, seed++);
    b.tensor(p + "attn_k.weight", t.k, e, ekv, seed++);
    b.tensor(p + "attn_v.weight", t.v, e, ekv, seed++);
    if (arch == "qwen2") {
      b.tensor(p + "attn_q.bias", DType::kF32, e, 1, seed++);
      b.tensor(p + "attn_k.bias", DType::kF32, ekv, 1, seed++);
      b.tensor(p + "attn_v.bias", DType::kF32, ekv, 1, seed++);
    }
    b.tensor(p + "attn_output.weight", t.o, e, e, seed++);
    b.tensor(p + "ffn_norm.weight", DType::kF32, e, 1, seed++, 1.0f, 0.1f);
    b.tensor(p + "ffn_gate.weight", t.gate, e, n_ff, seed++);
    b.tensor(p + "ffn_up.weight", t.up, e, n_ff, seed++);
    b.tensor(p + "ffn_down.weight", t.down, n_ff, e, seed++);
  }
  auto file = gguf::GgufFile::from_buffer(b.build(), "tiny-" + arch + ".gguf");
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  if (!file) return nullptr;
  auto m = Model::load(std::shared_ptr<const gguf::GgufFile>(std::move(file).value()));
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m ? m.value() : nullptr;
}

class ClEngineSyntheticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (inferd::opencl::testing::test_runtime(&why) == nullptr) GTEST_SKIP() << "no OpenCL device: " << why;
  }
  Result<std::unique_ptr<ClEngine>> make(std::shared_ptr<const Model> model, int32_t n_ubatch = 16,
                                         Numerics numerics = Numerics::kExact,
                                         std::optional<IntDot> int_dot = std::nullopt) {
    ClEngineOptions o = tiny_options();
    o.n_ubatch = n_ubatch;
    o.numerics = numerics;
    o.int_dot = int_dot;
    return make_with(std::move(model), o);
  }
  // An empty directory of this process's under the temporary directory (for a cache), removed first.
  static std::filesystem::path fresh_dir(const std::string& name) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("inferd-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    return dir;
  }
  // 64 positions, passes of up to 16 tokens.
  static ClEngineOptions tiny_options() {
    ClEngineOptions o;
    o.n_ctx = 64;
    o.n_ubatch = 16;
    return o;
  }
  // An engine with options `o` on its own Runtime of the test device, whose program cache (and storage
  // records) live in `cache_dir` ("": none).
  Result<std::unique_ptr<ClEngine>> make_with(std::shared_ptr<const Model> model, const ClEngineOptions& o,
                                              const std::string& cache_dir = "") {
    RuntimeOptions ro;
    ro.cache_dir = cache_dir;
    auto rt = testing::new_test_runtime(ro);
    if (!rt) return rt.status();
    auto e = ClEngine::create(std::move(model), std::move(rt).value(), o);
    if (e) std::printf("[cl-engine] %s\n", e.value()->describe().c_str());
    return e;
  }
  // With the exact numerics the engine's logits, prefill and decode over kTinyTokens, equal the CPU
  // engine's bit for bit, with each form of the integer dots (IntDot: float dot(), and
  // cl_khr_integer_dot_product's, emulated on a device without it); describe() names the form.
  void expect_exact_equals_cpu_engine(std::shared_ptr<const Model> model, const char* label);
};

// The first 9 tokens in one pass (prefill), the rest one by one (decode): every position's logits.
template <typename EngineT>
std::vector<float> prefill_then_decode(EngineT& engine, const std::vector<int32_t>& tokens) {
  std::vector<float> out;
  auto p = engine.eval(0, std::span<const int32_t>(tokens.data(), 9), /*all_logits=*/true);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  if (!p) return out;
  out.assign(p->begin(), p->end());
  for (size_t i = 9; i < tokens.size(); ++i) {
    auto d = engine.eval(0, std::span<const int32_t>(&tokens[i], 1));
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    if (!d) return out;
    out.insert(out.end(), d->begin(), d->end());
  }
  return out;
}

// qwen2 (Q|K|V biases, NeoX rope), an untied F16 output, and per layer either mixed types (three
// Q/K/V matmuls, separate gate and up) or one type (the fused matmuls): every weight type the
// kernels read.
const TinyLayerTypes kMixedLayers[2] = {
    {DType::kQ4_0, DType::kQ8_0, DType::kF16, DType::kQ4_1, DType::kF32, DType::kQ8_0, DType::kQ4_0},
    {DType::kQ4_1, DType::kQ4_1, DType::kQ4_1, DType::kQ4_1, DType::kQ4_1, DType::kQ4_1, DType::kQ4_1}};
const std::vector<int32_t> kTinyTokens = {3, 17, 42, 0, 49, 8, 8, 23, 31, 5, 11, 2};

// The CPU engine's logits of prefill_then_decode(kTinyTokens) (empty on a failure, reported).
std::vector<float> cpu_tiny_logits(const std::shared_ptr<const Model>& model) {
  EngineOptions co;
  co.n_ctx = 64;
  co.n_threads = 2;
  auto cpu = Engine::create(model, co);
  EXPECT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  return cpu ? prefill_then_decode(*cpu.value(), kTinyTokens) : std::vector<float>();
}

void ClEngineSyntheticTest::expect_exact_equals_cpu_engine(std::shared_ptr<const Model> model, const char* label) {
  const std::vector<float> want = cpu_tiny_logits(model);
  ASSERT_FALSE(want.empty());
  for (IntDot mode : {IntDot::kFloat, IntDot::kInt8}) {
    SCOPED_TRACE(int_dot_name(mode));
    auto cl = make(model, 16, Numerics::kExact, mode);
    ASSERT_TRUE(cl.is_ok()) << cl.status().to_string();
    if (cl.value()->numerics() != Numerics::kExact) GTEST_SKIP() << cl.value()->describe();
    EXPECT_NE(cl.value()->describe().find(std::string(int_dot_name(mode)) + " dot"), std::string::npos)
        << cl.value()->describe();
    const std::vector<float> got = prefill_then_decode(*cl.value(), kTinyTokens);
    ASSERT_EQ(got.size(), want.size());
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    std::printf("[cl-engine] %s, exact numerics, %s dot: %d of %zu logits differ from the CPU engine's (max |diff| "
                "%.2e)\n",
                label, int_dot_name(mode), differ, got.size(), static_cast<double>(max_abs_diff(got, want)));
    EXPECT_EQ(differ, 0);
  }
}

// With the exact numerics the whole forward pass equals the CPU engine's, prefill and decode, bit
// for bit: every exact op and both matmul groupings on one model, with both forms of the integer dots.
TEST_F(ClEngineSyntheticTest, Qwen2WithMixedTypesEqualsTheCpuEngine) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  expect_exact_equals_cpu_engine(model, "tiny qwen2, mixed types");
}

// With the float numerics it equals the float reference up to float summation order.
TEST_F(ClEngineSyntheticTest, Qwen2WithMixedTypesMatchesTheFloatReference) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  ASSERT_FALSE(model->config().tied_output);
  const std::vector<int32_t>& tokens = kTinyTokens;
  const std::vector<float> ref = float_reference(*model, tokens);
  auto cl = make(model, 16, Numerics::kFloat);
  ASSERT_TRUE(cl.is_ok()) << cl.status().to_string();
  const std::vector<float> got = prefill_then_decode(*cl.value(), tokens);
  float scale = 0.0f;
  for (float v : ref) scale = std::max(scale, std::fabs(v));
  const float d = max_abs_diff(got, ref);
  std::printf("[cl-engine] tiny qwen2, mixed types: max |logit diff| %.2e against the float reference (logits up to %.2f)\n",
              static_cast<double>(d), static_cast<double>(scale));
  EXPECT_LT(d, 1e-3f * std::max(scale, 1.0f));
}

// Every weight type the CPU engine computes with, in one model: Q5_0, Q5_1 and BF16 matrices (fused
// and split groupings), a Q5_1 embedding, a BF16 output, and K-quant down projections (n_ff 256, the
// only width of the tiny model that holds a K-quant block). Exact numerics: the CPU engine's logits.
TEST_F(ClEngineSyntheticTest, EveryWeightTypeEqualsTheCpuEngine) {
  const TinyLayerTypes layers[2] = {
      {DType::kQ5_0, DType::kQ5_1, DType::kBF16, DType::kQ5_1, DType::kQ5_0, DType::kQ5_0, DType::kQ4_K},
      {DType::kBF16, DType::kBF16, DType::kBF16, DType::kQ5_0, DType::kQ5_1, DType::kBF16, DType::kQ5_K}};
  auto model = tiny_model("llama", DType::kQ5_1, DType::kBF16, layers, /*n_ff=*/256);
  ASSERT_NE(model, nullptr);
  expect_exact_equals_cpu_engine(model, "tiny llama, Q5_0/Q5_1/BF16/Q4_K/Q5_K");
}

// The same model with the float numerics: within float summation order of the float reference.
TEST_F(ClEngineSyntheticTest, EveryWeightTypeMatchesTheFloatReference) {
  const TinyLayerTypes layers[2] = {
      {DType::kQ5_0, DType::kQ5_1, DType::kBF16, DType::kQ5_1, DType::kQ5_0, DType::kQ5_0, DType::kQ4_K},
      {DType::kBF16, DType::kBF16, DType::kBF16, DType::kQ5_0, DType::kQ5_1, DType::kBF16, DType::kQ6_K}};
  auto model = tiny_model("llama", DType::kQ5_1, DType::kBF16, layers, /*n_ff=*/256);
  ASSERT_NE(model, nullptr);
  const std::vector<float> ref = float_reference(*model, kTinyTokens);
  auto cl = make(model, 16, Numerics::kFloat);
  ASSERT_TRUE(cl.is_ok()) << cl.status().to_string();
  const std::vector<float> got = prefill_then_decode(*cl.value(), kTinyTokens);
  float scale = 0.0f;
  for (float v : ref) scale = std::max(scale, std::fabs(v));
  const float d = max_abs_diff(got, ref);
  std::printf("[cl-engine] tiny llama, Q5_0/Q5_1/BF16/Q4_K/Q6_K: max |logit diff| %.2e against the float reference "
              "(logits up to %.2f)\n",
              static_cast<double>(d), static_cast<double>(scale));
  EXPECT_LT(d, 1e-3f * std::max(scale, 1.0f));
}

// A step waits for the device once: its inputs' writes and its outputs' reads are enqueued with the
// kernels, and the host waits at the end (a discrete GPU pays a round trip for every wait). In every
// storage (a texture's reads are image reads), for decode and prefill steps, with and without logits.
TEST_F(ClEngineSyntheticTest, AStepWaitsForTheDeviceOnce) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  for (StorageType storage : {StorageType::kBuffer, StorageType::kTexture2D}) {
    SCOPED_TRACE(storage_name(storage));
    ClEngineOptions o = tiny_options();
    o.activation_storage = storage;
    auto made = make_with(model, o);
    if (!made && made.status().code() == Code::kOutOfRange) continue;  // no images on this device
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    ClEngine& e = *made.value();
    auto waits_of = [&](auto&& step) {
      const int64_t before = e.runtime().host_waits();
      step();
      return e.runtime().host_waits() - before;
    };
    const std::vector<int32_t> prompt(kTinyTokens.begin(), kTinyTokens.begin() + 5);
    auto prefill = [&](bool all_logits) {
      auto r = e.eval(0, prompt, all_logits);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    };
    auto decode = [&]() {
      auto r = e.eval(0, std::span<const int32_t>(&kTinyTokens[6], 1));
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    };
    prefill(false);  // the first pass of each shape builds its kernels
    decode();
    e.clear_slot(0);
    prefill(true);
    e.clear_slot(0);
    EXPECT_EQ(waits_of([&] { prefill(false); }), 1);
    EXPECT_EQ(waits_of(decode), 1);
    EXPECT_EQ(waits_of(decode), 1);
    e.clear_slot(0);
    EXPECT_EQ(waits_of([&] { prefill(true); }), 1);
  }
}

// The fused kernels save launches: matmul_add (the residual added in the matmul's store) one per attention
// output and per FFN down projection, two per layer; with float numerics a decode step's stacked gate|up
// matmul computes SwiGLU in its store, one more where a layer's gate and up share a type (the second layer
// here), the matmuls that read a layer's two RMSNorms normalize as they read (Ops::DecodeNorm), two more,
// and with llama's normal RoPE a stacked Q|K|V matmul writes what rope_kv writes (Ops::matmul_rope_kv), one
// more where Q, K and V share a type (the second layer; qwen2's NeoX RoPE keeps its rope_kv). The exact logits
// are the unfused engine's bit for bit; the float ones agree to float rounding (the folded norm sums the
// squares in each matmul's work-group: on PoCL in the norm kernel's order).
TEST_F(ClEngineSyntheticTest, FusedKernelsSaveLaunches) {
  for (const char* arch : {"qwen2", "llama"}) {
    SCOPED_TRACE(arch);
    auto model = tiny_model(arch, DType::kQ8_0, DType::kF16, kMixedLayers);
    ASSERT_NE(model, nullptr);
    for (Numerics numerics : {Numerics::kExact, Numerics::kFloat}) {
      SCOPED_TRACE(numerics_name(numerics));
      std::vector<float> logits[2];
      int64_t launches[2] = {0, 0};
      for (int fused = 0; fused < 2; ++fused) {
        ClEngineOptions o = tiny_options();
        o.numerics = numerics;
        o.activation_type = DataType::kFloat32;
        o.fuse = fused == 1;
        auto e = make_with(model, o);
        ASSERT_TRUE(e.is_ok()) << e.status().to_string();
        logits[fused] = prefill_then_decode(*e.value(), kTinyTokens);
        const int64_t before = e.value()->stats().launches;
        auto d = e.value()->eval(0, std::span<const int32_t>(&kTinyTokens[0], 1));
        ASSERT_TRUE(d.is_ok()) << d.status().to_string();
        launches[fused] = e.value()->stats().launches - before;
      }
      std::printf("[cl-engine] %s, %s numerics: %lld kernel launches per decode step unfused, %lld fused\n", arch,
                  numerics_name(numerics), static_cast<long long>(launches[0]), static_cast<long long>(launches[1]));
      const bool llama = std::string(arch) == "llama";
      EXPECT_EQ(launches[0] - launches[1],
                2 * 2 + (numerics == Numerics::kFloat ? 1 + 2 * 2 + (llama ? 1 : 0) : 0));  // two layers
      if (numerics == Numerics::kExact) {
        EXPECT_EQ(logits[0], logits[1]);
      } else {
        ASSERT_EQ(logits[0].size(), logits[1].size());
        const auto [lo, hi] = std::minmax_element(logits[0].begin(), logits[0].end());
        EXPECT_LE(max_abs_diff(logits[0], logits[1]), 1e-5f * (*hi - *lo));
      }
    }
  }
}

// The worker's settings (its environment): a value outside a setting's choices or range is refused with
// kInvalidArgument naming the setting and its variable, before any device is touched.
TEST(ClFactory, BadSettingsAreRefusedNamingTheVariable) {
  const std::pair<std::string, std::string> bad[] = {
      {"fuse", "maybe"},           {"replay", "1"},          {"prefill_tokens", "0"},    {"prefill_tokens", "17"},
      {"prefill_tokens", "016"},   {"prefill_tokens", "x"},  {"attention_chunk", "-1"}, {"attention_chunk", "65537"},
      {"attention_chunk", "1e3"},  {"attention_chunk", ""}};
  for (const auto& [key, value] : bad) {
    auto b = opencl_backend_factory().create(BackendConfig{"", 0, {{key, value}}});
    ASSERT_FALSE(b.is_ok()) << key << "=" << value;
    EXPECT_EQ(b.status().code(), Code::kInvalidArgument) << b.status().to_string();
    const std::string variable = opencl_backend_factory().environment.at(key);
    EXPECT_NE(b.status().to_string().find(variable), std::string::npos) << b.status().to_string();
  }
}

// Options out of range are refused with kInvalidArgument naming them, before anything is uploaded.
TEST_F(ClEngineSyntheticTest, OptionsOutOfRangeAreRefused) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  auto refused = [&](const ClEngineOptions& o, const char* what) {
    auto e = make_with(model, o);
    ASSERT_FALSE(e.is_ok()) << what;
    EXPECT_EQ(e.status().code(), Code::kInvalidArgument) << e.status().to_string();
    EXPECT_NE(e.status().to_string().find(what), std::string::npos) << e.status().to_string();
  };
  ClEngineOptions o = tiny_options();
  o.prefill_tokens = kMaxPrefillTokens + 1;
  refused(o, "prefill tokens");
  o = tiny_options();
  o.decode_shape = DecodeShape{kMaxDecodeSlices + 1, 1};
  refused(o, "decode shape");
  o = tiny_options();
  o.attention_chunk = -1;
  refused(o, "attention chunk");
  o.attention_chunk = kMaxAttentionChunkOption + 1;
  refused(o, "attention chunk");
}

// Replayed decode steps (OpenClOptions::replay): two slots decoding in turn across two KV buckets of 64 (the
// first step of each (tokens, outputs, KV length) shape records its launches, the next ones replay them)
// give the logits of steps run through the graph's nodes, bit for bit, with both numerics; a prefill in
// between (not replayed) changes nothing.
TEST_F(ClEngineSyntheticTest, ReplayedStepsGiveTheNodesBits) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  for (Numerics numerics : {Numerics::kExact, Numerics::kFloat}) {
    SCOPED_TRACE(numerics_name(numerics));
    std::vector<float> logits[2];
    for (bool replay : {false, true}) {
      ClEngineOptions o = tiny_options();
      o.n_ctx = 160;
      o.n_slots = 2;
      o.numerics = numerics;
      o.replay = replay;
      auto e = make_with(model, o);
      ASSERT_TRUE(e.is_ok()) << e.status().to_string();
      ClEngine& engine = *e.value();
      if (engine.numerics() != numerics) GTEST_SKIP() << engine.describe();
      std::vector<float>& out = logits[replay];
      auto add = [&](const Result<std::span<const float>>& r) {
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        out.insert(out.end(), r->begin(), r->end());
      };
      add(engine.eval(0, std::span<const int32_t>(kTinyTokens.data(), 9)));
      add(engine.eval(1, std::span<const int32_t>(kTinyTokens.data() + 3, 5)));
      for (int32_t i = 0; i < 150; ++i) {  // slot 0 reaches position 84, slot 1 position 86
        const int32_t token = (i * 7 + 3) % engine.n_vocab();
        add(engine.eval(i % 2, std::span<const int32_t>(&token, 1)));
        if (i == 41) add(engine.eval(1, std::span<const int32_t>(kTinyTokens.data(), 6)));  // a prefill between
      }
      const OpenClStats& s = engine.backend_stats();
      std::printf("[cl-engine] %s numerics, replay %s: %lld decode steps recorded, %lld replayed\n",
                  numerics_name(numerics), replay ? "on" : "off", static_cast<long long>(s.recorded_steps),
                  static_cast<long long>(s.replayed_steps));
      if (replay) {
        EXPECT_GE(s.recorded_steps, 2);  // a shape per KV bucket
        EXPECT_GE(s.replayed_steps, 140);
      } else {
        EXPECT_EQ(s.recorded_steps + s.replayed_steps, 0);
      }
    }
    ASSERT_FALSE(logits[0].empty());
    EXPECT_EQ(logits[0], logits[1]);
  }
}

// The tiled prefill kernel (GPUs' default) in a whole model: the simple kernel's logits, bit for bit.
TEST_F(ClEngineSyntheticTest, TiledPrefillGivesTheSimpleKernelsLogits) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  std::vector<float> logits[2];
  for (PrefillKernel kernel : {PrefillKernel::kSimple, PrefillKernel::kTiled}) {
    ClEngineOptions o = tiny_options();
    o.numerics = Numerics::kFloat;
    o.activation_type = DataType::kFloat32;
    o.prefill_kernel = kernel;
    o.prefill_tokens = 4;
    auto e = make_with(model, o);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    logits[kernel == PrefillKernel::kTiled] = prefill_then_decode(*e.value(), kTinyTokens);
  }
  ASSERT_FALSE(logits[0].empty());
  EXPECT_EQ(logits[0], logits[1]);
}

// The activations' storage by measurement (StoragePolicy::kMeasure, cl_backend.h): the first load times a
// decode step in every candidate storage and keeps the fastest, and records it in the cache directory;
// the next load reads the record instead of timing; a damaged record, or one whose choice is no longer a
// candidate, is timed again and rewritten. The trial steps change nothing the model computes: with the
// exact numerics the logits still equal the CPU engine's bit for bit.
TEST_F(ClEngineSyntheticTest, MeasuredStorageIsTheFastestAndIsRecorded) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  const std::filesystem::path dir = fresh_dir("storage-choice");
  auto measured = [&]() -> std::unique_ptr<ClEngine> {
    ClEngineOptions o = tiny_options();
    o.storage_policy = StoragePolicy::kMeasure;
    auto e = make_with(model, o, dir.string());
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e ? std::move(e).value() : nullptr;
  };
  auto records = [&]() {
    std::vector<std::filesystem::path> found;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().filename().string().rfind("storage-", 0) == 0) found.push_back(entry.path());
    }
    return found;
  };
  auto first = measured();
  ASSERT_NE(first, nullptr);
  if (first->device_info().image_support == false) GTEST_SKIP() << "one candidate storage only: the device has no images";
  EXPECT_EQ(first->storage_source(), StorageSource::kMeasured);
  const std::vector<StorageTrial> trials = first->storage_trials();
  ASSERT_GE(trials.size(), 2u);
  const StorageTrial* best = &trials[0];
  for (const StorageTrial& t : trials) {
    EXPECT_GT(t.step_ms, 0.0);
    if (t.step_ms < best->step_ms) best = &t;
    for (const StorageTrial& u : trials) EXPECT_TRUE(&t == &u || t.storage != u.storage);
  }
  EXPECT_EQ(first->activation_storage(), best->storage);
  EXPECT_GT(first->storage_measure_ms(), 0.0);
  EXPECT_NE(first->describe().find("(measured: "), std::string::npos) << first->describe();
  EXPECT_EQ(first->stats().decode_passes + first->stats().prefill_passes, 0);  // the trials are not counted
  ASSERT_EQ(records().size(), 1u);
  const std::filesystem::path record = records()[0];

  // The logits after the trials: the CPU engine's, bit for bit.
  const std::vector<float> want = cpu_tiny_logits(model);
  ASSERT_FALSE(want.empty());
  if (first->numerics() == Numerics::kExact) {
    EXPECT_EQ(prefill_then_decode(*first, kTinyTokens), want);
  }

  // The next load reads the record.
  auto second = measured();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->storage_source(), StorageSource::kRecorded);
  EXPECT_EQ(second->activation_storage(), first->activation_storage());
  ASSERT_EQ(second->storage_trials().size(), trials.size());
  for (size_t i = 0; i < trials.size(); ++i) {  // as recorded: to 4 decimals
    EXPECT_EQ(second->storage_trials()[i].storage, trials[i].storage);
    EXPECT_EQ(second->storage_trials()[i].parts, trials[i].parts);
    EXPECT_NEAR(second->storage_trials()[i].step_ms, trials[i].step_ms, 1e-4);
  }
  EXPECT_EQ(second->storage_measure_ms(), 0.0);
  EXPECT_NE(second->describe().find("(measured earlier: "), std::string::npos) << second->describe();
  if (second->numerics() == Numerics::kExact) {
    EXPECT_EQ(prefill_then_decode(*second, kTinyTokens), want);
  }

  // A record cut short is timed again and rewritten whole.
  std::stringstream text;
  text << std::ifstream(record).rdbuf();
  const std::string whole = text.str();
  { std::ofstream(record, std::ios::trunc) << whole.substr(0, whole.size() / 2); }
  auto third = measured();
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->storage_source(), StorageSource::kMeasured);
  std::stringstream rewritten;
  rewritten << std::ifstream(record).rdbuf();
  const size_t key_end = whole.find("trial ");
  ASSERT_NE(key_end, std::string::npos);
  EXPECT_EQ(rewritten.str().substr(0, key_end), whole.substr(0, key_end));  // the same key (the times differ)
  EXPECT_EQ(rewritten.str().substr(rewritten.str().size() - 4), "end\n");

  // A record whose choice is no storage this device would time for the model (texture3d: texture2d holds
  // it) is timed again.
  std::string stale = rewritten.str();
  const size_t choice = stale.find("choice ");
  ASSERT_NE(choice, std::string::npos);
  stale = stale.substr(0, choice) + "trial texture3d 1 1x1 0.0001\nchoice texture3d 1 1x1\nend\n";
  { std::ofstream(record, std::ios::trunc) << stale; }
  auto fourth = measured();
  ASSERT_NE(fourth, nullptr);
  EXPECT_EQ(fourth->storage_source(), StorageSource::kMeasured);
  EXPECT_NE(fourth->activation_storage(), StorageType::kTexture3D);
  std::filesystem::remove_all(dir);
}

// With the float numerics the measurement also times the decode matmul's shapes (DecodeShape) in the
// fastest storage and keeps the fastest configuration; every shape gives the same bits, so the logits are
// those of the untimed 1x1 engine. A forced storage keeps its storage and times the shapes alone.
TEST_F(ClEngineSyntheticTest, FloatNumericsTimeTheDecodeShapes) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  const std::filesystem::path dir = fresh_dir("decode-shapes");
  auto engine = [&](StoragePolicy policy, std::optional<StorageType> storage) -> std::unique_ptr<ClEngine> {
    ClEngineOptions o = tiny_options();
    o.numerics = Numerics::kFloat;
    o.activation_type = DataType::kFloat32;
    o.storage_policy = policy;
    o.activation_storage = storage;
    auto e = make_with(model, o, dir.string());
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e ? std::move(e).value() : nullptr;
  };
  auto plain = engine(StoragePolicy::kRule, StorageType::kBuffer);
  ASSERT_NE(plain, nullptr);
  EXPECT_TRUE(plain->storage_trials().empty());
  const std::vector<float> want = prefill_then_decode(*plain, kTinyTokens);

  auto timed = engine(StoragePolicy::kMeasure, std::nullopt);
  ASSERT_NE(timed, nullptr);
  const std::vector<StorageTrial>& trials = timed->storage_trials();
  const size_t shapes = decode_shape_candidates().size();
  ASSERT_GE(trials.size(), shapes);
  // The last trials: every shape, in one storage.
  for (size_t i = trials.size() - shapes; i < trials.size(); ++i) {
    EXPECT_EQ(trials[i].storage, trials.back().storage);
    EXPECT_EQ(trials[i].decode, decode_shape_candidates()[i - (trials.size() - shapes)]);
  }
  const StorageTrial* best = &trials[0];
  for (const StorageTrial& t : trials) {
    if (t.step_ms < best->step_ms) best = &t;
  }
  EXPECT_EQ(timed->activation_storage(), best->storage);
  EXPECT_NE(timed->describe().find("decode matmul " + best->decode.to_string()), std::string::npos) << timed->describe();
  EXPECT_EQ(prefill_then_decode(*timed, kTinyTokens), want);

  auto forced = engine(StoragePolicy::kMeasure, StorageType::kBuffer);
  ASSERT_NE(forced, nullptr);
  EXPECT_EQ(forced->storage_source(), StorageSource::kForced);
  ASSERT_EQ(forced->storage_trials().size(), shapes);
  for (const StorageTrial& t : forced->storage_trials()) EXPECT_EQ(t.storage, StorageType::kBuffer);
  EXPECT_NE(forced->describe().find("(measured: "), std::string::npos) << forced->describe();
  EXPECT_EQ(prefill_then_decode(*forced, kTinyTokens), want);
  // Its record is its own (another key: the storage is not timed): read back by the next such load.
  auto again = engine(StoragePolicy::kMeasure, StorageType::kBuffer);
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->describe().find("(measured earlier: "), std::string::npos) << again->describe();
  std::filesystem::remove_all(dir);
}

// Without a policy a CPU device keeps the rule (buffers first; images are emulated there) and a GPU
// measures; a forced storage is used as given.
TEST_F(ClEngineSyntheticTest, StoragePolicyDefaultsByDeviceType) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  auto plain = make(model);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  if (plain.value()->device_info().type == DeviceType::kCpu) {
    EXPECT_EQ(plain.value()->storage_source(), StorageSource::kRule);
    EXPECT_EQ(plain.value()->activation_storage(), StorageType::kBuffer);
    EXPECT_TRUE(plain.value()->storage_trials().empty());
  } else if (plain.value()->device_info().image_support) {
    EXPECT_NE(plain.value()->storage_source(), StorageSource::kRule);
  }
  ClEngineOptions o = tiny_options();
  o.activation_storage = StorageType::kImageBuffer;
  o.storage_policy = StoragePolicy::kMeasure;  // a forced storage is not measured
  auto forced = make_with(model, o);
  if (!forced && forced.status().code() == Code::kUnimplemented) GTEST_SKIP() << forced.status().to_string();
  ASSERT_TRUE(forced.is_ok()) << forced.status().to_string();
  EXPECT_EQ(forced.value()->storage_source(), StorageSource::kForced);
  EXPECT_EQ(forced.value()->activation_storage(), StorageType::kImageBuffer);
  EXPECT_NE(forced.value()->describe().find("(forced)"), std::string::npos) << forced.value()->describe();
}

// KV blocks (graph.h): a sequence whose blocks lie scattered over the pool (out of order, not adjacent)
// gets the logits of the default layout (one run of blocks per slot), and a second sequence that takes
// the first two blocks of its prompt from the first (set_slot with their 128 positions) and computes only
// the rest gets the logits of computing its whole prompt from scratch. Only addresses change, so both
// numerics give the same bits; the passes are the same on both sides (the prefix in passes of 64).
TEST_F(ClEngineSyntheticTest, ScatteredAndSharedKvBlocksGiveTheSameLogits) {
  auto model = tiny_model("qwen2", DType::kQ8_0, DType::kF16, kMixedLayers);
  ASSERT_NE(model, nullptr);
  constexpr int32_t kPrefix = 128, kPrompt = 150, kTokens = 153;  // 3 blocks; the last 3 tokens decoded
  auto engine = [&](Numerics numerics, int32_t n_slots, int32_t n_blocks) -> std::unique_ptr<ClEngine> {
    auto rt = testing::new_test_runtime();
    EXPECT_TRUE(rt.is_ok()) << rt.status().to_string();
    if (!rt) return nullptr;
    ClEngineOptions o;
    o.n_ctx = 192;
    o.n_slots = n_slots;
    o.n_ubatch = 64;
    o.n_blocks = n_blocks;
    o.numerics = numerics;
    auto e = ClEngine::create(model, std::move(rt).value(), o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e ? std::move(e).value() : nullptr;
  };
  // Tokens [from, kPrompt) of `seq` into `slot` (passes of 64), then the rest one by one: every row's logits.
  auto run = [](ClEngine& e, int32_t slot, const std::vector<int32_t>& seq, int32_t from) {
    std::vector<float> out;
    auto p = e.eval(slot, std::span<const int32_t>(&seq[static_cast<size_t>(from)], static_cast<size_t>(kPrompt - from)),
                    /*all_logits=*/true);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    if (!p) return out;
    out.assign(p->begin(), p->end());
    for (size_t i = kPrompt; i < seq.size(); ++i) {
      auto d = e.eval(slot, std::span<const int32_t>(&seq[i], 1));
      EXPECT_TRUE(d.is_ok()) << d.status().to_string();
      if (!d) return out;
      out.insert(out.end(), d->begin(), d->end());
    }
    return out;
  };
  std::vector<int32_t> first(kTokens), second(kTokens);
  for (int32_t i = 0; i < kTokens; ++i) {
    first[static_cast<size_t>(i)] = (i * 7 + 3) % 50;
    second[static_cast<size_t>(i)] = i < kPrefix ? first[static_cast<size_t>(i)] : (i * 11 + 5) % 50;
  }
  for (Numerics numerics : {Numerics::kExact, Numerics::kFloat}) {
    SCOPED_TRACE(numerics_name(numerics));
    auto ref = engine(numerics, 1, 0);
    ASSERT_NE(ref, nullptr);
    const std::vector<float> want_first = run(*ref, 0, first, 0);
    ref->clear_slot(0);
    std::vector<float> want_second = run(*ref, 0, second, 0);
    const size_t nv = static_cast<size_t>(ref->n_vocab());
    want_second.erase(want_second.begin(), want_second.begin() + static_cast<std::ptrdiff_t>(kPrefix * nv));

    auto pool = engine(numerics, 2, 8);
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(pool->n_blocks(), 8);
    // A layer's pool: 8 blocks of K and V for 64 positions of 2 kv heads of 16 halves; 2 layers.
    EXPECT_EQ(pool->stats().kv_bytes, size_t{8} * 2 * 64 * 32 * 2 * 2);
    EXPECT_EQ(pool->backend().memory().kv, pool->stats().kv_bytes);
    const int32_t blocks0[] = {6, 1, 4}, blocks1[] = {6, 1, 3};  // slot 1 shares blocks 6 and 1
    ASSERT_TRUE(pool->set_slot(0, blocks0, 0).is_ok());
    const std::vector<float> got_first = run(*pool, 0, first, 0);
    ASSERT_TRUE(pool->set_slot(1, blocks1, kPrefix).is_ok());
    EXPECT_EQ(pool->slot_length(1), kPrefix);
    const std::vector<float> got_second = run(*pool, 1, second, kPrefix);

    ASSERT_EQ(got_first.size(), want_first.size());
    ASSERT_EQ(got_second.size(), want_second.size());
    int differ_first = 0, differ_second = 0;
    for (size_t i = 0; i < got_first.size(); ++i) differ_first += got_first[i] != want_first[i];
    for (size_t i = 0; i < got_second.size(); ++i) differ_second += got_second[i] != want_second[i];
    std::printf("[cl-engine] %s numerics, KV blocks: scattered %d of %zu logits differ from the default layout's, "
                "shared prefix %d of %zu from scratch's\n",
                numerics_name(pool->numerics()), differ_first, got_first.size(), differ_second, got_second.size());
    EXPECT_EQ(differ_first, 0);
    EXPECT_EQ(differ_second, 0);
  }
}

// A whole GGUF, exact numerics, against the CPU engine: `prefill` tokens in passes of 64 (the logits
// of each pass's last token: the GEMM path of both engines), then `decode` tokens one at a time (the
// GEMV path), the same passes on both. Every logit must be equal.
void expect_file_equals_the_cpu_engine(const std::string& path, int32_t prefill, int32_t decode) {
  std::string why;
  if (inferd::opencl::testing::test_runtime(&why) == nullptr) GTEST_SKIP() << "no OpenCL device: " << why;
  auto model = Model::open(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int32_t n_vocab = model.value()->config().n_vocab;
  auto rt = testing::new_test_runtime();
  ASSERT_TRUE(rt.is_ok()) << rt.status().to_string();
  ClEngineOptions o;
  o.n_ctx = 512;
  o.n_ubatch = 64;
  auto cl = ClEngine::create(model.value(), std::move(rt).value(), o);
  ASSERT_TRUE(cl.is_ok()) << cl.status().to_string();
  if (cl.value()->numerics() != Numerics::kExact) GTEST_SKIP() << cl.value()->describe();
  EngineOptions co;
  co.n_ctx = 512;
  co.n_ubatch = 64;
  co.n_threads = 2;
  auto cpu = Engine::create(model.value(), co);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  std::vector<int32_t> tokens(static_cast<size_t>(prefill + decode));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 11) % static_cast<size_t>(n_vocab));
  size_t rows = 0;
  int differ = 0, embd_differ = 0;
  float max_diff = 0.0f;
  auto compare = [&](size_t first, size_t n) {
    const std::span<const int32_t> pass(&tokens[first], n);
    auto want = cpu.value()->eval(0, pass);
    auto got = cl.value()->eval(0, pass);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < got->size(); ++i) differ += (*got)[i] != (*want)[i];
    max_diff = std::max(max_diff, max_abs_diff(got.value(), want.value()));
    // The normalized hidden states the logits come from (what embeddings are made of) too.
    const std::span<const float> we = cpu.value()->embeddings(), ge = cl.value()->embeddings();
    ASSERT_EQ(we.size(), static_cast<size_t>(model.value()->config().n_embd));
    ASSERT_EQ(ge.size(), we.size());
    for (size_t i = 0; i < ge.size(); ++i) embd_differ += ge[i] != we[i];
    ++rows;
  };
  for (size_t i = 0; i < static_cast<size_t>(prefill); i += 64) compare(i, std::min<size_t>(64, static_cast<size_t>(prefill) - i));
  for (size_t i = static_cast<size_t>(prefill); i < tokens.size(); ++i) compare(i, 1);
  std::printf("[cl-engine] %s, exact numerics, %zu tokens: %d of %zu logits differ from the CPU engine's (max |diff| "
              "%.2e)\n",
              std::filesystem::path(path).filename().c_str(), tokens.size(), differ, rows * static_cast<size_t>(n_vocab),
              static_cast<double>(max_diff));
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(embd_differ, 0);
}

// The committed mixed-small model (Q4_0, Q8_0, Q4_K and Q6_K in every layer, a Q6_K output).
TEST(ClEngineFiles, MixedSmallEqualsTheCpuEngine) {
  expect_file_equals_the_cpu_engine(INFERD_TEST_DATA_DIR "/models/mixed-small.gguf", 256, 16);
}

// Every matrix Q4_0 (q4_0-tied-small) with the CPU engine in llama.cpp's repacked matmul order
// (kernels::MatmulOrder::kRepacked): the exact matmul sums those matrices in that order too, in the prefill
// and the decode variants.
TEST(ClEngineFiles, RepackedMatmulOrderEqualsTheCpuEngine) {
  const kernels::ScopedMatmulOrder repacked(kernels::MatmulOrder::kRepacked);
  expect_file_equals_the_cpu_engine(INFERD_TEST_DATA_DIR "/models/q4_0-tied-small.gguf", 128, 8);
  // Every layer matrix Q4_K: 130 prompt tokens, so that the last two take llama.cpp's GEMV steps, the others its
  // GEMM's.
  expect_file_equals_the_cpu_engine(INFERD_TEST_DATA_DIR "/models/q4_k-tied-small.gguf", 130, 8);
}

// The architectures past llama and qwen2 and the low-bit types, the committed synthetic models (make_synthetic_gguf.py):
// gemma3 (Q/K norms per head, norms after attention and FFN, scaled embeddings, GeGLU, sliding-window
// layers with their own RoPE base, Q scaled before its rounding), qwen3 (Q/K norms), phi3 (fused QKV and
// gate/up as row ranges, Q scaled), llama3 (RoPE frequency factors) and lowbit-small (Q2_K, Q3_K, IQ4_NL,
// IQ4_XS). 136 tokens: past gemma3-small's window of 128.
TEST(ClEngineFiles, NewArchitecturesAndTypesEqualTheCpuEngine) {
  for (const char* name : {"gemma3-small", "qwen3-small", "phi3-small", "llama3-small", "lowbit-small"}) {
    SCOPED_TRACE(name);
    expect_file_equals_the_cpu_engine(std::string(INFERD_TEST_DATA_DIR "/models/") + name + ".gguf", 128, 8);
  }
}

// The float attention split over chunks of positions (GPUs' default; Ops::attention_chunk) in a whole
// model with sliding-window layers (gemma3-small, window 128): 136 tokens prefilled, then 8 decode steps
// past the window, their attention split in chunks of 16 positions from the window's first. Other float
// sums than one work-group per head: the logits agree with the unsplit attention's to float rounding, and
// every step picks the same token.
TEST(ClEngineFiles, SplitAttentionAgreesWithOneGroupPerHead) {
  std::string why;
  if (inferd::opencl::testing::test_runtime(&why) == nullptr) GTEST_SKIP() << "no OpenCL device: " << why;
  auto model = Model::open(INFERD_TEST_DATA_DIR "/models/gemma3-small.gguf");
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int32_t n_vocab = model.value()->config().n_vocab;
  std::vector<int32_t> tokens(144);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 11) % static_cast<size_t>(n_vocab));
  std::vector<float> logits[2];
  for (int32_t chunk : {0, 16}) {
    auto rt = testing::new_test_runtime();
    ASSERT_TRUE(rt.is_ok()) << rt.status().to_string();
    ClEngineOptions o;
    o.n_ctx = 256;
    o.n_ubatch = 136;
    o.numerics = Numerics::kFloat;
    o.activation_type = DataType::kFloat32;
    o.attention_chunk = chunk;
    auto e = ClEngine::create(model.value(), std::move(rt).value(), o);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    auto p = e.value()->eval(0, std::span<const int32_t>(tokens.data(), 136));
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    for (size_t i = 136; i < tokens.size(); ++i) {
      auto d = e.value()->eval(0, std::span<const int32_t>(&tokens[i], 1));
      ASSERT_TRUE(d.is_ok()) << d.status().to_string();
      logits[chunk > 0].insert(logits[chunk > 0].end(), d->begin(), d->end());
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  const auto [lo, hi] = std::minmax_element(logits[0].begin(), logits[0].end());
  const float diff = max_abs_diff(logits[0], logits[1]);
  std::printf("[cl-engine] gemma3-small, 8 decode steps past the window: split attention's logits within %.2e of "
              "the unsplit ones (range %.2f)\n", diff, *hi - *lo);
  EXPECT_LT(diff, 1e-4f * (*hi - *lo));
  EXPECT_NE(logits[0], logits[1]) << "the split ran (other float sums)";
  const size_t v = static_cast<size_t>(n_vocab);
  for (size_t s = 0; s < logits[0].size() / v; ++s) {
    const auto a = logits[0].begin() + static_cast<std::ptrdiff_t>(s * v), b = logits[1].begin() + static_cast<std::ptrdiff_t>(s * v);
    EXPECT_EQ(std::max_element(a, a + n_vocab) - a, std::max_element(b, b + n_vocab) - b) << "step " << s;
  }
}

// Further GGUFs named in INFERD_OPENCL_TEST_MODELS (paths separated by ':'), e.g. the q4_k-small and
// q6_k-small presets of tools/reference/make_synthetic_gguf.py (too large to commit); skipped when unset.
TEST(ClEngineFiles, ListedModelsEqualTheCpuEngine) {
  const char* list = std::getenv("INFERD_OPENCL_TEST_MODELS");
  if (list == nullptr || *list == '\0') GTEST_SKIP() << "INFERD_OPENCL_TEST_MODELS is not set";
  std::stringstream paths(list);
  for (std::string path; std::getline(paths, path, ':');) {
    if (path.empty()) continue;
    SCOPED_TRACE(path);
    expect_file_equals_the_cpu_engine(path, 256, 16);
  }
}

}  // namespace
}  // namespace inferd::opencl
