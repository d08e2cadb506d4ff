#include "worker_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "config.h"
#include "inferd/ipc/frame.h"
#include "inferd/schemas/worker.capnp.h"

namespace inferd::daemon {
namespace {

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) +
           ")";
  }
  return "ended (status " + std::to_string(status) + ")";
}

}  // namespace

WorkerProcess::WorkerProcess(asio::io_context& io, WorkerSpec spec, Events events)
    : io_(io),
      spec_(std::move(spec)),
      events_(std::move(events)),
      control_(io),
      complete_efd_(io),
      pidfd_(io),
      exit_grace_(io) {}

Result<std::shared_ptr<WorkerProcess>> WorkerProcess::spawn(asio::io_context& io, const WorkerSpec& spec,
                                                            Events events) {
  std::shared_ptr<WorkerProcess> w(new WorkerProcess(io, spec, std::move(events)));
  auto ring = ipc::RingSegment::create(kMaxStepsInFlight, kMaxStepsInFlight);
  if (!ring) return ring.status();
  w->ring_ = std::move(ring).value();

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return errno_error("socketpair");
  ipc::UniqueFd ours(sv[0]), theirs(sv[1]);
  ipc::UniqueFd submit(::eventfd(0, EFD_CLOEXEC));
  ipc::UniqueFd complete(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!submit || !complete) return errno_error("eventfd");

  // Everything the child needs is prepared before fork: between fork and exec only async-signal-safe
  // calls are allowed (this process has other threads).
  // Descriptors in the child: 3 control, 4 weights, 5 ring, 6 submit, 7 complete, then 8 hidden-in and
  // 9 hidden-out for pipeline stages. Everything is prepared before fork: between fork and exec only
  // async-signal-safe calls are allowed (this process has other threads).
  std::vector<std::string> args = {spec.worker_path, "--backend", spec.backend, "--control-fd", "3", "--weights-fd", "4",
                                   "--ring-fd", "5", "--submit-efd", "6", "--complete-efd", "7"};
  int child_fds[7] = {theirs.get(), spec.weights_fd, w->ring_->fd(), submit.get(), complete.get(), -1, -1};
  if (spec.hidden_in_fd >= 0) {
    args.insert(args.end(), {"--hidden-in-fd", "8"});
    child_fds[5] = spec.hidden_in_fd;
  }
  if (spec.hidden_out_fd >= 0) {
    args.insert(args.end(), {"--hidden-out-fd", "9"});
    child_fds[6] = spec.hidden_out_fd;
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) return errno_error("fork");
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    sched_param normal{};
    ::sched_setscheduler(0, SCHED_OTHER, &normal);  // the supervisor's threads are SCHED_BATCH
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    int tmp[7];
    for (int i = 0; i < 7; ++i) {
      tmp[i] = child_fds[i] < 0 ? -1 : ::fcntl(child_fds[i], F_DUPFD_CLOEXEC, 64);
      if (child_fds[i] >= 0 && tmp[i] < 0) ::_exit(126);
    }
    for (int i = 0; i < 7; ++i) {
      if (tmp[i] >= 0 && ::dup2(tmp[i], 3 + i) < 0) ::_exit(126);  // dup2 clears FD_CLOEXEC on the copy
    }
    ::syscall(SYS_close_range, 10u, ~0u, 0u);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  w->pid_ = pid;
  int pidfd = pidfd_open(pid);
  if (pidfd < 0) {
    Status s = errno_error("pidfd_open");
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return s;
  }
  w->pidfd_.assign(pidfd);
  w->control_.assign(asio::local::stream_protocol(), ours.release());
  w->complete_efd_.assign(complete.release());
  w->submit_efd_ = std::move(submit);
  // theirs (the child's end) closes here, so EOF on the control socket means the worker is gone.
  w->read_frame_header();
  w->wait_completion();
  w->wait_exit();
  return w;
}

WorkerProcess::~WorkerProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void WorkerProcess::notify_submission() {
  uint64_t one = 1;
  (void)!::write(submit_efd_.get(), &one, sizeof(one));
}

void WorkerProcess::request_shutdown() {
  capnp::MallocMessageBuilder msg;
  msg.initRoot<wire::ToWorker>().setShutdown();
  send_frame(ipc::encode_frame(msg));
}

void WorkerProcess::kill() {
  if (pid_ > 0 && !reaped_) ::kill(pid_, SIGKILL);
}

void WorkerProcess::fail_protocol(const std::string& why) {
  spdlog::error("worker {} ({}): {}; killing it", pid_, spec_.model_id, why);
  kill();
}

void WorkerProcess::read_frame_header() {
  std::weak_ptr<WorkerProcess> weak = shared_from_this();
  asio::async_read(control_, asio::buffer(&frame_length_, 4), [weak](std::error_code ec, size_t) {
    auto self = weak.lock();
    if (!self) return;
    if (ec) return self->control_reader_done();  // EOF: the worker's messages are all in
    Status s = ipc::check_frame_length(self->frame_length_);
    if (!s) {
      self->fail_protocol(s.message());
      return self->control_reader_done();  // the stream cannot be resynchronized
    }
    self->read_frame_body(self->frame_length_);
  });
}

void WorkerProcess::read_frame_body(uint32_t length) {
  frame_.resize(length);
  std::weak_ptr<WorkerProcess> weak = shared_from_this();
  asio::async_read(control_, asio::buffer(frame_), [weak](std::error_code ec, size_t) {
    auto self = weak.lock();
    if (!self) return;
    if (ec) return self->control_reader_done();
    self->handle_frame(self->frame_);
    if (!self->exited_) self->read_frame_header();
  });
}

Result<WorkerMessage> decode_worker_message(std::span<const uint8_t> frame) {
  if (frame.empty() || frame.size() % sizeof(capnp::word) != 0 || frame.size() > ipc::kMaxFrameBytes) {
    return Status(Code::kCorrupt, "a control frame of " + std::to_string(frame.size()) + " bytes");
  }
  // A private, word-aligned copy: the reader needs alignment, and the bytes are the worker's.
  auto words = kj::heapArray<capnp::word>(frame.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), frame.data(), frame.size());
  auto text = [](capnp::Text::Reader t) {
    return std::string(t.cStr(), std::min<size_t>(t.size(), kMaxWorkerText));
  };
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = words.size() + 64;  // the frame, once
    options.nestingLimit = 16;
    capnp::FlatArrayMessageReader reader(words, options);
    auto m = reader.getRoot<wire::FromWorker>();
    WorkerMessage out;
    switch (m.which()) {
      case wire::FromWorker::HELLO:
        out.kind = WorkerMessage::Kind::kHello;
        out.protocol_version = m.getHello().getProtocolVersion();
        return out;
      case wire::FromWorker::READY: {
        auto r = m.getReady();
        out.kind = WorkerMessage::Kind::kReady;
        out.ready = WorkerReady{text(r.getDevice()), r.getKvBytes(), r.getArenaBytes(), r.getStartMs()};
        if (!std::isfinite(out.ready.start_ms)) out.ready.start_ms = 0;
        return out;
      }
      case wire::FromWorker::FAILED:
        out.kind = WorkerMessage::Kind::kFailed;
        out.failure = text(m.getFailed());
        return out;
      case wire::FromWorker::PONG:
        out.kind = WorkerMessage::Kind::kPong;
        return out;
    }
    return Status(Code::kCorrupt, "an unknown control message");
  } catch (const kj::Exception& e) {
    return Status(Code::kCorrupt, std::string("a malformed control message: ") +
                                      std::string(e.getDescription().cStr()).substr(0, 200));
  }
}

void WorkerProcess::handle_frame(const std::vector<uint8_t>& frame) {
  auto decoded = decode_worker_message(frame);
  if (!decoded) return fail_protocol("sent " + decoded.status().message());
  const WorkerMessage& m = decoded.value();
  switch (m.kind) {
      case WorkerMessage::Kind::kHello: {
        if (m.protocol_version != wire::WORKER_PROTOCOL_VERSION) {
          return fail_protocol("speaks worker protocol " + std::to_string(m.protocol_version) +
                               ", this supervisor " + std::to_string(wire::WORKER_PROTOCOL_VERSION));
        }
        capnp::MallocMessageBuilder msg;
        auto cfg = msg.initRoot<wire::ToWorker>().initConfigure();
        cfg.setProtocolVersion(wire::WORKER_PROTOCOL_VERSION);
        cfg.setContextSize(spec_.context_size);
        cfg.setSlots(spec_.slots);
        cfg.setThreads(spec_.threads);
        cfg.setBatchTokens(spec_.batch_tokens);
        cfg.setPadStep(spec_.pad_step);
        cfg.setKvBlocks(spec_.kv_blocks);
        cfg.setFirstLayer(spec_.first_layer);
        cfg.setEndLayer(spec_.end_layer);
        cfg.setModelId(spec_.model_id);
        send_frame(ipc::encode_frame(msg));
        return;
      }
      case WorkerMessage::Kind::kReady:
        ready_ = true;
        if (events_.on_ready) events_.on_ready(m.ready);
        return;
      case WorkerMessage::Kind::kFailed:
        failure_ = m.failure;
        spdlog::error("worker {} ({}) could not start: {}", pid_, spec_.model_id, failure_);
        return;  // it exits next; finish_exit() reports it with this reason
      case WorkerMessage::Kind::kPong:
        return;
  }
}

void WorkerProcess::send_frame(std::vector<uint8_t> frame) {
  write_queue_.push_back(std::move(frame));
  if (!writing_) write_next();
}

void WorkerProcess::write_next() {
  if (write_queue_.empty()) {
    writing_ = false;
    return;
  }
  writing_ = true;
  auto buf = std::make_shared<std::vector<uint8_t>>(std::move(write_queue_.front()));
  write_queue_.erase(write_queue_.begin());
  std::weak_ptr<WorkerProcess> weak = shared_from_this();
  asio::async_write(control_, asio::buffer(*buf), [weak, buf](std::error_code ec, size_t) {
    auto self = weak.lock();
    if (!self) return;
    if (ec) {  // the worker is gone; the pidfd reports it
      self->writing_ = false;
      self->write_queue_.clear();
      return;
    }
    self->write_next();
  });
}

void WorkerProcess::wait_completion() {
  std::weak_ptr<WorkerProcess> weak = shared_from_this();
  complete_efd_.async_wait(asio::posix::stream_descriptor::wait_read, [weak](std::error_code ec) {
    auto self = weak.lock();
    if (!self || ec) return;
    uint64_t count = 0;
    (void)!::read(self->complete_efd_.native_handle(), &count, sizeof(count));
    if (self->events_.on_completion) self->events_.on_completion();
    if (!self->exited_) self->wait_completion();
  });
}

void WorkerProcess::wait_exit() {
  std::weak_ptr<WorkerProcess> weak = shared_from_this();
  pidfd_.async_wait(asio::posix::stream_descriptor::wait_read, [weak](std::error_code ec) {
    auto self = weak.lock();
    if (!self || ec) return;
    int status = 0;
    pid_t r = ::waitpid(self->pid_, &status, 0);
    self->reaped_ = true;
    self->ready_ = false;
    self->exit_status_ = r == self->pid_ ? describe_exit(status) : std::string("ended (not reaped)");
    // The worker's end of the control socket closed with it: the reader sees EOF right after the
    // last message. Should a copy of that end have survived it (it is close-on-exec in the worker),
    // the exit is reported after a grace period anyway.
    if (self->reader_done_) return self->finish_exit();
    self->exit_grace_.expires_after(std::chrono::milliseconds(500));
    self->exit_grace_.async_wait([weak](std::error_code wait_ec) {
      auto me = weak.lock();
      if (!me || wait_ec) return;
      spdlog::warn("worker {} ({}) ended but its control socket stays open; reporting the exit", me->pid_,
                   me->spec_.model_id);
      me->finish_exit();
    });
  });
}

void WorkerProcess::control_reader_done() {
  reader_done_ = true;
  if (reaped_) finish_exit();
}

void WorkerProcess::finish_exit() {
  if (exited_) return;
  exited_ = true;
  ready_ = false;
  exit_grace_.cancel();
  std::string why = exit_status_;
  if (!failure_.empty()) why = failure_ + " (worker " + why + ")";
  // Close our ends now: the worker's fds disappear with it, ours must not leak across restarts.
  std::error_code ignored;
  control_.close(ignored);
  complete_efd_.close(ignored);
  pidfd_.close(ignored);
  submit_efd_.reset();
  if (events_.on_exit) events_.on_exit(why);
}

}  // namespace inferd::daemon
