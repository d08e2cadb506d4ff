#include "inferd/placement.h"

#include <algorithm>
#include <set>

namespace inferd::graph {

namespace {

// Whether the node's FFN neurons can be split between workers (the matmuls over ffn_gate/ffn_up rows and
// ffn_down columns, and SwiGLU between them).
bool neuron_splittable(const Node& n) {
  return n.part == Part::kFfn && n.op != Op::kRmsNorm && n.op != Op::kAdd;
}

// Whether `op` is, or fuses, one of `ops`.
bool op_matches(Op op, const std::vector<Op>& ops) {
  auto has = [&](Op o) { return std::find(ops.begin(), ops.end(), o) != ops.end(); };
  if (ops.empty() || has(op)) return true;
  switch (op) {
    case Op::kMatmulAdd: return has(Op::kMatmul) || has(Op::kAdd);
    case Op::kMatmulSwiglu: return has(Op::kMatmul) || has(Op::kSwiglu);
    case Op::kMatmulGeglu: return has(Op::kMatmul) || has(Op::kGeglu);
    case Op::kRopeKv: return has(Op::kRope) || has(Op::kKvWrite);
    default: return false;
  }
}

bool covers(const Assignment& a, const Node& n) {
  switch (n.part) {
    case Part::kEmbeddings: return a.embeddings;
    case Part::kOutput: return a.output;
    case Part::kAttention:
    case Part::kFfn: return n.layer >= a.first_layer && n.layer < a.end_layer && op_matches(n.op, a.ops);
  }
  return false;
}

std::string layer_range(int32_t first, int32_t end) {
  return end - first == 1 ? "layer " + std::to_string(first)
                          : "layers " + std::to_string(first) + "-" + std::to_string(end - 1);
}

}  // namespace

std::string PlacementPlan::summary() const {
  std::string out;
  for (const Assignment& a : assignments) {
    std::string part;
    auto add = [&](const std::string& s) {
      if (!part.empty()) part += " + ";
      part += s;
    };
    if (a.end_layer > a.first_layer) add(layer_range(a.first_layer, a.end_layer));
    if (a.embeddings) add("embeddings");
    if (a.output) add("output");
    if (!a.ops.empty()) {
      std::string ops;
      for (Op op : a.ops) {
        if (!ops.empty()) ops += ',';
        ops += op_name(op);
      }
      part.append(" (").append(ops).append(")");
    }
    if (a.neuron_end > 0) {
      part.append(" (ffn neurons ").append(std::to_string(a.neuron_begin)).append("-");
      part.append(std::to_string(a.neuron_end - 1)).append(")");
    }
    const std::string& backend = a.worker < workers.size() ? workers[a.worker].backend : std::string("?");
    if (!out.empty()) out += " | ";
    out.append(backend).append(":").append(std::to_string(a.worker)).append(" ").append(part);
  }
  return out;
}

Result<PlacementPlan> plan_pipeline(int32_t n_layer, const std::vector<uint32_t>& layer_split, const std::string& backend,
                                    const std::vector<std::string>& stage_backends) {
  std::vector<int32_t> bounds = {0};
  for (uint32_t b : layer_split) {
    if (b <= static_cast<uint32_t>(bounds.back()) || b >= static_cast<uint32_t>(n_layer)) {
      return Status(Code::kInvalidArgument, "layer split must be increasing first layers inside (0, " +
                                                std::to_string(n_layer) + "), got " + std::to_string(b));
    }
    bounds.push_back(static_cast<int32_t>(b));
  }
  bounds.push_back(n_layer);
  const size_t n_stages = bounds.size() - 1;
  if (!stage_backends.empty() && stage_backends.size() != n_stages) {
    return Status(Code::kInvalidArgument, "stage backends name " + std::to_string(stage_backends.size()) +
                                              " backends for " + std::to_string(n_stages) +
                                              " pipeline stages (layer split + 1)");
  }
  PlacementPlan plan;
  for (size_t i = 0; i < n_stages; ++i) {
    plan.workers.push_back(PlanWorker{stage_backends.empty() ? backend : stage_backends[i]});
    Assignment a;
    a.worker = static_cast<uint32_t>(i);
    a.first_layer = bounds[i];
    a.end_layer = bounds[i + 1];
    a.embeddings = i == 0;
    a.output = i + 1 == n_stages;
    plan.assignments.push_back(a);
  }
  return plan;
}

Result<std::vector<NodePlacement>> assign_nodes(const Graph& g, const PlacementPlan& plan) {
  std::vector<NodePlacement> out(g.nodes().size());
  for (size_t ai = 0; ai < plan.assignments.size(); ++ai) {
    const Assignment& a = plan.assignments[ai];
    auto bad = [&](const std::string& why) {
      return Status(Code::kInvalidArgument, "assignment " + std::to_string(ai) + ": " + why);
    };
    if (a.worker >= plan.workers.size()) return bad("worker " + std::to_string(a.worker) + " does not exist");
    if (a.first_layer < 0 || a.end_layer < a.first_layer || a.end_layer > g.end_layer ||
        (a.end_layer > a.first_layer && a.first_layer < g.first_layer)) {
      return bad(layer_range(a.first_layer, a.end_layer) + " is not inside the model's layers " +
                 std::to_string(g.first_layer) + "-" + std::to_string(g.end_layer - 1));
    }
    if (a.neuron_end != 0 && (a.neuron_begin < 0 || a.neuron_end <= a.neuron_begin)) return bad("empty neuron range");
    for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
      const Node& n = g.nodes()[ni];
      if (!covers(a, n)) continue;
      NodePlacement& p = out[ni];
      if (a.neuron_end == 0) {
        p = {NodeShare{a.worker, 0, 0}};
        continue;
      }
      if (n.op == Op::kRmsNorm && n.part == Part::kFfn && g.producer(n.in[0]) >= 0 &&
          g.nodes()[static_cast<size_t>(g.producer(n.in[0]))].op == Op::kMatmul) {
        // A norm of the FFN's output (gemma3's post_ffw_norm) needs the whole sum over the neurons.
        return bad("the FFN's output is normalized before its residual add, so its neurons cannot be split "
                   "between workers");
      }
      if (!neuron_splittable(n)) continue;  // the FFN's norm and add stay where they are
      // Carve [b, e) out of the current shares and give it to this assignment's worker.
      const int64_t n_ff = g.n_ff;
      if (a.neuron_end > n_ff) return bad("neuron range ends past the FFN's " + std::to_string(n_ff) + " neurons");
      NodePlacement next;
      for (const NodeShare& s : p) {
        const int64_t sb = s.neuron_end == 0 ? 0 : s.neuron_begin, se = s.neuron_end == 0 ? n_ff : s.neuron_end;
        if (sb < a.neuron_begin) next.push_back({s.worker, sb, std::min(se, a.neuron_begin)});
        if (se > a.neuron_end) next.push_back({s.worker, std::max(sb, a.neuron_end), se});
      }
      next.push_back({a.worker, a.neuron_begin, a.neuron_end});
      std::sort(next.begin(), next.end(), [](const NodeShare& x, const NodeShare& y) { return x.neuron_begin < y.neuron_begin; });
      p = std::move(next);
    }
  }
  for (size_t ni = 0; ni < out.size(); ++ni) {
    if (out[ni].empty()) {
      const Node& n = g.nodes()[ni];
      return Status(Code::kInvalidArgument, std::string("no worker runs ") + op_name(n.op) + " (" +
                                                g.tensor(n.out[0]).name + ")");
    }
  }
  return out;
}

std::vector<Exchange> exchanges(const Graph& g, const std::vector<NodePlacement>& placement) {
  std::vector<Exchange> out;
  std::set<std::tuple<uint32_t, uint32_t, TensorId>> seen;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const Node& n = g.nodes()[ni];
    for (TensorId id : n.in) {
      if (id == kNone) continue;
      const int p = g.producer(id);
      if (p < 0) continue;  // inputs and weights reach every worker
      for (const NodeShare& from : placement[static_cast<size_t>(p)]) {
        for (const NodeShare& to : placement[ni]) {
          if (from.worker == to.worker || !seen.insert({from.worker, to.worker, id}).second) continue;
          const Tensor& t = g.tensor(id);
          out.push_back(Exchange{from.worker, to.worker, id, t.name, t.cols});
        }
      }
    }
  }
  return out;
}

Result<std::vector<Stage>> pipeline_stages(const Graph& g, const PlacementPlan& plan) {
  auto placed = assign_nodes(g, plan);
  if (!placed) return placed.status();
  const std::vector<NodePlacement>& p = placed.value();
  // Every node whole on one worker, and each worker's nodes a run of the graph in order.
  std::vector<Stage> stages;
  for (size_t ni = 0; ni < p.size(); ++ni) {
    const Node& n = g.nodes()[ni];
    if (p[ni].size() != 1 || p[ni][0].neuron_end != 0) {
      return Status(Code::kUnimplemented, "FFN neurons of layer " + std::to_string(n.layer) +
                                              " split between workers: the hybrid runtime that runs them is not built yet");
    }
    const uint32_t w = p[ni][0].worker;
    if (stages.empty() || stages.back().worker != w) {
      for (const Stage& s : stages) {
        if (s.worker == w) {
          return Status(Code::kUnimplemented, std::string(op_name(n.op)) + " (" + g.tensor(n.out[0]).name +
                                                  ") runs on worker " + std::to_string(w) +
                                                  " apart from its layer: the runtime moves only the residual stream "
                                                  "between pipeline stages");
        }
      }
      Stage s;
      s.worker = w;
      s.backend = plan.workers[w].backend;
      s.first_layer = s.end_layer = n.layer >= 0 ? n.layer : (n.part == Part::kEmbeddings ? g.first_layer : g.end_layer);
      stages.push_back(s);
    }
    Stage& s = stages.back();
    if (n.part == Part::kEmbeddings) s.embeddings = true;
    if (n.part == Part::kOutput) s.output = true;
    if (n.layer >= 0) s.end_layer = n.layer + 1;
  }
  // Stages start at layer boundaries, and only the residual stream crosses from one to the next.
  for (const Exchange& x : exchanges(g, p)) {
    size_t from = 0, to = 0;
    for (size_t i = 0; i < stages.size(); ++i) {
      if (stages[i].worker == x.from) from = i;
      if (stages[i].worker == x.to) to = i;
    }
    if (to != from + 1 || g.tensor(x.tensor).role != Role::kResidual) {
      return Status(Code::kUnimplemented, "tensor " + x.name + " crosses from worker " + std::to_string(x.from) +
                                              " to " + std::to_string(x.to) +
                                              ": the runtime moves only the residual stream between pipeline stages");
    }
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    const Stage& s = stages[i];
    if (i > 0 && s.first_layer != stages[i - 1].end_layer) {
      return Status(Code::kUnimplemented, "worker " + std::to_string(s.worker) + " starts inside layer " +
                                              std::to_string(s.first_layer) +
                                              ": pipeline stages split the model at layer boundaries");
    }
  }
  return stages;
}

}  // namespace inferd::graph
