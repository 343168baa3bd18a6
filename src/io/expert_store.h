// The expert store at byte level: each routed expert is one byte range of a shard (its six MXFP4
// tensors stored back to back: one expert = one read), streamed from disk into a bounded cache. No
// expert is read at start-up; a layer's misses are read together, sorted by file offset, by a small
// loader pool, while the experts that are already in memory compute. The cache only changes speed:
// the same bytes reach the caller at any budget. This floor knows files and bytes only; the view of
// an expert's bytes as MXFP4 matrices (the ExpertSource) is built above it (runtime/expert_store.h).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace wren {

/// How the store reads shards: O_DIRECT with aligned buffers, buffered, or O_DIRECT when the
/// filesystem accepts it (else buffered, with a one-line notice).
enum class DirectIo { Auto, On, Off };

/// Store options. `cache_bytes` bounds the expert payload held in memory (at least one expert).
struct ExpertStoreOptions {
  uint64_t cache_bytes = 0;
  DirectIo direct = DirectIo::Auto;
  int loader_threads = 4;
  /// Test hook replacing pread(2) (fault injection); null = pread.
  std::function<long(int fd, void* buf, size_t n, uint64_t off)> pread_hook;
};

/// Counters since construction (or reset_stats()).
struct ExpertStoreStats {
  uint64_t hits = 0, misses = 0, bytes_read = 0;
  double read_s = 0;     ///< wall time the loaders spent in reads (summed over loaders)
  double wait_s = 0;     ///< time the compute thread waited for a read
  double compute_s = 0;  ///< time spent in the per-expert compute callbacks
  uint64_t evictions = 0;
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0; }
};

/// Where one expert's bytes are: [offset, offset + nbytes) of `file`; `name` labels errors.
struct ExpertExtent {
  std::string file;
  uint64_t offset = 0, nbytes = 0;
  std::string name;
};

/// Bounded LRU cache of expert byte ranges keyed by (layer, expert) (global across layers: a miss
/// evicts the least recently used unpinned expert of any layer), filled by pread into aligned slot
/// buffers.
class ExpertByteStore {
 public:
  /// Called on a loader thread with each expert's bytes once read; a throw fails that read (the
  /// message reaches the caller of visit_batches).
  using CheckFn = std::function<void(int layer, int e, const uint8_t* bytes)>;
  /// `extents[layer][e]` for every routed expert (layers without experts are empty), all of
  /// `expert_bytes` bytes. Throws wren::Error if one differs or the budget is below one expert.
  ExpertByteStore(std::vector<std::vector<ExpertExtent>> extents, uint64_t expert_bytes,
                  const ExpertStoreOptions& opts, CheckFn check = nullptr);
  ~ExpertByteStore();
  ExpertByteStore(const ExpertByteStore&) = delete;
  ExpertByteStore& operator=(const ExpertByteStore&) = delete;

  /// fn(ids, bytes, n): n experts of the request at once, bytes[i] the `expert_bytes` bytes of
  /// expert ids[i], valid during that call only.
  using BatchFn = std::function<void(const int* ids, const uint8_t* const* bytes, int n)>;
  /// Hands over every expert of `experts` (unique ids of `layer`) exactly once: the resident ones
  /// (pinned for the call) in one batch, then each miss as its read lands. Throws wren::Error
  /// naming file, expert and byte range on a failed or short read or a failed check.
  void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn);

  const ExpertStoreStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  int slots() const { return int(slots_.size()); }
  bool direct() const { return direct_; }

 private:
  struct Slot;
  int acquire_slot();  // an empty or LRU unpinned slot (evicted), or -1 when all are pinned
  void start_load(int layer, int e, int slot);
  void wait_loaded(int slot);
  void loader_main();
  void read_expert(Slot& s);
  int64_t key(int layer, int e) const { return int64_t(layer) * int64_t(extents_[layer].size()) + e; }

  std::vector<std::vector<ExpertExtent>> extents_;
  uint64_t expert_bytes_, slot_bytes_;
  ExpertStoreOptions opts_;
  CheckFn check_;
  bool direct_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unordered_map<int64_t, int> where_;  ///< layer * E + e -> slot
  uint64_t clock_ = 0;                       ///< LRU clock
  std::unordered_map<std::string, int> fds_;  ///< shard path -> fd (opened on first read)
  std::mutex fd_mu_;

  std::mutex mu_;
  std::condition_variable cv_job_, cv_done_;
  std::vector<int> queue_;  ///< slots to load
  bool stop_ = false;
  std::vector<std::thread> loaders_;
  ExpertStoreStats stats_;
  int fd_for(const std::string& path);
};

}  // namespace wren
