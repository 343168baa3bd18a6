// Token sampling (see sampler.h).
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace wren {

Sampler::Sampler(const SamplerOptions& o) : o_(o), state_(o.seed ^ 0x2545f4914f6cdd1dull) {
  check(o.top_p > 0.f && o.top_p <= 1.f, "--top-p must be in (0, 1], got " + std::to_string(o.top_p));
  check(o.top_k >= 0, "--top-k must be >= 0");
  check(std::isfinite(o.temperature) && o.temperature >= 0.f, "--temperature must be >= 0");
}

double Sampler::uniform() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return double((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

int Sampler::sample(const float* logits, int n) { return sample(logits, n, nullptr, 0); }

int Sampler::sample(const float* logits, int n, TokenLogprobs* lp, int top_n) {
  if (o_.temperature <= 0.f) {
    const int id = argmax(logits, n);
    if (lp) {  // greedy: log_softmax of the raw logits
      const double mx = logits[id];
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
      const double lse = mx + std::log(sum);
      lp->id = id;
      lp->logprob = double(logits[id]) - lse;
      lp->top.clear();
      const int k = std::min(std::max(top_n, 0), n);
      if (k > 0) {
        idx_.resize(n);
        std::iota(idx_.begin(), idx_.end(), 0);
        auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
        std::partial_sort(idx_.begin(), idx_.begin() + k, idx_.end(), by_logit);
        for (int i = 0; i < k; ++i) lp->top.push_back({idx_[i], double(logits[idx_[i]]) - lse});
      }
    }
    return id;
  }
  idx_.resize(n);
  std::iota(idx_.begin(), idx_.end(), 0);
  const int k = o_.top_k > 0 ? std::min(o_.top_k, n) : n;
  auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx_.begin(), idx_.begin() + k, idx_.end(), by_logit);
  idx_.resize(k);
  p_.resize(k);
  const double mx = logits[idx_[0]];
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += (p_[i] = std::exp((double(logits[idx_[i]]) - mx) / o_.temperature));
  int keep = k;  // nucleus: the smallest prefix whose mass reaches top_p
  if (o_.top_p < 1.f) {
    double acc = 0;
    for (int i = 0; i < k; ++i) {
      acc += p_[i] / sum;
      if (acc >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(p_.begin(), p_.begin() + keep, 0.0);
  }
  double r = uniform() * sum;
  int pick = keep - 1;
  for (int i = 0; i < keep; ++i)
    if ((r -= p_[i]) < 0) {
      pick = i;
      break;
    }
  if (lp) {
    const double log_sum = std::log(sum);
    lp->id = idx_[pick];
    lp->logprob = (double(logits[idx_[pick]]) - mx) / o_.temperature - log_sum;
    lp->top.clear();
    for (int i = 0; i < std::min(std::max(top_n, 0), keep); ++i) lp->top.push_back({idx_[i], (double(logits[idx_[i]]) - mx) / o_.temperature - log_sum});
  }
  return idx_[pick];
}

}  // namespace wren
