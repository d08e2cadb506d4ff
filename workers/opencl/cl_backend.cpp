#include "inferd/opencl/cl_backend.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "inferd/kernels/cpu.h"

namespace inferd::opencl {

namespace {

using graph::Graph;
using graph::Node;
using graph::Op;
using graph::TensorId;

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

Result<std::unique_ptr<MatmulWeights>> upload_matrix(Runtime& rt, const std::string& name, DType type, int64_t rows,
                                                     int64_t cols, const void* data) {
  if (!MatmulWeights::supports(type)) {
    return make_error(Code::kUnimplemented, "tensor %s has type %s, which the OpenCL backend cannot read yet",
                      name.c_str(), dtype_name(type));
  }
  auto w = MatmulWeights::upload(rt, type, rows, cols, data);
  if (!w) return w.status().with_context(name);
  return std::make_unique<MatmulWeights>(std::move(w).value());
}

// A weight matrix as MatmulWeights::upload reads it: the row layout (an interleaved matrix from a weights
// segment is deinterleaved into a host copy first).
Result<std::unique_ptr<MatmulWeights>> upload_view(Runtime& rt, const std::string& name, const WeightView& w) {
  if (!w.interleaved()) return upload_matrix(rt, name, w.type, w.rows, w.cols, w.data);
  std::vector<uint8_t> host(static_cast<size_t>(w.rows) * w.row_bytes);
  for_each_row_layout_piece(w.type, w.layout, w.rows, w.cols, w.data, [&](size_t off, const uint8_t* p, size_t n) {
    std::memcpy(host.data() + off, p, n);
    return true;
  });
  return upload_matrix(rt, name, w.type, w.rows, w.cols, host.data());
}

// Whether the CPU engine computes these matrices in one matmul order (kernels::matmul_order_for() decides by
// each one's rows), so that one stacked exact matmul can reproduce them all.
bool same_matmul_order(std::initializer_list<const WeightView*> parts) {
  const WeightView& first = **parts.begin();
  for (const WeightView* p : parts) {
    if (kernels::matmul_order_for(p->type, p->rows) != kernels::matmul_order_for(first.type, first.rows)) return false;
  }
  return true;
}

// Several matrices of one type, width and matmul order stacked into one (their rows one after the other), as
// one matmul computes them all.
Result<std::unique_ptr<MatmulWeights>> upload_stacked(Runtime& rt, const std::string& name,
                                                      std::initializer_list<const WeightView*> parts) {
  const WeightView& first = **parts.begin();
  INFERD_ASSERT(same_matmul_order(parts), "stacked matrices of different matmul orders");
  int64_t rows = 0;
  for (const WeightView* p : parts) rows += p->rows;
  std::vector<uint8_t> host(static_cast<size_t>(rows) * first.row_bytes);
  size_t at = 0;
  for (const WeightView* p : parts) {
    INFERD_ASSERT(p->type == first.type && p->cols == first.cols && p->row_bytes == first.row_bytes);
    const size_t bytes = static_cast<size_t>(p->rows) * p->row_bytes;
    for_each_row_layout_piece(p->type, p->layout, p->rows, p->cols, p->data, [&](size_t off, const uint8_t* b, size_t n) {
      std::memcpy(host.data() + at + off, b, n);
      return true;
    });
    at += bytes;
  }
  auto w = upload_matrix(rt, name, first.type, rows, first.cols, host.data());
  if (w) w.value()->set_order_rows(first.rows);
  return w;
}

// What compute() does for a node (decided once, in prepare()).
enum class Action : uint8_t {
  kSkip,        // computed by another node (a member of a stacked Q|K|V matmul)
  kEmbed,
  kRmsNorm,
  kMatmul,      // one matrix, or a stacked Q|K|V into one tensor
  kMatmulAdd,   // one matrix, the residual added at the store (matmul_add)
  kGateUp,      // matmul_swiglu / matmul_geglu: stacked gate|up then swiglu_halves (geglu_halves), or two
                // matmuls then swiglu (geglu)
  kRopeKv,
  kAttention,
  kSwiglu,
  kGeglu,
  kAdd,
  kGetRows,
};

}  // namespace

const char* numerics_name(Numerics numerics) { return numerics == Numerics::kExact ? "exact" : "float"; }
const char* storage_policy_name(StoragePolicy policy) { return policy == StoragePolicy::kRule ? "rule" : "measure"; }
const char* storage_source_name(StorageSource source) {
  switch (source) {
    case StorageSource::kForced: return "forced";
    case StorageSource::kRule: return "rule";
    case StorageSource::kMeasured: return "measured";
    case StorageSource::kRecorded: return "recorded";
  }
  return "?";
}

struct OpenClBackend::Impl {
  // The pass shapes (tokens, logits wanted, every row gathered) whose kernels were collected (compute()).
  std::set<std::tuple<int32_t, bool, bool>> collected_shapes;
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<Ops> ops;
  OpenClOptions opt;
  Numerics numerics = Numerics::kExact;
  std::string numerics_note;  // why the options' numerics were not used, for describe()
  CpuOrder cpu_order = CpuOrder::kX86;
  DataType act_type = DataType::kFloat32;
  StorageType act_storage = StorageType::kBuffer;
  int32_t act_parts = 1;  // kTexture2DSplit: the parts of every activation (clamped per tensor)
  std::string storage_notes;  // why a preferred storage was passed over, or what was measured, for describe()
  std::string decode_notes;   // the decode matmul's shapes measured (a forced storage), for describe()
  TensorFormat logits_format;
  AttentionGeometry geometry;
  BackendShape shape;
  OpenClStats stats;

  bool has_cache = false;  // the graph has attention (RoPE, a KV cache)
  bool exact() const { return numerics == Numerics::kExact; }
  TensorFormat act_format(DataType type) const { return TensorFormat(act_storage, type, act_parts); }

  // Weights: matrices by their view (a tied embedding serves the lookup and the projection), stacked
  // groups by the node that computes them, norm vectors by their view.
  std::map<const WeightView*, std::unique_ptr<MatmulWeights>> matrices;
  std::map<int, std::unique_ptr<MatmulWeights>> stacked;
  std::map<const WeightView*, Tensor> vectors;

  // Device activations: each a tensor for the largest step, of T or O rows (a step uses a view).
  struct Phys {
    int32_t channels = 0;
    DataType type = DataType::kFloat32;
    bool outputs_rows = false;  // O rows (the gathered rows and what follows), else T
    bool logits = false;        // the logits' own storage, grown on demand
    std::optional<Tensor> full, view;
  };
  std::vector<Phys> phys;
  size_t graph_phys = 0;    // phys[0, graph_phys) hold graph tensors (plan_graph); allocate() adds the quants'
  size_t vector_bytes = 0;  // of stats.weight_bytes, the norm vectors (allocate(): in the activations' storage)
  // A graph tensor's device home: a physical tensor and the first slice of its channels there.
  struct Bound {
    int phys = -1;
    int32_t slice = 0;
  };
  std::vector<Bound> bound;

  struct NodePlan {
    Action action = Action::kSkip;
    const MatmulWeights* w = nullptr;   // kMatmul / kEmbed / kGateUp (stacked, or gate)
    const MatmulWeights* w2 = nullptr;  // kGateUp unstacked: up
    const Tensor* vec = nullptr;        // kRmsNorm: the weight
    int tmp = -1, tmp2 = -1;            // kGateUp: gate|up (stacked) or gate and up
    ClMem bias;                         // kRopeKv: Q|K|V biases, or null
    int32_t cache = -1;                 // kRopeKv / kAttention: the layer's cache
    int rope = -1;                      // kRopeKv: its angles (ropes)
    float q_scale = 0.0f;               // kRopeKv: the attention's scale of Q (0: none)
    bool geglu = false;                 // kGateUp: GeGLU, else SwiGLU
    // Float decode steps fold an RMSNorm into the matmuls that read it (Ops::DecodeNorm), and a layer's
    // rope_kv into its stacked Q|K|V matmul (Ops::matmul_rope_kv): the folded node runs in prefill steps
    // only; a reader names its norm in `norm` (kMatmul, kGateUp and the Q|K|V matmuls stacked with them),
    // the stacked Q|K|V matmul its rope_kv node in `rope_kv`.
    bool folded = false;
    int norm = -1;
    int rope_kv = -1;
  };
  std::vector<NodePlan> plan;
  std::vector<ClMem> caches;  // per layer of the graph

  // Exact numerics: the Q8 (Q8_K) quants of a matmul input, one tensor per input width, and the shared
  // per-block buffers; which graph tensor they hold this step.
  std::map<int32_t, int> q8_of_width, q8k_of_width;
  TensorId q8_holds = graph::kNone, q8k_holds = graph::kNone;
  TensorId gathered_out = graph::kNone, gathered_in = graph::kNone;  // the get_rows node's tensors
  int32_t logits_capacity = 0;

  ClMem ids, pos, slots, rows;  // int32 per token: token id, position, slot; rows for the gather
  ClMem kv_table;               // [n_slots][blocks_per_slot] int32: StepIO::kv_table
  std::vector<int32_t> host_kv_table;  // what kv_table holds (empty: not uploaded since prepare())
  // The distinct RoPE angle sets of the graph's rope_kv nodes (a base, frequency scale and factors each:
  // gemma3's local and global layers have two), each a [max_tokens][head_dim] table of the step's positions.
  struct Rope {
    float base = 0.0f, freq_scale = 1.0f;
    const WeightView* factors = nullptr;
    ClMem table;
    std::vector<float> host;  // the step's angles, read by an enqueued write (compute())
  };
  std::vector<Rope> ropes;
  ClMem q_half;                 // [max_tokens][n_embd] halves, rope_kv -> attention
  ClMem q8_scales;              // exact: [max_tokens][widest / 32] (d, s) of the Q8 quants
  ClMem q8k_blocks;             // exact, K-quants: [max_tokens][widest / 256][kQ8KBlockFloats]
  ClMem scores;                 // exact: Ops::attention_exact's scratch
  ClMem attention_partials;     // float, split attention: Ops::attention's chunk states
  // Recorded decode steps by (tokens, outputs, all rows gathered, KV length padded) (OpenClOptions::replay);
  // forgotten whenever a buffer the launches bind is made again (allocate(), ensure_logits()).
  std::map<std::tuple<int32_t, int32_t, bool, int32_t>, Ops::Recording> recordings;
  static constexpr size_t kMaxRecordings = 16;
  size_t buffer_bytes = 0;
  // The host side of a step's enqueued transfers (compute()): valid until the step's one host wait.
  std::vector<int32_t> host_ids, host_pos, host_slots, host_rows;
  std::vector<TransferStaging> input_staging, output_staging;

  Status plan_graph(const Graph& g);
  // The activations every storage must hold: the widest (in act_type) and the residual stream (float).
  std::array<TensorSpec, 2> activation_specs() const;
  Bhwc logits_shape(const Graph& g) const { return Bhwc{1, 1, shape.max_tokens, static_cast<int32_t>(g.n_vocab)}; }
  // Puts the activations in `choice`, and the logits there too where it holds them and `logits_follow`
  // (a measured choice), else where the rule puts them; allocate() then creates the tensors.
  Status use_storage(const Graph& g, const StorageChoice& choice, bool logits_follow);
  Status allocate(const Graph& g);
  Status ensure_logits(int32_t n_out);
  Status bind_views(int32_t tokens, int32_t outputs);
  Tensor& dev(TensorId id);
  TensorSlice slice(TensorId id) { return TensorSlice{&dev(id), bound[static_cast<size_t>(id)].slice}; }
  Status matmul(const MatmulWeights& w, TensorId x, Tensor& y, int32_t step_tokens, const Tensor* residual = nullptr,
                const DecodeNorm* norm = nullptr);
  // A kRopeKv node's rope_kv (also where its Q|K|V matmul falls back from writing it itself), and the step's
  // placement with the node's RoPE angles.
  TokenPlacement rope_placement(const NodePlan& rp, const TokenPlacement& tokens) const;
  Status rope_kv(const Node& n, const NodePlan& np, const TokenPlacement& tokens);
  Status run_node(const Graph& g, size_t ni, const graph::StepIO& io, const TokenPlacement& tokens);
};

OpenClBackend::OpenClBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OpenClBackend::~OpenClBackend() = default;

Result<std::unique_ptr<OpenClBackend>> OpenClBackend::create(std::unique_ptr<Runtime> runtime,
                                                             const OpenClOptions& options) {
  INFERD_ASSERT(runtime != nullptr);
  auto impl = std::make_unique<Impl>();
  impl->rt = std::move(runtime);
  impl->ops = std::make_unique<Ops>(*impl->rt);
  impl->opt = options;
  if (options.int_dot) impl->ops->set_int_dot(*options.int_dot);
  if (options.prefill_tokens) {
    if (*options.prefill_tokens < 1 || *options.prefill_tokens > kMaxPrefillTokens) {
      return make_error(Code::kInvalidArgument, "prefill tokens must be in [1, %d], got %d", kMaxPrefillTokens,
                        *options.prefill_tokens);
    }
    impl->ops->set_prefill_tokens(*options.prefill_tokens);
  }
  if (options.prefill_kernel) impl->ops->set_prefill_kernel(*options.prefill_kernel);
  if (options.attention_chunk) {
    if (*options.attention_chunk < 0 || *options.attention_chunk > kMaxAttentionChunkOption) {
      return make_error(Code::kInvalidArgument, "attention chunk must be in [0, %d] positions, got %d",
                        kMaxAttentionChunkOption, *options.attention_chunk);
    }
    impl->ops->set_attention_chunk(*options.attention_chunk);
  }
  if (options.decode_shape) {
    const DecodeShape& d = *options.decode_shape;
    if (d.slices < 1 || d.slices > kMaxDecodeSlices || d.ahead < 1 || d.ahead > kMaxDecodeAhead) {
      return make_error(Code::kInvalidArgument, "decode shape %s: R in [1, %d], U in [1, %d]", d.to_string().c_str(),
                        kMaxDecodeSlices, kMaxDecodeAhead);
    }
  }
  impl->numerics = options.numerics;
  impl->cpu_order = host_cpu_order();
  if (impl->numerics == Numerics::kExact && !impl->ops->exact_supported()) {
    impl->numerics = Numerics::kFloat;
    impl->numerics_note = " (exact needs cl_khr_fp64)";
  }
  if (impl->numerics == Numerics::kExact && kernels::ggml_order() != kernels::GgmlOrder::kAvx512) {
    // The exact kernels reproduce the CPU engine's default float order (kernels::GgmlOrder), not the other.
    impl->numerics = Numerics::kFloat;
    impl->numerics_note = " (exact reproduces the CPU engine's AVX-512 order; INFERD_GGML_ORDER=avx2 is set)";
  }
  // The activations' data type: halves only where the numerics allow them.
  const DeviceInfo& info = impl->rt->info();
  if (options.activation_type) {
    if (*options.activation_type == DataType::kFloat16 && impl->exact()) {
      return Status(Code::kInvalidArgument,
                    "half-precision activations need float numerics: the exact numerics reproduce the CPU engine's "
                    "float activations");
    }
    impl->act_type = *options.activation_type;
  } else {
    impl->act_type = !impl->exact() && info.fp16 ? DataType::kFloat16 : DataType::kFloat32;
  }
  return std::unique_ptr<OpenClBackend>(new OpenClBackend(std::move(impl)));
}

Runtime& OpenClBackend::runtime() { return *impl_->rt; }
const DeviceInfo& OpenClBackend::device_info() const { return impl_->rt->info(); }
const OpenClStats& OpenClBackend::stats() const { return impl_->stats; }
StorageType OpenClBackend::activation_storage() const { return impl_->act_storage; }
DecodeShape OpenClBackend::decode_shape() const { return impl_->ops->decode_shape(); }
void OpenClBackend::set_profiling(bool on) { impl_->ops->set_profiling(on); }
Result<Profile> OpenClBackend::take_profile() { return impl_->ops->take_profile(); }
DataType OpenClBackend::activation_type() const { return impl_->act_type; }
Numerics OpenClBackend::numerics() const { return impl_->numerics; }
CpuOrder OpenClBackend::cpu_order() const { return impl_->cpu_order; }

BackendMemory OpenClBackend::memory() const {
  return BackendMemory{impl_->stats.weight_bytes, impl_->stats.kv_bytes, impl_->stats.activation_bytes};
}

std::string OpenClBackend::describe() const {
  const Impl& I = *impl_;
  const DeviceInfo& d = I.rt->info();
  return "OpenCL: " + d.name + " (" + d.vendor + ", driver " + d.driver_version + "), storage: weights=buffer activations=" +
         I.act_format(I.act_type).to_string() + I.storage_notes + " logits=" + I.logits_format.to_string() +
         " kv=buffer(f16), numerics " + numerics_name(I.numerics) +
         (I.exact() ? std::string(" (") + cpu_order_name(I.cpu_order) + ", " + int_dot_name(I.ops->int_dot()) + " dot)"
                    : I.numerics_note + ", decode matmul " + I.ops->decode_shape().to_string() + I.decode_notes) +
         ", weights " + mib(I.stats.weight_bytes);
}

bool OpenClBackend::supports(const Graph& g, const Node& n) const {
  auto type_ok = [&](TensorId w) { return MatmulWeights::supports(g.tensor(w).weight_type()); };
  // The node that reads `id`, when exactly one does.
  auto only_reader = [&](TensorId id) -> const Node* {
    const Node* reader = nullptr;
    for (const Node& m : g.nodes()) {
      for (TensorId in : m.in) {
        if (in != id) continue;
        if (reader != nullptr && reader != &m) return nullptr;
        reader = &m;
      }
    }
    return reader;
  };
  switch (n.op) {
    case Op::kEmbed: return type_ok(n.in[1]);
    case Op::kRmsNorm: {  // the row, or each head of it (groups of a multiple of 4 channels)
      const int64_t c = g.tensor(n.in[0]).cols, group = g.tensor(n.in[1]).cols;
      return g.tensor(n.in[1]).weight_type() == DType::kF32 && group > 0 && c % group == 0 &&
             (group == c || group % 4 == 0);
    }
    case Op::kMatmul: {
      if (!type_ok(n.in[1])) return false;
      if (n.in[2] == graph::kNone) return true;
      // A bias is added by the rope_kv that reads this matmul's output (Q, K or V).
      const Node* r = only_reader(n.out[0]);
      return r != nullptr && r->op == Op::kRopeKv && (r->in[0] == n.out[0] || r->in[1] == n.out[0] || r->in[2] == n.out[0]);
    }
    case Op::kMatmulSwiglu:
    case Op::kMatmulGeglu: return type_ok(n.in[1]) && type_ok(n.in[2]);
    case Op::kRopeKv: {
      AttentionGeometry geo{g.heads.n_head, g.heads.n_head_kv, g.heads.head_dim, 1, 1, 1, g.heads.rope_base,
                            g.heads.rope_style == RopeStyle::kNeox ? RopeMode::kNeox : RopeMode::kNormal};
      const bool factors_ok = n.rope_factors == nullptr ||
                              (n.rope_factors->type == DType::kF32 && n.rope_factors->rows * n.rope_factors->cols ==
                                                                          g.heads.head_dim / 2);
      return geo.check().is_ok() && factors_ok;
    }
    case Op::kAttention: {
      const int p = g.producer(n.in[0]);  // attention reads the halves rope_kv writes for Q
      return p >= 0 && g.nodes()[static_cast<size_t>(p)].op == Op::kRopeKv;
    }
    case Op::kSwiglu:
    case Op::kGeglu:
    case Op::kAdd:
    case Op::kGetRows: return true;
    case Op::kMatmulAdd:  // a bias is rope_kv's to add
      return impl_->opt.fuse && type_ok(n.in[1]) && n.in[2] == graph::kNone;
    case Op::kRope:
    case Op::kKvWrite: return false;
  }
  return false;
}

// Decides each node's action and weights (uploading them) and each tensor's device home.
Status OpenClBackend::Impl::plan_graph(const Graph& g) {
  Runtime& r = *rt;
  const size_t n_nodes = g.nodes().size();
  plan.clear();
  plan.resize(n_nodes);
  bound.assign(g.tensors().size(), Bound{});
  phys.clear();
  matrices.clear();
  ropes.clear();
  stacked.clear();
  vectors.clear();
  stats.weight_bytes = 0;
  vector_bytes = 0;
  gathered_out = gathered_in = graph::kNone;

  auto matrix = [&](TensorId id) -> Result<const MatmulWeights*> {
    const graph::Tensor& t = g.tensor(id);
    auto it = matrices.find(t.weight);
    if (it != matrices.end()) return it->second.get();
    auto w = upload_view(r, t.name, *t.weight);
    if (!w) return w.status();
    stats.weight_bytes += w.value()->device_bytes();
    return matrices.emplace(t.weight, std::move(w).value()).first->second.get();
  };

  // Liveness: how many readers each tensor has left, and each physical tensor's live graph tensors.
  std::vector<int> readers(g.tensors().size(), 0);
  for (const Node& n : g.nodes()) {
    for (TensorId id : n.in) {
      if (id != graph::kNone) ++readers[static_cast<size_t>(id)];
    }
  }
  for (TensorId id : g.outputs()) ++readers[static_cast<size_t>(id)];
  std::vector<int> live;    // per physical tensor: graph tensors bound to it and still to be read
  std::vector<int> free_list;
  auto new_phys = [&](int32_t channels, DataType type, bool outputs_rows, bool logits) {
    for (size_t k = 0; k < free_list.size(); ++k) {
      Phys& p = phys[static_cast<size_t>(free_list[k])];
      if (p.channels == channels && p.type == type && p.outputs_rows == outputs_rows && !logits && !p.logits) {
        const int id = free_list[k];
        free_list.erase(free_list.begin() + static_cast<std::ptrdiff_t>(k));
        return id;
      }
    }
    phys.push_back(Phys{channels, type, outputs_rows, logits, std::nullopt, std::nullopt});
    live.push_back(0);
    return static_cast<int>(phys.size() - 1);
  };
  auto type_of = [&](const graph::Tensor& t) { return t.role == graph::Role::kOther ? act_type : DataType::kFloat32; };
  auto home = [&](TensorId id, int p, int32_t slice) {
    bound[static_cast<size_t>(id)] = Bound{p, slice};
    ++live[static_cast<size_t>(p)];
  };
  auto place = [&](TensorId id) {
    const graph::Tensor& t = g.tensor(id);
    home(id, new_phys(static_cast<int32_t>(t.cols), type_of(t), t.rows == graph::Rows::kOutputs,
                      t.role == graph::Role::kLogits),
         0);
  };
  // get_rows' output stands for its source when every row is wanted in order (compute()): the source's
  // memory stays live as long as the output does.
  std::map<TensorId, int> holds_source;
  auto drop = [&](int p) {
    if (p >= 0 && --live[static_cast<size_t>(p)] == 0 && !phys[static_cast<size_t>(p)].logits) free_list.push_back(p);
  };
  auto release = [&](TensorId id) {
    drop(bound[static_cast<size_t>(id)].phys);
    if (auto it = holds_source.find(id); it != holds_source.end()) drop(it->second);
  };
  auto temp = [&](int32_t channels) {  // scratch inside one node, released after it
    const int p = new_phys(channels, act_type, false, false);
    free_list.push_back(p);
    return p;
  };
  for (TensorId id : g.inputs()) {
    if (g.tensor(id).elem == graph::Elem::kFloat) place(id);  // uploaded each step (hidden states, ...)
  }
  // The norms a float decode step folds into their readers: a whole-row RMSNorm (not the per-head Q/K
  // norms) whose output is read only as the input of matmuls, and is not a graph output. The norm's input
  // stays live until its last such reader (one more reader each).
  if (!exact() && opt.fuse) {
    for (size_t ni = 0; ni < n_nodes; ++ni) {
      const Node& n = g.nodes()[ni];
      if (n.op != Op::kRmsNorm || g.tensor(n.in[1]).cols != g.tensor(n.in[0]).cols) continue;
      const TensorId xn = n.out[0];
      if (std::find(g.outputs().begin(), g.outputs().end(), xn) != g.outputs().end()) continue;
      std::vector<size_t> readers_of;
      bool foldable = true;
      for (size_t j = ni + 1; j < n_nodes && foldable; ++j) {
        const Node& m = g.nodes()[j];
        const auto reads = std::count(m.in.begin(), m.in.end(), xn);
        if (reads == 0) continue;
        foldable = (m.op == Op::kMatmul || m.op == Op::kMatmulSwiglu || m.op == Op::kMatmulGeglu) && m.in[0] == xn &&
                   reads == 1;
        readers_of.push_back(j);
      }
      if (!foldable || readers_of.empty()) continue;
      plan[ni].folded = true;
      for (size_t j : readers_of) {
        plan[j].norm = static_cast<int>(ni);
        ++readers[static_cast<size_t>(n.in[0])];
      }
    }
  }

  const int32_t e4 = geometry.n_embd() / 4, ekv4 = geometry.n_embd_kv() / 4;
  for (size_t ni = 0; ni < n_nodes; ++ni) {
    const Node& n = g.nodes()[ni];
    NodePlan& np = plan[ni];
    auto in_layer = [&](const Status& s) { return n.layer >= 0 ? s.with_context("layer " + std::to_string(n.layer)) : s; };
    switch (n.op) {
      case Op::kEmbed: {
        np.action = Action::kEmbed;
        auto w = matrix(n.in[1]);
        if (!w) return w.status();
        np.w = w.value();
        place(n.out[0]);
        break;
      }
      case Op::kRmsNorm:
        np.action = Action::kRmsNorm;  // its weight is uploaded once the storage is chosen (allocate())
        place(n.out[0]);
        break;
      case Op::kMatmul: {
        if (bound[static_cast<size_t>(n.out[0])].phys >= 0) break;  // stacked with an earlier one: kSkip
        np.action = Action::kMatmul;
        // Q|K|V read by one rope_kv, of one input and type: one stacked matmul into one tensor.
        const Node* reader = nullptr;
        size_t reader_at = 0;
        for (size_t j = ni + 1; j < n_nodes && reader == nullptr; ++j) {
          const Node& m = g.nodes()[j];
          if (m.op == Op::kRopeKv && m.in[0] == n.out[0]) {
            reader = &m;
            reader_at = j;
          }
        }
        if (reader != nullptr) {
          const int pk = g.producer(reader->in[1]), pv = g.producer(reader->in[2]);
          const Node* k = pk >= 0 ? &g.nodes()[static_cast<size_t>(pk)] : nullptr;
          const Node* v = pv >= 0 ? &g.nodes()[static_cast<size_t>(pv)] : nullptr;
          const DType t = g.tensor(n.in[1]).weight_type();
          if (k && v && k->op == Op::kMatmul && v->op == Op::kMatmul && k->in[0] == n.in[0] && v->in[0] == n.in[0] &&
              g.tensor(k->in[1]).weight_type() == t && g.tensor(v->in[1]).weight_type() == t &&
              g.use_count(n.out[0]) == 1 && g.use_count(k->out[0]) == 1 && g.use_count(v->out[0]) == 1 &&
              static_cast<size_t>(pk) > ni && static_cast<size_t>(pv) > ni &&
              same_matmul_order({g.tensor(n.in[1]).weight, g.tensor(k->in[1]).weight, g.tensor(v->in[1]).weight})) {
            const std::string name = "blk." + std::to_string(n.layer) + ".attn_q|k|v.weight";
            auto w = upload_stacked(r, name, {g.tensor(n.in[1]).weight, g.tensor(k->in[1]).weight,
                                                   g.tensor(v->in[1]).weight});
            if (!w) return in_layer(w.status());
            stats.weight_bytes += w.value()->device_bytes();
            np.w = w.value().get();
            stacked.emplace(static_cast<int>(ni), std::move(w).value());
            const int p = new_phys(e4 * 4 + 2 * ekv4 * 4, act_type, false, false);
            home(n.out[0], p, 0);
            home(k->out[0], p, e4);
            home(v->out[0], p, e4 + ekv4);
            if (!exact() && opt.fuse && geometry.rope_mode == RopeMode::kNormal) {
              np.rope_kv = static_cast<int>(reader_at);
              plan[reader_at].folded = true;
            }
            break;
          }
        }
        auto w = matrix(n.in[1]);
        if (!w) return in_layer(w.status());
        np.w = w.value();
        place(n.out[0]);
        break;
      }
      case Op::kMatmulAdd: {
        np.action = Action::kMatmulAdd;
        auto w = matrix(n.in[1]);
        if (!w) return in_layer(w.status());
        np.w = w.value();
        place(n.out[0]);  // never the residual's memory: inputs are released after the node
        break;
      }
      case Op::kMatmulSwiglu:
      case Op::kMatmulGeglu: {
        np.action = Action::kGateUp;
        np.geglu = n.op == Op::kMatmulGeglu;
        const graph::Tensor& wg = g.tensor(n.in[1]);
        const graph::Tensor& wu = g.tensor(n.in[2]);
        const int32_t f = static_cast<int32_t>(wg.fixed_rows);
        place(n.out[0]);
        if (wg.weight_type() == wu.weight_type() && f % 4 == 0) {
          const std::string name = "blk." + std::to_string(n.layer) + ".ffn_gate|up.weight";
          auto w = upload_stacked(r, name, {wg.weight, wu.weight});
          if (!w) return in_layer(w.status());
          stats.weight_bytes += w.value()->device_bytes();
          np.w = w.value().get();
          stacked.emplace(static_cast<int>(ni), std::move(w).value());
          np.tmp = temp(2 * f);
        } else {
          auto a = matrix(n.in[1]);
          if (!a) return in_layer(a.status());
          auto b = matrix(n.in[2]);
          if (!b) return in_layer(b.status());
          np.w = a.value();
          np.w2 = b.value();
          np.tmp = new_phys(f, act_type, false, false);
          np.tmp2 = new_phys(f, act_type, false, false);
          free_list.push_back(np.tmp);
          free_list.push_back(np.tmp2);
        }
        break;
      }
      case Op::kRopeKv: {
        np.action = Action::kRopeKv;
        np.cache = n.layer - g.first_layer;
        const float base = g.heads.rope_base_of(n);
        auto same = [&](const Rope& rp) {
          return rp.base == base && rp.freq_scale == n.rope_freq_scale && rp.factors == n.rope_factors;
        };
        auto it = std::find_if(ropes.begin(), ropes.end(), same);
        np.rope = static_cast<int>(it - ropes.begin());
        if (it == ropes.end()) ropes.push_back(Rope{base, n.rope_freq_scale, n.rope_factors, ClMem(), {}});
        // An attention that scales Q itself (Node::scale > 0): Q is scaled here, before its rounding.
        for (const Node& m : g.nodes()) {
          if (m.op == Op::kAttention && m.in[0] == n.out[0] && m.scale > 0.0f) np.q_scale = m.scale;
        }
        // Q|K|V biases (qwen2) of the matmuls that computed Q, K and V.
        const int64_t e = geometry.n_embd(), ekv = geometry.n_embd_kv();
        std::vector<float> bias(static_cast<size_t>(e + 2 * ekv), 0.0f);
        bool any = false;
        const int64_t at[3] = {0, e, e + ekv};
        for (int i = 0; i < 3; ++i) {
          const int p = g.producer(n.in[static_cast<size_t>(i)]);
          if (p < 0) continue;
          const Node& m = g.nodes()[static_cast<size_t>(p)];
          if (m.op != Op::kMatmul || m.in[2] == graph::kNone) continue;
          const graph::Tensor& b = g.tensor(m.in[2]);
          std::memcpy(bias.data() + at[i], b.weight->f32(), static_cast<size_t>(b.cols) * sizeof(float));
          any = true;
        }
        if (any) {
          auto b = r.create_buffer(bias.size() * sizeof(float), CL_MEM_READ_ONLY, bias.data());
          if (!b) return b.status();
          np.bias = std::move(b).value();
          stats.weight_bytes += bias.size() * sizeof(float);
        }
        break;  // out[0] is the step's Q halves (q_half), out[1] the layer's cache
      }
      case Op::kAttention:
        np.action = Action::kAttention;
        np.cache = n.layer - g.first_layer;
        place(n.out[0]);
        break;
      case Op::kSwiglu:
      case Op::kGeglu:
      case Op::kAdd:
        np.action = n.op == Op::kAdd ? Action::kAdd : n.op == Op::kGeglu ? Action::kGeglu : Action::kSwiglu;
        place(n.out[0]);
        break;
      case Op::kGetRows: {
        np.action = Action::kGetRows;
        gathered_out = n.out[0];
        gathered_in = n.in[0];
        place(n.out[0]);
        const int source = bound[static_cast<size_t>(n.in[0])].phys;
        if (source >= 0) {
          ++live[static_cast<size_t>(source)];
          holds_source[n.out[0]] = source;
        }
        break;
      }
      case Op::kRope:
      case Op::kKvWrite:
        return Status(Code::kUnimplemented, std::string("the OpenCL backend cannot run ") + graph::op_name(n.op));
    }
    for (TensorId id : n.in) {
      if (id != graph::kNone && --readers[static_cast<size_t>(id)] == 0) release(id);
    }
    if (np.norm >= 0) {  // a folded norm's input, read here in decode steps
      const TensorId x = g.nodes()[static_cast<size_t>(np.norm)].in[0];
      if (--readers[static_cast<size_t>(x)] == 0) release(x);
    }
  }
  graph_phys = phys.size();
  return Status::ok();
}

std::array<TensorSpec, 2> OpenClBackend::Impl::activation_specs() const {
  const int32_t n = shape.max_tokens;
  int32_t widest = 0, widest_residual = 0;
  for (size_t i = 0; i < graph_phys; ++i) {
    const Phys& p = phys[i];
    if (p.logits) continue;
    widest = std::max(widest, p.channels);
    if (p.type == DataType::kFloat32) widest_residual = std::max(widest_residual, p.channels);
  }
  return {TensorSpec{Bhwc{1, 1, n, std::max(widest, 1)}, act_type},
          TensorSpec{Bhwc{1, 1, n, std::max(widest_residual, 1)}, DataType::kFloat32}};
}

Status OpenClBackend::Impl::use_storage(const Graph& g, const StorageChoice& choice, bool logits_follow) {
  act_storage = choice.storage;
  act_parts = choice.parts;
  if (g.n_vocab > 0) {
    auto logits = choose_storage(rt->info(), logits_shape(g), logits_follow ? storage_bit(choice.storage) : kAnyStorage);
    if (!logits) logits = choose_storage(rt->info(), logits_shape(g));
    if (!logits) return logits.status().with_context("logits");
    logits_format = TensorFormat(logits->storage, DataType::kFloat32, logits->parts);
  }
  return Status::ok();
}

Status OpenClBackend::choose_storages(const Graph& g) {
  Impl& I = *impl_;
  const DeviceInfo& info = I.rt->info();
  const std::array<TensorSpec, 2> specs = I.activation_specs();
  I.storage_notes.clear();
  I.decode_notes.clear();
  I.stats.storage_trials.clear();
  I.stats.storage_measure_ms = 0.0;
  const StoragePolicy policy =
      I.opt.storage_policy.value_or(info.type == DeviceType::kCpu ? StoragePolicy::kRule : StoragePolicy::kMeasure);
  // The storage: forced, else the rule's, else timed among the candidates.
  std::vector<StorageChoice> storages;
  if (I.opt.activation_storage) {  // the activations as forced, the logits by rule
    StorageChoice forced{*I.opt.activation_storage, 1, {}};
    if (forced.storage == StorageType::kTexture2DSplit) forced.parts = split_parts(info, specs[0].shape);
    for (const TensorSpec& t : specs) {
      INFERD_RETURN_IF_ERROR(TensorDescriptor(t.shape, TensorFormat(forced.storage, t.type, forced.parts))
                                 .fits(info)
                                 .with_context("forced activation storage"));
    }
    INFERD_RETURN_IF_ERROR(I.use_storage(g, forced, /*logits_follow=*/false));
    I.stats.storage_source = StorageSource::kForced;
    I.storage_notes = " (forced)";
  } else {
    auto rule = choose_storage(info, specs);
    if (!rule) return rule.status();
    INFERD_RETURN_IF_ERROR(I.use_storage(g, rule.value(), /*logits_follow=*/false));
    for (const std::string& why : rule->fallbacks) I.storage_notes += " (passed over " + why + ")";
    I.stats.storage_source = StorageSource::kRule;
    if (policy == StoragePolicy::kMeasure) storages = storage_candidates(info, specs);
    if (storages.size() < 2) storages.clear();
  }
  // The float decode matmul's shape: forced, else timed (the exact numerics have their own matmuls).
  std::vector<DecodeShape> shapes;
  if (I.opt.decode_shape) {
    I.ops->set_decode_shape(*I.opt.decode_shape);
  } else if (policy == StoragePolicy::kMeasure && !I.exact()) {
    shapes = decode_shape_candidates();
  }
  if (storages.empty() && shapes.empty()) return Status::ok();

  // A configuration is usable when its storage is one this load would time (or the storage in effect,
  // when the storage is not timed) and its shape likewise.
  const StorageChoice current{I.act_storage, I.act_parts, {}};
  auto usable = [&](StorageType st, int32_t parts, DecodeShape shape) {
    const bool storage_ok =
        storages.empty() ? st == current.storage && parts == current.parts
                         : std::any_of(storages.begin(), storages.end(),
                                       [&](const StorageChoice& c) { return c.storage == st && c.parts == parts; });
    const bool shape_ok = shapes.empty() ? shape == I.ops->decode_shape()
                                         : std::find(shapes.begin(), shapes.end(), shape) != shapes.end();
    return storage_ok && shape_ok;
  };
  auto describe_trials = [](const std::vector<StorageTrial>& trials, bool with_shape) {
    std::string text;
    char buf[80];
    for (const StorageTrial& t : trials) {
      std::snprintf(buf, sizeof(buf), "%s%s%s%s %.3g", text.empty() ? "" : ", ",
                    TensorFormat(t.storage, DataType::kFloat32, t.parts).to_string().c_str(), with_shape ? " " : "",
                    with_shape ? t.decode.to_string().c_str() : "", t.step_ms);
      text += buf;
    }
    return text + " ms per decode step";
  };
  auto apply = [&](const StorageRecord& r, StorageSource source) -> Status {
    INFERD_RETURN_IF_ERROR(I.use_storage(g, StorageChoice{r.storage, r.parts, {}}, /*logits_follow=*/!storages.empty()));
    if (!storages.empty()) {
      I.stats.storage_source = source;
      I.storage_notes.clear();
    }
    I.ops->set_decode_shape(r.decode);
    I.stats.storage_trials = r.trials;
    const std::string what = std::string(source == StorageSource::kMeasured ? "measured: " : "measured earlier: ") +
                             describe_trials(r.trials, !shapes.empty());
    (storages.empty() ? I.decode_notes : I.storage_notes) = " (" + what + ")";
    return Status::ok();
  };
  const StorageKey key{info.name, info.vendor, info.driver_version,
                       std::string(numerics_name(I.numerics)) + " " + data_type_name(I.act_type) + " " +
                           int_dot_name(I.ops->int_dot()) + "-dot storage=" +
                           (storages.empty() ? current.to_string() : "timed") +
                           " decode=" + (shapes.empty() ? I.ops->decode_shape().to_string() : "timed"),
                       graph_signature(g)};
  const std::string& dir = I.rt->options().cache_dir;
  if (!dir.empty()) {
    // A record that does not hold (another driver wrote it, it is damaged, its choice is no longer one this
    // load would time) is timed again and overwritten.
    auto recorded = load_storage_record(dir, key);
    if (recorded && usable(recorded->storage, recorded->parts, recorded->decode)) {
      return apply(recorded.value(), StorageSource::kRecorded);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  // First the storages at the shape in effect, then the shapes in the fastest storage.
  std::vector<StorageTrial> trials;
  if (!storages.empty()) {
    std::vector<StepConfig> configs;
    for (const StorageChoice& c : storages) configs.push_back(StepConfig{c, I.ops->decode_shape(), true});
    auto timed = time_steps(g, configs);
    if (!timed) return timed.status().with_context("timing the activation storages");
    trials = std::move(timed).value();
  }
  if (!shapes.empty()) {
    const StorageChoice in = trials.empty() ? current : [&] {
      const StorageRecord best = fastest(trials);
      return StorageChoice{best.storage, best.parts, {}};
    }();
    std::vector<StepConfig> configs;
    for (const DecodeShape& shape : shapes) configs.push_back(StepConfig{in, shape, !storages.empty()});
    auto timed = time_steps(g, configs);
    if (!timed) return timed.status().with_context("timing the decode matmul's shapes");
    trials.insert(trials.end(), timed->begin(), timed->end());
  }
  const StorageRecord record = fastest(std::move(trials));
  INFERD_RETURN_IF_ERROR(apply(record, StorageSource::kMeasured));
  I.stats.storage_measure_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!dir.empty()) {
    Status stored = store_storage_record(dir, key, record);
    if (!stored) I.storage_notes += " (not recorded: " + stored.message() + ")";
  }
  return Status::ok();
}

Result<std::vector<StorageTrial>> OpenClBackend::time_steps(const Graph& g, std::span<const StepConfig> configs) {
  Impl& I = *impl_;
  // One decode step: token 0 at position 0 of slot 0 (block 0), its logits wanted; a pipeline stage's
  // hidden states are zeros.
  std::vector<int32_t> zero(1, 0);
  size_t float_cols = 0;
  for (TensorId id : g.inputs()) {
    if (g.tensor(id).elem == graph::Elem::kFloat) float_cols = std::max(float_cols, static_cast<size_t>(g.tensor(id).cols));
  }
  std::vector<float> hidden(float_cols, 0.0f);
  graph::StepIO io;
  io.shape = graph::StepShape{1, g.io.out_rows != graph::kNone ? 1 : 0, I.shape.pad_step};
  for (TensorId id : g.inputs()) {
    if (g.tensor(id).elem == graph::Elem::kFloat) {
      io.inputs.push_back(graph::HostTensor{hidden.data(), static_cast<size_t>(g.tensor(id).cols)});
    } else {
      io.inputs.push_back(graph::HostTensor{zero.data(), 1});
    }
  }
  std::vector<std::vector<float>> outputs(g.outputs().size());
  for (std::vector<float>& o : outputs) io.outputs.push_back(&o);
  std::vector<int32_t> table;
  if (I.has_cache) {
    table.assign(static_cast<size_t>(I.shape.n_slots) * static_cast<size_t>(I.geometry.blocks_per_slot()), -1);
    table[0] = 0;
  }
  io.kv_table = table;

  // Rounds alternate the configurations (the device's clocks and the host's load drift); each round
  // re-creates the configuration's tensors and runs an untimed step first (kernel builds in the first
  // round, the driver's lazy allocation of new memory in every round).
  constexpr int kRounds = 3, kTimedSteps = 3;
  std::vector<std::vector<double>> times(configs.size());
  std::vector<Status> outcome(configs.size());  // not ok: the configuration failed
  for (int round = 0; round < kRounds; ++round) {
    for (size_t c = 0; c < configs.size(); ++c) {
      if (!outcome[c]) continue;
      Status st = I.use_storage(g, configs[c].storage, configs[c].logits_follow);
      I.ops->set_decode_shape(configs[c].decode);
      if (st) st = I.allocate(g);
      I.collected_shapes.clear();
      if (st) st = compute(g, io);
      for (int k = 0; st && k < kTimedSteps; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        st = compute(g, io);
        times[c].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      // A storage whose tensors cannot be created, or a shape or storage whose kernels fail on this device,
      // is not a candidate.
      if (!st) {
        outcome[c] = st.with_context(std::string(storage_name(configs[c].storage.storage)) + " " +
                                     configs[c].decode.to_string());
      }
    }
  }
  // The trials are not the model's steps.
  I.stats.decode_passes = I.stats.prefill_passes = I.stats.launches = I.stats.recorded_steps = I.stats.replayed_steps = 0;
  std::vector<StorageTrial> trials;
  std::string why;
  for (size_t c = 0; c < configs.size(); ++c) {
    if (!outcome[c]) {
      why += (why.empty() ? "" : "; ") + outcome[c].to_string();
      continue;
    }
    std::vector<double>& t = times[c];
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    trials.push_back(StorageTrial{configs[c].storage.storage, configs[c].storage.parts, configs[c].decode, t[t.size() / 2]});
  }
  if (trials.empty()) return Status(Code::kFailed, "no configuration ran a decode step: " + why);
  return trials;
}

Status OpenClBackend::Impl::allocate(const Graph& g) {
  Runtime& r = *rt;
  const int32_t n = shape.max_tokens;
  // Again from the graph's tensors (a storage trial allocates several times): the quants' tensors and
  // the norm vectors are made below.
  recordings.clear();  // they bind the tensors made again here
  phys.erase(phys.begin() + static_cast<std::ptrdiff_t>(graph_phys), phys.end());
  vectors.clear();
  stats.weight_bytes -= vector_bytes;
  vector_bytes = 0;
  // Norm weights: float vectors in the activations' storage.
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const Node& nd = g.nodes()[ni];
    if (nd.op != Op::kRmsNorm) continue;
    const graph::Tensor& w = g.tensor(nd.in[1]);
    auto it = vectors.find(w.weight);
    if (it == vectors.end()) {
      auto v = Tensor::allocate(r, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(w.cols)},
                                                    act_format(DataType::kFloat32)));
      if (!v) return v.status().with_context(w.name);
      INFERD_RETURN_IF_ERROR(upload(r, v.value(), std::span<const float>(w.weight->f32(), static_cast<size_t>(w.cols))));
      stats.weight_bytes += v->desc().data_bytes();
      vector_bytes += v->desc().data_bytes();
      it = vectors.emplace(w.weight, std::move(v).value()).first;
    }
    plan[ni].vec = &it->second;
  }
  stats.activation_bytes = 0;
  logits_capacity = 0;
  for (Phys& p : phys) {
    p.full.reset();
    p.view.reset();
    if (p.logits) continue;  // ensure_logits()
    auto t = Tensor::allocate(r, TensorDescriptor(Bhwc{1, 1, n, p.channels}, act_format(p.type)));
    if (!t) return t.status();
    stats.activation_bytes += t->desc().data_bytes();
    p.full.emplace(std::move(t).value());
  }
  // Exact numerics: Q8 (Q8_K) quants per matmul input width, and their per-block buffers.
  q8_of_width.clear();
  q8k_of_width.clear();
  int32_t widest_input = 0;
  bool k_quants = false;
  if (exact()) {
    for (const Node& nd : g.nodes()) {
      const bool gate_up = nd.op == Op::kMatmulSwiglu || nd.op == Op::kMatmulGeglu;  // in[2]: the up weights
      if (nd.op != Op::kMatmul && nd.op != Op::kMatmulAdd && !gate_up) continue;
      const int32_t c = static_cast<int32_t>(g.tensor(nd.in[0]).cols);
      widest_input = std::max(widest_input, c);
      for (int i : {1, 2}) {
        if (nd.in[static_cast<size_t>(i)] == graph::kNone || (i == 2 && !gate_up)) continue;
        const MatmulActivations kind = matmul_activations(g.tensor(nd.in[static_cast<size_t>(i)]).weight_type());
        auto& table = kind == MatmulActivations::kQ8K ? q8k_of_width : q8_of_width;
        if (kind == MatmulActivations::kFloat || table.count(c)) continue;
        k_quants = k_quants || kind == MatmulActivations::kQ8K;
        auto t = Tensor::allocate(r, TensorDescriptor(Bhwc{1, 1, n, c}, act_format(act_type)));
        if (!t) return t.status();
        stats.activation_bytes += t->desc().data_bytes();
        phys.push_back(Phys{c, act_type, false, false, std::move(t).value(), std::nullopt});
        table.emplace(c, static_cast<int>(phys.size() - 1));
      }
    }
  }
  buffer_bytes = 0;
  auto buffer = [&](ClMem& mem, size_t bytes, cl_mem_flags flags) -> Status {
    auto b = r.create_buffer(bytes, flags);
    if (!b) return b.status();
    mem = std::move(b).value();
    buffer_bytes += bytes;
    return Status::ok();
  };
  const size_t tokens = static_cast<size_t>(n);
  for (ClMem* ints : {&ids, &pos, &slots, &rows}) INFERD_RETURN_IF_ERROR(buffer(*ints, tokens * sizeof(cl_int), CL_MEM_READ_ONLY));
  if (has_cache) {  // RoPE and attention
    INFERD_RETURN_IF_ERROR(buffer(kv_table,
                                  static_cast<size_t>(shape.n_slots) * static_cast<size_t>(geometry.blocks_per_slot()) *
                                      sizeof(cl_int),
                                  CL_MEM_READ_ONLY));
    host_kv_table.clear();
    for (Rope& rp : ropes) {
      INFERD_RETURN_IF_ERROR(
          buffer(rp.table, tokens * static_cast<size_t>(geometry.head_dim) * sizeof(float), CL_MEM_READ_ONLY));
    }
    INFERD_RETURN_IF_ERROR(buffer(q_half, tokens * static_cast<size_t>(geometry.n_embd()) * 2, CL_MEM_READ_WRITE));
    if (!exact() && ops->attention_chunk() > 0) {
      INFERD_RETURN_IF_ERROR(buffer(attention_partials, Ops::attention_partials_bytes(geometry), CL_MEM_READ_WRITE));
    }
  }
  if (exact()) {
    if (widest_input > 0) {
      INFERD_RETURN_IF_ERROR(buffer(q8_scales, tokens * static_cast<size_t>(widest_input / 32) * 2 * sizeof(float),
                                    CL_MEM_READ_WRITE));
    }
    if (k_quants) {
      INFERD_RETURN_IF_ERROR(buffer(q8k_blocks,
                                    tokens * static_cast<size_t>(widest_input / 256) * kQ8KBlockFloats * sizeof(float),
                                    CL_MEM_READ_WRITE));
    }
    // The scores of every token of a step over the whole context, within a budget: a longer step runs
    // attention in several launches (Ops::attention_exact).
    if (has_cache) {
      constexpr size_t kScoresBudget = size_t{64} << 20;
      const int32_t kv_max = (shape.n_ctx + shape.pad_step - 1) / shape.pad_step * shape.pad_step;
      const size_t per_token = Ops::attention_scratch_bytes(geometry, 1, kv_max);
      const size_t tokens_fit = std::clamp<size_t>(kScoresBudget / per_token, 1, tokens);
      INFERD_RETURN_IF_ERROR(buffer(scores, tokens_fit * per_token, CL_MEM_READ_WRITE));
    }
  }
  stats.activation_bytes += buffer_bytes;
  return Status::ok();
}

Status OpenClBackend::Impl::ensure_logits(int32_t n_out) {
  if (n_out <= logits_capacity) return Status::ok();
  recordings.clear();  // they bind the logits made again here
  int32_t capacity = 1;
  while (capacity < n_out) capacity *= 2;
  capacity = std::min(capacity, shape.max_tokens);
  for (Phys& p : phys) {
    if (!p.logits) continue;
    if (p.full) stats.activation_bytes -= p.full->desc().data_bytes();
    p.full.reset();
    p.view.reset();
    auto t = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, capacity, p.channels}, logits_format));
    if (!t) return t.status().with_context("logits");
    stats.activation_bytes += t->desc().data_bytes();
    p.full.emplace(std::move(t).value());
  }
  logits_capacity = capacity;
  return Status::ok();
}

Status OpenClBackend::Impl::bind_views(int32_t tokens, int32_t outputs) {
  for (Phys& p : phys) {
    p.view.reset();
    if (!p.full) continue;
    const int32_t width = p.logits || p.outputs_rows ? outputs : tokens;
    if (width == 0) continue;
    auto v = p.full->view(Bhwc{1, 1, width, p.channels});
    if (!v) return v.status();
    p.view.emplace(std::move(v).value());
  }
  return Status::ok();
}

Tensor& OpenClBackend::Impl::dev(TensorId id) {
  const Bound& b = bound[static_cast<size_t>(id)];
  INFERD_ASSERT(b.phys >= 0, "tensor %d has no device home", id);
  Phys& p = phys[static_cast<size_t>(b.phys)];
  INFERD_ASSERT(p.view.has_value(), "tensor %d is not bound this step", id);
  return *p.view;
}

Status OpenClBackend::prepare(const Graph& g, const BackendShape& shape) {
  Impl& I = *impl_;
  I.shape = shape;
  AttentionGeometry& geo = I.geometry;
  geo.n_head = g.heads.n_head;
  geo.n_head_kv = g.heads.n_head_kv;
  geo.head_dim = g.heads.head_dim;
  geo.n_slots = shape.n_slots;
  geo.n_ctx = shape.n_ctx;
  geo.n_blocks = shape.n_blocks;
  geo.rope_base = g.heads.rope_base;
  geo.rope_mode = g.heads.rope_style == RopeStyle::kNeox ? RopeMode::kNeox : RopeMode::kNormal;
  I.has_cache = false;
  for (const graph::Tensor& t : g.tensors()) I.has_cache = I.has_cache || t.kind == graph::TensorKind::kKvCache;
  if (I.has_cache) {
    INFERD_RETURN_IF_ERROR(geo.check());
    if (geo.layer_cache_bytes() > I.rt->info().max_alloc_bytes) {
      return make_error(Code::kOutOfRange,
                        "a layer's KV cache (%s for %d blocks of %d tokens) exceeds the device's largest buffer (%s)",
                        mib(geo.layer_cache_bytes()).c_str(), shape.n_blocks, graph::kKvBlockTokens,
                        mib(I.rt->info().max_alloc_bytes).c_str());
    }
  }
  INFERD_RETURN_IF_ERROR(I.plan_graph(g));
  I.caches.clear();
  I.stats.kv_bytes = 0;
  if (I.has_cache) {
    for (int32_t l = g.first_layer; l < g.end_layer; ++l) {
      auto cache = I.rt->create_buffer(geo.layer_cache_bytes());
      if (!cache) return cache.status().with_context("KV cache of layer " + std::to_string(l));
      I.caches.push_back(std::move(cache).value());
      I.stats.kv_bytes += geo.layer_cache_bytes();
    }
  }
  INFERD_RETURN_IF_ERROR(choose_storages(g));  // may run trial steps (StoragePolicy::kMeasure)
  INFERD_RETURN_IF_ERROR(I.allocate(g));
  I.collected_shapes.clear();
  I.host_kv_table.clear();
  return I.rt->finish();
}

// y = W x (+ residual), with x quantized first as the CPU backend quantizes it (exact numerics), once per input.
Status OpenClBackend::Impl::matmul(const MatmulWeights& w, TensorId x, Tensor& y, int32_t step_tokens,
                                   const Tensor* residual, const DecodeNorm* norm) {
  Tensor& in = dev(x);
  if (!exact()) return ops->matmul(w, in, y, MatmulVariant::kAuto, residual, norm);
  INFERD_ASSERT(norm == nullptr, "a norm folded into an exact matmul");
  const CpuOrder order = matmul_order(cpu_order, w.type(), step_tokens);
  const MatmulActivations kind = matmul_activations(w.type());
  if (kind == MatmulActivations::kFloat) return ops->matmul_exact(w, in, nullptr, y, order, MatmulVariant::kAuto, residual);
  const bool k = kind == MatmulActivations::kQ8K;
  auto& table = k ? q8k_of_width : q8_of_width;
  auto it = table.find(in.shape().c);
  INFERD_ASSERT(it != table.end(), "no quants for a matmul input of %d channels", in.shape().c);
  Phys& qp = phys[static_cast<size_t>(it->second)];
  std::optional<Tensor> narrow;  // an input of O rows (the output projection's) uses O rows of the quants
  if (qp.view->shape().w != in.shape().w) {
    auto v = qp.full->view(in.shape());
    if (!v) return v.status();
    narrow.emplace(std::move(v).value());
  }
  Tensor& quants = narrow ? *narrow : *qp.view;
  TensorId& holds = k ? q8k_holds : q8_holds;
  cl_mem scales = k ? q8k_blocks.get() : q8_scales.get();
  if (holds != x) {  // the per-block buffer is shared by every width: requantize when another input took it
    INFERD_RETURN_IF_ERROR(k ? ops->quantize_q8_k(in, quants, scales) : ops->quantize_q8(in, quants, scales));
    holds = x;
  }
  return ops->matmul_exact(w, quants, scales, y, order, MatmulVariant::kAuto, residual);
}

TokenPlacement OpenClBackend::Impl::rope_placement(const NodePlan& rp, const TokenPlacement& tokens) const {
  TokenPlacement placed = tokens;
  placed.rope = ropes[static_cast<size_t>(rp.rope)].table.get();
  return placed;
}

Status OpenClBackend::Impl::rope_kv(const Node& n, const NodePlan& np, const TokenPlacement& tokens) {
  return ops->rope_kv(geometry, slice(n.in[0]), slice(n.in[1]), slice(n.in[2]), np.bias.get(), rope_placement(np, tokens),
                      q_half.get(), caches[static_cast<size_t>(np.cache)].get(), np.q_scale);
}

Status OpenClBackend::Impl::run_node(const Graph& g, size_t ni, const graph::StepIO& io, const TokenPlacement& tokens) {
  const Node& n = g.nodes()[ni];
  const NodePlan& np = plan[ni];
  const int32_t t_count = io.shape.tokens;
  auto out = [&]() -> Tensor& { return dev(n.out[0]); };
  // A decode step reads a folded norm's input through the norm instead of its output (NodePlan::norm).
  const bool decode = choose_matmul_variant(t_count) == MatmulVariant::kDecode;
  std::optional<DecodeNorm> fold;
  TensorId in0 = n.in[0];
  if (np.norm >= 0 && decode) {
    const Node& nn = g.nodes()[static_cast<size_t>(np.norm)];
    fold = DecodeNorm{plan[static_cast<size_t>(np.norm)].vec, nn.eps};
    in0 = nn.in[0];
  }
  const DecodeNorm* norm = fold ? &*fold : nullptr;
  switch (np.action) {
    case Action::kSkip: return Status::ok();
    case Action::kEmbed: return ops->get_rows(*np.w, ids.get(), out(), n.scale);
    case Action::kRmsNorm:
      if (np.folded && decode) return Status::ok();  // its readers normalize as they read
      return exact() ? ops->rms_norm_exact(dev(n.in[0]), *np.vec, n.eps, out())
                     : ops->rms_norm(dev(n.in[0]), *np.vec, n.eps, out());
    case Action::kMatmul: {
      const TensorSlice s = slice(n.out[0]);
      INFERD_ASSERT(s.first_slice == 0);
      if (np.rope_kv >= 0 && decode) {  // Q|K|V with the layer's rope_kv in the store
        const NodePlan& rp = plan[static_cast<size_t>(np.rope_kv)];
        const Status fused = ops->matmul_rope_kv(*np.w, dev(in0), norm, geometry, rp.bias.get(), rope_placement(rp, tokens),
                                                 q_half.get(), caches[static_cast<size_t>(rp.cache)].get(), rp.q_scale);
        if (fused.code() != Code::kOutOfRange) return fused;
        // A decode shape the kernel cannot launch: the matmul, then rope_kv.
        INFERD_RETURN_IF_ERROR(matmul(*np.w, in0, dev(n.out[0]), t_count, nullptr, norm));
        return rope_kv(g.nodes()[static_cast<size_t>(np.rope_kv)], rp, tokens);
      }
      return matmul(*np.w, in0, dev(n.out[0]), t_count, nullptr, norm);
    }
    case Action::kMatmulAdd: return matmul(*np.w, n.in[0], dev(n.out[0]), t_count, &dev(n.in[3]));
    case Action::kGateUp: {
      Tensor& h = out();
      if (np.w2 == nullptr && !np.geglu && !exact() && opt.fuse &&
          choose_matmul_variant(t_count) == MatmulVariant::kDecode) {
        // Float decode of a stacked gate|up: SwiGLU in the matmul's store, one launch.
        const Status fused = ops->matmul_swiglu(*np.w, dev(in0), h, norm);
        if (fused.code() != Code::kOutOfRange) return fused;
      }
      Tensor& a = *phys[static_cast<size_t>(np.tmp)].view;
      INFERD_RETURN_IF_ERROR(matmul(*np.w, in0, a, t_count, nullptr, norm));
      if (np.w2 == nullptr) {
        if (np.geglu) return ops->geglu_halves(a, h);
        return exact() ? ops->swiglu_halves_exact(a, h) : ops->swiglu_halves(a, h);
      }
      Tensor& b = *phys[static_cast<size_t>(np.tmp2)].view;
      INFERD_RETURN_IF_ERROR(matmul(*np.w2, in0, b, t_count, nullptr, norm));
      if (np.geglu) return ops->geglu(a, b, h);
      return exact() ? ops->swiglu_exact(a, b, h) : ops->swiglu(a, b, h);
    }
    case Action::kRopeKv:
      if (np.folded && decode) return Status::ok();  // its Q|K|V matmul wrote what it writes
      return rope_kv(n, np, tokens);
    case Action::kAttention: {
      // An explicit scale multiplied Q before its rounding (rope_kv); the default scales the scores.
      const float kq_scale = n.scale > 0.0f ? 1.0f : g.heads.kq_scale(n);
      cl_mem cache = caches[static_cast<size_t>(np.cache)].get();
      return exact() ? ops->attention_exact(geometry, q_half.get(), tokens, io.shape.kv_pad, kq_scale, cache,
                                            scores.get(), cpu_order, out(), n.window)
                     : ops->attention(geometry, q_half.get(), tokens, io.shape.kv_pad, kq_scale, cache, out(),
                                      n.window, attention_partials.get());
    }
    case Action::kSwiglu:
      return exact() ? ops->swiglu_exact(dev(n.in[0]), dev(n.in[1]), out()) : ops->swiglu(dev(n.in[0]), dev(n.in[1]), out());
    case Action::kGeglu: return ops->geglu(dev(n.in[0]), dev(n.in[1]), out());
    case Action::kAdd: return ops->add(dev(n.in[0]), dev(n.in[1]), out());
    case Action::kGetRows:
      if (bound[static_cast<size_t>(n.out[0])].phys == bound[static_cast<size_t>(n.in[0])].phys) {
        return Status::ok();  // every row in order: the output is bound to the source (compute())
      }
      return ops->gather(dev(n.in[0]), rows.get(), out());
  }
  return Status::ok();
}

Status OpenClBackend::compute(const Graph& g, graph::StepIO& io) {
  Impl& I = *impl_;
  Runtime& rt = *I.rt;
  const int32_t t_count = io.shape.tokens, n_out = io.shape.outputs;
  // One host wait per step: the inputs are copied into the backend's host memory and their writes
  // enqueued, the kernels follow, the outputs' reads are enqueued, and the host waits once, at the end.
  // Every way out of this function waits (`drain`): an enqueued write must not outlive the host memory
  // it reads, which the next step overwrites.
  // An error also forgets which block table the device holds: the failed step may not have written it.
  struct Drain {
    Runtime& rt;
    std::vector<int32_t>& uploaded_table;
    bool armed = true;
    ~Drain() {
      if (!armed) return;
      (void)rt.finish();
      uploaded_table.clear();
    }
  } drain{rt, I.host_kv_table};
  auto enqueue_ints = [&](const ClMem& mem, std::vector<int32_t>& host, const void* data, int32_t n) {
    host.assign(static_cast<const int32_t*>(data), static_cast<const int32_t*>(data) + n);
    return rt.write_buffer(mem.get(), 0, host.size() * sizeof(cl_int), host.data(), Transfer::kEnqueue);
  };
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const TensorId id = g.inputs()[i];
    const graph::HostTensor& h = io.inputs[i];
    if (id == g.io.token_ids) {
      INFERD_RETURN_IF_ERROR(enqueue_ints(I.ids, I.host_ids, h.data, t_count));
    } else if (id == g.io.positions) {
      INFERD_RETURN_IF_ERROR(enqueue_ints(I.pos, I.host_pos, h.data, t_count));
      if (I.has_cache) {  // the rotary angles of the step's positions, as the CPU computes them
        for (Impl::Rope& rp : I.ropes) {
          rp.host = rope_table(I.host_pos, I.geometry.head_dim, rp.base, rp.freq_scale,
                               rp.factors != nullptr ? rp.factors->f32() : nullptr);
          INFERD_RETURN_IF_ERROR(
              rt.write_buffer(rp.table.get(), 0, rp.host.size() * sizeof(float), rp.host.data(), Transfer::kEnqueue));
        }
      }
    } else if (id == g.io.slots) {
      INFERD_RETURN_IF_ERROR(enqueue_ints(I.slots, I.host_slots, h.data, t_count));
    } else if (id == g.io.out_rows) {
      if (n_out > 0) INFERD_RETURN_IF_ERROR(enqueue_ints(I.rows, I.host_rows, h.data, n_out));
    }
  }
  if (I.has_cache) {  // the block tables, when they changed (a decode step normally keeps them)
    const size_t entries = static_cast<size_t>(I.shape.n_slots) * static_cast<size_t>(I.geometry.blocks_per_slot());
    INFERD_ASSERT(io.kv_table.size() == entries, "a KV table of %zu entries, %zu expected", io.kv_table.size(), entries);
    if (!std::equal(io.kv_table.begin(), io.kv_table.end(), I.host_kv_table.begin(), I.host_kv_table.end())) {
      I.host_kv_table.assign(io.kv_table.begin(), io.kv_table.end());
      INFERD_RETURN_IF_ERROR(rt.write_buffer(I.kv_table.get(), 0, entries * sizeof(cl_int), I.host_kv_table.data(),
                                             Transfer::kEnqueue));
    }
  }
  if (n_out > 0) INFERD_RETURN_IF_ERROR(I.ensure_logits(n_out));
  INFERD_RETURN_IF_ERROR(I.bind_views(t_count, n_out));
  I.input_staging.resize(g.inputs().size());
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const TensorId id = g.inputs()[i];
    if (g.tensor(id).elem != graph::Elem::kFloat) continue;
    const graph::HostTensor& h = io.inputs[i];
    INFERD_RETURN_IF_ERROR(upload_enqueued(rt, I.dev(id), std::span<const float>(static_cast<const float*>(h.data), h.count),
                                           I.input_staging[i])
                               .with_context(id == g.io.hidden_in ? "hidden states" : g.tensor(id).name.c_str()));
  }
  // Every row wanted, in order (what ModelRunner asks for a prefill with all logits): the rows "gathered"
  // are the source's own, no copy.
  bool all_rows = n_out == t_count && g.io.out_rows != graph::kNone;
  for (size_t i = 0; all_rows && i < g.inputs().size(); ++i) {
    if (g.inputs()[i] != g.io.out_rows) continue;
    const int32_t* rows = static_cast<const int32_t*>(io.inputs[i].data);
    for (int32_t r = 0; all_rows && r < n_out; ++r) all_rows = rows[r] == r;
  }
  Impl::Bound saved{};
  if (all_rows && I.gathered_out != graph::kNone) {
    saved = I.bound[static_cast<size_t>(I.gathered_out)];
    I.bound[static_cast<size_t>(I.gathered_out)] = I.bound[static_cast<size_t>(I.gathered_in)];
  }
  const TokenPlacement tokens{I.pos.get(), I.slots.get(), nullptr, I.kv_table.get()};  // rope: per node
  auto run_nodes = [&]() -> Status {
    I.q8_holds = I.q8k_holds = graph::kNone;
    for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
      const Node& n = g.nodes()[ni];
      if (g.tensor(n.out[0]).rows == graph::Rows::kOutputs && n_out == 0) continue;  // no logits wanted
      Status s = I.run_node(g, ni, io, tokens);
      if (!s) return n.layer >= 0 ? s.with_context("layer " + std::to_string(n.layer)) : s;
    }
    return Status::ok();
  };
  // The first pass of its shape (tokens, logits or not, rows gathered or not) first goes through the nodes
  // collecting the kernels it needs, then builds the new ones side by side: a cold start compiles them in
  // parallel instead of one by one as the pass reaches them (Ops::begin_collect).
  Status st;
  const int64_t launches_before = I.ops->launches();
  if (I.collected_shapes.emplace(t_count, n_out > 0, all_rows).second) {
    I.ops->begin_collect();
    (void)run_nodes();  // computes nothing; an error here recurs in the real pass below
    st = I.ops->build_collected();
    if (st) I.stats.kernels_collected += I.ops->last_collected();
  }
  if (st) {
    if (I.opt.replay && choose_matmul_variant(t_count) == MatmulVariant::kDecode) {
      const auto key = std::make_tuple(t_count, n_out, all_rows, io.shape.kv_pad);
      if (auto it = I.recordings.find(key); it != I.recordings.end()) {
        st = I.ops->replay(it->second);
        if (st) ++I.stats.replayed_steps;
      } else {
        I.ops->begin_record();
        st = run_nodes();
        auto recording = I.ops->end_record();
        if (st && recording) {  // a launch that could not be recorded ran all the same: nothing to keep
          if (I.recordings.size() >= Impl::kMaxRecordings) I.recordings.clear();
          I.recordings.emplace(key, std::move(recording).value());
          ++I.stats.recorded_steps;
        }
      }
    } else {
      st = run_nodes();
    }
  }
  auto output_name = [&](TensorId id) { return id == g.io.hidden_out ? "hidden states" : g.tensor(id).name.c_str(); };
  I.output_staging.resize(g.outputs().size());
  for (size_t i = 0; st && i < g.outputs().size(); ++i) {
    const TensorId id = g.outputs()[i];
    const graph::Tensor& t = g.tensor(id);
    std::vector<float>& dst = *io.outputs[i];
    dst.resize(static_cast<size_t>(Graph::rows(t, io.shape)) * static_cast<size_t>(t.cols));
    if (!dst.empty()) st = download_enqueued(rt, I.dev(id), I.output_staging[i]).with_context(output_name(id));
  }
  if (st) st = rt.finish();     // the step's one host wait
  if (st) drain.armed = false;  // else the drain waits again and forgets the block table
  for (size_t i = 0; st && i < g.outputs().size(); ++i) {
    const TensorId id = g.outputs()[i];
    std::vector<float>& dst = *io.outputs[i];
    if (!dst.empty()) st = download_finished(I.dev(id), I.output_staging[i], dst).with_context(output_name(id));
  }
  if (all_rows && I.gathered_out != graph::kNone) I.bound[static_cast<size_t>(I.gathered_out)] = saved;
  INFERD_RETURN_IF_ERROR(st);
  (choose_matmul_variant(t_count) == MatmulVariant::kDecode ? I.stats.decode_passes : I.stats.prefill_passes)++;
  I.stats.kernels = I.ops->kernel_count();
  I.stats.launches += I.ops->launches() - launches_before;
  return Status::ok();
}

}  // namespace inferd::opencl
