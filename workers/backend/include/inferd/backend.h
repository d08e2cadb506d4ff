// inferd/backend.h — the one interface every compute backend implements (CPU, OpenCL, CUDA, ...).
//
// A backend runs graphs (inferd/graph.h) op by op: it says which operators it supports, prepares what a
// graph needs once (weights converted into its kernels' layouts, the KV cache of the graph's layers,
// buffers for the largest step), then computes one step at a time, choosing its kernels per step
// (stage-aware: a GEMV for one token, a GEMM for many, ...). It knows nothing of slots, batches, stages
// or sampling: ModelRunner (model_runner.h) drives it, and the worker process runs the runner.
//
// Adding a backend is a folder that implements this class (`final`), and registers itself with
// inferd_add_backend() in its CMakeLists.txt (backend_registry.h): the worker, the tools and the
// backend-ops test find it there.
//
// Errors: an operator a backend cannot run is *unsupported* (supports() is false), never a failure of
// compute(). prepare() fails with kUnimplemented for a weight type it cannot read, kOutOfRange when the
// device is too small; compute() fails only on device errors.
// Thread safety: one thread at a time uses a backend (the worker's step thread); a backend may use
// threads of its own inside compute().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "inferd/graph.h"
#include "inferd/status.h"

namespace inferd {

// The fixed shapes a backend prepares for: KV slots and positions per slot (the cache of every layer the
// graph computes), the most tokens in one step, and the step by which attention pads the KV length.
// The KV cache is a pool of n_blocks blocks of graph::kKvBlockTokens positions each (graph.h); each step's
// StepIO::kv_table maps the slots' positions to blocks.
struct BackendShape {
  int32_t n_slots = 1;
  int32_t n_ctx = 0;
  int32_t max_tokens = 512;
  int32_t pad_step = 64;
  int32_t n_blocks = 0;  // KV blocks in the pool; the runner resolves 0 to n_slots * kv_blocks_per_slot(n_ctx)
};

// Device memory a backend holds, in bytes.
struct BackendMemory {
  size_t weights = 0;      // converted weights (0 where the kernels read the shared segment in place)
  size_t kv = 0;           // the KV cache
  size_t activations = 0;  // activation buffers and scratch at the current step's size
};

class Backend {
 public:
  virtual ~Backend() = default;

  // The registry family ("cpu", "opencl"), as `--backend` names it.
  virtual std::string_view family() const = 0;
  // The device as `inferctl status` shows it: "CPU (avx2), 2 threads", "OpenCL: <device> ...".
  virtual std::string describe() const = 0;

  // Whether this backend can run `node` of `g`: its operator, tensor types and shapes.
  virtual bool supports(const graph::Graph& g, const graph::Node& node) const = 0;

  // Makes ready to compute `g`: converts or uploads every weight it reads, allocates the KV cache of its
  // layers for `shape` and the buffers of a step of shape.max_tokens tokens. Every node of `g` must be
  // supported. Called again with another graph, it drops what it held for the previous one.
  virtual Status prepare(const graph::Graph& g, const BackendShape& shape) = 0;

  // Computes `g` (the graph last prepared) for one step: reads io.inputs, writes io.outputs. The caller
  // has validated every token id, position and slot: the kernels trust them.
  virtual Status compute(const graph::Graph& g, graph::StepIO& io) = 0;

  virtual BackendMemory memory() const = 0;

  // False once a failure has left the device unusable (a GPU's sticky error): every later step would
  // fail too, so the worker exits and the supervisor restarts it on a fresh device context.
  virtual bool healthy() const { return true; }

  // Whether compute() gives the CPU backend's results bit for bit (the backend-ops suite then compares
  // for equality, otherwise by normalized mean squared error).
  virtual bool exact() const { return false; }
};

}  // namespace inferd
