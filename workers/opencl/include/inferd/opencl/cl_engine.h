// inferd/opencl/cl_engine.h — the forward pass of a llama-family model on an OpenCL device (issue 5).
//
// ClEngine is the OpenCL counterpart of inferd::Engine, with the same contract for forward(): batches
// of tokens of several slots, consecutive positions per slot, the logits of the tokens marked `logits`
// returned in batch order. Sampling stays on the host (the logits rows wanted are downloaded, nothing
// else). Like Engine it can run a pipeline stage, layers [first_layer, end_layer): a stage after the
// first takes the previous stage's hidden states (uploaded into the residual stream) instead of
// embedding tokens; a stage before the last downloads its residual stream instead of computing
// logits. With kExact numerics a stage's hidden states are the CPU engine stage's bit for bit, so
// CPU and OpenCL stages chain in any order and give the whole model's logits.
//
// What lives on the device, and how (ML Drift's tensor virtualization, ops.h):
//  * Weights are converted once, at create(), from the model's WeightViews (which point into the
//    shared weights segment) into the layouts the kernels read (MatmulWeights); a stage uploads its
//    own layers only, the embedding when it is first (or last with a tied output), the output norm
//    and projection when it is last. Q|K|V and gate|up are
//    concatenated into one matmul each where their types agree. The embedding table is one
//    MatmulWeights that serves both the lookup (Ops::get_rows) and a tied output projection.
//  * Activations are logical 1x1xTxC tensors (a token per x) in one storage picked per device
//    (choose_storage, or forced by ClEngineOptions::activation_storage) and one data type (float, or
//    half with float numerics: ClEngineOptions::activation_type; the residual stream is always
//    float), allocated once for n_ubatch
//    tokens; a pass of T tokens runs on views of their first T tokens (Tensor::view), so no kernel is
//    ever rebuilt for a new batch size. The logits have their own storage choice (a vocabulary is
//    often too tall for a 2D image) and grow on demand.
//  * The KV cache is one half-precision buffer per layer of the stage, [slot][k|v][kv_head][position][head_dim],
//    allocated for every slot and the whole context at create(); each pass's K/V rows are written in
//    place at their (slot, position) by Ops::rope_kv.
//  * Attention runs over the KV length rounded up to pad_step with the padding masked (Ops::attention,
//    Ops::attention_exact; the latter's scores scratch holds up to 64 MiB of a pass's tokens).
//  * Stage-aware matmuls: the decode kernels for passes of fewer than 4 tokens, the prefill kernels
//    otherwise (choose_matmul_variant).
//
// Numerics (ClEngineOptions::numerics, ops.h):
//  * kExact, the default: every op computes the CPU engine's float operations in its order (the
//    order of this process's CPU kernels, host_cpu_order()), so the logits equal the CPU engine's bit
//    for bit: activations quantized to Q8_0 / Q8_1 (Q8_K for K-quants) before matmuls with block
//    weights, integer dot products combined in its lane order, RMSNorm's double sum, ggml's expf in
//    SwiGLU and softmax, RoPE by the host's own cos and sin (rope_table), Q, K, V and the
//    probabilities rounded to half.
//    Needs cl_khr_fp64; a device without it runs kFloat and describe() says why.
//  * kFloat: activations stay float and the kernels sum in their fastest order (Q, K and V still
//    rounded to half, as llama.cpp): within float summation order of exact arithmetic; against the
//    CPU engine the logits differ by its 8-bit activation noise (about 96% teacher-forced top-1
//    agreement on SmolLM2).
//
// Errors: a tensor type the kernels cannot read (none the CPU engine computes with; MatmulWeights::
// supports) is kUnimplemented naming the tensor and the type; a device too small is kOutOfRange; batches are validated exactly as Engine::forward
// validates them (kInvalidArgument, kOutOfRange) before anything reaches the device.
//
// Thread safety: a ClEngine (and its Runtime) is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "inferd/engine.h"
#include "inferd/model.h"
#include "inferd/opencl/cl_runtime.h"
#include "inferd/opencl/ops.h"
#include "inferd/opencl/tensor_desc.h"
#include "inferd/status.h"

namespace inferd::opencl {

// How a ClEngine rounds (see above).
enum class Numerics { kExact, kFloat };
const char* numerics_name(Numerics numerics);

struct ClEngineOptions {
  int32_t n_ctx = 0;       // tokens per slot; 0: min(the model's training context, 4096)
  int32_t n_slots = 1;
  int32_t n_ubatch = 512;  // most tokens in one pass
  int32_t pad_step = 64;   // 64 or 128
  // The storage of the activations; unset: the device's first choice that fits (choose_storage).
  std::optional<StorageType> activation_storage;
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
};

class ClEngine {
 public:
  // Uploads the model to `runtime`'s device. The engine keeps `model` alive: the weights stay in the
  // shared segment the WeightViews point into; the device holds converted copies.
  static Result<std::unique_ptr<ClEngine>> create(std::shared_ptr<const Model> model, std::unique_ptr<Runtime> runtime,
                                                  const ClEngineOptions& options);
  ~ClEngine();
  ClEngine(const ClEngine&) = delete;
  ClEngine& operator=(const ClEngine&) = delete;

  // One forward pass over `batch` (1..n_ubatch tokens); see Engine::forward, including its pipeline
  // stage contract: `hidden_in` (batch.size() x n_embd floats) is read by a stage after the first and
  // must be empty otherwise; a stage before the last returns batch.size() x n_embd hidden-state floats.
  // The span is valid until the next call.
  Result<std::span<const float>> forward(std::span<const BatchToken> batch, std::span<const float> hidden_in = {});
  // Appends `tokens` to `slot` in passes of at most n_ubatch tokens; the logits of the last token, or
  // of every token when `all_logits`. Whole models only (kInvalidArgument for a stage).
  Result<std::span<const float>> eval(int32_t slot, std::span<const int32_t> tokens, bool all_logits = false);
  bool is_first_stage() const { return options_.first_layer == 0; }
  bool is_last_stage() const { return options_.end_layer == model_->config().n_layer; }

  void clear_slot(int32_t slot);
  void truncate_slot(int32_t slot, int32_t length);  // length <= the slot's length
  int32_t slot_length(int32_t slot) const;

  const Model& model() const { return *model_; }
  int32_t n_vocab() const { return model_->config().n_vocab; }
  const ClEngineOptions& options() const { return options_; }
  const ClEngineStats& stats() const { return stats_; }
  Runtime& runtime() { return *rt_; }
  const DeviceInfo& device_info() const { return rt_->info(); }
  StorageType activation_storage() const { return act_storage_; }
  DataType activation_type() const { return act_type_; }
  // The numerics in effect (options().numerics unless the device cannot run them) and, for kExact,
  // the CPU order they reproduce.
  Numerics numerics() const { return numerics_; }
  CpuOrder cpu_order() const { return cpu_order_; }
  // "OpenCL: <device> (<vendor>, driver <version>), storage: weights=buffer activations=buffer
  // logits=buffer kv=buffer(f16), numerics exact (x86), weights 106.4 MiB" (activations=buffer(f16)
  // when they are halves; ", layers 0-14" appended
  // for a pipeline stage): the worker's device as the daemon shows it.
  std::string describe() const;

 private:
  struct Layer;
  struct Activations;
  struct PassViews;
  ClEngine() = default;

  Status upload_weights();
  Status allocate_activations();
  Status ensure_logits(int32_t n_out);
  bool exact() const { return numerics_ == Numerics::kExact; }
  Status run_pass(std::span<const BatchToken> batch, std::span<const float> hidden_in, int32_t kv_pad, int32_t n_out);

  std::shared_ptr<const Model> model_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Ops> ops_;
  ClEngineOptions options_;
  AttentionGeometry geometry_;
  StorageType act_storage_ = StorageType::kBuffer;
  DataType act_type_ = DataType::kFloat32;
  int32_t act_parts_ = 1;  // kTexture2DSplit: the parts of every activation (clamped per tensor)
  TensorFormat act_format(DataType type) const { return TensorFormat(act_storage_, type, act_parts_); }
  TensorFormat logits_format_;
  std::string storage_notes_;  // why a preferred storage was passed over, for describe()
  Numerics numerics_ = Numerics::kExact;
  CpuOrder cpu_order_ = CpuOrder::kX86;
  std::string numerics_note_;  // why the options' numerics were not used, for describe()

  // Null where this stage does not need them: the embedding unless first (or last with a tied
  // output), the output norm unless last; output_ also when the projection is tied to the embedding.
  std::unique_ptr<MatmulWeights> embedding_;
  std::unique_ptr<MatmulWeights> output_;
  std::unique_ptr<Tensor> output_norm_;
  std::vector<Layer> layers_;  // layers_[i] is model layer first_layer + i
  std::unique_ptr<Activations> act_;

  std::vector<int32_t> slot_len_;
  std::vector<int32_t> host_ids_, host_pos_, host_slots_, host_rows_;
  std::vector<float> host_rope_;
  std::vector<float> logits_;
  std::vector<float> hidden_;  // a stage before the last: the pass's output
  std::vector<float> all_logits_;
  ClEngineStats stats_;
};

}  // namespace inferd::opencl
