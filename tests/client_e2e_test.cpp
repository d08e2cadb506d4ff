// libinferd-client against the real daemon: a real `inferd` with real `inferd-worker` processes,
// compared with the in-process engine. (The client's own tests use an in-process fake daemon; this
// one checks the library and the daemon against each other.)
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "inferd/client.h"
#include "inferd/engine.h"
#include "inferd/model.h"

namespace {

using namespace inferd::client;

const std::string kModel = INFERD_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

bool can_connect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// One inferd on a private socket for the whole test suite.
class DaemonFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    char tmpl[] = "/tmp/inferd-client-e2e-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    socket_ = dir_ + "/inferd.sock";
    const std::string exe = INFERD_BIN_DIR "/inferd";
    pid_ = ::fork();
    if (pid_ == 0) {
      std::string log = dir_ + "/inferd.log";
      FILE* f = std::freopen(log.c_str(), "w", stderr);
      (void)f;
      ::execl(exe.c_str(), exe.c_str(), "--socket", socket_.c_str(), "--threads", "1", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Bounded wait for the socket (the daemon is up in milliseconds).
    for (int i = 0; i < 1000 && !can_connect(socket_); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  static void TearDownTestSuite() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "inferd did not stop cleanly";
      std::filesystem::remove_all(dir_);
    }
  }
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "model not found: " << kModel << " (run scripts/setup.sh)";
    ASSERT_TRUE(can_connect(socket_)) << "inferd did not come up on " << socket_;
  }

  static inline std::string dir_, socket_;
  static inline pid_t pid_ = -1;
};

// The greedy tokens the in-process engine produces for `prompt`.
std::vector<int32_t> engine_greedy(const std::vector<int32_t>& prompt, int n) {
  auto model = inferd::Model::open(kModel);
  EXPECT_TRUE(model.is_ok());
  inferd::EngineOptions o;
  o.n_threads = 1;
  o.n_ctx = 256;
  auto engine = std::move(inferd::Engine::create(model.value(), o)).value();
  std::vector<int32_t> out;
  auto logits = engine->eval(0, prompt);
  for (int i = 0; i < n; ++i) {
    std::span<const float> l = logits.value();
    int32_t t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(t);
    logits = engine->eval(0, std::span<const int32_t>(&t, 1));
  }
  return out;
}

TEST_F(DaemonFixture, LoadGenerateStatusUnloadEqualsTheInProcessEngine) {
  Client client(socket_, "client_e2e_test");
  EXPECT_EQ(client.protocol_version(), 1u);
  std::vector<std::string> stages;
  LoadOptions lo;
  lo.id = "e2e";
  lo.context_size = 256;
  lo.parallel = 2;
  ModelInfo info = client.load(kModel, lo, [&](std::string_view stage, uint64_t, uint64_t) {
    if (stages.empty() || stages.back() != stage) stages.emplace_back(stage);
  });
  EXPECT_EQ(info.id, "e2e");
  EXPECT_EQ(info.arch, "llama");
  EXPECT_GT(info.weights_bytes, 90u << 20);
  EXPECT_FALSE(stages.empty());

  const std::vector<int32_t> prompt = client.tokenize("e2e", "The capital of France is", true, false);
  ASSERT_FALSE(prompt.empty());
  GenerateRequest req;
  req.model = "e2e";
  req.tokens = prompt;
  req.sampling.temperature = 0.0f;
  req.max_tokens = 16;
  req.ignore_eog = true;
  std::vector<int32_t> got;
  std::string text;
  GenerateResult r = client.generate(req, [&](const TokenBatch& b) {
    got.insert(got.end(), b.tokens.begin(), b.tokens.end());
    text += b.text;
    return true;
  });
  EXPECT_EQ(r.finish_reason, FinishReason::kMaxTokens);
  EXPECT_EQ(r.generated_tokens, 16u);
  EXPECT_EQ(got, engine_greedy(prompt, 16)) << "the daemon's greedy tokens differ from the in-process engine's";
  EXPECT_EQ(client.detokenize("e2e", got), text);

  DaemonStatus st = client.status();
  ASSERT_EQ(st.models.size(), 1u);
  EXPECT_EQ(st.models[0].generated_tokens, 16u);
  ASSERT_EQ(st.models[0].info.workers.size(), 1u);
  EXPECT_GT(st.models[0].info.workers[0].pid, 0u);
  EXPECT_GT(st.models[0].step_compute_us, 0.0);

  // Errors by kind.
  GenerateRequest bad = req;
  bad.model = "nope";
  try {
    client.generate(bad, [](const TokenBatch&) { return true; });
    ADD_FAILURE() << "an unknown model was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFailed);
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
  bad = req;
  bad.sampling.top_p = 1.5f;
  EXPECT_THROW(client.generate(bad, [](const TokenBatch&) { return true; }), Error);
  for (int32_t interval : {-2, 60001}) {
    bad = req;
    bad.stream_interval_ms = interval;
    try {
      client.generate(bad, [](const TokenBatch&) { return true; });
      ADD_FAILURE() << "streamIntervalMs " << interval << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFailed);
      EXPECT_NE(std::string(e.what()).find("streamIntervalMs"), std::string::npos) << e.what();
    }
  }

  // Stream pacing: with a 60 s interval the first batch comes at once and every other token with the
  // end, which cuts the wait short; the tokens are those of the unpaced stream.
  GenerateRequest paced = req;
  paced.stream_interval_ms = 60000;
  std::vector<size_t> batch_sizes;
  std::vector<int32_t> paced_tokens;
  const auto t0 = std::chrono::steady_clock::now();
  GenerateResult pr = client.generate(paced, [&](const TokenBatch& b) {
    batch_sizes.push_back(b.tokens.size());
    paced_tokens.insert(paced_tokens.end(), b.tokens.begin(), b.tokens.end());
    return true;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << "the last batch was held back";
  EXPECT_EQ(pr.generated_tokens, 16u);
  EXPECT_EQ(paced_tokens, got);
  ASSERT_EQ(batch_sizes.size(), 2u) << "expected the first batch, then the rest with the end";
  EXPECT_GE(batch_sizes[0], 1u);

  // Cancelling from the callback frees the slot.
  GenerateRequest longer = req;
  longer.max_tokens = 200;
  int batches = 0;
  GenerateResult c = client.generate(longer, [&](const TokenBatch&) { return ++batches < 3; });
  EXPECT_EQ(c.finish_reason, FinishReason::kCancelled);
  // The daemon frees the slot at its next step boundary; status shows it within a bounded wait.
  bool freed = false;
  for (int i = 0; i < 500 && !freed; ++i) {
    freed = client.status().models[0].slots_used == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(freed) << "the cancelled request still holds a KV slot";

  client.unload("e2e");
  EXPECT_TRUE(client.list().empty());
}

TEST(ClientWithoutDaemon, ConnectErrorNamesTheSocket) {
  try {
    Client c("/tmp/inferd-no-such-dir/inferd.sock");
    ADD_FAILURE() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConnect);
    EXPECT_NE(std::string(e.what()).find("/tmp/inferd-no-such-dir/inferd.sock"), std::string::npos) << e.what();
  }
}

}  // namespace
