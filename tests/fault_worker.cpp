// inferd-fault-worker: inferd-worker with faults, for the end-to-end crash tests (tests/e2e/test_crash.py
// starts the daemon with --worker-path pointing here). The fault is chosen by INFERD_TEST_WORKER_FAULT,
// read by this test binary only; the production worker has no such switch:
//   start    abort before the backend is made (a worker crashing in a loop)
//   hang     never get ready: block before the backend is made (a driver that never answers)
//   ring:N   a hostile worker: after its N-th step, write a completion counter far past anything it
//            published (once per supervisor, like device:N); the supervisor must kill it, not trust it
//   subtail:N  a hostile worker: after its N-th step, write a submission counter from the future (once per
//            supervisor); the supervisor must not trust the ring's room and kill the worker
//   entry:N  a hostile worker: answer its N-th step with a token outside the vocabulary and embedding
//            floats it was not asked for (once per supervisor); the supervisor must kill it
//   geometry:N  after its N-th step, scribble over the ring header's capacities and offsets (once per
//            supervisor) and go on working: the supervisor never reads them back, so nothing changes
//   step:N   fail the N-th step (from 1) with "injected fault" (a backend error; the worker lives on)
//   device:N fail the N-th step and report the device unusable (a GPU's sticky error): the worker
//            answers the step, then exits for a restart. Once per supervisor: the fault leaves a marker
//            file ($TMPDIR/inferd-fault-worker-device-<supervisor pid>), so the restarted worker is sound.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "worker.h"

namespace {

using inferd::Code;
using inferd::Status;
using inferd::worker::StepBackend;

// A step backend around the real one: what a fault does not change goes to it.
class Wrapped : public StepBackend {
 public:
  explicit Wrapped(std::unique_ptr<StepBackend> inner) : inner_(std::move(inner)) {}
  std::string device() const override { return inner_->device(); }
  uint64_t kv_bytes() const override { return inner_->kv_bytes(); }
  uint64_t arena_bytes() const override { return inner_->arena_bytes(); }

 protected:
  std::unique_ptr<StepBackend> inner_;
};

// Answers the N-th step with a completion no correct worker writes (once per supervisor).
class CorruptNthAnswer final : public Wrapped {
 public:
  CorruptNthAnswer(std::unique_ptr<StepBackend> inner, uint64_t n) : Wrapped(std::move(inner)), at_(n) {}
  Status step(const inferd::ipc::Submission& sub, inferd::ipc::Completion& out) override;

 private:
  uint64_t at_;
  uint64_t steps_ = 0;
};

class FailNthStep final : public Wrapped {
 public:
  FailNthStep(std::unique_ptr<StepBackend> inner, uint64_t n, bool breaks_device)
      : Wrapped(std::move(inner)), fail_at_(n), breaks_device_(breaks_device) {}
  Status step(const inferd::ipc::Submission& sub, inferd::ipc::Completion& out) override {
    if (++steps_ == fail_at_ && (!breaks_device_ || first_device_fault())) {
      broken_ = breaks_device_;
      return Status(Code::kFailed, breaks_device_ ? "injected device fault (inferd-fault-worker)"
                                                  : "injected fault (inferd-fault-worker)");
    }
    return inner_->step(sub, out);
  }
  bool healthy() const override { return !broken_; }

  // True the first time for this supervisor (creates the marker file).
  static bool first_device_fault() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/inferd-fault-worker-device-" +
                             std::to_string(::getppid());
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }

 private:
  uint64_t fail_at_;
  bool breaks_device_;
  bool broken_ = false;
  uint64_t steps_ = 0;
};

Status CorruptNthAnswer::step(const inferd::ipc::Submission& sub, inferd::ipc::Completion& out) {
  Status st = inner_->step(sub, out);
  if (st && ++steps_ == at_ && FailNthStep::first_device_fault()) {
    for (uint32_t i = 0; i < out.n_outputs; ++i) out.outputs[i].token = 1 << 30;
    out.n_embd_floats = inferd::ipc::kMaxEmbdFloats + 7;  // the supervisor copies at most the array
  }
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("INFERD_TEST_WORKER_FAULT");
  const std::string fault = env ? env : "";
  inferd::worker::WorkerHooks hooks;
  if (fault == "start") {
    hooks.configured = [] { std::abort(); };
  } else if (fault.rfind("ring:", 0) == 0) {
    const uint64_t n = std::strtoull(fault.c_str() + 5, nullptr, 10);
    hooks.published = [n](inferd::ipc::RingSegment& ring, uint64_t steps, int complete_efd) {
      if (steps != n || !FailNthStep::first_device_fault()) return;
      ring.header().comp_head.store(uint64_t{1} << 40, std::memory_order_release);
      const uint64_t one = 1;
      (void)!::write(complete_efd, &one, sizeof(one));
      for (;;) ::pause();  // keep the lie in place until the supervisor acts on it
    };
  } else if (fault.rfind("subtail:", 0) == 0 || fault.rfind("geometry:", 0) == 0) {
    const bool geometry = fault[0] == 'g';
    const uint64_t n = std::strtoull(fault.c_str() + (geometry ? 9 : 8), nullptr, 10);
    hooks.published = [n, geometry](inferd::ipc::RingSegment& ring, uint64_t steps, int complete_efd) {
      if (steps != n || !FailNthStep::first_device_fault()) return;
      inferd::ipc::RingHeader& h = ring.header();
      if (geometry) {  // then carry on: nothing the supervisor uses has changed
        h.sub_capacity = 0;
        h.comp_capacity = 0xffffffffu;
        h.sub_offset = h.comp_offset = uint64_t{1} << 50;
        h.segment_bytes = 1;
        return;
      }
      h.sub_tail.store(uint64_t{1} << 40, std::memory_order_release);
      const uint64_t one = 1;
      (void)!::write(complete_efd, &one, sizeof(one));
      for (;;) ::pause();  // keep the lie in place until the supervisor acts on it
    };
  } else if (fault.rfind("entry:", 0) == 0) {
    const uint64_t n = std::strtoull(fault.c_str() + 6, nullptr, 10);
    hooks.wrap = [n](std::unique_ptr<StepBackend> inner) {
      return std::unique_ptr<StepBackend>(new CorruptNthAnswer(std::move(inner), n));
    };
  } else if (fault == "hang") {
    hooks.configured = [] {
      for (;;) ::pause();
    };
  } else if (fault.rfind("step:", 0) == 0 || fault.rfind("device:", 0) == 0) {
    const bool device = fault[0] == 'd';
    const uint64_t n = std::strtoull(fault.c_str() + (device ? 7 : 5), nullptr, 10);
    hooks.wrap = [n, device](std::unique_ptr<StepBackend> inner) {
      return std::unique_ptr<StepBackend>(new FailNthStep(std::move(inner), n, device));
    };
  }
  return inferd::worker::worker_main(argc, argv, hooks);
}
