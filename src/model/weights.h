// The model's weights: per layer the op-level weight structs (ops/weights.h), plus the top-level
// tensors and the storage behind them. Shapes follow spec kimi-k3.md §3 (PyTorch Linear layout
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
  DenseWeight attn_mix, mlp_mix;  ///< derived [D]: res_norm ⊙ res_proj (spec §4.1 Mix)
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

}  // namespace wren
