// Experts through the memory mappings (see expert_source.h).
#include "ops/expert_source.h"

namespace wren {

MappedExperts::MappedExperts(const WeightList& w) : layers_(w.experts), checked_(w.experts.size()) {
  for (size_t i = 0; i < layers_.size(); ++i) checked_[i].assign(layers_[i]->size(), 0);
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
    const ExpertRef& ref = (*layers_[layer])[e];
    if (!checked_[layer][e]) {
      validate_expert_scales(ref);
      checked_[layer][e] = 1;
    }
    views.push_back(&ref);
  }
  if (!experts.empty()) fn(experts.data(), views.data(), int(views.size()));
}

}  // namespace wren
