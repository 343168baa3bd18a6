// The model's weights: per layer the op-level weight structs (ops/weights.h), plus the top-level
// tensors and the storage behind them. Shapes follow docs/model.md#tensors (PyTorch Linear layout
// [out, in], row-major).
#pragma once
#include <memory>
#include <vector>

#include "ops/weights.h"

namespace wren {

struct LayerWeights {
  DenseWeight input_norm, post_norm;        ///< [D]
  DenseWeight attn_res_norm, attn_res_proj;  ///< [D], [1, D]
  DenseWeight mlp_res_norm, mlp_res_proj;    ///< [D], [1, D]
  DenseWeight attn_mix, mlp_mix;  ///< derived [D]: res_norm ⊙ res_proj (docs/model.md#attnres)
  KdaWeights kda;
  MlaWeights mla;
  DenseMlpWeights mlp;
  MoeWeights moe;
};

struct ModelWeights {
  DenseWeight embed;  ///< [V, D]
  DenseWeight final_norm, out_res_norm, out_res_proj;  ///< [D], [D], [1, D]
  DenseWeight out_mix;  ///< derived [D]
  DenseWeight lm_head;  ///< [V, D]
  std::vector<LayerWeights> layers;

  /// Owned f32 storage behind the DenseWeight pointers.
  std::vector<std::unique_ptr<float[]>> arena;
  float* alloc(size_t n);
};

/// Every weight of `w` as the backends take them: the dense tensors (top-level ones, then per layer
/// norms, KDA, MLA, dense MLP and MoE tensors) and each layer's expert list.
WeightList weight_list(const ModelWeights& w);
/// The weights of one pipeline stage (docs/parallel.md): layers [first, end) with their experts
/// (other layers' expert lists empty, so the list stays indexed by layer), plus the embedding when
/// `embed` (the first stage) and the final mix, norm and lm_head when `head` (the last stage).
WeightList weight_list(const ModelWeights& w, int first, int end, bool embed, bool head);

}  // namespace wren
