// Per-sequence state as a first-class object (design.md §7): KDA recurrent states and conv windows,
// MLA latent caches, and the position. Copy / snapshot / restore go through the owning backend.
#pragma once
#include <vector>

#include "backends/backend.h"
#include "loader/config.h"

namespace wren {

/// All recurrent state of one sequence. Buffers belong to `backend` (device memory on a GPU).
class SequenceState {
 public:
  /// Allocates zeroed state for `cfg` with room for `capacity` tokens in each MLA cache.
  SequenceState(Backend& backend, const Config& cfg, int capacity);
  ~SequenceState();
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  /// Back to an empty sequence (states zeroed, caches emptied).
  void reset();
  /// Makes this state equal to `other` (same config and capacity); the basis of snapshot/restore.
  void copy_from(const SequenceState& other);

  int position() const { return position_; }  ///< tokens consumed so far
  int capacity() const { return capacity_; }
  void advance(int n) { position_ += n; }

  KdaState& kda(int layer) { return kda_[layer]; }
  MlaCache& mla(int layer) { return mla_[layer]; }

  /// Bytes of state per sequence (KDA states + conv windows + full MLA caches).
  size_t bytes() const { return bytes_for(cfg_, capacity_); }
  /// The same for any config and capacity, without allocating.
  static size_t bytes_for(const Config& c, int capacity);

 private:
  Backend& be_;
  const Config& cfg_;
  int capacity_;
  int position_ = 0;
  std::vector<KdaState> kda_;  ///< per layer (null for MLA layers)
  std::vector<MlaCache> mla_;  ///< per layer (null for KDA layers)
  size_t s_len() const { return size_t(cfg_.kda_heads) * cfg_.kda_head_dim * cfg_.kda_head_dim; }
  size_t conv_len() const { return size_t(3) * cfg_.kda_width() * (cfg_.conv_kernel - 1); }
  size_t cache_len() const { return size_t(capacity_) * cfg_.mla_cache_width(); }
};

}  // namespace wren
