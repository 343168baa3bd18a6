// The expert store at byte level: each routed expert is one byte range of a shard (its six MXFP4
// tensors stored back to back), streamed from disk into a bounded cache. No expert is read at
// start-up; a layer's misses are read together, sorted by file offset, by a small loader pool,
// while the experts that are already in memory compute. A large expert is read in pieces that the
// loaders share, so the misses land one after another, each as soon as the disk allows, instead
// of several at once at the end. The cache only changes speed:
// the same bytes reach the caller at any budget. This floor knows files and bytes only; the view of
// an expert's bytes as MXFP4 matrices (the ExpertSource) is built above it (runtime/expert_store.h).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
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

/// Parses the `--direct` flag's value: "auto", "on" or "off". Throws UsageError naming the
/// flag and the accepted values for anything else.
DirectIo parse_direct_io(const std::string& s);

/// Store options. `cache_bytes` bounds the expert payload held in memory (at least one expert).
struct ExpertStoreOptions {
  uint64_t cache_bytes = 0;
  DirectIo direct = DirectIo::Auto;
  int loader_threads = 4;
  /// Bytes of one read (a piece of an expert; the loaders read the pieces of one expert side by
  /// side). 0 = an expert's span over the loaders, at least 1 MiB. Rounded up to 4096 bytes.
  uint64_t piece_bytes = 0;
  /// Test hook replacing pread(2) (fault injection); null = pread.
  std::function<long(int fd, void* buf, size_t n, uint64_t off)> pread_hook;
};

/// Counters since construction (or reset_stats()).
struct ExpertStoreStats {
  uint64_t hits = 0, misses = 0, bytes_read = 0;  ///< bytes_read includes prefetch reads
  double read_s = 0;     ///< wall time the loaders spent in reads (summed over loaders)
  double wait_s = 0;     ///< time the compute thread waited for a read
  double compute_s = 0;  ///< time spent in the per-expert compute callbacks
  uint64_t evictions = 0;
  // Prefetch (prefetch()): reads issued ahead of need; of those, used by a later visit (a hit,
  // counted in `hits` too, or `prefetch_late` when the visit still had to wait for the read),
  // evicted unused, or failed (then read again on demand, so a transient fault costs time only).
  uint64_t prefetch_issued = 0, prefetch_used = 0, prefetch_late = 0, prefetch_wasted = 0, prefetch_failed = 0;
  // Recall of the guesses: over the visits of layers that had a guess, the unique experts the
  // visit asked for (`guessed_needed`) and how many of them the guess contained (`guessed_hit`).
  uint64_t guessed_needed = 0, guessed_hit = 0;
  std::string last_prefetch_error;  ///< message of the latest failed prefetch read
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0; }
  double recall() const { return guessed_needed ? double(guessed_hit) / double(guessed_needed) : 0; }
};

/// Where one expert's bytes are: [offset, offset + nbytes) of `file`; `name` labels errors.
struct ExpertExtent {
  std::string file;
  uint64_t offset = 0, nbytes = 0;
  std::string name;
};

/// Bounded LRU cache of expert byte ranges keyed by (layer, expert) (global across layers: a miss
/// evicts the least recently used unpinned expert of any layer), filled by pread into aligned slot
/// buffers allocated at construction. Bookkeeping is O(1) per expert: a hash map (layer, expert)
/// -> slot, a free list and an intrusive LRU list of the evictable slots (loaded, unpinned).
/// Reads run on `loader_threads` threads (several reads in flight), an expert as one or more
/// pieces (ExpertStoreOptions::piece_bytes) taken in order, so the loaders work on the same expert
/// and experts land in the order they were asked for; demand reads go before prefetch reads. visit_batches and prefetch may be called from one thread at a time (calls
/// from several threads are serialized).
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
  /// (pinned for the call) in one batch, then each one still in flight or missing as its read
  /// lands. Throws wren::Error naming file, expert and byte range on a failed or short read or a
  /// failed check.
  void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn);

  /// A guess: `experts` (ids of `layer`, duplicates allowed) will be visited soon. Starts reads of
  /// those not resident or in flight, behind any demand read (and on at most half of the loaders),
  /// into free or least recently used slots, while prefetched-and-unused experts hold at most half
  /// of the slots and leave twice the latest visit's count to demand (so wrong guesses never take
  /// more than half of the cache, and a cache too small for that prefetches nothing); moves
  /// resident ones to the recent end of the LRU.
  /// Never throws for a read: a failed prefetch is counted and read again when visited. Only
  /// timing depends on the guess; the bytes a visit hands over never do.
  void prefetch(int layer, const int* experts, int n);

  /// True when expert `e` of `layer` is in the cache, read and checked (a visit hands it over
  /// without a read; one in flight or failed: false). Throws wren::Error for an id out of range.
  bool holds(int layer, int e);

  /// Counters. Read on the thread that calls visit_batches / prefetch.
  const ExpertStoreStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  int slots() const { return int(slots_.size()); }
  bool direct() const { return direct_; }

 private:
  struct Slot;
  int acquire_slot();  // a free slot or the LRU unpinned loaded one (evicted); -1 when none
  void start_load(int layer, int e, int slot, bool prefetch);
  void wait_loaded(int slot);
  void reap();         // takes finished prefetch reads into the LRU (failed ones: freed)
  void pin(int slot);
  void unpin(int slot);
  void lru_remove(int slot);
  void lru_push_back(int slot);
  void free_slot(int slot);
  void loader_main();
  /// Reads piece `piece` of the expert in slot `s` (loader thread); throws wren::Error naming
  /// file, expert and byte range on a failed or short read.
  void read_piece(const Slot& s, int piece);
  /// Queues every piece of slot `slot` (state Loading; the caller holds mu_).
  void enqueue_locked(int slot, bool prefetch);
  /// One read of a loader: a piece of the expert in `slot`.
  struct Job {
    int slot, piece;
  };
  static int64_t key(int layer, int e) { return (int64_t(layer) << 32) | uint32_t(e); }

  std::vector<std::vector<ExpertExtent>> extents_;
  uint64_t expert_bytes_, slot_bytes_, piece_bytes_ = 0;
  ExpertStoreOptions opts_;
  CheckFn check_;
  bool direct_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unordered_map<int64_t, int> where_;  ///< key(layer, e) -> slot (loaded or in flight)
  std::vector<int> free_;                    ///< empty slots
  int lru_head_ = -1, lru_tail_ = -1;        ///< evictable slots, least recently used first
  int prefetched_unused_ = 0;                ///< slots loaded by prefetch, not yet visited
  int last_visit_ = 0;                       ///< experts asked for by the latest visit
  int prefetch_inflight_ = 0;                ///< prefetch pieces on loaders now (under mu_)
  int prefetch_room() const;                 ///< how many prefetched-unused slots may exist
  std::vector<std::vector<char>> guess_;     ///< [layer][e]: guessed since the layer's last visit
  std::vector<char> has_guess_;              ///< [layer]
  std::unordered_map<std::string, int> fds_;  ///< shard path -> fd (opened on first read)
  std::mutex fd_mu_;
  std::mutex api_mu_;  ///< serializes visit_batches / prefetch

  std::mutex mu_;  ///< guards the queues, slot states and `done_`, read_s
  std::condition_variable cv_job_, cv_done_;
  std::deque<Job> demand_q_, prefetch_q_;  ///< pieces to read, in order
  std::vector<int> done_;                  ///< finished prefetch reads not yet reaped
  bool stop_ = false;
  std::vector<std::thread> loaders_;
  ExpertStoreStats stats_;
  int fd_for(const std::string& path);
};

}  // namespace wren
