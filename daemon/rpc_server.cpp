#include "rpc_server.h"

// Cap'n Proto's generated Server classes and kj::TaskSet::ErrorHandler are destroyed through their
// own Own<> disposers, not through base pointers, and have no virtual destructors.
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>

#include "inferd/schemas/inferd.capnp.h"
#include "kj_bridge.h"

namespace inferd::daemon {
namespace {

kj::Exception to_exception(const Status& s) {
  kj::Exception::Type type = kj::Exception::Type::FAILED;
  switch (s.code()) {
    case Code::kOverloaded: type = kj::Exception::Type::OVERLOADED; break;
    case Code::kDisconnected: type = kj::Exception::Type::DISCONNECTED; break;
    case Code::kUnimplemented: type = kj::Exception::Type::UNIMPLEMENTED; break;
    default: break;
  }
  return kj::Exception(type, __FILE__, __LINE__, kj::str(s.message().c_str()));
}

template <typename T>
T unwrap(Result<T> r) {
  if (!r) kj::throwFatalException(to_exception(r.status()));
  return std::move(r).value();
}

rpc::ModelState to_rpc(ModelState s) {
  switch (s) {
    case ModelState::kLoading: return rpc::ModelState::LOADING;
    case ModelState::kReady: return rpc::ModelState::READY;
    case ModelState::kRecovering: return rpc::ModelState::RECOVERING;
    case ModelState::kFailed: return rpc::ModelState::FAILED;
  }
  return rpc::ModelState::FAILED;
}

void fill(rpc::ModelInfo::Builder b, const ModelInfoData& m) {
  b.setId(m.id);
  b.setPath(m.path);
  b.setName(m.name);
  b.setArch(m.arch);
  b.setDescription(m.description);
  b.setState(to_rpc(m.state));
  b.setWeightsBytes(m.weights_bytes);
  b.setWeightsHugePageBytes(m.weights_huge_page_bytes);
  b.setContextSize(m.context_size);
  b.setParallel(m.parallel);
  b.setVocabSize(m.vocab_size);
  b.setChatTemplate(m.chat_template);
  b.setLoadMs(m.load_ms);
  b.setKeepAliveS(m.keep_alive_s);
  b.setUnloadInS(m.unload_in_s);
  b.setLoadStage(m.load_stage);
  b.setLoadDone(m.load_done);
  b.setLoadTotal(m.load_total);
  auto placement = b.initPlacement();
  placement.setSummary(m.placement_summary);
  auto stages = placement.initStages(static_cast<unsigned>(m.placement.size()));
  for (unsigned i = 0; i < m.placement.size(); ++i) {
    const auto& s = m.placement[i];
    stages[i].setWorker(s.worker);
    stages[i].setBackend(s.backend);
    stages[i].setFirstLayer(s.first_layer);
    stages[i].setEndLayer(s.end_layer);
    stages[i].setEmbeddings(s.embeddings);
    stages[i].setOutput(s.output);
  }
  auto assignments = placement.initAssignments(static_cast<unsigned>(m.placement_assignments.size()));
  for (unsigned i = 0; i < m.placement_assignments.size(); ++i) {
    const auto& a = m.placement_assignments[i];
    auto o = assignments[i];
    o.setWorker(a.worker);
    o.setBackend(a.backend);
    o.setEmbeddings(a.embeddings);
    o.setFirstLayer(a.first_layer);
    o.setEndLayer(a.end_layer);
    o.setOutput(a.output);
    auto ops = o.initOperators(static_cast<unsigned>(a.operators.size()));
    for (unsigned k = 0; k < a.operators.size(); ++k) ops.set(k, a.operators[k]);
    o.setNeuronBegin(a.neuron_begin);
    o.setNeuronEnd(a.neuron_end);
    o.setNodes(a.nodes);
  }
  auto exchanges = placement.initExchanges(static_cast<unsigned>(m.placement_exchanges.size()));
  for (unsigned i = 0; i < m.placement_exchanges.size(); ++i) {
    const auto& x = m.placement_exchanges[i];
    exchanges[i].setFromWorker(x.from);
    exchanges[i].setToWorker(x.to);
    exchanges[i].setTensor(x.tensor);
    exchanges[i].setFloatsPerToken(x.floats_per_token);
    exchanges[i].setVia(x.via);
  }
  auto workers = b.initWorkers(static_cast<unsigned>(m.workers.size()));
  for (unsigned i = 0; i < m.workers.size(); ++i) {
    const auto& w = m.workers[i];
    workers[i].setIndex(w.index);
    workers[i].setBackend(w.backend);
    workers[i].setPid(w.pid);
    workers[i].setState(w.state);
    workers[i].setRssBytes(w.rss_bytes);
    workers[i].setSharedBytes(w.shared_bytes);
    workers[i].setUptimeMs(w.uptime_ms);
    workers[i].setRestarts(w.restarts);
    workers[i].setLastRestartMs(w.last_restart_ms);
    workers[i].setSteps(w.steps);
    workers[i].setTokens(w.tokens);
    workers[i].setDevice(w.device);
  }
}

void fill_list(capnp::List<rpc::ModelInfo>::Builder out, const std::vector<ModelInfoData>& models) {
  for (unsigned i = 0; i < models.size(); ++i) fill(out[i], models[i]);
}

// Converts and checks the shape of a request (the supervisor checks the values against the model).
Result<GenerateParams> to_params(rpc::GenerateRequest::Reader r) {
  GenerateParams p;
  p.model = r.getModel();
  auto in = r.getInput();
  switch (in.which()) {
    case rpc::GenerateRequest::Input::PROMPT:
      p.input = GenerateParams::Input::kPrompt;
      p.prompt = in.getPrompt();
      break;
    case rpc::GenerateRequest::Input::MESSAGES:
      p.input = GenerateParams::Input::kMessages;
      for (auto m : in.getMessages()) p.messages.push_back({m.getRole(), m.getContent()});
      break;
    case rpc::GenerateRequest::Input::TOKENS:
      p.input = GenerateParams::Input::kTokens;
      for (int32_t t : in.getTokens()) p.tokens.push_back(t);
      break;
    default:
      return Status(Code::kInvalidArgument, "the request's input is of a kind this daemon does not know");
  }
  auto s = r.getSampling();
  p.sampling.temperature = s.getTemperature();
  p.sampling.top_k = s.getTopK();
  p.sampling.top_p = s.getTopP();
  p.sampling.min_p = s.getMinP();
  p.sampling.repeat_penalty = s.getRepeatPenalty();
  p.sampling.repeat_last_n = s.getRepeatLastN();
  p.sampling.frequency_penalty = s.getFrequencyPenalty();
  p.sampling.presence_penalty = s.getPresencePenalty();
  p.sampling.seed = s.getSeed();
  p.max_tokens = r.getMaxTokens();
  for (auto stop : r.getStop()) p.stop.emplace_back(stop.cStr(), stop.size());
  p.add_special = r.getAddSpecial();
  p.parse_special = r.getParseSpecial();
  p.ignore_eog = r.getIgnoreEog();
  p.cache_prompt = r.getCachePrompt();
  p.stream_interval_ms = r.getStreamIntervalMs();
  if (p.stream_interval_ms < -1 || p.stream_interval_ms > static_cast<int32_t>(kMaxStreamIntervalMs)) {
    return Status(Code::kInvalidArgument, "streamIntervalMs is " + std::to_string(p.stream_interval_ms) +
                                              " (expected -1 for the daemon's default, or 0.." +
                                              std::to_string(kMaxStreamIntervalMs) + ")");
  }
  return p;
}

rpc::FinishReason to_rpc(FinishReason r) {
  switch (r) {
    case FinishReason::kEndOfGeneration: return rpc::FinishReason::END_OF_GENERATION;
    case FinishReason::kMaxTokens: return rpc::FinishReason::MAX_TOKENS;
    case FinishReason::kStop: return rpc::FinishReason::STOP;
    case FinishReason::kContextFull: return rpc::FinishReason::CONTEXT_FULL;
  }
  return rpc::FinishReason::END_OF_GENERATION;
}

// Load progress from the loader thread to this thread; only the latest value matters.
class ProgressRelay final : public LoadProgressSink {
 public:
  ~ProgressRelay() noexcept override {}
  struct Update {
    std::string stage;
    uint64_t done = 0, total = 0;
  };
  void update(const std::string& stage, uint64_t done, uint64_t total) override {
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter;
    {
      std::lock_guard<std::mutex> lock(mu_);
      latest_ = Update{stage, done, total};
      waiter = kj::mv(waiter_);
    }
    if (waiter.get() != nullptr) waiter->fulfill();
  }
  void close() { update("", 0, 0); }
  kj::Promise<void> ready() {
    std::lock_guard<std::mutex> lock(mu_);
    if (latest_) return kj::READY_NOW;
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    waiter_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }
  std::optional<Update> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(latest_, std::nullopt);
  }

 private:
  std::mutex mu_;
  std::optional<Update> latest_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter_;
};

kj::Promise<void> relay_progress(std::shared_ptr<ProgressRelay> relay, rpc::LoadProgress::Client cap) {
  return relay->ready().then([relay, cap]() mutable -> kj::Promise<void> {
    auto u = relay->take();
    if (!u || u->stage.empty()) return kj::READY_NOW;  // closed
    auto req = cap.updateRequest();
    req.setStage(u->stage);
    req.setDone(u->done);
    req.setTotal(u->total);
    return req.send().then([relay, cap]() mutable { return relay_progress(relay, cap); });
  });
}

// Admin.list and Inference.list: the same answer on both capabilities.
template <typename Context>
kj::Promise<void> list_models(Supervisor& sup, Context context) {
  return on_supervisor<std::vector<ModelInfoData>>(sup, [&sup] { return sup.list(); })
      .then([context](std::vector<ModelInfoData> models) mutable {
        fill_list(context.getResults().initModels(static_cast<unsigned>(models.size())), models);
      });
}

struct Peer {
  uint32_t pid = 0, uid = 0, gid = 0;
  bool known = false;
};

class AdminImpl final : public rpc::Admin::Server {
 public:
  explicit AdminImpl(Supervisor& sup) : sup_(sup) {}

  kj::Promise<void> load(LoadContext context) override {
    auto params = context.getParams();
    auto o = params.getOptions();
    LoadSpec spec;
    spec.path = params.getPath();
    spec.id = o.getId();
    spec.context_size = o.getContextSize();
    spec.parallel = o.getParallel();
    spec.threads = o.getThreads();
    spec.backend = o.getBackend();
    spec.batch_tokens = o.getBatchTokens();
    spec.pad_step = o.getPadStep();
    spec.max_queue = o.getMaxQueue();
    for (uint32_t b : o.getLayerSplit()) spec.layer_split.push_back(b);
    for (capnp::Text::Reader b : o.getStageBackends()) spec.stage_backends.emplace_back(b.cStr(), b.size());
    spec.keep_alive_s = o.getKeepAliveS();
    spec.cache_tokens = o.getCacheTokens();
    spec.chat_template = std::string(o.getChatTemplate().cStr(), o.getChatTemplate().size());
    auto relay = std::make_shared<ProgressRelay>();
    kj::Promise<void> progress = kj::READY_NOW;
    if (params.hasProgress()) {
      progress = relay_progress(relay, params.getProgress()).catch_([](kj::Exception&&) {}).eagerlyEvaluate(nullptr);
    }
    auto paf = kj::newPromiseAndCrossThreadFulfiller<Result<ModelInfoData>>();
    auto holder = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<Result<ModelInfoData>>>>(kj::mv(paf.fulfiller));
    Supervisor& sup = sup_;
    sup_.post([&sup, spec, relay, holder] {
      sup.load(spec, relay, [holder](Result<ModelInfoData> r) { (*holder)->fulfill(std::move(r)); });
    });
    return paf.promise.then([context, relay, progress = kj::mv(progress)](Result<ModelInfoData> r) mutable {
      relay->close();
      return progress.then([context, r = std::move(r)]() mutable {
        fill(context.getResults().initModel(), unwrap(std::move(r)));
      });
    });
  }

  kj::Promise<void> unload(UnloadContext context) override {
    std::string id = context.getParams().getId();
    Supervisor& sup = sup_;
    return on_supervisor<Status>(sup_, [&sup, id] { return sup.unload(id); }).then([](Status s) {
      if (!s) kj::throwFatalException(to_exception(s));
    });
  }

  kj::Promise<void> list(ListContext context) override { return list_models(sup_, context); }

  kj::Promise<void> status(StatusContext context) override {
    Supervisor& sup = sup_;
    return on_supervisor<DaemonStatusData>(sup_, [&sup] { return sup.status(); }).then([context](DaemonStatusData d) mutable {
      auto b = context.getResults().initStatus();
      b.setVersion(d.version);
      b.setProtocolVersion(rpc::PROTOCOL_VERSION);
      b.setPid(d.pid);
      b.setUptimeMs(d.uptime_ms);
      b.setSocketPath(d.socket_path);
      b.setConnections(d.connections);
      b.setRequestsTotal(d.requests_total);
      b.setRequestsRejected(d.requests_rejected);
      b.setRssBytes(d.rss_bytes);
      auto models = b.initModels(static_cast<unsigned>(d.models.size()));
      for (unsigned i = 0; i < d.models.size(); ++i) {
        const ModelStatusData& m = d.models[i];
        fill(models[i].initInfo(), m.info);
        models[i].setKvBytes(m.kv_bytes);
        models[i].setSlotsUsed(m.slots_used);
        models[i].setKvTokensUsed(m.kv_tokens_used);
        models[i].setRequestsActive(m.requests_active);
        models[i].setRequestsQueued(m.requests_queued);
        models[i].setRequestsDone(m.requests_done);
        models[i].setRequestsFailed(m.requests_failed);
        models[i].setPromptTokens(m.prompt_tokens);
        models[i].setGeneratedTokens(m.generated_tokens);
        models[i].setDecodeTokensPerSecond(m.decode_tokens_per_second);
        models[i].setReplays(m.replays);
        models[i].setStepComputeUs(m.step_compute_us);
        models[i].setStepOverheadUs(m.step_overhead_us);
        models[i].setCacheBlocks(m.cache.blocks);
        models[i].setCacheBlocksUsed(m.cache.blocks_used);
        models[i].setCacheBlocksCached(m.cache.blocks_cached);
        models[i].setCacheHits(m.cache.hits);
        models[i].setCacheHitTokens(m.cache.hit_tokens);
        models[i].setCacheEvictions(m.cache.evictions);
      }
    });
  }

 private:
  Supervisor& sup_;
};

class InferenceImpl final : public rpc::Inference::Server {
 public:
  // `client`: who is connected, for fairness between clients ("uid N", "" when unknown).
  InferenceImpl(Supervisor& sup, kj::Timer& timer, std::string client)
      : sup_(sup), timer_(timer), client_(std::move(client)) {}

  kj::Promise<void> list(ListContext context) override { return list_models(sup_, context); }

  kj::Promise<void> tokenize(TokenizeContext context) override {
    auto p = context.getParams();
    std::string model = p.getModel(), text = p.getText();
    bool add = p.getAddSpecial(), parse = p.getParseSpecial();
    Supervisor& sup = sup_;
    return on_supervisor_async<Result<std::vector<int32_t>>>(sup_, [&sup, model, text, add, parse](auto reply) {
             sup.tokenize(model, text, add, parse, std::move(reply));
           })
        .then([context](Result<std::vector<int32_t>> r) mutable {
          auto ids = unwrap(std::move(r));
          auto out = context.getResults().initTokens(static_cast<unsigned>(ids.size()));
          for (unsigned i = 0; i < ids.size(); ++i) out.set(i, ids[i]);
        });
  }

  kj::Promise<void> detokenize(DetokenizeContext context) override {
    auto p = context.getParams();
    std::string model = p.getModel();
    std::vector<int32_t> ids;
    for (int32_t t : p.getTokens()) ids.push_back(t);
    Supervisor& sup = sup_;
    return on_supervisor_async<Result<std::string>>(sup_, [&sup, model, ids](auto reply) {
             sup.detokenize(model, ids, std::move(reply));
           })
        .then([context](Result<std::string> r) mutable { context.getResults().setText(unwrap(std::move(r))); });
  }

  kj::Promise<void> generate(GenerateContext context) override {
    context.allowCancellation();
    auto params = to_params(context.getParams().getRequest());
    if (!params) return to_exception(params.status());
    auto sink = context.getParams().getSink();
    auto stream = std::make_shared<GenerationStream>();
    daemon::GenerateParams gp = std::move(params).value();
    gp.client = client_;
    const uint32_t interval_ms = gp.stream_interval_ms >= 0 ? static_cast<uint32_t>(gp.stream_interval_ms)
                                                            : sup_.config().stream_interval_ms;
    // Dropping the promise (the client cancelled or disconnected) stops the sequence at its next step.
    return start_generation(sup_, std::move(gp), stream,
                            [this, stream, sink, context, interval_ms](Status s) mutable -> kj::Promise<void> {
                              if (!s) return to_exception(s);
                              return pump(stream, sink, context, timer_, interval_ms,
                                          stream_stall_timeout(sup_.config()), true);
                            });
  }

 private:
  // Sends the stream's batches in order: the first as soon as it is ready, then at most one per
  // `interval_ms` (the end of the stream cuts a wait short).
  static kj::Promise<void> pump(std::shared_ptr<GenerationStream> stream, rpc::TokenSink::Client sink,
                                GenerateContext context, kj::Timer& timer, uint32_t interval_ms, kj::Duration stall,
                                bool first) {
    kj::Promise<void> pace = kj::READY_NOW;
    if (!first && interval_ms > 0) {
      pace = timer.afterDelay(interval_ms * kj::MILLISECONDS).exclusiveJoin(stream->ready(/*end_only=*/true));
    }
    return pace.then([stream] { return stream->ready(); }).then([stream, sink, context, &timer, interval_ms, stall]() mutable -> kj::Promise<void> {
      GenerationStream::Batch batch = stream->take();
      kj::Promise<void> sent = kj::READY_NOW;
      if (!batch.tokens.empty() || !batch.text.empty()) {
        auto req = sink.sendRequest();
        auto b = req.initBatch();
        auto t = b.initTokens(static_cast<unsigned>(batch.tokens.size()));
        for (unsigned i = 0; i < batch.tokens.size(); ++i) t.set(i, batch.tokens[i]);
        b.setText(batch.text);
        // A client that does not take its tokens is cut off: dropping the chain cancels the generation.
        sent = timer.timeoutAfter(stall, req.send());
      }
      if (!batch.end) {
        return sent.then([stream, sink, context, &timer, interval_ms, stall]() mutable {
          return pump(stream, sink, context, timer, interval_ms, stall, false);
        });
      }
      // The barrier: every batch has been handled by the client before generate returns.
      auto flushed = sent.then([sink]() mutable {
        // A sink without done() (UNIMPLEMENTED, or pycapnp's AttributeError) only loses the barrier.
        return sink.doneRequest().send().ignoreResult().catch_([](kj::Exception&&) {});
      });
      return flushed.then([context, end = std::move(*batch.end)]() mutable {
        GenerateSummary s = unwrap(std::move(end));
        auto r = context.getResults().initResult();
        r.setFinishReason(to_rpc(s.reason));
        r.setPromptTokens(s.prompt_tokens);
        r.setGeneratedTokens(s.generated_tokens);
        r.setSeed(s.seed);
        r.setQueueMs(s.queue_ms);
        r.setTimeToFirstTokenMs(s.time_to_first_token_ms);
        r.setPromptMs(s.prompt_ms);
        r.setGenerateMs(s.generate_ms);
        r.setReplays(s.replays);
        r.setCachedTokens(s.cached_tokens);
      });
    });
  }

  Supervisor& sup_;
  kj::Timer& timer_;
  std::string client_;
};

class DaemonImpl final : public rpc::Daemon::Server {
 public:
  DaemonImpl(Supervisor& sup, Peer peer, kj::Timer& timer) : sup_(sup), peer_(peer), timer_(timer) {}

  kj::Promise<void> hello(HelloContext context) override {
    auto p = context.getParams();
    if (p.getClientProtocol() != rpc::PROTOCOL_VERSION) {
      return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                           kj::str("this daemon serves protocol version ", rpc::PROTOCOL_VERSION,
                                   "; the client speaks version ", p.getClientProtocol()));
    }
    spdlog::debug("client '{}' (pid {}) says hello", p.getClientName().cStr(), peer_.pid);
    auto r = context.getResults();
    r.setProtocolVersion(rpc::PROTOCOL_VERSION);
    r.setDaemonVersion(INFERD_VERSION);
    r.setPid(static_cast<uint32_t>(::getpid()));
    return kj::READY_NOW;
  }

  kj::Promise<void> inference(InferenceContext context) override {
    context.getResults().setInference(
        kj::heap<InferenceImpl>(sup_, timer_, peer_.known ? "uid " + std::to_string(peer_.uid) : std::string()));
    return kj::READY_NOW;
  }

  kj::Promise<void> admin(AdminContext context) override {
    // Admin loads files the daemon can read and stops models: the daemon's own uid and root, the
    // configured admin-uids, or every peer only when configured so (admin-uids = any).
    const DaemonConfig& cfg = sup_.config();
    const auto& uids = cfg.admin_uids;
    bool allowed = cfg.admin_any || (peer_.known && (peer_.uid == ::getuid() || peer_.uid == 0 ||
                                                     std::find(uids.begin(), uids.end(), peer_.uid) != uids.end()));
    if (!allowed) {
      spdlog::warn("admin refused to uid {} (pid {})", peer_.uid, peer_.pid);
      return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                           kj::str("permission denied: admin calls are for the daemon's own uid, root and the "
                                   "configured admin-uids, and uid ",
                                   peer_.uid, " is none of them"));
    }
    context.getResults().setAdmin(kj::heap<AdminImpl>(sup_));
    return kj::READY_NOW;
  }

 private:
  Supervisor& sup_;
  Peer peer_;
  kj::Timer& timer_;
};

// What one connection may make the daemon hold: a message is read only up to the traversal limit (a
// request's text is limited by max-text-bytes; the message may hold little more), and the calls in
// flight on a connection are limited in total size (Cap'n Proto's flow limit: past it the connection
// is not read until calls finish), so a client cannot pile up memory with pipelined calls.
capnp::ReaderOptions receive_options(const DaemonConfig& config) {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = (2 * uint64_t{config.max_text_bytes} + (uint64_t{1} << 20)) / sizeof(capnp::word);
  o.nestingLimit = 64;
  return o;
}

struct Connection {
  Connection(kj::Own<kj::AsyncIoStream> s, capnp::Capability::Client bootstrap, const DaemonConfig& config)
      : stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, receive_options(config)),
        rpc(capnp::makeRpcServer(network, kj::mv(bootstrap))) {
    rpc.setFlowLimit(4 * (uint64_t{config.max_text_bytes} + (uint64_t{1} << 20)) / sizeof(capnp::word));
  }
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
};

class TaskLogger final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override {
    spdlog::info("connection ended: {}", e.getDescription().cStr());
  }
};

}  // namespace

struct RpcServer::Impl {
  Supervisor& sup;
  kj::Timer& timer;
  kj::Own<kj::ConnectionReceiver> listener;
  TaskLogger logger;
  kj::TaskSet tasks{logger};

  Impl(Supervisor& s, kj::Timer& t, kj::Own<kj::ConnectionReceiver> l) : sup(s), timer(t), listener(kj::mv(l)) {}

  kj::Promise<void> accept_loop() {
    return listener->accept().then([this](kj::Own<kj::AsyncIoStream> stream) {
      Peer peer;
      KJ_IF_MAYBE(fd, stream->getFd()) {
        struct ucred cred {};
        socklen_t len = sizeof(cred);
        if (::getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
          peer = Peer{static_cast<uint32_t>(cred.pid), cred.uid, cred.gid, true};
        }
      }
      spdlog::info("connection from pid {} uid {} gid {}", peer.pid, peer.uid, peer.gid);
      Supervisor& s = sup;
      sup.post([&s] { s.connection_opened(); });
      auto conn = kj::heap<Connection>(kj::mv(stream), kj::heap<DaemonImpl>(sup, peer, timer), sup.config());
      auto done = conn->network.onDisconnect();
      tasks.add(done.attach(kj::mv(conn), kj::defer([&s] { s.post([&s] { s.connection_closed(); }); })));
      return accept_loop();
    });
  }
};

RpcServer::RpcServer(Supervisor& supervisor, kj::AsyncIoProvider& io, kj::LowLevelAsyncIoProvider& low, int listen_fd)
    : impl_(std::make_unique<Impl>(supervisor, io.getTimer(),
                                   low.wrapListenSocketFd(listen_fd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP))) {}

RpcServer::~RpcServer() = default;

kj::Promise<void> RpcServer::run() { return impl_->accept_loop(); }

Status check_socket_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return errno_error("cannot stat " + dir);
  if (S_ISLNK(st.st_mode)) return Status(Code::kFailed, dir + " is a symbolic link; refusing to put the socket there");
  if (!S_ISDIR(st.st_mode)) return Status(Code::kFailed, dir + " is not a directory");
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return Status(Code::kFailed, dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to this daemon's uid " +
                                     std::to_string(::geteuid()) + " or root; refusing to put the socket there");
  }
  if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return Status(Code::kFailed, dir + " is writable by every user and not sticky; refusing to put the socket there");
  }
  return Status::ok();
}

Result<int> listen_unix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status(Code::kInvalidArgument, "socket path is longer than " + std::to_string(sizeof(addr.sun_path) - 1) +
                                              " bytes: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) {
    if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
    if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) return errno_error("cannot create " + dir.string());
  }
  if (!dir.empty()) INFERD_RETURN_IF_ERROR(check_socket_dir(dir.string()));
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_error("socket");
  // A socket file left by a crashed daemon: remove it, unless a daemon still answers on it.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      ::close(fd);
      return Status(Code::kFailed, path + " exists and is not a socket; refusing to replace it");
    }
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      ::close(fd);
      return Status(Code::kFailed, "another inferd is already serving " + path);
    }
    ::close(fd);
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    spdlog::info("removing stale socket {} left by an earlier run", path);
    ::unlink(path.c_str());
  }
  mode_t old = ::umask(0117);  // the socket is created 0660
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::umask(old);
  if (rc != 0) {
    Status s = errno_error("cannot bind " + path);
    ::close(fd);
    return s;
  }
  ::chmod(path.c_str(), 0660);
  if (::listen(fd, 128) != 0) {
    Status s = errno_error("cannot listen on " + path);
    ::close(fd);
    return s;
  }
  return fd;
}

}  // namespace inferd::daemon
