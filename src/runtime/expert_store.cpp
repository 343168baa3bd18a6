// The expert store as an ExpertSource (see expert_store.h).
#include "runtime/expert_store.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/sizes.h"

namespace wren {

namespace {

/// Each routed expert's byte range, [layer][expert]; throws unless its six tensors are contiguous.
std::vector<std::vector<ExpertExtent>> extents_of(const ModelWeights& w) {
  std::vector<std::vector<ExpertExtent>> out(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l)
    for (const ExpertRef& e : w.layers[l].moe.experts) {
      check(e.contiguous, e.file + ": the six tensors of '" + e.name +
                              "' are not stored back to back; the expert store needs one read per expert");
      out[l].push_back({e.file, e.offset, e.nbytes, e.name});
    }
  return out;
}

}  // namespace

ExpertStore::ExpertStore(const ModelWeights& w, int64_t expert_bytes, const ExpertStoreOptions& opts) : w_(w) {
  bytes_ = std::make_unique<ExpertByteStore>(
      extents_of(w), uint64_t(expert_bytes), opts,
      [this](int layer, int e, const uint8_t* bytes) { validate_expert_scales(view_of(layer, e, bytes)); });
}

ExpertRef ExpertStore::view_of(int layer, int e, const uint8_t* bytes) const {
  ExpertRef v = w_.layers[layer].moe.experts[e];
  const uint8_t* p = bytes;  // storage order: w1.packed, w1.scale, w2..., w3...
  for (MxMatrix* m : {&v.w1, &v.w2, &v.w3}) {
    const size_t n = size_t(m->rows) * m->cols;
    m->packed = p;
    m->scale = p + n / 2;
    p += n / 2 + n / 32;
  }
  return v;
}

void ExpertStore::visit(int layer, const std::vector<int>& experts,
                        const std::function<void(int, const ExpertRef&)>& fn) {
  visit_batches(layer, experts, [&](const int* ids, const ExpertRef* const* views, int n) {
    for (int i = 0; i < n; ++i) fn(ids[i], *views[i]);
  });
}

void ExpertStore::visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) {
  std::vector<ExpertRef> views;
  std::vector<const ExpertRef*> ptrs;
  bytes_->visit_batches(layer, experts, [&](const int* ids, const uint8_t* const* bytes, int n) {
    views.clear();
    ptrs.clear();
    for (int i = 0; i < n; ++i) views.push_back(view_of(layer, ids[i], bytes[i]));
    for (const ExpertRef& v : views) ptrs.push_back(&v);
    fn(ids, ptrs.data(), n);
  });
}

std::unique_ptr<ExpertStore> open_expert_store(const ModelWeights& w, const Config& c,
                                               const std::string& size, const std::string& direct,
                                               bool announce) {
  ExpertStoreOptions o;
  o.direct = parse_direct_io(direct);
  const uint64_t n_experts = uint64_t(c.n_experts) * uint64_t(c.n_layers - c.first_dense);
  const uint64_t all = n_experts * uint64_t(c.expert_bytes());
  if (size.empty()) {
    const uint64_t half = available_memory() / 2;
    o.cache_bytes = std::max<uint64_t>(c.expert_bytes(), half ? std::min(all, half) : all);
  } else {
    o.cache_bytes = parse_size(size, "--expert-cache");
    usage_check(o.cache_bytes >= uint64_t(c.expert_bytes()), "--expert-cache " + size + " is below one expert (" +
                                                      std::to_string(c.expert_bytes()) + " bytes)");
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

}  // namespace wren
