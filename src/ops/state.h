// Per-sequence state as a first-class object (docs/architecture.md, "State"): KDA recurrent states and conv windows,
// MLA latent caches, and the position. Copy / snapshot / restore go through the owning backend.
#pragma once
#include <vector>

#include "loader/config.h"
#include "ops/backend.h"

namespace wren {

/// All recurrent state of one sequence. Buffers belong to `backend` (device memory on a GPU).
class SequenceState {
 public:
  /// Allocates zeroed state for `cfg` with room for `capacity` tokens in each MLA cache.
  SequenceState(Backend& backend, const Config& cfg, int capacity);
  /// A state split across backends (pipeline stages, docs/parallel.md): layer i's buffers live on
  /// layer_backends[i] ([n_layers]); a null entry holds no buffers for that layer (a rank of a
  /// multi-process pipeline keeps only its own stage's slice). backend() is the first non-null
  /// entry. Throws wren::Error when the list has the wrong length or no backend at all.
  SequenceState(const std::vector<Backend*>& layer_backends, const Config& cfg, int capacity);
  ~SequenceState();
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  /// Back to an empty sequence (states zeroed, caches emptied).
  void reset();
  /// Makes this state equal to `other` (same config and capacity); the basis of snapshot/restore.
  void copy_from(const SequenceState& other);

  /// Host copy of the whole state (the prefix cache's snapshot, runtime/prefix_cache.h): per layer
  /// in order, a KDA layer's S [heads, dk, dk] then its conv window, an MLA layer's `length` cache
  /// rows [length, kv_lora + extra]; `mla_lengths` [n_layers] gets each layer's row count (0 for KDA).
  void save(std::vector<float>& out, std::vector<int>& mla_lengths) const;
  /// Makes this state what save() wrote (same config; each MLA length must fit this capacity),
  /// with `history` as its token log and history.size() as its position. Throws wren::Error on a
  /// size mismatch.
  void load(const std::vector<float>& data, const std::vector<int>& mla_lengths, const std::vector<int>& history);

  int position() const { return position_; }  ///< tokens consumed so far
  /// The backend that owns the buffers (a split state: the one of its first held layer).
  Backend& backend() const { return *be_; }
  /// True when every layer of [first, end) holds its buffers on `be` (Forward checks its stage's
  /// layers with it; an unsplit state holds all layers on backend()).
  bool holds(const Backend& be, int first, int end) const;
  /// The backend of layer i's buffers (null: a layer this state does not hold).
  Backend* layer_backend(int i) const { return layer_be_[size_t(i)]; }
  /// Ids consumed so far, in order (the engine's Runner records them, runtime/runner.h): enough
  /// to rebuild the state on another backend by running them again.
  const std::vector<int>& history() const { return history_; }
  /// False once a run replaced embeddings (x0): such a state cannot be rebuilt from its ids.
  bool replayable() const { return replayable_; }
  /// Appends n consumed ids to the history (x0 runs pass replayable = false).
  void record(const int* ids, int n, bool replayable);
  /// Frees the buffers and allocates zeroed ones on `be`: an empty sequence (position 0, empty
  /// history) that the caller refills by running the old history (CPU fallback, runtime/runner.h).
  void move_to(Backend& be);
  int capacity() const { return capacity_; }
  void advance(int n) { position_ += n; }
  /// The host counters a step advances when it is recorded (the position, each MLA cache's row
  /// count), for rewind.
  struct Mark {
    int position = 0;
    std::vector<int> mla_lengths;  ///< [n_layers] (0 for KDA layers)
  };
  /// Fills `m` with the counters now (reusing its storage).
  void mark(Mark& m) const;
  /// Sets the counters back to `m` (taken from this state): undoes the bookkeeping of a recorded
  /// step that never ran (Backend::step_discard). Device buffers and the history are untouched.
  void rewind(const Mark& m) noexcept;

  KdaState& kda(int layer) { return kda_[layer]; }
  MlaCache& mla(int layer) { return mla_[layer]; }

  /// Bytes of state per sequence (KDA states + conv windows + full MLA caches).
  size_t bytes() const { return bytes_for(cfg_, capacity_); }
  /// The same for any config and capacity, without allocating.
  static size_t bytes_for(const Config& c, int capacity);

 private:
  void allocate();
  void free_buffers();
  Backend* be_;
  std::vector<Backend*> layer_be_;  ///< [n_layers]: each layer's backend (all be_ when unsplit)
  bool split_ = false;              ///< layers live on more than one backend (or some on none)
  const Config& cfg_;
  int capacity_;
  int position_ = 0;
  std::vector<int> history_;
  bool replayable_ = true;
  std::vector<KdaState> kda_;  ///< per layer (null for MLA layers)
  std::vector<MlaCache> mla_;  ///< per layer (null for KDA layers)
  size_t s_len() const { return size_t(cfg_.kda_heads) * cfg_.kda_head_dim * cfg_.kda_head_dim; }
  size_t conv_len() const { return size_t(3) * cfg_.kda_width() * (cfg_.conv_kernel - 1); }
  size_t cache_len() const { return size_t(capacity_) * cfg_.mla_cache_width(); }
};

}  // namespace wren
