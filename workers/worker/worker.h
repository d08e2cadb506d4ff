// worker.h — the worker process (inferd-worker): one backend instance, spawned and supervised by inferd.
// Not meant to be run by hand.
//
//   inferd-worker --backend cpu --control-fd 3 --weights-fd 4 --ring-fd 5 --submit-efd 6 --complete-efd 7
//                 [--hidden-in-fd 8] [--hidden-out-fd 9]      (pipeline stages: ipc/hidden_exchange.h)
//
// The supervisor passes five inherited descriptors: the control socket (schemas/worker.capnp frames),
// the sealed weights segment, the ring segment and two eventfds (supervisor -> worker "a submission is
// ready", worker -> supervisor "a completion is ready"). The worker says Hello, receives Configure,
// makes its backend (the registry's, by the family of --backend), says Ready, then serves steps until
// the supervisor says Shutdown or goes away. It dies with the supervisor (PR_SET_PDEATHSIG), so it can
// never outlive it.
//
// Thread safety: worker_main() is a process's main; it runs on one thread (backends add their own).
#pragma once

#include <functional>
#include <memory>

#include "inferd/ipc/ring.h"
#include "step_backend.h"

namespace inferd::worker {

// Seams for test workers (tests/fault_worker): production passes none.
struct WorkerHooks {
  // Runs once Configure is read, before the backend is made (a test worker crashes here).
  std::function<void()> configured;
  // Wraps the step backend (a test worker fails chosen steps).
  std::function<std::unique_ptr<StepBackend>(std::unique_ptr<StepBackend>)> wrap;
  // Runs after each completion is published, with the ring, the step count and the completion eventfd
  // (a hostile test worker corrupts the ring here).
  std::function<void(ipc::RingSegment& ring, uint64_t steps, int complete_efd)> published;
};

// The whole worker process; returns its exit status.
int worker_main(int argc, char** argv, const WorkerHooks& hooks = {});

}  // namespace inferd::worker
