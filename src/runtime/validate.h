// Backend validation (gpu-backend.md, validation method): one prompt through a reference forward
// (the CPU in exact f32) and a candidate forward (another backend or format), compared per layer
// with the reference's layer inputs injected into the candidate, so each layer's error is its own
// and does not compound; then the free-running logits and a greedy continuation.
#pragma once
#include <vector>

#include "model/forward.h"

namespace wren {

/// One layer's comparison, over all prompt tokens, with the reference's inputs injected.
struct LayerCheck {
  double trace_rel_l2 = 0;   ///< ‖P_cand − P_ref‖ / ‖P_ref‖ after the layer (the golden traces' quantity)
  double output_rel_l2 = 0;  ///< the same for the layer's own output (P after minus P before)
  double worst_row = 0;      ///< largest per-token rel-L2 of P after the layer
};

/// Everything `wren validate` reports for one prompt.
struct PromptCheck {
  int tokens = 0;
  std::vector<LayerCheck> layers;     ///< [layers run]
  double logits_rel_l2 = 0;           ///< teacher-forced logits at every position, no injection
  int argmax_equal = 0;               ///< positions whose argmax agrees
  std::vector<int> greedy_ref, greedy_cand;  ///< greedy continuations (each on its own state)
  std::vector<float> margins;         ///< reference top-1 minus top-2 logit at each greedy step
  int greedy_equal = 0;               ///< leading steps that agree
  int first_near_tie = -1;            ///< first step with margin < near_tie (-1 = none)
  /// True when the continuations agree up to the first near-tie (or entirely).
  bool greedy_ok() const {
    const int need = first_near_tie < 0 ? int(greedy_ref.size()) : first_near_tie;
    return greedy_equal >= need;
  }
};

/// Runs `ids` (T tokens, [BOS] included if wanted) through both forwards on fresh states and
/// compares them. Both must be built on the same model config and with the same chunk size (the
/// injection replays the reference's per-chunk layer inputs). `greedy` = continuation length;
/// `near_tie` = the margin under which a greedy step is a near-tie (golden README: 0.02).
/// Throws wren::Error when the two forwards' layer calls do not line up.
PromptCheck validate_prompt(TokenStep& ref, TokenStep& cand, const std::vector<int>& ids, int ctx, int greedy,
                            float near_tie = 0.02f);

/// ‖a − b‖ / ‖b‖ over n values, in f64 (0 when both are zero).
double rel_l2(const float* a, const float* b, size_t n);

}  // namespace wren
