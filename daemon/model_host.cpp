#include "model_host.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>

#include "inferd/graph_builder.h"

namespace inferd::daemon {

namespace {

constexpr auto kShutdownGrace = std::chrono::seconds(5);

}  // namespace

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

ModelHost::~ModelHost() = default;

void ModelHost::arm_timer(std::chrono::milliseconds delay, std::function<void()> fire) {
  if (!step_timer_) step_timer_ = std::make_unique<asio::steady_timer>(sup_.io());
  step_timer_->expires_after(delay);  // cancels the wait armed before
  step_timer_->async_wait([fire = std::move(fire)](std::error_code ec) {
    if (!ec) fire();
  });
}

Status ModelHost::attach(std::shared_ptr<const ipc::WeightsSegment> weights, std::shared_ptr<const Model> model,
                           std::shared_ptr<const Tokenizer> tokenizer, double load_ms) {
  weights_ = std::move(weights);
  weights_huge_page_bytes_ = weights_->huge_page_bytes();
  model_ = std::move(model);
  tokenizer_ = std::move(tokenizer);
  const ModelConfig& c = model_->config();
  n_ctx_ = spec_.context_size ? spec_.context_size : static_cast<uint32_t>(default_context(c));
  // The KV pool: a context for every slot, plus the room asked for cached prefixes (prefix_cache.h).
  kv_blocks_ = spec_.parallel * static_cast<uint32_t>(graph::kv_blocks_per_slot(static_cast<int32_t>(n_ctx_))) +
               (spec_.cache_tokens + graph::kKvBlockTokens - 1) / graph::kKvBlockTokens;
  // Chat: a built-in format asked for by name; else the file's own template; else the arch's format.
  auto tmpl = weights_->gguf()->get_string("tokenizer.chat_template");
  if (!spec_.chat_template.empty()) {
    auto family = chat_template_by_name(spec_.chat_template);
    if (!family) return family.status();
    chat_ = ChatFormatter::builtin(*family);
  } else if (tmpl && !tmpl->empty()) {
    auto text = [&](int32_t id) { return id >= 0 ? std::string(tokenizer_->token_text(id)) : std::string(); };
    chat_ = ChatFormatter::jinja(*tmpl, text(tokenizer_->bos()), text(tokenizer_->eos()));
  } else {
    chat_ = ChatFormatter::builtin(detect_chat_template({}, c.arch));
  }
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
  so.kv_blocks = kv_blocks_;
  so.n_embd = static_cast<uint32_t>(c.n_embd);
  so.client_max_queue = sup_.config().client_max_queue;
  so.client_max_slots = sup_.config().client_max_slots;
  so.step_timeout = std::chrono::milliseconds(static_cast<int64_t>(sup_.config().step_timeout_s * 1000.0));
  std::vector<StagePort*> ports;
  for (Stage& st : stages_) ports.push_back(&st);
  scheduler_ = std::make_unique<Scheduler>(so, *tokenizer_, chat_, *this, std::move(ports));
  return Status::ok();
}

void ModelHost::start(std::function<void(Status)> ready) {
  first_ready_ = std::move(ready);
  for (Stage& st : stages_) spawn_worker(st);
}

Status ModelHost::admit(const GenerateParams& p) const {
  if (state_ == ModelState::kLoading) return Status(Code::kFailed, "model " + spec_.id + " is still loading");
  if (state_ == ModelState::kFailed) {
    return Status(Code::kFailed, "model " + spec_.id + " failed (" + failure_ + "); unload it and load it again");
  }
  return scheduler_->admit(p);
}

Result<std::string> ModelHost::prompt_text(const GenerateParams& p) const {
  INFERD_ASSERT(scheduler_ != nullptr);
  return scheduler_->prompt_text(p);
}

Status ModelHost::enqueue(GenerateParams p, std::shared_ptr<GenerationStream> stream) {
  if (state_ == ModelState::kLoading) return Status(Code::kFailed, "model " + spec_.id + " is still loading");
  if (state_ == ModelState::kFailed) {
    return Status(Code::kFailed, "model " + spec_.id + " failed (" + failure_ + "); unload it and load it again");
  }
  return scheduler_->enqueue(std::move(p), std::move(stream));
}

void ModelHost::schedule() {
  if (scheduler_) scheduler_->schedule();
}

void ModelHost::spawn_worker(Stage& st) {
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
  ws.kv_blocks = kv_blocks_;
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
  // A worker that never gets ready (stuck before Hello, or making its backend) is killed: its exit is
  // then handled like a crash (restart, or the load fails past max-restarts).
  if (!st.start_timer) st.start_timer = std::make_unique<asio::steady_timer>(sup_.io());
  const double timeout_s = sup_.config().start_timeout_s;
  st.start_timer->expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
  std::weak_ptr<WorkerProcess> weak = st.worker;
  st.start_timer->async_wait([this, weak, timeout_s, id = spec_.id](std::error_code ec) {
    if (ec) return;
    std::shared_ptr<WorkerProcess> worker = weak.lock();
    if (!worker || worker->ready()) return;
    spdlog::error("model {}: worker {} is not ready {} s after it started; killing it", id, worker->pid(), timeout_s);
    worker->kill();
  });
}

bool ModelHost::all_ready() const {
  return std::all_of(stages_.begin(), stages_.end(), [](const Stage& s) { return s.worker && s.worker->ready(); });
}

void ModelHost::on_ready(Stage& st, const WorkerReady& r) {
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

void ModelHost::on_exit(Stage& st, std::string why) {
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

void ModelHost::fail_backend(const Stage& st, const std::string& why) {
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

void ModelHost::shutdown(const Status& why, std::function<void()> stopped) {
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

ModelInfoData ModelHost::info() const {
  ModelInfoData m;
  m.id = spec_.id;
  m.path = spec_.path;
  m.state = state_;
  m.context_size = n_ctx_;
  m.parallel = spec_.parallel;
  m.load_ms = load_ms_;
  m.chat_template = chat_.name();
  if (state_ == ModelState::kLoading && load_tracker_) load_tracker_->fill(m);
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

size_t ModelHost::in_flight() const { return scheduler_ ? scheduler_->in_flight() : 0; }

ModelStatusData ModelHost::status() const {
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
  st.requests_cancelled = s.requests_cancelled;
  st.ttft = s.ttft;
  st.token_latency = s.token_latency;
  st.prompt_tokens = s.prompt_tokens;
  st.generated_tokens = s.generated_tokens;
  st.replays = s.replays;
  st.step_compute_us = s.step_compute_us;
  st.step_overhead_us = s.step_overhead_us;
  st.decode_tokens_per_second = s.decode_tokens_per_second;
  st.cache = s.cache;
  return st;
}

}  // namespace inferd::daemon
