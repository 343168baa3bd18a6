// `wren bench stream`: experts streamed from disk at K3 expert size (issue 17). Writes (or reuses) a
// synthetic checkpoint with K3's routed-expert shape, measures the raw sequential read of the same
// shards in the same run (cold: O_DIRECT, or the page cache dropped with posix_fadvise), then
// prefill and decode on the CPU backend at several expert-cache budgets with prediction off and
// on: tok/s, hit rate, recall, GB read per token and achieved GB/s against the raw read, min and
// median over several runs. Every run's logits are hashed: they must agree at every budget.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#include "bench/bench.h"
#include "bench/sequential_read.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/sizes.h"
#include "model/forward.h"
#include "runtime/backend_factory.h"
#include "runtime/expert_store.h"
#include "synth/synth.h"
#ifdef WREN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace wren::bench {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(const std::vector<double>& v) { return spread(v).median; }
double minimum(const std::vector<double>& v) { return spread(v).min; }

/// The prediction modes of --predict (off, on, both).
std::vector<bool> predict_modes(const std::string& p) {
  if (p == "off") return {false};
  if (p == "on") return {true};
  return {false, true};
}

/// The bench checkpoint's config: K3's routed-expert shape (latent 3584, width 3072: 17.55 MB per
/// MXFP4 expert, top-16) with small dense parts (hidden 512), `moe_layers` MoE layers after one
/// dense layer, KDA and MLA alternating (MLA last).
nlohmann::json stream_config(int moe_layers, int experts) {
  std::vector<int> kda, mla;
  const int L = moe_layers + 1;
  for (int i = 1; i <= L; ++i) (i % 2 == 0 || i == L ? mla : kda).push_back(i);
  nlohmann::json text = {
      {"hidden_size", 512}, {"num_hidden_layers", L}, {"vocab_size", 4352}, {"first_k_dense_replace", 1},
      {"intermediate_size", 1024}, {"num_attention_heads", 4}, {"q_lora_rank", 128}, {"kv_lora_rank", 64},
      {"qk_nope_head_dim", 32}, {"qk_rope_head_dim", 16}, {"v_head_dim", 32}, {"num_experts", experts},
      {"num_experts_per_token", 16}, {"moe_intermediate_size", 3072}, {"routed_expert_hidden_size", 3584},
      {"num_shared_experts", 1}, {"attn_res_block_size", 2}, {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0}, {"rms_norm_eps", 1e-05}, {"hidden_act", "situ"},
      {"latent_moe_use_norm", true}, {"moe_router_activation_func", "sigmoid"}, {"moe_renormalize", true},
      {"routed_scaling_factor", 1.0}, {"use_grouped_topk", true}, {"num_expert_group", 1}, {"topk_group", 1},
      {"topk_method", "noaux_tc"}, {"moe_layer_freq", 1}, {"mla_use_nope", true}, {"mla_use_output_gate", true},
      {"num_nextn_predict_layers", 0},
      {"linear_attn_config", {{"num_heads", 4}, {"head_dim", 64}, {"short_conv_kernel_size", 4},
                              {"gate_lower_bound", -5.0}, {"use_full_rank_gate", true}, {"kda_layers", kda},
                              {"full_attn_layers", mla}}}};
  return {{"model_type", "kimi_k3"},
          {"bos_token_id", 4096},
          {"eos_token_id", 4098},
          {"tie_word_embeddings", false},
          {"text_config", text},
          {"quantization_config",
           {{"quant_method", "compressed-tensors"},
            {"format", "mxfp4-pack-quantized"},
            {"config_groups",
             {{"group_0",
               {{"format", "mxfp4-pack-quantized"},
                {"targets", {"Linear"}},
                {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 32}}},
                {"input_activations", nullptr}}}}},
            {"ignore", {"re:.*(?<!experts\\.\\d+\\.w[123])$"}}}}};
}

void drop_cache(const std::set<std::string>& files) {
  for (const std::string& p : files) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

/// Forwards to the store and records the (layer, expert) pairs visited: the touched set.
class TouchCounter final : public ExpertSource {
 public:
  explicit TouchCounter(ExpertSource& s) : s_(s) {}
  void visit(int layer, const std::vector<int>& experts,
             const std::function<void(int, const ExpertRef&)>& fn) override {
    note(layer, experts);
    s_.visit(layer, experts, fn);
  }
  void visit_batches(int layer, const std::vector<int>& experts, const BatchFn& fn) override {
    note(layer, experts);
    s_.visit_batches(layer, experts, fn);
  }
  void prefetch(int layer, const int* experts, int n) override { s_.prefetch(layer, experts, n); }
  bool holds(int layer, int e) override { return s_.holds(layer, e); }
  std::set<int64_t> touched;

 private:
  void note(int layer, const std::vector<int>& experts) {
    for (int e : experts) touched.insert((int64_t(layer) << 32) | e);
  }
  ExpertSource& s_;
};

/// Every expert through a cold store with a no-op compute, 16 at a time as decode asks for them;
/// with `ahead`, the next 16 are prefetched before each visit (reads of two groups in flight).
/// GB/s over wall time.
double store_read(const Model& m, ExpertStoreOptions o, bool ahead) {
  const Config& c = m.config;
  o.cache_bytes = uint64_t(c.expert_bytes()) * 4 * c.top_k;
  ExpertStore store(m.weights, c.expert_bytes(), o);
  std::vector<std::pair<int, std::vector<int>>> groups;
  for (int l = c.first_dense; l < c.n_layers; ++l)
    for (int e0 = 0; e0 < c.n_experts; e0 += c.top_k) {
      std::vector<int> ids;
      for (int e = e0; e < std::min(c.n_experts, e0 + c.top_k); ++e) ids.push_back(e);
      groups.push_back({l, ids});
    }
  const double t0 = now_s();
  for (size_t g = 0; g < groups.size(); ++g) {
    if (ahead && g + 1 < groups.size())
      store.prefetch(groups[g + 1].first, groups[g + 1].second.data(), int(groups[g + 1].second.size()));
    store.visit(groups[g].first, groups[g].second, [](int, const ExpertRef&) {});
  }
  return store.stats().bytes_read / (now_s() - t0) / 1e9;
}

struct RunResult {
  double prefill_s = 0, decode_s = 0;
  uint64_t prefill_read = 0, prefill_touched = 0, decode_read = 0;
  double prefill_hit = 0, decode_hit = 0, recall = 0, decode_wait_s = 0;
  uint64_t hash = 0;
  // CUDA (VRAM tier): decode host -> device bytes (demand + prefetch), prefetch counters.
  uint64_t decode_h2d = 0, prefetch_issued = 0, prefetch_used = 0, slots = 0;
  uint64_t disk_guesses = 0;  ///< decode: guessed experts the host store read from disk (its prefetch reads)
  uint64_t not_held = 0;      ///< CUDA decode: guesses with room in VRAM left out (only on disk)
};

/// --budgets: comma-separated fractions of all expert bytes, each in (0, 1] (1 = every expert
/// fits). Throws UsageError naming the bad item.
std::vector<double> parse_budgets(const std::string& list) {
  std::vector<double> out;
  std::istringstream bs(list);
  for (std::string item; std::getline(bs, item, ',');) {
    char* end = nullptr;
    const double f = std::strtod(item.c_str(), &end);
    usage_check(!item.empty() && *end == '\0' && f > 0 && f <= 1,
                "--budgets: '" + item + "' is not a fraction of the expert bytes in (0, 1] (e.g. 0.1,0.3,1)");
    out.push_back(f);
  }
  usage_check(!out.empty(), "--budgets: give at least one fraction (e.g. 0.1,0.3,1)");
  return out;
}

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

/// The timed part of one bench run on `be`: prefills the bench prompt (a.prompt ids), then decodes
/// a.tokens greedy tokens, into r.prefill_s / r.decode_s (seconds) and r.hash (every logits row,
/// fnv1a64); `between` runs after the prefill, outside both timings (stats snapshots and resets).
void time_prompt(const Model& m, Backend& be, const StreamArgs& a, bool predict, RunResult& r,
                 const std::function<void()>& between) {
  const Config& c = m.config;
  ForwardOptions fo;
  fo.max_chunk = a.chunk;
  fo.predict = predict;
  Forward fwd(m, be, fo);
  SequenceState st(be, c, a.prompt + a.tokens + 1);
  std::vector<int> prompt;
  for (int i = 0; i < a.prompt; ++i) prompt.push_back((131 * i + 7) % c.vocab);
  std::vector<float> logits(c.vocab);
  double t0 = now_s();
  fwd.run(st, prompt.data(), nullptr, a.prompt, logits.data(), false);
  r.prefill_s = now_s() - t0;
  r.hash = fnv1a64(logits.data(), logits.size() * 4);
  between();
  t0 = now_s();
  for (int k = 0; k < a.tokens; ++k) {
    const int id = argmax(logits);
    fwd.run(st, &id, nullptr, 1, logits.data(), false);
    r.hash = fnv1a64(logits.data(), logits.size() * 4, r.hash);
  }
  r.decode_s = now_s() - t0;
}

RunResult one_run(const Model& m, const CpuOptions& cpu, const ExpertStoreOptions& so, const std::set<std::string>& files,
                  const StreamArgs& a, bool predict) {
  const Config& c = m.config;
  drop_cache(files);
  ExpertStore store(m.weights, c.expert_bytes(), so);
  TouchCounter touch(store);
  CpuBackend be(cpu, &touch);
  RunResult r;
  time_prompt(m, be, a, predict, r, [&] {
    const ExpertStoreStats& p = store.stats();
    r.prefill_read = p.bytes_read;
    r.prefill_touched = touch.touched.size() * uint64_t(c.expert_bytes());
    r.prefill_hit = p.hit_rate();
    store.reset_stats();
  });
  const ExpertStoreStats& d = store.stats();
  r.decode_read = d.bytes_read;
  r.decode_hit = d.hit_rate();
  r.recall = d.recall();
  r.decode_wait_s = d.wait_s;
  return r;
}

#ifdef WREN_HAVE_CUDA
/// As one_run on the CUDA backend (exact precision): `vram` bytes of expert slots (kAllExperts =
/// every expert resident, no store), the store of `so` between them and the disk.
RunResult one_cuda_run(const Model& m, const ExpertStoreOptions& so, const std::set<std::string>& files,
                       const StreamArgs& a, bool predict, uint64_t vram) {
  const Config& c = m.config;
  drop_cache(files);
  CudaBackend be(0, CudaOptions{});
  be.set_vram_expert_budget(vram);
  be.upload(weight_list(m.weights));
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<TouchCounter> touch;
  if (be.streams_experts()) {
    store = std::make_unique<ExpertStore>(m.weights, c.expert_bytes(), so);
    touch = std::make_unique<TouchCounter>(*store);
    be.set_expert_source(touch.get());
  }
  RunResult r;
  r.slots = be.stats().expert_slots;
  CudaStats p;
  time_prompt(m, be, a, predict, r, [&] {
    p = be.stats();
    if (store) {
      r.prefill_read = store->stats().bytes_read;
      r.prefill_touched = touch->touched.size() * uint64_t(c.expert_bytes());
      store->reset_stats();
    }
    r.prefill_hit = p.tier_hits + p.tier_misses ? double(p.tier_hits) / double(p.tier_hits + p.tier_misses) : 1.0;
  });
  const CudaStats d = be.stats();
  const uint64_t hits = d.tier_hits - p.tier_hits, misses = d.tier_misses - p.tier_misses;
  r.decode_hit = hits + misses ? double(hits) / double(hits + misses) : 1.0;
  const uint64_t needed = d.tier_guess_needed - p.tier_guess_needed, hit = d.tier_guess_hit - p.tier_guess_hit;
  r.recall = needed ? double(hit) / double(needed) : 0;
  r.decode_h2d = (d.tier_bytes - p.tier_bytes) + (d.tier_prefetch_bytes - p.tier_prefetch_bytes);
  r.prefetch_issued = d.tier_prefetch_issued - p.tier_prefetch_issued;
  r.not_held = d.tier_guess_not_held - p.tier_guess_not_held;
  r.prefetch_used = d.tier_prefetch_used - p.tier_prefetch_used;
  if (store) {
    r.decode_read = store->stats().bytes_read;
    r.decode_wait_s = store->stats().wait_s;
    r.disk_guesses = store->stats().prefetch_issued;
  }
  return r;
}

/// The CUDA half of run_stream: VRAM budgets (fractions of all expert bytes; 1 = all resident)
/// with prediction off and on, against the raw read `raw_med` and the host-to-device bandwidth
/// measured now.
void cuda_budgets(const Model& m, ExpertStoreOptions so, const std::set<std::string>& files, const StreamArgs& a,
                  double raw_med, uint64_t all_bytes) {
  const Config& c = m.config;
  double h2d = 0;
  {
    CudaBackend probe(0, CudaOptions{});
    h2d = probe.h2d_gbps(size_t(256) << 20);
  }
  so.cache_bytes = std::max<uint64_t>(c.expert_bytes(), uint64_t(a.host_cache * double(all_bytes)));
  std::printf("\n## CUDA: VRAM expert tier (exact precision), host cache %.2f GB (%.0f%%) between it and the disk\n"
              "host -> device copy from pinned memory, measured now: %.2f GB/s\n",
              so.cache_bytes / 1e9, a.host_cache * 100, h2d);
  std::printf("| VRAM budget | slots | predict | prefill tok/s | prefill disk GB / touched | decode s/token | "
              "VRAM hit rate | recall | prefetch used / copied | guesses read from disk / left on disk | disk GB/token | H2D GB/token | "
              "disk GB/s (x raw) | H2D GB/s (x measured) | floor s/token | time / floor |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::set<uint64_t> hashes;
  for (const double frac : parse_budgets(a.budgets)) {
    const uint64_t vram = frac >= 1 ? CudaBackend::kAllExperts : uint64_t(frac * double(all_bytes));
    for (bool predict : predict_modes(a.predict)) {
      std::vector<double> pf, sd, disk, h2dt, dach, hach, ratio;
      RunResult last;
      for (int r = 0; r < a.runs; ++r) {
        last = one_cuda_run(m, so, files, a, predict, vram);
        hashes.insert(last.hash);
        pf.push_back(a.prompt / last.prefill_s);
        sd.push_back(last.decode_s / a.tokens);
        disk.push_back(last.decode_read / 1e9 / a.tokens);
        h2dt.push_back(last.decode_h2d / 1e9 / a.tokens);
        dach.push_back(last.decode_read / 1e9 / last.decode_s);
        hach.push_back(last.decode_h2d / 1e9 / last.decode_s);
        // This run's floor: every disk byte at the raw read speed and every copied byte at the
        // measured host-to-device speed, whichever is longer (they can overlap).
        const double fl = std::max(disk.back() / raw_med, h2dt.back() / h2d);
        if (fl > 0) ratio.push_back(sd.back() / fl);
      }
      const double floor = std::max(median(disk) / raw_med, median(h2dt) / h2d);
      char recall[32] = "-", rt[48] = "-";
      if (predict && last.slots) std::snprintf(recall, sizeof recall, "%.1f%%", 100 * last.recall);
      if (!ratio.empty()) std::snprintf(rt, sizeof rt, "%.2fx / %.2fx", minimum(ratio), median(ratio));
      std::printf("| %.0f%% (%.2f GB) | %llu | %s | %.2f / %.2f | %.2f / %.2f | %.4f / %.4f | %.1f%% | %s | %llu / %llu | %llu / %llu | "
                  "%.3f | %.3f | %.3f (%.2fx) | %.2f (%.2fx) | %.4f | %s |\n",
                  frac * 100, frac >= 1 ? all_bytes / 1e9 : vram / 1e9, (unsigned long long)last.slots,
                  predict ? "on" : "off", minimum(pf), median(pf), last.prefill_read / 1e9, last.prefill_touched / 1e9,
                  minimum(sd), median(sd), 100 * last.decode_hit,
                  recall,
                  (unsigned long long)last.prefetch_used, (unsigned long long)last.prefetch_issued,
                  (unsigned long long)last.disk_guesses, (unsigned long long)last.not_held, median(disk),
                  median(h2dt), median(dach), median(dach) / raw_med, median(hach), median(hach) / h2d, floor,
                  rt);
      std::fflush(stdout);
    }
  }
  std::printf("\nCUDA logits identical at every VRAM budget, prediction on and off: %s (%zu distinct hashes)\n",
              hashes.size() == 1 ? "yes" : "NO", hashes.size());
  check(hashes.size() == 1, "bench stream --backend cuda: the logits differ between budgets or prediction modes");
}
#endif

}  // namespace

void run_stream(const StreamArgs& a) {
  check(a.moe_layers >= 1 && a.experts >= 16, "bench stream: --moe-layers >= 1 and --experts >= 16");
  parse_budgets(a.budgets);  // usage errors before any work
  if (a.backend == "cuda") {  // before the checkpoint is written
    std::string why;
    const bool ok = cuda_usable(&why);  // (not inside check(): its message would be built first)
    check(ok, "bench stream --backend cuda: " + why);
  }
  const nlohmann::json cfg = stream_config(a.moe_layers, a.experts);
  const std::string dir = a.dir;
  bool reuse = false;
  if (std::ifstream f(dir + "/config.json"); f) {
    nlohmann::json have;
    try {
      f >> have;
      reuse = have == cfg && std::filesystem::exists(dir + "/model.safetensors.index.json");
    } catch (...) {
    }
  }
  if (!reuse) {
    // Never overwrite a folder it did not write: only a missing or empty one, or one holding the
    // marker of an earlier bench checkpoint (of other sizes).
    const std::string marker = dir + "/.wren-bench-stream";
    std::error_code ec;
    const bool mine = std::filesystem::exists(marker, ec);
    check(mine || !std::filesystem::exists(dir, ec) || std::filesystem::is_empty(dir, ec),
          dir + ": bench stream writes its checkpoint only into a missing or empty folder (or one it wrote "
                "before); this one holds other files. Give --dir a new folder");
    std::printf("writing the bench checkpoint to %s ...\n", dir.c_str());
    std::fflush(stdout);
    std::filesystem::create_directories(dir);
    std::ofstream(marker) << "written by wren bench stream; the folder may be deleted\n";
    SynthOptions o;
    o.seed = 1;
    o.shard_bytes = 2'000'000'000;
    o.vision_shard = false;
    const double t0 = now_s();
    write_synthetic_checkpoint(cfg, dir, o);
    std::printf("written in %.1f s\n", now_s() - t0);
  }
  auto model = load_model(dir);
  const Config& c = model->config;
  std::set<std::string> files;
  for (const LayerWeights& l : model->weights.layers)
    for (const ExpertRef& e : l.moe.experts) files.insert(e.file);
  const uint64_t n_exp = uint64_t(c.n_experts) * (c.n_layers - c.first_dense);
  const uint64_t all_bytes = n_exp * c.expert_bytes();
  std::printf("model: %s (%s)\nexperts: %d MoE layers x %d = %llu experts of %.2f MB = %.2f GB in %zu shards; top-%d\n",
              dir.c_str(), reuse ? "reused" : "written", c.n_layers - c.first_dense, c.n_experts,
              (unsigned long long)n_exp, c.expert_bytes() / 1e6, all_bytes / 1e9, files.size(), c.top_k);
  std::printf("backend %s; cpu: %s, %d threads; prefill %d tokens (chunk %d), decode %d tokens; %d runs each; "
              "prediction %s\n",
              a.backend.c_str(), cpu::isa_name(a.cpu.isa), a.cpu.threads, a.prompt, a.chunk, a.tokens, a.runs,
              a.predict == "both" ? "off and on" : a.predict.c_str());
#ifndef WREN_HAVE_CUDA
  check(a.backend != "cuda", "bench stream --backend cuda: this build has no CUDA backend (configure with -DWREN_CUDA=ON)");
#endif

  ExpertStoreOptions so;
  so.direct = parse_direct_io(a.direct);
  so.loader_threads = a.loaders;
  so.cache_bytes = uint64_t(c.expert_bytes()) * 2 * c.top_k;
  const bool direct = ExpertStore(model->weights, c.expert_bytes(), so).direct();

  std::vector<double> raw;
  for (int r = 0; r < a.runs; ++r) {
    drop_cache(files);
    raw.push_back(sequential_read(files, direct, a.loaders));
  }
  const double raw_med = median(raw);
  std::printf("\n## Raw sequential read of the shards (%s, 8 MB reads, %d in flight: one per loader)\n"
              "GB/s: min %.3f, median %.3f (%d runs)\n",
              direct ? "cold: O_DIRECT" : "cold: page cache dropped", a.loaders, minimum(raw), raw_med, a.runs);

  std::vector<double> st, st_ahead, st_x, ahead_x;
  for (int r = 0; r < a.runs; ++r) {
    drop_cache(files);
    st.push_back(store_read(*model, so, false));
    drop_cache(files);
    st_ahead.push_back(store_read(*model, so, true));
    st_x.push_back(st.back() / raw[r]), ahead_x.push_back(st_ahead.back() / raw[r]);  // against this run's raw read
  }
  std::printf("expert store, every expert, 16 per visit, no compute (%d loaders): GB/s min %.3f, median %.3f; "
              "x raw per run min %.2fx, median %.2fx\n"
              "next 16 prefetched before each visit: GB/s min %.3f, median %.3f; x raw per run min %.2fx, median %.2fx\n",
              a.loaders, minimum(st), median(st), minimum(st_x), median(st_x), minimum(st_ahead), median(st_ahead),
              minimum(ahead_x), median(ahead_x));

#ifdef WREN_HAVE_CUDA
  if (a.backend == "cuda") {
    cuda_budgets(*model, so, files, a, raw_med, all_bytes);
    std::printf("peak RSS %.0f MB\n", peak_rss_bytes() / 1e6);
    return;
  }
#endif
  std::printf("\n## Prefill and decode by budget (cold cache at the start of each run; min / median of %d runs)\n", a.runs);
  std::printf("| budget | predict | prefill tok/s | prefill GB read / touched | decode s/token | decode GB/token | hit rate | recall | achieved GB/s (x raw) | I/O floor s/token | time / floor min / median |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::set<uint64_t> hashes;
  for (const double frac : parse_budgets(a.budgets)) {
    so.cache_bytes = std::max<uint64_t>(c.expert_bytes(), uint64_t(frac * double(all_bytes)));
    for (bool predict : predict_modes(a.predict)) {
      std::vector<double> pf, sd, gbt, ach, ratio;
      RunResult last;
      for (int r = 0; r < a.runs; ++r) {
        last = one_run(*model, a.cpu, so, files, a, predict);
        hashes.insert(last.hash);
        pf.push_back(a.prompt / last.prefill_s);
        sd.push_back(last.decode_s / a.tokens);
        gbt.push_back(last.decode_read / 1e9 / a.tokens);
        ach.push_back(last.decode_read / 1e9 / last.decode_s);
        if (gbt.back() > 0) ratio.push_back(sd.back() / (gbt.back() / raw_med));  // this run against its own floor
      }
      const double floor = median(gbt) / raw_med;  // s/token if every byte read came at the raw speed
      char rt[48] = "-";
      if (!ratio.empty()) std::snprintf(rt, sizeof rt, "%.2fx / %.2fx", minimum(ratio), median(ratio));
      std::printf("| %.0f%% (%.2f GB) | %s | %.2f / %.2f | %.2f / %.2f | %.3f / %.3f | %.3f | %.1f%% | %.1f%% | %.3f (%.2fx) | %.3f | %s |\n",
                  frac * 100, so.cache_bytes / 1e9, predict ? "on" : "off", minimum(pf), median(pf),
                  last.prefill_read / 1e9, last.prefill_touched / 1e9, minimum(sd), median(sd), median(gbt),
                  100 * last.decode_hit, 100 * last.recall, median(ach), median(ach) / raw_med, floor, rt);
      std::fflush(stdout);
    }
  }
  std::printf("\nlogits identical at every budget, prediction on and off: %s (%zu distinct hashes)\n",
              hashes.size() == 1 ? "yes" : "NO", hashes.size());
  std::printf("peak RSS %.0f MB\n", peak_rss_bytes() / 1e6);
  check(hashes.size() == 1, "bench stream: the logits differ between budgets or prediction modes");
}

}  // namespace wren::bench
