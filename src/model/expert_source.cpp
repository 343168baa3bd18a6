// Experts through the memory mappings (see expert_source.h).
#include "model/expert_source.h"

#include "model/load.h"

namespace wren {

MappedExperts::MappedExperts(const ModelWeights& w) : w_(w), checked_(w.layers.size()) {
  for (size_t i = 0; i < w.layers.size(); ++i) checked_[i].assign(w.layers[i].moe.experts.size(), 0);
}

void MappedExperts::visit(int layer, const std::vector<int>& experts,
                          const std::function<void(int, const ExpertRef&)>& fn) {
  visit_batches(layer, experts, [&](const int* ids, const ExpertRef* const* views, int n) {
    for (int i = 0; i < n; ++i) fn(ids[i], *views[i]);
  });
}

void MappedExperts::visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) {
  std::vector<const ExpertRef*> views;
  for (int e : experts) {
    const ExpertRef& ref = w_.layers[layer].moe.experts[e];
    if (!checked_[layer][e]) {
      validate_expert_scales(ref);
      checked_[layer][e] = 1;
    }
    views.push_back(&ref);
  }
  if (!experts.empty()) fn(experts.data(), views.data(), int(views.size()));
}

}  // namespace wren
