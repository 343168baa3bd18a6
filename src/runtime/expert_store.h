// The expert store: routed MXFP4 experts streamed from disk into a bounded cache (spec kimi-k3.md
// §3.7: one expert = six tensors back to back = one read). No expert is read at start-up; a layer's
// misses are read together, sorted by file offset, by a small loader pool, while the experts that
// are already in memory compute. The cache only changes speed: outputs are bit-identical at any
// budget (the same bytes reach the same kernel).
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

#include "model/expert_source.h"
#include "loader/config.h"
#include "model/weights.h"

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

/// Bounded LRU cache of experts (global across layers: a miss evicts the least recently used
/// unpinned expert of any layer), filled by pread into aligned slot buffers.
class ExpertStore final : public ExpertSource {
 public:
  /// `w` gives each expert's file, offset and size (from the tensor table). Throws wren::Error if
  /// an expert's tensors are not contiguous in its shard or the budget is below one expert.
  ExpertStore(const ModelWeights& w, int64_t expert_bytes, const ExpertStoreOptions& opts);
  ~ExpertStore() override;

  void visit(int layer, const std::vector<int>& experts,
             const std::function<void(int e, const ExpertRef& view)>& fn) override;
  /// The resident experts (pinned for the call) in one batch, then each miss as its read lands.
  void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) override;

  const ExpertStoreStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  int slots() const { return int(slots_.size()); }
  bool direct() const { return direct_; }

 private:
  struct Slot;
  struct Job;
  int acquire_slot();  // an empty or LRU unpinned slot (evicted), or -1 when all are pinned
  void start_load(int layer, int e, int slot);
  void wait_loaded(int slot);
  void loader_main();
  void read_expert(Slot& s);
  ExpertRef view_of(const Slot& s) const;

  const ModelWeights& w_;
  uint64_t expert_bytes_, slot_bytes_;
  ExpertStoreOptions opts_;
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

/// Builds the store for a loaded MXFP4 model from the CLI flags: `size` ("" = default: every
/// expert if that fits in half of MemAvailable, else half of MemAvailable), `direct` ("auto",
/// "on", "off"). Prints the budget on stderr when `announce`. Returns null (after a one-line
/// notice) when some expert's six tensors are not stored back to back: those checkpoints are read
/// through the shard mappings.
std::unique_ptr<ExpertStore> open_expert_store(const ModelWeights& w, const Config& c,
                                               const std::string& size, const std::string& direct,
                                               bool announce);

/// Peak resident set size of this process in bytes (getrusage).
uint64_t peak_rss_bytes();

/// Parses "8G", "512M", "300K", "1.5G" or a plain byte count; throws naming `what` on bad input.
uint64_t parse_size(const std::string& s, const std::string& what);

/// MemAvailable from /proc/meminfo in bytes (0 if unknown).
uint64_t available_memory();

}  // namespace wren
