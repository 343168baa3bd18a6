// An independent, naive f64 implementation of the K3 forward pass for tests, written straight from
// docs/model.md#forward in whole-sequence form: MLA without absorption (explicit k_nope and v per
// head), KDA from the full history of pre-conv inputs, experts fully dequantized. It shares only
// the loaded weights and the MXFP4 codec with the engine.
#pragma once
#include <vector>

#include "model/load.h"

namespace wren::test {

/// Teacher-forced pass over `ids`: returns logits [T, V]; fills trace [T, L, D] when non-null, and
/// routes [T][L] with each MoE layer's top-k expert ids in selection order (empty for dense layers)
/// when non-null.
std::vector<double> reference_forward(const Model& m, const std::vector<int>& ids,
                                      std::vector<double>* trace = nullptr,
                                      std::vector<std::vector<std::vector<int>>>* routes = nullptr);

}  // namespace wren::test
