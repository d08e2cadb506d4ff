// The worker process: one backend instance, spawned and supervised by inferd (worker.h).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "inferd/backend_names.h"
#include "inferd/backend_registry.h"
#include "inferd/ipc/frame.h"
#include "inferd/ipc/ring.h"
#include "inferd/ipc/weights_segment.h"
#include "inferd/schemas/worker.capnp.h"
#include "worker.h"

namespace inferd::worker {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string backend = "cpu";
  int control_fd = -1, weights_fd = -1, ring_fd = -1, submit_efd = -1, complete_efd = -1;
  int hidden_in_fd = -1, hidden_out_fd = -1;  // pipeline stages only
};

bool parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    char* end = nullptr;
    long v = std::strtol(argv[i + 1], &end, 10);
    bool num = end && *end == '\0' && v >= 0 && v < 1 << 20;
    if (k == "--backend") a->backend = argv[i + 1];
    else if (k == "--control-fd" && num) a->control_fd = static_cast<int>(v);
    else if (k == "--weights-fd" && num) a->weights_fd = static_cast<int>(v);
    else if (k == "--ring-fd" && num) a->ring_fd = static_cast<int>(v);
    else if (k == "--submit-efd" && num) a->submit_efd = static_cast<int>(v);
    else if (k == "--complete-efd" && num) a->complete_efd = static_cast<int>(v);
    else if (k == "--hidden-in-fd" && num) a->hidden_in_fd = static_cast<int>(v);
    else if (k == "--hidden-out-fd" && num) a->hidden_out_fd = static_cast<int>(v);
    else return false;
  }
  return argc % 2 == 1 && a->control_fd >= 0 && a->weights_fd >= 0 && a->ring_fd >= 0 && a->submit_efd >= 0 &&
         a->complete_efd >= 0;
}

Status send_failed(int fd, const std::string& why) {
  capnp::MallocMessageBuilder msg;
  msg.initRoot<wire::FromWorker>().setFailed(why);
  return ipc::write_frame(fd, msg);
}

int run(const Args& args, const WorkerHooks& hooks) {
  const auto t0 = Clock::now();
  const int ctl = args.control_fd;
  {
    capnp::MallocMessageBuilder msg;
    auto hello = msg.initRoot<wire::FromWorker>().initHello();
    hello.setProtocolVersion(wire::WORKER_PROTOCOL_VERSION);
    hello.setPid(static_cast<uint32_t>(::getpid()));
    hello.setBackend(args.backend);
    if (!ipc::write_frame(ctl, msg)) return 1;
  }
  auto frame = ipc::read_frame(ctl);
  if (!frame) return 0;  // the supervisor refused us (version) or went away
  capnp::FlatArrayMessageReader reader(frame.value());
  auto to = reader.getRoot<wire::ToWorker>();
  if (!to.isConfigure()) {
    (void)send_failed(ctl, "expected Configure");
    return 1;
  }
  auto cfg = to.getConfigure();
  if (cfg.getProtocolVersion() != wire::WORKER_PROTOCOL_VERSION) {
    (void)send_failed(ctl, "protocol version " + std::to_string(cfg.getProtocolVersion()) + " not served");
    return 1;
  }
  const std::string model_id = cfg.getModelId();
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [worker " + std::to_string(::getpid()) + " " + model_id + "] %v");

  if (hooks.configured) hooks.configured();

  auto fail = [&](const Status& s) {
    spdlog::error("{}", s.to_string());
    (void)send_failed(ctl, s.to_string());
    return 1;
  };
  // A registered backend's family, with a device index where it has devices: "cpu", "opencl:1".
  const auto name = parse_backend_name(args.backend);
  const BackendFactory* factory = name ? find_backend(name->family) : nullptr;
  if (factory == nullptr) {
    return fail(Status(Code::kUnimplemented, "backend '" + args.backend + "' is not built into this worker"));
  }
  auto weights = ipc::WeightsSegment::attach(ipc::UniqueFd(args.weights_fd));
  if (!weights) return fail(weights.status());
  auto model = Model::load(weights.value()->gguf());
  if (!model) return fail(model.status());
  auto ring = ipc::RingSegment::attach(ipc::UniqueFd(args.ring_fd));
  if (!ring) return fail(ring.status());
  BackendOptions bo;
  bo.context_size = static_cast<int32_t>(cfg.getContextSize());
  bo.slots = static_cast<int32_t>(cfg.getSlots());
  bo.threads = static_cast<int32_t>(cfg.getThreads());
  bo.batch_tokens = static_cast<int32_t>(cfg.getBatchTokens());
  bo.pad_step = static_cast<int32_t>(cfg.getPadStep());
  bo.kv_blocks = static_cast<int32_t>(std::min<uint32_t>(cfg.getKvBlocks(), 1u << 24));
  bo.first_layer = static_cast<int32_t>(cfg.getFirstLayer());
  bo.end_layer = static_cast<int32_t>(cfg.getEndLayer());
  const uint32_t n_embd = static_cast<uint32_t>(model.value()->config().n_embd);
  std::unique_ptr<ipc::HiddenExchange> hidden_in, hidden_out;
  if (args.hidden_in_fd >= 0) {
    auto x = ipc::HiddenExchange::attach(ipc::UniqueFd(args.hidden_in_fd), n_embd, cfg.getBatchTokens());
    if (!x) return fail(x.status());
    hidden_in = std::move(x).value();
  }
  if (args.hidden_out_fd >= 0) {
    auto x = ipc::HiddenExchange::attach(ipc::UniqueFd(args.hidden_out_fd), n_embd, cfg.getBatchTokens());
    if (!x) return fail(x.status());
    hidden_out = std::move(x).value();
  }
  bo.hidden_in = hidden_in.get();
  bo.hidden_out = hidden_out.get();
  bo.device = name->device;
  auto backend = make_stage_runner(model.value(), *factory, bo);
  if (!backend) return fail(backend.status());
  std::unique_ptr<StepBackend> step_backend = std::move(backend).value();
  if (hooks.wrap) step_backend = hooks.wrap(std::move(step_backend));
  StepBackend& be = *step_backend;
  {
    capnp::MallocMessageBuilder msg;
    auto ready = msg.initRoot<wire::FromWorker>().initReady();
    ready.setDevice(be.device());
    ready.setKvBytes(be.kv_bytes());
    ready.setArenaBytes(be.arena_bytes());
    ready.setStartMs(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!ipc::write_frame(ctl, msg)) return 1;
  }
  spdlog::info("ready: {}, {} slots", be.device(), bo.slots);

  ipc::RingSegment& r = *ring.value();
  uint64_t steps = 0, tokens = 0;
  pollfd fds[2] = {{ctl, POLLIN, 0}, {args.submit_efd, POLLIN, 0}};
  for (;;) {
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll: {}", std::strerror(errno));
      return 1;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t count = 0;
      (void)!::read(args.submit_efd, &count, sizeof(count));
      while (const ipc::Submission* sub = r.next_submission()) {
        ipc::Completion* out = r.completion_slot();
        if (!out) {
          spdlog::error("completion ring full: the supervisor queued more steps than the ring holds");
          return 1;
        }
        const auto s0 = Clock::now();
        const uint64_t step_id = sub->id;
        out->id = sub->id;
        out->n_outputs = 0;
        out->n_embd_floats = 0;
        out->error[0] = '\0';
        Status st = be.step(*sub, *out);
        out->status = static_cast<int32_t>(st.code());
        if (!st) {
          out->n_outputs = 0;
          std::snprintf(out->error, sizeof(out->error), "%s", st.message().c_str());
          spdlog::warn("step {} failed: {}", sub->id, st.to_string());
        }
        out->compute_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - s0).count());
        ++steps;
        tokens += sub->n_tokens;
        r.release_submission();
        r.publish_completion();
        if (hooks.published) hooks.published(r, steps, args.complete_efd);
        uint64_t one = 1;
        (void)!::write(args.complete_efd, &one, sizeof(one));
        if (!st && !be.healthy()) {
          spdlog::error("the device is unusable after step {} failed: exiting so that the supervisor restarts this worker",
                        step_id);
          return 3;
        }
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      auto f = ipc::read_frame(ctl);
      if (!f) return 0;  // supervisor closed the channel: exit quietly
      capnp::FlatArrayMessageReader rd(f.value());
      auto m = rd.getRoot<wire::ToWorker>();
      if (m.isShutdown()) {
        spdlog::info("shutdown after {} steps", steps);
        return 0;
      }
      if (m.isPing()) {
        capnp::MallocMessageBuilder msg;
        auto pong = msg.initRoot<wire::FromWorker>().initPong();
        pong.setSteps(steps);
        pong.setTokens(tokens);
        if (!ipc::write_frame(ctl, msg)) return 0;
      }
    }
  }
}

}  // namespace

int worker_main(int argc, char** argv, const WorkerHooks& hooks) {
  // Die with the supervisor; if it is already gone (we were reparented), exit at once.
  // (The supervisor also sets it between fork and exec and checks that it is still the parent.)
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::signal(SIGPIPE, SIG_IGN);
  // Logs go to stderr, which the worker shares with the supervisor (and so with journald).
  spdlog::set_default_logger(spdlog::stderr_color_mt("worker"));
  Args args;
  if (!parse_args(argc, argv, &args)) {
    std::fprintf(stderr,
                 "inferd-worker is started by inferd, not by hand.\n"
                 "usage: inferd-worker --backend cpu --control-fd N --weights-fd N --ring-fd N --submit-efd N "
                 "--complete-efd N\n");
    return 2;
  }
  // The supervisor's descriptors (dup2 cleared their FD_CLOEXEC) must not reach anything this process
  // might start (a driver's helper): the supervisor learns of this worker's end from the control
  // socket's EOF, which a surviving copy would hold back.
  for (int fd : {args.control_fd, args.weights_fd, args.ring_fd, args.submit_efd, args.complete_efd, args.hidden_in_fd,
                 args.hidden_out_fd}) {
    if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  try {
    return run(args, hooks);
  } catch (const std::exception& e) {  // Cap'n Proto reports malformed control messages by throwing
    spdlog::error("control channel: {}", e.what());
    return 1;
  }
}

}  // namespace inferd::worker
