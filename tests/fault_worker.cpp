// inferd-fault-worker: inferd-worker with faults, for the end-to-end crash tests (tests/e2e/test_crash.py
// starts the daemon with --worker-path pointing here). The fault is chosen by INFERD_TEST_WORKER_FAULT,
// read by this test binary only; the production worker has no such switch:
//   start    abort before the backend is made (a worker crashing in a loop)
//   step:N   fail the N-th step (from 1) with "injected fault" (a backend error; the worker lives on)
#include <cstdlib>
#include <string>

#include "worker.h"

namespace {

using inferd::Code;
using inferd::Status;
using inferd::worker::StepBackend;

class FailNthStep final : public StepBackend {
 public:
  FailNthStep(std::unique_ptr<StepBackend> inner, uint64_t n) : inner_(std::move(inner)), fail_at_(n) {}
  Status step(const inferd::ipc::Submission& sub, inferd::ipc::Completion& out) override {
    if (++steps_ == fail_at_) return Status(Code::kFailed, "injected fault (inferd-fault-worker)");
    return inner_->step(sub, out);
  }
  std::string device() const override { return inner_->device(); }
  uint64_t kv_bytes() const override { return inner_->kv_bytes(); }
  uint64_t arena_bytes() const override { return inner_->arena_bytes(); }

 private:
  std::unique_ptr<StepBackend> inner_;
  uint64_t fail_at_;
  uint64_t steps_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("INFERD_TEST_WORKER_FAULT");
  const std::string fault = env ? env : "";
  inferd::worker::WorkerHooks hooks;
  if (fault == "start") {
    hooks.configured = [] { std::abort(); };
  } else if (fault.rfind("step:", 0) == 0) {
    const uint64_t n = std::strtoull(fault.c_str() + 5, nullptr, 10);
    hooks.wrap = [n](std::unique_ptr<StepBackend> inner) {
      return std::unique_ptr<StepBackend>(new FailNthStep(std::move(inner), n));
    };
  }
  return inferd::worker::worker_main(argc, argv, hooks);
}
