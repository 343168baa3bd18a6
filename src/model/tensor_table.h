// The one tensor table: every checkpoint tensor the text model needs, its name, the shape the config
// implies, its kind and where it lands in ModelWeights. One visitor drives loading, validation,
// the checkpoint writer and byte accounting (docs/model.md#tensors).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/weights.h"

namespace wren {

/// Float: BF16/F16/F32 in the file, upcast to f32. ExpertPacked/ExpertScale: U8 MXFP4, kept packed.
enum class TensorKind { Float, ExpertPacked, ExpertScale };

/// One entry of the table.
struct TensorSpec {
  std::string name;            ///< checkpoint name without the "language_model." prefix
  std::string alt_name;        ///< accepted alternative name, if any (e.g. Kimi Linear layer 0)
  std::vector<int64_t> shape;  ///< expected shape
  TensorKind kind = TensorKind::Float;
  int layer = -1;              ///< -1 for global tensors
  DenseWeight* dense = nullptr;      ///< destination of a Float tensor
  WClass cls = WClass::Vector;       ///< role of a Float tensor (picks its --quant format)
  const uint8_t** bytes = nullptr;   ///< destination of an expert tensor's bytes
  ExpertRef* expert = nullptr;       ///< owning routed expert (MXFP4 or dense expert tensors)
  int part = 0;                      ///< 0..5: w1.packed, w1.scale, w2.packed, w2.scale, w3.packed, w3.scale
  bool is_expert() const { return kind != TensorKind::Float; }  ///< an MXFP4 expert tensor
};

/// Visits every tensor of the text model in a fixed order (globals, then per layer; each expert's
/// six tensors in storage order). Sizes `w.layers` and each MoE layer's `experts` first, and fills
/// shapes of DenseWeight/MxMatrix destinations.
void for_each_tensor(const Config& c, ModelWeights& w, const std::function<void(const TensorSpec&)>& f);

/// The checkpoint name of one expert ("model.layers.N.block_sparse_moe.experts.E").
std::string expert_name(int layer, int expert);

}  // namespace wren
