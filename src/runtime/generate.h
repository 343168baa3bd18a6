// Incremental generation: prefill the prompt once, then decode one token at a time reusing the
// sequence state (never recomputing the prefix).
#pragma once
#include <atomic>
#include <functional>
#include <vector>

#include "model/forward.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"

namespace wren {

/// Generation controls.
struct GenerateOptions {
  int max_new_tokens = 16;
  std::vector<int> stop_ids;  ///< generation ends after emitting one of these (e.g. end-of-message)
  SamplerOptions sampling;    ///< default: greedy
  /// Run the last emitted token through the model too, so the state holds the whole exchange
  /// (multi-turn chat continues from it without re-prefilling).
  bool commit_last = false;
  const std::atomic<bool>* cancel = nullptr;  ///< set to stop after the current token
  const float* x0 = nullptr;  ///< host [prompt, D]: rows replacing the prompt's embeddings
  float* prompt_logits = nullptr;  ///< host [prompt, V]: teacher-forced logits, when non-null
  const ForwardHooks* hooks = nullptr;  ///< validation hooks for the prompt pass
  /// >= 0: compute each drawn token's logprob and this many top alternatives (TokenLogprobs,
  /// from the sampled distribution) and pass them to `on_logprobs` just before `on_token`.
  int top_logprobs = -1;
  std::function<void(const TokenLogprobs&)> on_logprobs;
  bool hash_logits = false;  ///< fill GenerateStats::logits_fnv1a64
  /// Non-null (and enabled): an empty state resumes from the longest cached prefix of the prompt;
  /// the prompt is snapshotted at every multiple of the cache's interval, at its end (with its
  /// logits) and at the end of generation. Ignored with x0, prompt_logits or hooks.
  PrefixCache* prefix_cache = nullptr;
  /// Called on each logits row [V] just before a token is drawn from it (after the hash): may set
  /// ids to -inf so they cannot be drawn (constrained decoding, runtime/reply_constraint.h).
  std::function<void(float* logits, int n)> constrain;
  /// True when a decode step needs its logits row on the host: sampling (temperature > 0),
  /// logprobs, a constraint or the logits hash. Otherwise (plain greedy) the draw is the step's
  /// greedy id (BatchEntry::greedy: Backend::argmax_rows, the same id as the host's argmax) and
  /// the logits stay on the device.
  bool needs_logits() const {
    return sampling.temperature > 0.f || (top_logprobs >= 0 && on_logprobs) || constrain || hash_logits;
  }
};

/// Timings of one generation, in seconds.
struct GenerateStats {
  int prompt_tokens = 0, generated_tokens = 0;
  int cached_tokens = 0;  ///< prompt tokens restored from the prefix cache instead of prefilled
  double prefill_s = 0, decode_s = 0, ttft_s = 0;
  bool stopped = false;    ///< ended on a stop id
  bool cancelled = false;  ///< ended by `cancel`
  /// With GenerateOptions::hash_logits: FNV-1a 64 (core/hash.h) over the bytes of every logits
  /// row a token was sampled from, in order (the prompt's last position, then each decode step;
  /// f32 [V] each). Equal hashes = bit-identical logits; 0 when not asked.
  uint64_t logits_fnv1a64 = 0;
};

/// generate()'s prompt pass: runs `prompt` into `state` (through opts.prefix_cache when set:
/// resume, interval and end-of-prompt snapshots) and leaves the last position's logits in
/// `last_logits` [V] (with opts.prompt_logits: all of them there too). Sets st.cached_tokens.
/// Returns the prefix cache in use (null when none applies).
PrefixCache* prefill(TokenStep& fwd, SequenceState& state, const std::vector<int>& prompt, const GenerateOptions& opts,
                     float* last_logits, GenerateStats& st);

/// Prefills `prompt` into `state` (which may already hold a prefix) and decodes up to
/// max_new_tokens, calling `on_token` for each new id. Returns the generated ids.
std::vector<int> generate(TokenStep& fwd, SequenceState& state, const std::vector<int>& prompt,
                          const GenerateOptions& opts, GenerateStats* stats = nullptr,
                          const std::function<void(int)>& on_token = {});

/// generate() with greedy sampling (the default options): kept for the validation paths.
inline std::vector<int> generate_greedy(TokenStep& fwd, SequenceState& state, const std::vector<int>& prompt,
                                        const GenerateOptions& opts, GenerateStats* stats = nullptr,
                                        const std::function<void(int)>& on_token = {}) {
  return generate(fwd, state, prompt, opts, stats, on_token);
}

}  // namespace wren
