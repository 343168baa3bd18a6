// `wren bench routing`: what the router of a checkpoint does on real text, and what that means for
// the expert cache.
//   1. The text is tokenized (specials disabled) and cut into windows like `wren perplexity`
//      ([BOS] + window-1 file tokens, each window from a fresh state), then decoded ONE TOKEN AT A
//      TIME (teacher-forced), the access pattern of decode. Each MoE layer's expert source is
//      wrapped so every request is recorded: with one token per step a request is exactly that
//      token's top-k experts, so the counts are per-token routing decisions.
//   2. Per MoE layer: the count of each expert, max/mean load, coefficient of variation (std/mean),
//      normalized entropy H/ln(E) (1 = uniform), experts never chosen.
//      Next-token reuse: the share of a step's top-k the previous step (same layer, same window)
//      also chose (uniform routing: k/E).
//   3. The recorded trace is replayed through the real expert store (runtime/expert_store.h, the
//      global LRU of `--expert-cache`) at several budgets, and, as the reference measured in the same
//      run, a trace of the same length with uniformly random top-k sets (what random routers give),
//      and the offline bound of a static cache pinned with the B most used experts of this trace.
// Perplexity of the decode is printed too (it must agree with `wren perplexity` up to f32
// summation order: decode and prefill are the same math).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/bench.h"
#include "core/error.h"
#include "core/nll.h"
#include "model/forward.h"
#include "model/load.h"
#include "ops/expert_source.h"
#include "runtime/default_model.h"
#include "runtime/expert_store.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace wren::bench {

namespace {

/// An ExpertSource that records each request (layer, expert ids) and passes it on to `inner`.
class RecordingSource final : public ExpertSource {
 public:
  explicit RecordingSource(ExpertSource& inner) : inner_(inner) {}
  void visit(int layer, const std::vector<int>& experts,
             const std::function<void(int e, const ExpertRef& view)>& fn) override {
    trace.push_back({layer, experts});
    inner_.visit(layer, experts, fn);
  }
  void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) override {
    trace.push_back({layer, experts});
    inner_.visit_batches(layer, experts, fn);
  }
  bool holds(int layer, int e) override { return inner_.holds(layer, e); }
  struct Request {
    int layer;
    std::vector<int> experts;
  };
  std::vector<Request> trace;  ///< every request, in order

 private:
  ExpertSource& inner_;
};

/// Hit rate of the trace replayed through a fresh store holding `slots` experts (buffered reads).
ExpertStoreStats replay(const Model& m, const std::vector<RecordingSource::Request>& trace, int slots) {
  ExpertStoreOptions o;
  o.cache_bytes = uint64_t(slots) * uint64_t(m.config.expert_bytes());
  o.direct = DirectIo::Off;
  ExpertStore store(m.weights, m.config.expert_bytes(), o);
  for (const auto& r : trace) store.visit(r.layer, r.experts, [](int, const ExpertRef&) {});
  return store.stats();
}

struct LayerStats {
  int layer = 0;
  std::vector<long long> counts;
  double max_over_mean = 0, cv = 0, entropy = 0;
  double reuse = 0;  ///< mean share of a step's top-k that the previous step of the window also chose
  int unused = 0;
};

LayerStats layer_stats(int layer, const std::vector<long long>& counts) {
  LayerStats s;
  s.layer = layer;
  s.counts = counts;
  const int E = int(counts.size());
  double total = 0, mx = 0;
  for (long long c : counts) total += double(c), mx = std::max(mx, double(c)), s.unused += c == 0;
  const double mean = total / E;
  double var = 0, h = 0;
  for (long long c : counts) {
    var += (double(c) - mean) * (double(c) - mean);
    if (c > 0) h -= double(c) / total * std::log(double(c) / total);
  }
  s.max_over_mean = mean > 0 ? mx / mean : 0;
  s.cv = mean > 0 ? std::sqrt(var / E) / mean : 0;
  s.entropy = E > 1 ? h / std::log(double(E)) : 0;
  return s;
}

std::vector<int> parse_budgets(const std::string& s, int total, int top_k) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    check(!item.empty(), "--budgets: empty item in '" + s + "'");
    char* end = nullptr;
    const double f = std::strtod(item.c_str(), &end);
    check(end && *end == 0 && std::isfinite(f) && f > 0 && f <= 1,
          "--budgets: '" + item + "' is not a fraction in (0, 1] of all routed experts");
    out.push_back(std::clamp(int(std::lround(f * total)), top_k, total));
  }
  check(!out.empty(), "--budgets: no budget given");
  return out;
}

}  // namespace

void run_routing(const RoutingArgs& a) {
  const std::string dir = a.model.empty() ? default_model_dir() : a.model;
  std::ifstream f(a.text, std::ios::binary);
  check(bool(f), a.text + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto model = load_model(dir, a.plan);
  const Config& c = model->config;
  check(c.n_experts > 0 && c.first_dense < c.n_layers, dir + ": no routed-expert layers, nothing to measure");
  check(c.expert_format == ExpertFormat::MXFP4, dir + ": bench routing needs MXFP4 routed experts (the expert store)");
  const Tokenizer tok = Tokenizer::load(dir);
  std::vector<int> ids = tok.encode(text, SpecialMode::Disabled);
  check(!ids.empty(), a.text + ": no tokens (empty file)");
  if (a.tokens > 0 && ids.size() > size_t(a.tokens)) ids.resize(size_t(a.tokens));
  const int E = c.n_experts, K = c.top_k, V = c.vocab, moe_layers = c.n_layers - c.first_dense;
  const int total = E * moe_layers;
  const std::vector<int> budgets = parse_budgets(a.budgets, total, K);

  CpuBackend be(a.cpu);
  const WeightList wl = weight_list(model->weights);
  MappedExperts mapped(wl);
  RecordingSource rec(mapped);
  be.set_expert_source(&rec);
  Forward fwd(*model, be, {1, -1});
  std::vector<float> logits(static_cast<size_t>(V));
  const int step = a.window - 1;
  double nll = 0;
  long long scored = 0;
  int windows = 0;
  std::vector<size_t> window_steps;  // trace requests per window
  for (size_t start = 0; start < ids.size(); start += size_t(step)) {
    const size_t before = rec.trace.size();
    const size_t n = std::min(size_t(step), ids.size() - start);
    SequenceState st(be, c, int(n) + 2);
    int cur = c.bos_id;
    for (size_t j = 0; j <= n; ++j) {
      fwd.run(st, &cur, nullptr, 1, logits.data(), false);
      if (j == n) break;
      const int next = ids[start + j];
      nll += token_nll(logits.data(), V, next);
      ++scored;
      cur = next;
    }
    window_steps.push_back(rec.trace.size() - before);
    ++windows;
  }
  const long long steps = scored + windows;  // decode steps (each window's last token too)

  // Per-layer load from the trace: one request per (step, MoE layer), K ids each.
  std::vector<std::vector<long long>> counts(size_t(c.n_layers), std::vector<long long>(size_t(E), 0));
  long long requests = 0;
  for (const auto& r : rec.trace) {
    check(int(r.experts.size()) == K, "bench routing: a decode step asked for " + std::to_string(r.experts.size()) +
                                          " experts of layer " + std::to_string(r.layer) + ", expected top-k " +
                                          std::to_string(K));
    for (int e : r.experts) ++counts[size_t(r.layer)][size_t(e)];
    ++requests;
  }
  std::vector<LayerStats> ls;
  for (int l = c.first_dense; l < c.n_layers; ++l) ls.push_back(layer_stats(l, counts[size_t(l)]));
  // Next-token reuse per layer: |S_t ∩ S_t-1| / k over consecutive steps of a window (uniform: k/E).
  {
    std::vector<double> overlap(size_t(c.n_layers), 0);
    std::vector<long long> pairs(size_t(c.n_layers), 0);
    std::vector<const std::vector<int>*> prev(size_t(c.n_layers), nullptr);
    size_t at = 0;
    for (size_t w = 0; w < window_steps.size(); ++w) {
      std::fill(prev.begin(), prev.end(), nullptr);
      for (size_t r = 0; r < window_steps[w]; ++r, ++at) {
        const auto& q = rec.trace[at];
        const std::vector<int>*& p = prev[size_t(q.layer)];
        if (p) {
          int same = 0;
          for (int e : q.experts) same += std::find(p->begin(), p->end(), e) != p->end();
          overlap[size_t(q.layer)] += double(same) / K;
          ++pairs[size_t(q.layer)];
        }
        p = &q.experts;
      }
    }
    for (LayerStats& x : ls) x.reuse = pairs[size_t(x.layer)] ? overlap[size_t(x.layer)] / double(pairs[size_t(x.layer)]) : 0;
  }
  // Offline reference: a static cache pinned with the B most used (layer, expert) pairs of this
  // very trace (the best any fixed set of B experts could do on it, cold misses aside).
  std::vector<long long> all_counts;
  for (int l = c.first_dense; l < c.n_layers; ++l)
    all_counts.insert(all_counts.end(), counts[size_t(l)].begin(), counts[size_t(l)].end());
  std::sort(all_counts.begin(), all_counts.end(), std::greater<>());
  auto static_hit = [&](int slots) {
    long long top = 0, tot = 0;
    for (size_t i = 0; i < all_counts.size(); ++i) tot += all_counts[i], top += i < size_t(slots) ? all_counts[i] : 0;
    return tot ? double(top) / double(tot) : 0.0;
  };

  // The uniform reference: the same number of requests per layer, each K distinct experts drawn
  // uniformly (a fixed-seed xorshift).
  std::vector<RecordingSource::Request> uniform;
  uniform.reserve(rec.trace.size());
  uint64_t s = 0x9E3779B97F4A7C15ull;
  auto next = [&s] {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  };
  for (const auto& r : rec.trace) {
    std::vector<int> pick;
    while (int(pick.size()) < K) {
      const int e = int(next() % uint64_t(E));
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    uniform.push_back({r.layer, pick});
  }
  struct Hit {
    int slots;
    ExpertStoreStats text, uni;
  };
  std::vector<Hit> hits;
  for (int b : budgets) hits.push_back({b, replay(*model, rec.trace, b), replay(*model, uniform, b)});
  const double ppl = std::exp(nll / double(std::max(scored, 1LL)));

  if (a.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerStats& x : ls)
      layers.push_back({{"layer", x.layer}, {"counts", x.counts}, {"max_over_mean", x.max_over_mean}, {"cv", x.cv},
                        {"entropy", x.entropy}, {"unused", x.unused},
                        {"next_token_reuse", x.reuse}});
    nlohmann::json cache = nlohmann::json::array();
    for (const Hit& h : hits)
      cache.push_back({{"slots", h.slots}, {"fraction", double(h.slots) / total}, {"hit_rate", h.text.hit_rate()},
                       {"hits", h.text.hits}, {"misses", h.text.misses}, {"uniform_hit_rate", h.uni.hit_rate()},
                       {"static_top_hit_rate", static_hit(h.slots)}});
    const nlohmann::json j = {{"model", dir},     {"file", a.text},        {"tokens", scored},
                              {"windows", windows}, {"window", a.window},  {"decode_steps", steps},
                              {"perplexity", ppl}, {"num_experts", E},     {"top_k", K},
                              {"moe_layers", moe_layers}, {"requests", requests}, {"layers", layers},
                              {"expert_cache", cache}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("wren bench routing: %s on %s: %lld tokens in %d windows of up to %d, decoded one token at a time "
              "(%lld steps); perplexity %.4f\n",
              dir.c_str(), a.text.c_str(), scored, windows, a.window, steps, ppl);
  std::printf("%d MoE layers x %d routed experts, top-%d; %lld expert requests recorded\n\n", moe_layers, E, K,
              requests);
  std::printf("## Expert load per layer (uniform routing: max/mean -> 1, CV -> 0, entropy -> 1)\n");
  std::printf("| layer | max/mean | CV | entropy H/ln E | unused | next-token reuse (uniform %.3f) | top-4 experts (share of picks) |\n"
              "|---|---|---|---|---|---|---|\n", double(K) / E);
  for (const LayerStats& x : ls) {
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int p, int q) { return x.counts[size_t(p)] > x.counts[size_t(q)]; });
    double tot = 0;
    for (long long v : x.counts) tot += double(v);
    std::string top;
    for (int i = 0; i < std::min(4, E); ++i) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%s%d (%.1f%%)", i ? ", " : "", order[size_t(i)],
                    100.0 * double(x.counts[size_t(order[size_t(i)])]) / std::max(tot, 1.0));
      top += buf;
    }
    std::printf("| %d | %.2f | %.3f | %.3f | %d | %.3f | %s |\n", x.layer, x.max_over_mean, x.cv, x.entropy, x.unused,
                x.reuse, top.c_str());
  }
  std::printf("\n## Expert-cache hit rate vs budget (the store's global LRU, trace replayed; reference: uniform top-%d)\n", K);
  std::printf("(static top-B: the B most used experts of this trace pinned, known in advance: an offline bound for a fixed set)\n");
  std::printf("| budget (experts) | share of all | hit rate, this text | hit rate, uniform routing | static top-B, this text |\n"
              "|---|---|---|---|---|\n");
  for (const Hit& h : hits)
    std::printf("| %d | %.1f%% | %.1f%% | %.1f%% | %.1f%% |\n", h.slots, 100.0 * h.slots / total, 100 * h.text.hit_rate(),
                100 * h.uni.hit_rate(), 100 * static_hit(h.slots));
}

}  // namespace wren::bench
