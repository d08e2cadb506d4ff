// inferd/opencl/cl_engine.h — a llama-family model (or a pipeline stage of it) on an OpenCL device: the
// model graph run by the OpenCL backend (cl_backend.h) through the forward pass every backend shares
// (model_runner.h).
//
// ClEngine has the CPU Engine's contract for forward() and eval() (ModelRunner): batches of tokens of
// several slots, consecutive positions per slot, the logits of the tokens marked `logits` returned in
// batch order. Sampling stays on the host (the logits rows wanted are downloaded, nothing else). Like
// Engine it can run a pipeline stage, layers [first_layer, end_layer): with kExact numerics a stage's
// hidden states are the CPU engine stage's bit for bit, so CPU and OpenCL stages chain in any order and
// give the whole model's logits. What lives on the device and how, and the numerics: cl_backend.h.
//
// Errors: a tensor type the kernels cannot read (none the CPU engine computes with; MatmulWeights::
// supports) is kUnimplemented naming the tensor and the type; a device too small is kOutOfRange;
// batches are validated as ModelRunner validates them before anything reaches the device.
//
// Thread safety: a ClEngine (and its Runtime) is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "inferd/model_runner.h"
#include "inferd/opencl/cl_backend.h"
#include "inferd/model.h"
#include "inferd/opencl/cl_runtime.h"
#include "inferd/opencl/ops.h"
#include "inferd/opencl/tensor_desc.h"
#include "inferd/status.h"

namespace inferd::opencl {

struct ClEngineOptions {
  int32_t n_ctx = 0;       // tokens per slot; 0: min(the model's training context, 4096)
  int32_t n_slots = 1;
  int32_t n_ubatch = 512;  // most tokens in one pass
  int32_t pad_step = 64;   // 64 or 128
  // KV blocks in the pool (RunnerOptions::n_blocks); 0: a run of blocks per slot. create() stores the
  // resolved count.
  int32_t n_blocks = 0;
  // The storage of the activations; unset: chosen by storage_policy (OpenClOptions).
  std::optional<StorageType> activation_storage;
  // Unset: measured on GPUs and accelerators, the device's rule on CPU devices (cl_backend.h).
  std::optional<StoragePolicy> storage_policy;
  // The data type of the activations other than the residual stream (which stays float, as in
  // llama.cpp: it accumulates every layer's output); unset: kFloat16 where the numerics are kFloat and
  // the device has cl_khr_fp16 (a GPU with native halves, where half the activation bytes is half
  // the traffic), kFloat32 otherwise. kFloat16 with kExact numerics is kInvalidArgument: the exact
  // ops reproduce the CPU engine's float activations.
  std::optional<DataType> activation_type;
  Numerics numerics = Numerics::kExact;
  // How the exact matmuls form their int8 dot products (ops.h IntDot); unset: choose_int_dot(device),
  // int8 where the device has cl_khr_integer_dot_product. Same bits either way.
  std::optional<IntDot> int_dot;
  // The float decode matmul's work-group shape (OpenClOptions::decode_shape).
  std::optional<DecodeShape> decode_shape;
  bool fuse = true;  // OpenClOptions::fuse: matmul_add and the float decode's gate|up + SwiGLU in one kernel
  std::optional<int> prefill_tokens;  // OpenClOptions::prefill_tokens
  std::optional<PrefillKernel> prefill_kernel;  // OpenClOptions::prefill_kernel
  std::optional<int32_t> attention_chunk;       // OpenClOptions::attention_chunk
  bool replay = true;                           // OpenClOptions::replay
  // The layers this engine runs, [first_layer, end_layer) (end_layer 0: through the last); see
  // EngineOptions. create() stores the resolved end_layer.
  int32_t first_layer = 0;
  int32_t end_layer = 0;
};

struct ClEngineStats {
  int64_t forward_calls = 0;
  int64_t tokens = 0;
  int64_t decode_passes = 0;   // passes that ran the decode (GEMV) matmul kernels
  int64_t prefill_passes = 0;  // passes that ran the prefill matmul kernels
  size_t weight_bytes = 0;     // device memory of the converted weights
  size_t kv_bytes = 0;
  size_t activation_bytes = 0;  // activation tensors and per-pass buffers, logits included
  size_t kernels = 0;           // distinct kernels built
  size_t kernels_collected = 0;  // of them, built side by side before the first pass of a shape (OpenClStats)
  int64_t launches = 0;          // kernels enqueued by the passes
};

class ClEngine final : public ModelRunner {
 public:
  // Uploads the model to `runtime`'s device. The engine keeps `model` alive: the weights stay in the
  // shared segment the WeightViews point into; the device holds converted copies.
  static Result<std::unique_ptr<ClEngine>> create(std::shared_ptr<const Model> model, std::unique_ptr<Runtime> runtime,
                                                  const ClEngineOptions& options);

  // The options in effect (n_ctx and end_layer resolved).
  const ClEngineOptions& options() const { return options_; }
  const ClEngineStats& stats() const;
  Runtime& runtime() { return cl_->runtime(); }
  const DeviceInfo& device_info() const { return cl_->device_info(); }
  StorageType activation_storage() const { return cl_->activation_storage(); }
  DecodeShape decode_shape() const { return cl_->decode_shape(); }
  // Device time per kernel (OpenClBackend::set_profiling, take_profile).
  void set_profiling(bool on) { cl_->set_profiling(on); }
  Result<Profile> take_profile() { return cl_->take_profile(); }
  // How the activations' storage was decided, and what was timed (OpenClStats).
  StorageSource storage_source() const { return cl_->stats().storage_source; }
  const std::vector<StorageTrial>& storage_trials() const { return cl_->stats().storage_trials; }
  double storage_measure_ms() const { return cl_->stats().storage_measure_ms; }
  const OpenClStats& backend_stats() const { return cl_->stats(); }
  DataType activation_type() const { return cl_->activation_type(); }
  // The numerics in effect (options().numerics unless the device cannot run them) and, for kExact,
  // the CPU order they reproduce.
  Numerics numerics() const { return cl_->numerics(); }
  CpuOrder cpu_order() const { return cl_->cpu_order(); }
  // The backend's describe() (cl_backend.h), with ", layers 14-29" for a pipeline stage: the worker's
  // device as the daemon shows it.
  std::string describe() const;

 private:
  ClEngine() = default;

  OpenClBackend* cl_ = nullptr;  // owned by the runner
  ClEngineOptions options_;
  mutable ClEngineStats stats_;
};

}  // namespace inferd::opencl
