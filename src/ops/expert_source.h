// Where a backend gets routed MXFP4 experts from, one MoE layer at a time: the interface, and the
// source that reads them straight from the memory-mapped shards (MappedExperts). The bounded,
// streaming one is the expert store (runtime/expert_store.h over io/expert_store.h).
#pragma once
#include <functional>
#include <vector>

#include "ops/weights.h"

namespace wren {

/// Expert access for one MoE layer at a time. `visit` calls fn(e, view) once for each expert id
/// in `experts` (unique ids), with a view whose MxMatrix pointers stay valid during the call only.
/// Implementations choose the order (to overlap I/O with compute); results never depend on it.
/// Throws wren::Error naming file and tensor on a read failure or a ue8m0 scale byte 255.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual void visit(int layer, const std::vector<int>& experts,
                     const std::function<void(int e, const ExpertRef& view)>& fn) = 0;

  /// fn(ids, views, n): n experts of `experts` at once, views[i] of expert ids[i], all valid
  /// during that call only.
  using BatchFn = std::function<void(const int* ids, const ExpertRef* const* views, int n)>;
  /// As visit, but hands over as many experts at once as the source keeps valid together, so a
  /// backend can run them concurrently (each expert exactly once over all batches). The default
  /// hands them over one at a time through visit.
  virtual void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) {
    visit(layer, experts, [&](int e, const ExpertRef& view) {
      const ExpertRef* v = &view;
      fn(&e, &v, 1);
    });
  }

  /// A guess that `experts` (ids of `layer`, duplicates allowed) will be visited soon: a source
  /// that reads from disk may start reading them now. A wrong guess may cost time, never change
  /// what a visit hands over. The default (memory-resident sources) does nothing.
  virtual void prefetch(int layer, const int* experts, int n) { (void)layer, (void)experts, (void)n; }

  /// Whether a visit would hand expert `e` of `layer` over now, from memory, without starting or
  /// waiting for a read (a read in flight counts as not held). The CUDA VRAM tier copies only such
  /// guesses: its kernels are so much faster than the disk that a guess read from disk delays the
  /// reads a layer needs (docs/streaming.md, run 26a). The default (memory-resident sources): true.
  virtual bool holds(int layer, int e) { return (void)layer, (void)e, true; }
};

/// Experts read through the shards' memory mappings (pages fault in on first use). Each expert's
/// scales are validated the first time it is used.
class MappedExperts final : public ExpertSource {
 public:
  /// `w.experts[layer]` gives each layer's experts; they must outlive this source.
  explicit MappedExperts(const WeightList& w);
  /// No layer yet: bind() gives them one at a time.
  MappedExperts() = default;
  /// Serves `layer` from `experts` (which must outlive the use). A layer bound to another list
  /// before is rebound, and its experts' scales are validated again on first use.
  void bind(int layer, const std::vector<ExpertRef>& experts);
  void visit(int layer, const std::vector<int>& experts,
             const std::function<void(int e, const ExpertRef& view)>& fn) override;
  /// All of them in one batch (the mappings stay valid).
  void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) override;

 private:
  std::vector<const std::vector<ExpertRef>*> layers_;
  std::vector<std::vector<char>> checked_;  ///< [layer][expert]
};

}  // namespace wren
