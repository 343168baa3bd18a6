// `wren bench experts`: the expert store against a plain sequential read of the same shards, in one
// run, then decode speed, hit rate and memory at three cache budgets. Cold numbers use O_DIRECT
// (or drop the files from the page cache with posix_fadvise where O_DIRECT is unavailable).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "bench/bench.h"
#include "bench/sequential_read.h"
#include "core/error.h"
#include "core/sizes.h"
#include "model/forward.h"
#include "runtime/expert_store.h"
#include "runtime/generate.h"

namespace wren::bench {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Current resident set size (VmRSS) in bytes.
uint64_t rss_now() {
  std::ifstream f("/proc/self/status");
  std::string k;
  while (f >> k) {
    uint64_t kb;
    if (k == "VmRSS:" && f >> kb) return kb * 1024;
  }
  return 0;
}

void drop_cache(const std::set<std::string>& files) {
  for (const std::string& p : files) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

/// Every expert of every MoE layer through a cold store, as decode does (one layer's misses at a
/// time, 16 at once) with a no-op compute. GB/s over wall time.
double store_read(const Model& m, const ExpertStoreOptions& o, uint64_t* bytes) {
  const Config& c = m.config;
  ExpertStore store(m.weights, c.expert_bytes(), o);
  const double t0 = now_s();
  for (int l = c.first_dense; l < c.n_layers; ++l)
    for (int e0 = 0; e0 < c.n_experts; e0 += c.top_k) {
      std::vector<int> ids;
      for (int e = e0; e < std::min(c.n_experts, e0 + c.top_k); ++e) ids.push_back(e);
      store.visit(l, ids, [](int, const ExpertRef&) {});
    }
  const double dt = now_s() - t0;
  *bytes = store.stats().bytes_read;
  return *bytes / dt / 1e9;
}

void bench_experts(const ExpertsArgs& a) {
  auto model = load_model(a.model);
  const Config& c = model->config;
  check(c.expert_format == ExpertFormat::MXFP4, a.model + ": bench experts needs MXFP4 routed experts");
  std::set<std::string> files;
  for (const LayerWeights& l : model->weights.layers)
    for (const ExpertRef& e : l.moe.experts) files.insert(e.file);
  const uint64_t n_exp = uint64_t(c.n_experts) * (c.n_layers - c.first_dense);
  const uint64_t all_bytes = n_exp * c.expert_bytes();
  std::printf("model: %s\nexperts: %llu x %.2f MB = %.2f GB in %zu shards; top-%d of %d per layer\n",
              a.model.c_str(), (unsigned long long)n_exp, c.expert_bytes() / 1e6, all_bytes / 1e9,
              files.size(), c.top_k, c.n_experts);

  ExpertStoreOptions probe;
  probe.cache_bytes = uint64_t(c.expert_bytes()) * 2 * c.top_k;
  probe.direct = parse_direct_io(a.direct);
  const bool direct = ExpertStore(model->weights, c.expert_bytes(), probe).direct();
  const char* cold = direct ? "cold (O_DIRECT)" : "cold (page cache dropped with posix_fadvise)";

  std::printf("\n## Read throughput, %s; min / median of %d runs\n", cold, a.runs);
  uint64_t seq_bytes = 0, st_bytes = 0;
  std::vector<double> seq, st, ratio;
  for (int r = 0; r < a.runs; ++r) {  // each run: one plain read, then the store, both cold
    drop_cache(files);
    seq.push_back(sequential_read(files, direct, probe.loader_threads, &seq_bytes));
    drop_cache(files);
    st.push_back(store_read(*model, probe, &st_bytes));
    ratio.push_back(st.back() / seq.back());
  }
  const Spread q = spread(seq), s = spread(st), rs = spread(ratio);
  std::printf("| reader | bytes | GB/s min | GB/s median |\n|---|---|---|---|\n");
  std::printf("| plain sequential read of the shards (8 MB reads, %d in flight) | %.2f GB | %.2f | %.2f |\n",
              probe.loader_threads, seq_bytes / 1e9, q.min, q.median);
  std::printf("| expert store (one read per expert, %d loaders, 16 at a time) | %.2f GB | %.2f | %.2f |\n",
              probe.loader_threads, st_bytes / 1e9, s.min, s.median);
  std::printf("ratio store / sequential (per run): min %.2fx, median %.2fx (%d runs; target >= 0.8x)\n", rs.min,
              rs.median, a.runs);

  std::printf("\n## Decode at three budgets (%d prompt tokens, %d generated; cache starts %s; min / median of %d runs)\n",
              8, a.tokens, cold, a.runs);
  std::printf("| budget | experts held | hit rate | read GB | I/O wait s | expert compute s | decode tok/s min | decode tok/s median | RSS MB | RSS / (base + budget) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const uint64_t base_rss = rss_now();
  CpuBackend be;
  std::vector<int> prompt;
  for (int i = 0; i < 8; ++i) prompt.push_back((131 * i + 7) % c.vocab);
  for (double frac : {0.1, 0.5, 1.0}) {
    ExpertStoreOptions o = probe;
    o.cache_bytes = std::max<uint64_t>(c.expert_bytes(), uint64_t(frac * all_bytes));
    std::vector<double> tps;
    ExpertStoreStats x;
    int slots = 0;
    for (int r = 0; r < a.runs; ++r) {
      drop_cache(files);
      auto store = std::make_unique<ExpertStore>(model->weights, c.expert_bytes(), o);
      be.set_expert_source(store.get());
      Forward fwd(*model, be, {32, -1});
      SequenceState state(be, c, 64 + a.tokens);
      GenerateOptions g;
      g.max_new_tokens = a.tokens;
      GenerateStats gs;
      generate_greedy(fwd, state, prompt, g, &gs);
      tps.push_back((gs.generated_tokens - 1) / std::max(gs.decode_s, 1e-9));
      x = store->stats(), slots = store->slots();
      be.set_expert_source(nullptr);
    }
    const Spread t = spread(tps);
    const uint64_t rss = rss_now();
    std::printf("| %.0f%% (%.2f GB) | %d | %.1f%% | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.2f |\n", frac * 100,
                o.cache_bytes / 1e9, slots, 100 * x.hit_rate(), x.bytes_read / 1e9, x.wait_s, x.compute_s, t.min,
                t.median, rss / 1e6, double(rss) / double(base_rss + uint64_t(slots) * c.expert_bytes()));
  }
  std::printf("\nbase RSS after loading the dense weights: %.0f MB; peak RSS %.0f MB\n", base_rss / 1e6,
              peak_rss_bytes() / 1e6);
}

}  // namespace


void run_experts(const ExpertsArgs& a) { bench_experts(a); }

}  // namespace wren::bench
