#include "program.h"

#include <algorithm>
#include <map>

#include "inferd/status.h"

namespace inferd::cpu {

namespace {

using graph::Elem;
using graph::Graph;
using graph::Node;
using graph::Op;
using graph::TensorId;
using graph::TensorKind;

// How a step splits its work between threads.
enum class Part : uint8_t {
  kRowsT,       // token rows: split_range(T) (the same split for every such step)
  kRowsO,       // output rows: split_range(O)
  kReplicated,  // every thread, every row, into its own buffers
  kChunks,      // weight rows (output columns) claimed dynamically; every token row
  kUnits,       // (token, head) units
};

bool row_split(Part p) { return p == Part::kRowsT || p == Part::kRowsO; }

bool is_matmul(Op op) {
  return op == Op::kMatmul || op == Op::kMatmulAdd || op == Op::kMatmulSwiglu || op == Op::kMatmulGeglu;
}

// What a step touches that other threads may touch too: shared buffers, the step's outputs, a layer's
// KV cache. Thread-local buffers and the (read-only) inputs never conflict.
struct Hazard {
  enum Kind : uint8_t { kBuffer, kOutput, kCache } kind;
  int32_t index;
  bool operator<(const Hazard& o) const { return kind != o.kind ? kind < o.kind : index < o.index; }
};

class Compiler {
 public:
  Compiler(const Graph& g, bool gemv) : g_(g) {
    p_.gemv = gemv;
    const size_t nt = g.tensors().size();
    where_.assign(nt, Ref{});
    last_use_.assign(nt, -1);
    enc_kinds_.assign(nt, 0);
    enc_.assign(nt, {});
    encoded_.assign(nt, false);
    matmul_only_.assign(nt, true);
    for (size_t i = 0; i < g.inputs().size(); ++i) where_[static_cast<size_t>(g.inputs()[i])] = {Loc::kInput, static_cast<int32_t>(i)};
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      const TensorId id = g.outputs()[i];
      where_[static_cast<size_t>(id)] = {Loc::kOutput, static_cast<int32_t>(i)};
      last_use_[static_cast<size_t>(id)] = static_cast<int>(g.nodes().size());
      matmul_only_[static_cast<size_t>(id)] = false;
    }
    for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
      const Node& n = g.nodes()[ni];
      for (int i = 0; i < n.n_in(); ++i) {
        const TensorId id = n.in[static_cast<size_t>(i)];
        if (id == graph::kNone) continue;
        last_use_[static_cast<size_t>(id)] = std::max(last_use_[static_cast<size_t>(id)], static_cast<int>(ni));
        if (!is_matmul(n.op) || i != 0) matmul_only_[static_cast<size_t>(id)] = false;
      }
      if (is_matmul(n.op)) {
        const size_t x = static_cast<size_t>(n.in[0]);
        enc_kinds_[x] |= 1 << act_index(act_type_of(g.tensor(n.in[1]).weight_type()));
        if (n.op == Op::kMatmulSwiglu || n.op == Op::kMatmulGeglu) enc_kinds_[x] |= 1 << act_index(act_type_of(g.tensor(n.in[2]).weight_type()));
      }
    }
  }

  Program run() {
    for (size_t ni = 0; ni < g_.nodes().size(); ++ni) lower(static_cast<int32_t>(ni));
    p_.n_phases = phase_ + 1;
    return std::move(p_);
  }

 private:
  static RowsOf rows_of(const graph::Tensor& t) {
    INFERD_ASSERT(t.rows != graph::Rows::kFixed, "activation %s has a fixed row count", t.name.c_str());
    return t.rows == graph::Rows::kTokens ? RowsOf::kTokens : RowsOf::kOutputs;
  }
  // Replicated: a one-token program's work on a token row, done by every thread into its own buffer.
  bool replicate(const graph::Tensor& t) const { return p_.gemv && t.rows == graph::Rows::kTokens; }

  Ref new_buffer(std::string name, bool local, RowsOf rows, size_t row_bytes) {
    p_.buffers.push_back(Buffer{std::move(name), local, rows, row_bytes, -1, -1});
    return {local ? Loc::kLocal : Loc::kShared, static_cast<int32_t>(p_.buffers.size() - 1)};
  }
  // The storage of a node's output: the caller's vector for a graph output, else a new buffer.
  Ref output(TensorId id, bool local) {
    Ref& r = where_[static_cast<size_t>(id)];
    if (r.loc == Loc::kNone) {
      const graph::Tensor& t = g_.tensor(id);
      r = new_buffer(t.name, local, local ? RowsOf::kOne : rows_of(t), static_cast<size_t>(t.cols) * sizeof(float));
    }
    return r;
  }
  // `out` takes `in`'s buffer when `in` dies at node `ni` and is none of the node's other operands (an
  // operator that works in place must not overwrite what it still reads through another operand).
  Ref output_in_place(TensorId out, TensorId in, int32_t ni) {
    const Ref r = where_[static_cast<size_t>(in)];
    const Node& n = g_.nodes()[static_cast<size_t>(ni)];
    const int uses = static_cast<int>(std::count(n.in.begin(), n.in.end(), in));
    if (where_[static_cast<size_t>(out)].loc == Loc::kNone && (r.loc == Loc::kShared || r.loc == Loc::kLocal) &&
        last_use_[static_cast<size_t>(in)] == ni && uses == 1) {
      where_[static_cast<size_t>(out)] = r;
      return r;
    }
    return output(out, false);
  }
  Ref at(TensorId id) const {
    const Ref r = where_[static_cast<size_t>(id)];
    INFERD_ASSERT(r.loc != Loc::kNone, "tensor %s is read before it is computed", g_.tensor(id).name.c_str());
    return r;
  }

  static void hazard_of(const Ref& r, std::vector<Hazard>& out) {
    if (r.loc == Loc::kShared) out.push_back({Hazard::kBuffer, r.index});
    if (r.loc == Loc::kOutput) out.push_back({Hazard::kOutput, r.index});
  }

  // Appends `s`, first a barrier where it conflicts with what the current phase touched.
  // `any_rows`: read at rows other than the step's own split (conflicts with any write in the phase).
  void emit(Step s, Part part, const std::vector<Ref>& reads, const std::vector<Ref>& writes, int32_t cache_read = -1,
            int32_t cache_write = -1, const std::vector<Ref>& any_rows = {}) {
    std::vector<Hazard> rd, wr, rd_any;
    for (const Ref& r : reads) hazard_of(r, rd);
    for (const Ref& r : any_rows) hazard_of(r, rd_any);
    for (const Ref& r : writes) hazard_of(r, wr);
    if (cache_read >= 0) rd.push_back({Hazard::kCache, cache_read});
    if (cache_write >= 0) wr.push_back({Hazard::kCache, cache_write});
    bool conflict = false;
    for (const Hazard& h : rd) {
      auto it = touched_.find(h);
      if (it == touched_.end() || !it->second.written) continue;
      if (!(row_split(part) && it->second.part == part && it->second.same_part)) conflict = true;
    }
    for (const Hazard& h : rd_any) {
      auto it = touched_.find(h);
      if (it != touched_.end() && it->second.written) conflict = true;
    }
    for (const Hazard& h : wr) {
      auto it = touched_.find(h);
      if (it == touched_.end()) continue;
      if (!(row_split(part) && it->second.part == part && it->second.same_part)) conflict = true;
    }
    if (conflict) {
      Step b;
      b.kind = StepKind::kBarrier;
      p_.steps.push_back(b);
      ++phase_;
      touched_.clear();
    }
    auto note = [&](const Hazard& h, bool write) {
      auto [it, fresh] = touched_.try_emplace(h, Touch{part, true, write});
      if (!fresh) {
        it->second.same_part = it->second.same_part && it->second.part == part;
        it->second.written = it->second.written || write;
      }
    };
    for (const Hazard& h : rd) note(h, false);
    for (const Hazard& h : rd_any) {  // any thread reads any row: a later write by any split conflicts
      auto [it, fresh] = touched_.try_emplace(h, Touch{Part::kUnits, true, false});
      if (!fresh) it->second.same_part = false;
    }
    for (const Hazard& h : wr) note(h, true);
    auto live = [&](const Ref& r) {
      if (r.loc != Loc::kShared && r.loc != Loc::kLocal) return;
      Buffer& b = p_.buffers[static_cast<size_t>(r.index)];
      if (b.first_phase < 0) b.first_phase = phase_;
      b.last_phase = phase_;
    };
    for (const Ref& r : reads) live(r);
    for (const Ref& r : any_rows) live(r);
    for (const Ref& r : writes) live(r);
    p_.steps.push_back(s);
  }

  // The encodings of `x` that its matmuls read, computed once (an encode step, or nothing when done).
  void encode(TensorId x, int32_t ni) {
    const size_t xi = static_cast<size_t>(x);
    if (encoded_[xi]) {
      return;
    }
    const graph::Tensor& t = g_.tensor(x);
    const bool local = replicate(t);
    Step s;
    s.kind = StepKind::kEncode;
    s.node = ni;
    s.rows = rows_of(t);
    s.replicated = local;
    s.src = at(x);
    s.act_kinds = enc_kinds_[xi];
    std::vector<Ref> writes;
    for (int k = 0; k < kActKinds; ++k) {
      if (!(s.act_kinds & (1 << k))) continue;
      s.act_row_bytes[k] = dtype_row_bytes(kActTypes[k], t.cols);
      s.act[k] = new_buffer(t.name + "_" + dtype_name(kActTypes[k]), local, local ? RowsOf::kOne : rows_of(t),
                            s.act_row_bytes[k]);
      enc_[xi][static_cast<size_t>(k)] = s.act[k];
      writes.push_back(s.act[k]);
    }
    encoded_[xi] = true;
    emit(s, local ? Part::kReplicated : (s.rows == RowsOf::kTokens ? Part::kRowsT : Part::kRowsO), {s.src}, writes);
  }

  void matmul_operands(Step& s, TensorId x) {
    const size_t xi = static_cast<size_t>(x);
    s.act_kinds = enc_kinds_[xi];
    const int64_t k = g_.tensor(x).cols;
    for (int a = 0; a < kActKinds; ++a) {
      if (!(s.act_kinds & (1 << a))) continue;
      s.act[a] = enc_[xi][static_cast<size_t>(a)];
      s.act_row_bytes[a] = dtype_row_bytes(kActTypes[a], k);
    }
    s.rows = rows_of(g_.tensor(x));
    s.counter = p_.n_counters++;
  }
  std::vector<Ref> act_reads(const Step& s) const {
    std::vector<Ref> r;
    for (int a = 0; a < kActKinds; ++a) {
      if (s.act_kinds & (1 << a)) r.push_back(s.act[a]);
    }
    return r;
  }

  void lower(int32_t ni) {
    const Node& n = g_.nodes()[static_cast<size_t>(ni)];
    const graph::Tensor& out = g_.tensor(n.out[0]);
    Step s;
    s.node = ni;
    switch (n.op) {
      case Op::kEmbed:
        s.kind = StepKind::kEmbed;
        s.rows = RowsOf::kTokens;
        s.ints = at(n.in[0]);
        s.dst = output(n.out[0], false);
        emit(s, Part::kRowsT, {}, {s.dst});
        return;
      case Op::kRmsNorm: {
        const bool local = replicate(out) && matmul_only_[static_cast<size_t>(n.out[0])];
        s.kind = StepKind::kRmsNorm;
        s.rows = rows_of(out);
        s.replicated = local;
        s.src = at(n.in[0]);
        s.dst = output(n.out[0], local);
        emit(s, local ? Part::kReplicated : (s.rows == RowsOf::kTokens ? Part::kRowsT : Part::kRowsO), {s.src}, {s.dst});
        return;
      }
      case Op::kMatmul:
      case Op::kMatmulAdd: {
        encode(n.in[0], ni);
        s.kind = StepKind::kMatmul;
        matmul_operands(s, n.in[0]);
        if (n.op == Op::kMatmulAdd) {
          s.res = at(n.in[3]);
          s.dst = output_in_place(n.out[0], n.in[3], ni);
        } else {
          s.dst = output(n.out[0], false);
        }
        std::vector<Ref> reads = act_reads(s);
        if (s.res.loc != Loc::kNone) reads.push_back(s.res);
        emit(s, Part::kChunks, reads, {s.dst});
        return;
      }
      case Op::kMatmulSwiglu:
      case Op::kMatmulGeglu: {
        encode(n.in[0], ni);
        s.kind = StepKind::kGateUp;
        matmul_operands(s, n.in[0]);
        s.dst = output(n.out[0], false);
        s.scratch = new_buffer(out.name + "_up", false, rows_of(out), static_cast<size_t>(out.cols) * sizeof(float));
        std::vector<Ref> writes = {s.dst, s.scratch};
        emit(s, Part::kChunks, act_reads(s), writes);
        return;
      }
      case Op::kRope:
        s.kind = StepKind::kRope;
        s.src = at(n.in[0]);
        s.ints = at(n.in[1]);
        s.dst = output(n.out[0], false);
        emit(s, Part::kUnits, {s.src}, {s.dst});
        return;
      case Op::kKvWrite:
        s.kind = StepKind::kKvWrite;
        s.src = at(n.in[0]);
        s.src2 = at(n.in[1]);
        s.ints = at(n.in[2]);
        s.slots = at(n.in[3]);
        where_[static_cast<size_t>(n.out[0])] = Ref{};  // the layer's cache
        emit(s, Part::kUnits, {s.src, s.src2}, {}, -1, n.layer);
        return;
      case Op::kRopeKv:
        s.kind = StepKind::kRopeKv;
        s.src = at(n.in[0]);
        s.src2 = at(n.in[1]);
        s.res = at(n.in[2]);  // V
        s.ints = at(n.in[3]);
        s.slots = at(n.in[4]);
        s.dst = output_in_place(n.out[0], n.in[0], ni);
        for (const Node& consumer : g_.nodes()) {  // the attention over this Q, if it scales Q itself
          if (consumer.op == Op::kAttention && consumer.in[0] == n.out[0] && consumer.scale > 0.0f) {
            s.q_scale = consumer.scale;
          }
        }
        emit(s, Part::kUnits, {s.src, s.src2, s.res}, {s.dst}, -1, n.layer);
        return;
      case Op::kAttention: {
        s.kind = StepKind::kAttention;
        s.src = at(n.in[0]);
        s.ints = at(n.in[2]);
        s.slots = at(n.in[3]);
        const int q_producer = g_.producer(n.in[0]);
        s.round_q = q_producer < 0 || g_.nodes()[static_cast<size_t>(q_producer)].op != Op::kRopeKv;
        if (s.round_q && n.scale > 0.0f) s.q_scale = n.scale;  // else the RopeKv step scales Q before rounding
        s.dst = output(n.out[0], false);
        s.scratch = new_buffer(out.name + "_scores", true, RowsOf::kKv, sizeof(float));
        emit(s, Part::kUnits, {s.src, s.scratch}, {s.dst, s.scratch}, n.layer, -1);
        return;
      }
      case Op::kSwiglu:
      case Op::kGeglu:
      case Op::kAdd:
        s.kind = n.op == Op::kAdd ? StepKind::kAdd : n.op == Op::kSwiglu ? StepKind::kSwiglu : StepKind::kGeglu;
        s.rows = rows_of(out);
        s.src = at(n.in[0]);
        s.src2 = at(n.in[1]);
        s.dst = output(n.out[0], false);
        emit(s, s.rows == RowsOf::kTokens ? Part::kRowsT : Part::kRowsO, {s.src, s.src2}, {s.dst});
        return;
      case Op::kGetRows:
        s.kind = StepKind::kGetRows;
        s.rows = RowsOf::kOutputs;
        s.src = at(n.in[0]);
        s.ints = at(n.in[1]);
        s.dst = output(n.out[0], false);
        // Rows chosen by index: any thread may read any row of src.
        emit(s, Part::kRowsO, {}, {s.dst}, -1, -1, {s.src});
        return;
    }
    INFERD_ASSERT(false, "unknown operator %s", graph::op_name(n.op));
  }

  struct Touch {
    Part part;
    bool same_part;  // every access in this phase used `part`
    bool written;
  };

  const Graph& g_;
  Program p_;
  int32_t phase_ = 0;
  std::map<Hazard, Touch> touched_;
  std::vector<Ref> where_;
  std::vector<int> last_use_;
  std::vector<int> enc_kinds_;
  std::vector<std::array<Ref, kActKinds>> enc_;
  std::vector<bool> encoded_;
  std::vector<bool> matmul_only_;  // read only as the activation input of matmuls
};

}  // namespace

Program compile(const graph::Graph& g, bool gemv) { return Compiler(g, gemv).run(); }

}  // namespace inferd::cpu
