// CUDA backend: the VRAM expert tier (see cuda_common.cuh, ExpertTier). When the routed MXFP4
// experts do not fit the budget, upload() leaves them on the host and sets up n_slots device slots.
// routed_moe then routes on the device, brings the ids to the host (one sync per MoE layer), and
// calls tier_prepare: hits refresh their LRU clock; misses take an empty slot or the least
// recently used one not needed by the same call, are read through the host tier's visit() (the
// shard mappings, or the ExpertStore: disk -> host), copied into pinned staging and sent with
// cudaMemcpyAsync on the compute stream (ordered before the kernels that read them). The kernels
// then read the per-(token, slot) pointer table. The bytes that reach the kernels are the stored
// bytes, so results are bit-identical at every budget.
#include <algorithm>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_common.cuh"

namespace wren {

using cuda::check_cuda;

namespace {

constexpr size_t kAlign = 256;

size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t tier_key(int layer, int e) { return (int64_t(layer) << 32) | uint32_t(e); }

std::string bytes_str(uint64_t b) { return std::to_string(b) + " bytes"; }

}  // namespace

void CudaBackend::Impl::tier_reset() {
  cuda::ExpertTier& t = tier;
  if (t.arena) cudaFree(t.arena);
  if (t.staging) cudaFreeHost(t.staging);
  if (t.pinned_pairs) cudaFreeHost(t.pinned_pairs);
  t.arena = nullptr, t.staging = nullptr, t.pinned_pairs = nullptr;
  t.staging_bytes = 0, t.pinned_pairs_len = 0;
  t.active = false, t.n_slots = 0, t.clock = 0;
  t.where.clear(), t.key.clear(), t.last_use.clear();
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
  t.key.assign(slots, -1);
  t.last_use.assign(slots, 0);
  t.mapped = std::make_unique<MappedExperts>(w);
  t.active = true;
  stats.expert_slots = slots;
  return true;
}

const cuda::ExpertPtrs* CudaBackend::Impl::tier_prepare(int layer, const int* ids, int pairs) {
  cuda::ExpertTier& t = tier;
  const uint64_t stamp = ++t.clock;
  std::vector<int> misses;
  int distinct = 0;
  std::unordered_map<int, int> seen;  // expert -> index in misses or -1 (hit)
  for (int j = 0; j < pairs; ++j) {
    if (seen.count(ids[j])) continue;
    ++distinct;
    const auto it = t.where.find(tier_key(layer, ids[j]));
    if (it != t.where.end()) {
      t.last_use[it->second] = stamp;
      seen[ids[j]] = -1;
      ++stats.tier_hits;
    } else {
      seen[ids[j]] = int(misses.size());
      misses.push_back(ids[j]);
    }
  }
  if (distinct > t.n_slots)
    throw Error("CUDA backend: --vram-experts: layer " + std::to_string(layer) + " needs " + std::to_string(distinct) +
                " experts at once but the budget holds " + std::to_string(t.n_slots) + " (raise --vram-experts)");
  // Slots for the misses: empty ones first, then the least recently used not needed now.
  std::vector<int> slot_of(misses.size());
  for (size_t i = 0; i < misses.size(); ++i) {
    int best = -1;
    for (int s = 0; s < t.n_slots; ++s) {
      if (t.last_use[s] == stamp) continue;
      if (t.key[s] < 0) {
        best = s;
        break;
      }
      if (best < 0 || t.last_use[s] < t.last_use[best]) best = s;
    }
    if (t.key[best] >= 0) t.where.erase(t.key[best]);
    t.key[best] = tier_key(layer, misses[i]);
    t.where[t.key[best]] = best;
    t.last_use[best] = stamp;
    slot_of[i] = best;
  }
  if (!misses.empty()) {
    const size_t need = misses.size() * t.slot_bytes;
    if (t.staging_bytes < need) {  // every earlier copy from staging is done (caller synced)
      if (t.staging) check_cuda(cudaFreeHost(t.staging), "cudaFreeHost (expert staging)");
      t.staging = nullptr, t.staging_bytes = 0;
      void* p = nullptr;
      check_cuda(cudaHostAlloc(&p, need, cudaHostAllocDefault), "cudaHostAlloc (expert staging)");
      t.staging = static_cast<uint8_t*>(p), t.staging_bytes = need;
    }
    ExpertSource* src = t.source ? t.source : t.mapped.get();
    src->visit(layer, misses, [&](int e, const ExpertRef& v) {
      const int i = seen.at(e);
      if (v.w1.rows != t.inter || v.w1.cols != t.io || v.w3.rows != t.inter || v.w3.cols != t.io ||
          v.w2.rows != t.io || v.w2.cols != t.inter)
        throw Error("CUDA backend: VRAM expert tier: layer " + std::to_string(layer) + " expert " + v.name +
                    " has a shape unlike the first expert's");
      uint8_t* st = t.staging + size_t(i) * t.slot_bytes;
      const uint8_t* parts[6] = {v.w1.packed, v.w1.scale, v.w3.packed, v.w3.scale, v.w2.packed, v.w2.scale};
      for (int k = 0; k < 6; ++k) std::memcpy(st + t.off[k], parts[k], t.len[k]);
      check_cuda(cudaMemcpyAsync(t.arena + size_t(slot_of[i]) * t.slot_bytes, st, t.slot_bytes,
                                 cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync (expert to its VRAM slot)");
      ++stats.tier_misses;
      stats.tier_bytes += t.slot_bytes;
    });
  }
  if (t.pinned_pairs_len < size_t(pairs)) {
    if (t.pinned_pairs) check_cuda(cudaFreeHost(t.pinned_pairs), "cudaFreeHost (pair table)");
    t.pinned_pairs = nullptr, t.pinned_pairs_len = 0;
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, size_t(pairs) * sizeof(cuda::ExpertPtrs), cudaHostAllocDefault),
               "cudaHostAlloc (pair table)");
    t.pinned_pairs = static_cast<cuda::ExpertPtrs*>(p), t.pinned_pairs_len = size_t(pairs);
  }
  for (int j = 0; j < pairs; ++j) {
    const auto it = t.where.find(tier_key(layer, ids[j]));
    check(it != t.where.end(), "CUDA backend: VRAM expert tier: an expert was not loaded");
    const uint8_t* base = reinterpret_cast<const uint8_t*>(t.arena) + size_t(it->second) * t.slot_bytes;
    t.pinned_pairs[j] = {base + t.off[0], base + t.off[1], base + t.off[2], base + t.off[3], base + t.off[4],
                         base + t.off[5]};
  }
  auto* dev = static_cast<cuda::ExpertPtrs*>(scratch(pair_table, size_t(pairs) * sizeof(cuda::ExpertPtrs)));
  check_cuda(cudaMemcpyAsync(dev, t.pinned_pairs, size_t(pairs) * sizeof(cuda::ExpertPtrs), cudaMemcpyHostToDevice,
                             stream),
             "cudaMemcpyAsync (pair table)");
  return dev;
}

void CudaBackend::set_vram_expert_budget(uint64_t bytes) { impl_->tier.budget = bytes; }

void CudaBackend::set_host_tier(ExpertSource* source) { impl_->tier.source = source; }

bool CudaBackend::experts_streamed() const { return impl_->tier.active; }

}  // namespace wren
