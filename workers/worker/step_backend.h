// step_backend.h — what a worker process runs: one forward step at a time over the KV slots it owns.
//
// A StepBackend receives a ring Submission (tokens of one or more sequences), validates it itself, and
// fills a Completion (a sampled token per sequence that asked for one). The one implementation is a
// ModelRunner on a registered backend (make_stage_runner); tests wrap it (WorkerHooks, worker.h).
//
// Contract for every step backend (the supervisor relies on it):
//  * A sequence whose first token in a step has position 0, or that is marked ipc::kSeqFresh, starts
//    afresh in its slot (a new request or a replay): its first position is the length of the cached
//    prefix its KV blocks hold; otherwise its first position must equal the slot's length.
//  * The slot's KV block table is the one the step names for the sequence (when it names one).
//  * Every token of a step is added to its sequence's sampling history before that sequence samples.
//  * Sampling of a sequence created with n_sampled = k resumes its random sequence after k draws.
//  * A malformed submission fails the step with a message; it never crashes the worker.
//  * A pipeline stage before the last publishes the step's hidden states and samples nothing; only
//    the last stage samples.
//
// Thread safety: one thread calls step().
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "inferd/backend_factory.h"
#include "inferd/ipc/hidden_exchange.h"
#include "inferd/ipc/ring.h"
#include "inferd/model.h"
#include "inferd/status.h"

namespace inferd::worker {

struct BackendOptions {
  int32_t context_size = 0;
  int32_t slots = 1;
  int32_t threads = 0;
  int32_t batch_tokens = 512;
  int32_t pad_step = 64;
  int32_t kv_blocks = 0;  // the KV pool in blocks (RunnerOptions::n_blocks; 0: slots × one context's)
  // Pipeline stage: the layers this worker runs ([0, 0) = all), and the exchanges it reads hidden
  // states from (a stage after the first) and writes them to (a stage before the last). Borrowed.
  int32_t first_layer = 0;
  int32_t end_layer = 0;
  const ipc::HiddenExchange* hidden_in = nullptr;
  const ipc::HiddenExchange* hidden_out = nullptr;
  // GPU backends: which device, as "--backend opencl:N" names it ("" = the backend's default).
  std::string device;
};

class StepBackend {
 public:
  virtual ~StepBackend() = default;
  virtual Status step(const ipc::Submission& submission, ipc::Completion& completion) = 0;
  // The device as the daemon shows it (the backend's describe(), ", layers a-b" for a stage).
  virtual std::string device() const = 0;
  virtual uint64_t kv_bytes() const = 0;
  virtual uint64_t arena_bytes() const = 0;
  // False once a failed step has left the device unusable (Backend::healthy): the worker exits after
  // answering that step, and the supervisor restarts it like a crashed one.
  virtual bool healthy() const { return true; }
};

// The model (or the stage `options` names) on a backend made by `factory` (its environment settings
// read), behind the StepBackend contract: StepLogic's validation and sampling around the runner.
Result<std::unique_ptr<StepBackend>> make_stage_runner(std::shared_ptr<const Model> model, const BackendFactory& factory,
                                                       const BackendOptions& options);

}  // namespace inferd::worker
