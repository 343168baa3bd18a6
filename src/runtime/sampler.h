// Token sampling: greedy, or temperature with top-k and top-p (nucleus), seeded and reproducible.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/argmax.h"  // argmax: the greedy draw

namespace wren {

/// Sampling controls. temperature <= 0 means greedy (argmax, ties to the lower id).
struct SamplerOptions {
  float temperature = 0.f;
  float top_p = 1.f;   ///< keep the smallest set of most likely tokens whose mass reaches top_p
  int top_k = 0;       ///< keep the k most likely tokens (0 = all)
  uint64_t seed = 0;   ///< same seed + same logits = same tokens, on every platform
};

/// The log-probability of a drawn token and of the most likely alternatives, taken from the very
/// distribution the sampler drew from: with temperature > 0, softmax(logits / temperature)
/// restricted to the top-k and then the top-p (nucleus) set and renormalised over it (tokens
/// outside it have probability 0 and are never listed); with temperature 0 (greedy), which draws
/// from no distribution, softmax(logits) over the whole vocabulary (temperature 1, no cut).
struct TokenLogprobs {
  int id = -1;
  double logprob = 0;                        ///< natural log of the drawn token's probability
  std::vector<std::pair<int, double>> top;   ///< up to N (id, logprob), most likely first
};

/// Draws token ids from logits. One sampler per sequence (it carries the random state).
class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o);
  /// Picks an id from logits[n]. Throws wren::Error on bad options (top_p outside (0, 1]).
  int sample(const float* logits, int n);
  /// sample(), also filling `lp` (when non-null) with the drawn token's logprob and the `top_n`
  /// most likely tokens of the same distribution (see TokenLogprobs). Draws the same ids as
  /// sample() for the same seed.
  int sample(const float* logits, int n, TokenLogprobs* lp, int top_n);
  const SamplerOptions& options() const { return o_; }

 private:
  double uniform();  // [0, 1), splitmix64-based: identical on every platform
  SamplerOptions o_;
  uint64_t state_;
  std::vector<int> idx_;
  std::vector<double> p_;
};

}  // namespace wren
