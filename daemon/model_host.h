// daemon/model_host.h — one loaded model in the supervisor: its weights, tokenizer, placement plan, the
// worker processes of its pipeline stages, and the scheduler that drives them.
//
// The scheduler (scheduler.h) decides what each worker computes; the host runs the worker processes
// behind it: it plans the model's placement (placement.h) and spawns one worker per pipeline stage, tells
// the scheduler when a worker is ready, answers or dies, restarts dead workers (more than max-restarts
// crashes within restart-window mark the model failed), and reports status.
//
// Thread safety: every method runs on the supervisor's io_context thread. (A load's detached loader thread
// touches no ModelHost: it copies the file and posts the result back.)
#pragma once

#include <asio.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chat_template.h"
#include "generation.h"
#include "inferd/ipc/hidden_exchange.h"
#include "inferd/ipc/weights_segment.h"
#include "inferd/model.h"
#include "inferd/placement.h"
#include "inferd/tokenizer.h"
#include "scheduler.h"
#include "supervisor.h"
#include "worker_process.h"

namespace inferd::daemon {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// RssAnon and RssShmem of a process, from /proc.
std::pair<uint64_t, uint64_t> process_memory(pid_t pid);

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
    std::unique_ptr<asio::steady_timer> start_timer;  // start-timeout of the current worker

    // StagePort: the current worker's ring.
    bool ready() const override { return worker && worker->ready(); }
    ipc::Submission* submission_slot() override { return worker->ring().submission_slot(); }
    void publish_submission() override {
      worker->ring().publish_submission();
      worker->notify_submission();
    }
    const ipc::Completion* next_completion() override { return worker->ring().next_completion(); }
    void release_completion() override { worker->ring().release_completion(); }
    bool broken() const override { return worker && worker->ring().broken(); }
    void kill() override {
      if (worker) worker->kill();
    }
    int pid() const override { return worker ? worker->pid() : -1; }
  };

  ModelHost(Supervisor& sup, LoadSpec spec, uint64_t serial) : sup_(sup), spec_(std::move(spec)), serial_(serial) {}
  ~ModelHost() override;

  const LoadSpec& spec() const { return spec_; }
  // A by-name model's keep-alive, as a request's keep_alive sets it.
  void set_keep_alive(double seconds) { spec_.keep_alive_s = seconds; }
  // Where the load stands, for info() while loading.
  void set_load_tracker(std::shared_ptr<const LoadTracker> t) { load_tracker_ = std::move(t); }
  uint64_t serial() const { return serial_; }  // unique per load, so a late result finds its own host
  ModelState state() const { return state_; }

  // SchedulerHost
  Clock::time_point now() const override { return Clock::now(); }
  void arm_timer(std::chrono::milliseconds delay, std::function<void()> fire) override;

  // Plans the model's placement and lays it out on pipeline stages; kInvalidArgument for a bad layer
  // split, kUnimplemented for a plan the runtime cannot run yet.
  Status attach(std::shared_ptr<const ipc::WeightsSegment> weights, std::shared_ptr<const Model> model,
                std::shared_ptr<const Tokenizer> tokenizer, double load_ms);

  // Starts the workers; `ready` is called once, with OK when all are ready or the reason they are not.
  void start(std::function<void(Status)> ready);

  // ---- requests -------------------------------------------------------------------------------

  Status enqueue(GenerateParams p, std::shared_ptr<GenerationStream> stream);
  // Whether a request can be taken now, checked before its text is tokenized (Scheduler::admit).
  Status admit(const GenerateParams& p) const;
  Result<std::string> prompt_text(const GenerateParams& p) const;
  void schedule();

  // ---- worker life ----------------------------------------------------------------------------

  void spawn_worker(Stage& st);
  bool all_ready() const;
  void on_ready(Stage& st, const WorkerReady& r);
  void on_exit(Stage& st, std::string why);
  void fail_backend(const Stage& st, const std::string& why);

  // Fails every request, asks the workers to exit and calls `stopped` once they have (or were killed).
  void shutdown(const Status& why, std::function<void()> stopped);

  // ---- reporting ------------------------------------------------------------------------------

  ModelInfoData info() const;
  ModelStatusData status() const;
  // Requests active or queued on the model (0 before its scheduler exists); cheap, unlike status().
  size_t in_flight() const;

  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // For tokenization off the supervisor thread: the tokenizer outlives an unload while it is in use.
  std::shared_ptr<const Tokenizer> shared_tokenizer() const { return tokenizer_; }

 private:
  Supervisor& sup_;
  LoadSpec spec_;
  uint64_t serial_;
  ModelState state_ = ModelState::kLoading;
  std::string failure_;
  std::shared_ptr<const ipc::WeightsSegment> weights_;
  uint64_t weights_huge_page_bytes_ = 0;  // read once at attach (smaps)
  std::shared_ptr<const Model> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  ChatFormatter chat_;
  uint32_t n_ctx_ = 0;
  uint32_t kv_blocks_ = 0;  // the workers' KV pool (blocks of graph::kKvBlockTokens positions)
  double load_ms_ = 0;
  std::shared_ptr<const LoadTracker> load_tracker_;

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


}  // namespace inferd::daemon
