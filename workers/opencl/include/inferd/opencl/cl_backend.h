// inferd/opencl/cl_backend.h — the OpenCL backend: graphs (inferd/graph.h) on an OpenCL device, op by op
// through Ops (ops.h).
//
// prepare() does once what a graph needs (ML Drift's way):
//  * Weights are converted from the model's WeightViews (which point into the shared weights segment)
//    into the layouts the kernels read (MatmulWeights); only the weights the graph reads — a pipeline
//    stage uploads its own layers. Matmuls that share an input and a weight type are merged into one
//    where the graph lets them: Q|K|V stacked into one matrix when their only use is one rope_kv, gate|up
//    for matmul_swiglu. The embedding table is one MatmulWeights serving the lookup and a tied output
//    projection. Q/K/V biases (qwen2) are added by rope_kv.
//  * Activations are logical 1x1xTxC tensors (a token per x) in one storage picked per device
//    (choose_storage, or forced by OpenClOptions::activation_storage) and one data type (float, or half
//    with float numerics; the residual stream is always float), allocated for the largest step and
//    reused by liveness (a tensor's memory goes back to a pool after its last reader; a node never
//    writes the memory it reads, as images require). A step of T tokens runs on views of their first T
//    tokens, so no kernel is ever rebuilt for a new batch size. The logits have their own storage.
//  * The KV cache is one half-precision buffer per layer of the graph, a pool of BackendShape::n_blocks
//    blocks of 64 positions, [block][k|v][kv_head][64][head_dim]; a slot's position p is row p % 64 of
//    block kv_table[slot][p / 64] (StepIO::kv_table, uploaded when it changes). rope_kv writes each
//    step's K/V rows in place at their rows; attention runs over the KV length padded to the pad step.
// compute() is stage-aware: the decode matmul kernels for steps of fewer than 4 tokens, the prefill
// kernels otherwise (choose_matmul_variant).
//
// The activations' storage (OpenClOptions::storage_policy): on a GPU the kernels' speed in each storage
// depends on the device and driver (on an NVIDIA H200 the texture2d ML Drift prefers lost to buffers by
// 10-25% on decode), so prepare() times a decode step of the graph itself in each storage that fits
// (storage_candidates: a texture, an image buffer, a buffer; the logits in the same storage where it
// fits them), three rounds each after an untimed warm step, and keeps the fastest. The result is cached
// in the program cache's directory per device, driver, configuration and graph (storage_record.h), so
// only a model's first load on a device pays for it (mostly kernel builds of the storages not chosen).
// The trial steps write position 0 of KV block 0, which every sequence writes before it reads.
//
// Numerics (OpenClOptions::numerics, ops.h): kExact computes the CPU backend's float operations in its
// order, so its logits equal the CPU backend's bit for bit (activations quantized to Q8_0 / Q8_1 /
// Q8_K before matmuls with block weights, the dot kernels' lane order, RMSNorm's double sum, ggml's
// expf, RoPE by the host's cos and sin); it needs cl_khr_fp64, and a device without it runs kFloat
// (describe() says why). kFloat keeps activations unquantized and sums in the fastest order.
//
// Operators: embed, rms_norm, matmul (a bias only where a rope_kv adds it), matmul_add (the residual
// added at the matmul's store: one launch fewer per layer's attention output and FFN down projection),
// matmul_swiglu, rope_kv, attention (of a rope_kv's Q), swiglu, add, get_rows. rope and kv_write alone are
// unsupported.
//
// Thread safety: one thread at a time (the Runtime's queue is in order).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "inferd/backend.h"
#include "inferd/opencl/cl_runtime.h"
#include "inferd/opencl/ops.h"
#include "inferd/opencl/storage_record.h"
#include "inferd/opencl/tensor_desc.h"

namespace inferd::opencl {

// How the backend rounds (see above).
enum class Numerics { kExact, kFloat };
const char* numerics_name(Numerics numerics);

// How prepare() picks the activations' storage when OpenClOptions::activation_storage is unset.
enum class StoragePolicy {
  kRule,     // the device's first preference that fits (choose_storage)
  kMeasure,  // the fastest decode step among storage_candidates, timed (or read from its record)
};
const char* storage_policy_name(StoragePolicy policy);  // "rule", "measure"

// Where the activations' storage in effect came from.
enum class StorageSource {
  kForced,    // OpenClOptions::activation_storage
  kRule,      // choose_storage (kRule, or kMeasure with a single candidate)
  kMeasured,  // timed by this prepare()
  kRecorded,  // timed by an earlier load: the record in the cache directory
};
const char* storage_source_name(StorageSource source);  // "forced", "rule", "measured", "recorded"

struct OpenClOptions {
  // The storage of the activations; unset: chosen by storage_policy.
  std::optional<StorageType> activation_storage;
  // Unset: kMeasure on GPUs and accelerators; kRule on CPU devices, where images are emulated in software
  // and buffers win (BENCHMARKS.md, "OpenCL storage by measurement").
  std::optional<StoragePolicy> storage_policy;
  // The data type of the activations other than the residual stream (which stays float, as in
  // llama.cpp: it accumulates every layer's output); unset: kFloat16 where the numerics are kFloat and
  // the device has cl_khr_fp16, kFloat32 otherwise. kFloat16 with kExact numerics is kInvalidArgument.
  std::optional<DataType> activation_type;
  Numerics numerics = Numerics::kExact;
  // How the exact matmuls form their int8 dot products (ops.h IntDot); unset: choose_int_dot(device).
  std::optional<IntDot> int_dot;
  // The float decode matmul's work-group shape (ops.h DecodeShape); unset: timed with kMeasure and float
  // numerics, default_decode_shape(device) otherwise. Out of range: kInvalidArgument.
  std::optional<DecodeShape> decode_shape;
  // Fused kernels: the residual added in the matmul's store (the graph's matmul_add), and with float
  // numerics SwiGLU in a decode step's stacked gate|up matmul (Ops::matmul_swiglu). false runs the matmul
  // and the add (the swiglu) apart, to measure the fusion. The same bits either way with float activations;
  // with half ones the unfused matmul's output is rounded to half first.
  bool fuse = true;
  // Tokens per work-item of the float prefill matmul (Ops::prefill_tokens); unset: the device's default.
  std::optional<int> prefill_tokens;
  // The float prefill matmul's kernel (Ops::prefill_kernel); unset: kSimple.
  std::optional<PrefillKernel> prefill_kernel;
  // Positions per chunk of the float attention split over the positions (Ops::attention_chunk; 0: never
  // split); unset: the device's default. Out of [0, kMaxAttentionChunkOption]: kInvalidArgument.
  std::optional<int32_t> attention_chunk;
  // Decode steps replayed: the first step of a shape (tokens, outputs, KV bucket) records its launches,
  // each from a kernel object with its arguments bound (Ops::begin_record); the next steps of that shape
  // enqueue them again without generating keys or binding arguments (Ops::replay). The same kernels and
  // arguments: the same bits. false runs every step through the graph's nodes.
  bool replay = true;
};
inline constexpr int32_t kMaxAttentionChunkOption = 1 << 16;

struct OpenClStats {
  int64_t decode_passes = 0;    // steps that ran the decode (GEMV) matmul kernels
  int64_t prefill_passes = 0;   // steps that ran the prefill matmul kernels
  size_t weight_bytes = 0;      // device memory of the converted weights
  size_t kv_bytes = 0;
  size_t activation_bytes = 0;  // activation tensors and per-step buffers, logits included
  size_t kernels = 0;           // distinct kernels built
  size_t kernels_collected = 0;  // of them, built side by side before the first pass of a shape needed them
  int64_t launches = 0;          // kernels enqueued by compute() (Ops::launches), the storage trials' excluded
  int64_t recorded_steps = 0;    // decode steps whose launches were recorded (OpenClOptions::replay)
  int64_t replayed_steps = 0;    // decode steps that replayed a recording
  StorageSource storage_source = StorageSource::kRule;
  std::vector<StorageTrial> storage_trials;  // kMeasured, kRecorded: each candidate's time per decode step
  double storage_measure_ms = 0.0;           // kMeasured: what the timing cost prepare(), kernel builds included
};

class OpenClBackend final : public Backend {
 public:
  // kInvalidArgument for half activations with the exact numerics.
  static Result<std::unique_ptr<OpenClBackend>> create(std::unique_ptr<Runtime> runtime, const OpenClOptions& options);
  ~OpenClBackend() override;
  OpenClBackend(const OpenClBackend&) = delete;
  OpenClBackend& operator=(const OpenClBackend&) = delete;

  std::string_view family() const override { return "opencl"; }
  // "OpenCL: <device> (<vendor>, driver <version>), storage: weights=buffer activations=buffer
  // (measured: buffer 2.91, texture2d 3.05, image_buffer 3.20 ms per decode step) logits=buffer
  // kv=buffer(f16), numerics exact (x86, float dot), weights 106.4 MiB".
  std::string describe() const override;
  bool supports(const graph::Graph& g, const graph::Node& node) const override;
  Status prepare(const graph::Graph& g, const BackendShape& shape) override;
  Status compute(const graph::Graph& g, graph::StepIO& io) override;
  BackendMemory memory() const override;
  bool exact() const override { return numerics() == Numerics::kExact; }

  Runtime& runtime();
  const DeviceInfo& device_info() const;
  const OpenClStats& stats() const;
  StorageType activation_storage() const;
  // The float decode matmul's work-group shape in effect (ops.h DecodeShape).
  DecodeShape decode_shape() const;
  // Device time per kernel of the steps run while profiling is on (Ops::set_profiling, take_profile; the
  // Runtime made with RuntimeOptions::profiling).
  void set_profiling(bool on);
  Result<Profile> take_profile();
  DataType activation_type() const;
  // The numerics in effect (options().numerics unless the device cannot run them) and, for kExact, the
  // CPU order they reproduce.
  Numerics numerics() const;
  CpuOrder cpu_order() const;

 private:
  struct Impl;
  explicit OpenClBackend(std::unique_ptr<Impl> impl);
  // Sets the activations' and the logits' storage and the decode matmul's shape (the class comment); may
  // run trial steps.
  Status choose_storages(const graph::Graph& g);
  // A configuration a trial times.
  struct StepConfig {
    StorageChoice storage;
    DecodeShape decode;
    bool logits_follow = true;  // the logits in the activations' storage where it holds them (use_storage)
  };
  // The timed trials of StoragePolicy::kMeasure: each configuration's median time per decode step.
  Result<std::vector<StorageTrial>> time_steps(const graph::Graph& g, std::span<const StepConfig> configs);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd::opencl
