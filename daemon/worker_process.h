// daemon/worker_process.h — one inferd-worker child process, seen from the supervisor.
//
// spawn() creates the worker's private channels — a control socketpair, a fresh ring segment, two
// eventfds — forks and execs inferd-worker with them (and the model's weights segment) as its only
// descriptors, and opens a pidfd for it. Everything after that is asynchronous on the supervisor's
// io_context: the Hello/Ready handshake, completion wake-ups, and the pidfd turning readable when the
// process exits (however it exits: crash, kill -9, OOM killer), which is reported once through
// Events::on_exit after the child is reaped.
//
// Lifetime: owned by a shared_ptr; asynchronous handlers hold weak_ptrs, so destroying the object
// cancels everything. Destroying a live worker kills it (SIGKILL) and reaps it.
// Thread safety: every method runs on the supervisor's io_context thread.
#pragma once

#include <asio.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "inferd/ipc/ring.h"
#include "inferd/ipc/unique_fd.h"
#include "inferd/status.h"

namespace inferd::daemon {

struct WorkerSpec {
  std::string worker_path;
  std::string backend = "cpu";
  std::string model_id;
  int weights_fd = -1;     // borrowed; the worker gets its own duplicate
  int hidden_in_fd = -1;   // pipeline stages: borrowed exchanges (ipc/hidden_exchange.h), or -1
  int hidden_out_fd = -1;
  uint32_t context_size = 0, slots = 1, threads = 0, batch_tokens = 512, pad_step = 64;
  uint32_t kv_blocks = 0;  // the KV pool in blocks (0: slots × the blocks of one context)
  uint32_t first_layer = 0, end_layer = 0;
};

struct WorkerReady {
  std::string device;
  uint64_t kv_bytes = 0;
  uint64_t arena_bytes = 0;
  double start_ms = 0;
};

// A control message from a worker, decoded and checked: the worker is not trusted, so anything it
// sends that is not one of these, well formed, is an error (the supervisor then kills it). Strings are
// cut to kMaxWorkerText bytes (they end up in logs and status).
struct WorkerMessage {
  enum class Kind { kHello, kReady, kFailed, kPong };
  Kind kind = Kind::kPong;
  uint32_t protocol_version = 0;  // kHello
  WorkerReady ready;              // kReady
  std::string failure;            // kFailed
};
inline constexpr size_t kMaxWorkerText = 4096;
// `frame`: one frame's payload (ipc/frame.h), any alignment. kCorrupt naming what is wrong.
Result<WorkerMessage> decode_worker_message(std::span<const uint8_t> frame);

class WorkerProcess : public std::enable_shared_from_this<WorkerProcess> {
 public:
  struct Events {
    std::function<void(const WorkerReady&)> on_ready;
    std::function<void()> on_completion;      // the completion eventfd fired: drain the ring
    std::function<void(std::string why)> on_exit;  // the process is gone (reaped); `why` describes it
  };

  static Result<std::shared_ptr<WorkerProcess>> spawn(asio::io_context& io, const WorkerSpec& spec, Events events);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool ready() const { return ready_; }
  bool exited() const { return exited_; }
  ipc::RingSegment& ring() { return *ring_; }
  const ipc::RingSegment& ring() const { return *ring_; }
  // Wakes the worker after a submission was published.
  void notify_submission();
  // Asks the worker to exit (it finishes the step it is in). on_exit follows.
  void request_shutdown();
  // SIGKILL; on_exit follows.
  void kill();

 private:
  WorkerProcess(asio::io_context& io, WorkerSpec spec, Events events);
  void read_frame_header();
  void read_frame_body(uint32_t length);
  void handle_frame(const std::vector<uint8_t>& frame);
  void wait_completion();
  void wait_exit();
  // The exit is reported once both the pidfd said the worker ended and the control socket was read
  // to its end: a Failed message the worker wrote just before exiting is then never lost to the race
  // between the two descriptors (the client's load error carries its reason).
  void control_reader_done();
  void finish_exit();
  void send_frame(std::vector<uint8_t> frame);
  void write_next();
  void fail_protocol(const std::string& why);

  asio::io_context& io_;
  WorkerSpec spec_;
  Events events_;
  pid_t pid_ = -1;
  bool ready_ = false;
  bool exited_ = false;
  bool reaped_ = false;
  bool reader_done_ = false;  // the control socket reached EOF or stopped being read
  std::string exit_status_;   // describe_exit() of the reaped status
  std::string failure_;  // the worker's Failed message, if it sent one
  std::unique_ptr<ipc::RingSegment> ring_;
  ipc::UniqueFd submit_efd_;
  asio::local::stream_protocol::socket control_;
  asio::posix::stream_descriptor complete_efd_;
  asio::posix::stream_descriptor pidfd_;
  asio::steady_timer exit_grace_;  // after the reap: the most we wait for the control socket's EOF
  uint32_t frame_length_ = 0;
  std::vector<uint8_t> frame_;
  std::vector<std::vector<uint8_t>> write_queue_;
  bool writing_ = false;
};

}  // namespace inferd::daemon
