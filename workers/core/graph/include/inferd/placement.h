// inferd/placement.h — the placement plan: which backend instance, in which worker process, runs each
// operator of a model's graph.
//
// A plan is a list of workers (each one backend instance: "cpu", "opencl:1") and a list of assignments,
// each naming a part of the graph — the embeddings, a range of layers, the output — optionally only
// some operators of it (attention, the FFN matmuls, ...) and, for the FFN, a range of neurons (rows
// of ffn_gate/ffn_up, columns of ffn_down), and the worker that runs it. Later assignments take
// precedence over earlier ones for the nodes they name, so "layers 0-29 on the GPU, the FFN neurons
// 4096-8191 of layers 20-29 on the CPU" is two assignments. Every node of the graph must end up on
// exactly one worker (assign_nodes).
//
// Tensors a node on one worker reads from a node on another cross processes (exchanges()). The runtime
// has one way to move them today: the hidden-state exchange in shared memory between pipeline stages
// (ipc/hidden_exchange.h), which carries the residual stream at a layer boundary. So a plan runs
// (pipeline_stages()) when each worker computes whole layers, in order, and hands on the residual
// stream; a plan that places an operator or a neuron range apart from its layer is well formed and
// shown, but refused with kUnimplemented until the hybrid runtime (PowerInfer's hot/cold neuron split,
// OATO's offloaded operators) exists.
//
// The planner (plan_pipeline) produces today's placements: --layer-split and --stage-backends.
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "inferd/graph.h"
#include "inferd/status.h"

namespace inferd::graph {

struct PlanWorker {
  std::string backend;  // "cpu", "opencl", "opencl:1", ...
};

struct Assignment {
  uint32_t worker = 0;
  // The part of the graph: the embedding lookup, layers [first_layer, end_layer), the output (norm,
  // projection; sampling runs where the output does). Any combination.
  bool embeddings = false;
  int32_t first_layer = 0, end_layer = 0;  // empty range: no layers
  bool output = false;
  // Only these operators of the layers (empty: all). Fused operators count as what they fuse.
  std::vector<Op> ops;
  // Only FFN neurons [neuron_begin, neuron_end) of the layers' FFN operators (0, 0: all).
  int64_t neuron_begin = 0, neuron_end = 0;

  bool whole_layers() const { return ops.empty() && neuron_end == 0; }
};

// A tensor that crosses workers: written by `from`, read by `to`.
struct Exchange {
  uint32_t from = 0, to = 0;
  TensorId tensor = kNone;
  std::string name;
  int64_t cols = 0;  // floats per row
};

// One pipeline stage: a worker running layers [first_layer, end_layer), with the embeddings (the first)
// or the output (the last).
struct Stage {
  uint32_t worker = 0;
  std::string backend;
  int32_t first_layer = 0, end_layer = 0;
  bool embeddings = false, output = false;
};

struct PlacementPlan {
  std::vector<PlanWorker> workers;
  std::vector<Assignment> assignments;

  // "cpu:0 layers 0-14 + embeddings | opencl:1 layers 15-29 + output" (one part per assignment).
  std::string summary() const;
};

// Today's placements: one worker per pipeline stage. `layer_split` holds the first layer of each stage
// after the first (increasing, inside (0, n_layer)); `stage_backends` one backend per stage, or none
// (every stage runs `backend`). kInvalidArgument naming what is wrong.
Result<PlacementPlan> plan_pipeline(int32_t n_layer, const std::vector<uint32_t>& layer_split, const std::string& backend,
                                    const std::vector<std::string>& stage_backends);

// Where one node runs: one share for the whole node, or several that split its FFN neurons.
struct NodeShare {
  uint32_t worker = 0;
  int64_t neuron_begin = 0, neuron_end = 0;  // 0, 0: every neuron
};
using NodePlacement = std::vector<NodeShare>;

// The shares of every node of `g` (the whole model's graph), by node index, the assignments applied in
// order. A neuron range splits the FFN's matmuls and SwiGLU; the FFN's norm and residual add are whole.
// kInvalidArgument when an assignment names a worker or layer that does not exist, a neuron range
// outside the FFN, or when a node is left without a worker.
Result<std::vector<NodePlacement>> assign_nodes(const Graph& g, const PlacementPlan& plan);

// The tensors that cross workers under `placement` (assign_nodes), each once per (from, to).
std::vector<Exchange> exchanges(const Graph& g, const std::vector<NodePlacement>& placement);

// The pipeline stages the plan runs as, when it can run today: every worker computes whole consecutive
// layers, workers follow each other in layer order, the first also embeds, the last also computes the
// output, and only the residual stream crosses a boundary. kUnimplemented naming the first operator
// or neuron range placed apart from its layer otherwise.
Result<std::vector<Stage>> pipeline_stages(const Graph& g, const PlacementPlan& plan);

}  // namespace inferd::graph
