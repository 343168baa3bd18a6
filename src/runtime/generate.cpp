// Incremental generation (see generate.h).
#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace wren {

int argmax(const float* logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

std::vector<int> generate_greedy(Forward& fwd, SequenceState& state, const std::vector<int>& prompt,
                                 const GenerateOptions& opts, GenerateStats* stats,
                                 const std::function<void(int)>& on_token) {
  using clock = std::chrono::steady_clock;
  check(!prompt.empty(), "the prompt is empty: at least one token id is needed");
  const int V = fwd.config().vocab;
  std::vector<float> logits(V);
  std::vector<int> out;
  auto t0 = clock::now();
  const int T = int(prompt.size());
  if (opts.prompt_logits) {
    fwd.run(state, prompt.data(), opts.x0, T, opts.prompt_logits, true, opts.hooks);
    std::copy(opts.prompt_logits + size_t(T - 1) * V, opts.prompt_logits + size_t(T) * V, logits.begin());
  } else {
    fwd.run(state, prompt.data(), opts.x0, T, logits.data(), false, opts.hooks);
  }
  auto t1 = clock::now();
  for (int n = 0; n < opts.max_new_tokens; ++n) {
    const int id = argmax(logits.data(), V);
    out.push_back(id);
    if (on_token) on_token(id);
    const bool stop = std::find(opts.stop_ids.begin(), opts.stop_ids.end(), id) != opts.stop_ids.end();
    if (stop || n + 1 == opts.max_new_tokens) break;
    fwd.run(state, &id, nullptr, 1, logits.data(), false);
  }
  auto t2 = clock::now();
  if (stats) {
    stats->prompt_tokens = int(prompt.size());
    stats->generated_tokens = int(out.size());
    stats->prefill_s = std::chrono::duration<double>(t1 - t0).count();
    stats->decode_s = std::chrono::duration<double>(t2 - t1).count();
  }
  return out;
}

}  // namespace wren
