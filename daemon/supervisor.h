// daemon/supervisor.h — the supervisor: the model registry, one scheduler per model, the worker
// processes, all driven by one Asio io_context (its own thread).
//
// Actors. Each loaded model is a ModelHost that owns its weights segment, its tokenizer, its scheduler
// and its workers (WorkerProcess). They interact only through the io_context: a worker's completion,
// exit or readiness is an event on it; the RPC thread reaches the supervisor only by post()ing a
// function to it (see rpc_server.cpp), and gets answers back through cross-thread promise fulfillers
// or a GenerationStream. So no supervisor state is ever touched by two threads and nothing here
// takes a lock. Loading copies the file into shared memory on a detached loader thread, which hands
// the finished segment back to the io_context through a LoadChannel: nothing ever joins a loader, so a
// read stuck on a hung file system holds up only its own load, never the supervisor or its shutdown.
//
// Thread safety: every method except the constructor, post() and io() must run on the io_context's
// thread.
#pragma once

#include <asio.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "generation.h"
#include "histogram.h"
#include "inferd/status.h"
#include "prefix_cache.h"

namespace inferd::daemon {

struct LoadSpec {
  std::string path;
  std::string id;
  uint32_t context_size = 0, parallel = 0, threads = 0, batch_tokens = 0, pad_step = 0, max_queue = 0;
  std::string backend;
  std::vector<uint32_t> layer_split;  // first layer of each pipeline stage after the first
  // The backend of each stage (layer_split.size() + 1 names); empty: every stage runs `backend`.
  std::vector<std::string> stage_backends;
  // Unloaded after this many seconds without a request (0: never). Loads by name take keep-alive, or
  // the first request's keep_alive; later requests' keep_alive change it (loads by name only: a model an
  // admin loaded keeps the admin's setting).
  double keep_alive_s = 0;
  // KV positions kept for cached prompt prefixes beyond parallel × context_size (LoadOptions.cacheTokens).
  uint32_t cache_tokens = 0;
  // "" : the file's chat template (Jinja); else a built-in format by name (LoadOptions.chatTemplate).
  std::string chat_template;
  bool by_name = false;  // loaded on a request's first use of its name (model-dirs)
};

struct PlacementStageInfo {
  uint32_t worker = 0;
  std::string backend;
  uint32_t first_layer = 0, end_layer = 0;
  bool embeddings = false, output = false;
};

// One assignment of the placement plan (inferd/placement.h): which operators a worker runs.
struct PlacementAssignmentInfo {
  uint32_t worker = 0;
  std::string backend;
  bool embeddings = false;
  uint32_t first_layer = 0, end_layer = 0;
  bool output = false;
  std::vector<std::string> operators;  // only these (empty: every operator of the layers)
  uint64_t neuron_begin = 0, neuron_end = 0;  // FFN neurons (0, 0: all)
  uint32_t nodes = 0;                  // graph operators the worker runs
};

// A tensor that crosses workers, and how.
struct PlacementExchangeInfo {
  uint32_t from = 0, to = 0;
  std::string tensor;
  uint32_t floats_per_token = 0;
  std::string via;
};

struct WorkerInfoData {
  uint32_t index = 0;
  std::string backend;
  uint32_t pid = 0;
  std::string state;
  uint64_t rss_bytes = 0, shared_bytes = 0, uptime_ms = 0;
  uint32_t restarts = 0;
  double last_restart_ms = 0;
  uint64_t steps = 0, tokens = 0;
  std::string device;
};

enum class ModelState { kLoading, kReady, kRecovering, kFailed };

struct ModelInfoData {
  std::string id, path, name, arch, description;
  ModelState state = ModelState::kLoading;
  uint64_t weights_bytes = 0;
  uint64_t weights_huge_page_bytes = 0;
  uint32_t context_size = 0, parallel = 0, vocab_size = 0;
  std::string chat_template;
  std::vector<PlacementStageInfo> placement;
  std::string placement_summary;
  std::vector<PlacementAssignmentInfo> placement_assignments;
  std::vector<PlacementExchangeInfo> placement_exchanges;
  std::vector<WorkerInfoData> workers;
  double load_ms = 0;
  double keep_alive_s = 0;  // 0: never unloaded for idleness
  double unload_in_s = -1;  // seconds until the idle unload; -1: not scheduled (never, or busy)
  // While loading: the stage ("copying", "validating", "starting workers") and its progress.
  std::string load_stage;
  uint64_t load_done = 0, load_total = 0;
};

struct ModelStatusData {
  ModelInfoData info;
  uint64_t kv_bytes = 0;
  uint32_t slots_used = 0;
  uint64_t kv_tokens_used = 0;
  uint32_t requests_active = 0, requests_queued = 0;
  uint64_t requests_done = 0, requests_failed = 0, prompt_tokens = 0, generated_tokens = 0, replays = 0;
  uint64_t requests_cancelled = 0;
  double decode_tokens_per_second = 0;
  double step_compute_us = 0, step_overhead_us = 0;
  Histogram ttft = ttft_histogram(), token_latency = token_latency_histogram();
  PrefixCacheStats cache;
};

struct DaemonStatusData {
  std::string version;
  uint32_t pid = 0;
  uint64_t uptime_ms = 0;
  std::string socket_path;
  std::vector<ModelStatusData> models;
  uint32_t connections = 0;
  uint64_t requests_total = 0, requests_rejected = 0, rss_bytes = 0;
};

// Progress of a load, reported from the loader thread. Implementations must be thread-safe.
class LoadProgressSink {
 public:
  virtual ~LoadProgressSink() = default;
  virtual void update(const std::string& stage, uint64_t done, uint64_t total) = 0;
};

// A load's latest progress, for status (any client sees it, not only the one that asked for the
// load), passed on to the loading client's sink when there is one. Thread-safe: the loader thread
// updates it, the supervisor thread reads it.
class LoadTracker final : public LoadProgressSink {
 public:
  explicit LoadTracker(std::shared_ptr<LoadProgressSink> client) : client_(std::move(client)) {}
  void update(const std::string& stage, uint64_t done, uint64_t total) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stage_ = stage;
      done_ = done;
      total_ = total;
    }
    if (client_) client_->update(stage, done, total);
  }
  void fill(ModelInfoData& m) const {
    std::lock_guard<std::mutex> lock(mu_);
    m.load_stage = stage_;
    m.load_done = done_;
    m.load_total = total_;
  }

 private:
  std::shared_ptr<LoadProgressSink> client_;
  mutable std::mutex mu_;
  std::string stage_;
  uint64_t done_ = 0, total_ = 0;
};

class ModelHost;

// How a detached loader thread hands its result to the io_context: post() runs `fn` there, or drops
// it (returning false) once close() has been called, so a loader that finishes after the supervisor is
// gone touches nothing of it. Thread-safe.
class LoadChannel {
 public:
  explicit LoadChannel(asio::io_context& io) : io_(&io) {}
  bool post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (io_ == nullptr) return false;
    asio::post(*io_, std::move(fn));
    return true;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    io_ = nullptr;
  }

 private:
  std::mutex mutex_;
  asio::io_context* io_;
};

class Supervisor {
 public:
  explicit Supervisor(DaemonConfig config);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  asio::io_context& io() { return io_; }
  // Runs the io_context on the calling thread until stop().
  void run();
  // Any thread: runs fn on the supervisor thread.
  void post(std::function<void()> fn) { asio::post(io_, std::move(fn)); }
  // Shuts every worker down and stops run() once they are gone.
  void stop();

  void load(LoadSpec spec, std::shared_ptr<LoadProgressSink> progress,
            std::function<void(Result<ModelInfoData>)> done);
  Status unload(const std::string& id);
  std::vector<ModelInfoData> list() const;
  DaemonStatusData status() const;
  // Text work — tokenizing and detokenizing, a prompt's included — runs on the text pool, never on the
  // supervisor thread: a large text delays only its own request. Each is refused first when its text is
  // larger than max-text-bytes. `reply` is called once, on any thread (or never, if the daemon stops
  // first).
  template <typename T>
  using Reply = std::function<void(T)>;
  void tokenize(const std::string& model, std::string text, bool add_special, bool parse_special,
                Reply<Result<std::vector<int32_t>>> reply);
  void detokenize(const std::string& model, std::vector<int32_t> tokens, Reply<Result<std::string>> reply);
  // Queues a generation; results arrive on `stream`. The request is checked (unknown model, bad values,
  // a full queue: OVERLOADED) before its text is tokenized on the text pool; then it is queued, and
  // `reply` gets OK or the reason nothing was queued.
  // A model that is not loaded but is a file in model-dirs (the name, or the name + ".gguf") is loaded
  // under that name first, with keep-alive; requests for a model that is loading wait for it (at most
  // max-queue of them), then go on as any request.
  void generate(GenerateParams params, std::shared_ptr<GenerationStream> stream, Reply<Status> reply);
  // Wakes the model's scheduler to notice a cancelled stream.
  void kick(const std::string& model);

  // Counters kept by the RPC layer (supervisor thread).
  void connection_opened() { ++connections_; }
  void connection_closed() { --connections_; }

  const DaemonConfig& config() const { return config_; }

 private:
  ModelHost* find(const std::string& id) const;
  // The file for a model requested by name: "<dir>/<name>" or "<dir>/<name>.gguf" in model-dirs.
  std::optional<std::string> model_file(const std::string& name) const;
  // Requests waiting for their model's load; released when it ends.
  struct Parked {
    GenerateParams params;
    std::shared_ptr<GenerationStream> stream;
    Reply<Status> reply;
  };
  void release_parked(const std::string& id, const Status& loaded);
  // `m` with its keep-alive and the time left before its idle unload.
  ModelInfoData with_keep_alive(const ModelHost& h, ModelInfoData m) const;
  void set_keep_alive(ModelHost& h, double seconds);
  // Unloads models idle longer than their keep-alive; runs every second while one has a keep-alive.
  void sweep_idle();
  void arm_sweep();

  DaemonConfig config_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::shared_ptr<LoadChannel> loads_ = std::make_shared<LoadChannel>(io_);  // closed by ~Supervisor
  // Tokenization and detokenization, on one thread: requests keep their order (joined by ~Supervisor).
  asio::thread_pool text_pool_{1};
  std::map<std::string, std::unique_ptr<ModelHost>> models_;  // includes models still loading
  std::vector<std::unique_ptr<ModelHost>> retiring_;          // unloaded, waiting for workers to exit
  std::chrono::steady_clock::time_point started_;
  uint32_t connections_ = 0;
  uint64_t requests_total_ = 0, requests_rejected_ = 0;
  uint64_t load_serial_ = 0;
  bool stopping_ = false;
  std::map<std::string, std::vector<Parked>> parked_;
  // Idle unloads: when each model with a keep-alive was last busy.
  std::map<std::string, std::chrono::steady_clock::time_point> last_busy_;
  asio::steady_timer sweep_timer_{io_};
  bool sweep_armed_ = false;
};

}  // namespace inferd::daemon
