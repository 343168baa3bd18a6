// Backend validation (see validate.h).
#include "runtime/validate.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace wren {

namespace {

/// One before_layer call of the reference: where it was and its inputs (host copies).
struct LayerInputs {
  int layer, t0, T, n_blocks;
  std::vector<float> P;       ///< [T, D]
  std::vector<float> blocks;  ///< [n_blocks, T, D]
};

int argmax(const float* x, size_t n) { return int(std::max_element(x, x + n) - x); }

/// Greedy continuation of `ids`; margins (top-1 minus top-2) when asked.
std::vector<int> greedy(TokenStep& f, const std::vector<int>& ids, int ctx, int n, std::vector<float>* margins) {
  const size_t V = f.config().vocab;
  SequenceState st(f.backend(), f.config(), ctx);
  std::vector<float> logits(V);
  f.run(st, ids.data(), nullptr, int(ids.size()), logits.data(), false);
  std::vector<int> out;
  for (int s = 0; s < n; ++s) {
    const int top = argmax(logits.data(), V);
    if (margins) {
      float second = -INFINITY;
      for (size_t v = 0; v < V; ++v)
        if (int(v) != top) second = std::max(second, logits[v]);
      margins->push_back(logits[top] - second);
    }
    out.push_back(top);
    if (s + 1 < n) f.run(st, &top, nullptr, 1, logits.data(), false);
  }
  return out;
}

}  // namespace

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

PromptCheck validate_prompt(TokenStep& ref, TokenStep& cand, const std::vector<int>& ids, int ctx, int n_greedy,
                            float near_tie) {
  const Config& c = ref.config();
  check(cand.config().hidden == c.hidden && cand.config().vocab == c.vocab && cand.layers_run() == ref.layers_run(),
        "validate: the reference and candidate forwards run different models");
  check(!ids.empty(), "validate: empty prompt");
  const int T = int(ids.size()), L = ref.layers_run();
  const size_t D = c.hidden, V = c.vocab;
  PromptCheck r;
  r.tokens = T;

  // 1. Reference, teacher-forced: logits at every position, P after every layer, layer inputs.
  std::vector<float> trace_ref(size_t(T) * L * D), logits_ref(size_t(T) * V);
  std::vector<LayerInputs> rec;
  {
    ForwardHooks h;
    h.trace = trace_ref.data();
    h.before_layer = [&](int layer, int t0, int n, const LayerIo& io) {
      LayerInputs in{layer, t0, n, io.n_blocks, std::vector<float>(size_t(n) * D),
                     std::vector<float>(size_t(io.n_blocks) * n * D)};
      io.backend.to_host(io.P, size_t(n) * D, in.P.data());
      for (int b = 0; b < io.n_blocks; ++b) io.backend.to_host(io.blocks[b], size_t(n) * D, in.blocks.data() + size_t(b) * n * D);
      rec.push_back(std::move(in));
    };
    SequenceState st(ref.backend(), c, ctx);
    ref.run(st, ids.data(), nullptr, T, logits_ref.data(), true, &h);
  }

  // 2. Candidate with the reference's inputs injected before every layer.
  std::vector<float> trace_cand(size_t(T) * L * D);
  {
    ForwardHooks h;
    h.trace = trace_cand.data();
    size_t k = 0;
    h.before_layer = [&](int layer, int t0, int n, const LayerIo& io) {
      check(k < rec.size() && rec[k].layer == layer && rec[k].t0 == t0 && rec[k].T == n && rec[k].n_blocks == io.n_blocks,
            "validate: the candidate's layer calls do not line up with the reference's (same --chunk needed)");
      const LayerInputs& in = rec[k++];
      io.backend.from_host(in.P.data(), size_t(n) * D, io.P);
      for (int b = 0; b < io.n_blocks; ++b) io.backend.from_host(in.blocks.data() + size_t(b) * n * D, size_t(n) * D, io.blocks[b]);
    };
    SequenceState st(cand.backend(), cand.config(), ctx);
    cand.run(st, ids.data(), nullptr, T, nullptr, false, &h);
  }
  r.layers.resize(L);
  for (int i = 0; i < L; ++i) {
    std::vector<float> a(size_t(T) * D), b(size_t(T) * D), before(size_t(T) * D, 0.f);
    for (const LayerInputs& in : rec)  // P entering the layer's own contribution (zero after a snapshot)
      if (in.layer == i && !c.layers[i].snapshot)
        std::copy(in.P.begin(), in.P.end(), before.begin() + size_t(in.t0) * D);
    LayerCheck& lc = r.layers[i];
    for (int t = 0; t < T; ++t) {
      const float* pc = trace_cand.data() + (size_t(t) * L + i) * D;
      const float* pr = trace_ref.data() + (size_t(t) * L + i) * D;
      std::copy(pc, pc + D, a.begin() + size_t(t) * D);
      std::copy(pr, pr + D, b.begin() + size_t(t) * D);
      lc.worst_row = std::max(lc.worst_row, rel_l2(pc, pr, D));
    }
    lc.trace_rel_l2 = rel_l2(a.data(), b.data(), a.size());
    for (size_t j = 0; j < a.size(); ++j) a[j] -= before[j], b[j] -= before[j];
    lc.output_rel_l2 = rel_l2(a.data(), b.data(), a.size());
  }

  // 3. Candidate free-running, teacher-forced: logits and argmax at every position.
  {
    std::vector<float> logits(size_t(T) * V);
    SequenceState st(cand.backend(), cand.config(), ctx);
    cand.run(st, ids.data(), nullptr, T, logits.data(), true);
    r.logits_rel_l2 = rel_l2(logits.data(), logits_ref.data(), logits.size());
    for (int t = 0; t < T; ++t)
      r.argmax_equal += argmax(logits.data() + size_t(t) * V, V) == argmax(logits_ref.data() + size_t(t) * V, V);
  }

  // 4. Greedy continuations, each on its own state, compared up to the reference's first near-tie.
  if (n_greedy > 0) {
    r.greedy_ref = greedy(ref, ids, ctx, n_greedy, &r.margins);
    r.greedy_cand = greedy(cand, ids, ctx, n_greedy, nullptr);
    while (r.greedy_equal < n_greedy && r.greedy_ref[r.greedy_equal] == r.greedy_cand[r.greedy_equal]) ++r.greedy_equal;
    for (int s = 0; s < n_greedy; ++s)
      if (r.margins[s] < near_tie) {
        r.first_near_tie = s;
        break;
      }
  }
  return r;
}

}  // namespace wren
