// The model's weight list for the backends (see weights.h).
#include "model/weights.h"

namespace wren {

WeightList weight_list(const ModelWeights& w) { return weight_list(w, 0, int(w.layers.size()), true, true); }

WeightList weight_list(const ModelWeights& w, int first, int end, bool embed, bool head) {
  static const std::vector<ExpertRef> none;
  WeightList out;
  auto& p = out.dense;
  if (embed) p.push_back(&w.embed);
  if (head)
    for (const DenseWeight* d : {&w.final_norm, &w.out_res_norm, &w.out_res_proj, &w.out_mix, &w.lm_head})
      p.push_back(d);
  for (int i = 0; i < int(w.layers.size()); ++i) {
    const LayerWeights& l = w.layers[size_t(i)];
    if (i < first || i >= end) {
      out.experts.push_back(&none);
      continue;
    }
    for (const DenseWeight* d : {&l.input_norm, &l.post_norm, &l.attn_res_norm, &l.attn_res_proj,
                                 &l.mlp_res_norm, &l.mlp_res_proj, &l.attn_mix, &l.mlp_mix})
      p.push_back(d);
    const KdaWeights& k = l.kda;
    for (const DenseWeight* d : {&k.q, &k.k, &k.v, &k.q_conv, &k.k_conv, &k.v_conv, &k.f_a, &k.f_b,
                                 &k.a_log, &k.dt_bias, &k.b, &k.g, &k.g_a, &k.g_b, &k.o_norm, &k.o})
      p.push_back(d);
    const MlaWeights& a = l.mla;
    for (const DenseWeight* d : {&a.q, &a.q_a, &a.q_a_norm, &a.q_b, &a.kv_a, &a.kv_a_norm, &a.kv_b, &a.g, &a.o})
      p.push_back(d);
    for (const DenseWeight* d : {&l.mlp.gate, &l.mlp.up, &l.mlp.down}) p.push_back(d);
    const MoeWeights& m = l.moe;
    for (const DenseWeight* d : {&m.router, &m.bias, &m.down, &m.norm, &m.up, &m.shared_gate,
                                 &m.shared_up, &m.shared_down})
      p.push_back(d);
    out.experts.push_back(&m.experts);
  }
  return out;
}

}  // namespace wren
