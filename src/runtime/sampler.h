// Token sampling: greedy, or temperature with top-k and top-p (nucleus), seeded and reproducible.
#pragma once
#include <cstdint>
#include <vector>

namespace wren {

/// Sampling controls. temperature <= 0 means greedy (argmax, ties to the lower id).
struct SamplerOptions {
  float temperature = 0.f;
  float top_p = 1.f;   ///< keep the smallest set of most likely tokens whose mass reaches top_p
  int top_k = 0;       ///< keep the k most likely tokens (0 = all)
  uint64_t seed = 0;   ///< same seed + same logits = same tokens, on every platform
};

/// Draws token ids from logits. One sampler per sequence (it carries the random state).
class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o);
  /// Picks an id from logits[n]. Throws wren::Error on bad options (top_p outside (0, 1]).
  int sample(const float* logits, int n);
  const SamplerOptions& options() const { return o_; }

 private:
  double uniform();  // [0, 1), splitmix64-based: identical on every platform
  SamplerOptions o_;
  uint64_t state_;
  std::vector<int> idx_;
  std::vector<double> p_;
};

/// Index of the largest logit; ties go to the lower id.
int argmax(const float* logits, int n);

}  // namespace wren
