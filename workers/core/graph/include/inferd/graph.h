// inferd/graph.h — the model graph: a forward pass written once, as operators over named tensors.
//
// A Graph is what a model computes in one step, independent of where it runs. The builder
// (graph_builder.h) writes the llama-family forward pass — embeddings, RMSNorm, matmuls, RoPE, the KV
// write into the cache's sub-tensor, attention, SwiGLU, residual adds, the output norm and projection —
// once for every backend; a backend (workers/backend/backend.h) says which operators it supports and
// runs them, choosing its kernels per step. Fused operators (a matmul with the residual add in its
// store, gate and up matmuls with SwiGLU, RoPE with the KV write) are operators of the graph too:
// fuse() rewrites the basic patterns into them where the backend supports them.
//
// Shapes. Every activation is a matrix of rows x cols floats, rows being the step's tokens (T), the
// tokens whose logits are wanted (O), or a fixed count. T, O and the padded KV length come with each
// step (StepShape), so one graph serves every step of a stage: decode and prefill differ in shapes,
// not in structure, and each backend picks its kernels (GEMV or GEMM, ...) per step.
//
// Values are SSA: each tensor is written by one node. The KV cache of a layer is a tensor of kind
// kKvCache; a node that writes rows into it (kKvWrite, kRopeKv) outputs the cache's next version,
// which attention reads, so the dependency is explicit. Backends map every version of a layer's
// cache to that layer's one pre-allocated cache and write the new rows in place.
//
// Thread safety: a Graph is a value; build it on one thread, then share it read-only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "inferd/dtype.h"
#include "inferd/model.h"
#include "inferd/status.h"

namespace inferd::graph {

using TensorId = int32_t;
inline constexpr TensorId kNone = -1;

// Operators and their operands (in[i], out[i]); x is an activation of rows x K floats.
enum class Op : uint8_t {
  // Basic operators.
  kEmbed,        // out = rows of in[1] (the embedding table, a weight) at the token ids in[0] (int32, T),
                 //       times Node::scale where that is not 0
  kRmsNorm,      // out = in[0] / sqrt(mean(in[0]^2) + eps) * in[1] (an F32 weight vector), over each group
                 //       of in[1].cols columns (a row, or each head of a row: the Q/K norms)
  kMatmul,       // out = in[0] W^T (+ in[2], an optional F32 bias vector), W = in[1]: rows x N
  kRope,         // out = in[0] (heads of head_dim) rotated at the positions in[1] (int32, T) times
                 //       Node::rope_freq_scale, with base Node::rope_base (0: Heads::rope_base), each pair's
                 //       angle divided by Node::rope_factors[i] where given (llama 3.1)
  kKvWrite,      // out = in[4] (layer cache) with the rows of K = in[0], V = in[1] written at the tokens'
                 //       positions in[2] and slots in[3]
  kAttention,    // out = causal attention of Q = in[0] (rotated) over the cache in[1] at positions in[2]
                 //       and slots in[3]; KV length padded to the step's kv_pad and masked; q.k scaled by
                 //       Heads::kq_scale(node) (an explicit Node::scale multiplies Q itself before the
                 //       product, as llama.cpp's gemma3 graph does); Node::window > 0: only the last `window` positions
                 //       (the query's own included) are attended to
  kSwiglu,       // out = silu(in[0]) * in[1]
  kAdd,          // out = in[0] + in[1]
  kGetRows,      // out = rows in[1] (int32, O) of in[0]: the tokens whose logits are wanted
  kGeglu,        // out = gelu(in[0]) * in[1] (gelu's tanh approximation, as ggml's table computes it)
  // Fused operators (fuse()).
  kMatmulAdd,    // out = in[3] + in[0] W^T (+ in[2]), W = in[1]: the residual add in the matmul's store
  kMatmulSwiglu, // out = silu(in[0] Wg^T) * (in[0] Wu^T), Wg = in[1], Wu = in[2]
  kRopeKv,       // out[0] = RoPE(Q = in[0]); out[1] = the cache in[5] with RoPE(K = in[1]) and V = in[2]
                 //          written at positions in[3], slots in[4]
  kMatmulGeglu,  // out = gelu(in[0] Wg^T) * (in[0] Wu^T), Wg = in[1], Wu = in[2]
};
inline constexpr int kOpCount = 14;
const char* op_name(Op op);
bool is_fused(Op op);

enum class TensorKind : uint8_t {
  kInput,       // bound per step by the caller (StepIO)
  kActivation,  // computed by a node
  kWeight,      // a view of the model's weights
  kKvCache,     // a layer's KV cache (persistent across steps), or a version of it written by a node
};
enum class Elem : uint8_t { kFloat, kInt32, kWeight };  // kWeight: the weight's own DType
enum class Rows : uint8_t { kTokens, kOutputs, kFixed };  // T, O, or Tensor::fixed_rows

// What a tensor holds, as a hint for backends that lay tensors out differently (the residual stream
// stays float where other activations may be halves; the logits may need their own storage).
enum class Role : uint8_t { kOther, kResidual, kLogits };

struct Tensor {
  std::string name;  // weights: the GGUF tensor name; activations: "blk.3.attn_norm", "logits", ...
  TensorKind kind = TensorKind::kActivation;
  Elem elem = Elem::kFloat;
  Rows rows = Rows::kTokens;
  int64_t fixed_rows = 0;
  int64_t cols = 0;
  int32_t layer = -1;                 // the layer it belongs to (-1: none)
  Role role = Role::kOther;
  const WeightView* weight = nullptr;  // kWeight: the model's view (type, data, row stride)

  DType weight_type() const { return weight ? weight->type : DType::kF32; }
};

// Which part of the model a node computes (placement.h assigns parts to workers).
enum class Part : uint8_t { kEmbeddings, kAttention, kFfn, kOutput };
const char* part_name(Part part);

struct Node {
  static constexpr int kMaxIn = 6, kMaxOut = 2;
  Op op = Op::kAdd;
  Part part = Part::kAttention;
  int32_t layer = -1;  // -1 outside the layers (embedding, output)
  std::array<TensorId, kMaxIn> in{kNone, kNone, kNone, kNone, kNone, kNone};
  std::array<TensorId, kMaxOut> out{kNone, kNone};
  float eps = 0.0f;    // kRmsNorm
  float scale = 0.0f;  // kEmbed: the rows' factor (0: none); kAttention: the q.k scale (0: 1/sqrt(head_dim))
  float rope_base = 0.0f, rope_freq_scale = 1.0f;  // kRope, kRopeKv (rope_base 0: Heads::rope_base)
  const WeightView* rope_factors = nullptr;          // kRope, kRopeKv: head_dim / 2 F32 divisors, or none
  int32_t window = 0;  // kAttention: sliding window in positions (0: none)

  int n_in() const;
  int n_out() const { return out[1] == kNone ? 1 : 2; }
};

// The attention geometry every RoPE, KV and attention node of a graph shares.
struct Heads {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float rope_base = 10000.0f;
  RopeStyle rope_style = RopeStyle::kNormal;

  int32_t n_embd() const { return n_head * head_dim; }  // Q's width (the model's n_embd may differ)
  int32_t n_embd_kv() const { return n_head_kv * head_dim; }
  float kq_scale(const Node& attention) const;
  float rope_base_of(const Node& rope) const { return rope.rope_base > 0.0f ? rope.rope_base : rope_base; }
};


// The concrete sizes of one step.
struct StepShape {
  int32_t tokens = 0;   // T
  int32_t outputs = 0;  // O: tokens whose logits are wanted
  int32_t kv_pad = 0;   // attention's KV length, rounded up to the pad step
};

class Graph {
 public:
  // The step's standard inputs and outputs (kNone where this graph has none).
  struct Io {
    TensorId token_ids = kNone, positions = kNone, slots = kNone, out_rows = kNone, hidden_in = kNone;
    TensorId logits = kNone, hidden_out = kNone;
    // The last stage's second output: the output rows' hidden states after the output norm (what the
    // logits are computed from), for embeddings.
    TensorId embd = kNone;
  };

  TensorId add_tensor(Tensor t);
  // Appends a node; its inputs must exist and its outputs be activations or KV versions not yet written.
  void add_node(const Node& n);
  // Marks an existing tensor as an input bound per step, or as an output the step returns.
  void mark_input(TensorId id);
  void mark_output(TensorId id);

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor& tensor(TensorId id) const { return tensors_.at(static_cast<size_t>(id)); }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const std::vector<TensorId>& inputs() const { return inputs_; }
  const std::vector<TensorId>& outputs() const { return outputs_; }
  // The node that writes `id` (-1 for inputs, weights and a layer's first cache version).
  int producer(TensorId id) const;
  // Number of nodes that read `id`, and the output's use as a graph output.
  int use_count(TensorId id) const;

  // Rows of `t` in a step of `shape`.
  static int64_t rows(const Tensor& t, const StepShape& shape);

  Io io;
  Heads heads;
  int32_t first_layer = 0, end_layer = 0;  // the model layers this graph computes
  int32_t n_vocab = 0, n_embd = 0, n_ff = 0;

  // Checks structure: operand counts and kinds, shapes that agree, SSA. kInvalidArgument naming the node.
  Status validate() const;
  // One line per node: "blk.0: attn_q = matmul(attn_norm, blk.0.attn_q.weight[Q4_0])".
  std::string to_string() const;

 private:
  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<TensorId> inputs_, outputs_;
  std::vector<int> producer_;
  std::vector<int> uses_;
};

// Whether `n` uses what only some architectures need (a grouped RMSNorm, scaled embeddings, a RoPE
// base, scaling or frequency factors of its own, a sliding window or a q.k scale of its own, GeGLU):
// backends that have
// not implemented these refuse such nodes in supports().
bool uses_variants(const Graph& g, const Node& n);

// The host data of one step: a span per graph input (parallel to Graph::inputs(); int32 or float by the
// tensor's Elem, rows(tensor, shape) x cols elements) and a destination per graph output (parallel to
// Graph::outputs(); resized by the backend to rows x cols floats).
struct HostTensor {
  const void* data = nullptr;
  size_t count = 0;  // elements
};
// The KV cache of every backend is a pool of blocks of kKvBlockTokens positions (for every layer the
// graph computes). A slot's position p lives in block kv_table[slot * blocks_per_slot + p / kKvBlockTokens],
// at row p % kKvBlockTokens: the table is how the kv_write / rope_kv / attention operators find rows.
// Blocks are allocated by whoever drives the runner (the daemon's scheduler, which shares the blocks of a
// common prompt prefix between sequences); a block is only written by one sequence at a time.
inline constexpr int32_t kKvBlockTokens = 64;
inline constexpr int32_t kv_blocks_per_slot(int32_t n_ctx) { return (n_ctx + kKvBlockTokens - 1) / kKvBlockTokens; }

struct StepIO {
  StepShape shape;
  std::vector<HostTensor> inputs;
  std::vector<std::vector<float>*> outputs;
  // [n_slots][kv_blocks_per_slot(n_ctx)] block ids, row-major; an entry a step's positions reach is in
  // [0, n_blocks) (the runner validates it); others are -1.
  std::span<const int32_t> kv_table;
};

// Which backend runs a node: true when it supports the node of `g` (op, types, shapes).
using SupportsFn = std::function<bool(const Graph& g, const Node& node)>;

// Rewrites basic patterns into the fused operators `supports` accepts, keeping the graph's meaning:
//   kMatmul -> kAdd (the matmul's only use)            =>  kMatmulAdd
//   kMatmul(Wg, x), kMatmul(Wu, x) -> kSwiglu          =>  kMatmulSwiglu (no bias, only uses)
//   kRope(Q), kRope(K) -> kKvWrite(K', V)               =>  kRopeKv (K' used only by the write)
// Returns how many fused nodes it made. The graph stays valid (validate()).
int fuse(Graph& g, const SupportsFn& supports);

}  // namespace inferd::graph
