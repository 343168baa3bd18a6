// The memory floor of one decode token: the bytes a token must read (weights in the formats the
// model holds them in, the chosen experts, the recurrent state and the attention cache) and the
// device copy bandwidth they are divided by. Shared by `bench layers` (per layer) and `bench batch`
// (the whole token, beside its measured step time).
#pragma once
#include <vector>

#include "model/load.h"
#include "ops/backend.h"

namespace wren::bench {

/// Bytes one decode token reads, per layer and outside the layers.
struct DecodeBytes {
  std::vector<double> layer;  ///< [n_layers]: dense weights + vectors, top-k experts, KDA state or MLA rows
  double outside = 0;         ///< one embedding row, the final mix / norm and the lm_head
  double total() const;
};

/// Bytes of one dense weight in its format: data + scales (q8/q4).
double weight_bytes(const DenseWeight& w);
/// Bytes of one routed expert as the model holds it: MXFP4 codes + scales, or its three dense
/// matrices in their format (0 without routed experts).
double routed_expert_bytes(const Model& m);
/// The bytes a decode token at `position` (tokens already in the sequence) reads: each layer's dense
/// weights and vectors as held (a weight's format and shape; placed weights count the same), top_k
/// routed experts in a MoE layer, the KDA state read and written (f32 [H, d, d]) or the MLA cache
/// rows of positions 0..position (f32, cache width).
DecodeBytes decode_bytes(const Model& m, int position);

/// Bandwidth of a device copy of `floats` f32 values on `be`: (bytes read + written) / seconds,
/// median of 5 after a warm-up (B/s).
double copy_bandwidth(Backend& be, size_t floats);

}  // namespace wren::bench
