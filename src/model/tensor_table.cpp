// The one tensor table (see tensor_table.h). Names and shapes: docs/model.md#tensors.
#include "model/tensor_table.h"

#include "core/mxfp4.h"

namespace wren {

namespace {

using Visit = std::function<void(const TensorSpec&)>;

struct Table {
  const Config& c;
  const Visit& f;
  int layer = -1;
  std::string base;  // "model.layers.N." for per-layer tensors
  ExpertRef* expert = nullptr;  // owner of the dense expert tensors being visited

  void dense(const std::string& name, DenseWeight& dst, std::vector<int64_t> shape,
             WClass cls = WClass::Vector, const std::string& alt = "") {
    dst.rows = shape.size() >= 2 ? shape[0] : 1;
    dst.cols = shape.back();
    if (shape.size() == 3) dst.cols = shape[1] * shape[2];  // conv [P, 1, K] -> [P, K]
    if (shape.size() == 4) dst.rows = 1, dst.cols = shape[2];  // A_log [1, 1, H, 1]
    TensorSpec s;
    s.name = base + name;
    if (!alt.empty()) s.alt_name = base + alt;
    s.shape = std::move(shape);
    s.layer = layer;
    s.dense = &dst;
    s.expert = expert;
    s.cls = cls;
    f(s);
  }

  void mx(ExpertRef& e, MxMatrix& m, const std::string& stem, int rows, int cols, int part) {
    m.rows = rows;
    m.cols = cols;
    TensorSpec s;
    s.layer = layer;
    s.expert = &e;
    s.name = e.name + "." + stem + ".weight_packed";
    s.shape = {rows, cols / 2};
    s.kind = TensorKind::ExpertPacked;
    s.bytes = &m.packed;
    s.part = part;
    f(s);
    s.name = e.name + "." + stem + ".weight_scale";
    s.shape = {rows, cols / mxfp4::kGroup};
    s.kind = TensorKind::ExpertScale;
    s.bytes = &m.scale;
    s.part = part + 1;
    f(s);
  }

  void kda(KdaWeights& k) {
    const int64_t D = c.hidden, P = c.kda_width(), H = c.kda_heads, d = c.kda_head_dim;
    const std::string a = "self_attn.";
    dense(a + "q_proj.weight", k.q, {P, D}, WClass::Attn);
    dense(a + "k_proj.weight", k.k, {P, D}, WClass::Attn);
    dense(a + "v_proj.weight", k.v, {P, D}, WClass::Attn);
    dense(a + "q_conv1d.weight", k.q_conv, {P, 1, c.conv_kernel});
    dense(a + "k_conv1d.weight", k.k_conv, {P, 1, c.conv_kernel});
    dense(a + "v_conv1d.weight", k.v_conv, {P, 1, c.conv_kernel});
    dense(a + "f_a_proj.weight", k.f_a, {d, D}, WClass::Attn);
    dense(a + "f_b_proj.weight", k.f_b, {P, d}, WClass::Attn);
    if (c.a_log_4d) dense(a + "A_log", k.a_log, {1, 1, H, 1});
    else dense(a + "A_log", k.a_log, {c.a_log_len});
    dense(a + "dt_bias", k.dt_bias, {P});
    dense(a + "b_proj.weight", k.b, {H, D}, WClass::Attn);
    if (c.kda_gate_rank == 0) {
      dense(a + "g_proj.weight", k.g, {P, D}, WClass::Attn);
    } else {
      dense(a + "g_a_proj.weight", k.g_a, {c.kda_gate_rank, D}, WClass::Attn);
      dense(a + "g_b_proj.weight", k.g_b, {P, c.kda_gate_rank}, WClass::Attn);
    }
    dense(a + "o_norm.weight", k.o_norm, {d});
    dense(a + "o_proj.weight", k.o, {D, P}, WClass::Attn);
  }

  void mla(MlaWeights& m) {
    const int64_t D = c.hidden, H = c.mla_heads;
    const std::string a = "self_attn.";
    if (c.q_lora > 0) {
      dense(a + "q_a_proj.weight", m.q_a, {c.q_lora, D}, WClass::Mla);
      dense(a + "q_a_layernorm.weight", m.q_a_norm, {c.q_lora});
      dense(a + "q_b_proj.weight", m.q_b, {H * c.mla_q_head(), c.q_lora}, WClass::Mla);
    } else {
      dense(a + "q_proj.weight", m.q, {H * c.mla_q_head(), D}, WClass::Mla);
    }
    dense(a + "kv_a_proj_with_mqa.weight", m.kv_a, {c.mla_cache_width(), D}, WClass::Mla);
    dense(a + "kv_a_layernorm.weight", m.kv_a_norm, {c.kv_lora});
    dense(a + "kv_b_proj.weight", m.kv_b, {H * (c.qk_nope + c.v_head), c.kv_lora}, WClass::Mla);
    if (c.mla_out_gate) dense(a + "g_proj.weight", m.g, {H * c.v_head, D}, WClass::Mla);
    dense(a + "o_proj.weight", m.o, {D, H * c.v_head}, WClass::Mla);
  }

  void moe(MoeWeights& m) {
    const int64_t D = c.hidden, E = c.n_experts, S = c.shared_inter();
    const std::string a = "block_sparse_moe.";
    dense(a + "gate.weight", m.router, {E, D}, WClass::Router);
    dense(a + "gate.e_score_correction_bias", m.bias, {E});
    if (c.moe_kind == MoeKind::Latent) {
      dense(a + "routed_expert_down_proj.weight", m.down, {c.latent, D}, WClass::Latent);
      dense(a + "routed_expert_norm.weight", m.norm, {c.latent});
      dense(a + "routed_expert_up_proj.weight", m.up, {D, c.latent}, WClass::Latent);
    }
    dense(a + "shared_experts.gate_proj.weight", m.shared_gate, {S, D}, WClass::Shared);
    dense(a + "shared_experts.up_proj.weight", m.shared_up, {S, D}, WClass::Shared);
    dense(a + "shared_experts.down_proj.weight", m.shared_down, {D, S}, WClass::Shared);
    m.experts.resize(c.n_experts);
    for (int e = 0; e < c.n_experts; ++e) {
      ExpertRef& x = m.experts[e];
      x.name = expert_name(layer, e);
      const int io = c.expert_io();
      if (c.expert_format == ExpertFormat::MXFP4) {
        mx(x, x.w1, "w1", c.moe_inter, io, 0);
        mx(x, x.w2, "w2", io, c.moe_inter, 2);
        mx(x, x.w3, "w3", c.moe_inter, io, 4);
      } else {
        const std::string stem = "block_sparse_moe.experts." + std::to_string(e) + ".";
        expert = &x;
        dense(stem + "w1.weight", x.d1, {c.moe_inter, io}, WClass::Expert);
        dense(stem + "w2.weight", x.d2, {io, c.moe_inter}, WClass::Expert);
        dense(stem + "w3.weight", x.d3, {c.moe_inter, io}, WClass::Expert);
        expert = nullptr;
      }
    }
  }

  void layer_tensors(int i, LayerWeights& l) {
    layer = i;
    base = "model.layers." + std::to_string(i) + ".";
    const int64_t D = c.hidden;
    dense("input_layernorm.weight", l.input_norm, {D});
    dense("post_attention_layernorm.weight", l.post_norm, {D});
    if (c.residual == Residual::AttnRes) {
      dense("self_attention_res_norm.weight", l.attn_res_norm, {D});
      dense("self_attention_res_proj.weight", l.attn_res_proj, {1, D});
      dense("mlp_res_norm.weight", l.mlp_res_norm, {D});
      dense("mlp_res_proj.weight", l.mlp_res_proj, {1, D});
    }
    if (c.layers[i].mixer == Mixer::KDA) kda(l.kda);
    else mla(l.mla);
    if (c.layers[i].ffn == Ffn::Dense) {
      // transformers' save_pretrained names Kimi Linear's dense layer `block_sparse_moe.*`
      // (docs/model.md#kimi-linear); the released checkpoints use `mlp.*`. Accept both.
      dense("mlp.gate_proj.weight", l.mlp.gate, {c.dense_inter, D}, WClass::Dense, "block_sparse_moe.gate_proj.weight");
      dense("mlp.up_proj.weight", l.mlp.up, {c.dense_inter, D}, WClass::Dense, "block_sparse_moe.up_proj.weight");
      dense("mlp.down_proj.weight", l.mlp.down, {D, c.dense_inter}, WClass::Dense, "block_sparse_moe.down_proj.weight");
    } else {
      moe(l.moe);
    }
  }
};

}  // namespace

std::string expert_name(int layer, int expert) {
  return "model.layers." + std::to_string(layer) + ".block_sparse_moe.experts." + std::to_string(expert);
}

void for_each_tensor(const Config& c, ModelWeights& w, const Visit& f) {
  Table t{c, f, -1, "", nullptr};
  const int64_t D = c.hidden, V = c.vocab;
  t.dense("model.embed_tokens.weight", w.embed, {V, D}, WClass::Embed);
  t.dense("model.norm.weight", w.final_norm, {D});
  if (c.residual == Residual::AttnRes) {
    t.dense("model.output_attn_res_norm.weight", w.out_res_norm, {D});
    t.dense("model.output_attn_res_proj.weight", w.out_res_proj, {1, D});
  }
  t.dense("lm_head.weight", w.lm_head, {V, D}, WClass::Head);
  w.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) t.layer_tensors(i, w.layers[i]);
}

}  // namespace wren
