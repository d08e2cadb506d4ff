#include "inferd/graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "inferd/graph_builder.h"
#include "inferd/placement.h"

namespace inferd::graph {
namespace {

// A 6-layer llama (Q4_0, Q8_0, Q4_K, Q6_K weights) and a 2-layer qwen2 (Q/K/V biases, tied output).
const char* kMixed = INFERD_TEST_DATA_DIR "/models/mixed-small.gguf";
const char* kQwen2 = INFERD_TEST_DATA_DIR "/models/qwen2-small.gguf";

std::shared_ptr<const Model> open(const char* path) {
  auto m = Model::open(path);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? m.value() : nullptr;
}

std::map<Op, int> count_ops(const Graph& g) {
  std::map<Op, int> n;
  for (const Node& node : g.nodes()) ++n[node.op];
  return n;
}

bool everything(const Graph&, const Node&) { return true; }

// phi3: the fused attn_qkv and gate/up tensors are bound as row ranges of one tensor each, and Q is scaled before
// the product by 1/sqrt(head_dim).
TEST(Graph, APhi3ModelsFusedMatricesAreRowRanges) {
  auto model = open(INFERD_TEST_DATA_DIR "/models/phi3-small.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  for (int i = 0; i < c.n_layer; ++i) {
    const LayerWeights& l = model->layer(i);
    EXPECT_EQ(l.wq.rows, c.n_embd_q());
    EXPECT_EQ(l.wk.rows, c.n_embd_kv());
    EXPECT_EQ(l.wv.rows, c.n_embd_kv());
    EXPECT_EQ(l.wk.data, l.wq.data + static_cast<size_t>(l.wq.rows) * l.wq.row_bytes);
    EXPECT_EQ(l.wv.data, l.wk.data + static_cast<size_t>(l.wk.rows) * l.wk.row_bytes);
    EXPECT_EQ(l.w_gate.rows, c.n_ff);
    EXPECT_EQ(l.w_up.rows, c.n_ff);
    EXPECT_EQ(l.w_up.data, l.w_gate.data + static_cast<size_t>(c.n_ff) * l.w_gate.row_bytes);
  }
  auto g = build_forward(*model);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  int attention = 0;
  for (const Node& node : g->nodes()) {
    if (node.op != Op::kAttention) continue;
    ++attention;
    EXPECT_FLOAT_EQ(node.scale, 1.0f / std::sqrt(static_cast<float>(c.head_dim)));
    EXPECT_EQ(node.window, 0);
  }
  EXPECT_EQ(attention, c.n_layer);
}

// gemma3: Q/K norms per head, post norms, GeGLU, scaled embeddings, sliding-window layers with their own
// RoPE base; what the parameters say rides on the nodes, and fusion makes matmul_geglu.
TEST(Graph, TheForwardPassOfAGemma3Model) {
  auto model = open(INFERD_TEST_DATA_DIR "/models/gemma3-small.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  auto g = build_forward(*model);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const int L = c.n_layer;
  std::map<Op, int> n = count_ops(g.value());
  EXPECT_EQ(n[Op::kRmsNorm], 6 * L + 1);  // attn, q, k, post-attention, ffn, post-ffn; the output norm
  EXPECT_EQ(n[Op::kGeglu], L);
  EXPECT_EQ(n[Op::kSwiglu], 0);
  for (const Node& node : g->nodes()) {
    switch (node.op) {
      case Op::kEmbed: EXPECT_FLOAT_EQ(node.scale, std::sqrt(static_cast<float>(c.n_embd))); break;
      case Op::kAttention:
        EXPECT_EQ(node.window, c.layer_swa(node.layer) ? c.swa_window : 0) << node.layer;
        // Q is scaled before the product (llama.cpp's gemma3 graph), on every layer: a variant.
        EXPECT_FLOAT_EQ(node.scale, 1.0f / std::sqrt(static_cast<float>(c.head_dim)));
        EXPECT_TRUE(uses_variants(g.value(), node)) << node.layer;
        break;
      case Op::kRope:
        EXPECT_EQ(g->heads.rope_base_of(node), c.layer_rope_base(node.layer)) << node.layer;
        break;
      case Op::kRmsNorm:
        // The Q/K norms normalize each head: their weight is one head wide (K has one head here, so its
        // norm is an ordinary one).
        if (g->tensor(node.out[0]).name.find("q_norm") != std::string::npos) {
          EXPECT_EQ(g->tensor(node.in[1]).cols, c.head_dim);
          EXPECT_TRUE(uses_variants(g.value(), node));
        }
        break;
      default: break;
    }
  }
  EXPECT_EQ(g->tensor(g->io.logits).cols, c.n_vocab);
  Graph fused = g.value();
  fuse(fused, everything);
  std::map<Op, int> f = count_ops(fused);
  EXPECT_EQ(f[Op::kMatmulGeglu], L);
  EXPECT_EQ(f[Op::kRopeKv], L);
  EXPECT_EQ(f[Op::kMatmulAdd], 0);  // the post norms stand between the matmuls and the residual adds
  EXPECT_TRUE(fused.validate());
  for (const Node& node : fused.nodes()) {
    if (node.op == Op::kRopeKv) {
      EXPECT_EQ(fused.heads.rope_base_of(node), c.layer_rope_base(node.layer));
    }
  }
  // The post-FFN norm needs the whole FFN: its neurons cannot be split between workers.
  PlacementPlan plan;
  plan.workers = {{"cpu"}, {"cpu"}};
  plan.assignments = {Assignment{0, true, 0, L, true, {}, 0, 0}, Assignment{1, false, 0, L, false, {}, 0, 64}};
  auto placed = assign_nodes(g.value(), plan);
  ASSERT_FALSE(placed.is_ok());
  EXPECT_NE(placed.status().message().find("neurons cannot be split"), std::string::npos) << placed.status().to_string();
}

TEST(Graph, TheForwardPassOfALlamaModel) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  auto g = build_forward(*model);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const int L = model->config().n_layer;
  std::map<Op, int> n = count_ops(g.value());
  EXPECT_EQ(n[Op::kEmbed], 1);
  EXPECT_EQ(n[Op::kRmsNorm], 2 * L + 1);
  EXPECT_EQ(n[Op::kMatmul], 7 * L + 1);  // q k v o gate up down per layer, the output projection
  EXPECT_EQ(n[Op::kRope], 2 * L);
  EXPECT_EQ(n[Op::kKvWrite], L);
  EXPECT_EQ(n[Op::kAttention], L);
  EXPECT_EQ(n[Op::kSwiglu], L);
  EXPECT_EQ(n[Op::kAdd], 2 * L);
  EXPECT_EQ(n[Op::kGetRows], 1);
  EXPECT_NE(g->io.token_ids, kNone);
  EXPECT_EQ(g->io.hidden_in, kNone);
  ASSERT_NE(g->io.logits, kNone);
  EXPECT_EQ(g->tensor(g->io.logits).cols, model->config().n_vocab);
  EXPECT_EQ(g->tensor(g->io.logits).rows, Rows::kOutputs);
  // The logits, and the rows' normalized hidden states they are computed from (for embeddings).
  EXPECT_EQ(g->outputs(), (std::vector<TensorId>{g->io.logits, g->io.embd}));
  ASSERT_NE(g->io.embd, kNone);
  EXPECT_EQ(g->tensor(g->io.embd).cols, model->config().n_embd);
  EXPECT_EQ(g->tensor(g->io.embd).rows, Rows::kOutputs);
  EXPECT_EQ(g->tensor(g->io.embd).name, "output_norm");
  // Every matmul names its weight tensor and type, as the file has them.
  const std::string text = g->to_string();
  EXPECT_NE(text.find("blk.0: blk.0.q = matmul(blk.0.attn_norm, blk.0.attn_q.weight["), std::string::npos) << text;
  EXPECT_NE(text.find("logits = matmul(output_norm, output.weight["), std::string::npos) << text;
}

TEST(Graph, PipelineStagesTakeHiddenStatesAndHandThemOn) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  auto head = build_forward(*model, 0, 2);
  auto tail = build_forward(*model, 2, 0);
  ASSERT_TRUE(head.is_ok() && tail.is_ok());
  EXPECT_EQ(head->io.logits, kNone);
  ASSERT_NE(head->io.hidden_out, kNone);
  EXPECT_EQ(head->tensor(head->io.hidden_out).role, Role::kResidual);
  EXPECT_EQ(count_ops(head.value())[Op::kGetRows], 0);
  EXPECT_EQ(tail->io.token_ids, kNone);
  EXPECT_NE(tail->io.hidden_in, kNone);
  EXPECT_EQ(count_ops(tail.value())[Op::kEmbed], 0);
  EXPECT_EQ(count_ops(tail.value())[Op::kAttention], model->config().n_layer - 2);
  EXPECT_EQ(build_forward(*model, 3, 3).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(build_forward(*model, 0, 99).status().code(), Code::kInvalidArgument);
}

TEST(Graph, Qwen2BiasesAndTiedOutput) {
  auto model = open(kQwen2);
  ASSERT_TRUE(model);
  auto g = build_forward(*model);
  ASSERT_TRUE(g.is_ok());
  int biased = 0;
  for (const Node& n : g->nodes()) biased += n.op == Op::kMatmul && n.in[2] != kNone;
  EXPECT_EQ(biased, 3 * model->config().n_layer);
  const Node& out = g->nodes().back();
  EXPECT_EQ(g->tensor(out.in[1]).weight, &model->token_embd());  // the embedding table projects
}

TEST(Fuse, EveryPatternWhereTheBackendSupportsIt) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  Graph g = build_forward(*model).value();
  const size_t before = g.nodes().size();
  const int L = model->config().n_layer;
  EXPECT_EQ(fuse(g, everything), 4 * L);  // o + add, down + add, gate/up + swiglu, rope q/k + kv write
  ASSERT_TRUE(g.validate().is_ok()) << g.validate().to_string();
  std::map<Op, int> n = count_ops(g);
  EXPECT_EQ(n[Op::kMatmulAdd], 2 * L);
  EXPECT_EQ(n[Op::kMatmulSwiglu], L);
  EXPECT_EQ(n[Op::kRopeKv], L);
  EXPECT_EQ(n[Op::kAdd] + n[Op::kSwiglu] + n[Op::kRope] + n[Op::kKvWrite], 0);
  EXPECT_EQ(n[Op::kMatmul], 3 * L + 1);  // q, k, v and the output projection stay
  EXPECT_EQ(g.nodes().size(), before - 2 * L - 2 * L - 2 * L);
  for (const Node& node : g.nodes()) {
    if (is_fused(node.op)) {
      EXPECT_GE(node.layer, 0);
    }
  }
}

TEST(Fuse, OnlyWhatTheBackendSupports) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  Graph g = build_forward(*model).value();
  // A backend without matmul_add (the OpenCL backend's choice): the adds stay.
  const int fused = fuse(g, [](const Graph&, const Node& n) { return n.op != Op::kMatmulAdd; });
  EXPECT_EQ(fused, 2 * model->config().n_layer);
  std::map<Op, int> n = count_ops(g);
  EXPECT_EQ(n[Op::kMatmulAdd], 0);
  EXPECT_EQ(n[Op::kAdd], 2 * model->config().n_layer);
  EXPECT_TRUE(g.validate().is_ok());
  Graph none = build_forward(*model).value();
  EXPECT_EQ(fuse(none, [](const Graph&, const Node&) { return false; }), 0);
}

TEST(Fuse, BiasedMatmulsAreNotFusedIntoSwiglu) {
  auto model = open(kQwen2);
  ASSERT_TRUE(model);
  Graph g = build_forward(*model).value();
  fuse(g, everything);
  EXPECT_TRUE(g.validate().is_ok());
  // Q/K/V keep their biases; RoPE and the KV write still fuse around them.
  EXPECT_EQ(count_ops(g)[Op::kRopeKv], model->config().n_layer);
}

// Regression: rope_kv produces Q' where the KV write stood and rounds it to half; it must not be fused
// when something other than a later attention reads Q'.
TEST(Fuse, RopeKvOnlyWhereAttentionAloneReadsQ) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  Graph g = build_forward(*model).value();
  TensorId q_rope = kNone;
  for (const Node& n : g.nodes()) {
    if (n.op == Op::kRope && n.layer == 0) {
      q_rope = n.out[0];
      break;
    }
  }
  ASSERT_NE(q_rope, kNone);
  g.mark_output(q_rope);  // another reader of layer 0's Q'
  fuse(g, everything);
  EXPECT_TRUE(g.validate().is_ok()) << g.validate().to_string();
  EXPECT_EQ(count_ops(g)[Op::kRopeKv], model->config().n_layer - 1);
}

TEST(Validate, RefusesBrokenGraphs) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  Graph g = build_forward(*model).value();
  // An output that nothing computes.
  Tensor t;
  t.name = "dangling";
  t.cols = 4;
  g.mark_output(g.add_tensor(t));
  Status s = g.validate();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("dangling"), std::string::npos) << s.message();
  // A matmul whose weight does not match its input.
  Graph h = build_forward(*model).value();
  for (Node& n : h.mutable_nodes()) {
    if (n.op == Op::kMatmul) {
      n.in[0] = h.io.token_ids;  // one column, against a weight of n_embd
      break;
    }
  }
  EXPECT_EQ(h.validate().code(), Code::kInvalidArgument);
  // A node that writes a graph input, or a weight.
  Graph k = build_forward(*model).value();
  k.mutable_nodes().front().out[0] = k.io.positions;
  EXPECT_EQ(k.validate().code(), Code::kInvalidArgument);
  // Attention of a layer the graph does not have.
  Graph l = build_forward(*model, 0, 2).value();
  for (Node& n : l.mutable_nodes()) {
    if (n.op == Op::kAttention) n.layer = 4;
  }
  EXPECT_EQ(l.validate().code(), Code::kInvalidArgument);
}

// ---- Placement --------------------------------------------------------------------------------------

TEST(Placement, OneWorkerRunsEverything) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  const Graph g = build_forward(*model).value();
  auto plan = plan_pipeline(model->config().n_layer, {}, "cpu", {});
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->summary(), "cpu:0 layers 0-5 + embeddings + output");
  auto placed = assign_nodes(g, plan.value());
  ASSERT_TRUE(placed.is_ok());
  for (const NodePlacement& p : placed.value()) {
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].worker, 0u);
  }
  EXPECT_TRUE(exchanges(g, placed.value()).empty());
  auto stages = pipeline_stages(g, plan.value());
  ASSERT_TRUE(stages.is_ok());
  ASSERT_EQ(stages->size(), 1u);
  EXPECT_EQ((*stages)[0].first_layer, 0);
  EXPECT_EQ((*stages)[0].end_layer, 6);
  EXPECT_TRUE((*stages)[0].embeddings && (*stages)[0].output);
}

TEST(Placement, LayerSplitIsAPipelineThatHandsOnTheResidualStream) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  const Graph g = build_forward(*model).value();
  auto plan = plan_pipeline(6, {2, 5}, "cpu", {"opencl", "cpu", "opencl:1"});
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->summary(), "opencl:0 layers 0-1 + embeddings | cpu:1 layers 2-4 | opencl:1:2 layer 5 + output");
  auto placed = assign_nodes(g, plan.value());
  ASSERT_TRUE(placed.is_ok());
  const std::vector<Exchange> x = exchanges(g, placed.value());
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(x[0].name, "blk.1.ffn_res");
  EXPECT_EQ(x[0].from, 0u);
  EXPECT_EQ(x[0].to, 1u);
  EXPECT_EQ(x[0].cols, model->config().n_embd);
  EXPECT_EQ(x[1].name, "blk.4.ffn_res");
  auto stages = pipeline_stages(g, plan.value());
  ASSERT_TRUE(stages.is_ok()) << stages.status().to_string();
  ASSERT_EQ(stages->size(), 3u);
  EXPECT_EQ((*stages)[1].backend, "cpu");
  EXPECT_EQ((*stages)[1].first_layer, 2);
  EXPECT_EQ((*stages)[1].end_layer, 5);
  EXPECT_FALSE((*stages)[1].embeddings || (*stages)[1].output);
  EXPECT_TRUE((*stages)[2].output);
}

TEST(Placement, BadSplitsAreRefused) {
  EXPECT_EQ(plan_pipeline(6, {0}, "cpu", {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(plan_pipeline(6, {3, 3}, "cpu", {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(plan_pipeline(6, {6}, "cpu", {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(plan_pipeline(6, {3}, "cpu", {"cpu"}).status().code(), Code::kInvalidArgument);
}

TEST(Placement, AnOperatorOnAnotherBackendIsExpressedButNotRunYet) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  const Graph g = build_forward(*model).value();
  // Everything on the GPU, attention of layer 3 on a CPU worker (OATO's offloaded operator).
  PlacementPlan plan;
  plan.workers = {{"opencl"}, {"cpu"}};
  Assignment all;
  all.worker = 0;
  all.embeddings = all.output = true;
  all.first_layer = 0;
  all.end_layer = 6;
  Assignment attention;
  attention.worker = 1;
  attention.first_layer = 3;
  attention.end_layer = 4;
  attention.ops = {Op::kAttention};
  plan.assignments = {all, attention};
  EXPECT_EQ(plan.summary(), "opencl:0 layers 0-5 + embeddings + output | cpu:1 layer 3 (attention)");
  auto placed = assign_nodes(g, plan);
  ASSERT_TRUE(placed.is_ok());
  int on_cpu = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if ((*placed)[i][0].worker == 1) {
      ++on_cpu;
      EXPECT_EQ(g.nodes()[i].op, Op::kAttention);
      EXPECT_EQ(g.nodes()[i].layer, 3);
    }
  }
  EXPECT_EQ(on_cpu, 1);
  // Q and the cache go to the CPU worker, the attention output comes back.
  std::vector<std::string> names;
  for (const Exchange& x : exchanges(g, placed.value())) names.push_back(x.name);
  EXPECT_EQ(names, (std::vector<std::string>{"blk.3.q_rope", "blk.3.kv'", "blk.3.attn"}));
  Status s = pipeline_stages(g, plan).status();
  EXPECT_EQ(s.code(), Code::kUnimplemented);
  EXPECT_NE(s.message().find("apart from its layer"), std::string::npos) << s.message();
}

TEST(Placement, ColdFfnNeuronsOnTheCpuAreExpressedButNotRunYet) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  const Graph g = build_forward(*model).value();
  const int64_t n_ff = model->config().n_ff;
  // PowerInfer's split: the hot half of every FFN on the GPU, the cold half on the CPU.
  PlacementPlan plan;
  plan.workers = {{"opencl"}, {"cpu"}};
  Assignment all{0, true, 0, 6, true, {}, 0, 0};
  Assignment cold{1, false, 0, 6, false, {}, n_ff / 2, n_ff};
  plan.assignments = {all, cold};
  EXPECT_NE(plan.summary().find("(ffn neurons 512-1023)"), std::string::npos) << plan.summary();
  auto placed = assign_nodes(g, plan);
  ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
  int split = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const NodePlacement& p = (*placed)[i];
    if (p.size() == 2) {
      ++split;
      EXPECT_EQ(p[0].worker, 0u);
      EXPECT_EQ(p[0].neuron_end, n_ff / 2);
      EXPECT_EQ(p[1].worker, 1u);
      EXPECT_EQ(p[1].neuron_begin, n_ff / 2);
    }
  }
  EXPECT_EQ(split, 4 * model->config().n_layer);  // gate, up, swiglu, down
  EXPECT_EQ(pipeline_stages(g, plan).status().code(), Code::kUnimplemented);
  Assignment outside{1, false, 0, 6, false, {}, 0, n_ff + 1};
  plan.assignments = {all, outside};
  EXPECT_EQ(assign_nodes(g, plan).status().code(), Code::kInvalidArgument);
}

TEST(Placement, EveryNodeNeedsAWorker) {
  auto model = open(kMixed);
  ASSERT_TRUE(model);
  const Graph g = build_forward(*model).value();
  PlacementPlan plan;
  plan.workers = {{"cpu"}};
  plan.assignments = {Assignment{0, true, 0, 5, true, {}, 0, 0}};  // layer 5 forgotten
  Status s = assign_nodes(g, plan).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("blk.5"), std::string::npos) << s.message();
  plan.assignments = {Assignment{3, true, 0, 6, true, {}, 0, 0}};
  EXPECT_EQ(assign_nodes(g, plan).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace inferd::graph
