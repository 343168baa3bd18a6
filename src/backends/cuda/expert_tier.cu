// CUDA backend: the VRAM expert tier (see cuda_common.cuh, ExpertTier; docs/streaming.md#cuda).
// When the routed MXFP4 experts do not fit the budget, upload() leaves them on the host and sets up
// n_slots device slots, a ring of pinned staging buffers, two copy streams and their events, all
// at once. routed_moe then routes on the device, brings the ids to the host (one sync per MoE
// layer), and calls tier_prepare per group of tokens: hits leave the LRU for the call; misses take
// a free slot or the head of the LRU (never a slot of the same group), are read through the host
// tier's visit() (the shard mappings, or the ExpertStore: disk -> host, several reads in flight),
// copied into the next staging buffer and sent with cudaMemcpyAsync on the demand copy stream.
// Events instead of syncs:
// - a copy into a slot waits (on its copy stream) for the kernel group that last read the slot
//   and for the slot's previous copy (a prefetch still in flight that is evicted);
// - the compute stream waits for each slot's latest copy before the group's kernels;
// - a staging buffer is refilled once the copy out of it is done (the host waits for that copy
//   only, never for the compute stream as such).
// Prediction: CudaBackend::prefetch_experts stores the guess; once the running routed_moe call has
// queued its kernels, tier_prefetch copies the guessed experts into slots on the prefetch copy
// stream while those kernels run. A prefetch never evicts a slot of the running call (the LRU is
// ordered by use stamp, so its head tells in O(1)), leaves twice the latest call's distinct count
// of slots to demand and holds at most half of the slots with unused guesses. Only guesses the
// host source holds in memory (ExpertSource::holds) are copied: a guess never sends the host store
// to the disk (docs/streaming.md#cuda).
// The bytes that reach the kernels are the stored bytes, so results are bit-identical at every
// budget, with prediction on or off.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_common.cuh"

namespace wren {

using cuda::check_cuda;

namespace {

constexpr size_t kAlign = 256;
constexpr int kStaging = 8;   ///< pinned staging buffers (copies in flight per tier)
constexpr int kReadRing = 64; ///< compute-stream events of recent kernel groups

size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t tier_key(int layer, int e) { return (int64_t(layer) << 32) | uint32_t(e); }

std::string bytes_str(uint64_t b) { return std::to_string(b) + " bytes"; }

/// Test hook: spins for about `ns` nanoseconds (one thread).
__global__ void stall_kernel(long long ns) {
  const long long t0 = clock64();
  // clock64 counts SM cycles; ~1.5-2 GHz: 1 cycle <= 1 ns, so `ns` cycles x 2 is at least `ns`.
  while (clock64() - t0 < 2 * ns) {
  }
}

void lru_remove(cuda::ExpertTier& t, int s) {
  cuda::TierSlot& x = t.slots[s];
  if (!x.in_lru) return;
  (x.prev >= 0 ? t.slots[x.prev].next : t.lru_head) = x.next;
  (x.next >= 0 ? t.slots[x.next].prev : t.lru_tail) = x.prev;
  x.prev = x.next = -1, x.in_lru = false;
}

/// Appends slot s at the recent end with use = the current clock (so the list stays ordered by use).
void lru_push_back(cuda::ExpertTier& t, int s) {
  cuda::TierSlot& x = t.slots[s];
  lru_remove(t, s);
  x.use = t.clock;
  x.prev = t.lru_tail, x.next = -1, x.in_lru = true;
  (t.lru_tail >= 0 ? t.slots[t.lru_tail].next : t.lru_head) = s;
  t.lru_tail = s;
}

/// Empties slot s (off the LRU, out of the map, onto the free list).
void free_slot(cuda::ExpertTier& t, int s) {
  cuda::TierSlot& x = t.slots[s];
  lru_remove(t, s);
  if (x.key >= 0) t.where.erase(x.key);
  if (x.prefetched) --t.prefetched_unused;
  x.key = -1, x.prefetched = false;
  t.free_slots.push_back(s);
}

}  // namespace

void CudaBackend::Impl::tier_reset() {
  cuda::ExpertTier& t = tier;
  // Copies may be in flight: wait for them before their buffers go.
  if (t.demand_copy) cudaStreamSynchronize(t.demand_copy);
  if (t.prefetch_copy) cudaStreamSynchronize(t.prefetch_copy);
  if (stream) cudaStreamSynchronize(stream);
  if (t.arena) cudaFree(t.arena);
  if (t.staging) cudaFreeHost(t.staging);
  if (t.pinned_pairs) cudaFreeHost(t.pinned_pairs);
  for (cuda::TierSlot& s : t.slots)
    if (s.ready) cudaEventDestroy(s.ready);
  for (cudaEvent_t e : t.staging_done) cudaEventDestroy(e);
  for (cudaEvent_t e : t.reads) cudaEventDestroy(e);
  if (t.demand_copy) cudaStreamDestroy(t.demand_copy);
  if (t.prefetch_copy) cudaStreamDestroy(t.prefetch_copy);
  t.demand_copy = t.prefetch_copy = nullptr;
  t.arena = nullptr, t.staging = nullptr, t.pinned_pairs = nullptr;
  t.pinned_pairs_len = 0, t.n_staging = 0, t.next_staging = 0;
  t.active = false, t.n_slots = 0, t.clock = 0, t.call_first = 1, t.read_seq = 0;
  t.last_distinct = 0, t.prefetched_unused = 0, t.lru_head = t.lru_tail = -1;
  t.where.clear(), t.slots.clear(), t.free_slots.clear(), t.staging_done.clear(), t.staging_busy.clear();
  t.reads.clear(), t.group_slots.clear(), t.pending_ids.clear(), t.guess_ids.clear();
  t.pending_layer = t.guess_layer = -1;
  t.mapped.reset();
  stats.expert_slots = 0;
}

bool CudaBackend::Impl::tier_setup(const WeightList& w, uint64_t bytes) {
  cuda::ExpertTier& t = tier;
  tier_reset();
  const ExpertRef* first = nullptr;
  int64_t n_experts = 0;
  for (const std::vector<ExpertRef>* layer : w.experts)
    for (const ExpertRef& e : *layer) {
      if (!e.w1.packed) return false;  // dense experts: always resident
      if (!first) first = &e;
      ++n_experts;
    }
  if (!first || t.budget == kAllExperts) return false;
  uint64_t budget = t.budget;
  if (budget == 0) {  // default: what is free now (dense weights are in), less a margin
    size_t free_b = 0, total_b = 0;
    check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const uint64_t margin = std::max<uint64_t>(uint64_t(1) << 30, total_b / 20);
    budget = free_b > margin ? free_b - margin : 0;
  }
  if (bytes <= budget) return false;
  const MxMatrix* mats[3] = {&first->w1, &first->w3, &first->w2};
  size_t off = 0;
  for (int k = 0; k < 3; ++k) {
    t.len[2 * k] = size_t(mats[k]->rows) * (mats[k]->cols / 2);
    t.len[2 * k + 1] = size_t(mats[k]->rows) * (mats[k]->cols / 32);
    t.off[2 * k] = off, off += aligned(t.len[2 * k]);
    t.off[2 * k + 1] = off, off += aligned(t.len[2 * k + 1]);
  }
  t.slot_bytes = off;
  t.inter = int(first->w1.rows), t.io = int(first->w1.cols);
  const uint64_t slots = std::min<uint64_t>(budget / t.slot_bytes, uint64_t(n_experts));
  if (slots < 1)
    throw Error("--vram-experts: a budget of " + bytes_str(budget) + " holds no expert (one needs " +
                bytes_str(t.slot_bytes) + " of device memory)");
  t.n_slots = int(slots);
  void* arena = nullptr;
  check_cuda(cudaMalloc(&arena, size_t(slots) * t.slot_bytes),
             ("cudaMalloc of " + std::to_string(slots) + " expert slots").c_str());
  t.arena = static_cast<char*>(arena);
  t.slots.assign(slots, cuda::TierSlot{});
  t.free_slots.reserve(slots);
  for (int s = int(slots) - 1; s >= 0; --s) t.free_slots.push_back(s);  // slot 0 first
  t.where.reserve(size_t(slots) * 2);
  for (cuda::TierSlot& s : t.slots)
    check_cuda(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming), "cudaEventCreate (expert slot)");
  // Staging: a ring of pinned buffers, one expert each, allocated now (never on the token path).
  t.n_staging = int(std::min<uint64_t>(kStaging, slots + 1));
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, size_t(t.n_staging) * t.slot_bytes, cudaHostAllocDefault),
             "cudaHostAlloc (expert staging)");
  t.staging = static_cast<uint8_t*>(p);
  t.staging_done.assign(t.n_staging, nullptr);
  t.staging_busy.assign(t.n_staging, 0);
  for (cudaEvent_t& e : t.staging_done)
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (expert staging)");
  t.reads.assign(kReadRing, nullptr);
  for (cudaEvent_t& e : t.reads)
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (expert reads)");
  check_cuda(cudaStreamCreateWithFlags(&t.demand_copy, cudaStreamNonBlocking), "cudaStreamCreate (demand copies)");
  check_cuda(cudaStreamCreateWithFlags(&t.prefetch_copy, cudaStreamNonBlocking), "cudaStreamCreate (prefetch copies)");
  t.mapped = std::make_unique<MappedExperts>(w);
  t.active = true;
  stats.expert_slots = slots;
  return true;
}

namespace {

/// Takes a slot for a new expert: a free one, else the LRU head when its last use is older than
/// `protect` (the LRU is ordered by use, so no later entry is older). -1 when there is none.
int take_slot(cuda::ExpertTier& t, CudaStats& stats, uint64_t protect) {
  if (!t.free_slots.empty()) {
    const int s = t.free_slots.back();
    t.free_slots.pop_back();
    return s;
  }
  const int s = t.lru_head;
  if (s < 0 || t.slots[s].use >= protect) return -1;
  cuda::TierSlot& x = t.slots[s];
  lru_remove(t, s);
  t.where.erase(x.key);
  if (x.prefetched) --t.prefetched_unused, ++stats.tier_prefetch_wasted;
  x.key = -1, x.prefetched = false;
  return s;
}

void check_shape(const cuda::ExpertTier& t, int layer, const ExpertRef& v) {
  if (v.w1.rows != t.inter || v.w1.cols != t.io || v.w3.rows != t.inter || v.w3.cols != t.io ||
      v.w2.rows != t.io || v.w2.cols != t.inter)
    throw Error("CUDA backend: VRAM expert tier: layer " + std::to_string(layer) + " expert " + v.name +
                " has a shape unlike the first expert's");
}

/// Queues the copy of expert `v` into slot s on stream `cs`: host bytes into the next staging
/// buffer (waiting for that buffer's previous copy), then one cudaMemcpyAsync after the waits
/// for the slot's last readers and its previous copy; records the slot's and the buffer's events.
void copy_in(cuda::ExpertTier& t, int s, const ExpertRef& v, cudaStream_t cs) {
  const int b = t.next_staging;
  t.next_staging = (b + 1) % t.n_staging;
  if (t.staging_busy[b]) check_cuda(cudaEventSynchronize(t.staging_done[b]), "cudaEventSynchronize (expert staging)");
  uint8_t* st = t.staging + size_t(b) * t.slot_bytes;
  const uint8_t* parts[6] = {v.w1.packed, v.w1.scale, v.w3.packed, v.w3.scale, v.w2.packed, v.w2.scale};
  for (int k = 0; k < 6; ++k) std::memcpy(st + t.off[k], parts[k], t.len[k]);
  cuda::TierSlot& x = t.slots[s];
  if (x.read_seq) check_cuda(cudaStreamWaitEvent(cs, t.reads[x.read_seq % kReadRing], 0), "cudaStreamWaitEvent (slot readers)");
  if (x.copied) check_cuda(cudaStreamWaitEvent(cs, x.ready, 0), "cudaStreamWaitEvent (slot's previous copy)");
  check_cuda(cudaMemcpyAsync(t.arena + size_t(s) * t.slot_bytes, st, t.slot_bytes, cudaMemcpyHostToDevice, cs),
             "cudaMemcpyAsync (expert to its VRAM slot)");
  check_cuda(cudaEventRecord(t.staging_done[b], cs), "cudaEventRecord (expert staging)");
  check_cuda(cudaEventRecord(x.ready, cs), "cudaEventRecord (expert slot)");
  t.staging_busy[b] = 1, x.copied = true;
}

}  // namespace

void CudaBackend::Impl::tier_begin_call(int pairs) {
  cuda::ExpertTier& t = tier;
  t.call_first = t.clock + 1;
  if (t.pinned_pairs_len < size_t(pairs)) {  // the caller synced: no copy from it is pending
    if (t.pinned_pairs) check_cuda(cudaFreeHost(t.pinned_pairs), "cudaFreeHost (pair table)");
    t.pinned_pairs = nullptr, t.pinned_pairs_len = 0;
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, size_t(pairs) * sizeof(cuda::ExpertPtrs), cudaHostAllocDefault),
               "cudaHostAlloc (pair table)");
    t.pinned_pairs = static_cast<cuda::ExpertPtrs*>(p), t.pinned_pairs_len = size_t(pairs);
  }
  scratch(pair_table, size_t(pairs) * sizeof(cuda::ExpertPtrs));
}

const cuda::ExpertPtrs* CudaBackend::Impl::tier_prepare(int layer, const int* ids, int pairs, int at,
                                                         ExpertSource* src) {
  cuda::ExpertTier& t = tier;
  const uint64_t stamp = ++t.clock;
  std::vector<int> misses, distinct_ids;
  t.group_slots.clear();
  distinct_ids.assign(ids, ids + pairs);
  std::sort(distinct_ids.begin(), distinct_ids.end());
  distinct_ids.erase(std::unique(distinct_ids.begin(), distinct_ids.end()), distinct_ids.end());
  if (int(distinct_ids.size()) > t.n_slots)
    throw Error("CUDA backend: --vram-experts: layer " + std::to_string(layer) + " needs " +
                std::to_string(distinct_ids.size()) + " experts at once but the budget holds " +
                std::to_string(t.n_slots) + " (raise --vram-experts)");
  for (int id : distinct_ids) {
    const auto it = t.where.find(tier_key(layer, id));
    if (it != t.where.end()) {
      cuda::TierSlot& x = t.slots[it->second];
      lru_remove(t, it->second);
      x.use = stamp;
      if (x.prefetched) x.prefetched = false, --t.prefetched_unused, ++stats.tier_prefetch_used;
      t.group_slots.push_back(it->second);
      ++stats.tier_hits;
    } else {
      misses.push_back(id);
    }
  }
  // Slots for the misses: free ones first, then the least recently used not taken by this group.
  std::vector<int> slot_of(misses.size());
  std::vector<char> done(misses.size(), 0);
  for (size_t i = 0; i < misses.size(); ++i) {
    const int s = take_slot(t, stats, stamp);
    check(s >= 0, "CUDA backend: VRAM expert tier: no slot free for a miss");
    t.slots[s].key = tier_key(layer, misses[i]);
    t.slots[s].use = stamp;
    t.where[t.slots[s].key] = s;
    slot_of[i] = s;
  }
  if (!misses.empty()) {
    std::unordered_map<int, size_t> index;  // expert -> its place in misses
    for (size_t i = 0; i < misses.size(); ++i) index[misses[i]] = i;
    try {
      src->visit(layer, misses, [&](int e, const ExpertRef& v) {
        const auto f = index.find(e);
        const size_t i = f == index.end() ? misses.size() : f->second;
        check(i < misses.size() && !done[i], "CUDA backend: VRAM expert tier: the source handed over an expert not asked for");
        check_shape(t, layer, v);
        copy_in(t, slot_of[i], v, t.demand_copy);
        done[i] = 1;
        ++stats.tier_misses;
        stats.tier_bytes += t.slot_bytes;
      });
    } catch (...) {
      // Slots whose bytes never came must not be found later: empty them. The rest (hits, and
      // misses already copied) are evictable again.
      for (size_t i = 0; i < misses.size(); ++i)
        if (!done[i]) free_slot(t, slot_of[i]);
        else lru_push_back(t, slot_of[i]);
      for (int s : t.group_slots) lru_push_back(t, s);
      t.group_slots.clear();
      throw;
    }
  }
  for (size_t i = 0; i < misses.size(); ++i) t.group_slots.push_back(slot_of[i]);
  // The kernels read the group's slots once their latest copies are done.
  for (int s : t.group_slots) {
    if (t.slots[s].copied) check_cuda(cudaStreamWaitEvent(stream, t.slots[s].ready, 0), "cudaStreamWaitEvent (expert copy)");
    lru_push_back(t, s);  // evictable again for later groups and calls (use = stamp)
  }
  cuda::ExpertPtrs* host = t.pinned_pairs + at;
  for (int j = 0; j < pairs; ++j) {
    const auto it = t.where.find(tier_key(layer, ids[j]));
    check(it != t.where.end(), "CUDA backend: VRAM expert tier: an expert was not loaded");
    const uint8_t* base = reinterpret_cast<const uint8_t*>(t.arena) + size_t(it->second) * t.slot_bytes;
    host[j] = {base + t.off[0], base + t.off[1], base + t.off[2], base + t.off[3], base + t.off[4], base + t.off[5]};
  }
  auto* dev = static_cast<cuda::ExpertPtrs*>(pair_table.ptr) + at;
  check_cuda(cudaMemcpyAsync(dev, host, size_t(pairs) * sizeof(cuda::ExpertPtrs), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (pair table)");
  return dev;
}

void CudaBackend::Impl::tier_mark_read() {
  cuda::ExpertTier& t = tier;
  const uint64_t seq = ++t.read_seq;
  check_cuda(cudaEventRecord(t.reads[seq % kReadRing], stream), "cudaEventRecord (expert reads)");
  for (int s : t.group_slots) t.slots[s].read_seq = seq;
}

namespace {

/// How many more guesses the tier may copy now: unused guesses hold at most half of the slots and
/// leave twice the latest call's distinct count to demand (a budget too small for both: none).
int prefetch_room(const cuda::ExpertTier& t) {
  if (t.ignore_prefetch_limits) return t.n_slots;
  return std::max(0, std::min(t.n_slots / 2 - t.prefetched_unused, t.n_slots - 2 * t.last_distinct));
}

}  // namespace

void CudaBackend::Impl::tier_prefetch(ExpertSource* src) {
  cuda::ExpertTier& t = tier;
  const int layer = t.pending_layer;
  t.pending_layer = -1;
  if (layer < 0 || t.pending_ids.empty()) return;
  const int room = prefetch_room(t);
  std::vector<int> want, slot_of;
  for (int e : t.pending_ids) {
    const auto it = t.where.find(tier_key(layer, e));
    if (it != t.where.end()) {  // resident: keep it from being evicted first
      if (t.slots[it->second].in_lru) lru_push_back(t, it->second);
      continue;
    }
    if (int(want.size()) >= room) continue;
    // Held when guessed, but the call that ran since may have had the host store evict it: a
    // copy now would wait for a disk read.
    if (!src->holds(layer, e)) {
      ++stats.tier_guess_not_held;
      continue;
    }
    const int s = take_slot(t, stats, t.call_first);  // never a slot of the running call
    if (s < 0) break;
    cuda::TierSlot& x = t.slots[s];
    x.key = tier_key(layer, e), x.prefetched = true;
    t.where[x.key] = s;
    ++t.prefetched_unused;
    want.push_back(e), slot_of.push_back(s);
  }
  if (want.empty()) return;
  if (t.stall_prefetch_us > 0) {
    stall_kernel<<<1, 1, 0, t.prefetch_copy>>>(1000LL * t.stall_prefetch_us);
    launched("VRAM tier test stall kernel");
  }
  std::vector<char> done(want.size(), 0);
  std::unordered_map<int, size_t> index;  // expert -> its place in want
  for (size_t i = 0; i < want.size(); ++i) index[want[i]] = i;
  try {
    src->visit(layer, want, [&](int e, const ExpertRef& v) {
      const auto f = index.find(e);
      const size_t i = f == index.end() ? want.size() : f->second;
      check(i < want.size() && !done[i], "CUDA backend: VRAM expert tier: the source handed over an expert not asked for");
      check_shape(t, layer, v);
      copy_in(t, slot_of[i], v, t.prefetch_copy);
      done[i] = 1;
      ++stats.tier_prefetch_issued;
      stats.tier_prefetch_bytes += t.slot_bytes;
    });
  } catch (const DeviceError&) {
    throw;  // a CUDA failure is not a failed guess
  } catch (const Error&) {
    // A failed read of a guess costs time only: the expert is read again when it is asked for.
    for (size_t i = 0; i < want.size(); ++i)
      if (!done[i]) ++stats.tier_prefetch_failed;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (done[i]) lru_push_back(t, slot_of[i]);
    else free_slot(t, slot_of[i]);
  }
}

void CudaBackend::set_vram_expert_budget(uint64_t bytes) { impl_->tier.budget = bytes; }

bool CudaBackend::streams_experts() const { return impl_->tier.active; }

bool CudaBackend::uses_prediction() const { return impl_->tier.active; }

void CudaBackend::prefetch_experts(int layer, const int* experts, int n) {
  cuda::ExpertTier& t = impl_->tier;
  if (!t.active) return Backend::prefetch_experts(layer, experts, n);
  // The distinct guesses, most frequent first (prefill: over the chunk's tokens), then in the
  // order given (decode: the router's top-k order).
  std::unordered_map<int, int> count;
  std::vector<int> ids;
  for (int i = 0; i < n; ++i)
    if (count[experts[i]]++ == 0) ids.push_back(experts[i]);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return count[a] > count[b]; });
  t.guess_layer = layer, t.guess_ids = ids;
  std::sort(t.guess_ids.begin(), t.guess_ids.end());
  // The tier copies only guesses the source holds in memory now (ExpertSource::holds): a guess
  // read from disk took the disk from the reads the next layer needs, and tier_prefetch waited for
  // it (run 26a: twice the decode time of prediction off at 40% VRAM). So prediction never adds
  // disk bytes here; it moves host-cached experts into VRAM before they are asked for. No more
  // than the tier's prefetch room, with the demand of the call about to run taken as the larger of
  // the latest call's distinct count and the guess's (the first call of a prompt has no latest
  // call). The held guesses are passed on to the source too, which keeps them from being evicted
  // first (they are held, so it reads nothing).
  ExpertSource* src = t.source(expert_source());
  std::vector<int> host, pending;
  int room = prefetch_room(t);
  if (!t.ignore_prefetch_limits)
    room = std::min(room, t.n_slots - 2 * std::max(t.last_distinct, std::min(int(ids.size()), t.n_slots)));
  for (int e : ids) {
    if (t.where.count(tier_key(layer, e))) {
      pending.push_back(e);  // resident: tier_prefetch keeps it from being evicted first
    } else if (int(host.size()) < room) {
      if (src->holds(layer, e)) {
        host.push_back(e);
        pending.push_back(e);
      } else {
        ++impl_->stats.tier_guess_not_held;  // room for it, but only on disk: left to demand
      }
    }
  }
  if (!host.empty()) Backend::prefetch_experts(layer, host.data(), int(host.size()));
  t.pending_layer = layer, t.pending_ids = std::move(pending);
}

void CudaBackend::tier_test_hooks(int stall_prefetch_us, bool ignore_prefetch_limits) {
  impl_->tier.stall_prefetch_us = stall_prefetch_us;
  impl_->tier.ignore_prefetch_limits = ignore_prefetch_limits;
}

bool CudaBackend::tier_holds(int layer, int expert) const {
  const cuda::ExpertTier& t = impl_->tier;
  return t.active && t.where.count(tier_key(layer, expert)) > 0;
}

double CudaBackend::h2d_gbps(size_t bytes, int reps) {
  Impl& m = *impl_;
  void* host = nullptr;
  void* dev = nullptr;
  check_cuda(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc (h2d bandwidth)");
  const cudaError_t err = cudaMalloc(&dev, bytes);
  if (err != cudaSuccess) {
    cudaFreeHost(host);
    check_cuda(err, "cudaMalloc (h2d bandwidth)");
  }
  std::memset(host, 1, bytes);
  std::vector<double> s;
  cudaEvent_t a = nullptr, b = nullptr;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int r = 0; r <= reps; ++r) {
    cudaEventRecord(a, m.stream);
    cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, m.stream);
    cudaEventRecord(b, m.stream);
    check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize (h2d bandwidth)");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (r > 0) s.push_back(ms / 1e3);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  cudaFree(dev), cudaFreeHost(host);
  std::sort(s.begin(), s.end());
  return s.empty() ? 0 : double(bytes) / s[s.size() / 2] / 1e9;
}

}  // namespace wren
