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

namespace {
constexpr uint64_t kAlign = 4096;  // O_DIRECT alignment used for offsets, lengths and buffers
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

/// One cache slot: an aligned buffer holding one expert's six tensors.
struct ExpertByteStore::Slot {
  enum State { Empty, Loading, Ready, Failed } state = Empty;
  int layer = -1, e = -1, pins = 0;
  uint64_t last_use = 0, data_off = 0;
  uint8_t* buf = nullptr;
  std::string error;
  ~Slot() { std::free(buf); }
};

ExpertByteStore::ExpertByteStore(std::vector<std::vector<ExpertExtent>> extents, uint64_t expert_bytes,
                                 const ExpertStoreOptions& opts, CheckFn check_fn)
    : extents_(std::move(extents)), expert_bytes_(expert_bytes), opts_(opts), check_(std::move(check_fn)) {
  slot_bytes_ = (expert_bytes_ + 2 * kAlign + kAlign - 1) / kAlign * kAlign;
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
  }
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

void ExpertByteStore::read_expert(Slot& s) {
  const ExpertExtent& ref = extents_[s.layer][s.e];
  const uint64_t start = direct_ ? ref.offset / kAlign * kAlign : ref.offset;
  const uint64_t end = direct_ ? (ref.offset + ref.nbytes + kAlign - 1) / kAlign * kAlign : ref.offset + ref.nbytes;
  const std::string where = ref.file + ": expert '" + ref.name + "' (bytes " + std::to_string(ref.offset) +
                            ".." + std::to_string(ref.offset + ref.nbytes) + ")";
  const int fd = fd_for(ref.file);
  uint64_t got = 0;
  while (got < end - start) {
    const long r = opts_.pread_hook ? opts_.pread_hook(fd, s.buf + got, end - start - got, start + got)
                                    : long(::pread(fd, s.buf + got, end - start - got, off_t(start + got)));
    if (r < 0 && errno == EINTR) continue;
    check(r >= 0, where + ": read failed: " + std::strerror(errno));
    if (r == 0) break;  // end of file
    got += uint64_t(r);
  }
  s.data_off = ref.offset - start;
  check(got >= s.data_off + ref.nbytes, where + ": short read, got " + std::to_string(got) + " of " +
                                            std::to_string(end - start) + " bytes (file truncated?)");
  if (check_) check_(s.layer, s.e, s.buf + s.data_off);
}

void ExpertByteStore::loader_main() {
  for (;;) {
    int slot;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_job_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      slot = queue_.front();
      queue_.erase(queue_.begin());
    }
    Slot& s = *slots_[slot];
    const double t0 = now_s();
    std::string err;
    try {
      read_expert(s);
    } catch (const std::exception& e) {
      err = e.what();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      stats_.read_s += now_s() - t0;
      s.error = err;
      s.state = err.empty() ? Slot::Ready : Slot::Failed;
    }
    cv_done_.notify_all();
  }
}

int ExpertByteStore::acquire_slot() {
  int best = -1;
  for (int i = 0; i < int(slots_.size()); ++i) {
    const Slot& s = *slots_[i];
    if (s.state == Slot::Empty) return i;
    if (s.pins == 0 && s.state == Slot::Ready && (best < 0 || s.last_use < slots_[best]->last_use)) best = i;
  }
  if (best >= 0) {
    Slot& s = *slots_[best];
    where_.erase(key(s.layer, s.e));
    s.state = Slot::Empty;
    ++stats_.evictions;
  }
  return best;
}

void ExpertByteStore::start_load(int layer, int e, int slot) {
  Slot& s = *slots_[slot];
  s.layer = layer, s.e = e, s.pins = 1, s.state = Slot::Loading, s.error.clear();
  where_[key(layer, e)] = slot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(slot);
  }
  cv_job_.notify_one();
  stats_.bytes_read += extents_[layer][e].nbytes;
}

void ExpertByteStore::wait_loaded(int slot) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return slots_[slot]->state != Slot::Loading; });
}

void ExpertByteStore::visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) {
  std::vector<std::pair<int, int>> hits;  // (e, slot)
  std::vector<int> misses;
  for (int e : experts) {
    auto it = where_.find(key(layer, e));
    if (it != where_.end()) {
      hits.push_back({e, it->second});
      ++slots_[it->second]->pins;
    } else {
      misses.push_back(e);
    }
  }
  stats_.hits += hits.size();
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
      start_load(layer, misses[issued], s);
      miss_slot[issued++] = s;
    }
  };
  std::vector<int> ids;  // one batch: (ids[i], slot[i]), views of pinned slots
  std::vector<int> batch_slots;
  std::vector<const uint8_t*> ptrs;
  auto run = [&] {
    ptrs.clear();
    for (int slot : batch_slots) {
      Slot& s = *slots_[slot];
      s.last_use = ++clock_;
      ptrs.push_back(s.buf + s.data_off);
    }
    const double t0 = now_s();
    fn(ids.data(), ptrs.data(), int(ids.size()));
    stats_.compute_s += now_s() - t0;
  };
  size_t done_hits = 0, done_misses = 0;
  try {
    issue_more();
    if (!hits.empty()) {  // resident experts compute (all at once) while reads run
      for (const auto& h : hits) ids.push_back(h.first), batch_slots.push_back(h.second);
      run();
      for (; done_hits < hits.size(); ++done_hits) --slots_[hits[done_hits].second]->pins;
    }
    for (; done_misses < misses.size(); ++done_misses) {
      issue_more();
      const int slot = miss_slot[done_misses];
      const double t0 = now_s();
      wait_loaded(slot);
      stats_.wait_s += now_s() - t0;
      Slot& s = *slots_[slot];
      if (s.state == Slot::Failed) throw Error(s.error);
      ids.assign(1, misses[done_misses]);
      batch_slots.assign(1, slot);
      run();
      --s.pins;
    }
  } catch (...) {
    // Let every issued read finish, then drop failed and unfinished slots and all pins.
    for (size_t i = 0; i < issued; ++i) wait_loaded(miss_slot[i]);
    for (size_t i = done_hits; i < hits.size(); ++i) --slots_[hits[i].second]->pins;
    for (size_t i = done_misses; i < issued; ++i) {
      Slot& s = *slots_[miss_slot[i]];
      s.pins = 0;
      if (s.state == Slot::Failed) {
        where_.erase(key(s.layer, s.e));
        s.state = Slot::Empty;
      }
    }
    throw;
  }
}

}  // namespace wren
