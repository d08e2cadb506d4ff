#include "inferd/graph.h"

#include <cmath>
#include <cstdio>
#include <optional>

namespace inferd::graph {

namespace {

constexpr const char* kOpNames[kOpCount] = {"embed",      "rms_norm",      "matmul",  "rope",     "kv_write", "attention",
                                            "swiglu",     "add",           "get_rows", "matmul_add", "matmul_swiglu",
                                            "rope_kv",    "geglu",         "matmul_geglu"};

// Operand counts: required inputs, optional trailing inputs (bias), outputs.
struct Arity {
  int required, optional, outputs;
};
Arity arity(Op op) {
  switch (op) {
    case Op::kEmbed: return {2, 0, 1};
    case Op::kRmsNorm: return {2, 0, 1};
    case Op::kMatmul: return {2, 1, 1};
    case Op::kRope: return {2, 0, 1};
    case Op::kKvWrite: return {5, 0, 1};
    case Op::kAttention: return {4, 0, 1};
    case Op::kSwiglu:
    case Op::kGeglu: return {2, 0, 1};
    case Op::kAdd: return {2, 0, 1};
    case Op::kGetRows: return {2, 0, 1};
    case Op::kMatmulAdd: return {4, 0, 1};  // in[2] (bias) may be kNone
    case Op::kMatmulSwiglu:
    case Op::kMatmulGeglu: return {3, 0, 1};
    case Op::kRopeKv: return {6, 0, 2};
  }
  return {0, 0, 0};
}

}  // namespace

const char* op_name(Op op) {
  const auto i = static_cast<size_t>(op);
  return i < static_cast<size_t>(kOpCount) ? kOpNames[i] : "?";
}

const char* part_name(Part part) {
  switch (part) {
    case Part::kEmbeddings: return "embeddings";
    case Part::kAttention: return "attention";
    case Part::kFfn: return "ffn";
    case Part::kOutput: return "output";
  }
  return "?";
}

bool is_fused(Op op) {
  return op == Op::kMatmulAdd || op == Op::kMatmulSwiglu || op == Op::kRopeKv || op == Op::kMatmulGeglu;
}

float Heads::kq_scale(const Node& attention) const {
  return attention.scale > 0.0f ? attention.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

bool uses_variants(const Graph& g, const Node& n) {
  switch (n.op) {
    case Op::kEmbed: return n.scale != 0.0f;
    case Op::kRmsNorm: return g.tensor(n.in[1]).cols != g.tensor(n.in[0]).cols;
    case Op::kRope:
    case Op::kRopeKv:
      return g.heads.rope_base_of(n) != g.heads.rope_base || n.rope_freq_scale != 1.0f || n.rope_factors != nullptr;
    case Op::kAttention:
      return n.window > 0 || n.scale > 0.0f;  // an explicit scale multiplies Q before the product
    case Op::kGeglu:
    case Op::kMatmulGeglu: return true;
    default: return false;
  }
}

int Node::n_in() const {
  int n = 0;
  for (int i = 0; i < kMaxIn; ++i) {
    if (in[static_cast<size_t>(i)] != kNone) n = i + 1;
  }
  return n;
}

TensorId Graph::add_tensor(Tensor t) {
  tensors_.push_back(std::move(t));
  producer_.push_back(-1);
  uses_.push_back(0);
  return static_cast<TensorId>(tensors_.size() - 1);
}

void Graph::add_node(const Node& n) {
  for (TensorId id : n.in) {
    if (id == kNone) continue;
    INFERD_ASSERT(id >= 0 && static_cast<size_t>(id) < tensors_.size(), "node input %d does not exist", id);
    ++uses_[static_cast<size_t>(id)];
  }
  for (TensorId id : n.out) {
    if (id == kNone) continue;
    INFERD_ASSERT(id >= 0 && static_cast<size_t>(id) < tensors_.size(), "node output %d does not exist", id);
    INFERD_ASSERT(producer_[static_cast<size_t>(id)] < 0, "tensor %s is written twice", tensors_[static_cast<size_t>(id)].name.c_str());
    producer_[static_cast<size_t>(id)] = static_cast<int>(nodes_.size());
  }
  nodes_.push_back(n);
}

void Graph::mark_input(TensorId id) {
  INFERD_ASSERT(tensor(id).kind == TensorKind::kInput);
  inputs_.push_back(id);
}

void Graph::mark_output(TensorId id) {
  outputs_.push_back(id);
  ++uses_[static_cast<size_t>(id)];
}

int Graph::producer(TensorId id) const { return producer_.at(static_cast<size_t>(id)); }
int Graph::use_count(TensorId id) const { return uses_.at(static_cast<size_t>(id)); }

int64_t Graph::rows(const Tensor& t, const StepShape& shape) {
  switch (t.rows) {
    case Rows::kTokens: return shape.tokens;
    case Rows::kOutputs: return shape.outputs;
    case Rows::kFixed: return t.fixed_rows;
  }
  return 0;
}

Status Graph::validate() const {
  std::vector<bool> defined(tensors_.size(), false);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorKind k = tensors_[i].kind;
    defined[i] = k == TensorKind::kInput || k == TensorKind::kWeight || (k == TensorKind::kKvCache && producer_[i] < 0);
    if (k == TensorKind::kWeight && tensors_[i].weight == nullptr) {
      return Status(Code::kInvalidArgument, "weight tensor " + tensors_[i].name + " has no data");
    }
  }
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    const Node& n = nodes_[ni];
    auto bad = [&](const std::string& why) {
      return Status(Code::kInvalidArgument, "node " + std::to_string(ni) + " (" + op_name(n.op) + "): " + why);
    };
    const Arity a = arity(n.op);
    for (int i = 0; i < Node::kMaxIn; ++i) {
      const TensorId id = n.in[static_cast<size_t>(i)];
      const bool optional = i >= a.required || (n.op == Op::kMatmulAdd && i == 2);
      if (id == kNone) {
        if (!optional && i < a.required) return bad("input " + std::to_string(i) + " is missing");
        continue;
      }
      if (i >= a.required + a.optional) return bad("input " + std::to_string(i) + " is one too many");
      if (!defined[static_cast<size_t>(id)]) return bad("input " + tensors_[static_cast<size_t>(id)].name + " is not computed before");
    }
    for (int i = 0; i < Node::kMaxOut; ++i) {
      const TensorId id = n.out[static_cast<size_t>(i)];
      if ((id == kNone) != (i >= a.outputs)) return bad("wrong number of outputs");
      if (id == kNone) continue;
      const TensorKind k = tensors_[static_cast<size_t>(id)].kind;
      if (k != TensorKind::kActivation && k != TensorKind::kKvCache) {
        return bad("it writes " + tensors_[static_cast<size_t>(id)].name + ", which is not an activation");
      }
      defined[static_cast<size_t>(id)] = true;
    }
    const bool uses_cache = n.op == Op::kKvWrite || n.op == Op::kRopeKv || n.op == Op::kAttention;
    if (uses_cache && (n.layer < first_layer || n.layer >= end_layer)) {
      return bad("layer " + std::to_string(n.layer) + " is outside the graph's layers");
    }
    // Shapes.
    auto t = [&](int i) -> const Tensor& { return tensors_[static_cast<size_t>(n.in[static_cast<size_t>(i)])]; };
    const Tensor& o = tensors_[static_cast<size_t>(n.out[0])];
    auto same_rows = [](const Tensor& x, const Tensor& y) {
      return x.rows == y.rows && (x.rows != Rows::kFixed || x.fixed_rows == y.fixed_rows);
    };
    switch (n.op) {
      case Op::kMatmul:
      case Op::kMatmulAdd: {
        const Tensor& w = t(1);
        if (w.kind != TensorKind::kWeight || w.cols != t(0).cols) return bad("weight " + w.name + " does not match its input");
        if (o.cols != w.fixed_rows || !same_rows(o, t(0))) return bad("output shape");
        if (n.in[2] != kNone && (t(2).kind != TensorKind::kWeight || t(2).cols != w.fixed_rows)) return bad("bias");
        if (n.op == Op::kMatmulAdd && (t(3).cols != o.cols || !same_rows(t(3), o))) return bad("residual shape");
        break;
      }
      case Op::kMatmulSwiglu:
      case Op::kMatmulGeglu:
        if (t(1).kind != TensorKind::kWeight || t(2).kind != TensorKind::kWeight || t(1).cols != t(0).cols || t(2).cols != t(0).cols || t(1).fixed_rows != t(2).fixed_rows ||
            o.cols != t(1).fixed_rows) {
          return bad("gate/up shapes");
        }
        break;
      case Op::kRmsNorm:
        if (t(1).kind != TensorKind::kWeight || t(1).cols <= 0 || t(0).cols % t(1).cols != 0 || o.cols != t(0).cols ||
            !same_rows(o, t(0))) {
          return bad("shapes");
        }
        break;
      case Op::kAdd:
      case Op::kSwiglu:
      case Op::kGeglu:
        if (t(1).cols != t(0).cols || o.cols != t(0).cols || !same_rows(t(1), t(0)) || !same_rows(o, t(0))) {
          return bad("operands of different shapes");
        }
        break;
      case Op::kGetRows:
        if (o.cols != t(0).cols || t(1).elem != Elem::kInt32) return bad("shapes");
        break;
      case Op::kEmbed:
        if (t(0).elem != Elem::kInt32 || t(1).kind != TensorKind::kWeight || o.cols != t(1).cols) return bad("shapes");
        break;
      case Op::kRope:
        if (o.cols != t(0).cols || heads.head_dim <= 0 || t(0).cols % heads.head_dim != 0 || t(1).elem != Elem::kInt32) {
          return bad("shapes");
        }
        if (n.rope_factors && (n.rope_factors->type != DType::kF32 || n.rope_factors->cols != heads.head_dim / 2)) {
          return bad("rope factors");
        }
        break;
      case Op::kKvWrite:
      case Op::kRopeKv:
      case Op::kAttention: {
        const int cache = n.op == Op::kKvWrite ? 4 : n.op == Op::kRopeKv ? 5 : 1;
        if (t(cache).kind != TensorKind::kKvCache) return bad("its cache operand is not a KV cache");
        const int64_t e = heads.n_embd(), ekv = heads.n_embd_kv();
        const bool widths = n.op == Op::kKvWrite   ? t(0).cols == ekv && t(1).cols == ekv
                            : n.op == Op::kRopeKv  ? t(0).cols == e && t(1).cols == ekv && t(2).cols == ekv
                                                   : t(0).cols == e && o.cols == e;
        if (heads.head_dim <= 0 || heads.n_head_kv <= 0 || !widths) return bad("widths do not match the heads");
        const int pos = n.op == Op::kKvWrite ? 2 : n.op == Op::kRopeKv ? 3 : 2;
        if (t(pos).elem != Elem::kInt32 || t(pos + 1).elem != Elem::kInt32) return bad("positions and slots must be int32");
        break;
      }
    }
  }
  for (TensorId id : outputs_) {
    if (!defined[static_cast<size_t>(id)]) return Status(Code::kInvalidArgument, "output " + tensor(id).name + " is never computed");
  }
  return Status::ok();
}

std::string Graph::to_string() const {
  std::string out;
  for (const Node& n : nodes_) {
    std::string line = (n.layer >= 0 ? "blk." + std::to_string(n.layer) + ": " : std::string()) +
                       tensor(n.out[0]).name;
    if (n.out[1] != kNone) line += ", " + tensor(n.out[1]).name;
    line += std::string(" = ") + op_name(n.op) + "(";
    for (int i = 0; i < n.n_in(); ++i) {
      const TensorId id = n.in[static_cast<size_t>(i)];
      if (i) line += ", ";
      if (id == kNone) {
        line += "-";
        continue;
      }
      const Tensor& t = tensor(id);
      line += t.name;
      if (t.kind == TensorKind::kWeight) line += std::string("[") + dtype_name(t.weight_type()) + "]";
    }
    out += line + ")\n";
  }
  return out;
}

// ---- fuse() ----------------------------------------------------------------------------------------

namespace {

// Replaces nodes by index: `replace[i]` (if set) takes node i's place; nodes with `drop[i]` go.
void rebuild(Graph& g, const std::vector<std::optional<Node>>& replace, const std::vector<bool>& drop) {
  Graph out;
  out.io = g.io;
  out.heads = g.heads;
  out.first_layer = g.first_layer;
  out.end_layer = g.end_layer;
  out.n_vocab = g.n_vocab;
  out.n_embd = g.n_embd;
  out.n_ff = g.n_ff;
  for (const Tensor& t : g.tensors()) out.add_tensor(t);
  for (TensorId id : g.inputs()) out.mark_input(id);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (replace[i]) {
      out.add_node(*replace[i]);
    } else if (!drop[i]) {
      out.add_node(g.nodes()[i]);
    }
  }
  for (TensorId id : g.outputs()) out.mark_output(id);
  g = std::move(out);
}

}  // namespace

int fuse(Graph& g, const SupportsFn& supports) {
  const std::vector<Node>& nodes = g.nodes();
  const size_t n = nodes.size();
  std::vector<std::optional<Node>> replace(n);
  std::vector<bool> drop(n, false);
  int fused = 0;
  // The only consumer of a tensor (index), or -1 when it has none or several, or is a graph output.
  std::vector<int> only_use(g.tensors().size(), -1);
  {
    std::vector<int> count(g.tensors().size(), 0);
    for (size_t i = 0; i < n; ++i) {
      for (TensorId id : nodes[i].in) {
        if (id == kNone) continue;
        ++count[static_cast<size_t>(id)];
        only_use[static_cast<size_t>(id)] = static_cast<int>(i);
      }
    }
    for (TensorId id : g.outputs()) count[static_cast<size_t>(id)] += 1;
    for (size_t id = 0; id < count.size(); ++id) {
      if (count[id] != 1) only_use[id] = -1;
    }
  }
  auto taken = [&](size_t i) { return replace[i].has_value() || drop[i]; };

  for (size_t i = 0; i < n; ++i) {
    const Node& a = nodes[i];
    if (taken(i)) continue;
    // matmul -> add  =>  matmul_add (the residual add in the matmul's store).
    if (a.op == Op::kMatmul) {
      const int u = only_use[static_cast<size_t>(a.out[0])];
      if (u > static_cast<int>(i) && !taken(static_cast<size_t>(u)) && nodes[static_cast<size_t>(u)].op == Op::kAdd) {
        const Node& add = nodes[static_cast<size_t>(u)];
        const TensorId residual = add.in[0] == a.out[0] ? add.in[1] : add.in[0];
        Node f;
        f.op = Op::kMatmulAdd;
        f.part = a.part;
        f.layer = a.layer;
        f.in = {a.in[0], a.in[1], a.in[2], residual, kNone, kNone};
        f.out = add.out;
        // It takes the add's place, where every operand exists.
        if (supports(g, f)) {
          drop[i] = true;
          replace[static_cast<size_t>(u)] = f;
          ++fused;
          continue;
        }
      }
    }
    // matmul(Wg, x), matmul(Wu, x) -> swiglu | geglu  =>  matmul_swiglu | matmul_geglu.
    if (a.op == Op::kMatmul && a.in[2] == kNone) {
      const int u = only_use[static_cast<size_t>(a.out[0])];
      const Op glu = u > static_cast<int>(i) ? nodes[static_cast<size_t>(u)].op : Op::kAdd;
      if ((glu == Op::kSwiglu || glu == Op::kGeglu) && !taken(static_cast<size_t>(u))) {
        const Node& sw = nodes[static_cast<size_t>(u)];
        const TensorId other = sw.in[0] == a.out[0] ? sw.in[1] : sw.in[0];
        const int bp = g.producer(other);
        if (sw.in[0] == a.out[0] && bp > static_cast<int>(i) && bp < u && !taken(static_cast<size_t>(bp))) {
          const Node& b = nodes[static_cast<size_t>(bp)];
          if (b.op == Op::kMatmul && b.in[2] == kNone && b.in[0] == a.in[0] &&
              only_use[static_cast<size_t>(b.out[0])] == u) {
            Node f;
            f.op = glu == Op::kSwiglu ? Op::kMatmulSwiglu : Op::kMatmulGeglu;
            f.part = a.part;
            f.layer = a.layer;
            f.in = {a.in[0], a.in[1], b.in[1], kNone, kNone, kNone};
            f.out = sw.out;
            if (supports(g, f)) {
              drop[i] = drop[static_cast<size_t>(bp)] = true;
              replace[static_cast<size_t>(u)] = f;
              ++fused;
              continue;
            }
          }
        }
      }
    }
    // rope(Q), rope(K) -> kv_write(K', V)  =>  rope_kv.
    if (a.op == Op::kRope) {
      for (size_t j = i + 1; j < n; ++j) {
        const Node& b = nodes[j];
        if (b.op != Op::kRope || b.layer != a.layer || taken(j)) continue;
        const int w = only_use[static_cast<size_t>(b.out[0])];
        if (w < 0 || taken(static_cast<size_t>(w))) break;
        const Node& kv = nodes[static_cast<size_t>(w)];
        if (kv.op != Op::kKvWrite || kv.in[0] != b.out[0] || kv.in[2] != a.in[1] || b.in[1] != a.in[1]) break;
        Node f;
        if (a.rope_base != b.rope_base || a.rope_freq_scale != b.rope_freq_scale || a.rope_factors != b.rope_factors) break;
        f.op = Op::kRopeKv;
        f.part = a.part;
        f.layer = a.layer;
        f.rope_base = a.rope_base;
        f.rope_freq_scale = a.rope_freq_scale;
        f.rope_factors = a.rope_factors;
        f.in = {a.in[0], b.in[0], kv.in[1], kv.in[2], kv.in[3], kv.in[4]};
        f.out = {a.out[0], kv.out[0]};
        // Every input must exist where the fused node stands (the KV write's place), and Q' (now rounded
        // as attention rounds it, and produced there) may be read only by attention after it.
        bool ready = true;
        for (TensorId id : f.in) {
          if (id != kNone && g.producer(id) >= w) ready = false;
        }
        for (size_t r = 0; r < n && ready; ++r) {
          const Node& reader = nodes[r];
          for (int k = 0; k < reader.n_in(); ++k) {
            if (reader.in[static_cast<size_t>(k)] != a.out[0]) continue;
            if (reader.op != Op::kAttention || static_cast<int>(r) <= w || k != 0) ready = false;
          }
        }
        for (TensorId id : g.outputs()) ready = ready && id != a.out[0];
        if (ready && supports(g, f)) {
          drop[i] = drop[j] = true;
          replace[static_cast<size_t>(w)] = f;
          ++fused;
        }
        break;
      }
    }
  }
  if (fused > 0) rebuild(g, replace, drop);
  return fused;
}

}  // namespace inferd::graph
