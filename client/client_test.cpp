// Tests of libinferd-client against a fake daemon served in the same thread: the Client and the
// fake's EzRpcServer share the thread's kj event loop, so while the Client waits for a reply the
// loop runs the fake too. Nothing sleeps; where the test needs the fake to have seen something (a
// cancellation), it waits on a promise the fake fulfils.
#include "inferd/client.h"

#include <fcntl.h>
#include <unistd.h>

#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>
#include <kj/async.h>
#include <kj/debug.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "inferd/testing/scoped_env.h"

#include "inferd/schemas/inferd.capnp.h"

namespace inferd::client {
namespace {

namespace rpc = ::inferd::rpc;

enum class GenerateMode { kStream, kOverloaded, kHang };

// What the fake saw and how it behaves; owned by the test fixture, outlives the servers' calls.
struct FakeState {
  int admin_calls = 0;
  int inference_calls = 0;
  std::string client_name;
  GenerateMode generate_mode = GenerateMode::kStream;

  // The last generate request, flattened.
  std::string input_kind, prompt, model;
  std::vector<std::string> message_texts;  // "role:content"
  std::vector<int32_t> tokens;
  std::vector<std::string> stop;
  float temperature = -1;
  int32_t top_k = 0;
  uint64_t seed = 0;
  uint32_t max_tokens = 0;
  bool ignore_eog = false;

  std::vector<uint32_t> layer_split;  // of the last load
  std::vector<std::string> stage_backends;

  kj::Own<kj::PromiseFulfiller<void>> cancelled;  // fulfilled when a hanging generate is dropped
};

kj::Exception remote_error(kj::Exception::Type type, const char* what) {
  return kj::Exception(type, __FILE__, __LINE__, kj::heapString(what));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"  // see client.cpp: owned by kj::heap only

void fill_model(rpc::ModelInfo::Builder m, const char* id) {
  m.setId(id);
  m.setPath("/models/fake.gguf");
  m.setArch("llama");
  m.setState(rpc::ModelState::READY);
  m.setWeightsBytes(106332160);
  m.setContextSize(2048);
  m.setParallel(4);
  m.getPlacement().setSummary("cpu:0 layers 0-29 + output");
  auto stages = m.getPlacement().initStages(1);
  stages[0].setBackend("cpu");
  stages[0].setEndLayer(30);
  stages[0].setOutput(true);
  auto workers = m.initWorkers(1);
  workers[0].setPid(777);
  workers[0].setState("ready");
  workers[0].setLastRestartMs(12.5);
}

class FakeInference final : public rpc::Inference::Server {
 public:
  explicit FakeInference(FakeState& state) : state_(state) {}

  kj::Promise<void> list(ListContext context) override {
    fill_model(context.getResults().initModels(1)[0], "fake");
    return kj::READY_NOW;
  }

  kj::Promise<void> tokenize(TokenizeContext context) override {
    auto p = context.getParams();
    if (p.getModel() != "fake") throw remote_error(kj::Exception::Type::FAILED, "unknown model 'nope'");
    // One token per byte, plus a BOS of 1 when asked for.
    kj::StringPtr input = p.getText();
    const bool bos = p.getAddSpecial();
    auto tokens = context.getResults().initTokens(static_cast<unsigned>(input.size() + (bos ? 1 : 0)));
    unsigned i = 0;
    if (bos) tokens.set(i++, 1);
    for (char c : input) tokens.set(i++, static_cast<unsigned char>(c));
    return kj::READY_NOW;
  }

  kj::Promise<void> detokenize(DetokenizeContext context) override {
    std::string out;
    for (int32_t t : context.getParams().getTokens()) out += static_cast<char>(t);
    context.getResults().setText(out);
    return kj::READY_NOW;
  }

  kj::Promise<void> generate(GenerateContext context) override {
    auto req = context.getParams().getRequest();
    record(req);
    switch (state_.generate_mode) {
      case GenerateMode::kOverloaded:
        throw remote_error(kj::Exception::Type::OVERLOADED, "admission queue full (64 waiting)");
      case GenerateMode::kHang: {
        // Cap'n Proto 0.9 cancels a server call on the client's Finish only where the server allows
        // it; inferd's generate must do the same for dropping the call to cancel the generation.
        context.allowCancellation();
        FakeState* state = &state_;
        return kj::Promise<void>(kj::NEVER_DONE).attach(kj::defer([state] { state->cancelled->fulfill(); }));
      }
      case GenerateMode::kStream: break;
    }
    auto sink = context.getParams().getSink();
    return send(sink, {1, 2}, "Hel")
        .then([this, sink]() mutable { return send(sink, {3}, "lo"); })
        .then([this, sink]() mutable { return send(sink, {4}, "!"); })
        .then([sink]() mutable { return sink.doneRequest().send(); })  // fails the call if unimplemented
        .then([context](auto&&) mutable {
          auto r = context.getResults().initResult();
          r.setFinishReason(rpc::FinishReason::MAX_TOKENS);
          r.setPromptTokens(5);
          r.setGeneratedTokens(4);
          r.setSeed(99);
          r.setTimeToFirstTokenMs(1.5);
          r.setReplays(1);
        });
  }

 private:
  kj::Promise<void> send(rpc::TokenSink::Client& sink, std::vector<int32_t> tokens, const char* text) {
    auto req = sink.sendRequest();
    auto batch = req.initBatch();
    auto list = batch.initTokens(static_cast<unsigned>(tokens.size()));
    for (unsigned i = 0; i < tokens.size(); ++i) list.set(i, tokens[i]);
    batch.setText(text);
    return req.send();
  }

  void record(rpc::GenerateRequest::Reader req) {
    state_.model = req.getModel();
    state_.message_texts.clear();
    state_.tokens.clear();
    state_.stop.clear();
    state_.prompt.clear();
    auto input = req.getInput();
    switch (input.which()) {
      case rpc::GenerateRequest::Input::PROMPT:
        state_.input_kind = "prompt";
        state_.prompt = input.getPrompt();
        break;
      case rpc::GenerateRequest::Input::MESSAGES:
        state_.input_kind = "messages";
        for (auto m : input.getMessages()) {
          state_.message_texts.push_back(std::string(m.getRole().cStr()) + ":" + m.getContent().cStr());
        }
        break;
      case rpc::GenerateRequest::Input::TOKENS:
        state_.input_kind = "tokens";
        for (int32_t t : input.getTokens()) state_.tokens.push_back(t);
        break;
    }
    for (auto s : req.getStop()) state_.stop.push_back(s);
    state_.temperature = req.getSampling().getTemperature();
    state_.top_k = req.getSampling().getTopK();
    state_.seed = req.getSampling().getSeed();
    state_.max_tokens = req.getMaxTokens();
    state_.ignore_eog = req.getIgnoreEog();
  }

  FakeState& state_;
};

class FakeAdmin final : public rpc::Admin::Server {
 public:
  explicit FakeAdmin(FakeState& state) : state_(state) {}

  kj::Promise<void> load(LoadContext context) override {
    auto params = context.getParams();
    if (params.getPath() == "/missing.gguf") {
      throw remote_error(kj::Exception::Type::FAILED, "cannot open /missing.gguf: No such file or directory");
    }
    std::string id = params.getOptions().getId();
    state_.layer_split.clear();
    for (uint32_t l : params.getOptions().getLayerSplit()) state_.layer_split.push_back(l);
    state_.stage_backends.clear();
    for (auto b : params.getOptions().getStageBackends()) state_.stage_backends.emplace_back(b.cStr());
    auto progress = params.getProgress();
    auto first = progress.updateRequest();
    first.setStage("validating");
    first.setDone(1);
    first.setTotal(1);
    return first.send()
        .then([progress]() mutable {
          auto r = progress.updateRequest();
          r.setStage("copying");
          r.setDone(50);
          r.setTotal(100);
          return r.send();
        })
        .then([context, id]() mutable { fill_model(context.getResults().initModel(), id.c_str()); });
  }

  kj::Promise<void> unload(UnloadContext context) override {
    if (context.getParams().getId() != "fake") throw remote_error(kj::Exception::Type::FAILED, "no model 'x'");
    return kj::READY_NOW;
  }

  kj::Promise<void> status(StatusContext context) override {
    auto s = context.getResults().initStatus();
    s.setVersion("0.1.0-fake");
    s.setPid(4242);
    s.setConnections(1);
    auto models = s.initModels(1);
    fill_model(models[0].initInfo(), "fake");
    models[0].setSlotsUsed(2);
    models[0].setDecodeTokensPerSecond(80.5);
    return kj::READY_NOW;
  }

 private:
  FakeState& state_;
};

class FakeDaemon final : public rpc::Daemon::Server {
 public:
  explicit FakeDaemon(FakeState& state) : state_(state) {}

  kj::Promise<void> hello(HelloContext context) override {
    state_.client_name = context.getParams().getClientName();
    if (state_.client_name == "too-new") {
      throw remote_error(kj::Exception::Type::FAILED, "protocol version 1 is not served");
    }
    auto r = context.getResults();
    r.setProtocolVersion(rpc::PROTOCOL_VERSION);
    r.setDaemonVersion("0.1.0-fake");
    r.setPid(4242);
    return kj::READY_NOW;
  }

  kj::Promise<void> inference(InferenceContext context) override {
    ++state_.inference_calls;
    context.getResults().setInference(kj::heap<FakeInference>(state_));
    return kj::READY_NOW;
  }

  kj::Promise<void> admin(AdminContext context) override {
    ++state_.admin_calls;
    context.getResults().setAdmin(kj::heap<FakeAdmin>(state_));
    return kj::READY_NOW;
  }

 private:
  FakeState& state_;
};

#pragma GCC diagnostic pop

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "inferd-client-test-" + std::to_string(::getpid()) + ".sock";
    ::unlink(path_.c_str());
    server_ = std::make_unique<capnp::EzRpcServer>(kj::heap<FakeDaemon>(*fake_), kj::str("unix:", path_.c_str()));
    server_->getPort().wait(wait_scope());  // listening from here on
  }
  void TearDown() override {
    server_.reset();
    ::unlink(path_.c_str());
  }
  kj::WaitScope& wait_scope() { return server_->getWaitScope(); }

  // Behind a pointer: kj::Own members make FakeState's destructor noexcept(false).
  std::unique_ptr<FakeState> fake_ = std::make_unique<FakeState>();
  std::string path_;
  std::unique_ptr<capnp::EzRpcServer> server_;
};

TEST_F(ClientTest, HelloReportsDaemonAndSendsClientName) {
  Client client(path_, "unit-test");
  EXPECT_EQ(client.protocol_version(), 1u);
  EXPECT_EQ(client.daemon_version(), "0.1.0-fake");
  EXPECT_EQ(client.daemon_pid(), 4242u);
  EXPECT_EQ(client.socket_path(), path_);
  EXPECT_EQ(fake_->client_name, "unit-test");
}

TEST_F(ClientTest, RefusedHelloIsTheDaemonsErrorNotAConnectError) {
  try {
    Client client(path_, "too-new");
    FAIL() << "hello should have been refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFailed);
    EXPECT_STREQ(e.what(), "protocol version 1 is not served");
  }
}

TEST_F(ClientTest, GenerateStreamsBatchesInOrderAndReturnsTheResult) {
  Client client(path_);
  GenerateRequest req;
  req.model = "fake";
  req.prompt = "Hi";
  req.sampling.temperature = 0;
  req.sampling.seed = 7;
  req.max_tokens = 4;
  req.stop = {"\n\n", "END"};
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> tokens;
  GenerateResult r = client.generate(req, [&](const TokenBatch& b) {
    texts.push_back(b.text);
    tokens.push_back(b.tokens);
    return true;
  });
  EXPECT_EQ(texts, (std::vector<std::string>{"Hel", "lo", "!"}));
  EXPECT_EQ(tokens, (std::vector<std::vector<int32_t>>{{1, 2}, {3}, {4}}));
  EXPECT_EQ(r.finish_reason, FinishReason::kMaxTokens);
  EXPECT_EQ(r.prompt_tokens, 5u);
  EXPECT_EQ(r.generated_tokens, 4u);
  EXPECT_EQ(r.seed, 99u);
  EXPECT_DOUBLE_EQ(r.time_to_first_token_ms, 1.5);
  EXPECT_EQ(r.replays, 1u);
  EXPECT_EQ(fake_->input_kind, "prompt");
  EXPECT_EQ(fake_->prompt, "Hi");
  EXPECT_EQ(fake_->stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(fake_->temperature, 0.0f);
  EXPECT_EQ(fake_->top_k, 40);
  EXPECT_EQ(fake_->seed, 7u);
  EXPECT_EQ(fake_->max_tokens, 4u);
}

TEST_F(ClientTest, MessagesWinOverTokensWhichWinOverPrompt) {
  Client client(path_);
  auto ignore = [](const TokenBatch&) { return true; };
  GenerateRequest req;
  req.model = "fake";
  req.prompt = "ignored";
  req.tokens = {5, 6};
  req.messages = {{"system", "be brief"}, {"user", "hi"}};
  client.generate(req, ignore);
  EXPECT_EQ(fake_->input_kind, "messages");
  EXPECT_EQ(fake_->message_texts, (std::vector<std::string>{"system:be brief", "user:hi"}));
  req.messages.clear();
  client.generate(req, ignore);
  EXPECT_EQ(fake_->input_kind, "tokens");
  EXPECT_EQ(fake_->tokens, (std::vector<int32_t>{5, 6}));
  req.tokens.clear();
  client.generate(req, ignore);
  EXPECT_EQ(fake_->input_kind, "prompt");
  EXPECT_EQ(fake_->prompt, "ignored");
}

TEST_F(ClientTest, ReturningFalseCancelsAtTheDaemon) {
  Client client(path_);
  int batches = 0;
  GenerateRequest req;
  req.model = "fake";
  GenerateResult r = client.generate(req, [&](const TokenBatch&) { return ++batches < 2; });
  EXPECT_EQ(r.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(batches, 2);  // the third batch is never delivered

  // A hanging generation is cancelled at the daemon when the call is dropped.
  fake_->generate_mode = GenerateMode::kHang;
  auto cancelled = kj::newPromiseAndFulfiller<void>();
  fake_->cancelled = kj::mv(cancelled.fulfiller);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "x", 1), 1);
  client.set_cancel_fd(fds[0]);
  r = client.generate(req, [](const TokenBatch&) { return true; });
  EXPECT_EQ(r.finish_reason, FinishReason::kCancelled);
  cancelled.promise.wait(wait_scope());  // hangs (and the test times out) if the daemon never saw it
  char byte;
  EXPECT_EQ(::read(fds[0], &byte, 1), -1) << "the cancelling byte should have been consumed";
  EXPECT_EQ(errno, EAGAIN);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_F(ClientTest, CallbackExceptionsPropagateUnchanged) {
  Client client(path_);
  GenerateRequest req;
  req.model = "fake";
  EXPECT_THROW(client.generate(req, [](const TokenBatch&) -> bool { throw std::logic_error("from callback"); }),
               std::logic_error);
  // The client is still usable afterwards.
  EXPECT_EQ(client.list().size(), 1u);
}

TEST_F(ClientTest, ErrorKindAndMessageComeFromTheDaemon) {
  Client client(path_);
  fake_->generate_mode = GenerateMode::kOverloaded;
  GenerateRequest req;
  req.model = "fake";
  try {
    client.generate(req, [](const TokenBatch&) { return true; });
    FAIL() << "expected OVERLOADED";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOverloaded);
    EXPECT_STREQ(e.what(), "admission queue full (64 waiting)");
  }
  try {
    client.tokenize("nope", "x");
    FAIL() << "expected FAILED";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFailed);
    EXPECT_STREQ(e.what(), "unknown model 'nope'");
  }
}

TEST_F(ClientTest, TokenizeAndDetokenize) {
  Client client(path_);
  EXPECT_EQ(client.tokenize("fake", "ab"), (std::vector<int32_t>{1, 'a', 'b'}));
  EXPECT_EQ(client.tokenize("fake", "ab", /*add_special=*/false), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_EQ(client.detokenize("fake", {'o', 'k'}), "ok");
}

TEST_F(ClientTest, AdminIsAskedForOnlyWhenNeededAndOnce) {
  Client client(path_);
  GenerateRequest req;
  req.model = "fake";
  client.generate(req, [](const TokenBatch&) { return true; });
  ASSERT_EQ(client.list().size(), 1u);
  EXPECT_EQ(fake_->admin_calls, 0);
  EXPECT_EQ(fake_->inference_calls, 1);
  DaemonStatus s = client.status();
  client.status();
  EXPECT_EQ(fake_->admin_calls, 1);
  EXPECT_EQ(s.version, "0.1.0-fake");
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].slots_used, 2u);
  EXPECT_DOUBLE_EQ(s.models[0].decode_tokens_per_second, 80.5);
  const ModelInfo& m = s.models[0].info;
  EXPECT_EQ(m.state, ModelState::kReady);
  EXPECT_EQ(m.weights_bytes, 106332160u);
  EXPECT_EQ(m.placement.summary, "cpu:0 layers 0-29 + output");
  ASSERT_EQ(m.placement.stages.size(), 1u);
  EXPECT_EQ(m.placement.stages[0].end_layer, 30u);
  EXPECT_TRUE(m.placement.stages[0].output);
  ASSERT_EQ(m.workers.size(), 1u);
  EXPECT_EQ(m.workers[0].pid, 777u);
  EXPECT_DOUBLE_EQ(m.workers[0].last_restart_ms, 12.5);
}

TEST_F(ClientTest, LoadReportsProgressAndReturnsTheModel) {
  Client client(path_);
  std::vector<std::string> seen;
  LoadOptions options;
  options.id = "mine";
  options.layer_split = {10, 20};
  options.stage_backends = {"opencl", "cpu", "opencl:1"};
  ModelInfo m = client.load("/models/fake.gguf", options, [&](std::string_view stage, uint64_t done, uint64_t total) {
    seen.push_back(std::string(stage) + " " + std::to_string(done) + "/" + std::to_string(total));
  });
  EXPECT_EQ(m.id, "mine");
  EXPECT_EQ(fake_->layer_split, (std::vector<uint32_t>{10, 20}));
  EXPECT_EQ(fake_->stage_backends, (std::vector<std::string>{"opencl", "cpu", "opencl:1"}));
  EXPECT_EQ(seen, (std::vector<std::string>{"validating 1/1", "copying 50/100"}));
  try {
    client.load("/missing.gguf", {});
    FAIL() << "expected FAILED";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFailed);
    EXPECT_STREQ(e.what(), "cannot open /missing.gguf: No such file or directory");
  }
  client.unload("fake");
  EXPECT_THROW(client.unload("x"), Error);
}

TEST(ClientConnectTest, MissingSocketIsAConnectError) {
  const std::string path = ::testing::TempDir() + "inferd-client-test-no-such-dir/inferd.sock";
  try {
    Client client(path);
    FAIL() << "connected to a socket that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConnect);
    EXPECT_EQ(std::string(e.what()),
              "cannot connect to " + path + ": No such file or directory (is inferd running?)");
  }
}

using inferd::testing::ScopedEnv;

TEST(DefaultSocketPathTest, FollowsTheDocumentedOrder) {
  {
    ScopedEnv socket("INFERD_SOCKET", "/x/y.sock");
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/1000");
    EXPECT_EQ(default_socket_path(), "/x/y.sock");
  }
  {
    ScopedEnv socket("INFERD_SOCKET", "");
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/1000");
    EXPECT_EQ(default_socket_path(), "/run/user/1000/inferd/inferd.sock");
  }
  {
    ScopedEnv socket("INFERD_SOCKET", std::nullopt);
    ScopedEnv xdg("XDG_RUNTIME_DIR", std::nullopt);
    EXPECT_EQ(default_socket_path(), ::geteuid() == 0 ? std::string("/run/inferd/inferd.sock")
                                                      : "/tmp/inferd-" + std::to_string(::geteuid()) +
                                                            "/inferd.sock");
  }
}

TEST(ToStringTest, NamesAreStable) {
  EXPECT_STREQ(to_string(FinishReason::kEndOfGeneration), "end of generation");
  EXPECT_STREQ(to_string(FinishReason::kCancelled), "cancelled");
  EXPECT_STREQ(to_string(ModelState::kRecovering), "recovering");
  EXPECT_STREQ(to_string(ErrorKind::kOverloaded), "overloaded");
}

}  // namespace
}  // namespace inferd::client
