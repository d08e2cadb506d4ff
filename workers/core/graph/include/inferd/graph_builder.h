// inferd/graph_builder.h — the forward pass of every supported architecture, written once as a Graph.
//
// Every backend runs this graph (or a pipeline stage of it); none has its own forward pass. One layer:
//
//   xn   = rms_norm(x, attn_norm)                   q, k, v = matmul(xn, attn_q|k|v (+ bias: qwen2))
//   [q = rms_norm(q, attn_q_norm) per head; k likewise: qwen3, gemma3]
//   q'   = rope(q)     k' = rope(k)                 kv'     = kv_write(k', v, pos, slot, kv)
//   attn = attention(q', kv', pos, slot)            o       = matmul(attn, attn_output)
//   [o = rms_norm(o, post_attention_norm): gemma3]  x       = add(x, o)
//   xn   = rms_norm(x, ffn_norm)                    h       = swiglu | geglu(matmul(xn, ffn_gate), matmul(xn, ffn_up))
//   d    = matmul(h, ffn_down)   [d = rms_norm(d, post_ffw_norm): gemma3]        x = add(x, d)
//
// Per-layer parameters ride on the nodes: gemma3's embeddings are scaled (embed's scale), its local
// layers have a sliding window (attention's window) and their own RoPE base (rope's rope_base).
//
// The first stage embeds the step's token ids; a later one starts from the previous stage's hidden
// states (input "hidden_in"). The last stage gathers the rows whose logits are wanted, normalises them
// (output_norm) and projects them (output, or token_embd when tied): output "logits", O x n_vocab; an
// earlier one returns its residual stream (output "hidden_out", T x n_embd).
//
// Thread safety: pure functions of the (immutable) model.
#pragma once

#include <cstdint>

#include "inferd/graph.h"
#include "inferd/model.h"
#include "inferd/status.h"

namespace inferd::graph {

// The graph of layers [first_layer, end_layer) of `model` (end_layer 0: through the last). The graph
// points into `model`'s weight views: the model must outlive it. kInvalidArgument for a bad range.
Result<Graph> build_forward(const Model& model, int32_t first_layer = 0, int32_t end_layer = 0);

}  // namespace inferd::graph
