// Incremental generation (see generate.h).
#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/hash.h"

namespace wren {

PrefixCache* prefill(TokenStep& fwd, SequenceState& state, const std::vector<int>& prompt, const GenerateOptions& opts,
                     float* last_logits, GenerateStats& st) {
  const int V = fwd.config().vocab, T = int(prompt.size());
  std::vector<float> restored;
  PrefixCache* cache = opts.prefix_cache && opts.prefix_cache->enabled() && !opts.x0 && !opts.prompt_logits &&
                               !opts.hooks
                           ? opts.prefix_cache
                           : nullptr;
  if (opts.prompt_logits) {
    fwd.run(state, prompt.data(), opts.x0, T, opts.prompt_logits, true, opts.hooks);
    std::copy(opts.prompt_logits + size_t(T - 1) * V, opts.prompt_logits + size_t(T) * V, last_logits);
  } else if (cache) {
    if (state.position() == 0) st.cached_tokens = cache->restore(state, prompt, &restored);
    if (!restored.empty()) std::copy(restored.begin(), restored.end(), last_logits);
    // The rest of the prompt in pieces that end on the snapshot interval (the result does not
    // depend on how a prompt is cut: tests GoldenChunks, PrefixCache*).
    const int I = cache->interval();
    for (int i = st.cached_tokens; i < T;) {
      const int pos = state.position(), n = std::min(T - i, (pos / I + 1) * I - pos);
      const bool last = i + n == T;
      fwd.run(state, prompt.data() + i, nullptr, n, last ? last_logits : nullptr, false);
      i += n;
      if (!last) cache->store(state);
    }
    cache->store(state, last_logits, V);  // the end of the prompt, with its logits
  } else {
    fwd.run(state, prompt.data(), opts.x0, T, last_logits, false, opts.hooks);
  }
  return cache;
}

std::vector<int> generate(TokenStep& fwd, SequenceState& state, const std::vector<int>& prompt,
                          const GenerateOptions& opts, GenerateStats* stats,
                          const std::function<void(int)>& on_token) {
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  check(!prompt.empty(), "the prompt is empty: at least one token id is needed");
  const int V = fwd.config().vocab, T = int(prompt.size());
  check(state.position() + T + opts.max_new_tokens <= state.capacity(),
        "context limit: " + std::to_string(state.position()) + " tokens held + " + std::to_string(T) +
            " prompt + " + std::to_string(opts.max_new_tokens) + " to generate exceed the context of " +
            std::to_string(state.capacity()) + " tokens (raise --ctx)");
  Sampler sampler(opts.sampling);
  std::vector<float> logits(V);
  std::vector<int> out;
  GenerateStats st;
  st.prompt_tokens = T;
  const auto t0 = clock::now();
  PrefixCache* cache = prefill(fwd, state, prompt, opts, logits.data(), st);
  const auto t1 = clock::now();
  uint64_t hash = kFnv1a64Offset;
  // Plain greedy: each decode step hands back its greedy id instead of its logits (the prompt's
  // last logits are on the host: the first token is drawn from them), through decode_greedy, which
  // may record a step while the one before it runs.
  const bool greedy_ids = !opts.needs_logits();
  bool host_logits = true;  // `logits` holds the row the last token was drawn from
  // Takes token n (out.size()); returns whether a step consuming it follows.
  auto take = [&](int id) {
    if (out.empty()) st.ttft_s = secs(clock::now() - t0);
    out.push_back(id);
    if (on_token) on_token(id);
    st.stopped = std::find(opts.stop_ids.begin(), opts.stop_ids.end(), id) != opts.stop_ids.end();
    st.cancelled = opts.cancel && opts.cancel->load();
    const bool last = st.stopped || st.cancelled || int(out.size()) == opts.max_new_tokens;
    return !last || opts.commit_last;
  };
  for (int n = 0; n < opts.max_new_tokens; ++n) {
    if (opts.hash_logits) hash = fnv1a64(logits.data(), logits.size() * sizeof(float), hash);
    if (opts.constrain) opts.constrain(logits.data(), V);
    TokenLogprobs lp;
    const bool want_lp = opts.top_logprobs >= 0 && opts.on_logprobs;
    const int id = sampler.sample(logits.data(), V, want_lp ? &lp : nullptr, opts.top_logprobs);
    if (want_lp) opts.on_logprobs(lp);
    const bool more = take(id);
    const bool last = st.stopped || st.cancelled || n + 1 == opts.max_new_tokens;
    if (!more) break;
    if (greedy_ids) {  // the rest of the tokens (and a committed last one) from the device's arg-max
      host_logits = false;
      bool committed = last;  // the step consuming the last token ran: its id is not taken
      // A step for each token left, and one consuming the last when it is committed.
      const int steps = opts.max_new_tokens - 1 - n + (opts.commit_last ? 1 : 0);
      fwd.decode_greedy(state, id, steps, [&](int next) {
        if (committed) return false;
        const bool go = take(next);
        committed = go && (st.stopped || st.cancelled || int(out.size()) == opts.max_new_tokens);
        return go;
      });
      break;
    }
    fwd.run(state, &id, nullptr, 1, logits.data(), false);
    if (last) break;
  }
  // The end of the exchange (next turns); masked logits (constrain) are not the model's, and a
  // greedy-id step left none on the host: then the snapshot keeps none.
  if (cache && !out.empty()) cache->store(state, opts.constrain || !host_logits ? nullptr : logits.data(), V);
  st.generated_tokens = int(out.size());
  if (opts.hash_logits) st.logits_fnv1a64 = hash;
  st.prefill_s = secs(t1 - t0);
  st.decode_s = secs(clock::now() - t1);
  if (stats) *stats = st;
  return out;
}

}  // namespace wren
