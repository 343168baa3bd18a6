// Loading a checkpoint into ModelWeights through the tensor table.
#pragma once
#include <cstdint>
#include <functional>
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

/// Called after each dense tensor with the stored bytes read so far and the total stored bytes of
/// the dense tensors (the routed experts stay in the mapping and are not counted).
using LoadProgress = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

/// How load_model places the weights beyond the plan.
struct LoadOptions {
  /// A backend that places_dense(): every dense matrix (rows > 1) goes straight from the mapped
  /// checkpoint to that backend's memory (Backend::place_dense: f32 matrices as stored, for the
  /// backend to upcast; other formats converted here one tensor at a time), so the host holds no
  /// copy of them; each tensor's mapped pages are dropped once it is placed. Vectors stay host f32
  /// (the backend takes them with the experts afterwards, e.g. CudaBackend::upload). The model's
  /// weights then serve that backend only (a CPU fallback loads its own copy).
  Backend* place_on = nullptr;
  /// Progress after each dense tensor (may be empty); for a progress display.
  LoadProgress progress;
};

/// load_model as above, with `o` (placement on a backend, progress).
std::unique_ptr<Model> load_model(const std::string& dir, const QuantPlan& plan, const LoadOptions& o);

struct TensorSpec;
/// Checks a located tensor's stored shape and dtype against its table entry (header only, no
/// weights read); throws naming the shard, the tensor, found and expected.
void check_tensor(const TensorRef& r, const TensorSpec& s);

/// Fills every layer's AttnRes score vectors (attn_mix, mlp_mix, and the final out_mix) as
/// norm ⊙ proj from the loaded weights, allocated in `w` (docs/model.md#attnres). Used by the
/// loader for AttnRes models and by the random in-memory models of `wren bench layers`.
void derive_attnres_mix(ModelWeights& w);

/// Throws when the checkpoint index lists a text-model tensor of a layer at or beyond the config's
/// num_hidden_layers (a silently ignored layer means checkpoint and config disagree).
void check_layer_count(const Checkpoint& ck, const Config& c);

}  // namespace wren
