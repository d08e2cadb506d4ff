#include "inferd/graph_builder.h"

namespace inferd::graph {

namespace {

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  TensorId weight(const WeightView& w, std::string name) {
    Tensor t;
    t.name = std::move(name);
    t.kind = TensorKind::kWeight;
    t.elem = Elem::kWeight;
    t.rows = Rows::kFixed;
    t.fixed_rows = w.rows;
    t.cols = w.cols;
    t.weight = &w;
    return g_.add_tensor(std::move(t));
  }
  TensorId input(std::string name, Elem elem, Rows rows, int64_t cols, Role role = Role::kOther) {
    Tensor t;
    t.name = std::move(name);
    t.kind = TensorKind::kInput;
    t.elem = elem;
    t.rows = rows;
    t.cols = cols;
    t.role = role;
    const TensorId id = g_.add_tensor(std::move(t));
    g_.mark_input(id);
    return id;
  }
  TensorId act(std::string name, int64_t cols, int32_t layer, Rows rows = Rows::kTokens, Role role = Role::kOther) {
    Tensor t;
    t.name = std::move(name);
    t.rows = rows;
    t.cols = cols;
    t.layer = layer;
    t.role = role;
    return g_.add_tensor(std::move(t));
  }
  TensorId cache(std::string name, int32_t layer) {
    Tensor t;
    t.name = std::move(name);
    t.kind = TensorKind::kKvCache;
    t.rows = Rows::kFixed;
    t.layer = layer;
    return g_.add_tensor(std::move(t));
  }
  // The part of the model the nodes added next belong to.
  void part(Part p) { part_ = p; }

  TensorId node(Op op, int32_t layer, std::initializer_list<TensorId> in, TensorId out, float eps = 0.0f) {
    Node n;
    n.eps = eps;
    return node(n, op, layer, in, out);
  }
  // A node with parameters (`n`'s scale, rope and window fields).
  TensorId node(Node n, Op op, int32_t layer, std::initializer_list<TensorId> in, TensorId out) {
    n.op = op;
    n.part = part_;
    n.layer = layer;
    size_t i = 0;
    for (TensorId id : in) n.in[i++] = id;
    n.out[0] = out;
    g_.add_node(n);
    return out;
  }

 private:
  Graph& g_;
  Part part_ = Part::kEmbeddings;
};

}  // namespace

Result<Graph> build_forward(const Model& model, int32_t first_layer, int32_t end_layer) {
  const ModelConfig& c = model.config();
  if (end_layer == 0) end_layer = c.n_layer;
  if (first_layer < 0 || first_layer >= end_layer || end_layer > c.n_layer) {
    return make_error(Code::kInvalidArgument, "layer range [%d, %d) is not inside the model's %d layers", first_layer,
                      end_layer, c.n_layer);
  }
  Graph g;
  g.first_layer = first_layer;
  g.end_layer = end_layer;
  g.n_vocab = c.n_vocab;
  g.n_embd = c.n_embd;
  g.n_ff = c.n_ff;
  g.heads = Heads{c.n_head, c.n_head_kv, c.head_dim, c.rope_base, c.rope_style};
  Builder b(g);
  const int64_t E = c.n_embd, Eq = c.n_embd_q(), Ekv = c.n_embd_kv(), F = c.n_ff;
  const bool first = first_layer == 0, last = end_layer == c.n_layer;

  TensorId x;
  b.part(Part::kEmbeddings);
  if (first) {
    g.io.token_ids = b.input("tokens", Elem::kInt32, Rows::kTokens, 1);
    Node embed;
    embed.scale = c.embd_scale != 1.0f ? c.embd_scale : 0.0f;
    x = b.node(embed, Op::kEmbed, -1, {g.io.token_ids, b.weight(model.token_embd(), "token_embd.weight")},
               b.act("embd", E, -1, Rows::kTokens, Role::kResidual));
  } else {
    g.io.hidden_in = b.input("hidden_in", Elem::kFloat, Rows::kTokens, E, Role::kResidual);
    x = g.io.hidden_in;
  }
  g.io.positions = b.input("positions", Elem::kInt32, Rows::kTokens, 1);
  g.io.slots = b.input("slots", Elem::kInt32, Rows::kTokens, 1);

  for (int32_t l = first_layer; l < end_layer; ++l) {
    const LayerWeights& w = model.layer(l);
    const std::string p = "blk." + std::to_string(l) + ".";
    auto weight = [&](const WeightView& v, const char* name) { return b.weight(v, p + name + ".weight"); };
    auto bias = [&](const WeightView& v, const char* name) {
      return v.present() ? b.weight(v, p + name + ".bias") : kNone;
    };
    b.part(Part::kAttention);
    const TensorId xn = b.node(Op::kRmsNorm, l, {x, weight(w.attn_norm, "attn_norm")}, b.act(p + "attn_norm", E, l),
                               c.rms_eps);
    TensorId q = b.node(Op::kMatmul, l, {xn, weight(w.wq, "attn_q"), bias(w.bq, "attn_q")}, b.act(p + "q", Eq, l));
    TensorId k = b.node(Op::kMatmul, l, {xn, weight(w.wk, "attn_k"), bias(w.bk, "attn_k")}, b.act(p + "k", Ekv, l));
    const TensorId v = b.node(Op::kMatmul, l, {xn, weight(w.wv, "attn_v"), bias(w.bv, "attn_v")}, b.act(p + "v", Ekv, l));
    if (c.qk_norm) {  // RMSNorm over each head
      q = b.node(Op::kRmsNorm, l, {q, weight(w.q_norm, "attn_q_norm")}, b.act(p + "q_norm", Eq, l), c.rms_eps);
      k = b.node(Op::kRmsNorm, l, {k, weight(w.k_norm, "attn_k_norm")}, b.act(p + "k_norm", Ekv, l), c.rms_eps);
    }
    Node rope;
    rope.rope_base = c.layer_rope_base(l) != c.rope_base ? c.layer_rope_base(l) : 0.0f;
    rope.rope_freq_scale = c.layer_rope_freq_scale(l);
    rope.rope_factors = model.rope_freqs().present() ? &model.rope_freqs() : nullptr;
    const TensorId q_rot = b.node(rope, Op::kRope, l, {q, g.io.positions}, b.act(p + "q_rope", Eq, l));
    const TensorId k_rot = b.node(rope, Op::kRope, l, {k, g.io.positions}, b.act(p + "k_rope", Ekv, l));
    const TensorId kv = b.node(Op::kKvWrite, l, {k_rot, v, g.io.positions, g.io.slots, b.cache(p + "kv", l)},
                               b.cache(p + "kv'", l));
    Node attention;
    attention.scale = c.attn_scale;  // 0: the default 1/sqrt(head_dim)
    attention.window = c.layer_swa(l) ? c.swa_window : 0;
    const TensorId attn = b.node(attention, Op::kAttention, l, {q_rot, kv, g.io.positions, g.io.slots},
                                 b.act(p + "attn", Eq, l));
    TensorId proj = b.node(Op::kMatmul, l, {attn, weight(w.wo, "attn_output")}, b.act(p + "attn_out", E, l));
    if (c.post_norms) {
      proj = b.node(Op::kRmsNorm, l, {proj, weight(w.attn_post_norm, "post_attention_norm")},
                    b.act(p + "attn_post_norm", E, l), c.rms_eps);
    }
    x = b.node(Op::kAdd, l, {x, proj}, b.act(p + "attn_res", E, l, Rows::kTokens, Role::kResidual));
    b.part(Part::kFfn);
    const TensorId fn = b.node(Op::kRmsNorm, l, {x, weight(w.ffn_norm, "ffn_norm")}, b.act(p + "ffn_norm", E, l),
                               c.rms_eps);
    const TensorId gate = b.node(Op::kMatmul, l, {fn, weight(w.w_gate, "ffn_gate")}, b.act(p + "ffn_gate", F, l));
    const TensorId up = b.node(Op::kMatmul, l, {fn, weight(w.w_up, "ffn_up")}, b.act(p + "ffn_up", F, l));
    const Op glu = c.ffn_act == FfnActivation::kSilu ? Op::kSwiglu : Op::kGeglu;
    const TensorId h = b.node(glu, l, {gate, up}, b.act(p + "ffn_h", F, l));
    TensorId down = b.node(Op::kMatmul, l, {h, weight(w.w_down, "ffn_down")}, b.act(p + "ffn_out", E, l));
    if (c.post_norms) {
      down = b.node(Op::kRmsNorm, l, {down, weight(w.ffn_post_norm, "post_ffw_norm")}, b.act(p + "ffn_post_norm", E, l),
                    c.rms_eps);
    }
    x = b.node(Op::kAdd, l, {x, down}, b.act(p + "ffn_res", E, l, Rows::kTokens, Role::kResidual));
  }

  if (!last) {
    g.io.hidden_out = x;
    g.mark_output(x);
  } else {
    b.part(Part::kOutput);
    g.io.out_rows = b.input("out_rows", Elem::kInt32, Rows::kOutputs, 1);
    const TensorId rows =
        b.node(Op::kGetRows, -1, {x, g.io.out_rows}, b.act("out_rows_x", E, -1, Rows::kOutputs, Role::kResidual));
    const TensorId norm = b.node(Op::kRmsNorm, -1, {rows, b.weight(model.output_norm(), "output_norm.weight")},
                                 b.act("output_norm", E, -1, Rows::kOutputs), c.rms_eps);
    const TensorId out_w = c.tied_output ? b.weight(model.token_embd(), "token_embd.weight")
                                         : b.weight(model.output(), "output.weight");
    g.io.logits = b.node(Op::kMatmul, -1, {norm, out_w}, b.act("logits", c.n_vocab, -1, Rows::kOutputs, Role::kLogits));
    g.mark_output(g.io.logits);
    g.io.embd = norm;
    g.mark_output(norm);
  }
  INFERD_RETURN_IF_ERROR(g.validate());
  return g;
}

}  // namespace inferd::graph
