// Negative log-likelihood of one token under a logits row, the quantity perplexity averages.
#pragma once
#include <algorithm>
#include <cmath>

namespace wren {

/// −log softmax(logits)[target], computed in f64 with the row's maximum subtracted (no overflow for
/// any finite row). `logits`: V f32 values; `target` in [0, V). Used by `wren perplexity`,
/// `wren bench routing` and `wren bench quality --text`, so their perplexities agree exactly.
inline double token_nll(const float* logits, int V, int target) {
  double mx = logits[0];
  for (int i = 1; i < V; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - mx);
  return std::log(sum) + mx - double(logits[target]);
}

}  // namespace wren
