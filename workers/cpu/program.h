// program.h (private to inferd_backend_cpu) — a graph lowered into the steps every thread of the CPU
// backend walks.
//
// compile() turns the graph's nodes into CPU steps: each matmul-family node gets an encode step for its
// input (the activation encodings its weights consume, once per tensor); in a one-token program
// (`gemv`) every RMSNorm feeding only matmuls and every encode of a token row is *replicated*: each
// thread computes the single row into its own buffer, so the matmul that follows needs no barrier (the
// fused decode GEMV with activation quantization). Steps are split between threads by a partition:
// token rows (the same split for every step), weight-row chunks claimed dynamically, or (token, head)
// units. A barrier goes in front of a step only where it reads or overwrites memory that another thread
// may be writing or reading in the current phase; phases are what lie between barriers.
//
// Memory: every activation tensor gets a buffer — shared (one for all threads) or local (one per
// thread) — whose lifetime is the range of phases from its first write to its last read; a fused
// operator's output reuses its input's buffer where the input dies there (matmul_add's residual,
// rope_kv's Q), so the residual stream is updated in place. Buffers are sized per step shape by the
// backend (ArenaPlan), graph inputs are read where the caller holds them, graph outputs are written
// straight into the caller's vectors.
//
// Thread safety: a Program is an immutable value once compiled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "inferd/graph.h"
#include "matmul.h"

namespace inferd::cpu {

enum class StepKind : uint8_t {
  kEmbed, kRmsNorm, kEncode, kMatmul, kGateUp, kRope, kKvWrite, kRopeKv, kAttention, kSwiglu, kGeglu, kAdd, kGetRows,
  kBarrier,
};

// Where an operand lives. kShared / kLocal: a buffer of the program; kInput / kOutput: the step's host
// tensors (Graph::inputs() / outputs() index).
enum class Loc : uint8_t { kNone, kShared, kLocal, kInput, kOutput };
struct Ref {
  Loc loc = Loc::kNone;
  int32_t index = -1;
  bool operator==(const Ref&) const = default;
};

// A buffer's size: `row_bytes` times the rows of its kind (kOne: per-thread scratch of one row; kKv:
// the step's padded KV length, in floats).
enum class RowsOf : uint8_t { kTokens, kOutputs, kOne, kKv };

struct Buffer {
  std::string name;
  bool local = false;  // one per thread
  RowsOf rows = RowsOf::kTokens;
  size_t row_bytes = 0;
  int first_phase = 0, last_phase = 0;
};

struct Step {
  StepKind kind = StepKind::kBarrier;
  int32_t node = -1;                // the graph node (weights, eps, layer)
  RowsOf rows = RowsOf::kTokens;    // the rows it works on (kTokens or kOutputs)
  bool replicated = false;          // every thread computes every row into its own (local) buffers
  Ref dst, src, src2, res, ints, slots;  // operands, by step kind (cpu_backend.cpp)
  Ref dst2;                         // kRopeKv: unused (the cache is the layer's)
  int act_kinds = 0;                // encode / matmul: bit k = encoding kActTypes[k]
  Ref act[kActKinds];               // the encodings (encode writes them, matmuls read them)
  size_t act_row_bytes[kActKinds] = {};
  int32_t counter = -1;             // matmul family: the chunk counter
  Ref scratch;                      // attention: scores (local); gate_up: the up rows (shared)
  bool round_q = false;             // attention: round Q to half first (its producer did not)
  float q_scale = 0.0f;             // kRopeKv / attention: multiply Q by this before rounding it (0: no): the
                                    // attention node's explicit scale, applied by whichever step rounds Q
};

struct Program {
  bool gemv = false;
  std::vector<Step> steps;
  std::vector<Buffer> buffers;
  int32_t n_counters = 0;
  int32_t n_phases = 0;
};

// Lowers `g` (every node supported by the CPU backend) for steps of one token (`gemv`) or several.
Program compile(const graph::Graph& g, bool gemv);

}  // namespace inferd::cpu
