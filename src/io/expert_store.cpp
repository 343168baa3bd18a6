// The byte-level expert store (see expert_store.h).
#include "io/expert_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace wren {

DirectIo parse_direct_io(const std::string& s) {
  usage_check(s == "auto" || s == "on" || s == "off", "--direct: '" + s + "' is not a read mode (expected auto, on or off)");
  return s == "on" ? DirectIo::On : s == "off" ? DirectIo::Off : DirectIo::Auto;
}

namespace {
constexpr uint64_t kAlign = 4096;  // O_DIRECT alignment used for offsets, lengths and buffers
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

/// One cache slot: an aligned buffer holding one expert's six tensors.
struct ExpertByteStore::Slot {
  enum State { Empty, Loading, Ready, Failed } state = Empty;  ///< guarded by mu_
  int layer = -1, e = -1, pins = 0;
  int prev = -1, next = -1;  ///< LRU links (in_lru)
  bool in_lru = false;
  bool prefetched = false;   ///< loaded by prefetch() and not visited since
  bool retried = false;      ///< a failed prefetch read again on demand
  int pieces_left = 0;       ///< pieces of the read in flight not yet landed (guarded by mu_)
  uint64_t data_off = 0;
  uint8_t* buf = nullptr;
  std::string error;         ///< the failure of the read's lowest failed piece (guarded by mu_)
  int error_piece = 0;       ///< that piece (guarded by mu_)
  ~Slot() { std::free(buf); }
};

ExpertByteStore::ExpertByteStore(std::vector<std::vector<ExpertExtent>> extents, uint64_t expert_bytes,
                                 const ExpertStoreOptions& opts, CheckFn check_fn)
    : extents_(std::move(extents)), expert_bytes_(expert_bytes), opts_(opts), check_(std::move(check_fn)) {
  slot_bytes_ = (expert_bytes_ + 2 * kAlign + kAlign - 1) / kAlign * kAlign;
  {
    const uint64_t loaders = uint64_t(std::max(1, opts.loader_threads));
    const uint64_t want = opts.piece_bytes ? opts.piece_bytes : std::max<uint64_t>(1 << 20, (slot_bytes_ + loaders - 1) / loaders);
    piece_bytes_ = (std::min(want, slot_bytes_) + kAlign - 1) / kAlign * kAlign;  // no wrap-around
  }
  check(opts.cache_bytes >= expert_bytes_,
        "--expert-cache " + std::to_string(opts.cache_bytes) + " bytes is below one expert (" +
            std::to_string(expert_bytes_) + " bytes)");
  uint64_t total = 0;
  std::string first_file;
  for (const auto& layer : extents_)
    for (const ExpertExtent& e : layer) {
      check(e.nbytes == expert_bytes_, e.file + ": expert '" + e.name + "' holds " +
                                           std::to_string(e.nbytes) + " bytes, expected " +
                                           std::to_string(expert_bytes_));
      total += e.nbytes;
      if (first_file.empty()) first_file = e.file;
    }
  const uint64_t n_slots = std::max<uint64_t>(1, std::min(opts.cache_bytes, std::max(total, expert_bytes_)) / expert_bytes_);
  for (uint64_t i = 0; i < n_slots; ++i) {
    auto s = std::make_unique<Slot>();
    check(posix_memalign(reinterpret_cast<void**>(&s->buf), kAlign, slot_bytes_) == 0,
          "cannot allocate an expert cache slot of " + std::to_string(slot_bytes_) + " bytes");
    slots_.push_back(std::move(s));
    free_.push_back(int(n_slots - 1 - i));
  }
  guess_.resize(extents_.size());
  has_guess_.assign(extents_.size(), 0);
  for (size_t l = 0; l < extents_.size(); ++l) guess_[l].assign(extents_[l].size(), 0);
  direct_ = opts.direct != DirectIo::Off && !opts.pread_hook;
  if (direct_ && !first_file.empty()) {  // probe: can this filesystem do O_DIRECT?
    const int fd = ::open(first_file.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    bool ok = fd >= 0 && ::pread(fd, slots_[0]->buf, kAlign, 0) >= 0;
    if (fd >= 0) ::close(fd);
    if (!ok) {
      check(opts.direct != DirectIo::On, first_file + ": --direct on, but O_DIRECT reads fail here: " + std::strerror(errno));
      std::fprintf(stderr, "wren: O_DIRECT not supported for %s; using buffered reads\n", first_file.c_str());
      direct_ = false;
    }
  }
  for (int i = 0; i < std::max(1, opts.loader_threads); ++i) loaders_.emplace_back([this] { loader_main(); });
}

ExpertByteStore::~ExpertByteStore() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_job_.notify_all();
  for (auto& t : loaders_) t.join();
  for (auto& [_, fd] : fds_) ::close(fd);
}

int ExpertByteStore::fd_for(const std::string& path) {
  std::lock_guard<std::mutex> lk(fd_mu_);
  auto it = fds_.find(path);
  if (it != fds_.end()) return it->second;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct_ ? O_DIRECT : 0));
  check(fd >= 0, path + ": cannot open for expert reads: " + std::strerror(errno));
  fds_[path] = fd;
  return fd;
}

namespace {
/// The bytes the store reads for `ref`: widened to whole 4096-byte blocks for O_DIRECT.
std::pair<uint64_t, uint64_t> read_span(const ExpertExtent& ref, bool direct) {
  if (!direct) return {ref.offset, ref.offset + ref.nbytes};
  return {ref.offset / kAlign * kAlign, (ref.offset + ref.nbytes + kAlign - 1) / kAlign * kAlign};
}
}  // namespace

void ExpertByteStore::read_piece(const Slot& s, int piece) {
  const ExpertExtent& ref = extents_[s.layer][s.e];
  const auto [start, end] = read_span(ref, direct_);
  const uint64_t p0 = start + uint64_t(piece) * piece_bytes_, p1 = std::min(end, p0 + piece_bytes_);
  const std::string where = ref.file + ": expert '" + ref.name + "' (bytes " + std::to_string(ref.offset) +
                            ".." + std::to_string(ref.offset + ref.nbytes) + ")";
  const int fd = fd_for(ref.file);
  uint8_t* dst = s.buf + (p0 - start);
  uint64_t got = 0;
  while (got < p1 - p0) {
    const long r = opts_.pread_hook ? opts_.pread_hook(fd, dst + got, p1 - p0 - got, p0 + got)
                                    : long(::pread(fd, dst + got, p1 - p0 - got, off_t(p0 + got)));
    if (r < 0 && errno == EINTR) continue;
    check(r >= 0, where + ": read failed: " + std::strerror(errno));
    if (r == 0) break;  // end of file
    got += uint64_t(r);
    // O_DIRECT: a read that ends off a 4096-byte boundary ended at the end of the file. Another
    // pread would start at an unaligned offset, which some filesystems refuse (EINVAL) instead
    // of returning 0, failing an expert whose bytes were all read.
    if (direct_ && got % kAlign != 0) break;
  }
  // Only the widening past the expert's last byte may be missing (the end of the file).
  check(p0 + got >= std::min(p1, ref.offset + ref.nbytes),
        where + ": short read, got " + std::to_string(p0 - start + got) + " of " + std::to_string(end - start) +
            " bytes (file truncated?)");
}

void ExpertByteStore::enqueue_locked(int slot, bool prefetch) {
  Slot& s = *slots_[slot];
  const auto [start, end] = read_span(extents_[s.layer][s.e], direct_);
  const int pieces = int((end - start + piece_bytes_ - 1) / piece_bytes_);
  s.data_off = extents_[s.layer][s.e].offset - start;
  s.state = Slot::Loading;
  s.error.clear();
  s.error_piece = 0;
  s.pieces_left = pieces;
  for (int i = 0; i < pieces; ++i) (prefetch ? prefetch_q_ : demand_q_).push_back({slot, i});
}

void ExpertByteStore::loader_main() {
  for (;;) {
    Job job;
    bool pre;
    {
      std::unique_lock<std::mutex> lk(mu_);
      // Demand reads first; prefetch reads on at most half of the loaders, so a demand read that
      // arrives while guesses are being read finds a loader free.
      cv_job_.wait(lk, [&] {
        return stop_ || !demand_q_.empty() || (!prefetch_q_.empty() && 2 * prefetch_inflight_ < std::max(2, opts_.loader_threads));
      });
      if (stop_) return;
      pre = demand_q_.empty();
      if (pre) ++prefetch_inflight_;
      std::deque<Job>& q = pre ? prefetch_q_ : demand_q_;
      job = q.front();
      q.pop_front();
    }
    Slot& s = *slots_[job.slot];
    const double t0 = now_s();
    std::string err;
    try {
      read_piece(s, job.piece);
    } catch (const std::exception& e) {
      err = e.what();
    }
    bool last;
    {
      std::lock_guard<std::mutex> lk(mu_);
      // The lowest failed piece's message: every piece before it was read whole, so its byte count
      // from the expert's start is what was really read (and the same in every run).
      if (!err.empty() && (s.error.empty() || job.piece < s.error_piece)) s.error = err, s.error_piece = job.piece;
      last = --s.pieces_left == 0;
      if (last) err = s.error;  // the expert's outcome (empty: every piece landed)
    }
    // The last piece to land checks the whole expert (outside the lock: it reads the slot only).
    if (last && err.empty() && check_) {
      try {
        check_(s.layer, s.e, s.buf + s.data_off);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      stats_.read_s += now_s() - t0;
      if (last) {
        s.error = err;
        s.state = err.empty() ? Slot::Ready : Slot::Failed;
        if (pre) done_.push_back(job.slot);
      }
      if (pre) --prefetch_inflight_;
    }
    if (last) cv_done_.notify_all();
    if (pre) cv_job_.notify_one();
  }
}

void ExpertByteStore::lru_remove(int i) {
  Slot& s = *slots_[i];
  if (!s.in_lru) return;
  (s.prev >= 0 ? slots_[s.prev]->next : lru_head_) = s.next;
  (s.next >= 0 ? slots_[s.next]->prev : lru_tail_) = s.prev;
  s.prev = s.next = -1;
  s.in_lru = false;
}

void ExpertByteStore::lru_push_back(int i) {
  Slot& s = *slots_[i];
  if (s.in_lru) lru_remove(i);
  s.prev = lru_tail_, s.next = -1;
  (lru_tail_ >= 0 ? slots_[lru_tail_]->next : lru_head_) = i;
  lru_tail_ = i;
  s.in_lru = true;
}

void ExpertByteStore::pin(int i) {
  lru_remove(i);
  ++slots_[i]->pins;
}

void ExpertByteStore::unpin(int i) {
  Slot& s = *slots_[i];
  if (--s.pins > 0) return;
  s.pins = 0;
  Slot::State st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    st = s.state;
  }
  if (st == Slot::Ready) lru_push_back(i);
  else if (st == Slot::Failed || st == Slot::Empty) free_slot(i);
  // Loading (a prefetch a failed visit left in flight): reap() files it when it lands.
}

void ExpertByteStore::free_slot(int i) {
  Slot& s = *slots_[i];
  lru_remove(i);
  auto it = where_.find(key(s.layer, s.e));
  if (it != where_.end() && it->second == i) where_.erase(it);
  if (s.prefetched) --prefetched_unused_;
  s.prefetched = false, s.retried = false, s.pins = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.state = Slot::Empty;
  }
  free_.push_back(i);
}

void ExpertByteStore::reap() {
  std::vector<int> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done.swap(done_);
  }
  for (int i : done) {
    Slot& s = *slots_[i];
    if (s.pins > 0) continue;  // a visit waits for it and files it when done
    Slot::State st;
    std::string err;
    {
      std::lock_guard<std::mutex> lk(mu_);
      st = s.state, err = s.error;
    }
    if (st == Slot::Ready) {
      lru_push_back(i);
    } else if (st == Slot::Failed) {
      ++stats_.prefetch_failed;
      stats_.last_prefetch_error = err;
      free_slot(i);
    }
  }
}

int ExpertByteStore::acquire_slot() {
  if (!free_.empty()) {
    const int i = free_.back();
    free_.pop_back();
    return i;
  }
  const int i = lru_head_;
  if (i < 0) return -1;
  Slot& s = *slots_[i];
  lru_remove(i);
  where_.erase(key(s.layer, s.e));
  if (s.prefetched) --prefetched_unused_, ++stats_.prefetch_wasted;
  s.prefetched = false;
  ++stats_.evictions;
  return i;
}

void ExpertByteStore::start_load(int layer, int e, int slot, bool prefetch) {
  Slot& s = *slots_[slot];
  s.layer = layer, s.e = e, s.pins = prefetch ? 0 : 1, s.prefetched = prefetch, s.retried = false;
  where_[key(layer, e)] = slot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    enqueue_locked(slot, prefetch);
  }
  cv_job_.notify_all();
  stats_.bytes_read += extents_[layer][e].nbytes;
}

void ExpertByteStore::wait_loaded(int slot) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return slots_[slot]->state != Slot::Loading; });
}

void ExpertByteStore::prefetch(int layer, const int* experts, int n) {
  std::lock_guard<std::mutex> api(api_mu_);
  check(layer >= 0 && size_t(layer) < extents_.size(), "expert store: prefetch of layer " + std::to_string(layer) +
                                                            ", which does not exist");
  reap();
  std::vector<char>& g = guess_[layer];
  has_guess_[layer] = 1;
  for (int k = 0; k < n; ++k) {
    const int e = experts[k];
    check(e >= 0 && size_t(e) < g.size(), "expert store: prefetch of expert " + std::to_string(e) + " of layer " +
                                              std::to_string(layer) + ", which has " + std::to_string(g.size()));
    if (g[e]) continue;
    g[e] = 1;
    auto it = where_.find(key(layer, e));
    if (it != where_.end()) {
      if (slots_[it->second]->in_lru) lru_push_back(it->second);  // keep it: it is wanted soon
      continue;
    }
    if (prefetched_unused_ + 1 > prefetch_room()) continue;
    const int slot = acquire_slot();
    if (slot < 0) continue;
    start_load(layer, e, slot, true);
    ++prefetched_unused_;
    ++stats_.prefetch_issued;
  }
}

bool ExpertByteStore::holds(int layer, int e) {
  std::lock_guard<std::mutex> api(api_mu_);
  if (layer < 0 || size_t(layer) >= extents_.size() || e < 0 || size_t(e) >= extents_[size_t(layer)].size())
    throw Error("expert store: holds() of expert " + std::to_string(e) + " of layer " + std::to_string(layer) +
                ", which does not exist");
  reap();
  const auto it = where_.find(key(layer, e));
  if (it == where_.end()) return false;
  std::lock_guard<std::mutex> lk(mu_);
  return slots_[it->second]->state == Slot::Ready;
}

int ExpertByteStore::prefetch_room() const {
  // Half of the slots at most, and none of the two visits' worth of slots the current and the
  // next layer ask for: guesses that the current layer's misses would evict cost reads for nothing.
  return std::min(int(slots_.size()) / 2, int(slots_.size()) - 2 * last_visit_);
}

void ExpertByteStore::visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) {
  std::lock_guard<std::mutex> api(api_mu_);
  reap();
  last_visit_ = int(experts.size());
  if (size_t(layer) < has_guess_.size() && has_guess_[layer]) {  // recall of the guess for this layer
    std::vector<char>& g = guess_[layer];
    for (int e : experts) stats_.guessed_hit += g[e] ? 1 : 0;
    stats_.guessed_needed += experts.size();
    std::fill(g.begin(), g.end(), 0);
    has_guess_[layer] = 0;
  }
  std::vector<std::pair<int, int>> hits;  // (e, slot): loaded
  std::vector<std::pair<int, int>> late;  // (e, slot): a prefetch still in flight (or failed)
  std::vector<int> misses;
  for (int e : experts) {
    auto it = where_.find(key(layer, e));
    if (it == where_.end()) {
      misses.push_back(e);
      continue;
    }
    const int slot = it->second;
    Slot& s = *slots_[slot];
    Slot::State st;
    {
      std::lock_guard<std::mutex> lk(mu_);
      st = s.state;
    }
    pin(slot);
    if (s.prefetched) {
      s.prefetched = false;
      --prefetched_unused_;
      ++stats_.prefetch_used;
    }
    (st == Slot::Ready ? hits : late).push_back({e, slot});
  }
  stats_.hits += hits.size() + late.size();
  stats_.prefetch_late += late.size();
  stats_.misses += misses.size();
  const auto& refs = extents_[layer];
  std::sort(misses.begin(), misses.end(), [&](int a, int b) {
    return refs[a].file != refs[b].file ? refs[a].file < refs[b].file : refs[a].offset < refs[b].offset;
  });
  std::vector<int> miss_slot(misses.size(), -1);
  size_t issued = 0;
  auto issue_more = [&] {  // reads go out in file-offset order as slots allow
    while (issued < misses.size()) {
      const int s = acquire_slot();
      if (s < 0) return;
      start_load(layer, misses[issued], s, false);
      miss_slot[issued++] = s;
    }
  };
  std::vector<int> ids;  // one batch: (ids[i], slot[i]), views of pinned slots
  std::vector<int> batch_slots;
  std::vector<const uint8_t*> ptrs;
  auto run = [&] {
    ptrs.clear();
    for (int slot : batch_slots) ptrs.push_back(slots_[slot]->buf + slots_[slot]->data_off);
    const double t0 = now_s();
    fn(ids.data(), ptrs.data(), int(ids.size()));
    stats_.compute_s += now_s() - t0;
  };
  // One in-flight read (a late prefetch or a miss) to completion. A failed prefetch is read
  // again once, on demand (a transient fault costs time only); a failed demand read throws.
  auto await = [&](int slot, bool from_prefetch) {
    for (;;) {
      const double t0 = now_s();
      wait_loaded(slot);
      stats_.wait_s += now_s() - t0;
      Slot& s = *slots_[slot];
      std::string err;
      bool retry;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (s.state != Slot::Failed) return;
        err = s.error;
        retry = from_prefetch && !s.retried;
        if (retry) {
          s.retried = true;
          enqueue_locked(slot, false);
        }
      }
      if (!retry) throw Error(err);
      ++stats_.prefetch_failed;
      stats_.last_prefetch_error = err;
      stats_.bytes_read += expert_bytes_;
      cv_job_.notify_all();
      from_prefetch = false;  // the retry is a demand read: its failure throws
    }
  };
  // No free or evictable slot: every other slot holds a prefetch read not yet landed. Waits for
  // one to land and files it (reap).
  auto wait_for_slot = [&] {
    bool any = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      any = !done_.empty();
      for (size_t i = 0; i < slots_.size() && !any; ++i)
        any = slots_[i]->state == Slot::Loading && slots_[i]->pins == 0;
    }
    check(any, "expert store: no slot can take a read of layer " + std::to_string(layer) + " (internal error)");
    const double t0 = now_s();
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_done_.wait(lk, [&] { return !done_.empty(); });
    }
    stats_.wait_s += now_s() - t0;
    reap();
  };
  size_t done_hits = 0, done_late = 0, done_misses = 0;
  try {
    issue_more();
    if (!hits.empty()) {  // resident experts compute (all at once) while reads run
      for (const auto& h : hits) ids.push_back(h.first), batch_slots.push_back(h.second);
      run();
      for (; done_hits < hits.size(); ++done_hits) unpin(hits[done_hits].second);
    }
    for (; done_late < late.size(); ++done_late) {  // prefetches in flight: their reads are out already
      const int slot = late[done_late].second;
      await(slot, true);
      ids.assign(1, late[done_late].first);
      batch_slots.assign(1, slot);
      run();
      unpin(slot);
    }
    for (; done_misses < misses.size(); ++done_misses) {
      issue_more();
      while (miss_slot[done_misses] < 0) {
        wait_for_slot();
        issue_more();
      }
      const int slot = miss_slot[done_misses];
      await(slot, false);
      ids.assign(1, misses[done_misses]);
      batch_slots.assign(1, slot);
      run();
      unpin(slot);
    }
  } catch (...) {
    // Let every read this visit waits on finish, then drop its pins (failed slots are freed).
    for (size_t i = 0; i < issued; ++i) wait_loaded(miss_slot[i]);
    for (size_t i = done_late; i < late.size(); ++i) wait_loaded(late[i].second);
    for (size_t i = done_hits; i < hits.size(); ++i) unpin(hits[i].second);
    for (size_t i = done_late; i < late.size(); ++i) unpin(late[i].second);
    for (size_t i = done_misses; i < issued; ++i) unpin(miss_slot[i]);
    throw;
  }
}

}  // namespace wren
