#include "inferd/engine.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include <sched.h>

#include "inferd/arena.h"
#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/kv_cache.h"
#include "ops.h"
#include "inferd/thread_pool.h"

namespace inferd {

MatmulPath choose_matmul_path(int64_t n_tokens) {
  // One token: every weight byte is used once, the pass is bound by memory bandwidth, so the GEMV
  // streams weights with no extra pass over the activations. Two or more tokens: the blocked GEMM
  // reuses each decoded weight block for up to kMaxDotRows tokens (measured: inferd-bench --paths).
  return n_tokens <= 1 ? MatmulPath::kGemv : MatmulPath::kGemm;
}

namespace {

// Activation encodings a matmul may need, indexed by act_index().
constexpr int kActKinds = 4;
int act_index(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kQ8_0: return 1;
    case DType::kQ8_1: return 2;
    case DType::kQ8_K: return 3;
    default: INFERD_ASSERT(false, "unexpected activation type"); return 0;
  }
}
constexpr DType kActTypes[kActKinds] = {DType::kF32, DType::kQ8_0, DType::kQ8_1, DType::kQ8_K};

int64_t round_up(int64_t v, int64_t step) { return (v + step - 1) / step * step; }

// The inputs of the matmuls of one layer (and of the output projection). Each has a width k and the
// set of activation encodings its weights consume (a model may mix weight types).
enum Site { kSiteAttnIn, kSiteWoIn, kSiteFfnIn, kSiteDownIn, kSiteOutIn, kSites };

struct SiteInfo {
  int64_t k = 0;
  unsigned act_mask = 0;
  size_t row_bytes[kActKinds] = {};  // bytes of one encoded row, per needed kind
};

}  // namespace

struct Engine::Impl {
  std::shared_ptr<const Model> model;
  ModelConfig cfg;
  EngineOptions opt;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<ThreadPool> pool;
  std::vector<int32_t> slot_len;
  SiteInfo sites[kSites];
  const kernels::TypeKernels* embd_kernels = nullptr;

  // Shape-dependent plan.
  struct PlanKey {
    int64_t m_cap = 0, n_out_cap = 0, kv_pad = 0;
    bool operator==(const PlanKey&) const = default;
  } key;
  ArenaPlan plan;
  int id_x = -1, id_u = -1, id_xn = -1, id_q = -1, id_k = -1, id_v = -1, id_attn = -1, id_h = -1, id_xo = -1;
  int id_scores = -1, id_local_xn = -1;
  int id_act[kSites][kActKinds];
  int id_local_act[kActKinds];
  size_t local_act_stride[kActKinds] = {};  // bytes per thread in local_<kind>
  std::vector<int64_t> out_rows;             // batch indices of the tokens whose logits are wanted
  size_t arena_capacity = 0;
  uint8_t* arena = nullptr;  // owned, 64-byte aligned
  std::vector<float> logits;
  // Dynamic row chunks: one counter per matmul of a pass, on its own cache line, reset before each pass.
  struct alignas(64) ChunkCounter {
    std::atomic<int64_t> next{0};
  };
  std::unique_ptr<ChunkCounter[]> chunk_counters;
  int n_chunk_counters = 0;
  std::vector<float> hidden;          // a pipeline stage's output (m x n_embd)
  const float* hidden_in = nullptr;   // the previous stage's output, during a pass
  float* hidden_out = nullptr;
  std::vector<float> all_logits;
  EngineStats stats;
  bool forced = false;
  MatmulPath forced_path = MatmulPath::kGemv;

  ~Impl() { std::free(arena); }

  template <typename T>
  T* buf(int id) const {
    return reinterpret_cast<T*>(arena + plan.offset(id));
  }

  void ensure_plan(int64_t m, int64_t n_out, int64_t kv_pad);
  void run_pass(std::span<const BatchToken> batch, MatmulPath path, int ith, int nth);

  // Encodes rows [t0, t1) of `src` (k floats each) for `site` into every needed activation kind.
  void encode_rows(Site site, const float* src, int64_t t0, int64_t t1, uint8_t* const dst[kActKinds]) const {
    const SiteInfo& s = sites[site];
    for (int a = 0; a < kActKinds; ++a) {
      if (!(s.act_mask & (1u << a))) continue;
      const kernels::TypeKernels* tk = quantizer(a);
      for (int64_t t = t0; t < t1; ++t) tk->quantize_act(src + t * s.k, dst[a] + static_cast<size_t>(t) * s.row_bytes[a], s.k);
    }
  }
  // A kernel table whose act_type is kind `a` (used for quantize_act only).
  const kernels::TypeKernels* quantizer(int a) const {
    static const DType kWeightFor[kActKinds] = {DType::kF32, DType::kQ8_0, DType::kQ4_1, DType::kQ4_K};
    return kernels::type_kernels(kWeightFor[a]);
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  model_ = impl_->model;
  options_ = impl_->opt;
}
Engine::~Engine() = default;

Status check_engine_shape(int32_t n_ctx, int32_t n_slots, int32_t n_ubatch, int32_t pad_step) {
  if (n_ctx < 1 || n_ctx > (1 << 20)) {
    return make_error(Code::kInvalidArgument, "n_ctx must be in [1, 1048576], got %d", n_ctx);
  }
  if (n_slots < 1 || n_slots > 1024) {
    return make_error(Code::kInvalidArgument, "n_slots must be in [1, 1024], got %d", n_slots);
  }
  if (n_ubatch < 1 || n_ubatch > 8192) {
    return make_error(Code::kInvalidArgument, "n_ubatch must be in [1, 8192], got %d", n_ubatch);
  }
  if (pad_step != 64 && pad_step != 128) {
    return make_error(Code::kInvalidArgument, "pad_step must be 64 or 128, got %d", pad_step);
  }
  return Status::ok();
}

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const Model> model, const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  const ModelConfig& cfg = model->config();
  EngineOptions opt = options;
  if (opt.n_ctx == 0) opt.n_ctx = default_context(cfg);
  if (opt.n_threads == 0) {
    cpu_set_t set;
    opt.n_threads = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                                  : static_cast<int>(std::thread::hardware_concurrency());
    opt.n_threads = std::max(opt.n_threads, 1);
  }
  INFERD_RETURN_IF_ERROR(check_engine_shape(opt.n_ctx, opt.n_slots, opt.n_ubatch, opt.pad_step));
  if (opt.n_threads < 1 || opt.n_threads > 512) {
    return make_error(Code::kInvalidArgument, "n_threads must be in [1, 512], got %d", opt.n_threads);
  }
  if (opt.end_layer == 0) opt.end_layer = cfg.n_layer;
  if (opt.first_layer < 0 || opt.first_layer >= opt.end_layer || opt.end_layer > cfg.n_layer) {
    return make_error(Code::kInvalidArgument, "layer range [%d, %d) is not inside the model's %d layers",
                      opt.first_layer, opt.end_layer, cfg.n_layer);
  }
  impl->model = model;
  impl->cfg = cfg;
  impl->opt = opt;
  ModelConfig stage_cfg = cfg;  // the cache holds this stage's layers only
  stage_cfg.n_layer = opt.end_layer - opt.first_layer;
  auto kv = KvCache::create(stage_cfg, opt.n_slots, opt.n_ctx);
  if (!kv) return kv.status();
  impl->kv = std::move(kv).value();
  impl->pool = std::make_unique<ThreadPool>(opt.n_threads);
  impl->slot_len.assign(static_cast<size_t>(opt.n_slots), 0);
  impl->embd_kernels = kernels::type_kernels(model->token_embd().type);
  impl->logits.reserve(static_cast<size_t>(cfg.n_vocab));

  auto add_site = [&](Site site, int64_t k, const WeightView& w) {
    SiteInfo& s = impl->sites[site];
    s.k = k;
    const kernels::TypeKernels* tk = kernels::type_kernels(w.type);
    INFERD_ASSERT(tk != nullptr);  // Model::load checked every weight type
    const int a = act_index(tk->act_type);
    s.act_mask |= 1u << a;
    s.row_bytes[a] = dtype_row_bytes(tk->act_type, k);
  };
  for (int l = opt.first_layer; l < opt.end_layer; ++l) {
    const LayerWeights& lw = model->layer(l);
    for (const WeightView* w : {&lw.wq, &lw.wk, &lw.wv}) add_site(kSiteAttnIn, cfg.n_embd, *w);
    add_site(kSiteWoIn, cfg.n_embd, lw.wo);
    add_site(kSiteFfnIn, cfg.n_embd, lw.w_gate);
    add_site(kSiteFfnIn, cfg.n_embd, lw.w_up);
    add_site(kSiteDownIn, cfg.n_ff, lw.w_down);
  }
  if (opt.end_layer == cfg.n_layer) add_site(kSiteOutIn, cfg.n_embd, model->output());
  for (int s = 0; s < kSites; ++s) {
    for (int a = 0; a < kActKinds; ++a) {
      if (impl->sites[s].act_mask & (1u << a)) {
        // Activation rows must be whole blocks of their encoding.
        const DTypeInfo* info = dtype_info(kActTypes[a]);
        if (impl->sites[s].k % info->block_size != 0) {
          return make_error(Code::kUnimplemented, "row width %lld is not a multiple of %s's block size %lld",
                            static_cast<long long>(impl->sites[s].k), info->name,
                            static_cast<long long>(info->block_size));
        }
      }
    }
  }
  impl->stats.kv_bytes = impl->kv->bytes();
  impl->n_chunk_counters = 6 * (opt.end_layer - opt.first_layer) + 8;  // q k v wo gate/up down per layer + output
  impl->chunk_counters = std::make_unique<Impl::ChunkCounter[]>(static_cast<size_t>(impl->n_chunk_counters));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

void Engine::Impl::ensure_plan(int64_t m, int64_t n_out, int64_t kv_pad) {
  // Symbolic shapes: token counts round up to 32 (1 stays 1), KV length to the padding step, so
  // the plan is rebuilt only when a real size crosses a step.
  PlanKey k{m == 1 ? 1 : round_up(m, 32), n_out <= 1 ? n_out : round_up(n_out, 32), kv_pad};
  if (k == key && arena != nullptr) return;
  key = k;
  stats.plan_rebuilds++;

  const int64_t mc = k.m_cap, E = cfg.n_embd, Ekv = cfg.n_embd_kv(), F = cfg.n_ff;
  const int nth = pool->size();
  const size_t f = sizeof(float);
  // Steps of one layer (lifetimes are inclusive step ranges):
  //  0 embed | 1 norm | 2 encode | 3 qkv | 4 rope+cache | 5 attention | 6 encode | 7 wo
  //  8 norm | 9 encode | 10 gate/up | 11 encode | 12 down | 13 out norm | 14 encode | 15 output
  plan = ArenaPlan();
  id_x = plan.add("x", static_cast<size_t>(mc * E) * f, 0, 13);
  id_xn = plan.add("xn", static_cast<size_t>(mc * E) * f, 1, 10);
  id_q = plan.add("q", static_cast<size_t>(mc * E) * f, 3, 5);
  id_k = plan.add("k", static_cast<size_t>(mc * Ekv) * f, 3, 4);
  id_v = plan.add("v", static_cast<size_t>(mc * Ekv) * f, 3, 4);
  id_attn = plan.add("attn", static_cast<size_t>(mc * E) * f, 5, 7);
  id_h = plan.add("h", static_cast<size_t>(mc * F) * f, 10, 12);
  id_u = plan.add("u", static_cast<size_t>(mc * F) * f, 10, 10);
  id_xo = plan.add("x_out", static_cast<size_t>(std::max<int64_t>(k.n_out_cap, 1) * E) * f, 13, 15);
  id_scores = plan.add("scores", static_cast<size_t>(nth) * static_cast<size_t>(kv_pad) * f, 5, 5);
  id_local_xn = plan.add("local_xn", static_cast<size_t>(nth) * static_cast<size_t>(std::max(E, F)) * f, 0, 15);
  static const char* kSiteNames[kSites] = {"enc_attn", "enc_wo", "enc_ffn", "enc_down", "enc_out"};
  static const int kSiteLife[kSites][2] = {{2, 3}, {6, 7}, {9, 10}, {11, 12}, {14, 15}};
  size_t local_bytes[kActKinds] = {};
  for (int s = 0; s < kSites; ++s) {
    const int64_t rows = s == kSiteOutIn ? std::max<int64_t>(k.n_out_cap, 1) : mc;
    for (int a = 0; a < kActKinds; ++a) {
      id_act[s][a] = -1;
      if (!(sites[s].act_mask & (1u << a))) continue;
      id_act[s][a] = plan.add(std::string(kSiteNames[s]) + "_" + dtype_name(kActTypes[a]),
                              static_cast<size_t>(rows) * sites[s].row_bytes[a], kSiteLife[s][0], kSiteLife[s][1]);
      local_bytes[a] = std::max(local_bytes[a], sites[s].row_bytes[a]);
    }
  }
  for (int a = 0; a < kActKinds; ++a) {
    local_act_stride[a] = static_cast<size_t>(round_up(static_cast<int64_t>(local_bytes[a]), 64));
    id_local_act[a] = local_bytes[a] == 0 ? -1
                                          : plan.add(std::string("local_") + dtype_name(kActTypes[a]),
                                                     static_cast<size_t>(nth) * local_act_stride[a], 0, 15);
  }
  plan.plan(64);
  if (plan.total_bytes() > arena_capacity) {
    std::free(arena);
    arena_capacity = plan.total_bytes();
    arena = static_cast<uint8_t*>(std::aligned_alloc(64, round_up(static_cast<int64_t>(arena_capacity), 64)));
    INFERD_ASSERT(arena != nullptr, "out of memory for the activation arena");
  }
  stats.arena_bytes = plan.total_bytes();
  stats.arena_naive_bytes = plan.naive_bytes();
}

namespace {

// One weight matrix applied to encoded activations: out[t * out_stride + r] (+)= dot(W[r], act[t]).
struct MatmulJob {
  const WeightView* w;
  uint8_t* const* act;     // per activation kind
  const size_t* act_row_bytes;
  float* out;
  int64_t out_stride;
  bool accumulate;
  const float* bias;       // optional, added to every output row
};

// max_nr = 1 is the GEMV path (each token streams the weight rows on its own); kMaxDotRows the GEMM
// path, which blocks rows so that a block of weights stays in L1/L2 while all token groups pass it.
void matmul_rows(const MatmulJob& j, int64_t m, int max_nr, int64_t r0, int64_t r1) {
  const kernels::TypeKernels* tk = kernels::type_kernels(j.w->type);
  const int a = act_index(tk->act_type);
  // The GEMM path uses the register-tiled kernel where one exists (same bits as `dot`).
  if (max_nr > 1) {
    if (kernels::GemmFn gemm = kernels::gemm_kernel(j.w->type)) {
      gemm({j.w->type, j.w->cols, j.w->data, j.w->row_bytes, r0, r1, j.act[a], j.act_row_bytes[a], m, j.out,
            j.out_stride, j.accumulate, j.bias});
      return;
    }
  }
  const uint8_t* act = j.act[a];
  const size_t stride = j.act_row_bytes[a];
  const int64_t k = j.w->cols;
  auto store = [&](int64_t t, int64_t r, float v) {
    float* o = j.out + t * j.out_stride + r;
    *o = j.accumulate ? *o + v : v + (j.bias ? j.bias[r] : 0.0f);
  };
  // Decode: four weight rows at a time (four independent accumulation chains; same bits as `dot`).
  if (max_nr == 1 && tk->dot_w4 != nullptr) {
    // The kernels prefetch the rows two calls ahead as they stream; the first two calls of a chunk
    // have nobody to do that for them, so ask for those 8 rows at once here (one burst of misses in
    // parallel instead of a cold start, at every chunk of every matmul of every layer).
    const int64_t warm = std::min<int64_t>(r1, r0 + 8);
    for (int64_t r = r0; r < warm; ++r) {
      const char* row = reinterpret_cast<const char*>(j.w->row(r));
      for (size_t off = 0; off < j.w->row_bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
    }
    float y4[4];
    for (int64_t t = 0; t < m; ++t) {
      const uint8_t* at = act + static_cast<size_t>(t) * stride;
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) {
        tk->dot_w4(k, j.w->row(r), j.w->row_bytes, at, y4);
        for (int i = 0; i < 4; ++i) store(t, r + i, y4[i]);
      }
      for (; r < r1; ++r) {
        tk->dot(k, j.w->row(r), at, stride, 1, y4);
        store(t, r, y4[0]);
      }
    }
    return;
  }
  const int64_t rb = max_nr == 1 ? r1 - r0
                                 : std::max<int64_t>(1, static_cast<int64_t>((32 * 1024) / std::max<size_t>(j.w->row_bytes, 1)));
  float y[kernels::kMaxDotRows];
  for (int64_t rb0 = r0; rb0 < r1; rb0 += rb) {
    const int64_t rb1 = std::min(r1, rb0 + rb);
    for (int64_t t0 = 0; t0 < m; t0 += max_nr) {
      const int nr = static_cast<int>(std::min<int64_t>(max_nr, m - t0));
      const uint8_t* a0 = act + static_cast<size_t>(t0) * stride;
      for (int64_t r = rb0; r < rb1; ++r) {
        tk->dot(k, j.w->row(r), a0, stride, nr, y);
        const float b = j.bias ? j.bias[r] : 0.0f;
        for (int i = 0; i < nr; ++i) {
          float* o = j.out + (t0 + i) * j.out_stride + r;
          *o = j.accumulate ? *o + y[i] : y[i] + b;
        }
      }
    }
  }
}

// h[t][r] = silu(gate[r] . x[t]) * (up[r] . x[t]) for rows [r0, r1).
void gate_up_rows(const WeightView& wg, const WeightView& wu, uint8_t* const* act, const size_t* act_row_bytes,
                  float* h, int64_t m, int max_nr, int64_t n_ff, int64_t r0, int64_t r1) {
  const kernels::TypeKernels* tg = kernels::type_kernels(wg.type);
  const kernels::TypeKernels* tu = kernels::type_kernels(wu.type);
  const int ag = act_index(tg->act_type), au = act_index(tu->act_type);
  const int64_t k = wg.cols;
  const int64_t rb = max_nr == 1 ? r1 - r0
                                 : std::max<int64_t>(1, static_cast<int64_t>((32 * 1024) / (wg.row_bytes + wu.row_bytes)));
  float g[kernels::kMaxDotRows], u[kernels::kMaxDotRows];
  // Decode: four rows of gate and of up at a time (same bits as `dot`, see TypeKernels::dot_w4).
  if (max_nr == 1 && tg->dot_w4 != nullptr && tu->dot_w4 != nullptr) {
    for (int64_t t = 0; t < m; ++t) {
      const uint8_t* ag_t = act[ag] + static_cast<size_t>(t) * act_row_bytes[ag];
      const uint8_t* au_t = act[au] + static_cast<size_t>(t) * act_row_bytes[au];
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) {
        tg->dot_w4(k, wg.row(r), wg.row_bytes, ag_t, g);
        tu->dot_w4(k, wu.row(r), wu.row_bytes, au_t, u);
        for (int i = 0; i < 4; ++i) h[t * n_ff + r + i] = ops::silu(g[i]) * u[i];
      }
      for (; r < r1; ++r) {
        tg->dot(k, wg.row(r), ag_t, act_row_bytes[ag], 1, g);
        tu->dot(k, wu.row(r), au_t, act_row_bytes[au], 1, u);
        h[t * n_ff + r] = ops::silu(g[0]) * u[0];
      }
    }
    return;
  }
  for (int64_t rb0 = r0; rb0 < r1; rb0 += rb) {
    const int64_t rb1 = std::min(r1, rb0 + rb);
    for (int64_t t0 = 0; t0 < m; t0 += max_nr) {
      const int nr = static_cast<int>(std::min<int64_t>(max_nr, m - t0));
      for (int64_t r = rb0; r < rb1; ++r) {
        tg->dot(k, wg.row(r), act[ag] + static_cast<size_t>(t0) * act_row_bytes[ag], act_row_bytes[ag], nr, g);
        tu->dot(k, wu.row(r), act[au] + static_cast<size_t>(t0) * act_row_bytes[au], act_row_bytes[au], nr, u);
        for (int i = 0; i < nr; ++i) h[(t0 + i) * n_ff + r] = ops::silu(g[i]) * u[i];
      }
    }
  }
}

}  // namespace

void Engine::Impl::run_pass(std::span<const BatchToken> batch, MatmulPath path, int ith, int nth) {
  const int64_t m = static_cast<int64_t>(batch.size());
  const int64_t E = cfg.n_embd, Ekv = cfg.n_embd_kv(), F = cfg.n_ff, hd = cfg.head_dim;
  const int64_t n_head = cfg.n_head, n_head_kv = cfg.n_head_kv, group = n_head / n_head_kv;
  float* x = buf<float>(id_x);
  float* xn = buf<float>(id_xn);
  float* q = buf<float>(id_q);
  float* kb = buf<float>(id_k);
  float* vb = buf<float>(id_v);
  float* attn = buf<float>(id_attn);
  float* h = buf<float>(id_h);
  float* local_xn = buf<float>(id_local_xn) + static_cast<size_t>(ith) * static_cast<size_t>(std::max(E, F));
  // A single token is normalised and encoded by every thread itself (no barrier): the fused decode GEMV.
  const bool gemv = m == 1;
  const int max_nr = path == MatmulPath::kGemv ? 1 : kernels::kMaxDotRows;

  // Activation buffers per site: shared (several tokens) or this thread's own (one token).
  uint8_t* act[kSites][kActKinds] = {};
  for (int s = 0; s < kSites; ++s) {
    for (int a = 0; a < kActKinds; ++a) {
      if (gemv && id_local_act[a] >= 0) {
        act[s][a] = buf<uint8_t>(id_local_act[a]) + static_cast<size_t>(ith) * local_act_stride[a];
      } else if (id_act[s][a] >= 0) {
        act[s][a] = buf<uint8_t>(id_act[s][a]);
      }
    }
  }

  // Encodes `src` rows for `site`: for one token each thread encodes the row itself (no barrier);
  // otherwise the rows are split between threads, followed by a barrier.
  auto encode = [&](Site site, const float* src) {
    if (gemv) {
      encode_rows(site, src, 0, 1, act[site]);
    } else {
      auto [t0, t1] = split_range(m, ith, nth);
      encode_rows(site, src, t0, t1, act[site]);
      pool->barrier();
    }
  };
  auto norm_rows = [&](const float* src, const WeightView& w, float* dst) {
    if (gemv) {
      ops::rms_norm(src, w.f32(), dst, E, cfg.rms_eps);
    } else {
      auto [t0, t1] = split_range(m, ith, nth);
      for (int64_t t = t0; t < t1; ++t) ops::rms_norm(src + t * E, w.f32(), dst + t * E, E, cfg.rms_eps);
    }
  };
  // Rows [0, n) of one matmul, in chunks that threads claim as they go, so that a thread preempted by
  // another process (the daemon, a client) does not hold the others up at the next barrier. Every
  // thread makes the same sequence of calls, so call number `site` is the same matmul on all of them.
  // Guided sizes: each claim takes 1/(2 nth) of what is left (at least 64 rows), so the first chunks
  // are long streams and the last ones short enough to even out the threads. Every chunk start costs
  // the decode GEMV a cold prefetch window: fixed chunks of n / (4 nth) rows measured 3% slower 1.1B
  // Q4_0 decode in-process (2 threads). Claims of 1/nth (half the rows at once on 2 threads) were as
  // fast in-process but left a thread preempted by the daemon or a client holding the pass up
  // (SmolLM2 through the daemon 189 vs 197 tok/s); 1/(4 nth) was slower in-process (31.7 vs 33.2). Chunk boundaries are multiples of 64 rows: each row, and each SIMD
  // group of an element-wise op over rows, is computed exactly as with a static split (bit-identical).
  int site = 0;
  auto for_chunks = [&](int64_t n, auto&& fn) {
    INFERD_ASSERT(site < n_chunk_counters);
    std::atomic<int64_t>& next = chunk_counters[static_cast<size_t>(site++)].next;
    int64_t r0 = next.load(std::memory_order_relaxed);
    while (r0 < n) {
      const int64_t chunk = std::max<int64_t>(64, round_up((n - r0 + 2 * nth - 1) / (2 * nth), 64));
      if (next.compare_exchange_weak(r0, r0 + chunk, std::memory_order_relaxed)) {
        fn(r0, std::min(n, r0 + chunk));
        r0 = next.load(std::memory_order_relaxed);
      }
    }
  };
  auto matmul = [&](const MatmulJob& j) {
    for_chunks(j.w->rows, [&](int64_t r0, int64_t r1) { matmul_rows(j, m, max_nr, r0, r1); });
  };

  // Embeddings, or the previous pipeline stage's hidden states.
  {
    auto [t0, t1] = split_range(m, ith, nth);
    for (int64_t t = t0; t < t1; ++t) {
      if (opt.first_layer == 0) {
        embd_kernels->to_float(model->token_embd().row(batch[static_cast<size_t>(t)].token), x + t * E, E);
      } else {
        std::memcpy(x + t * E, hidden_in + t * E, static_cast<size_t>(E) * sizeof(float));
      }
    }
    pool->barrier();
  }

  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t kv_pad = key.kv_pad;
  float* scores = buf<float>(id_scores) + static_cast<size_t>(ith) * static_cast<size_t>(kv_pad);

  for (int l = opt.first_layer; l < opt.end_layer; ++l) {
    const LayerWeights& lw = model->layer(l);
    const int32_t kl = l - opt.first_layer;  // the layer's index in this stage's cache
    // Attention block: norm, encode, Q/K/V.
    float* xn_a = gemv ? local_xn : xn;
    norm_rows(x, lw.attn_norm, xn_a);
    encode(kSiteAttnIn, xn_a);
    const size_t* rb_attn = sites[kSiteAttnIn].row_bytes;
    matmul({&lw.wq, act[kSiteAttnIn], rb_attn, q, E, false, lw.bq.present() ? lw.bq.f32() : nullptr});
    matmul({&lw.wk, act[kSiteAttnIn], rb_attn, kb, Ekv, false, lw.bk.present() ? lw.bk.f32() : nullptr});
    matmul({&lw.wv, act[kSiteAttnIn], rb_attn, vb, Ekv, false, lw.bv.present() ? lw.bv.f32() : nullptr});
    pool->barrier();

    // RoPE on Q and K; K and V rows go straight into the cache (sub-tensor views).
    {
      const int64_t units = m * (n_head + n_head_kv);
      auto [u0, u1] = split_range(units, ith, nth);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = u / (n_head + n_head_kv), hh = u % (n_head + n_head_kv);
        const BatchToken& bt = batch[static_cast<size_t>(t)];
        if (hh < n_head) {
          float* qh = q + t * E + hh * hd;
          ops::rope_head(qh, hd, bt.pos, cfg.rope_base, cfg.rope_style);
          INFERD_ASSERT(hd <= ops::kMaxHeadDim);
          fp16_t qh16[ops::kMaxHeadDim];
          kernels::fp32_to_fp16_row(qh, qh16, hd);  // Q meets the F16 K cache as F16, as in ggml
          kernels::fp16_to_fp32_row(qh16, qh, hd);
        } else {
          const int32_t kvh = static_cast<int32_t>(hh - n_head);
          float* kh = kb + t * Ekv + kvh * hd;
          ops::rope_head(kh, hd, bt.pos, cfg.rope_base, cfg.rope_style);
          kernels::fp32_to_fp16_row(kh, kv->k(bt.slot, kl, kvh).row(bt.pos), hd);
          kernels::fp32_to_fp16_row(vb + t * Ekv + kvh * hd, kv->v(bt.slot, kl, kvh).row(bt.pos), hd);
        }
      }
      pool->barrier();
    }

    // Attention over the padded KV length; positions past the token's own are masked.
    {
      const int64_t units = m * n_head;
      auto [u0, u1] = split_range(units, ith, nth);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = u / n_head, hh = u % n_head;
        const BatchToken& bt = batch[static_cast<size_t>(t)];
        const int32_t kvh = static_cast<int32_t>(hh / group);
        const KvCache::View kc = kv->k(bt.slot, kl, kvh), vc = kv->v(bt.slot, kl, kvh);
        ops::attention_head(q + t * E + hh * hd, kc, vc, hd, bt.pos + 1, kq_scale, scores,
                            attn + t * E + hh * hd);
      }
      pool->barrier();
    }

    // Output projection, residual add fused into the matmul's write.
    encode(kSiteWoIn, attn);
    matmul({&lw.wo, act[kSiteWoIn], sites[kSiteWoIn].row_bytes, x, E, true, nullptr});
    pool->barrier();

    // FFN: norm, encode, gate/up with SwiGLU fused, down with the residual add fused.
    float* xn_f = gemv ? local_xn : xn;
    norm_rows(x, lw.ffn_norm, xn_f);
    encode(kSiteFfnIn, xn_f);
    {
      const bool tiled = max_nr > 1 && kernels::gemm_kernel(lw.w_gate.type) && kernels::gemm_kernel(lw.w_up.type);
      for_chunks(F, [&](int64_t r0, int64_t r1) {
        if (tiled) {
          // Tiled GEMMs for gate and up, then SwiGLU over this chunk's columns.
          float* u = buf<float>(id_u);
          const size_t* rb_ffn = sites[kSiteFfnIn].row_bytes;
          matmul_rows({&lw.w_gate, act[kSiteFfnIn], rb_ffn, h, F, false, nullptr}, m, max_nr, r0, r1);
          matmul_rows({&lw.w_up, act[kSiteFfnIn], rb_ffn, u, F, false, nullptr}, m, max_nr, r0, r1);
          for (int64_t t = 0; t < m; ++t) kernels::swiglu(r1 - r0, h + t * F + r0, u + t * F + r0, h + t * F + r0);
        } else {
          gate_up_rows(lw.w_gate, lw.w_up, act[kSiteFfnIn], sites[kSiteFfnIn].row_bytes, h, m, max_nr, F, r0, r1);
        }
      });
      pool->barrier();
    }
    encode(kSiteDownIn, h);
    matmul({&lw.w_down, act[kSiteDownIn], sites[kSiteDownIn].row_bytes, x, E, true, nullptr});
    pool->barrier();
  }

  // A stage before the last hands its hidden states on.
  if (opt.end_layer < cfg.n_layer) {
    auto [t0, t1] = split_range(m, ith, nth);
    std::memcpy(hidden_out + t0 * E, x + t0 * E, static_cast<size_t>((t1 - t0) * E) * sizeof(float));
    return;
  }

  // Output: final norm and projection of the tokens whose logits are wanted.
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  if (n_out == 0) return;
  float* xo = buf<float>(id_xo);
  {
    auto [o0, o1] = split_range(n_out, ith, nth);
    for (int64_t o = o0; o < o1; ++o) {
      ops::rms_norm(x + out_rows[static_cast<size_t>(o)] * E, model->output_norm().f32(), xo + o * E, E, cfg.rms_eps);
    }
    pool->barrier();
    // The output rows are encoded into the shared buffers on both paths (there may be several).
    uint8_t* out_act[kActKinds] = {};
    for (int a = 0; a < kActKinds; ++a) {
      out_act[a] = id_act[kSiteOutIn][a] >= 0 ? buf<uint8_t>(id_act[kSiteOutIn][a]) : nullptr;
    }
    encode_rows(kSiteOutIn, xo, o0, o1, out_act);
    pool->barrier();
    const WeightView& wout = model->output();
    for_chunks(wout.rows, [&](int64_t r0, int64_t r1) {
      matmul_rows({&wout, out_act, sites[kSiteOutIn].row_bytes, logits.data(), cfg.n_vocab, false, nullptr}, n_out,
                  max_nr, r0, r1);
    });
  }
}

Result<std::span<const float>> Engine::forward(std::span<const BatchToken> batch, std::span<const float> hidden_in) {
  Impl& I = *impl_;
  const ModelConfig& cfg = I.cfg;
  if (batch.empty() || static_cast<int64_t>(batch.size()) > I.opt.n_ubatch) {
    return make_error(Code::kInvalidArgument, "a batch must hold 1 to %d tokens, got %zu", I.opt.n_ubatch,
                      batch.size());
  }
  const bool first = I.opt.first_layer == 0, last = I.opt.end_layer == cfg.n_layer;
  const size_t hidden_floats = batch.size() * static_cast<size_t>(cfg.n_embd);
  if (!first && hidden_in.size() != hidden_floats) {
    return make_error(Code::kInvalidArgument, "a stage starting at layer %d needs %zu hidden-state floats, got %zu",
                      I.opt.first_layer, hidden_floats, hidden_in.size());
  }
  // Validate everything before touching the cache.
  std::vector<int32_t> next = I.slot_len;
  int64_t n_out = 0, max_len = 0;
  for (const BatchToken& bt : batch) {
    if (bt.token < 0 || bt.token >= cfg.n_vocab) {
      return make_error(Code::kInvalidArgument, "token id %d is out of range [0, %d)", bt.token, cfg.n_vocab);
    }
    if (bt.slot < 0 || bt.slot >= I.opt.n_slots) {
      return make_error(Code::kInvalidArgument, "slot %d is out of range [0, %d)", bt.slot, I.opt.n_slots);
    }
    if (bt.pos >= I.opt.n_ctx) {
      return make_error(Code::kOutOfRange, "position %d is past the context size %d of slot %d", bt.pos,
                        I.opt.n_ctx, bt.slot);
    }
    if (bt.pos != next[static_cast<size_t>(bt.slot)]) {
      return make_error(Code::kInvalidArgument, "slot %d: token at position %d, but the sequence continues at %d",
                        bt.slot, bt.pos, next[static_cast<size_t>(bt.slot)]);
    }
    next[static_cast<size_t>(bt.slot)] = bt.pos + 1;
    max_len = std::max<int64_t>(max_len, bt.pos + 1);
    n_out += bt.logits && last ? 1 : 0;
  }

  const MatmulPath path = I.forced ? I.forced_path : choose_matmul_path(static_cast<int64_t>(batch.size()));
  I.ensure_plan(static_cast<int64_t>(batch.size()), n_out, round_up(max_len, I.opt.pad_step));
  I.logits.resize(static_cast<size_t>(n_out) * static_cast<size_t>(cfg.n_vocab));
  I.out_rows.clear();
  for (size_t t = 0; t < batch.size() && last; ++t) {
    if (batch[t].logits) I.out_rows.push_back(static_cast<int64_t>(t));
  }
  if (!last) I.hidden.resize(hidden_floats);
  I.hidden_in = hidden_in.data();
  I.hidden_out = I.hidden.data();
  for (int c = 0; c < I.n_chunk_counters; ++c) I.chunk_counters[static_cast<size_t>(c)].next.store(0, std::memory_order_relaxed);
  I.pool->run([&](int ith, int nth) { I.run_pass(batch, path, ith, nth); });

  I.slot_len = std::move(next);
  I.stats.forward_calls++;
  I.stats.tokens += static_cast<int64_t>(batch.size());
  (path == MatmulPath::kGemv ? I.stats.gemv_passes : I.stats.gemm_passes)++;
  if (!last) return std::span<const float>(I.hidden);
  return std::span<const float>(I.logits);
}

Result<std::span<const float>> Engine::eval(int32_t slot, std::span<const int32_t> tokens, bool all_logits) {
  Impl& I = *impl_;
  if (I.opt.first_layer != 0 || I.opt.end_layer != I.cfg.n_layer) {
    return make_error(Code::kInvalidArgument, "eval() runs whole models; a pipeline stage is driven by forward()");
  }
  if (slot < 0 || slot >= I.opt.n_slots) {
    return make_error(Code::kInvalidArgument, "slot %d is out of range [0, %d)", slot, I.opt.n_slots);
  }
  if (tokens.empty()) return make_error(Code::kInvalidArgument, "nothing to evaluate: no tokens");
  const int64_t start = I.slot_len[static_cast<size_t>(slot)];
  if (start + static_cast<int64_t>(tokens.size()) > I.opt.n_ctx) {
    return make_error(Code::kOutOfRange, "%lld tokens after %lld already in slot %d exceed the context size %d",
                      static_cast<long long>(tokens.size()), static_cast<long long>(start), slot, I.opt.n_ctx);
  }
  const size_t nv = static_cast<size_t>(I.cfg.n_vocab);
  if (all_logits) I.all_logits.resize(tokens.size() * nv);
  std::vector<BatchToken> batch;
  std::span<const float> last;
  for (size_t i0 = 0; i0 < tokens.size(); i0 += static_cast<size_t>(I.opt.n_ubatch)) {
    const size_t i1 = std::min(tokens.size(), i0 + static_cast<size_t>(I.opt.n_ubatch));
    batch.clear();
    for (size_t i = i0; i < i1; ++i) {
      batch.push_back(BatchToken{tokens[i], slot, static_cast<int32_t>(start + static_cast<int64_t>(i)),
                                 all_logits || i + 1 == tokens.size()});
    }
    auto r = forward(batch);
    if (!r) return r.status();
    if (all_logits) std::copy(r->begin(), r->end(), I.all_logits.begin() + static_cast<std::ptrdiff_t>(i0 * nv));
    last = r.value();
  }
  if (all_logits) return std::span<const float>(I.all_logits);
  return last;
}

void Engine::clear_slot(int32_t slot) { truncate_slot(slot, 0); }

void Engine::truncate_slot(int32_t slot, int32_t length) {
  INFERD_ASSERT(slot >= 0 && slot < impl_->opt.n_slots);
  INFERD_ASSERT(length >= 0 && length <= impl_->slot_len[static_cast<size_t>(slot)]);
  impl_->slot_len[static_cast<size_t>(slot)] = length;
}

int32_t Engine::slot_length(int32_t slot) const {
  INFERD_ASSERT(slot >= 0 && slot < impl_->opt.n_slots);
  return impl_->slot_len[static_cast<size_t>(slot)];
}

const EngineStats& Engine::stats() const { return impl_->stats; }

std::string Engine::plan_report() const { return impl_->plan.to_string(); }

void Engine::force_matmul_path(const MatmulPath* path) {
  impl_->forced = path != nullptr;
  if (path) impl_->forced_path = *path;
}

}  // namespace inferd
