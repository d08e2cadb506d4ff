// The backend-ops suite: every operator of the model graph, on every registered backend in every
// configuration it offers for testing (BackendFactory::test_variants), against the CPU backend running
// the graph's basic operators (the definition of each operator).
//
// A case is a small graph of basic operators with odd sizes, its weights of a given type and its host
// inputs, run for one or more steps. Each backend runs the graph fused for itself (graph::fuse), so a
// fused operator is checked against the operators it replaces. A backend that reports exact()
// (the CPU; the OpenCL backend's exact numerics) must give the reference's bits; the others are compared
// by normalized mean squared error, as ggml's test-backend-ops does. A case whose graph has an operator
// the backend does not support, or a backend whose device is missing, is skipped and says why: that is
// not a failure. A new backend joins by registering (backend_registry.h); a new operator comes with its
// cases here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include "inferd/backend_registry.h"
#include "inferd/cpu_backend.h"
#include "inferd/graph.h"
#include "inferd/kernels/cpu.h"
#include "inferd/kernels/test_weights.h"

namespace inferd {
namespace {

// The backends are held to the CPU reference in the vec_dot matmul order (kernels::MatmulOrder), the one CUDA's
// exact numerics reproduce; the repacked order's kernels have tests of their own (kernels/cpu/gemm_test.cpp,
// ClEngineFiles.RepackedMatmulOrderEqualsTheCpuEngine, the numerics tests).
const kernels::ScopedMatmulOrder kVecDotOrder(kernels::MatmulOrder::kVecDot);

using graph::Elem;
using graph::Graph;
using graph::Node;
using graph::Op;
using graph::Rows;
using graph::TensorId;

// ---- Cases --------------------------------------------------------------------------------------------

// A case's graph and data. Weight views point into `weight_bytes`, so the case must not move once built.
struct CaseData {
  Graph g;
  BackendShape shape;
  std::deque<std::vector<uint8_t>> weight_bytes;
  std::deque<WeightView> views;
  // Per step: the shape and the host data of every graph input (in Graph::inputs() order).
  struct StepData {
    graph::StepShape shape;
    std::vector<std::vector<float>> floats;
    std::vector<std::vector<int32_t>> ints;
  };
  std::vector<StepData> steps;
};

// Builds a case's graph: inputs, weights, nodes.
class CaseBuilder {
 public:
  explicit CaseBuilder(CaseData& d) : d_(d) {}

  TensorId input(const std::string& name, Elem elem, Rows rows, int64_t cols) {
    graph::Tensor t;
    t.name = name;
    t.kind = graph::TensorKind::kInput;
    t.elem = elem;
    t.rows = rows;
    t.cols = cols;
    const TensorId id = d_.g.add_tensor(t);
    d_.g.mark_input(id);
    return id;
  }
  TensorId act(const std::string& name, int64_t cols, Rows rows = Rows::kTokens, graph::Role role = graph::Role::kOther) {
    graph::Tensor t;
    t.name = name;
    t.rows = rows;
    t.cols = cols;
    t.role = role;
    return d_.g.add_tensor(t);
  }
  // A weight of `type`, rows x cols, from random floats of spread `spread` (a vector: rows == 1, F32).
  TensorId weight(const std::string& name, DType type, int64_t rows, int64_t cols, uint32_t seed, float spread = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, spread);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    std::vector<uint8_t>& bytes = d_.weight_bytes.emplace_back(row_bytes * static_cast<size_t>(rows));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = dist(rng);
      kernels::testing::encode_weight_row(type, row.data(), cols, seed * 7919u + static_cast<uint32_t>(r), spread,
                                          bytes.data() + static_cast<size_t>(r) * row_bytes);
    }
    WeightView& w = d_.views.emplace_back();
    w.data = bytes.data();
    w.type = type;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = row_bytes;
    graph::Tensor t;
    t.name = name;
    t.kind = graph::TensorKind::kWeight;
    t.elem = Elem::kWeight;
    t.rows = Rows::kFixed;
    t.fixed_rows = rows;
    t.cols = cols;
    t.weight = &w;
    return d_.g.add_tensor(t);
  }
  TensorId cache(int32_t layer) {
    graph::Tensor t;
    t.name = "kv" + std::to_string(layer);
    t.kind = graph::TensorKind::kKvCache;
    t.rows = Rows::kFixed;
    t.layer = layer;
    return d_.g.add_tensor(t);
  }
  TensorId node(Op op, std::initializer_list<TensorId> in, TensorId out, int32_t layer = -1, float eps = 0.0f) {
    Node n;
    n.op = op;
    n.layer = layer;
    n.part = layer >= 0 ? graph::Part::kAttention : graph::Part::kEmbeddings;
    size_t i = 0;
    for (TensorId id : in) n.in[i++] = id;
    n.out[0] = out;
    n.eps = eps;
    d_.g.add_node(n);
    return out;
  }
  void output(TensorId id) { d_.g.mark_output(id); }

  // A step: random floats for every float input, the given ints for the int inputs (by tensor id).
  void step(int32_t tokens, int32_t outputs, int32_t kv_pad, const std::map<TensorId, std::vector<int32_t>>& ints,
            uint32_t seed) {
    CaseData::StepData s;
    s.shape = {tokens, outputs, kv_pad};
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (TensorId id : d_.g.inputs()) {
      const graph::Tensor& t = d_.g.tensor(id);
      if (t.elem == Elem::kInt32) {
        s.ints.push_back(ints.at(id));
        s.floats.emplace_back();
      } else {
        std::vector<float> v(static_cast<size_t>(Graph::rows(t, s.shape) * t.cols));
        for (float& x : v) x = dist(rng);
        s.floats.push_back(std::move(v));
        s.ints.emplace_back();
      }
    }
    d_.steps.push_back(std::move(s));
  }

 private:
  CaseData& d_;
};

struct Case {
  std::string name;
  std::function<void(CaseData&)> build;
  std::vector<DType> weight_types = {};  // the weight types of its matmuls or embedding table, if any
};

const DType kWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                              DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::string type_name(DType t) {
  std::string s = dtype_name(t);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Element-wise: a + b and silu(a) * b, odd widths, one and several tokens.
void add_elementwise(std::vector<Case>& cases) {
  for (Op op : {Op::kAdd, Op::kSwiglu}) {
    for (auto [t, c] : {std::pair{7, 37}, std::pair{1, 100}, std::pair{3, 576}}) {
      cases.push_back({std::string(graph::op_name(op)) + "_t" + std::to_string(t) + "_c" + std::to_string(c),
                       [op, t = t, c = c](CaseData& d) {
                         CaseBuilder b(d);
                         const TensorId x = b.input("a", Elem::kFloat, Rows::kTokens, c);
                         const TensorId y = b.input("b", Elem::kFloat, Rows::kTokens, c);
                         b.output(b.node(op, {x, y}, b.act("out", c)));
                         b.step(t, 0, 64, {}, 1);
                       }});
    }
  }
}

// RMSNorm, with a learned weight vector.
void add_norms(std::vector<Case>& cases) {
  for (auto [t, c] : {std::pair{5, 133}, std::pair{1, 576}, std::pair{2, 4}}) {
    cases.push_back({"rms_norm_t" + std::to_string(t) + "_c" + std::to_string(c), [t = t, c = c](CaseData& d) {
                       CaseBuilder b(d);
                       const TensorId x = b.input("x", Elem::kFloat, Rows::kTokens, c);
                       const TensorId w = b.weight("norm", DType::kF32, 1, c, 3);
                       b.output(b.node(Op::kRmsNorm, {x, w}, b.act("out", c), -1, 1e-5f));
                       b.step(t, 0, 64, {}, 2);
                     }});
  }
}

// get_rows: the rows whose logits are wanted, some of them or all.
void add_get_rows(std::vector<Case>& cases) {
  // Some rows; every row in order (a prefill with all logits); every row count, out of order, repeated.
  const std::pair<std::string, std::vector<int32_t>> sets[] = {
      {"some", {1, 3, 4, 8}}, {"all", {0, 1, 2, 3}}, {"shuffled", {2, 0, 3, 3}}};
  for (const auto& [what, rows] : sets) {
    const int32_t t = what == "some" ? 9 : 4;
    cases.push_back({"get_rows_" + what, [rows, t](CaseData& d) {
                       CaseBuilder b(d);
                       const TensorId x = b.input("x", Elem::kFloat, Rows::kTokens, 21);
                       const TensorId r = b.input("rows", Elem::kInt32, Rows::kOutputs, 1);
                       d.g.io.out_rows = r;
                       b.output(b.node(Op::kGetRows, {x, r}, b.act("out", 21, Rows::kOutputs, graph::Role::kResidual)));
                       b.step(t, static_cast<int32_t>(rows.size()), 64, {{r, rows}}, 4);
                     }});
  }
}

// The embedding lookup, every weight type.
void add_embeddings(std::vector<Case>& cases) {
  for (DType type : kWeightTypes) {
    cases.push_back({"embed_" + type_name(type), [type](CaseData& d) {
                       CaseBuilder b(d);
                       const TensorId ids = b.input("tokens", Elem::kInt32, Rows::kTokens, 1);
                       d.g.io.token_ids = ids;
                       const TensorId table = b.weight("token_embd", type, 40, 256, 5);
                       b.output(b.node(Op::kEmbed, {ids, table}, b.act("out", 256)));
                       b.step(6, 0, 64, {{ids, {0, 39, 7, 7, 21, 3}}}, 6);
                     },
                     {type}});
  }
}

// Matmuls, every weight type, decode and prefill token counts, an odd row count; with the residual add
// after them (a backend may fuse it: matmul_add).
void add_matmuls(std::vector<Case>& cases) {
  for (DType type : kWeightTypes) {
    for (int32_t t : {1, 2, 5, 17}) {
      for (bool residual : {false, true}) {
        const int64_t k = 512, n = 37;
        cases.push_back({std::string(residual ? "matmul_add_" : "matmul_") + type_name(type) + "_t" + std::to_string(t),
                         [=](CaseData& d) {
                           CaseBuilder b(d);
                           const TensorId x = b.input("x", Elem::kFloat, Rows::kTokens, k);
                           const TensorId w = b.weight("w", type, n, k, 7 + t);
                           TensorId y = b.node(Op::kMatmul, {x, w}, b.act("y", n));
                           if (residual) {
                             const TensorId r = b.input("residual", Elem::kFloat, Rows::kTokens, n);
                             y = b.node(Op::kAdd, {r, y}, b.act("sum", n, Rows::kTokens, graph::Role::kResidual));
                           }
                           b.output(y);
                           b.step(t, 0, 64, {}, 8);
                         },
                         {type}});
      }
    }
  }
}

// Gate and up matmuls with SwiGLU (a backend may fuse them: matmul_swiglu), every type, and gate and up
// of different types.
void add_ffn(std::vector<Case>& cases) {
  std::vector<std::pair<DType, DType>> pairs;
  for (DType type : kWeightTypes) pairs.push_back({type, type});
  pairs.push_back({DType::kQ4_K, DType::kQ6_K});
  pairs.push_back({DType::kQ8_0, DType::kF16});
  for (auto [tg, tu] : pairs) {
    for (int32_t t : {1, 6}) {
      std::string name = "matmul_swiglu_" + type_name(tg);
      if (tg != tu) name.append("_").append(type_name(tu));
      name.append("_t").append(std::to_string(t));
      cases.push_back({name,
                       [tg = tg, tu = tu, t](CaseData& d) {
                         CaseBuilder b(d);
                         const int64_t k = 256, f = 68;
                         const TensorId x = b.input("x", Elem::kFloat, Rows::kTokens, k);
                         const TensorId g = b.node(Op::kMatmul, {x, b.weight("gate", tg, f, k, 11)}, b.act("gate", f));
                         const TensorId u = b.node(Op::kMatmul, {x, b.weight("up", tu, f, k, 12)}, b.act("up", f));
                         b.output(b.node(Op::kSwiglu, {g, u}, b.act("h", f)));
                         b.step(t, 0, 64, {}, 13);
                       },
                       {tg, tu}});
    }
  }
}

// The attention block of one layer: Q, K, V matmuls (with biases, as qwen2), RoPE of Q and K, the KV
// write into the cache's sub-tensor, attention over the padded cache (a backend may fuse the RoPEs and
// the write: rope_kv). Two steps: a prefill of slot 1, then a decode of slot 1 and a fresh slot 0.
void add_attention(std::vector<Case>& cases) {
  struct Geometry {
    const char* name;
    int32_t n_head, n_head_kv, head_dim;
    RopeStyle style;
  };
  for (const Geometry& geo : {Geometry{"gqa_hd64", 4, 2, 64, RopeStyle::kNormal},
                              Geometry{"mha_hd32_neox", 8, 8, 32, RopeStyle::kNeox}}) {
    for (bool bias : {false, true}) {
      for (DType type : {DType::kQ8_0, DType::kF16}) {
        cases.push_back({std::string("attention_") + geo.name + (bias ? "_bias_" : "_") + type_name(type),
                         [geo, bias, type](CaseData& d) {
                           CaseBuilder b(d);
                           d.g.heads = graph::Heads{geo.n_head, geo.n_head_kv, geo.head_dim, 10000.0f, geo.style};
                           d.g.first_layer = 0;
                           d.g.end_layer = 1;
                           d.shape = BackendShape{2, 96, 8, 64};
                           const int64_t e = geo.n_head * geo.head_dim, ekv = geo.n_head_kv * geo.head_dim;
                           const TensorId x = b.input("x", Elem::kFloat, Rows::kTokens, e);
                           const TensorId pos = b.input("positions", Elem::kInt32, Rows::kTokens, 1);
                           const TensorId slot = b.input("slots", Elem::kInt32, Rows::kTokens, 1);
                           d.g.io.positions = pos;
                           d.g.io.slots = slot;
                           auto proj = [&](const char* name, int64_t rows, uint32_t seed) {
                             const TensorId w = b.weight(std::string(name) + ".weight", type, rows, e, seed, 0.1f);
                             const TensorId bv =
                                 bias ? b.weight(std::string(name) + ".bias", DType::kF32, 1, rows, seed + 1) : graph::kNone;
                             return b.node(Op::kMatmul, {x, w, bv}, b.act(name, rows), 0);
                           };
                           const TensorId q = proj("q", e, 21), k = proj("k", ekv, 23), v = proj("v", ekv, 25);
                           const TensorId qr = b.node(Op::kRope, {q, pos}, b.act("q_rope", e), 0);
                           const TensorId kr = b.node(Op::kRope, {k, pos}, b.act("k_rope", ekv), 0);
                           const TensorId kv = b.node(Op::kKvWrite, {kr, v, pos, slot, b.cache(0)}, b.cache(0), 0);
                           b.output(b.node(Op::kAttention, {qr, kv, pos, slot}, b.act("attn", e), 0));
                           b.step(5, 0, 64, {{pos, {0, 1, 2, 3, 4}}, {slot, {1, 1, 1, 1, 1}}}, 31);
                           b.step(2, 0, 64, {{pos, {5, 0}}, {slot, {1, 0}}}, 32);
                         }});
      }
    }
  }
  // A long prefill whose KV length crosses a padding step, and a decode after it.
  cases.push_back({"attention_long_prefill", [](CaseData& d) {
                     CaseBuilder b(d);
                     d.g.heads = graph::Heads{4, 2, 64, 10000.0f, RopeStyle::kNormal};
                     d.g.first_layer = 0;
                     d.g.end_layer = 1;
                     d.shape = BackendShape{1, 160, 80, 64};
                     const TensorId q = b.input("q", Elem::kFloat, Rows::kTokens, 256);
                     const TensorId k = b.input("k", Elem::kFloat, Rows::kTokens, 128);
                     const TensorId v = b.input("v", Elem::kFloat, Rows::kTokens, 128);
                     const TensorId pos = b.input("positions", Elem::kInt32, Rows::kTokens, 1);
                     const TensorId slot = b.input("slots", Elem::kInt32, Rows::kTokens, 1);
                     d.g.io.positions = pos;
                     d.g.io.slots = slot;
                     const TensorId qr = b.node(Op::kRope, {q, pos}, b.act("q_rope", 256), 0);
                     const TensorId kr = b.node(Op::kRope, {k, pos}, b.act("k_rope", 128), 0);
                     const TensorId kv = b.node(Op::kKvWrite, {kr, v, pos, slot, b.cache(0)}, b.cache(0), 0);
                     b.output(b.node(Op::kAttention, {qr, kv, pos, slot}, b.act("attn", 256), 0));
                     std::vector<int32_t> p(70), s(70, 0);
                     for (int32_t i = 0; i < 70; ++i) p[static_cast<size_t>(i)] = i;
                     b.step(70, 0, 128, {{pos, p}, {slot, s}}, 41);
                     b.step(1, 0, 128, {{pos, {70}}, {slot, {0}}}, 42);
                   }});
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  add_elementwise(cases);
  add_norms(cases);
  add_get_rows(cases);
  add_embeddings(cases);
  add_matmuls(cases);
  add_ffn(cases);
  add_attention(cases);
  return cases;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = all_cases();
  return kCases;
}

// ---- Backends ---------------------------------------------------------------------------------------

struct Variant {
  const BackendFactory* factory;
  BackendVariant variant;
};

std::vector<Variant> variants() {
  std::vector<Variant> out;
  for (const BackendFactory* f : registered_backends()) {
    for (BackendVariant& v : f->test_variants()) out.push_back({f, std::move(v)});
  }
  return out;
}

// One instance per variant for the whole suite (an OpenCL context each); null with the reason when it
// cannot be made here (no device).
Backend* instance(const Variant& v, std::string* why) {
  static std::map<std::string, std::pair<std::unique_ptr<Backend>, std::string>> made;
  auto it = made.find(v.variant.name);
  if (it == made.end()) {
    auto b = v.factory->create(v.variant.config);
    it = made.emplace(v.variant.name, b.is_ok() ? std::pair{std::move(b).value(), std::string()}
                                                 : std::pair{std::unique_ptr<Backend>(), b.status().to_string()})
             .first;
  }
  *why = it->second.second;
  return it->second.first.get();
}

// Runs `d`'s graph (fused for `b` when `fuse`) for every step; the outputs of every step, in order.
Result<std::vector<std::vector<float>>> run(Backend& b, const CaseData& d, bool fuse) {
  Graph g = d.g;
  if (fuse) graph::fuse(g, [&b](const Graph& gr, const Node& n) { return b.supports(gr, n); });
  for (const Node& n : g.nodes()) {
    if (!b.supports(g, n)) {
      return Status(Code::kUnimplemented, std::string(graph::op_name(n.op)) + " (" + g.tensor(n.out[0]).name + ")");
    }
  }
  // The KV pool as ModelRunner makes it by default: a run of blocks per slot, each slot's table its own run.
  BackendShape shape = d.shape;
  const int32_t per_slot = graph::kv_blocks_per_slot(shape.n_ctx);
  if (shape.n_blocks == 0) shape.n_blocks = shape.n_slots * per_slot;
  std::vector<int32_t> kv_table(static_cast<size_t>(shape.n_slots) * static_cast<size_t>(per_slot));
  for (size_t i = 0; i < kv_table.size(); ++i) kv_table[i] = static_cast<int32_t>(i);
  INFERD_RETURN_IF_ERROR(b.prepare(g, shape));
  std::vector<std::vector<float>> out;
  for (const CaseData::StepData& s : d.steps) {
    graph::StepIO io;
    io.shape = s.shape;
    io.kv_table = kv_table;
    for (size_t i = 0; i < g.inputs().size(); ++i) {
      if (g.tensor(g.inputs()[i]).elem == Elem::kInt32) {
        io.inputs.push_back({s.ints[i].data(), s.ints[i].size()});
      } else {
        io.inputs.push_back({s.floats[i].data(), s.floats[i].size()});
      }
    }
    std::vector<std::vector<float>> outputs(g.outputs().size());
    for (auto& o : outputs) io.outputs.push_back(&o);
    INFERD_RETURN_IF_ERROR(b.compute(g, io));
    for (auto& o : outputs) out.push_back(std::move(o));
  }
  return out;
}

// Normalized mean squared error of `got` against `want`.
double nmse(const std::vector<float>& want, const std::vector<float>& got) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    err += d * d;
    norm += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return norm > 0 ? err / norm : err;
}

class BackendOpsTest : public ::testing::TestWithParam<std::tuple<size_t, size_t>> {
 protected:
  static const std::vector<Variant>& all_variants() {
    static const std::vector<Variant> kVariants = variants();
    return kVariants;
  }
  static CpuBackend& reference() {
    static std::unique_ptr<CpuBackend> cpu = CpuBackend::create(CpuBackendOptions{}).value();
    return *cpu;
  }
};

TEST_P(BackendOpsTest, MatchesTheCpuReference) {
  const auto [vi, ci] = GetParam();
  const Variant& v = all_variants()[vi];
  const Case& c = cases()[ci];
  std::string why;
  Backend* backend = instance(v, &why);
  if (backend == nullptr) GTEST_SKIP() << v.variant.name << " is not available here: " << why;
  CaseData d;
  d.shape = BackendShape{1, 64, 32, 64};
  c.build(d);
  ASSERT_TRUE(d.g.validate().is_ok()) << d.g.validate().to_string();
  auto want = run(reference(), d, /*fuse=*/false);
  ASSERT_TRUE(want.is_ok()) << "the CPU reference: " << want.status().to_string();
  auto got = run(*backend, d, /*fuse=*/true);
  if (!got && got.status().code() == Code::kUnimplemented) {
    GTEST_SKIP() << v.variant.name << " does not support " << got.status().message();
  }
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), want->size());
  const bool exact = backend->exact();
  // Float numerics: the CPU quantizes a matmul's activations to 8 bits, the backend need not; halves
  // round every activation.
  const double tolerance = v.variant.name.find("f16") != std::string::npos ? 3e-3 : 5e-4;
  for (size_t o = 0; o < want->size(); ++o) {
    const std::vector<float>& w = (*want)[o];
    const std::vector<float>& g = (*got)[o];
    ASSERT_EQ(g.size(), w.size()) << "output " << o;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_TRUE(std::isfinite(g[i])) << "output " << o << "[" << i << "] = " << g[i];
    if (exact) {
      size_t differ = 0, first = g.size();
      for (size_t i = 0; i < g.size(); ++i) {
        if (std::memcmp(&g[i], &w[i], sizeof(float)) != 0) {
          if (differ++ == 0) first = i;
        }
      }
      EXPECT_EQ(differ, 0u) << "output " << o << ": " << differ << " of " << g.size() << " floats differ, the first at "
                            << first << " (" << (first < g.size() ? g[first] : 0.0f) << " vs "
                            << (first < w.size() ? w[first] : 0.0f) << ")";
    } else {
      EXPECT_LE(nmse(w, g), tolerance) << "output " << o;
    }
  }
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<size_t, size_t>>& info) {
  static const std::vector<Variant> kVariants = variants();
  const auto [vi, ci] = info.param;
  return kVariants[vi].variant.name + "_" + cases()[ci].name;
}

// Every case on every variant, except that a storage-only variant runs the weight-typed cases of F16, Q4_0
// and Q4_K alone (one of each block family; the full product compiled some 900 OpenCL programs, a quarter of
// an hour on PoCL with an empty kernel cache).
std::vector<std::tuple<size_t, size_t>> params() {
  std::vector<std::tuple<size_t, size_t>> out;
  const std::vector<Variant> vs = variants();
  auto spread_type = [](DType t) { return t == DType::kF16 || t == DType::kQ4_0 || t == DType::kQ4_K; };
  for (size_t v = 0; v < vs.size(); ++v) {
    for (size_t c = 0; c < cases().size(); ++c) {
      const std::vector<DType>& types = cases()[c].weight_types;
      if (vs[v].variant.storage_only && !std::all_of(types.begin(), types.end(), spread_type)) continue;
      out.emplace_back(v, c);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendOpsTest, ::testing::ValuesIn(params()), test_name);

// Fused operators equal the basic operators they replace, bit for bit, on the CPU.
TEST(BackendOpsFusion, TheCpuFusedGraphEqualsItsBasicOperators) {
  std::unique_ptr<CpuBackend> owned = CpuBackend::create(CpuBackendOptions{}).value();
  CpuBackend& cpu = *owned;
  size_t fused_cases = 0;
  for (const Case& c : cases()) {
    CaseData d;
    d.shape = BackendShape{1, 64, 32, 64};
    c.build(d);
    Graph g = d.g;
    if (graph::fuse(g, [&cpu](const Graph& gr, const Node& n) { return cpu.supports(gr, n); }) == 0) continue;
    ++fused_cases;
    auto basic = run(cpu, d, false);
    auto fused = run(cpu, d, true);
    ASSERT_TRUE(basic.is_ok() && fused.is_ok()) << c.name;
    ASSERT_EQ(basic->size(), fused->size());
    for (size_t o = 0; o < basic->size(); ++o) {
      ASSERT_EQ(std::memcmp((*basic)[o].data(), (*fused)[o].data(), (*basic)[o].size() * sizeof(float)), 0)
          << c.name << " output " << o;
    }
  }
  EXPECT_GT(fused_cases, 50u);
}

}  // namespace
}  // namespace inferd
