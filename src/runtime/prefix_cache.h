// Prefix cache: host-RAM snapshots of whole sequence states (SequenceState::save: every KDA layer's
// S and conv window, every MLA layer's latent rows; the AttnRes block sums are per-chunk
// activations, not state), keyed by the token prefix that produced them. A new request resumes
// from the longest cached prefix of its tokens instead of prefilling it again (docs/serve.md).
//
// Keys are FNV-1a 64 hashes of the prefix ids; a hit is only taken after comparing the stored ids
// with the request's, so a hash collision is a miss, never a wrong state. Entries are evicted least
// recently used first once their bytes exceed the budget. Thread-safe (one mutex).
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ops/state.h"

namespace wren {

/// Counters since construction (bytes/entries: now).
struct PrefixCacheStats {
  uint64_t lookups = 0;        ///< restore() calls
  uint64_t hits = 0;           ///< restore() calls that resumed from a snapshot
  uint64_t cached_tokens = 0;  ///< prompt tokens not prefilled thanks to hits (sum)
  uint64_t stores = 0, evictions = 0;
  size_t bytes = 0, entries = 0, budget = 0;
};

class PrefixCache {
 public:
  /// `budget_bytes`: host memory the snapshots may take (0 = the cache stores nothing).
  /// `interval`: generate() snapshots the prompt at every multiple of this many tokens (>= 1).
  explicit PrefixCache(size_t budget_bytes, int interval = 256);

  /// Makes `st` the longest cached prefix of `tokens` and returns its length (0 = nothing cached:
  /// `st` is left as it was). A prefix of the full length is only taken from an entry that kept
  /// the logits of its last position; they are copied into `last_logits` [V] (resized). With
  /// `last_logits` null, at most tokens.size() - 1 tokens are restored (the caller runs the rest
  /// and gets its own logits).
  int restore(SequenceState& st, const std::vector<int>& tokens, std::vector<float>* last_logits = nullptr);

  /// Snapshots `st` keyed by its history (SequenceState::history, which the engine's Runner
  /// records: a state advanced by a bare Forward, or fed embeddings, has none and is not stored). `logits` [V] (may be null): the logits of its last position, kept with the entry.
  /// An entry for the same ids is refreshed (and gains the logits if it had none).
  void store(const SequenceState& st, const float* logits = nullptr, int V = 0);

  int interval() const { return interval_; }
  bool enabled() const { return budget_ > 0; }
  PrefixCacheStats stats() const;

 private:
  struct Entry {
    uint64_t key;
    std::vector<int> tokens;
    std::vector<float> data;  ///< SequenceState::save
    std::vector<int> mla_lengths;
    std::vector<float> logits;  ///< of the last position, or empty
    size_t bytes() const;
  };
  using Lru = std::list<Entry>;  ///< most recently used first
  void evict_to(size_t budget);
  void erase(Lru::iterator it);

  mutable std::mutex mu_;
  size_t budget_;
  int interval_;
  Lru lru_;
  std::unordered_multimap<uint64_t, Lru::iterator> index_;
  std::map<int, int> lengths_;  ///< prefix length -> entries of that length (lookup candidates)
  PrefixCacheStats stats_;
};

}  // namespace wren
