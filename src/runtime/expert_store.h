// The expert store as an ExpertSource: routed MXFP4 experts streamed from disk into a bounded cache
// (the byte-level store, io/expert_store.h: docs/model.md#tensors-moe, one expert = six tensors back to
// back = one read), each expert's bytes viewed as its three MXFP4 matrices and its scales checked
// when read. The cache only changes speed: outputs are bit-identical at any budget (the same bytes
// reach the same kernel).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/expert_store.h"
#include "loader/config.h"
#include "model/weights.h"
#include "ops/expert_source.h"

namespace wren {

/// The model's routed experts through an ExpertByteStore (see io/expert_store.h for the cache).
class ExpertStore final : public ExpertSource {
 public:
  /// `w` gives each expert's file, offset and size (from the tensor table). Throws wren::Error if
  /// an expert's tensors are not contiguous in its shard or the budget is below one expert.
  ExpertStore(const ModelWeights& w, int64_t expert_bytes, const ExpertStoreOptions& opts);

  void visit(int layer, const std::vector<int>& experts,
             const std::function<void(int e, const ExpertRef& view)>& fn) override;
  /// The resident experts (pinned for the call) in one batch, then each miss as its read lands.
  void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) override;
  /// Starts reads of the guessed experts (ExpertByteStore::prefetch).
  void prefetch(int layer, const int* experts, int n) override { bytes_->prefetch(layer, experts, n); }
  /// Read and checked in the cache (ExpertByteStore::holds).
  bool holds(int layer, int e) override { return bytes_->holds(layer, e); }

  const ExpertStoreStats& stats() const { return bytes_->stats(); }
  void reset_stats() { bytes_->reset_stats(); }
  int slots() const { return bytes_->slots(); }
  bool direct() const { return bytes_->direct(); }

 private:
  ExpertRef view_of(int layer, int e, const uint8_t* bytes) const;
  const ModelWeights& w_;
  std::unique_ptr<ExpertByteStore> bytes_;
};

/// Builds the store for a loaded MXFP4 model from the CLI flags: `size` ("" = default: every
/// expert if that fits in half of MemAvailable, else half of MemAvailable), `direct` ("auto",
/// "on", "off"). Prints the budget on stderr when `announce`. Returns null (after a one-line
/// notice) when some expert's six tensors are not stored back to back: those checkpoints are read
/// through the shard mappings.
std::unique_ptr<ExpertStore> open_expert_store(const ModelWeights& w, const Config& c,
                                               const std::string& size, const std::string& direct,
                                               bool announce);

}  // namespace wren
