// ClEngine pipeline stages on SmolLM2 (30 layers): a model split into stages, chained here pass by
// pass (each stage's hidden states fed to the next, as the worker's hidden-state exchange does), gives
// the whole model's logits bit for bit, whether the stages run on OpenCL or on the CPU engine in any
// mix. Passes of several tokens and of one token (prefill and decode kernels), and two slots in one
// batch. Skips without an OpenCL device, without the model, or when the device cannot run the exact
// numerics (without them OpenCL and CPU logits differ by design).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "inferd/engine.h"
#include "inferd/opencl/cl_engine.h"
#include "test_device.h"

namespace inferd::opencl {
namespace {

const char* kModel = INFERD_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

// One stage of a pipeline, on either engine.
struct Stage {
  std::function<Result<std::span<const float>>(std::span<const BatchToken>, std::span<const float>)> forward;
  std::string name;
};

// The passes every pipeline runs: a prompt of 13 tokens in slot 0 and 9 in slot 1 in one batch (logits
// for every token), then three decode steps of both slots in one batch, then two single-token steps of
// slot 0. Token ids are fixed, spread over the vocabulary.
std::vector<std::vector<BatchToken>> test_passes(int32_t n_vocab) {
  auto token = [n_vocab](int i) { return static_cast<int32_t>((1 + 7919LL * i) % n_vocab); };
  std::vector<std::vector<BatchToken>> passes;
  std::vector<BatchToken> prompt;
  int next = 0;
  for (int p = 0; p < 13; ++p) prompt.push_back({token(next++), 0, p, true});
  for (int p = 0; p < 9; ++p) prompt.push_back({token(next++), 1, p, true});
  passes.push_back(prompt);
  for (int s = 0; s < 3; ++s) passes.push_back({{token(next++), 1, 9 + s, true}, {token(next++), 0, 13 + s, true}});
  for (int s = 0; s < 2; ++s) passes.push_back({{token(next++), 0, 16 + s, true}});
  return passes;
}

class ClStageTest : public ::testing::Test {
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
    auto probe = make_cl(0, 0);
    ASSERT_NE(probe, nullptr);
    if (probe->numerics() != Numerics::kExact) {
      GTEST_SKIP() << "the device runs float numerics only (" << probe->describe()
                   << "): stages cannot equal the CPU engine bit for bit";
    }
  }

  int32_t n_layer() const { return model_->config().n_layer; }

  std::unique_ptr<ClEngine> make_cl(int32_t first, int32_t end) {
    auto rt = testing::new_test_runtime();
    EXPECT_TRUE(rt.is_ok()) << rt.status().to_string();
    if (!rt) return nullptr;
    ClEngineOptions o;
    o.n_ctx = 128;
    o.n_slots = 2;
    o.first_layer = first;
    o.end_layer = end;
    auto e = ClEngine::create(model_, std::move(rt).value(), o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (!e) return nullptr;
    return std::move(e).value();
  }

  std::unique_ptr<Engine> make_cpu(int32_t first, int32_t end) {
    EngineOptions o;
    o.n_ctx = 128;
    o.n_slots = 2;
    o.n_threads = 2;
    o.first_layer = first;
    o.end_layer = end;
    auto e = Engine::create(model_, o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (!e) return nullptr;
    return std::move(e).value();
  }

  // A stage that owns its engine through the closure.
  Stage cl_stage(int32_t first, int32_t end) {
    std::shared_ptr<ClEngine> e = make_cl(first, end);
    if (e == nullptr) return {};
    return {[e](std::span<const BatchToken> b, std::span<const float> h) { return e->forward(b, h); },
            "opencl[" + std::to_string(first) + "," + std::to_string(end) + ")"};
  }
  Stage cpu_stage(int32_t first, int32_t end) {
    std::shared_ptr<Engine> e = make_cpu(first, end);
    if (e == nullptr) return {};
    return {[e](std::span<const BatchToken> b, std::span<const float> h) { return e->forward(b, h); },
            "cpu[" + std::to_string(first) + "," + std::to_string(end) + ")"};
  }

  // Runs test_passes() through the stages in order; the logits of every pass, concatenated (empty
  // after a failure, which is reported).
  std::vector<float> run_pipeline(const std::vector<Stage>& stages) {
    std::vector<float> logits, hidden;
    std::string names;
    for (const Stage& s : stages) {
      EXPECT_TRUE(s.forward) << "a stage could not be created";
      if (!s.forward) return {};
      names += (names.empty() ? "" : " -> ") + s.name;
    }
    const size_t embd = static_cast<size_t>(model_->config().n_embd);
    for (const std::vector<BatchToken>& batch : test_passes(model_->config().n_vocab)) {
      hidden.clear();
      for (size_t i = 0; i < stages.size(); ++i) {
        auto r = stages[i].forward(batch, hidden);
        EXPECT_TRUE(r.is_ok()) << stages[i].name << ": " << r.status().to_string();
        if (!r) return {};
        if (i + 1 < stages.size()) {
          EXPECT_EQ(r->size(), batch.size() * embd) << stages[i].name << " returned no hidden states";
          hidden.assign(r->begin(), r->end());
        } else {
          logits.insert(logits.end(), r->begin(), r->end());
        }
      }
    }
    std::printf("[cl-stage] %s: %zu logits\n", names.c_str(), logits.size());
    return logits;
  }

  // The whole CPU engine's logits for test_passes(), computed once.
  const std::vector<float>& cpu_reference() {
    if (cpu_reference_.empty()) cpu_reference_ = run_pipeline({cpu_stage(0, n_layer())});
    return cpu_reference_;
  }

  // The number of logits that differ in any bit (NaN-safe: compares bit patterns).
  static size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return SIZE_MAX;
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return n;
  }

  inline static std::shared_ptr<const Model> model_;
  inline static std::vector<float> cpu_reference_;
};

TEST_F(ClStageTest, WholeOpenClEngineEqualsTheCpuEngine) {
  const std::vector<float> whole = run_pipeline({cl_stage(0, n_layer())});
  ASSERT_FALSE(whole.empty());
  EXPECT_EQ(differing(whole, cpu_reference()), 0u);
}

// Two OpenCL stages split at 1, n/2 and n-1 equal the whole OpenCL engine and the CPU engine.
TEST_F(ClStageTest, TwoOpenClStagesEqualTheWholeModel) {
  const std::vector<float> whole = run_pipeline({cl_stage(0, n_layer())});
  ASSERT_FALSE(whole.empty());
  for (int32_t split : {1, n_layer() / 2, n_layer() - 1}) {
    const std::vector<float> staged = run_pipeline({cl_stage(0, split), cl_stage(split, n_layer())});
    ASSERT_FALSE(staged.empty()) << "split at " << split;
    EXPECT_EQ(differing(staged, whole), 0u) << "split at " << split << " vs the whole OpenCL engine";
    EXPECT_EQ(differing(staged, cpu_reference()), 0u) << "split at " << split << " vs the CPU engine";
  }
}

// Mixed backends, both orders (llama.cpp's -ngl puts the first layers on the GPU), and three stages.
TEST_F(ClStageTest, MixedCpuAndOpenClStagesEqualTheCpuEngine) {
  const int32_t n = n_layer(), half = n / 2;
  const std::vector<float> cpu_then_cl = run_pipeline({cpu_stage(0, half), cl_stage(half, n)});
  ASSERT_FALSE(cpu_then_cl.empty());
  EXPECT_EQ(differing(cpu_then_cl, cpu_reference()), 0u) << "CPU stage then OpenCL stage";
  const std::vector<float> cl_then_cpu = run_pipeline({cl_stage(0, half), cpu_stage(half, n)});
  ASSERT_FALSE(cl_then_cpu.empty());
  EXPECT_EQ(differing(cl_then_cpu, cpu_reference()), 0u) << "OpenCL stage then CPU stage";
  const std::vector<float> three = run_pipeline({cl_stage(0, 10), cpu_stage(10, 20), cl_stage(20, n)});
  ASSERT_FALSE(three.empty());
  EXPECT_EQ(differing(three, cpu_reference()), 0u) << "OpenCL, CPU, OpenCL";
}

// A stage uploads only what it runs: the first stage no output norm, the last no embedding unless
// the output is tied to it; each stage's KV cache covers its own layers.
TEST_F(ClStageTest, StagesHoldOnlyTheirLayers) {
  auto whole = make_cl(0, 0);
  auto head = make_cl(0, 10);
  auto tail = make_cl(10, n_layer());
  ASSERT_TRUE(whole && head && tail);
  EXPECT_EQ(whole->options().end_layer, n_layer());
  EXPECT_TRUE(head->is_first_stage() && !head->is_last_stage());
  EXPECT_TRUE(!tail->is_first_stage() && tail->is_last_stage());
  EXPECT_EQ(head->stats().kv_bytes * static_cast<size_t>(n_layer()), whole->stats().kv_bytes * 10);
  EXPECT_EQ(head->stats().kv_bytes + tail->stats().kv_bytes, whole->stats().kv_bytes);
  EXPECT_LT(head->stats().weight_bytes, whole->stats().weight_bytes);
  EXPECT_LT(tail->stats().weight_bytes, whole->stats().weight_bytes);
  if (!model_->config().tied_output) {
    // Only then can the embedding (in the head) and the output (in the tail) be told apart.
    EXPECT_EQ(head->stats().weight_bytes + tail->stats().weight_bytes, whole->stats().weight_bytes);
  }
  EXPECT_NE(head->describe().find("layers 0-9"), std::string::npos) << head->describe();
  EXPECT_EQ(whole->describe().find("layers"), std::string::npos) << whole->describe();
}

// Bad stage use is an error value: a layer range outside the model, hidden states of the wrong size
// or where none are taken, eval() on a stage.
TEST_F(ClStageTest, RejectsBadStageUse) {
  for (auto [first, end] : {std::pair{-1, 10}, std::pair{10, 10}, std::pair{20, 10}, std::pair{0, n_layer() + 1}}) {
    auto rt = testing::new_test_runtime();
    ASSERT_TRUE(rt.is_ok()) << rt.status().to_string();
    ClEngineOptions o;
    o.n_ctx = 128;
    o.first_layer = first;
    o.end_layer = end;
    EXPECT_EQ(ClEngine::create(model_, std::move(rt).value(), o).status().code(), Code::kInvalidArgument)
        << "[" << first << ", " << end << ")";
  }
  auto head = make_cl(0, 10);
  auto tail = make_cl(10, n_layer());
  ASSERT_TRUE(head && tail);
  const BatchToken two[] = {{1, 0, 0, true}, {2, 0, 1, true}};
  const std::vector<float> one_row(static_cast<size_t>(model_->config().n_embd), 0.5f);
  EXPECT_EQ(tail->forward(two, one_row).status().code(), Code::kInvalidArgument);  // 1 row for 2 tokens
  EXPECT_EQ(tail->forward(two).status().code(), Code::kInvalidArgument);           // none at all
  EXPECT_EQ(head->forward(std::span<const BatchToken>(two, 1), one_row).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(tail->slot_length(0), 0);
  EXPECT_EQ(head->slot_length(0), 0);
  const int32_t tokens[] = {1, 2};
  EXPECT_EQ(head->eval(0, tokens).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(tail->eval(0, tokens).status().code(), Code::kInvalidArgument);
  // Still usable afterwards.
  auto r = tail->forward(std::span<const BatchToken>(two, 1), one_row);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), static_cast<size_t>(tail->n_vocab()));
}

}  // namespace
}  // namespace inferd::opencl
