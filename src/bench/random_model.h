// Random-weight models built directly in memory (no files): the benchmark's way to get true K3
// layer sizes without writing tens of GB of shards. Same tensor table, shapes and layout as a
// loaded checkpoint (dense matrices [rows, cols] in the plan's formats; MXFP4 experts packed +
// ue8m0 scales, or dense experts as the plan's Expert class says).
#pragma once
#include <cstdint>
#include <memory>

#include <nlohmann/json_fwd.hpp>

#include "model/load.h"
#include "model/quant.h"

namespace wren {

/// Builds a Model for `config` (validated as parse_config does) with random weights from `seed`.
/// Routed experts (MXFP4 or dense) come from a pool of `distinct_experts` random experts (expert e
/// of every layer shares the storage of pool entry e % distinct_experts), so 896 experts per layer
/// need only the pool's memory; the model's `ckpt` is null. Dense values: norms near 1, other
/// vectors small, matrices uniform in ±1/sqrt(cols), drawn in f32 then encoded in plan.of(class)
/// (as a checkpoint stored in f32 would load); expert scale bytes in [118, 124]. Throws wren::Error.
std::unique_ptr<Model> make_random_model(const nlohmann::json& config, uint64_t seed, int distinct_experts,
                                         const QuantPlan& plan = {});

}  // namespace wren
