// The expert store (see expert_store.h).
#include "runtime/expert_store.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "model/load.h"

namespace wren {

namespace {
constexpr uint64_t kAlign = 4096;  // O_DIRECT alignment used for offsets, lengths and buffers
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

/// One cache slot: an aligned buffer holding one expert's six tensors.
struct ExpertStore::Slot {
  enum State { Empty, Loading, Ready, Failed } state = Empty;
  int layer = -1, e = -1, pins = 0;
  uint64_t last_use = 0, data_off = 0;
  uint8_t* buf = nullptr;
  std::string error;
  ~Slot() { std::free(buf); }
};

ExpertStore::ExpertStore(const ModelWeights& w, int64_t expert_bytes, const ExpertStoreOptions& opts)
    : w_(w), expert_bytes_(uint64_t(expert_bytes)), opts_(opts) {
  slot_bytes_ = (expert_bytes_ + 2 * kAlign + kAlign - 1) / kAlign * kAlign;
  check(opts.cache_bytes >= expert_bytes_,
        "--expert-cache " + std::to_string(opts.cache_bytes) + " bytes is below one expert (" +
            std::to_string(expert_bytes_) + " bytes)");
  uint64_t total = 0;
  std::string first_file;
  for (const LayerWeights& l : w.layers)
    for (const ExpertRef& e : l.moe.experts) {
      check(e.contiguous, e.file + ": the six tensors of '" + e.name +
                              "' are not stored back to back; the expert store needs one read per expert");
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

ExpertStore::~ExpertStore() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_job_.notify_all();
  for (auto& t : loaders_) t.join();
  for (auto& [_, fd] : fds_) ::close(fd);
}

int ExpertStore::fd_for(const std::string& path) {
  std::lock_guard<std::mutex> lk(fd_mu_);
  auto it = fds_.find(path);
  if (it != fds_.end()) return it->second;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct_ ? O_DIRECT : 0));
  check(fd >= 0, path + ": cannot open for expert reads: " + std::strerror(errno));
  fds_[path] = fd;
  return fd;
}

void ExpertStore::read_expert(Slot& s) {
  const ExpertRef& ref = w_.layers[s.layer].moe.experts[s.e];
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
  validate_expert_scales(view_of(s));
}

ExpertRef ExpertStore::view_of(const Slot& s) const {
  ExpertRef v = w_.layers[s.layer].moe.experts[s.e];
  const uint8_t* p = s.buf + s.data_off;  // storage order: w1.packed, w1.scale, w2..., w3...
  for (MxMatrix* m : {&v.w1, &v.w2, &v.w3}) {
    const size_t n = size_t(m->rows) * m->cols;
    m->packed = p;
    m->scale = p + n / 2;
    p += n / 2 + n / 32;
  }
  return v;
}

void ExpertStore::loader_main() {
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

int ExpertStore::acquire_slot() {
  int best = -1;
  for (int i = 0; i < int(slots_.size()); ++i) {
    const Slot& s = *slots_[i];
    if (s.state == Slot::Empty) return i;
    if (s.pins == 0 && s.state == Slot::Ready && (best < 0 || s.last_use < slots_[best]->last_use)) best = i;
  }
  if (best >= 0) {
    Slot& s = *slots_[best];
    where_.erase(int64_t(s.layer) * int64_t(w_.layers[s.layer].moe.experts.size()) + s.e);
    s.state = Slot::Empty;
    ++stats_.evictions;
  }
  return best;
}

void ExpertStore::start_load(int layer, int e, int slot) {
  Slot& s = *slots_[slot];
  s.layer = layer, s.e = e, s.pins = 1, s.state = Slot::Loading, s.error.clear();
  where_[int64_t(layer) * int64_t(w_.layers[layer].moe.experts.size()) + e] = slot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(slot);
  }
  cv_job_.notify_one();
  stats_.bytes_read += w_.layers[layer].moe.experts[e].nbytes;
}

void ExpertStore::wait_loaded(int slot) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return slots_[slot]->state != Slot::Loading; });
}

void ExpertStore::visit(int layer, const std::vector<int>& experts,
                        const std::function<void(int, const ExpertRef&)>& fn) {
  visit_batches(layer, experts, [&](const int* ids, const ExpertRef* const* views, int n) {
    for (int i = 0; i < n; ++i) fn(ids[i], *views[i]);
  });
}

void ExpertStore::visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) {
  const int64_t E = int64_t(w_.layers[layer].moe.experts.size());
  std::vector<std::pair<int, int>> hits;  // (e, slot)
  std::vector<int> misses;
  for (int e : experts) {
    auto it = where_.find(layer * E + e);
    if (it != where_.end()) {
      hits.push_back({e, it->second});
      ++slots_[it->second]->pins;
    } else {
      misses.push_back(e);
    }
  }
  stats_.hits += hits.size();
  stats_.misses += misses.size();
  const auto& refs = w_.layers[layer].moe.experts;
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
  std::vector<ExpertRef> views;
  std::vector<const ExpertRef*> ptrs;
  auto run = [&] {
    views.clear();
    ptrs.clear();
    for (int slot : batch_slots) {
      Slot& s = *slots_[slot];
      s.last_use = ++clock_;
      views.push_back(view_of(s));
    }
    for (const ExpertRef& v : views) ptrs.push_back(&v);
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
        where_.erase(int64_t(s.layer) * E + s.e);
        s.state = Slot::Empty;
      }
    }
    throw;
  }
}

std::unique_ptr<ExpertStore> open_expert_store(const ModelWeights& w, const Config& c,
                                               const std::string& size, const std::string& direct,
                                               bool announce) {
  ExpertStoreOptions o;
  check(direct == "auto" || direct == "on" || direct == "off", "--direct: '" + direct + "' (expected auto, on or off)");
  o.direct = direct == "on" ? DirectIo::On : direct == "off" ? DirectIo::Off : DirectIo::Auto;
  const uint64_t n_experts = uint64_t(c.n_experts) * uint64_t(c.n_layers - c.first_dense);
  const uint64_t all = n_experts * uint64_t(c.expert_bytes());
  if (size.empty()) {
    const uint64_t half = available_memory() / 2;
    o.cache_bytes = std::max<uint64_t>(c.expert_bytes(), half ? std::min(all, half) : all);
  } else {
    o.cache_bytes = parse_size(size, "--expert-cache");
  }
  for (const LayerWeights& l : w.layers)
    for (const ExpertRef& e : l.moe.experts)
      if (!e.contiguous) {
        std::fprintf(stderr, "wren: %s: the tensors of '%s' are not stored back to back; experts are read "
                             "through the shard mappings instead of the expert store\n", e.file.c_str(), e.name.c_str());
        return nullptr;
      }
  auto store = std::make_unique<ExpertStore>(w, c.expert_bytes(), o);
  if (announce)
    std::fprintf(stderr, "wren: expert cache %.3f MB%s: %d of %llu experts (%.3f MB each), %s reads\n",
                 double(store->slots()) * c.expert_bytes() / 1e6, size.empty() ? " (default)" : "",
                 store->slots(), (unsigned long long)n_experts, c.expert_bytes() / 1e6,
                 store->direct() ? "O_DIRECT" : "buffered");
  return store;
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return uint64_t(ru.ru_maxrss) * 1024;
}

uint64_t parse_size(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double mult = 1;
  const std::string unit = end ? std::string(end) : "";
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB") mult = 1e3;
  else if (unit == "M" || unit == "MB") mult = 1e6;
  else if (unit == "G" || unit == "GB") mult = 1e9;
  else if (unit == "T" || unit == "TB") mult = 1e12;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else mult = -1;
  check(end != s.c_str() && mult > 0 && v >= 0 && std::isfinite(v),
        what + ": '" + s + "' is not a size (expected e.g. 8G, 512M, 300K or a byte count)");
  // The double -> uint64 cast is undefined at 2^64 and beyond: refuse such sizes (no machine has them).
  check(v * mult < 18446744073709551616.0, what + ": '" + s + "' is beyond 2^64 bytes (16 EiB)");
  return uint64_t(v * mult);
}

uint64_t available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace wren
