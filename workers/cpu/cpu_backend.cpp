#include "inferd/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include <sched.h>

#include "inferd/arena.h"
#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/kv_cache.h"
#include "inferd/thread_pool.h"
#include "matmul.h"
#include "inferd/cpu_ops.h"
#include "program.h"

namespace inferd {

MatmulPath choose_matmul_path(int64_t n_tokens) {
  // One token: every weight byte is used once, the pass is bound by memory bandwidth, so the GEMV
  // streams weights with no extra pass over the activations. Two or more tokens: the blocked GEMM
  // reuses each decoded weight block for up to kMaxDotRows tokens (measured: inferd-bench --paths).
  return n_tokens <= 1 ? MatmulPath::kGemv : MatmulPath::kGemm;
}

namespace {

// Q as it meets the F16 K cache in ggml: times `scale` first where the attention scales Q itself (0: not), then
// rounded to half. `dst` may be `src`.
void q_as_half(const float* src, float scale, int64_t hd, float* dst) {
  float scaled[ops::kMaxHeadDim];
  if (scale > 0.0f) {
    for (int64_t i = 0; i < hd; ++i) scaled[i] = src[i] * scale;
    src = scaled;
  }
  fp16_t half[ops::kMaxHeadDim];
  kernels::fp32_to_fp16_row(src, half, hd);
  kernels::fp16_to_fp32_row(half, dst, hd);
}

using cpu::Loc;
using cpu::Ref;
using cpu::RowsOf;
using cpu::Step;
using cpu::StepKind;
using graph::Op;

int64_t round_up(int64_t v, int64_t step) { return (v + step - 1) / step * step; }

bool is_activation_ok(const graph::Tensor& t) {
  return t.kind != graph::TensorKind::kActivation || t.rows != graph::Rows::kFixed;
}

}  // namespace

struct CpuBackend::Impl {
  CpuBackendOptions opt;
  std::unique_ptr<ThreadPool> pool;
  BackendShape shape;
  std::unique_ptr<KvCache> kv;
  int32_t first_layer = 0;
  graph::Heads heads;
  std::optional<cpu::Program> programs[2];  // [0]: one-token steps (GEMV), [1]: several tokens

  // The shape-dependent plan.
  struct PlanKey {
    int64_t m_cap = 0, n_out_cap = 0, kv_pad = 0;
    bool operator==(const PlanKey&) const = default;
  } key;
  const cpu::Program* planned = nullptr;  // the program `plan` was made for
  ArenaPlan plan;
  std::vector<size_t> offset;  // per buffer: its offset in the arena (shared) or in a thread's region (local)
  size_t local_base = 0, local_stride = 0;
  size_t arena_capacity = 0;
  uint8_t* arena = nullptr;  // owned, 64-byte aligned

  // Dynamic row chunks: one counter per matmul of a program, on its own cache line, reset before each pass.
  struct alignas(64) ChunkCounter {
    std::atomic<int64_t> next{0};
  };
  std::unique_ptr<ChunkCounter[]> counters;
  int32_t n_counters = 0;

  CpuBackendStats stats;
  bool forced = false;
  MatmulPath forced_path = MatmulPath::kGemv;

  // The pass in progress (set by compute() on the calling thread, read by every thread).
  struct Pass {
    const graph::Graph* g = nullptr;
    const cpu::Program* prog = nullptr;
    const graph::StepIO* io = nullptr;
    int64_t tokens = 0, outputs = 0, kv_pad = 0;
    int max_nr = 1;
  } pass;

  ~Impl() { std::free(arena); }

  Status ensure_plan(const cpu::Program& prog, int64_t m, int64_t n_out, int64_t kv_pad);
  void run_pass(int ith, int nth);
  void run_step(const Step& s, int ith, int nth);

  uint8_t* ptr(const Ref& r, int ith) const {
    switch (r.loc) {
      case Loc::kShared: return arena + offset[static_cast<size_t>(r.index)];
      case Loc::kLocal: return arena + local_base + static_cast<size_t>(ith) * local_stride + offset[static_cast<size_t>(r.index)];
      case Loc::kInput: return static_cast<uint8_t*>(const_cast<void*>(pass.io->inputs[static_cast<size_t>(r.index)].data));
      case Loc::kOutput: return reinterpret_cast<uint8_t*>(pass.io->outputs[static_cast<size_t>(r.index)]->data());
      case Loc::kNone: break;
    }
    return nullptr;
  }
  float* f32(const Ref& r, int ith) const { return reinterpret_cast<float*>(ptr(r, ith)); }
  const int32_t* ints(const Ref& r) const { return reinterpret_cast<const int32_t*>(ptr(r, 0)); }
  int64_t rows(RowsOf r) const { return r == RowsOf::kOutputs ? pass.outputs : pass.tokens; }
  // The rows per dot call of a matmul of m rows of `type`: the step's path, except that one row (a prefill's
  // output projection: only the last token's logits) takes the GEMV as a decode step does, unless a path is
  // forced. Same bits either way for every type but IQ4_NL, whose GEMM has llamafile's order: it keeps the step's.
  int matmul_nr(DType type, int64_t m) const { return !forced && m == 1 && type != DType::kIQ4_NL ? 1 : pass.max_nr; }
};

CpuBackend::CpuBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuBackend::~CpuBackend() = default;

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(const CpuBackendOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  if (impl->opt.n_threads == 0) {
    cpu_set_t set;
    impl->opt.n_threads = sched_getaffinity(0, sizeof(set), &set) == 0
                              ? CPU_COUNT(&set)
                              : static_cast<int>(std::thread::hardware_concurrency());
    impl->opt.n_threads = std::max(impl->opt.n_threads, 1);
  }
  if (impl->opt.n_threads < 1 || impl->opt.n_threads > 512) {
    return make_error(Code::kInvalidArgument, "n_threads must be in [1, 512], got %d", impl->opt.n_threads);
  }
  impl->pool = std::make_unique<ThreadPool>(impl->opt.n_threads);
  return std::unique_ptr<CpuBackend>(new CpuBackend(std::move(impl)));
}

int32_t CpuBackend::n_threads() const { return impl_->opt.n_threads; }
const CpuBackendStats& CpuBackend::stats() const { return impl_->stats; }
std::string CpuBackend::plan_report() const { return impl_->plan.to_string(); }

void CpuBackend::force_matmul_path(const MatmulPath* path) {
  impl_->forced = path != nullptr;
  if (path) impl_->forced_path = *path;
}

std::string CpuBackend::describe() const {
  return std::string("CPU (") + kernels::isa_name(kernels::best_isa()) + ", " +
         kernels::matmul_order_name(kernels::matmul_order()) + " matmul order), " + std::to_string(impl_->opt.n_threads) +
         " threads";
}

BackendMemory CpuBackend::memory() const {
  return BackendMemory{0, impl_->stats.kv_bytes, impl_->stats.arena_bytes};
}

bool CpuBackend::supports(const graph::Graph& g, const graph::Node& n) const {
  for (int i = 0; i < n.n_in(); ++i) {
    if (n.in[static_cast<size_t>(i)] != graph::kNone && !is_activation_ok(g.tensor(n.in[static_cast<size_t>(i)]))) return false;
  }
  if (!is_activation_ok(g.tensor(n.out[0]))) return false;
  // A matmul's input rows must be whole blocks of the encoding its weights consume.
  auto matmul_ok = [&](graph::TensorId x, graph::TensorId w) {
    const graph::Tensor& wt = g.tensor(w);
    if (wt.kind != graph::TensorKind::kWeight || kernels::type_kernels(wt.weight_type()) == nullptr) return false;
    const DTypeInfo* enc = dtype_info(cpu::act_type_of(wt.weight_type()));
    return g.tensor(x).cols % enc->block_size == 0;
  };
  const graph::Heads& h = g.heads;
  const bool heads_ok = h.head_dim > 0 && h.head_dim % 2 == 0 && h.head_dim <= ops::kMaxHeadDim && h.n_head_kv > 0 &&
                        h.n_head % h.n_head_kv == 0;
  switch (n.op) {
    case Op::kEmbed: return kernels::type_kernels(g.tensor(n.in[1]).weight_type()) != nullptr;
    case Op::kRmsNorm: return g.tensor(n.in[1]).weight_type() == DType::kF32;
    case Op::kMatmul:
      return matmul_ok(n.in[0], n.in[1]) && (n.in[2] == graph::kNone || g.tensor(n.in[2]).weight_type() == DType::kF32);
    case Op::kMatmulAdd: return matmul_ok(n.in[0], n.in[1]) && n.in[2] == graph::kNone;  // a bias would be added twice
    case Op::kMatmulSwiglu:
    case Op::kMatmulGeglu: return matmul_ok(n.in[0], n.in[1]) && matmul_ok(n.in[0], n.in[2]);
    case Op::kRope:
    case Op::kKvWrite:
    case Op::kRopeKv:
    case Op::kAttention: return heads_ok;
    case Op::kSwiglu:
    case Op::kGeglu:
    case Op::kAdd:
    case Op::kGetRows: return true;
  }
  return false;
}

Status CpuBackend::prepare(const graph::Graph& g, const BackendShape& shape) {
  Impl& I = *impl_;
  I.shape = shape;
  I.first_layer = g.first_layer;
  I.heads = g.heads;
  I.programs[0].reset();
  I.programs[1].reset();
  I.planned = nullptr;
  I.kv.reset();
  bool has_cache = false;
  for (const graph::Tensor& t : g.tensors()) has_cache = has_cache || t.kind == graph::TensorKind::kKvCache;
  if (has_cache) {
    ModelConfig stage;  // the cache holds this graph's layers only
    stage.n_layer = g.end_layer - g.first_layer;
    stage.n_head = g.heads.n_head;
    stage.n_head_kv = g.heads.n_head_kv;
    stage.head_dim = g.heads.head_dim;
    auto kv = KvCache::create(stage, shape.n_blocks, graph::kv_blocks_per_slot(shape.n_ctx));
    if (!kv) return kv.status();
    I.kv = std::move(kv).value();
  }
  I.stats.kv_bytes = I.kv ? I.kv->bytes() : 0;
  return Status::ok();
}

Status CpuBackend::Impl::ensure_plan(const cpu::Program& prog, int64_t m, int64_t n_out, int64_t kv_pad) {
  // Symbolic shapes: token counts round up to 32 (1 stays 1), KV length to the padding step, so the plan
  // is rebuilt only when a real size crosses a step.
  const PlanKey k{m == 1 ? 1 : round_up(m, 32), n_out <= 1 ? n_out : round_up(n_out, 32), kv_pad};
  if (k == key && planned == &prog && arena != nullptr) return Status::ok();
  key = k;
  planned = &prog;
  stats.plan_rebuilds++;

  const int nth = pool->size();
  auto bytes = [&](const cpu::Buffer& b) -> size_t {
    switch (b.rows) {
      case RowsOf::kTokens: return static_cast<size_t>(k.m_cap) * b.row_bytes;
      case RowsOf::kOutputs: return static_cast<size_t>(std::max<int64_t>(k.n_out_cap, 1)) * b.row_bytes;
      case RowsOf::kOne: return b.row_bytes;
      case RowsOf::kKv: return static_cast<size_t>(k.kv_pad) * b.row_bytes;
    }
    return 0;
  };
  // Each thread's own buffers, planned once for all threads, then the shared ones and the threads' regions.
  ArenaPlan local;
  std::vector<int> local_id(prog.buffers.size(), -1), shared_id(prog.buffers.size(), -1);
  for (size_t i = 0; i < prog.buffers.size(); ++i) {
    const cpu::Buffer& b = prog.buffers[i];
    if (b.local && b.first_phase >= 0) local_id[i] = local.add(b.name, bytes(b), b.first_phase, b.last_phase);
  }
  local.plan(64);
  local_stride = static_cast<size_t>(round_up(static_cast<int64_t>(local.total_bytes()), 64));
  plan = ArenaPlan();
  for (size_t i = 0; i < prog.buffers.size(); ++i) {
    const cpu::Buffer& b = prog.buffers[i];
    if (!b.local && b.first_phase >= 0) shared_id[i] = plan.add(b.name, bytes(b), b.first_phase, b.last_phase);
  }
  const int local_region =
      local_stride == 0 ? -1 : plan.add("per-thread", static_cast<size_t>(nth) * local_stride, 0, prog.n_phases);
  plan.plan(64);
  offset.assign(prog.buffers.size(), 0);
  for (size_t i = 0; i < prog.buffers.size(); ++i) {
    if (shared_id[i] >= 0) offset[i] = plan.offset(shared_id[i]);
    if (local_id[i] >= 0) offset[i] = local.offset(local_id[i]);
  }
  local_base = local_region >= 0 ? plan.offset(local_region) : 0;
  if (plan.total_bytes() > arena_capacity) {
    std::free(arena);
    arena_capacity = 0;
    const size_t size = static_cast<size_t>(round_up(static_cast<int64_t>(plan.total_bytes()), 64));
    arena = static_cast<uint8_t*>(std::aligned_alloc(64, size));
    if (arena == nullptr) {
      planned = nullptr;
      return make_error(Code::kFailed, "out of memory for the activation arena (%zu bytes)", size);
    }
    arena_capacity = plan.total_bytes();
  }
  stats.arena_bytes = plan.total_bytes();
  stats.arena_naive_bytes = plan.naive_bytes() - (local_region >= 0 ? static_cast<size_t>(nth) * local_stride : 0) +
                            static_cast<size_t>(nth) * local.naive_bytes();
  return Status::ok();
}

Status CpuBackend::compute(const graph::Graph& g, graph::StepIO& io) {
  Impl& I = *impl_;
  const graph::StepShape& sh = io.shape;
  const int which = sh.tokens == 1 ? 0 : 1;
  if (!I.programs[which]) I.programs[which].emplace(cpu::compile(g, which == 0));
  const cpu::Program& prog = *I.programs[which];
  const MatmulPath path = I.forced ? I.forced_path : choose_matmul_path(sh.tokens);
  INFERD_RETURN_IF_ERROR(I.ensure_plan(prog, sh.tokens, sh.outputs, sh.kv_pad));
  if (I.kv) {
    INFERD_ASSERT(io.kv_table.size() == static_cast<size_t>(I.shape.n_slots) *
                                            static_cast<size_t>(graph::kv_blocks_per_slot(I.shape.n_ctx)),
                  "the step's KV block table has %zu entries", io.kv_table.size());
    I.kv->bind(io.kv_table);
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const graph::Tensor& t = g.tensor(g.outputs()[i]);
    io.outputs[i]->resize(static_cast<size_t>(graph::Graph::rows(t, sh)) * static_cast<size_t>(t.cols));
  }
  if (I.n_counters < prog.n_counters) {
    I.n_counters = prog.n_counters;
    I.counters = std::make_unique<Impl::ChunkCounter[]>(static_cast<size_t>(I.n_counters));
  }
  for (int32_t c = 0; c < prog.n_counters; ++c) I.counters[static_cast<size_t>(c)].next.store(0, std::memory_order_relaxed);
  I.pass = Impl::Pass{&g, &prog, &io, sh.tokens, sh.outputs, sh.kv_pad,
                      path == MatmulPath::kGemv ? 1 : kernels::kMaxDotRows};
  I.pool->run([&I](int ith, int nth) { I.run_pass(ith, nth); });
  (path == MatmulPath::kGemv ? I.stats.gemv_passes : I.stats.gemm_passes)++;
  return Status::ok();
}

void CpuBackend::Impl::run_pass(int ith, int nth) {
  for (const Step& s : pass.prog->steps) {
    if (s.kind == StepKind::kBarrier) {
      pool->barrier();
    } else if (s.rows != RowsOf::kOutputs || pass.outputs > 0) {
      run_step(s, ith, nth);
    }
  }
}

void CpuBackend::Impl::run_step(const Step& s, int ith, int nth) {
  const graph::Graph& g = *pass.g;
  const graph::Node& n = g.nodes()[static_cast<size_t>(s.node)];
  const int64_t m = rows(s.rows);
  const int64_t hd = heads.head_dim, n_head = heads.n_head, n_head_kv = heads.n_head_kv;
  // Rows [0, m) of a row step: this thread's share, or every row when replicated.
  auto row_range = [&]() -> std::pair<int64_t, int64_t> {
    return s.replicated ? std::pair<int64_t, int64_t>{0, m} : split_range(m, ith, nth);
  };
  // Rows of one matmul in chunks that threads claim as they go, so that a thread preempted by another
  // process (the daemon, a client) does not hold the others up at the next barrier. Guided sizes: each
  // claim takes 1/(2 nth) of what is left (at least 64 rows), so the first chunks are long streams and
  // the last ones short enough to even out the threads. Every chunk start costs the decode GEMV a cold
  // prefetch window: fixed chunks of n / (4 nth) rows measured 3% slower 1.1B Q4_0 decode in-process (2
  // threads). Claims of 1/nth (half the rows at once on 2 threads) were as fast in-process but left a
  // thread preempted by the daemon or a client holding the pass up (SmolLM2 through the daemon 189 vs
  // 197 tok/s); 1/(4 nth) was slower in-process (31.7 vs 33.2). Chunk boundaries are multiples of 64
  // rows: each row, and each SIMD group of an element-wise op over rows, is computed exactly as with a
  // static split (bit-identical).
  auto for_chunks = [&](int64_t total, auto&& fn) {
    std::atomic<int64_t>& next = counters[static_cast<size_t>(s.counter)].next;
    int64_t r0 = next.load(std::memory_order_relaxed);
    while (r0 < total) {
      const int64_t chunk = std::max<int64_t>(64, round_up((total - r0 + 2 * nth - 1) / (2 * nth), 64));
      if (next.compare_exchange_weak(r0, r0 + chunk, std::memory_order_relaxed)) {
        fn(r0, std::min(total, r0 + chunk));
        r0 = next.load(std::memory_order_relaxed);
      }
    }
  };
  auto act_ptrs = [&](uint8_t* act[cpu::kActKinds]) {
    for (int a = 0; a < cpu::kActKinds; ++a) act[a] = (s.act_kinds & (1 << a)) ? ptr(s.act[a], ith) : nullptr;
  };

  switch (s.kind) {
    case StepKind::kBarrier: return;
    case StepKind::kEmbed: {
      const WeightView& w = *g.tensor(n.in[1]).weight;
      const kernels::TypeKernels* tk = kernels::type_kernels(w.type);
      const int32_t* ids = ints(s.ints);
      float* dst = f32(s.dst, ith);
      const int64_t e = w.cols;
      auto [t0, t1] = split_range(m, ith, nth);
      thread_local std::vector<uint8_t> row;  // an interleaved matrix's row, in the row layout
      row.resize(w.row_bytes);
      for (int64_t t = t0; t < t1; ++t) {
        tk->to_float(w.read_row(ids[t], row.data()), dst + t * e, e);
        if (n.scale != 0.0f) {
          for (int64_t i = 0; i < e; ++i) dst[t * e + i] *= n.scale;
        }
      }
      return;
    }
    case StepKind::kRmsNorm: {
      const float* w = g.tensor(n.in[1]).weight->f32();
      const int64_t e = g.tensor(n.in[0]).cols, group = g.tensor(n.in[1]).cols;  // a row, or each head of it
      const float* src = f32(s.src, ith);
      float* dst = f32(s.dst, ith);
      auto [t0, t1] = row_range();
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t c = 0; c < e; c += group) ops::rms_norm(src + t * e + c, w, dst + t * e + c, group, n.eps);
      }
      return;
    }
    case StepKind::kEncode: {
      const int64_t k = g.tensor(n.in[0]).cols;
      const float* src = f32(s.src, ith);
      auto [t0, t1] = row_range();
      for (int a = 0; a < cpu::kActKinds; ++a) {
        if (!(s.act_kinds & (1 << a))) continue;
        uint8_t* dst = ptr(s.act[a], ith);
        for (int64_t t = t0; t < t1; ++t) cpu::encode_row(a, src + t * k, dst + static_cast<size_t>(t) * s.act_row_bytes[a], k);
      }
      return;
    }
    case StepKind::kMatmul: {
      const WeightView& w = *g.tensor(n.in[1]).weight;
      uint8_t* act[cpu::kActKinds];
      act_ptrs(act);
      float* out = f32(s.dst, ith);
      const float* residual = s.res.loc == Loc::kNone ? nullptr : f32(s.res, ith);
      const float* bias = n.op == Op::kMatmul && n.in[2] != graph::kNone ? g.tensor(n.in[2]).weight->f32() : nullptr;
      const cpu::MatmulJob job{&w, act, s.act_row_bytes, out, w.rows, residual != nullptr, bias, residual};
      const int max_nr = matmul_nr(w.type, m);
      for_chunks(w.rows, [&](int64_t r0, int64_t r1) { cpu::matmul_rows(job, m, max_nr, r0, r1); });
      return;
    }
    case StepKind::kGateUp: {
      const WeightView& wg = *g.tensor(n.in[1]).weight;
      const WeightView& wu = *g.tensor(n.in[2]).weight;
      uint8_t* act[cpu::kActKinds];
      act_ptrs(act);
      float* h = f32(s.dst, ith);
      const int64_t f = wg.rows;
      const int max_nr = std::max(matmul_nr(wg.type, m), matmul_nr(wu.type, m));  // IQ4_NL keeps the step's
      const bool geglu = n.op == Op::kMatmulGeglu;
      // Batches go through matmul_rows (the type's GEMM where it has one) as soon as either weight has a GEMM:
      // IQ4_NL's GEMM has llama.cpp's batch order, which its dot kernel does not.
      const bool tiled = max_nr > 1 && (cpu::has_gemm(wg) || cpu::has_gemm(wu));
      for_chunks(f, [&](int64_t r0, int64_t r1) {
        if (tiled) {
          // Gate and up as matmuls (tiled GEMMs where the types have them), then the GLU over this chunk's columns.
          float* u = f32(s.scratch, ith);
          cpu::matmul_rows({&wg, act, s.act_row_bytes, h, f, false, nullptr}, m, max_nr, r0, r1);
          cpu::matmul_rows({&wu, act, s.act_row_bytes, u, f, false, nullptr}, m, max_nr, r0, r1);
          for (int64_t t = 0; t < m; ++t) {
            (geglu ? kernels::geglu : kernels::swiglu)(r1 - r0, h + t * f + r0, u + t * f + r0, h + t * f + r0);
          }
        } else {
          cpu::gate_up_rows(wg, wu, act, s.act_row_bytes, h, m, max_nr, f, r0, r1, geglu);
        }
      });
      return;
    }
    case StepKind::kRopeKv: {
      // RoPE on Q and K; K and V rows go straight into the cache (sub-tensor views).
      const int64_t e = n_head * hd, ekv = n_head_kv * hd;
      const float* q = f32(s.src, ith);
      const float* kb = f32(s.src2, ith);
      const float* vb = f32(s.res, ith);
      float* q_out = f32(s.dst, ith);
      const int32_t* pos = ints(s.ints);
      const int32_t* slot = ints(s.slots);
      const int32_t kl = n.layer - first_layer;  // the layer's index in this stage's cache
      const float base = heads.rope_base_of(n), freq_scale = n.rope_freq_scale;
      const float* factors = n.rope_factors ? n.rope_factors->f32() : nullptr;
      auto [u0, u1] = split_range(m * (n_head + n_head_kv), ith, nth);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = u / (n_head + n_head_kv), hh = u % (n_head + n_head_kv);
        if (hh < n_head) {
          float* qh = q_out + t * e + hh * hd;
          if (q_out != q) std::memcpy(qh, q + t * e + hh * hd, static_cast<size_t>(hd) * sizeof(float));
          ops::rope_head(qh, hd, pos[t], base, heads.rope_style, freq_scale, factors);
          q_as_half(qh, s.q_scale, hd, qh);
        } else {
          const int32_t kvh = static_cast<int32_t>(hh - n_head);
          float kh[ops::kMaxHeadDim];
          std::memcpy(kh, kb + t * ekv + kvh * hd, static_cast<size_t>(hd) * sizeof(float));
          ops::rope_head(kh, hd, pos[t], base, heads.rope_style, freq_scale, factors);
          kernels::fp32_to_fp16_row(kh, kv->k(slot[t], kl, kvh).row(pos[t]), hd);
          kernels::fp32_to_fp16_row(vb + t * ekv + kvh * hd, kv->v(slot[t], kl, kvh).row(pos[t]), hd);
        }
      }
      return;
    }
    case StepKind::kRope: {
      const int64_t c = g.tensor(n.in[0]).cols, n_heads = c / hd;
      const float* src = f32(s.src, ith);
      float* dst = f32(s.dst, ith);
      const int32_t* pos = ints(s.ints);
      auto [u0, u1] = split_range(m * n_heads, ith, nth);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = u / n_heads, hh = u % n_heads;
        float* d = dst + t * c + hh * hd;
        if (d != src + t * c + hh * hd) std::memcpy(d, src + t * c + hh * hd, static_cast<size_t>(hd) * sizeof(float));
        ops::rope_head(d, hd, pos[t], heads.rope_base_of(n), heads.rope_style, n.rope_freq_scale,
                       n.rope_factors ? n.rope_factors->f32() : nullptr);
      }
      return;
    }
    case StepKind::kKvWrite: {
      const int64_t ekv = n_head_kv * hd;
      const float* kb = f32(s.src, ith);
      const float* vb = f32(s.src2, ith);
      const int32_t* pos = ints(s.ints);
      const int32_t* slot = ints(s.slots);
      const int32_t kl = n.layer - first_layer;
      auto [u0, u1] = split_range(m * n_head_kv, ith, nth);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = u / n_head_kv;
        const int32_t kvh = static_cast<int32_t>(u % n_head_kv);
        kernels::fp32_to_fp16_row(kb + t * ekv + kvh * hd, kv->k(slot[t], kl, kvh).row(pos[t]), hd);
        kernels::fp32_to_fp16_row(vb + t * ekv + kvh * hd, kv->v(slot[t], kl, kvh).row(pos[t]), hd);
      }
      return;
    }
    case StepKind::kAttention: {
      // Attention over the padded KV length; positions past the token's own are masked.
      const int64_t e = n_head * hd, group = n_head / n_head_kv;
      const float* q = f32(s.src, ith);
      float* out = f32(s.dst, ith);
      float* scores = f32(s.scratch, ith);
      const int32_t* pos = ints(s.ints);
      const int32_t* slot = ints(s.slots);
      const int32_t kl = n.layer - first_layer;
      // An explicit scale (gemma3, phi3) multiplies Q before the product, as llama.cpp's graphs for them do
      // (then Q is rounded to F16: here or, fused, in the RopeKv step); the default 1/sqrt(head_dim) scales
      // the scores.
      INFERD_ASSERT(s.q_scale == 0.0f || s.round_q, "Q is scaled by the step that rounds it");
      const float kq_scale = n.scale > 0.0f ? 1.0f : heads.kq_scale(n);
      auto [u0, u1] = split_range(m * n_head, ith, nth);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = u / n_head, hh = u % n_head;
        const int32_t kvh = static_cast<int32_t>(hh / group);
        const float* qh = q + t * e + hh * hd;
        float rounded[ops::kMaxHeadDim];
        if (s.round_q) {
          q_as_half(qh, s.q_scale, hd, rounded);
          qh = rounded;
        }
        const int64_t start = n.window > 0 ? std::max<int64_t>(0, pos[t] + 1 - n.window) : 0;
        ops::attention_head(qh, kv->k(slot[t], kl, kvh), kv->v(slot[t], kl, kvh), hd, pos[t] + 1, kq_scale, scores,
                            out + t * e + hh * hd, start);
      }
      return;
    }
    case StepKind::kSwiglu:
    case StepKind::kGeglu:
    case StepKind::kAdd: {
      const int64_t c = g.tensor(n.in[0]).cols;
      const float* a = f32(s.src, ith);
      const float* b = f32(s.src2, ith);
      float* dst = f32(s.dst, ith);
      auto [t0, t1] = split_range(m, ith, nth);
      for (int64_t t = t0; t < t1; ++t) {
        if (s.kind == StepKind::kSwiglu) {
          kernels::swiglu(c, a + t * c, b + t * c, dst + t * c);
        } else if (s.kind == StepKind::kGeglu) {
          kernels::geglu(c, a + t * c, b + t * c, dst + t * c);
        } else {
          for (int64_t i = 0; i < c; ++i) dst[t * c + i] = a[t * c + i] + b[t * c + i];
        }
      }
      return;
    }
    case StepKind::kGetRows: {
      const int64_t c = g.tensor(n.in[0]).cols;
      const float* src = f32(s.src, ith);
      const int32_t* idx = ints(s.ints);
      float* dst = f32(s.dst, ith);
      auto [o0, o1] = split_range(m, ith, nth);
      for (int64_t o = o0; o < o1; ++o) std::memcpy(dst + o * c, src + idx[o] * c, static_cast<size_t>(c) * sizeof(float));
      return;
    }
  }
}

}  // namespace inferd
