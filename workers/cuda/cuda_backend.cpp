#include "inferd/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <unistd.h>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/cuda.h"
#include "inferd/rope_table.h"

namespace inferd::cuda {

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

Status cuda_status(cudaError_t e, const std::string& what) {
  const Code code = e == cudaErrorMemoryAllocation ? Code::kOutOfRange : Code::kFailed;
  return Status(code, "CUDA error in " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define INFERD_CUDA_TRY(expr, what)                   \
  do {                                                \
    const cudaError_t err_ = (expr);                  \
    if (err_ != cudaSuccess) return cuda_status(err_, what); \
  } while (0)

// Device memory, owned.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(p_, o.p_);
      std::swap(bytes_, o.bytes_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static Result<DeviceBuffer> allocate(size_t bytes, const std::string& what) {
    DeviceBuffer b;
    // Rounded up to 16 bytes: the staged GEMVs read a matrix's last row as whole 16-byte vectors (cuda.h).
    const cudaError_t e = cudaMalloc(&b.p_, (std::max<size_t>(bytes, 16) + 15) / 16 * 16);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      return Status(Code::kOutOfRange, "out of device memory: " + what + " needs " + mib(bytes) + ", " + mib(free_b) +
                                           " of " + mib(total_b) + " free");
    }
    b.bytes_ = bytes;
    return b;
  }
  void reset() {
    if (p_ != nullptr) (void)cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

WType wtype(DType t) { return static_cast<WType>(static_cast<uint32_t>(t)); }

// An instantiated CUDA graph, owned.
class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(cudaGraphExec_t e) : e_(e) {}
  ~GraphExec() {
    if (e_ != nullptr) (void)cudaGraphExecDestroy(e_);
  }
  GraphExec(GraphExec&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  cudaGraphExec_t get() const { return e_; }

 private:
  cudaGraphExec_t e_ = nullptr;
};

bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown: return true;
    default: return false;
  }
}

}  // namespace

const char* matmul_path_name(MatmulPath p) {
  switch (p) {
    case MatmulPath::kGemv: return "gemv";
    case MatmulPath::kTensorCores: return "tensor_cores";
  }
  return "?";
}

const char* activations_name(Activations a) { return a == Activations::kQ8 ? "q8" : "float"; }

const char* numerics_name(Numerics n) { return n == Numerics::kExact ? "exact" : "float"; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Result<DeviceInfo> query_device(int index) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(Code::kNotFound, std::string("no CUDA device: ") + cudaGetErrorString(e));
  }
  if (n == 0) return Status(Code::kNotFound, "no CUDA device: the runtime sees none");
  if (index < 0 || index >= n) {
    return make_error(Code::kNotFound, "CUDA device %d does not exist (this machine has %d)", index, n);
  }
  cudaDeviceProp p{};
  INFERD_CUDA_TRY(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sms = p.multiProcessorCount;
  d.total_bytes = p.totalGlobalMem;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) {
    d.driver = std::to_string(driver / 1000) + "." + std::to_string((driver % 1000) / 10);
  }
  return d;
}

struct CudaBackend::Impl {
  CudaOptions opt;
  DeviceInfo info;
  cudaStream_t stream = nullptr;
  CudaStats stats;
  BackendShape shape;
  bool broken = false;  // a sticky error: the context is unusable
  std::string broken_reason;

  // Weights: one device copy per view (a tied embedding serves the lookup and the projection).
  std::map<const WeightView*, DeviceBuffer> weights;
  // Activations: a pool of buffers; each graph tensor's home is one of them (-1: none).
  std::vector<DeviceBuffer> pool;
  std::vector<int> home;
  std::vector<int> tmp_a, tmp_b;  // per node: matmul_swiglu's / matmul_geglu's gate and up scratch
  std::vector<DeviceBuffer> caches;  // per layer of the graph
  KvLayout kv;
  // The step's block tables ([n_slots][blocks_per_slot] int32, StepIO::kv_table) on the device, and what
  // they hold (empty: nothing uploaded since prepare()). CUDA graphs capture the buffer's address.
  DeviceBuffer kv_table;
  std::vector<int32_t> host_kv_table;
  // Quantized matmul inputs (Activations::kQ8): a buffer per kind, and the tensor it holds this step.
  DeviceBuffer quant[3];
  TensorId quant_holds[3] = {graph::kNone, graph::kNone, graph::kNone};
  // The same inputs as the integer GEMV reads them (quantize_q8_input: codes, scales and sums), for the
  // matrices it reads (q8_gemv()), and the tensor it holds this step.
  DeviceBuffer q8_codes;
  TensorId q8_codes_hold = graph::kNone;
  // Exact numerics: the quantized matmul inputs (one buffer for both kinds, the tensor and kind it holds)
  // and attention's scores.
  DeviceBuffer exact_act, scores;
  // Float numerics with CudaOptions::split_attention: the attention parts of split_tokens tokens.
  DeviceBuffer split_parts;
  int32_t split_tokens = 0;
  TensorId exact_holds = graph::kNone;
  ActQuant exact_holds_kind = ActQuant::kNone;
  int32_t score_tokens = 0;
  bool exact() const { return opt.numerics == Numerics::kExact; }  // resolved by create()
  std::string graphs_text() const {
    if (!opt.graphs) return "off";
    if (stats.graph_captures == 0 && graph_note.empty()) return "on (steps of up to 16 tokens)";
    return std::to_string(stats.graph_captures) + " captured, " + std::to_string(stats.graph_replays) + " steps replayed" +
           (graph_note.empty() ? "" : " (" + graph_note + ")");
  }
  std::string numerics_text() const {
    if (exact()) return "numerics exact (the CPU engine's x86 arithmetic, dp4a integer dots)";
    std::string t = std::string("numerics float, matmul ") + matmul_path_name(opt.matmul) + ", matmul inputs " +
                    activations_name(*opt.activations);
    if (opt.activations == Activations::kQ8 && opt.matmul == MatmulPath::kGemv) {
      t += std::string(" (integer dots on Q4_0/Q4_1/Q8_0/Q4_K") + (opt.q6k_integer ? "/Q6_K" : "") + ": " +
           std::to_string(stats.q8_gemv_matmuls) + " matmuls recorded)";
    }
    if (opt.matmul == MatmulPath::kGemv) {
      t += opt.fuse ? ", fused GEMVs on (" + std::to_string(stats.fused_launches) + " launches recorded)"
                    : ", fused GEMVs off";
    }
    t += opt.split_attention ? ", attention split in " + std::to_string(kAttentionSplits) + " parts"
                             : ", attention unsplit";
    return t;
  }
  // CUDA graphs per step shape (tokens, outputs); a shape whose capture failed runs its kernels directly.
  std::map<std::pair<int32_t, int32_t>, GraphExec> graphs;
  std::set<std::pair<int32_t, int32_t>> uncapturable;
  std::string graph_note;  // why a capture failed, for describe()
  Status run_nodes(const Graph& g, const graph::StepShape& s);
  // RoPE angle tables: one per positions input and distinct (base, frequency scale, factors) of the
  // graph's rope nodes (gemma3's local and global layers: two), the device table and the host one it is
  // computed in; rope_of: each node's table (-1: none).
  struct RopeTable {
    TensorId positions = graph::kNone;
    float base = 0.0f, freq_scale = 1.0f;
    const WeightView* factors = nullptr;
    DeviceBuffer device;
    std::vector<float> host;
  };
  std::vector<RopeTable> rope_tables;
  std::vector<int> rope_of;
  // kernels::gelu_table() on the device, for GeGLU (uploaded by prepare() when the graph has it).
  DeviceBuffer gelu;

  Status fail(cudaError_t e, const std::string& what) {
    if (is_sticky(e)) {
      broken = true;
      broken_reason = cudaGetErrorString(e);
    }
    return cuda_status(e, what);
  }
  Status bind() { return cudaSetDevice(info.index) == cudaSuccess ? Status::ok() : Status(Code::kFailed, "cudaSetDevice failed"); }
  Matrix matrix(const graph::Tensor& t) const {
    const WeightView* w = t.weight;
    return Matrix{wtype(w->type), weights.at(w).get(), w->row_bytes, w->rows, w->cols};
  }
  float* f(TensorId id) const {
    const int h = home[static_cast<size_t>(id)];
    INFERD_ASSERT(h >= 0, "tensor %d has no device home", id);
    return pool[static_cast<size_t>(h)].as<float>();
  }
  const int32_t* ints(TensorId id) const { return reinterpret_cast<const int32_t*>(f(id)); }
  const float* vec(const Graph& g, TensorId id) const {
    if (id == graph::kNone) return nullptr;
    return weights.at(g.tensor(id).weight).as<float>();
  }
  uint16_t* cache(const Graph& g, const Node& n) const {
    return caches[static_cast<size_t>(n.layer - g.first_layer)].as<uint16_t>();
  }
  const int32_t* table() const { return kv_table.as<int32_t>(); }
  // The matmul input `x` of `rows` rows as a matmul with `w` reads it: quantized when the options say so.
  Result<const float*> matmul_input(const Graph& g, TensorId x, int32_t rows, const Matrix& w);
  // Whether a matmul with `w` runs the integer GEMV (q8 inputs, the GEMV path, a matrix it reads), and
  // its input `x` of `rows` rows quantized for it (once per tensor and step).
  bool q8_inputs() const { return !exact() && opt.activations == Activations::kQ8 && opt.matmul == MatmulPath::kGemv; }
  bool q8_gemv(const Matrix& w) const { return q8_inputs() && q8_gemv_applies(w) && integer_type(w.type); }
  // The types whose rows the integer GEMV reads under these options (Q6_K only with q6k_integer).
  bool integer_type(WType type) const { return q8_gemv_type(type) && (type != WType::kQ6_K || opt.q6k_integer); }
  Result<const void*> q8_input(const Graph& g, TensorId x, int32_t rows);
  // y = W x (+ bias, or residual +) with the options' arithmetic.
  Status matmul(const Graph& g, TensorId x, int32_t rows, const Matrix& w, const float* bias, const float* residual,
                float* y);
  Status plan(const Graph& g);
  Status upload_weights(const Graph& g);
  Status run_node(const Graph& g, const Node& n, const graph::StepShape& s, size_t index);
  // Whether the options let steps launch fused GEMVs (CudaOptions::fuse; float numerics, the GEMV); each
  // launch also needs fused_gemv_applies() on its matrices and the input the kernel reads.
  bool fusing() const { return opt.fuse && !exact() && opt.matmul == MatmulPath::kGemv; }
  // Nodes ni, ni + 1, ... that are plain matmuls of one input and weight type and width (Q, K and V),
  // launched as one fused GEMV; returns how many it ran (0: none, the caller runs node ni).
  Result<size_t> run_fused_matmuls(const Graph& g, const graph::StepShape& s, size_t ni);
};

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  if (impl_ && impl_->stream != nullptr) {
    (void)cudaSetDevice(impl_->info.index);
    (void)cudaStreamSynchronize(impl_->stream);
    (void)cudaStreamDestroy(impl_->stream);
  }
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const CudaOptions& given) {
  CudaOptions options = given;
  const bool x86 = kernels::best_isa() != kernels::Isa::kScalar;
  // The exact kernels reproduce the CPU engine in llama.cpp's AVX-512 float order (kernels::GgmlOrder).
  const bool avx512_order = kernels::ggml_order() == kernels::GgmlOrder::kAvx512;
  // ... and its vec_dot matmul order (kernels::MatmulOrder), not the repacked one.
  const bool vec_dot_order = kernels::matmul_order() == kernels::MatmulOrder::kVecDot;
  if (!options.numerics) {
    const bool float_asked = options.matmul != MatmulPath::kGemv || options.activations == Activations::kQ8;
    options.numerics = x86 && avx512_order && vec_dot_order && !float_asked ? Numerics::kExact : Numerics::kFloat;
  }
  if (options.numerics == Numerics::kExact) {
    if (options.matmul != MatmulPath::kGemv || options.activations == Activations::kQ8) {
      return Status(Code::kInvalidArgument,
                    "INFERD_CUDA_NUMERICS (numerics) = 'exact' has its own matmul: it excludes matmul = 'tensor_cores' "
                    "and activations = 'q8'");
    }
    if (!x86) {
      return Status(Code::kUnimplemented,
                    "exact CUDA numerics reproduce the CPU engine's x86 kernels; this CPU runs the scalar ones");
    }
    if (!avx512_order) {
      return Status(Code::kUnimplemented,
                    "exact CUDA numerics reproduce the CPU engine's AVX-512 float order; INFERD_GGML_ORDER=avx2 is set");
    }
    if (!vec_dot_order) {
      return Status(Code::kUnimplemented,
                    "exact CUDA numerics reproduce the CPU engine's vec_dot matmul order, and the matmul order is "
                    "'repacked' (the default): set INFERD_MATMUL_ORDER=vec_dot (daemon: matmul-order = vec_dot)");
    }
  }
  // Float numerics on the GEMV default to 8-bit inputs (the integer GEMV: llama.cpp's arithmetic, and the
  // faster one); exact numerics have their own, tensor cores read float.
  if (!options.activations) {
    options.activations =
        options.numerics == Numerics::kFloat && options.matmul == MatmulPath::kGemv ? Activations::kQ8 : Activations::kFloat;
  }
  auto info = query_device(options.device);
  if (!info) return info.status();
  if (info->cc_major < 7) {
    return make_error(Code::kUnimplemented, "%s has compute capability %d.%d: the CUDA backend needs 7.0 or newer",
                      info->name.c_str(), info->cc_major, info->cc_minor);
  }
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->info = std::move(info).value();
  INFERD_RETURN_IF_ERROR(impl->bind());
  INFERD_CUDA_TRY(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

const DeviceInfo& CudaBackend::device() const { return impl_->info; }
const CudaStats& CudaBackend::stats() const { return impl_->stats; }
bool CudaBackend::healthy() const { return !impl_->broken; }
bool CudaBackend::exact() const { return impl_->exact(); }

BackendMemory CudaBackend::memory() const {
  return BackendMemory{impl_->stats.weight_bytes, impl_->stats.kv_bytes, impl_->stats.activation_bytes};
}

std::string CudaBackend::describe() const {
  const Impl& I = *impl_;
  const DeviceInfo& d = I.info;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "CUDA: %s (sm_%d%d, %d SMs, %.1f GiB, driver %s), weights %s uploaded in %.2f s (%.1f GB/s%s), KV %s, "
                "activations %s, %s, CUDA graphs %s",
                d.name.c_str(), d.cc_major, d.cc_minor, d.sms, static_cast<double>(d.total_bytes) / (1 << 30),
                d.driver.c_str(), mib(I.stats.weight_bytes).c_str(), I.stats.upload_seconds, I.stats.upload_gbps(),
                I.stats.upload_registered ? ", from the registered mapping" : ", pageable", mib(I.stats.kv_bytes).c_str(),
                mib(I.stats.activation_bytes).c_str(), I.numerics_text().c_str(), I.graphs_text().c_str());
  return buf;
}

bool CudaBackend::supports(const Graph& g, const Node& n) const {
  auto type_ok = [&](TensorId w) {
    const graph::Tensor& t = g.tensor(w);
    return t.weight != nullptr && wtype_supported(static_cast<uint32_t>(t.weight->type));
  };
  auto f32 = [&](TensorId w) { return w == graph::kNone || g.tensor(w).weight_type() == DType::kF32; };
  const graph::Heads& h = g.heads;
  switch (n.op) {
    case Op::kEmbed: return type_ok(n.in[1]);
    case Op::kRmsNorm: {  // the row, or each head of it: rows x groups of the weight's width
      const int64_t group = g.tensor(n.in[1]).cols;
      return f32(n.in[1]) && group > 0 && g.tensor(n.in[0]).cols % group == 0;
    }
    case Op::kMatmul: return type_ok(n.in[1]) && f32(n.in[2]);
    case Op::kMatmulAdd: return type_ok(n.in[1]) && f32(n.in[2]);
    case Op::kMatmulSwiglu:
    case Op::kMatmulGeglu: return type_ok(n.in[1]) && type_ok(n.in[2]);
    case Op::kRope:
      return h.head_dim > 0 && h.head_dim % 2 == 0 && g.tensor(n.in[0]).cols % h.head_dim == 0 &&
             (n.rope_factors == nullptr ||
              (n.rope_factors->type == DType::kF32 && n.rope_factors->rows * n.rope_factors->cols == h.head_dim / 2));
    case Op::kKvWrite: return h.head_dim > 0 && h.n_head_kv > 0;
    case Op::kAttention:
      return h.head_dim % 32 == 0 && h.head_dim <= 256 && h.n_head_kv > 0 && h.n_head % h.n_head_kv == 0;
    case Op::kSwiglu:
    case Op::kGeglu:
    case Op::kAdd:
    case Op::kGetRows: return true;
    case Op::kRopeKv: return false;
  }
  return false;
}

// Every weight the graph reads, copied as it is. The views usually lie in one mapping (the shared
// segment): registered read-only, the copies are DMA straight from it.
Status CudaBackend::Impl::upload_weights(const Graph& g) {
  std::vector<const WeightView*> views;
  std::set<const WeightView*> seen;
  size_t total = 0;
  for (const Node& n : g.nodes()) {
    for (TensorId id : n.in) {
      if (id == graph::kNone) continue;
      const graph::Tensor& t = g.tensor(id);
      if (t.kind != graph::TensorKind::kWeight || !seen.insert(t.weight).second) continue;
      views.push_back(t.weight);
      total += static_cast<size_t>(t.weight->rows) * t.weight->row_bytes;
    }
  }
  // Fail before allocating anything when the device cannot hold the weights.
  size_t free_b = 0, total_b = 0;
  INFERD_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (total > free_b) {
    return Status(Code::kOutOfRange, "the weights need " + mib(total) + " of device memory; " + info.name + " has " +
                                         mib(free_b) + " of " + mib(total_b) + " free");
  }
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (const WeightView* v : views) {
    lo = std::min(lo, reinterpret_cast<uintptr_t>(v->data));
    hi = std::max(hi, reinterpret_cast<uintptr_t>(v->data) + static_cast<size_t>(v->rows) * v->row_bytes);
  }
  const auto t0 = std::chrono::steady_clock::now();
  void* registered = nullptr;
  if (!views.empty() && hi - lo <= total + total / 4 + (size_t{1} << 20)) {
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t start = lo / page * page, end = (hi + page - 1) / page * page;
    if (cudaHostRegister(reinterpret_cast<void*>(start), end - start, cudaHostRegisterReadOnly) == cudaSuccess) {
      registered = reinterpret_cast<void*>(start);
    } else {
      (void)cudaGetLastError();  // not registrable (e.g. no read-only registration): pageable copies
    }
  }
  stats.upload_registered = registered != nullptr;
  Status st;
  for (const WeightView* v : views) {
    const size_t bytes = static_cast<size_t>(v->rows) * v->row_bytes;
    auto b = DeviceBuffer::allocate(bytes, "weights");
    if (!b) {
      st = b.status();
      break;
    }
    cudaError_t e = cudaSuccess;
    if (!v->interleaved()) {
      e = cudaMemcpyAsync(b->get(), v->data, bytes, cudaMemcpyHostToDevice, stream);
    } else {
      // Interleaved for the CPU's GEMV (inferd/weight_layout.h): the kernels here read rows, so the matrix
      // goes up in the row layout, a few MiB at a time through a host buffer (synchronous copies: the
      // buffer is reused).
      auto* dst = static_cast<uint8_t*>(b->get());
      for_each_row_layout_piece(v->type, v->layout, v->rows, v->cols, v->data, [&](size_t off, const uint8_t* p, size_t n) {
        e = cudaMemcpy(dst + off, p, n, cudaMemcpyHostToDevice);
        return e == cudaSuccess;
      });
    }
    if (e != cudaSuccess) {
      st = fail(e, "the weight upload");
      break;
    }
    stats.weight_bytes += bytes;
    weights.emplace(v, std::move(b).value());
  }
  const cudaError_t sync = cudaStreamSynchronize(stream);
  if (registered != nullptr) (void)cudaHostUnregister(registered);
  if (st && sync != cudaSuccess) st = fail(sync, "the weight upload");
  stats.upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

// Each tensor's device home: inputs and outputs their own buffers, activations from the pool, a buffer
// going back to the pool once its tensor's last reader has run.
Status CudaBackend::Impl::plan(const Graph& g) {
  const size_t nt = g.tensors().size();
  home.assign(nt, -1);
  tmp_a.assign(g.nodes().size(), -1);
  tmp_b.assign(g.nodes().size(), -1);
  pool.clear();
  std::vector<size_t> sizes;
  std::vector<int> free_list;
  const graph::StepShape widest{shape.max_tokens, shape.max_tokens, 0};
  auto bytes_of = [&](const graph::Tensor& t) {
    return static_cast<size_t>(Graph::rows(t, widest)) * static_cast<size_t>(std::max<int64_t>(t.cols, 1)) * 4;
  };
  auto take = [&](size_t bytes) {
    for (size_t k = 0; k < free_list.size(); ++k) {
      if (sizes[static_cast<size_t>(free_list[k])] == bytes) {
        const int id = free_list[k];
        free_list.erase(free_list.begin() + static_cast<std::ptrdiff_t>(k));
        return id;
      }
    }
    sizes.push_back(bytes);
    return static_cast<int>(sizes.size() - 1);
  };
  std::vector<int> readers(nt, 0);
  for (const Node& n : g.nodes()) {
    for (TensorId id : n.in) {
      if (id != graph::kNone) ++readers[static_cast<size_t>(id)];
    }
  }
  std::vector<bool> pinned(nt, false);  // never returned to the pool: inputs and outputs
  for (TensorId id : g.inputs()) {
    home[static_cast<size_t>(id)] = take(bytes_of(g.tensor(id)));
    pinned[static_cast<size_t>(id)] = true;
  }
  for (TensorId id : g.outputs()) pinned[static_cast<size_t>(id)] = true;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const Node& n = g.nodes()[ni];
    for (int o = 0; o < n.n_out(); ++o) {
      const TensorId id = n.out[static_cast<size_t>(o)];
      const graph::Tensor& t = g.tensor(id);
      if (t.kind == graph::TensorKind::kKvCache) continue;  // the layer's cache
      home[static_cast<size_t>(id)] = take(bytes_of(t));
    }
    if (n.op == Op::kMatmulSwiglu || n.op == Op::kMatmulGeglu) {
      const size_t bytes = bytes_of(g.tensor(n.out[0]));
      tmp_a[ni] = take(bytes);
      tmp_b[ni] = take(bytes);
      free_list.push_back(tmp_a[ni]);
      free_list.push_back(tmp_b[ni]);
    }
    for (TensorId id : n.in) {
      if (id == graph::kNone) continue;
      const size_t i = static_cast<size_t>(id);
      if (--readers[i] == 0 && !pinned[i] && home[i] >= 0 && g.tensor(id).kind == graph::TensorKind::kActivation) {
        free_list.push_back(home[i]);
      }
    }
  }
  size_t need = 0;
  for (size_t b : sizes) need += b;
  size_t free_b = 0, total_b = 0;
  INFERD_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (need > free_b) {
    return Status(Code::kOutOfRange, "the activations of a " + std::to_string(shape.max_tokens) + "-token step need " +
                                         mib(need) + "; the device has " + mib(free_b) + " free");
  }
  for (size_t b : sizes) {
    auto buf = DeviceBuffer::allocate(b, "activations");
    if (!buf) return buf.status();
    pool.push_back(std::move(buf).value());
    stats.activation_bytes += b;
  }
  // A scratch buffer counted with the activations; `scratch_tokens`: how many of a step's tokens fit in 64 MiB
  // of `per_token` bytes (longer steps run in launches of that many).
  const auto scratch = [&](size_t bytes, const char* what, DeviceBuffer* dst) -> Status {
    dst->reset();
    auto buf = DeviceBuffer::allocate(bytes, what);
    if (!buf) return buf.status();
    stats.activation_bytes += buf->bytes();
    *dst = std::move(buf).value();
    return Status::ok();
  };
  const auto scratch_tokens = [&](size_t per_token) {
    return static_cast<int32_t>(std::clamp<size_t>((size_t{64} << 20) / std::max<size_t>(per_token, 1), 1,
                                                   static_cast<size_t>(shape.max_tokens)));
  };
  // Every matmul's weight type and input width (gate and up for the GLU nodes).
  const auto for_each_matmul = [&](auto fn) {
    for (const Node& n : g.nodes()) {
      const bool two = n.op == Op::kMatmulSwiglu || n.op == Op::kMatmulGeglu;
      if (n.op != Op::kMatmul && n.op != Op::kMatmulAdd && !two) continue;
      for (size_t i = 1; i <= (two ? 2u : 1u); ++i) fn(wtype(g.tensor(n.in[i]).weight_type()), g.tensor(n.in[0]).cols);
    }
  };
  const bool has_attention =
      std::any_of(g.nodes().begin(), g.nodes().end(), [](const Node& n) { return n.op == Op::kAttention; });
  // The quantized matmul inputs: the widest input of each kind, for a step of max_tokens.
  q8_codes.reset();
  if (opt.activations == Activations::kQ8) {
    int64_t input_cols[3] = {0, 0, 0}, integer_cols = 0;
    for_each_matmul([&](WType type, int64_t cols) {
      int64_t& kind_cols = input_cols[static_cast<int>(act_quant_for(type))];
      kind_cols = std::max(kind_cols, cols);
      if (integer_type(type)) integer_cols = std::max(integer_cols, cols);
    });
    // The integer GEMV's codes: the input of every matrix it reads (one it cannot read uses quant[] instead).
    if (integer_cols > 0 && opt.matmul == MatmulPath::kGemv) {
      INFERD_RETURN_IF_ERROR(scratch(q8_input_bytes(shape.max_tokens, integer_cols), "8-bit matmul inputs", &q8_codes));
    }
    for (int k = 1; k < 3; ++k) {
      quant[k].reset();
      if (input_cols[k] == 0) continue;
      INFERD_RETURN_IF_ERROR(scratch(static_cast<size_t>(input_cols[k]) * static_cast<size_t>(shape.max_tokens) * 4,
                                     "quantized activations", &quant[k]));
    }
  }
  split_parts.reset();
  split_tokens = 0;
  if (!exact() && opt.split_attention && has_attention) {
    const size_t per_token = attention_split_scratch_floats(g.heads.n_head, g.heads.head_dim, 1) * 4;
    split_tokens = scratch_tokens(per_token);
    INFERD_RETURN_IF_ERROR(scratch(per_token * static_cast<size_t>(split_tokens), "attention parts", &split_parts));
  }
  if (exact()) {
    size_t act_bytes = 0;
    for_each_matmul([&](WType type, int64_t cols) {
      act_bytes = std::max(act_bytes, exact_activation_bytes(type, shape.max_tokens, cols));
    });
    INFERD_RETURN_IF_ERROR(scratch(act_bytes, "quantized activations", &exact_act));
    if (has_attention) {  // attention's scores
      const size_t per_token = attention_exact_scratch_floats(kv, g.heads.n_head, 1) * 4;
      score_tokens = scratch_tokens(per_token);
      INFERD_RETURN_IF_ERROR(scratch(per_token * static_cast<size_t>(score_tokens), "attention scores", &scores));
    }
  }
  return Status::ok();
}

Status CudaBackend::prepare(const Graph& g, const BackendShape& shape) {
  Impl& I = *impl_;
  if (I.broken) return Status(Code::kFailed, "the CUDA device is unusable after an earlier error: " + I.broken_reason);
  INFERD_RETURN_IF_ERROR(I.bind());
  (void)cudaStreamSynchronize(I.stream);
  I.weights.clear();
  I.pool.clear();
  I.caches.clear();
  I.kv_table.reset();
  I.host_kv_table.clear();
  I.graphs.clear();
  I.uncapturable.clear();
  I.graph_note.clear();
  I.rope_tables.clear();
  I.rope_of.clear();
  I.gelu.reset();
  I.exact_act.reset();
  I.scores.reset();
  for (DeviceBuffer& q : I.quant) q.reset();
  I.q8_codes.reset();
  I.split_parts.reset();
  I.stats = CudaStats{};
  I.shape = shape;
  for (const Node& n : g.nodes()) {
    if (!supports(g, n)) {
      return Status(Code::kUnimplemented, std::string("the CUDA backend cannot run ") + graph::op_name(n.op) + " (" +
                                              g.tensor(n.out[0]).name + ")");
    }
  }
  Status st = I.upload_weights(g);
  bool has_cache = false;
  for (const graph::Tensor& t : g.tensors()) has_cache = has_cache || t.kind == graph::TensorKind::kKvCache;
  static_assert(kKvBlockTokens == graph::kKvBlockTokens, "the kernels' KV block is the graph's");
  I.kv = KvLayout{shape.n_blocks, graph::kv_blocks_per_slot(shape.n_ctx), shape.n_ctx, g.heads.n_head_kv,
                  g.heads.head_dim};
  if (st && has_cache) {
    const size_t bytes = I.kv.half_elems() * 2;
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    const size_t need = bytes * static_cast<size_t>(g.end_layer - g.first_layer);
    if (need > free_b) {
      st = Status(Code::kOutOfRange, "the KV cache (" + std::to_string(shape.n_blocks) + " blocks of " +
                                         std::to_string(kKvBlockTokens) + " tokens) needs " + mib(need) +
                                         "; the device has " + mib(free_b) + " free after the weights");
    }
    if (st) {
      auto t = DeviceBuffer::allocate(
          static_cast<size_t>(shape.n_slots) * static_cast<size_t>(I.kv.blocks_per_slot) * sizeof(int32_t),
          "the KV block tables");
      if (t) {
        I.stats.activation_bytes += t->bytes();
        I.kv_table = std::move(t).value();
      } else {
        st = t.status();
      }
    }
    for (int32_t l = g.first_layer; st && l < g.end_layer; ++l) {
      auto c = DeviceBuffer::allocate(bytes, "the KV cache of layer " + std::to_string(l));
      if (!c) {
        st = c.status();
        break;
      }
      const cudaError_t e = cudaMemsetAsync(c->get(), 0, bytes, I.stream);
      if (e != cudaSuccess) st = I.fail(e, "the KV cache");
      I.caches.push_back(std::move(c).value());
      I.stats.kv_bytes += bytes;
    }
  }
  if (st) st = I.plan(g);
  if (st) {
    I.rope_of.assign(g.nodes().size(), -1);
    for (size_t ni = 0; ni < g.nodes().size() && st; ++ni) {
      const Node& n = g.nodes()[ni];
      if (n.op != Op::kRope) continue;
      const float base = g.heads.rope_base_of(n);
      auto same = [&](const Impl::RopeTable& t) {
        return t.positions == n.in[1] && t.base == base && t.freq_scale == n.rope_freq_scale && t.factors == n.rope_factors;
      };
      auto it = std::find_if(I.rope_tables.begin(), I.rope_tables.end(), same);
      I.rope_of[ni] = static_cast<int>(it - I.rope_tables.begin());
      if (it != I.rope_tables.end()) continue;
      auto t = DeviceBuffer::allocate(static_cast<size_t>(shape.max_tokens) * static_cast<size_t>(g.heads.head_dim) * 4,
                                      "RoPE angles");
      if (!t) {
        st = t.status();
        break;
      }
      I.stats.activation_bytes += t->bytes();
      I.rope_tables.push_back(Impl::RopeTable{n.in[1], base, n.rope_freq_scale, n.rope_factors, std::move(t).value(), {}});
    }
  }
  if (st && std::any_of(g.nodes().begin(), g.nodes().end(),
                        [](const Node& n) { return n.op == Op::kGeglu || n.op == Op::kMatmulGeglu; })) {
    auto t = DeviceBuffer::allocate(sizeof(fp16_t) << 16, "the GELU table");
    if (t) {
      I.gelu = std::move(t).value();
      I.stats.weight_bytes += I.gelu.bytes();
      const cudaError_t e = cudaMemcpyAsync(I.gelu.get(), kernels::gelu_table(), I.gelu.bytes(), cudaMemcpyHostToDevice,
                                            I.stream);
      if (e != cudaSuccess) st = I.fail(e, "the GELU table");
    } else {
      st = t.status();
    }
  }
  if (st) {
    const cudaError_t e = cudaStreamSynchronize(I.stream);
    if (e != cudaSuccess) st = I.fail(e, "prepare");
  }
  if (!st) {  // nothing stays allocated
    I.weights.clear();
    I.pool.clear();
    I.caches.clear();
    I.kv_table.reset();
    I.graphs.clear();
    I.rope_tables.clear();
    I.rope_of.clear();
    I.gelu.reset();
    I.exact_act.reset();
    I.scores.reset();
    I.q8_codes.reset();
    I.split_parts.reset();
    const CudaStats kept{};
    I.stats = kept;
  }
  return st;
}

Result<const float*> CudaBackend::Impl::matmul_input(const Graph& g, TensorId x, int32_t rows, const Matrix& w) {
  const ActQuant kind = opt.activations == Activations::kQ8 ? act_quant_for(w.type) : ActQuant::kNone;
  if (kind == ActQuant::kNone) return static_cast<const float*>(f(x));
  const int k = static_cast<int>(kind);
  float* q = quant[k].as<float>();
  if (quant_holds[k] != x) {
    const cudaError_t e = quantize_activations(kind, f(x), rows, g.tensor(x).cols, q, stream);
    if (e != cudaSuccess) return fail(e, "quantize_activations");
    quant_holds[k] = x;
  }
  return static_cast<const float*>(q);
}

Result<const void*> CudaBackend::Impl::q8_input(const Graph& g, TensorId x, int32_t rows) {
  if (q8_codes_hold != x) {
    const cudaError_t e = quantize_q8_input(f(x), rows, g.tensor(x).cols, q8_codes.get(), stream);
    if (e != cudaSuccess) return fail(e, "quantize_q8_input");
    q8_codes_hold = x;
  }
  return static_cast<const void*>(q8_codes.get());
}

Status CudaBackend::Impl::matmul(const Graph& g, TensorId x, int32_t rows, const Matrix& w, const float* bias,
                                 const float* residual, float* y) {
  cudaError_t e = cudaSuccess;
  if (exact()) {
    ++stats.exact_matmuls;
    const ActQuant kind = act_quant_for(w.type);
    const void* act = f(x);
    if (kind != ActQuant::kNone) {
      if (exact_holds != x || exact_holds_kind != kind) {
        e = quantize_exact(kind, f(x), rows, g.tensor(x).cols, exact_act.get(), stream);
        if (e != cudaSuccess) return fail(e, "quantize_exact");
        exact_holds = x;
        exact_holds_kind = kind;
      }
      act = exact_act.get();
    }
    e = matmul_exact(w, act, rows, bias, residual, y, stream);
    return e == cudaSuccess ? Status::ok() : fail(e, "matmul_exact");
  }
  ++(opt.matmul == MatmulPath::kGemv ? stats.gemv_matmuls : stats.tensor_core_matmuls);
  if (q8_gemv(w)) {
    auto xq = q8_input(g, x, rows);
    if (!xq) return xq.status();
    ++stats.q8_gemv_matmuls;
    e = matmul_q8(w, xq.value(), rows, bias, residual, y, stream);
    return e == cudaSuccess ? Status::ok() : fail(e, "matmul_q8");
  }
  auto in = matmul_input(g, x, rows, w);
  if (!in) return in.status();
  e = matmul_path(opt.matmul == MatmulPath::kGemv ? 1 : 2, w, in.value(), rows, bias, residual, y, stream);
  return e == cudaSuccess ? Status::ok() : fail(e, "matmul");
}

Status CudaBackend::Impl::run_node(const Graph& g, const Node& n, const graph::StepShape& s, size_t index) {
  const graph::Tensor& out = g.tensor(n.out[0]);
  const int32_t rows = static_cast<int32_t>(Graph::rows(out, s));
  const int64_t cols = out.cols;
  const bool ex = exact();
  cudaError_t e = cudaSuccess;
  switch (n.op) {
    case Op::kEmbed: {
      const Matrix w = matrix(g.tensor(n.in[1]));
      e = ex ? get_rows_exact(w, ints(n.in[0]), rows, f(n.out[0]), stream)
             : get_rows(w, ints(n.in[0]), rows, f(n.out[0]), stream);
      if (e == cudaSuccess && n.scale != 0.0f) {  // gemma3: the rows times sqrt(n_embd), as the CPU
        e = scale(f(n.out[0]), static_cast<int64_t>(rows) * cols, n.scale, f(n.out[0]), stream);
      }
      break;
    }
    case Op::kRmsNorm: {  // each group of the weight's width (a row, or a head: qwen3's Q/K norms) is a row
      const int64_t group = g.tensor(n.in[1]).cols;
      const int32_t norm_rows = static_cast<int32_t>(rows * (cols / group));
      if (!ex && q8_inputs() && group == cols && cols % 64 == 0 && q8_codes.bytes() >= q8_input_bytes(rows, cols)) {
        // The norm's output quantized in the same launch for the integer GEMVs that read it next.
        e = rms_norm_q8(f(n.in[0]), vec(g, n.in[1]), rows, cols, n.eps, f(n.out[0]), q8_codes.get(), stream);
        if (e == cudaSuccess) q8_codes_hold = n.out[0];
        break;
      }
      e = ex ? rms_norm_exact(f(n.in[0]), vec(g, n.in[1]), norm_rows, group, n.eps, f(n.out[0]), stream)
             : rms_norm(f(n.in[0]), vec(g, n.in[1]), norm_rows, group, n.eps, f(n.out[0]), stream);
      break;
    }
    case Op::kMatmul:
    case Op::kMatmulAdd:
      return matmul(g, n.in[0], rows, matrix(g.tensor(n.in[1])), vec(g, n.in[2]),
                    n.op == Op::kMatmulAdd ? f(n.in[3]) : nullptr, f(n.out[0]));
    case Op::kMatmulSwiglu:
    case Op::kMatmulGeglu: {
      const Matrix wg = matrix(g.tensor(n.in[1])), wu = matrix(g.tensor(n.in[2]));
      if (fusing() && q8_gemv(wg) && q8_gemv(wu) && wg.type == wu.type && wg.rows == wu.rows &&
          wg.row_bytes == wu.row_bytes) {
        auto xq = q8_input(g, n.in[0], rows);
        if (!xq) return xq.status();
        stats.gemv_matmuls += 2;
        stats.q8_gemv_matmuls += 2;
        ++stats.fused_launches;
        e = matmul_glu_q8(n.op == Op::kMatmulGeglu ? Glu::kGelu : Glu::kSilu, wg, wu, xq.value(), rows,
                          gelu.as<uint16_t>(), f(n.out[0]), stream);
        break;
      }
      if (fusing() && wg.type == wu.type && wg.rows == wu.rows && wg.cols == wu.cols) {
        // The input the kernel reads (quantized with q8 inputs; kept for the separate matmuls otherwise).
        auto in = matmul_input(g, n.in[0], rows, wg);
        if (!in) return in.status();
        if (fused_gemv_applies(wg, in.value(), rows) && fused_gemv_applies(wu, in.value(), rows)) {
          stats.gemv_matmuls += 2;
          ++stats.fused_launches;
          e = matmul_glu(n.op == Op::kMatmulGeglu ? Glu::kGelu : Glu::kSilu, wg, wu, in.value(), rows,
                         gelu.as<uint16_t>(), f(n.out[0]), stream);
          break;
        }
      }
      float* a = pool[static_cast<size_t>(tmp_a[index])].as<float>();
      float* b = pool[static_cast<size_t>(tmp_b[index])].as<float>();
      INFERD_RETURN_IF_ERROR(matmul(g, n.in[0], rows, wg, nullptr, nullptr, a));
      INFERD_RETURN_IF_ERROR(matmul(g, n.in[0], rows, wu, nullptr, nullptr, b));
      const int64_t count = static_cast<int64_t>(rows) * cols;
      if (n.op == Op::kMatmulGeglu) {
        e = geglu(a, b, count, gelu.as<uint16_t>(), f(n.out[0]), stream);
      } else {
        e = ex ? swiglu_exact(a, b, count, f(n.out[0]), stream) : swiglu(a, b, count, f(n.out[0]), stream);
      }
      break;
    }
    case Op::kRope: {
      const int32_t hd = g.heads.head_dim;
      e = rope(f(n.in[0]), rows, static_cast<int32_t>(cols / hd), hd,
               rope_tables[static_cast<size_t>(rope_of[index])].device.as<float>(),
               g.heads.rope_style == RopeStyle::kNeox, f(n.out[0]), stream);
      break;
    }
    case Op::kKvWrite:
      e = kv_write(kv, f(n.in[0]), f(n.in[1]), ints(n.in[2]), ints(n.in[3]), table(), s.tokens, cache(g, n), stream);
      break;
    case Op::kAttention: {
      // An explicit scale multiplies Q before its rounding (gemma3, phi3); the default scales the scores.
      const float kq_scale = n.scale > 0.0f ? 1.0f : g.heads.kq_scale(n);
      e = ex ? attention_exact(kv, g.heads.n_head, f(n.in[0]), ints(n.in[2]), ints(n.in[3]), table(), s.tokens,
                               kq_scale, n.scale, n.window, cache(g, n), scores.as<float>(), score_tokens, f(n.out[0]),
                               stream)
         : opt.split_attention
             ? attention_split(kv, g.heads.n_head, f(n.in[0]), ints(n.in[2]), ints(n.in[3]), table(), s.tokens, kq_scale,
                               n.scale, n.window, cache(g, n), split_parts.as<float>(), split_tokens, f(n.out[0]),
                               stream)
             : attention(kv, g.heads.n_head, f(n.in[0]), ints(n.in[2]), ints(n.in[3]), table(), s.tokens, kq_scale,
                         n.scale, n.window, cache(g, n), f(n.out[0]), stream);
      break;
    }
    case Op::kSwiglu: {
      const int64_t count = static_cast<int64_t>(rows) * cols;
      e = ex ? swiglu_exact(f(n.in[0]), f(n.in[1]), count, f(n.out[0]), stream)
             : swiglu(f(n.in[0]), f(n.in[1]), count, f(n.out[0]), stream);
      break;
    }
    case Op::kAdd: e = add(f(n.in[0]), f(n.in[1]), static_cast<int64_t>(rows) * cols, f(n.out[0]), stream); break;
    case Op::kGetRows: e = gather(f(n.in[0]), cols, ints(n.in[1]), rows, f(n.out[0]), stream); break;
    case Op::kGeglu:
      e = geglu(f(n.in[0]), f(n.in[1]), static_cast<int64_t>(rows) * cols, gelu.as<uint16_t>(), f(n.out[0]), stream);
      break;
    case Op::kRopeKv: return Status(Code::kUnimplemented, "the CUDA backend does not fuse rope_kv");
  }
  if (e != cudaSuccess) return fail(e, graph::op_name(n.op));
  return Status::ok();
}

// The step's kernels, in graph order, on the stream (launched, or recorded while capturing).
Status CudaBackend::Impl::run_nodes(const Graph& g, const graph::StepShape& s) {
  for (TensorId& held : quant_holds) held = graph::kNone;
  q8_codes_hold = graph::kNone;
  exact_holds = graph::kNone;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const Node& n = g.nodes()[ni];
    if (g.tensor(n.out[0]).rows == graph::Rows::kOutputs && s.outputs == 0) continue;  // no logits wanted
    Result<size_t> fused = run_fused_matmuls(g, s, ni);
    Status st = fused ? Status::ok() : fused.status();
    if (st && fused.value() > 0) {
      ni += fused.value() - 1;
    } else if (st) {
      st = run_node(g, n, s, ni);
    }
    if (!st) return n.layer >= 0 ? st.with_context("layer " + std::to_string(n.layer)) : st;
  }
  return Status::ok();
}

Result<size_t> CudaBackend::Impl::run_fused_matmuls(const Graph& g, const graph::StepShape& s, size_t ni) {
  const auto& nodes = g.nodes();
  const Node& first = nodes[ni];
  if (first.op != Op::kMatmul || !fusing()) return size_t{0};
  const int32_t rows = static_cast<int32_t>(Graph::rows(g.tensor(first.out[0]), s));
  MatmulOut outs[kMaxFused];
  size_t count = 0;
  for (size_t j = ni; j < nodes.size() && count < static_cast<size_t>(kMaxFused); ++j) {
    const Node& n = nodes[j];
    if (n.op != Op::kMatmul || n.in[0] != first.in[0] || Graph::rows(g.tensor(n.out[0]), s) != rows) break;
    const Matrix w = matrix(g.tensor(n.in[1]));
    if (count > 0 && (w.type != outs[0].w.type || w.cols != outs[0].w.cols || w.row_bytes != outs[0].w.row_bytes)) {
      break;
    }
    outs[count++] = MatmulOut{w, vec(g, n.in[2]), f(n.out[0])};
  }
  if (count < 2) return size_t{0};
  bool integer = true;
  for (size_t i = 0; i < count; ++i) integer = integer && q8_gemv(outs[i].w);
  if (integer) {
    auto xq = q8_input(g, first.in[0], rows);
    if (!xq) return xq.status();
    stats.gemv_matmuls += static_cast<int64_t>(count);
    stats.q8_gemv_matmuls += static_cast<int64_t>(count);
    ++stats.fused_launches;
    const cudaError_t e = matmul_many_q8(outs, static_cast<int>(count), xq.value(), rows, stream);
    if (e != cudaSuccess) return fail(e, "matmul_many_q8");
    return count;
  }
  // The input the kernel reads (quantized with q8 inputs: then cached for the separate matmuls if these
  // cannot be fused after all).
  auto in = matmul_input(g, first.in[0], rows, outs[0].w);
  if (!in) return in.status();
  for (size_t i = 0; i < count; ++i) {
    if (!fused_gemv_applies(outs[i].w, in.value(), rows)) return size_t{0};
  }
  stats.gemv_matmuls += static_cast<int64_t>(count);
  ++stats.fused_launches;
  const cudaError_t e = matmul_many(outs, static_cast<int>(count), in.value(), rows, stream);
  if (e != cudaSuccess) return fail(e, "matmul_many");
  return count;
}

Status CudaBackend::compute(const Graph& g, graph::StepIO& io) {
  Impl& I = *impl_;
  if (I.broken) return Status(Code::kFailed, "the CUDA device is unusable after an earlier error: " + I.broken_reason);
  INFERD_RETURN_IF_ERROR(I.bind());
  const graph::StepShape& s = io.shape;
  INFERD_ASSERT(s.tokens >= 1 && s.tokens <= I.shape.max_tokens && s.outputs <= s.tokens, "step of %d tokens", s.tokens);
  // The step's inputs. The host data may change once compute() returns: it waits for the copies.
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const TensorId id = g.inputs()[i];
    const graph::HostTensor& h = io.inputs[i];
    const size_t bytes = h.count * 4;
    if (bytes == 0) continue;
    INFERD_ASSERT(bytes <= I.pool[static_cast<size_t>(I.home[static_cast<size_t>(id)])].bytes(), "input %d too large", id);
    const cudaError_t e = cudaMemcpyAsync(I.f(id), h.data, bytes, cudaMemcpyHostToDevice, I.stream);
    if (e != cudaSuccess) return I.fail(e, "the step's inputs");
    bool angles = false;
    for (Impl::RopeTable& table : I.rope_tables) {
      if (table.positions != id) continue;
      // The rotary angles as the CPU computes them (the node's base, frequency scale and factors).
      table.host = rope_table(std::span<const int32_t>(static_cast<const int32_t*>(h.data), h.count), g.heads.head_dim,
                              table.base, table.freq_scale, table.factors != nullptr ? table.factors->f32() : nullptr);
      const cudaError_t et = cudaMemcpyAsync(table.device.get(), table.host.data(), table.host.size() * 4,
                                             cudaMemcpyHostToDevice, I.stream);
      if (et != cudaSuccess) return I.fail(et, "the RoPE angles");
      angles = true;
    }
    if (angles) {  // the host tables are rewritten next step: wait for these copies first
      const cudaError_t es = cudaStreamSynchronize(I.stream);
      if (es != cudaSuccess) return I.fail(es, "the RoPE angles");
    }
  }
  if (!I.caches.empty()) {  // the block tables, when they changed (a decode step normally keeps them)
    const size_t entries = static_cast<size_t>(I.shape.n_slots) * static_cast<size_t>(I.kv.blocks_per_slot);
    INFERD_ASSERT(io.kv_table.size() == entries, "a KV table of %zu entries, %zu expected", io.kv_table.size(), entries);
    if (!std::equal(io.kv_table.begin(), io.kv_table.end(), I.host_kv_table.begin(), I.host_kv_table.end())) {
      // Copied from host_kv_table, which stays as it is until the step's end (synchronized below).
      I.host_kv_table.assign(io.kv_table.begin(), io.kv_table.end());
      const cudaError_t e = cudaMemcpyAsync(I.kv_table.get(), I.host_kv_table.data(), entries * sizeof(int32_t),
                                            cudaMemcpyHostToDevice, I.stream);
      if (e != cudaSuccess) {
        I.host_kv_table.clear();
        return I.fail(e, "the KV block tables");
      }
    }
  }
  Status st;
  const std::pair<int32_t, int32_t> key{s.tokens, s.outputs};
  if (I.opt.graphs && s.tokens <= kGraphMaxTokens && !I.uncapturable.count(key)) {
    auto it = I.graphs.find(key);
    if (it == I.graphs.end()) {
      // Capture the shape's node sequence (nothing runs while capturing), then replay it below.
      cudaError_t e = cudaStreamBeginCapture(I.stream, cudaStreamCaptureModeThreadLocal);
      if (e != cudaSuccess) return I.fail(e, "cudaStreamBeginCapture");
      const Status captured = I.run_nodes(g, s);
      cudaGraph_t graph = nullptr;
      e = cudaStreamEndCapture(I.stream, &graph);
      cudaGraphExec_t exec = nullptr;
      if (captured && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      if (!captured || e != cudaSuccess) {
        (void)cudaGetLastError();  // capture errors are not sticky: run this shape's kernels directly
        I.uncapturable.insert(key);
        I.graph_note = !captured ? captured.message() : std::string("capture failed: ") + cudaGetErrorString(e);
        if (I.broken) return captured;
      } else {
        it = I.graphs.emplace(key, GraphExec(exec)).first;
        ++I.stats.graph_captures;
      }
    }
    if (it != I.graphs.end()) {
      const cudaError_t e = cudaGraphLaunch(it->second.get(), I.stream);
      if (e != cudaSuccess) return I.fail(e, "cudaGraphLaunch");
      ++I.stats.graph_replays;
    } else {
      st = I.run_nodes(g, s);
    }
  } else {
    st = I.run_nodes(g, s);
  }
  for (size_t i = 0; st && i < g.outputs().size(); ++i) {
    const TensorId id = g.outputs()[i];
    const graph::Tensor& t = g.tensor(id);
    std::vector<float>& dst = *io.outputs[i];
    dst.resize(static_cast<size_t>(Graph::rows(t, s)) * static_cast<size_t>(t.cols));
    if (dst.empty()) continue;
    const cudaError_t e = cudaMemcpyAsync(dst.data(), I.f(id), dst.size() * 4, cudaMemcpyDeviceToHost, I.stream);
    if (e != cudaSuccess) st = I.fail(e, "the step's outputs");
  }
  const cudaError_t e = cudaStreamSynchronize(I.stream);
  if (st && e != cudaSuccess) st = I.fail(e, "the step");
  if (st) ++I.stats.steps;
  return st;
}

}  // namespace inferd::cuda
