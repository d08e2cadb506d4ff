// libinferd-client: the plain C++ API of inferd/client.h over Cap'n Proto RPC (schemas/inferd.capnp).
//
// Every call builds a request, sends it and waits on the calling thread's kj event loop (owned by
// capnp::EzRpcClient, one per thread). Callbacks run inside that wait. The two callback servers
// (TokenSink, LoadProgress) may outlive the call that created them — the daemon holds its reference
// until it releases the capability — so they reach the caller's callback only through a shared
// CallState that the call closes when it returns.
#include "inferd/client.h"

#include <sys/un.h>
#include <unistd.h>

#include <capnp/ez-rpc.h>
#include <kj/async-io.h>
#include <kj/async.h>
#include <kj/exception.h>

#include <cstdlib>
#include <exception>
#include <utility>

#include "inferd/schemas/inferd.capnp.h"

namespace inferd::client {
namespace {

namespace rpc = ::inferd::rpc;

// ---------------------------------------------------------------------------------------------
// Errors

ErrorKind kind_of(kj::Exception::Type type) {
  switch (type) {
    case kj::Exception::Type::OVERLOADED: return ErrorKind::kOverloaded;
    case kj::Exception::Type::DISCONNECTED: return ErrorKind::kDisconnected;
    case kj::Exception::Type::UNIMPLEMENTED: return ErrorKind::kUnimplemented;
    case kj::Exception::Type::FAILED: break;
  }
  return ErrorKind::kFailed;
}

constexpr std::string_view kRemotePrefix = "remote exception: ";

bool is_remote(const kj::Exception& e) {
  return std::string_view(e.getDescription().cStr()).substr(0, kRemotePrefix.size()) == kRemotePrefix;
}

// The daemon's own words: kj wraps a remote description as "remote exception: <description>", and a
// server that threw a std::exception as "std::exception: <what>"; neither prefix helps a reader.
std::string clean_description(const kj::Exception& e) {
  std::string_view d(e.getDescription().cStr());
  for (bool again = true; again;) {
    again = false;
    for (std::string_view prefix : {kRemotePrefix, std::string_view("std::exception: ")}) {
      if (d.substr(0, prefix.size()) == prefix) {
        d.remove_prefix(prefix.size());
        again = true;
      }
    }
  }
  if (d.empty()) return "unknown error";
  return std::string(d);
}

[[noreturn]] void throw_error(const kj::Exception& e) {
  if (!is_remote(e) && e.getType() == kj::Exception::Type::DISCONNECTED) {
    // kj's own words ("Peer disconnected.") do not say which peer.
    throw Error(ErrorKind::kDisconnected, "lost the connection to inferd (" + clean_description(e) + ")");
  }
  throw Error(kind_of(e.getType()), clean_description(e));
}

// Runs `f`, turning kj exceptions into Error.
template <typename F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const kj::Exception& e) {
    throw_error(e);
  }
}

// ---------------------------------------------------------------------------------------------
// Conversions between the plain structs and the schema.

kj::StringPtr text(const std::string& s) { return kj::StringPtr(s.c_str(), s.size()); }
std::string str(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

ModelState from_rpc(rpc::ModelState s) {
  switch (s) {
    case rpc::ModelState::LOADING: return ModelState::kLoading;
    case rpc::ModelState::READY: return ModelState::kReady;
    case rpc::ModelState::RECOVERING: return ModelState::kRecovering;
    case rpc::ModelState::FAILED: return ModelState::kFailed;
  }
  return ModelState::kFailed;  // an enumerant from a newer daemon
}

FinishReason from_rpc(rpc::FinishReason r) {
  switch (r) {
    case rpc::FinishReason::END_OF_GENERATION: return FinishReason::kEndOfGeneration;
    case rpc::FinishReason::MAX_TOKENS: return FinishReason::kMaxTokens;
    case rpc::FinishReason::STOP: return FinishReason::kStop;
    case rpc::FinishReason::CONTEXT_FULL: return FinishReason::kContextFull;
  }
  return FinishReason::kEndOfGeneration;  // an enumerant from a newer daemon
}

WorkerInfo from_rpc(rpc::WorkerInfo::Reader r) {
  WorkerInfo w;
  w.index = r.getIndex();
  w.backend = str(r.getBackend());
  w.pid = r.getPid();
  w.state = str(r.getState());
  w.rss_bytes = r.getRssBytes();
  w.shared_bytes = r.getSharedBytes();
  w.uptime_ms = r.getUptimeMs();
  w.restarts = r.getRestarts();
  w.last_restart_ms = r.getLastRestartMs();
  w.steps = r.getSteps();
  w.tokens = r.getTokens();
  w.device = str(r.getDevice());
  return w;
}

ModelInfo from_rpc(rpc::ModelInfo::Reader r) {
  ModelInfo m;
  m.id = str(r.getId());
  m.path = str(r.getPath());
  m.name = str(r.getName());
  m.arch = str(r.getArch());
  m.description = str(r.getDescription());
  m.state = from_rpc(r.getState());
  m.weights_bytes = r.getWeightsBytes();
  m.weights_huge_page_bytes = r.getWeightsHugePageBytes();
  m.context_size = r.getContextSize();
  m.parallel = r.getParallel();
  m.vocab_size = r.getVocabSize();
  m.chat_template = str(r.getChatTemplate());
  auto placement = r.getPlacement();
  m.placement.summary = str(placement.getSummary());
  for (auto s : placement.getStages()) {
    m.placement.stages.push_back(PlacementStage{s.getWorker(), str(s.getBackend()), s.getFirstLayer(),
                                                s.getEndLayer(), s.getEmbeddings(), s.getOutput()});
  }
  for (auto a : placement.getAssignments()) {
    PlacementAssignment p;
    p.worker = a.getWorker();
    p.backend = str(a.getBackend());
    p.embeddings = a.getEmbeddings();
    p.first_layer = a.getFirstLayer();
    p.end_layer = a.getEndLayer();
    p.output = a.getOutput();
    for (auto op : a.getOperators()) p.operators.push_back(str(op));
    p.neuron_begin = a.getNeuronBegin();
    p.neuron_end = a.getNeuronEnd();
    p.nodes = a.getNodes();
    m.placement.assignments.push_back(std::move(p));
  }
  for (auto x : placement.getExchanges()) {
    m.placement.exchanges.push_back(
        PlacementExchange{x.getFromWorker(), x.getToWorker(), str(x.getTensor()), x.getFloatsPerToken(), str(x.getVia())});
  }
  for (auto w : r.getWorkers()) m.workers.push_back(from_rpc(w));
  m.load_ms = r.getLoadMs();
  m.keep_alive_s = r.getKeepAliveS();
  m.unload_in_s = r.getUnloadInS();
  m.load_stage = str(r.getLoadStage());
  m.load_done = r.getLoadDone();
  m.load_total = r.getLoadTotal();
  return m;
}

std::vector<ModelInfo> from_rpc(capnp::List<rpc::ModelInfo>::Reader list) {
  std::vector<ModelInfo> out;
  out.reserve(list.size());
  for (auto m : list) out.push_back(from_rpc(m));
  return out;
}

ModelStatus from_rpc(rpc::ModelStatus::Reader r) {
  ModelStatus s;
  s.info = from_rpc(r.getInfo());
  s.kv_bytes = r.getKvBytes();
  s.slots_used = r.getSlotsUsed();
  s.kv_tokens_used = r.getKvTokensUsed();
  s.requests_active = r.getRequestsActive();
  s.requests_queued = r.getRequestsQueued();
  s.requests_done = r.getRequestsDone();
  s.requests_failed = r.getRequestsFailed();
  s.prompt_tokens = r.getPromptTokens();
  s.generated_tokens = r.getGeneratedTokens();
  s.decode_tokens_per_second = r.getDecodeTokensPerSecond();
  s.replays = r.getReplays();
  s.step_compute_us = r.getStepComputeUs();
  s.step_overhead_us = r.getStepOverheadUs();
  s.cache_blocks = r.getCacheBlocks();
  s.cache_blocks_used = r.getCacheBlocksUsed();
  s.cache_blocks_cached = r.getCacheBlocksCached();
  s.cache_hits = r.getCacheHits();
  s.cache_hit_tokens = r.getCacheHitTokens();
  s.cache_evictions = r.getCacheEvictions();
  return s;
}

DaemonStatus from_rpc(rpc::DaemonStatus::Reader r) {
  DaemonStatus s;
  s.version = str(r.getVersion());
  s.protocol_version = r.getProtocolVersion();
  s.pid = r.getPid();
  s.uptime_ms = r.getUptimeMs();
  s.socket_path = str(r.getSocketPath());
  for (auto m : r.getModels()) s.models.push_back(from_rpc(m));
  s.connections = r.getConnections();
  s.requests_total = r.getRequestsTotal();
  s.requests_rejected = r.getRequestsRejected();
  s.rss_bytes = r.getRssBytes();
  return s;
}

GenerateResult from_rpc(rpc::GenerateResult::Reader r) {
  GenerateResult g;
  g.finish_reason = from_rpc(r.getFinishReason());
  g.prompt_tokens = r.getPromptTokens();
  g.generated_tokens = r.getGeneratedTokens();
  g.seed = r.getSeed();
  g.queue_ms = r.getQueueMs();
  g.time_to_first_token_ms = r.getTimeToFirstTokenMs();
  g.prompt_ms = r.getPromptMs();
  g.generate_ms = r.getGenerateMs();
  g.replays = r.getReplays();
  g.cached_tokens = r.getCachedTokens();
  return g;
}

void to_rpc(const LoadOptions& o, rpc::LoadOptions::Builder b) {
  b.setId(text(o.id));
  b.setContextSize(o.context_size);
  b.setParallel(o.parallel);
  b.setThreads(o.threads);
  b.setBackend(text(o.backend));
  b.setBatchTokens(o.batch_tokens);
  b.setPadStep(o.pad_step);
  b.setMaxQueue(o.max_queue);
  auto split = b.initLayerSplit(static_cast<unsigned>(o.layer_split.size()));
  for (unsigned i = 0; i < o.layer_split.size(); ++i) split.set(i, o.layer_split[i]);
  auto backends = b.initStageBackends(static_cast<unsigned>(o.stage_backends.size()));
  for (unsigned i = 0; i < o.stage_backends.size(); ++i) backends.set(i, text(o.stage_backends[i]));
  b.setKeepAliveS(o.keep_alive_s);
  b.setCacheTokens(o.cache_tokens);
  b.setChatTemplate(text(o.chat_template));
}

void to_rpc(const Sampling& s, rpc::Sampling::Builder b) {
  b.setTemperature(s.temperature);
  b.setTopK(s.top_k);
  b.setTopP(s.top_p);
  b.setMinP(s.min_p);
  b.setRepeatPenalty(s.repeat_penalty);
  b.setRepeatLastN(s.repeat_last_n);
  b.setFrequencyPenalty(s.frequency_penalty);
  b.setPresencePenalty(s.presence_penalty);
  b.setSeed(s.seed);
}

void to_rpc(const GenerateRequest& g, rpc::GenerateRequest::Builder b) {
  b.setModel(text(g.model));
  auto input = b.initInput();
  if (!g.messages.empty()) {
    auto messages = input.initMessages(static_cast<unsigned>(g.messages.size()));
    for (unsigned i = 0; i < g.messages.size(); ++i) {
      messages[i].setRole(text(g.messages[i].role));
      messages[i].setContent(text(g.messages[i].content));
    }
  } else if (!g.tokens.empty()) {
    auto tokens = input.initTokens(static_cast<unsigned>(g.tokens.size()));
    for (unsigned i = 0; i < g.tokens.size(); ++i) tokens.set(i, g.tokens[i]);
  } else {
    input.setPrompt(text(g.prompt));
  }
  to_rpc(g.sampling, b.initSampling());
  b.setMaxTokens(g.max_tokens);
  auto stop = b.initStop(static_cast<unsigned>(g.stop.size()));
  for (unsigned i = 0; i < g.stop.size(); ++i) stop.set(i, text(g.stop[i]));
  b.setAddSpecial(g.add_special);
  b.setParseSpecial(g.parse_special);
  b.setIgnoreEog(g.ignore_eog);
  b.setCachePrompt(g.cache_prompt);
  b.setStreamIntervalMs(g.stream_interval_ms);
}

// ---------------------------------------------------------------------------------------------
// Callback servers

// What a callback server shares with the call that created it. The call sets `open` to false when
// it returns, after which late messages are acknowledged and ignored. A callback that throws or asks
// to stop fulfils `stop`, which makes the call drop its request.
struct CallState {
  bool open = true;
  std::exception_ptr error;  // what the caller's callback threw
  kj::Own<kj::PromiseFulfiller<void>> stop;

  void request_stop() {
    open = false;
    stop->fulfill();
  }
};

// Cap'n Proto 0.9's Capability::Server has virtual methods but no virtual destructor; servers are
// only ever owned through kj::heap's kj::Own, whose disposer deletes the concrete type.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"

class TokenSinkServer final : public rpc::TokenSink::Server {
 public:
  TokenSinkServer(std::shared_ptr<CallState> state, const BatchFn* on_batch)
      : state_(std::move(state)), on_batch_(on_batch) {}

  kj::Promise<void> send(SendContext context) override {
    if (!state_->open) return kj::READY_NOW;
    auto batch = context.getParams().getBatch();
    TokenBatch out;
    for (int32_t t : batch.getTokens()) out.tokens.push_back(t);
    out.text = str(batch.getText());
    bool keep_going = false;
    try {
      keep_going = !*on_batch_ || (*on_batch_)(out);
    } catch (...) {
      state_->error = std::current_exception();
    }
    if (!keep_going) state_->request_stop();
    return kj::READY_NOW;
  }

  // The daemon's barrier after the last send(): send() above handles each batch before it is
  // acknowledged, so there is nothing left to wait for.
  kj::Promise<void> done(DoneContext context) override { return kj::READY_NOW; }

 private:
  std::shared_ptr<CallState> state_;
  const BatchFn* on_batch_;  // valid while state_->open
};

class LoadProgressServer final : public rpc::LoadProgress::Server {
 public:
  LoadProgressServer(std::shared_ptr<CallState> state, const LoadProgressFn* progress)
      : state_(std::move(state)), progress_(progress) {}

  kj::Promise<void> update(UpdateContext context) override {
    if (!state_->open) return kj::READY_NOW;
    auto p = context.getParams();
    try {
      (*progress_)(std::string_view(p.getStage().cStr(), p.getStage().size()), p.getDone(), p.getTotal());
    } catch (...) {
      state_->error = std::current_exception();
      state_->request_stop();
    }
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<CallState> state_;
  const LoadProgressFn* progress_;  // valid while state_->open
};

#pragma GCC diagnostic pop

}  // namespace

// ---------------------------------------------------------------------------------------------

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kFailed: return "failed";
    case ErrorKind::kOverloaded: return "overloaded";
    case ErrorKind::kDisconnected: return "disconnected";
    case ErrorKind::kUnimplemented: return "unimplemented";
    case ErrorKind::kConnect: return "cannot connect";
  }
  return "unknown";
}

const char* to_string(ModelState state) {
  switch (state) {
    case ModelState::kLoading: return "loading";
    case ModelState::kReady: return "ready";
    case ModelState::kRecovering: return "recovering";
    case ModelState::kFailed: return "failed";
  }
  return "unknown";
}

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndOfGeneration: return "end of generation";
    case FinishReason::kMaxTokens: return "max tokens";
    case FinishReason::kStop: return "stop string";
    case FinishReason::kContextFull: return "context full";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

Error::Error(ErrorKind kind, std::string message) : std::runtime_error(std::move(message)), kind_(kind) {}

std::string default_socket_path() {
  if (const char* env = std::getenv("INFERD_SOCKET"); env != nullptr && *env != '\0') return env;
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/inferd/inferd.sock";
  }
  if (::geteuid() == 0) return "/run/inferd/inferd.sock";
  return "/tmp/inferd-" + std::to_string(::geteuid()) + "/inferd.sock";
}

struct Client::Impl {
  Impl(std::string path, const std::string& name) : socket_path(std::move(path)) {
    if (socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
      throw Error(ErrorKind::kConnect, "cannot connect to " + socket_path + ": the path is longer than the " +
                                           std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                                           " bytes a unix socket address holds");
    }
    try {
      ez = kj::heap<capnp::EzRpcClient>(kj::str("unix:", socket_path.c_str()));
      daemon = ez->getMain<rpc::Daemon>();
      auto req = daemon.helloRequest();
      req.setClientProtocol(rpc::PROTOCOL_VERSION);
      req.setClientName(text(name));
      auto reply = req.send().wait(ez->getWaitScope());
      protocol_version = reply.getProtocolVersion();
      daemon_version = str(reply.getDaemonVersion());
      daemon_pid = reply.getPid();
    } catch (const kj::Exception& e) {
      // The daemon's own refusal (e.g. an unsupported protocol) keeps its kind; anything that went
      // wrong before the daemon answered means it could not be reached.
      if (is_remote(e)) throw_error(e);
      throw Error(ErrorKind::kConnect,
                  "cannot connect to " + socket_path + ": " + connect_reason(e) + " (is inferd running?)");
    }
  }

  // "connect(...): No such file or directory" -> "No such file or directory".
  static std::string connect_reason(const kj::Exception& e) {
    std::string d = clean_description(e);
    const size_t colon = d.rfind(": ");
    return colon == std::string::npos ? d : d.substr(colon + 2);
  }

  kj::WaitScope& wait_scope() { return ez->getWaitScope(); }

  rpc::Inference::Client& inference() {
    KJ_IF_MAYBE(i, inference_cap) { return *i; }
    inference_cap = daemon.inferenceRequest().send().getInference();
    return KJ_ASSERT_NONNULL(inference_cap);
  }

  // Asked for on first use only, so a client that only generates never needs admin rights.
  rpc::Admin::Client& admin() {
    KJ_IF_MAYBE(a, admin_cap) { return *a; }
    admin_cap = daemon.adminRequest().send().getAdmin();
    return KJ_ASSERT_NONNULL(admin_cap);
  }

  // Waits for `call` unless a callback asks to stop (or the cancel fd fires) first; then the call is
  // dropped, which cancels it at the daemon. Returns nullptr when stopped.
  template <typename T>
  kj::Maybe<T> wait_or_stop(kj::Promise<T> call, CallState& state, kj::Promise<void> stop) {
    kj::Promise<kj::Maybe<T>> result = call.then([](T&& v) -> kj::Maybe<T> { return kj::mv(v); })
                                           .exclusiveJoin(stop.then([]() -> kj::Maybe<T> { return nullptr; }));
    kj::Own<kj::AsyncInputStream> cancel_stream;
    if (cancel_fd >= 0) {
      cancel_stream = ez->getLowLevelIoProvider().wrapInputFd(cancel_fd);
      result = result.exclusiveJoin(cancel_stream->tryRead(cancel_byte, 1, 1).then(
          [](size_t) -> kj::Maybe<T> { return nullptr; }));
    }
    kj::Maybe<T> out = nullptr;
    try {
      out = result.wait(wait_scope());
    } catch (const kj::Exception& e) {
      state.open = false;
      if (state.error) std::rethrow_exception(state.error);
      throw_error(e);
    }
    state.open = false;
    if (state.error) std::rethrow_exception(state.error);
    if (out == nullptr) {
      // Let the dropped call's Finish message reach the socket before the caller moves on (or exits).
      wait_scope().poll();
    }
    return out;
  }

  std::string socket_path;
  kj::Own<capnp::EzRpcClient> ez;
  rpc::Daemon::Client daemon = nullptr;
  kj::Maybe<rpc::Inference::Client> inference_cap;
  kj::Maybe<rpc::Admin::Client> admin_cap;
  uint32_t protocol_version = 0;
  std::string daemon_version;
  uint32_t daemon_pid = 0;
  int cancel_fd = -1;
  char cancel_byte[1];
};

Client::Client(std::string socket_path, std::string client_name)
    : impl_(std::make_unique<Impl>(std::move(socket_path), client_name)) {}
Client::~Client() = default;
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

const std::string& Client::socket_path() const { return impl_->socket_path; }
uint32_t Client::protocol_version() const { return impl_->protocol_version; }
std::string Client::daemon_version() const { return impl_->daemon_version; }
uint32_t Client::daemon_pid() const { return impl_->daemon_pid; }
void Client::set_cancel_fd(int fd) { impl_->cancel_fd = fd; }

ModelInfo Client::load(const std::string& path, const LoadOptions& options, LoadProgressFn progress) {
  return translated([&]() -> ModelInfo {
    auto req = impl_->admin().loadRequest();
    req.setPath(text(path));
    to_rpc(options, req.initOptions());
    auto state = std::make_shared<CallState>();
    auto stop = kj::newPromiseAndFulfiller<void>();
    state->stop = kj::mv(stop.fulfiller);
    if (progress) req.setProgress(kj::heap<LoadProgressServer>(state, &progress));
    auto call = req.send().then([](capnp::Response<rpc::Admin::LoadResults>&& r) { return from_rpc(r.getModel()); });
    KJ_IF_MAYBE(model, impl_->wait_or_stop(kj::mv(call), *state, kj::mv(stop.promise))) { return kj::mv(*model); }
    // Only a progress callback that threw stops a load, and that is rethrown above; the cancel fd
    // is for generations only, but a load it interrupts ends the same way.
    throw Error(ErrorKind::kFailed, "load cancelled");
  });
}

void Client::unload(const std::string& id) {
  translated([&] {
    auto req = impl_->admin().unloadRequest();
    req.setId(text(id));
    req.send().wait(impl_->wait_scope());
  });
}

DaemonStatus Client::status() {
  return translated([&] {
    auto reply = impl_->admin().statusRequest().send().wait(impl_->wait_scope());
    return from_rpc(reply.getStatus());
  });
}

std::vector<ModelInfo> Client::list() {
  return translated([&] {
    auto reply = impl_->inference().listRequest().send().wait(impl_->wait_scope());
    return from_rpc(reply.getModels());
  });
}

std::vector<int32_t> Client::tokenize(const std::string& model, const std::string& input, bool add_special,
                                      bool parse_special) {
  return translated([&] {
    auto req = impl_->inference().tokenizeRequest();
    req.setModel(text(model));
    req.setText(text(input));
    req.setAddSpecial(add_special);
    req.setParseSpecial(parse_special);
    auto reply = req.send().wait(impl_->wait_scope());
    std::vector<int32_t> tokens;
    tokens.reserve(reply.getTokens().size());
    for (int32_t t : reply.getTokens()) tokens.push_back(t);
    return tokens;
  });
}

std::string Client::detokenize(const std::string& model, const std::vector<int32_t>& tokens) {
  return translated([&] {
    auto req = impl_->inference().detokenizeRequest();
    req.setModel(text(model));
    auto list = req.initTokens(static_cast<unsigned>(tokens.size()));
    for (unsigned i = 0; i < tokens.size(); ++i) list.set(i, tokens[i]);
    auto reply = req.send().wait(impl_->wait_scope());
    return str(reply.getText());
  });
}

GenerateResult Client::generate(const GenerateRequest& request, const BatchFn& on_batch) {
  return translated([&] {
    auto req = impl_->inference().generateRequest();
    to_rpc(request, req.initRequest());
    auto state = std::make_shared<CallState>();
    auto stop = kj::newPromiseAndFulfiller<void>();
    state->stop = kj::mv(stop.fulfiller);
    req.setSink(kj::heap<TokenSinkServer>(state, &on_batch));
    auto call = req.send().then(
        [](capnp::Response<rpc::Inference::GenerateResults>&& r) { return from_rpc(r.getResult()); });
    KJ_IF_MAYBE(result, impl_->wait_or_stop(kj::mv(call), *state, kj::mv(stop.promise))) { return *result; }
    GenerateResult cancelled;
    cancelled.finish_reason = FinishReason::kCancelled;
    return cancelled;
  });
}

}  // namespace inferd::client
