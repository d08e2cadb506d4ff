// inferd/cuda/cuda_backend.h — the CUDA backend: the model graph on an NVIDIA GPU.
//
// prepare() uploads every weight the graph reads, in the GGUF's own blocks (the kernels dequantize
// as they read: kernels/cuda), from wherever the model maps them — the supervisor's sealed shared
// segment in a worker — through a read-only host registration of that mapping (cudaHostRegister) so
// the copies are DMA from the segment itself with no staging copy; it allocates the KV cache of the
// graph's layers on the device (per layer a pool of BackendShape::n_blocks blocks of 64 positions,
// [k|v][block][kv_head][64][head_dim] halves, written in place; a slot's position p is row p % 64 of
// block kv_table[slot][p / 64], the step's StepIO::kv_table, copied to the device when it changes) and
// the activations of a step of max_tokens tokens (buffers reused once a tensor's last reader has run).
// compute() runs the graph's nodes on one stream and waits for the outputs.
//
// Kernels: every kernel gives a token the same result whatever else its step holds (batch-invariant),
// so prefill equals decode, concurrent streams equal one-at-a-time ones, and a sequence replayed after a
// worker restart comes out the same. Matmuls are a float GEMV reading each weight row once per step
// (MatmulPath::kGemv, the default), or tensor-core tiles (fp16 WMMA, fp32 accumulation) for every step.
// Optionally a matmul's input is first quantized to 8 bits as the CPU engine quantizes it for that
// weight type (Activations::kQ8); the GEMV then dots Q4_0, Q4_1, Q8_0 and Q4_K rows with those codes in
// integers (dp4a, llama.cpp's MMVQ arithmetic), other types dequantized as before.
//
// Errors: no device (no driver, "driver version is insufficient", no GPU) is kNotFound from create()
// with the runtime's reason; a device too small for the graph is kOutOfRange from prepare() with the
// sizes, and nothing stays allocated; a CUDA error in a step fails the step with the runtime's message,
// and when the error leaves the device context unusable (a sticky error) healthy() turns false: the
// worker then exits so that the supervisor restarts it.
// Decode steps run as CUDA graphs (CudaOptions::graphs): the node sequence of a (tokens, outputs) shape is
// captured once and replayed; the step's inputs are copied in before the replay and its outputs out after.
// Thread safety: one thread at a time (Backend); prepare() and compute() bind the device to the
// calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "inferd/backend.h"
#include "inferd/status.h"

namespace inferd::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sms = 0;
  size_t total_bytes = 0;
  std::string driver;  // "13.0"
};

// The device `index` (kNotFound with the CUDA runtime's reason when there is none).
Result<DeviceInfo> query_device(int index);
// How many devices the runtime sees (0 when none, or no usable driver).
int device_count();

// The matmul kernel of every step. The GEMV (the default) computes in float; tensor cores read fp16 tiles.
// Both give a token the same result whatever else its step holds; a backend never mixes them.
enum class MatmulPath : uint8_t { kGemv, kTensorCores };
const char* matmul_path_name(MatmulPath p);

// A matmul's activations: quantized to 8 bits as the CPU engine (and llama.cpp) quantizes them for the
// weight's type, so that the logits follow the CPU engine's; or kept in float.
enum class Activations : uint8_t { kQ8, kFloat };
const char* activations_name(Activations a);

// The arithmetic of every op. kFloat: the kernels above, within float summation order of the exact
// math (a few percent of the logits' range from the CPU engine, whose 8-bit activations dominate the
// difference). kExact: the CPU engine's arithmetic operation for operation in its x86 kernels' order
// (kernels/cuda exact.cu): matmul inputs quantized as the CPU quantizes them, integer dots with dp4a,
// the CPU's fma chains, its RMS norm, SiLU and attention; the logits equal the CPU engine's bit for bit
// (exact() is true, and the backend-ops suite holds it to that). It needs a host whose CPU engine runs
// the x86 kernels, and excludes tensor cores and q8 activations (it has its own matmul).
// Unset (the default): kExact where the host's CPU engine runs the x86 kernels and neither tensor cores
// nor q8 activations are asked for; else kFloat. The same default as the OpenCL backend's: a GPU gives
// the CPU's tokens unless told to trade them for speed.
enum class Numerics : uint8_t { kFloat, kExact };
const char* numerics_name(Numerics n);

struct CudaOptions {
  int device = 0;
  MatmulPath matmul = MatmulPath::kGemv;
  // Unset: q8 with float numerics on the GEMV, else float (create() resolves it).
  std::optional<Activations> activations;
  std::optional<Numerics> numerics;
  // Steps of up to kGraphMaxTokens tokens (decode and small batches) run as CUDA graphs, captured once per
  // (tokens, outputs) shape and replayed: one launch instead of hundreds. Every kernel reads the step's
  // positions, slots, angles and KV block tables from fixed device buffers, so a shape's graph serves every
  // step of that shape. Off: every kernel launched each step.
  bool graphs = true;
  // Decode steps (float numerics, the GEMV, up to 8 tokens) launch fused GEMVs: a layer's Q, K and V
  // matmuls in one kernel, the FFN's gate and up matmuls with SwiGLU/GeGLU in one; each output the same
  // bits as the separate kernels give. Off: a kernel per matmul and activation.
  bool fuse = true;
  // Float numerics: attention split over the positions in kernels::cuda::kAttentionSplits parts (thread
  // blocks) merged by a second kernel (flash-decoding: a decode step's attention spread over the device).
  // Off: one thread block per head and token, its warps taking the positions in turn.
  bool split_attention = true;
  // Float numerics with 8-bit matmul inputs: Q6_K rows read by the integer GEMV too (off: by the float-input
  // GEMV). Off until measured on a GPU.
  bool q6k_integer = false;
};
inline constexpr int32_t kGraphMaxTokens = 16;

struct CudaStats {
  size_t weight_bytes = 0, kv_bytes = 0, activation_bytes = 0;
  double upload_seconds = 0.0;
  bool upload_registered = false;  // the weights were copied from a registered (pinned) host mapping
  int64_t steps = 0, gemv_matmuls = 0, tensor_core_matmuls = 0, exact_matmuls = 0;
  int64_t graph_captures = 0, graph_replays = 0;  // CUDA graphs: shapes captured, steps run as a graph
  // Fused GEMV launches enqueued (each doing the work of two or three kernels); a launch recorded into a
  // CUDA graph counts once, however often the graph is replayed.
  int64_t fused_launches = 0;
  // Matmuls on the integer GEMV (Activations::kQ8 with the GEMV: 8-bit inputs dotted by dp4a), counted
  // as gemv_matmuls are.
  int64_t q8_gemv_matmuls = 0;
  double upload_gbps() const {
    return upload_seconds > 0 ? static_cast<double>(weight_bytes) / upload_seconds / 1e9 : 0.0;
  }
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const CudaOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view family() const override { return "cuda"; }
  std::string describe() const override;
  bool supports(const graph::Graph& g, const graph::Node& node) const override;
  Status prepare(const graph::Graph& g, const BackendShape& shape) override;
  Status compute(const graph::Graph& g, graph::StepIO& io) override;
  BackendMemory memory() const override;
  bool healthy() const override;
  bool exact() const override;

  const DeviceInfo& device() const;
  const CudaStats& stats() const;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd::cuda
