// Loading a checkpoint into ModelWeights through the tensor table.
#pragma once
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "model/quant.h"
#include "model/weights.h"

namespace wren {

/// A loaded model: the open checkpoint (its mappings back the expert pointers), the config and
/// the weights.
struct Model {
  std::unique_ptr<Checkpoint> ckpt;
  Config config;
  ModelWeights weights;
  QuantPlan plan;  ///< formats the dense weights were loaded in
};

/// Opens DIR and loads every tensor of the table: shape and dtype checked (error names the shard,
/// the tensor, expected and found), Float tensors upcast to f32, expert tensors kept packed in
/// the mapping. Vision tensors are never touched. Dense matrices are then stored in the format
/// `plan` gives their class (default: all f32, the exact mode); vectors always stay f32.
std::unique_ptr<Model> load_model(const std::string& dir, const QuantPlan& plan = {});

}  // namespace wren
