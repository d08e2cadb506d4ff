#include "supervisor.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "chat_template.h"
#include "inferd/graph_builder.h"
#include "inferd/placement.h"
#include "inferd/backend_names.h"
#include "inferd/ipc/hidden_exchange.h"
#include "inferd/ipc/ring.h"
#include "inferd/ipc/weights_segment.h"
#include "inferd/model.h"
#include "inferd/tokenizer.h"
#include "scheduler.h"
#include "text_output.h"
#include "worker_process.h"

namespace inferd::daemon {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

constexpr auto kShutdownGrace = std::chrono::seconds(5);

// RssAnon and RssShmem of a process, from /proc.
std::pair<uint64_t, uint64_t> process_memory(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  uint64_t anon = 0, shmem = 0;
  while (in >> key) {
    uint64_t kb = 0;
    if (key == "RssAnon:" && in >> kb) anon = kb * 1024;
    else if (key == "RssShmem:" && in >> kb) shmem = kb * 1024;
    in.ignore(1 << 20, '\n');
  }
  return {anon, shmem};
}

std::string basename_id(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0) base.resize(base.size() - 5);
  return base;
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == ':';
  });
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// ModelHost: one loaded model — its weights, tokenizer, placement plan, workers, and their scheduler.
//
// The scheduler (scheduler.h) decides what each worker computes; the host runs the worker processes
// behind it: it spawns one per pipeline stage of the placement plan, tells the scheduler when a worker
// is ready, answers or dies, restarts dead workers (more than max-restarts crashes within
// restart-window mark the model failed), and reports status.

class ModelHost : public SchedulerHost {
 public:
  // One pipeline stage: a worker process running layers [first_layer, end_layer).
  struct Stage final : StagePort {
    uint32_t index = 0, first_layer = 0, end_layer = 0;
    bool embeddings = false, output = false;
    std::string backend;  // "cpu", "opencl:1", ...: the plan's worker backend
    std::shared_ptr<WorkerProcess> worker;
    WorkerReady ready_info;
    bool ever_ready = false;
    std::optional<Clock::time_point> crashed_at;
    std::deque<Clock::time_point> crashes;
    Clock::time_point started;
    uint32_t restarts = 0;
    double last_restart_ms = 0;

    // StagePort: the current worker's ring.
    bool ready() const override { return worker && worker->ready(); }
    ipc::Submission* submission_slot() override { return worker->ring().submission_slot(); }
    void publish_submission() override {
      worker->ring().publish_submission();
      worker->notify_submission();
    }
    const ipc::Completion* next_completion() override { return worker->ring().next_completion(); }
    void release_completion() override { worker->ring().release_completion(); }
    void kill() override { worker->kill(); }
    int pid() const override { return worker ? worker->pid() : -1; }
  };

  ModelHost(Supervisor& sup, LoadSpec spec, uint64_t serial) : sup_(sup), spec_(std::move(spec)), serial_(serial) {}
  ~ModelHost() override {
    if (loader_.joinable()) loader_.join();
  }

  const LoadSpec& spec() const { return spec_; }
  uint64_t serial() const { return serial_; }  // unique per load, so a late result finds its own host
  ModelState state() const { return state_; }
  std::thread& loader() { return loader_; }

  // SchedulerHost
  Clock::time_point now() const override { return Clock::now(); }
  void arm_timer(std::chrono::milliseconds delay, std::function<void()> fire) override {
    if (!step_timer_) step_timer_ = std::make_unique<asio::steady_timer>(sup_.io());
    step_timer_->expires_after(delay);  // cancels the wait armed before
    step_timer_->async_wait([fire = std::move(fire)](std::error_code ec) {
      if (!ec) fire();
    });
  }

  // Plans the model's placement and lays it out on pipeline stages; kInvalidArgument for a bad layer
  // split, kUnimplemented for a plan the runtime cannot run yet.
  Status attach(std::shared_ptr<const ipc::WeightsSegment> weights, std::shared_ptr<const Model> model,
                std::unique_ptr<Tokenizer> tokenizer, double load_ms) {
    weights_ = std::move(weights);
    weights_huge_page_bytes_ = weights_->huge_page_bytes();
    model_ = std::move(model);
    tokenizer_ = std::move(tokenizer);
    const ModelConfig& c = model_->config();
    n_ctx_ = spec_.context_size ? spec_.context_size : static_cast<uint32_t>(default_context(c));
    auto tmpl = weights_->gguf()->get_string("tokenizer.chat_template");
    chat_template_ = detect_chat_template(tmpl ? tmpl.value() : std::string_view());
    load_ms_ = load_ms;
    // The plan, on the model's graph: which worker (backend) runs which operators.
    auto graph = graph::build_forward(*model_);
    if (!graph) return graph.status();
    auto plan = graph::plan_pipeline(c.n_layer, spec_.layer_split, spec_.backend, spec_.stage_backends);
    if (!plan) return plan.status();
    auto placed = graph::assign_nodes(graph.value(), plan.value());
    if (!placed) return placed.status();
    auto stages = graph::pipeline_stages(graph.value(), plan.value());
    if (!stages) return stages.status();
    plan_ = std::move(plan).value();
    plan_exchanges_ = graph::exchanges(graph.value(), placed.value());
    plan_nodes_.assign(plan_.workers.size(), 0);
    for (const graph::NodePlacement& p : placed.value()) {
      for (const graph::NodeShare& share : p) ++plan_nodes_[share.worker];
    }
    stages_.resize(stages->size());
    for (size_t i = 0; i < stages->size(); ++i) {
      const graph::Stage& from = (*stages)[i];
      Stage& st = stages_[i];
      st.index = static_cast<uint32_t>(i);
      st.first_layer = static_cast<uint32_t>(from.first_layer);
      st.end_layer = static_cast<uint32_t>(from.end_layer);
      st.embeddings = from.embeddings;
      st.output = from.output;
      st.backend = from.backend;
      if (i + 1 < stages->size()) {
        auto x = ipc::HiddenExchange::create(static_cast<uint32_t>(c.n_embd), spec_.batch_tokens);
        if (!x) return x.status();
        exchanges_.push_back(std::move(x).value());
      }
    }
    SchedulerOptions so;
    so.model_id = spec_.id;
    so.context_size = n_ctx_;
    so.parallel = spec_.parallel;
    so.batch_tokens = spec_.batch_tokens;
    so.max_queue = spec_.max_queue;
    so.steps_in_flight = sup_.config().steps_in_flight;
    std::vector<StagePort*> ports;
    for (Stage& st : stages_) ports.push_back(&st);
    scheduler_ = std::make_unique<Scheduler>(so, *tokenizer_, chat_template_, *this, std::move(ports));
    return Status::ok();
  }

  // Starts the workers; `ready` is called once, with OK when all are ready or the reason they are not.
  void start(std::function<void(Status)> ready) {
    first_ready_ = std::move(ready);
    for (Stage& st : stages_) spawn_worker(st);
  }

  // ---- requests -------------------------------------------------------------------------------

  Status enqueue(GenerateParams p, std::shared_ptr<GenerationStream> stream) {
    if (state_ == ModelState::kLoading) return Status(Code::kFailed, "model " + spec_.id + " is still loading");
    if (state_ == ModelState::kFailed) {
      return Status(Code::kFailed, "model " + spec_.id + " failed (" + failure_ + "); unload it and load it again");
    }
    return scheduler_->enqueue(std::move(p), std::move(stream));
  }

  void schedule() {
    if (scheduler_) scheduler_->schedule();
  }

  // ---- worker life ----------------------------------------------------------------------------

  void spawn_worker(Stage& st) {
    WorkerSpec ws;
    ws.worker_path = sup_.config().worker_path;
    ws.backend = st.backend;
    ws.model_id = spec_.id;
    ws.weights_fd = weights_->fd();
    ws.hidden_in_fd = st.index > 0 ? exchanges_[st.index - 1]->fd() : -1;
    ws.hidden_out_fd = st.index + 1 < stages_.size() ? exchanges_[st.index]->fd() : -1;
    ws.context_size = n_ctx_;
    ws.slots = spec_.parallel;
    ws.threads = spec_.threads;
    ws.batch_tokens = spec_.batch_tokens;
    ws.pad_step = spec_.pad_step;
    ws.first_layer = st.first_layer;
    ws.end_layer = st.end_layer;
    const uint32_t index = st.index;
    WorkerProcess::Events ev;
    ev.on_ready = [this, index](const WorkerReady& r) { on_ready(stages_[index], r); };
    ev.on_completion = [this, index] {
      if (stages_[index].worker) scheduler_->on_completion(index);
    };
    ev.on_exit = [this, index](std::string why) { on_exit(stages_[index], std::move(why)); };
    auto w = WorkerProcess::spawn(sup_.io(), ws, std::move(ev));
    if (!w) {
      spdlog::error("model {}: cannot start worker {}: {}", spec_.id, st.index, w.status().to_string());
      fail_backend(st, w.status().message());
      return;
    }
    st.worker = std::move(w).value();
    spdlog::info("model {}: worker {} (layers {}-{}) started as pid {}", spec_.id, st.index, st.first_layer,
                 st.end_layer - 1, st.worker->pid());
  }

  bool all_ready() const {
    return std::all_of(stages_.begin(), stages_.end(), [](const Stage& s) { return s.worker && s.worker->ready(); });
  }

  void on_ready(Stage& st, const WorkerReady& r) {
    st.ready_info = r;
    st.started = Clock::now();
    st.ever_ready = true;
    if (st.crashed_at) {
      st.last_restart_ms = ms_between(*st.crashed_at, Clock::now());
      st.crashed_at.reset();
      spdlog::info("model {}: worker {} back as pid {} in {:.1f} ms; replaying {} requests", spec_.id, st.index,
                   st.worker->pid(), st.last_restart_ms, scheduler_->stats().requests_active);
    } else {
      spdlog::info("model {}: worker {} ready ({}, KV {:.1f} MiB) in {:.1f} ms", spec_.id, st.index, r.device,
                   r.kv_bytes / 1048576.0, r.start_ms);
    }
    if (!all_ready()) return;
    state_ = ModelState::kReady;
    if (first_ready_) std::exchange(first_ready_, nullptr)(Status::ok());
    scheduler_->schedule();
  }

  void on_exit(Stage& st, std::string why) {
    // Runs inside the WorkerProcess's handler: the old worker must outlive this call.
    auto dead = st.worker;
    asio::post(sup_.io(), [dead] {});
    st.worker.reset();
    scheduler_->stage_lost(st.index);
    if (shutting_down_) {
      spdlog::info("model {}: worker {} (pid {}) {}", spec_.id, st.index, dead->pid(), why);
      if (on_stopped_ && std::none_of(stages_.begin(), stages_.end(), [](const Stage& s) { return s.worker != nullptr; })) {
        std::exchange(on_stopped_, nullptr)();
      }
      return;
    }
    if (state_ == ModelState::kFailed) {  // a failed model's workers are not restarted
      spdlog::info("model {}: worker {} (pid {}) {}", spec_.id, st.index, dead->pid(), why);
      return;
    }
    spdlog::error("model {}: worker {} (pid {}) {}", spec_.id, st.index, dead->pid(), why);
    if (first_ready_ || !st.ever_ready) {  // it never became ready: the load fails
      state_ = ModelState::kFailed;
      scheduler_->stop();
      failure_ = "worker could not start: " + why;
      for (Stage& other : stages_) {
        if (other.worker) other.worker->kill();
      }
      if (first_ready_) std::exchange(first_ready_, nullptr)(Status(Code::kFailed, failure_));
      return;
    }
    const auto now = Clock::now();
    st.crashed_at = now;
    st.crashes.push_back(now);
    const auto window = std::chrono::duration<double>(sup_.config().restart_window_s);
    while (!st.crashes.empty() && now - st.crashes.front() > window) st.crashes.pop_front();
    if (st.crashes.size() > sup_.config().max_restarts) {
      fail_backend(st, "its worker crashed " + std::to_string(st.crashes.size()) + " times in " +
                           std::to_string(static_cast<int>(sup_.config().restart_window_s)) + " s (last: " + why + ")");
      return;
    }
    // Every sequence is replayed from position 0 on every stage (the restarted worker's cache is empty).
    scheduler_->replay(why);
    ++st.restarts;
    state_ = ModelState::kRecovering;
    spawn_worker(st);
  }

  void fail_backend(const Stage& st, const std::string& why) {
    state_ = ModelState::kFailed;
    failure_ = "backend " + st.backend + (stages_.size() > 1 ? " of stage " + std::to_string(st.index) : "") +
               " failed: " + why;
    spdlog::error("model {}: {}", spec_.id, failure_);
    for (Stage& other : stages_) {  // the other pipeline stages have nothing left to do
      if (other.worker) other.worker->request_shutdown();
    }
    scheduler_->stop();
    scheduler_->fail_all(Status(Code::kDisconnected, "model " + spec_.id + ": " + failure_));
    if (first_ready_) std::exchange(first_ready_, nullptr)(Status(Code::kFailed, failure_));
  }

  // Fails every request, asks the workers to exit and calls `stopped` once they have (or were killed).
  void shutdown(const Status& why, std::function<void()> stopped) {
    shutting_down_ = true;
    if (scheduler_) {
      scheduler_->stop();
      scheduler_->fail_all(why);
    }
    if (first_ready_) std::exchange(first_ready_, nullptr)(why);
    if (std::none_of(stages_.begin(), stages_.end(), [](const Stage& s) { return s.worker != nullptr; })) {
      asio::post(sup_.io(), std::move(stopped));
      return;
    }
    on_stopped_ = std::move(stopped);
    kill_timer_ = std::make_unique<asio::steady_timer>(sup_.io(), kShutdownGrace);
    std::vector<std::weak_ptr<WorkerProcess>> weak;
    for (Stage& st : stages_) {
      if (!st.worker) continue;
      st.worker->request_shutdown();
      weak.push_back(st.worker);
    }
    kill_timer_->async_wait([weak](std::error_code ec) {
      if (ec) return;
      for (auto& w : weak) {
        if (auto p = w.lock()) p->kill();
      }
    });
  }

  // ---- reporting ------------------------------------------------------------------------------

  ModelInfoData info() const {
    ModelInfoData m;
    m.id = spec_.id;
    m.path = spec_.path;
    m.state = state_;
    m.context_size = n_ctx_;
    m.parallel = spec_.parallel;
    m.load_ms = load_ms_;
    m.chat_template = chat_template_name(chat_template_);
    if (!model_) return m;
    const ModelConfig& c = model_->config();
    m.name = c.name;
    m.arch = c.arch;
    m.description = model_->describe();
    m.vocab_size = static_cast<uint32_t>(c.n_vocab);
    m.weights_bytes = weights_->size();
    m.weights_huge_page_bytes = weights_huge_page_bytes_;
    m.placement_summary = plan_.summary();
    for (size_t i = 0; i < plan_.assignments.size(); ++i) {
      const graph::Assignment& a = plan_.assignments[i];
      PlacementAssignmentInfo p;
      p.worker = a.worker;
      p.backend = plan_.workers[a.worker].backend;
      p.embeddings = a.embeddings;
      p.first_layer = static_cast<uint32_t>(a.first_layer);
      p.end_layer = static_cast<uint32_t>(a.end_layer);
      p.output = a.output;
      for (graph::Op op : a.ops) p.operators.emplace_back(graph::op_name(op));
      p.neuron_begin = static_cast<uint64_t>(a.neuron_begin);
      p.neuron_end = static_cast<uint64_t>(a.neuron_end);
      p.nodes = plan_nodes_[a.worker];
      m.placement_assignments.push_back(p);
    }
    for (const graph::Exchange& x : plan_exchanges_) {
      m.placement_exchanges.push_back(
          PlacementExchangeInfo{x.from, x.to, x.name, static_cast<uint32_t>(x.cols), "shared memory (hidden-state exchange)"});
    }
    for (const Stage& st : stages_) {
      PlacementStageInfo p;
      p.worker = st.index;
      p.backend = st.backend;
      p.first_layer = st.first_layer;
      p.end_layer = st.end_layer;
      p.embeddings = st.embeddings;
      p.output = st.output;
      m.placement.push_back(p);

      WorkerInfoData w;
      w.index = st.index;
      w.backend = st.backend;
      w.restarts = st.restarts;
      w.last_restart_ms = st.last_restart_ms;
      w.steps = scheduler_ ? scheduler_->stage_steps(st.index) : 0;
      w.tokens = scheduler_ ? scheduler_->stage_tokens(st.index) : 0;
      w.device = st.ready_info.device;
      if (st.worker) {
        w.pid = static_cast<uint32_t>(st.worker->pid());
        w.state = st.worker->ready() ? "ready" : (st.restarts ? "restarting" : "starting");
        auto [anon, shmem] = process_memory(st.worker->pid());
        w.rss_bytes = anon;
        w.shared_bytes = shmem;
        if (st.worker->ready()) w.uptime_ms = static_cast<uint64_t>(ms_between(st.started, Clock::now()));
      } else {
        w.state = state_ == ModelState::kFailed ? "failed" : "stopped";
      }
      m.workers.push_back(w);
    }
    return m;
  }

  ModelStatusData status() const {
    ModelStatusData st;
    st.info = info();
    for (const Stage& s : stages_) st.kv_bytes += s.ready_info.kv_bytes;
    if (!scheduler_) return st;
    const SchedulerStats s = scheduler_->stats();
    st.slots_used = s.slots_used;
    st.kv_tokens_used = s.kv_tokens_used;
    st.requests_active = s.requests_active;
    st.requests_queued = s.requests_queued;
    st.requests_done = s.requests_done;
    st.requests_failed = s.requests_failed;
    st.prompt_tokens = s.prompt_tokens;
    st.generated_tokens = s.generated_tokens;
    st.replays = s.replays;
    st.step_compute_us = s.step_compute_us;
    st.step_overhead_us = s.step_overhead_us;
    st.decode_tokens_per_second = s.decode_tokens_per_second;
    return st;
  }

  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

 private:
  Supervisor& sup_;
  LoadSpec spec_;
  uint64_t serial_;
  ModelState state_ = ModelState::kLoading;
  std::string failure_;
  std::thread loader_;
  std::shared_ptr<const ipc::WeightsSegment> weights_;
  uint64_t weights_huge_page_bytes_ = 0;  // read once at attach (smaps)
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate chat_template_ = ChatTemplate::kChatml;
  uint32_t n_ctx_ = 0;
  double load_ms_ = 0;

  graph::PlacementPlan plan_;
  std::vector<graph::Exchange> plan_exchanges_;
  std::vector<uint32_t> plan_nodes_;  // graph operators per plan worker
  std::vector<Stage> stages_;  // pipeline order; sized once in attach() (handlers and the scheduler point into it)
  std::vector<std::unique_ptr<ipc::HiddenExchange>> exchanges_;  // between stage i and i + 1
  std::unique_ptr<Scheduler> scheduler_;
  std::function<void(Status)> first_ready_;
  std::function<void()> on_stopped_;
  std::unique_ptr<asio::steady_timer> kill_timer_;
  std::unique_ptr<asio::steady_timer> step_timer_;  // the scheduler's hang detector
  bool shutting_down_ = false;
};

// ------------------------------------------------------------------------------------------------
// Supervisor

Supervisor::Supervisor(DaemonConfig config)
    : config_(std::move(config)), work_(asio::make_work_guard(io_)), started_(Clock::now()) {}

Supervisor::~Supervisor() = default;

void Supervisor::run() { io_.run(); }

void Supervisor::stop() {
  if (stopping_) return;
  stopping_ = true;
  auto remaining = std::make_shared<size_t>(models_.size() + retiring_.size());
  auto done_one = [this, remaining] {
    if (--*remaining == 0) {
      work_.reset();
      io_.stop();
    }
  };
  if (*remaining == 0) {
    work_.reset();
    io_.stop();
    return;
  }
  for (auto& [id, host] : models_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
  for (auto& host : retiring_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
}

ModelHost* Supervisor::find(const std::string& id) const {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
}

void Supervisor::load(LoadSpec spec, std::shared_ptr<LoadProgressSink> progress,
                      std::function<void(Result<ModelInfoData>)> done) {
  auto fail = [&](Code code, const std::string& why) { done(Status(code, why)); };
  if (stopping_) return fail(Code::kDisconnected, "the daemon is shutting down");
  if (spec.path.empty() || spec.path[0] != '/') {
    return fail(Code::kInvalidArgument, "model path must be absolute, got '" + spec.path + "'");
  }
  if (spec.id.empty()) spec.id = basename_id(spec.path);
  if (!valid_id(spec.id)) {
    return fail(Code::kInvalidArgument, "model id '" + spec.id + "' must be 1-128 characters of A-Z a-z 0-9 . _ - :");
  }
  if (models_.count(spec.id)) return fail(Code::kInvalidArgument, "a model with id '" + spec.id + "' is already loaded");
  if (spec.backend.empty()) spec.backend = "cpu";
  // "opencl" or "opencl:N" (device N): the worker checks N against the devices it finds.
  auto check_backend = [](const std::string& name) { return check_backend_name(name); };
  if (Status s = check_backend(spec.backend); !s) return done(s);
  if (!spec.stage_backends.empty()) {
    if (spec.stage_backends.size() != spec.layer_split.size() + 1) {
      return fail(Code::kInvalidArgument, "stage backends name " + std::to_string(spec.stage_backends.size()) +
                                              " backends for " + std::to_string(spec.layer_split.size() + 1) +
                                              " pipeline stages (layer split + 1)");
    }
    for (size_t i = 0; i < spec.stage_backends.size(); ++i) {
      if (Status s = check_backend(spec.stage_backends[i]); !s) {
        return done(s.with_context("stage " + std::to_string(i)));
      }
    }
  }
  if (spec.parallel == 0) spec.parallel = config_.default_parallel;
  if (spec.parallel > ipc::kMaxStepSeqs) {
    return fail(Code::kInvalidArgument, "parallel must be in [1, " + std::to_string(ipc::kMaxStepSeqs) + "]");
  }
  if (spec.context_size == 0) spec.context_size = config_.default_context;
  if (spec.context_size != 0 && (spec.context_size < 16 || spec.context_size > 131072)) {
    return fail(Code::kInvalidArgument, "context size must be in [16, 131072]");
  }
  if (spec.threads == 0) spec.threads = config_.threads;
  if (spec.threads > 1024) return fail(Code::kInvalidArgument, "threads must be at most 1024");
  if (spec.batch_tokens == 0) spec.batch_tokens = 512;
  if (spec.batch_tokens > ipc::kMaxStepTokens) {
    return fail(Code::kInvalidArgument, "batch tokens must be in [1, " + std::to_string(ipc::kMaxStepTokens) + "]");
  }
  if (spec.pad_step == 0) spec.pad_step = 64;
  if (spec.pad_step != 64 && spec.pad_step != 128) return fail(Code::kInvalidArgument, "pad step must be 64 or 128");
  if (spec.max_queue == 0) spec.max_queue = config_.max_queue;

  const uint64_t serial = ++load_serial_;
  auto host_ptr = std::make_unique<ModelHost>(*this, spec, serial);
  ModelHost* host = host_ptr.get();
  models_.emplace(spec.id, std::move(host_ptr));
  spdlog::info("loading {} as {} ({} slots, context {}, {} threads)", spec.path, spec.id, spec.parallel,
               spec.context_size ? std::to_string(spec.context_size) : std::string("default"),
               spec.threads ? std::to_string(spec.threads) : std::string("all"));
  const auto t0 = Clock::now();
  std::string id = spec.id;
  // The copy into shared memory runs on its own thread; the result comes back to this io_context.
  host->loader() = std::thread([this, spec, progress, done, t0, id, serial]() mutable {
    if (progress) progress->update("copying", 0, 1);
    auto weights = ipc::WeightsSegment::create(spec.path, [&](uint64_t d, uint64_t t) {
      if (progress) progress->update("copying", d, t);
    });
    Result<std::shared_ptr<const Model>> model = Status(Code::kFailed, "not loaded");
    Result<std::unique_ptr<Tokenizer>> tokenizer = Status(Code::kFailed, "not loaded");
    if (weights) {
      if (progress) progress->update("validating", 0, 1);
      model = Model::load(weights.value()->gguf());
      if (model) tokenizer = Tokenizer::from_gguf(*weights.value()->gguf());
    }
    auto shared = std::make_shared<std::tuple<decltype(weights), decltype(model), decltype(tokenizer)>>(
        std::move(weights), std::move(model), std::move(tokenizer));
    asio::post(io_, [this, shared, progress, done, t0, id, serial] {
      auto& [w, m, t] = *shared;
      ModelHost* h = find(id);
      if (!h || h->serial() != serial) return done(Status(Code::kFailed, "model " + id + " was unloaded while loading"));
      Status err = !w ? w.status() : !m ? m.status() : !t ? t.status() : Status::ok();
      if (!err) {
        spdlog::error("load of {} failed: {}", id, err.to_string());
        models_.erase(id);  // joins the loader thread, which has nothing left to do
        return done(err);
      }
      Status laid_out = h->attach(std::move(w).value(), std::move(m).value(), std::move(t).value(),
                                  ms_between(t0, Clock::now()));
      if (!laid_out) {
        models_.erase(id);
        return done(laid_out);
      }
      if (progress) progress->update("starting workers", 0, 1);
      h->start([this, h, done, progress, id](Status s) {
        if (!s) {
          spdlog::error("load of {} failed: {}", id, s.to_string());
          if (ModelHost* again = find(id); again == h) {
            auto node = models_.extract(id);
            auto* raw = node.mapped().get();
            retiring_.push_back(std::move(node.mapped()));
            raw->shutdown(s, [this, raw] { std::erase_if(retiring_, [raw](auto& r) { return r.get() == raw; }); });
          }
          return done(s);
        }
        if (progress) progress->update("starting workers", 1, 1);
        spdlog::info("model {} ready: {}", id, h->info().description);
        done(h->info());
      });
    });
  });
}

Status Supervisor::unload(const std::string& id) {
  auto it = models_.find(id);
  if (it == models_.end()) return Status(Code::kNotFound, "no model with id '" + id + "' is loaded");
  ModelHost* raw = it->second.get();
  retiring_.push_back(std::move(it->second));
  models_.erase(it);
  spdlog::info("unloading {}", id);
  raw->shutdown(Status(Code::kFailed, "model " + id + " was unloaded"),
                [this, raw] { std::erase_if(retiring_, [raw](auto& r) { return r.get() == raw; }); });
  return Status::ok();
}

std::vector<ModelInfoData> Supervisor::list() const {
  std::vector<ModelInfoData> out;
  for (auto& [id, host] : models_) out.push_back(host->info());
  return out;
}

DaemonStatusData Supervisor::status() const {
  DaemonStatusData st;
  st.version = INFERD_VERSION;
  st.pid = static_cast<uint32_t>(::getpid());
  st.uptime_ms = static_cast<uint64_t>(ms_between(started_, Clock::now()));
  st.socket_path = config_.socket_path;
  for (auto& [id, host] : models_) st.models.push_back(host->status());
  st.connections = connections_;
  st.requests_total = requests_total_;
  st.requests_rejected = requests_rejected_;
  st.rss_bytes = process_memory(::getpid()).first;
  return st;
}

Result<std::vector<int32_t>> Supervisor::tokenize(const std::string& model, const std::string& text, bool add_special,
                                                  bool parse_special) const {
  ModelHost* h = find(model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + model + "' is loaded");
  if (!h->tokenizer()) return Status(Code::kFailed, "model " + model + " is still loading");
  return h->tokenizer()->encode(text, add_special, parse_special);
}

Result<std::string> Supervisor::detokenize(const std::string& model, const std::vector<int32_t>& tokens) const {
  ModelHost* h = find(model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + model + "' is loaded");
  if (!h->tokenizer()) return Status(Code::kFailed, "model " + model + " is still loading");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= h->tokenizer()->n_vocab()) {
      return Status(Code::kInvalidArgument, "token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                                                ", outside the vocabulary");
    }
  }
  return h->tokenizer()->decode(tokens, false);
}

Status Supervisor::generate(GenerateParams params, std::shared_ptr<GenerationStream> stream) {
  ++requests_total_;
  ModelHost* h = find(params.model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + params.model + "' is loaded");
  Status s = h->enqueue(std::move(params), std::move(stream));
  if (s.code() == Code::kOverloaded) ++requests_rejected_;
  return s;
}

void Supervisor::kick(const std::string& model) {
  if (ModelHost* h = find(model)) h->schedule();
}

}  // namespace inferd::daemon
