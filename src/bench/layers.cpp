// `wren bench layers`: decode time per layer against the memory floor, TTFT and prefill tok/s, on a
// random-weight model built in memory at true K3 layer sizes (preset k3: hidden 7168, KDA 96×128,
// MLA 96 heads / kv_lora 512, 896 MXFP4 experts top-16, latent 3584), at Kimi-Linear-48B-A3B sizes
// (preset kimi-linear: hidden 2304, KDA 32×128, MLA 32 heads, 256 dense experts top-8 of 1024) or a
// tiny preset for tests; the dense weights in the --quant preset's formats (default exact: f32).
//
// Per-layer decode time = t(first i+1 layers) − t(first i layers) for one decode token (the mean
// of --decode tokens decoded as `wren run` decodes: on CUDA each step recorded while the one
// before runs); the floor of layer i = bytes it must read per token (its dense weights in their
// format, its top-k experts' bytes, its KDA state read + written or its MLA cache rows) / the
// backend's measured copy bandwidth (bytes read + written by a 1 GiB device copy, over the time).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "bench/bench.h"
#include "bench/decode_floor.h"
#include "bench/profile_rows.h"
#include "bench/random_model.h"
#include "core/error.h"
#include "model/forward.h"
#include "model/tensor_table.h"
#include "runtime/backend_factory.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#ifdef WREN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace wren::bench {

namespace {

using clock_type = std::chrono::steady_clock;

/// Kimi-Linear-48B-A3B's config (the keys of its published config.json; bench/gpu_vs_fla.py's
/// sizes) with `kda` KDA layers then `mla` MLA layers, all MoE.
nlohmann::json kimi_linear_config(const LayersArgs& a) {
  const int L = a.kda + a.mla;
  std::vector<int> kda, full;
  std::vector<std::string> types, mlp(L, "sparse");
  for (int i = 1; i <= L; ++i) {
    (i <= a.kda ? kda : full).push_back(i);
    types.push_back(i <= a.kda ? "linear_attention" : "full_attention");
  }
  return {{"model_type", "kimi_linear"}, {"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 0},
          {"first_k_dense_replace", 0}, {"hidden_act", "silu"}, {"hidden_size", 2304}, {"intermediate_size", 9216},
          {"kv_lora_rank", 512}, {"mla_use_nope", true}, {"moe_intermediate_size", 1024}, {"moe_layer_freq", 1},
          {"moe_renormalize", true}, {"moe_router_activation_func", "sigmoid"}, {"num_attention_heads", 32},
          {"num_expert_group", 1}, {"num_experts", a.experts > 0 ? a.experts : 256}, {"num_experts_per_token", 8},
          {"num_hidden_layers", L}, {"num_key_value_heads", 32}, {"num_shared_experts", 1}, {"q_lora_rank", nullptr},
          {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"head_dim", 192},
          {"rms_norm_eps", 1e-5}, {"routed_scaling_factor", 2.446}, {"tie_word_embeddings", false}, {"topk_group", 1},
          {"use_grouped_topk", true}, {"vocab_size", a.vocab},
          {"linear_attn_config",
           {{"full_attn_layers", full}, {"head_dim", 128}, {"kda_layers", kda}, {"num_heads", 32},
            {"short_conv_kernel_size", 4}}},
          {"layer_types", types}, {"mlp_layer_types", mlp}};
}

/// The K3 text config (docs/model.md#config) with `kda` KDA layers then `mla` MLA layers, all MoE.
nlohmann::json bench_config(const LayersArgs& a) {
  if (a.preset == "kimi-linear") return kimi_linear_config(a);
  const bool k3 = a.preset == "k3";
  const int L = a.kda + a.mla;
  std::vector<int> kda, full;
  for (int i = 1; i <= L; ++i) (i <= a.kda ? kda : full).push_back(i);
  nlohmann::json t = {
      {"model_type", "kimi_linear"}, {"hidden_size", k3 ? 7168 : 128}, {"num_hidden_layers", L},
      {"vocab_size", a.vocab}, {"first_k_dense_replace", 0}, {"num_attention_heads", k3 ? 96 : 4},
      {"num_key_value_heads", k3 ? 96 : 4}, {"q_lora_rank", k3 ? 1536 : 64}, {"kv_lora_rank", k3 ? 512 : 32},
      {"qk_nope_head_dim", k3 ? 128 : 32}, {"qk_rope_head_dim", k3 ? 64 : 16}, {"v_head_dim", k3 ? 128 : 32},
      {"num_experts", a.experts > 0 ? a.experts : 896}, {"num_experts_per_token", k3 ? 16 : 4},
      {"moe_intermediate_size", k3 ? 3072 : 64}, {"routed_expert_hidden_size", k3 ? 3584 : 64},
      {"num_shared_experts", 2}, {"attn_res_block_size", 12}, {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0}, {"rms_norm_eps", 1e-5}, {"hidden_act", "situ"},
      {"latent_moe_use_norm", true}, {"moe_router_activation_func", "sigmoid"}, {"moe_renormalize", true},
      {"routed_scaling_factor", 1.0}, {"use_grouped_topk", true}, {"num_expert_group", 1}, {"topk_group", 1},
      {"topk_method", "noaux_tc"}, {"moe_layer_freq", 1}, {"mla_use_nope", true}, {"mla_use_output_gate", true},
      {"num_nextn_predict_layers", 0}, {"tie_word_embeddings", false},
      {"linear_attn_config",
       {{"num_heads", k3 ? 96 : 4}, {"head_dim", k3 ? 128 : 32}, {"short_conv_kernel_size", 4},
        {"gate_lower_bound", -5.0}, {"use_full_rank_gate", true}, {"kda_layers", kda}, {"full_attn_layers", full}}}};
  nlohmann::json q = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"},
                      {"config_groups", {{"group_0", {{"format", "mxfp4-pack-quantized"}, {"targets", {"Linear"}},
                                                      {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 32}}},
                                                      {"input_activations", nullptr}}}}}};
  return {{"model_type", "kimi_k3"}, {"bos_token_id", 1}, {"eos_token_id", 2}, {"tie_word_embeddings", false},
          {"text_config", t}, {"quantization_config", q}};
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Launch counters of one decode token (CUDA backend; zeros elsewhere).
struct StepCounts {
  uint64_t graph_launches = 0;  ///< decode graphs launched
  uint64_t kernels = 0;         ///< kernels run (inside graphs + outside)
  uint64_t outside = 0;         ///< kernel launches outside graphs
  uint64_t syncs = 0;           ///< host syncs
};

/// The 8-token prompt 3, 4, ..., 10 through `fwd` into `st` (logits: [vocab]); returns its greedy
/// next id, the first decode token.
int prefill8(Forward& fwd, SequenceState& st, std::vector<float>& logits) {
  std::vector<int> ids(8);
  for (int i = 0; i < 8; ++i) ids[i] = 3 + i;
  fwd.run(st, ids.data(), nullptr, 8, logits.data(), false);
  return argmax(logits.data(), int(logits.size()));
}

/// Seconds per decode token with the first `layers` layers, after an 8-token prefill. `graph`:
/// the steps run as `wren run` decodes (TokenStep::decode_greedy: where the backend records a step,
/// CUDA, each step is recorded while the one before runs), the mean over `tokens` steps after 2
/// warm-up steps; else op by op, the median of `tokens` single steps. `counts` receives the
/// counters of one more single step.
double decode_time(const Model& m, Backend& be, int layers, int tokens, bool graph, StepCounts* counts) {
  Forward fwd(m, be, {32, layers, graph});
  SequenceState st(be, m.config, 64 + tokens);
  std::vector<float> logits(m.config.vocab);
  int id = prefill8(fwd, st, logits);
  double per = 0;
  if (graph) {
    auto take = [&](int next) { return id = next, true; };
    fwd.decode_greedy(st, id, 2, take);  // warm-up (first recordings)
    const auto t0 = clock_type::now();
    fwd.decode_greedy(st, id, tokens, take);
    per = seconds_since(t0) / tokens;
  }
  std::vector<double> t;
  if (counts) *counts = {};
#ifdef WREN_HAVE_CUDA
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
#endif
  for (int i = 0; i < (graph ? 1 : tokens); ++i) {
#ifdef WREN_HAVE_CUDA
    const CudaStats s0 = cuda ? cuda->stats() : CudaStats{};
#endif
    const auto t0 = clock_type::now();
    fwd.run(st, &id, nullptr, 1, logits.data(), false);  // ends with a device -> host copy (sync)
    t.push_back(seconds_since(t0));
    id = argmax(logits.data(), m.config.vocab);
#ifdef WREN_HAVE_CUDA
    if (cuda && counts) {
      const CudaStats s1 = cuda->stats();
      counts->graph_launches = s1.graph_launches - s0.graph_launches;
      counts->outside = s1.launches - s0.launches;
      counts->kernels = counts->outside + (s1.graph_kernels - s0.graph_kernels);
      counts->syncs = s1.host_syncs - s0.host_syncs;
    }
#endif
  }
  if (graph) return per;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// One decode token of the whole model op by op (no graph; an event after every launch, the same
/// numerics), after an 8-token prefill: device milliseconds per kernel label, largest first, and
/// *total_ms the span. Empty where the backend has no per-launch timing (the CPU).
std::vector<GpuOpTime> profile_decode(const Model& m, Backend& be, double* total_ms) {
  Forward fwd(m, be, {32, -1, false});
  SequenceState st(be, m.config, 64);
  std::vector<float> logits(m.config.vocab);
  const int id = prefill8(fwd, st, logits);
  *total_ms = 0;
  if (!gpu_profile_begin(be)) return {};
  fwd.run(st, &id, nullptr, 1, logits.data(), false);
  return gpu_profile_end(be, total_ms);
}

/// A progress line on stderr with the seconds since `start` (long runs stay observable).
void progress(clock_type::time_point start, const std::string& what) {
  std::fprintf(stderr, "wren bench: [%7.2f s] %s\n", seconds_since(start), what.c_str());
  std::fflush(stderr);
}

/// Median seconds of `reps` calls of `op` (then one device -> host read to drain the queue).
template <class Op>
double time_op(Backend& be, float* probe_buf, int reps, Op&& op) {
  std::vector<double> t;
  float probe;
  for (int r = 0; r < 5; ++r) {
    be.to_host(probe_buf, 1, &probe);
    const auto t0 = clock_type::now();
    for (int i = 0; i < reps; ++i) op(i);
    be.to_host(probe_buf, 1, &probe);
    t.push_back(seconds_since(t0) / reps);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

/// Decode-shape timings of single ops of layer 0 (a KDA + MoE layer at the preset's sizes), with
/// the bytes each must read: where the layer's time goes.
void op_table(const Model& m, Backend& be, double bw) {
  const Config& c = m.config;
  const LayerWeights& l = m.weights.layers[0];
  if (c.layers[0].mixer != Mixer::KDA) return;
  const size_t D = c.hidden, P = c.kda_width();
  float* x = be.alloc(D * 32);
  float* y = be.alloc(std::max(P, size_t(c.n_experts)) * 32);
  std::vector<float> ones(D * 32, 0.01f);
  be.from_host(ones.data(), ones.size(), x);
  std::printf("%-34s %10s %10s %8s\n", "op (layer 0, decode shapes)", "us", "MB", "GB/s");
  auto row = [&](const std::string& name, double s, double bytes) {
    std::printf("%-34s %10.1f %10.2f %8.0f\n", name.c_str(), s * 1e6, bytes / 1e6, bytes / s / 1e9);
  };
  for (int T : {1, 32}) {
    const DenseWeight& q = l.kda.q;
    const double s = time_op(be, y, 10, [&](int) { be.gemm(q, x, T, y); });
    row("gemm q_proj " + std::to_string(q.rows) + "x" + std::to_string(q.cols) + " " + wformat_name(q.format) +
            " T=" + std::to_string(T),
        s, weight_bytes(q));
  }
  for (const DenseWeight* w : {&l.kda.o, &l.moe.router, &l.moe.down, &l.moe.shared_gate, &l.kda.f_a}) {
    if (!w->data) continue;  // (no latent projections outside K3)
    const double s = time_op(be, y, 10, [&](int) { be.gemm(*w, x, 1, y); });
    row("gemm " + std::to_string(w->rows) + "x" + std::to_string(w->cols) + " " + wformat_name(w->format) + " T=1", s,
        weight_bytes(*w));
  }
  if (c.expert_format == ExpertFormat::MXFP4) {
    const double s = time_op(be, y, 16, [&](int i) {
      be.expert_ffn(l.moe.experts[size_t(i * 37) % l.moe.experts.size()], x, c.situ_b1, c.situ_b2, y);
    });
    row("expert_ffn (distinct experts)", s, double(c.expert_bytes()));
  }
  {
    std::vector<int> ids(c.top_k);
    std::vector<float> w(c.top_k);
    const double s = time_op(be, y, 10, [&](int) { be.router_topk(y, l.moe.bias, 1, c.n_experts, c.top_k, ids.data(), w.data()); });
    row("router_topk (incl. host sync)", s, double(c.n_experts) * 8);
  }
  {  // the device-routed MoE (no host sync)
    const RoutedMoeParams p{0,         c.n_experts, c.top_k, c.expert_io(), c.routed_scale, c.situ_b1, c.situ_b2,
                            c.expert_format, c.act, c.moe_inter};
    float* ys = be.alloc(size_t(c.top_k) * c.expert_io());
    float* out = be.alloc(c.expert_io());
    float* gua = be.alloc(3 * size_t(std::max(c.moe_inter, 1)));  // the host-routed dense path's g, u, act
    const uint64_t before = be.fallbacks();
    const RoutedMoeWork ws{ys, gua, gua + c.moe_inter, gua + 2 * size_t(c.moe_inter)};
    const double s = time_op(be, y, 10, [&](int) { be.routed_moe(p, l.moe, y, x, 1, ws, out); });
    row(be.fallbacks() == before ? "routed_moe T=1 (router+top-k experts)" : "routed_moe T=1 (host-routed fallback)", s,
        double(c.top_k) * routed_expert_bytes(m));
    be.release(ys);
    be.release(out);
    be.release(gua);
  }
  {
    SequenceState st(be, c, 8);
    float* buf = be.alloc(P * 6);
    const KdaParams p{c.kda_heads, c.kda_head_dim, c.conv_kernel, c.gate_lower_bound, c.rms_eps};
    const double s = time_op(be, y, 10, [&](int) {
      be.kda_core(p, l.kda, st.kda(0), buf, buf + P, buf + 2 * P, buf + 3 * P, buf + 4 * P, buf + 5 * P, 1, y);
    });
    row("kda_core T=1 (state r+w)", s, 2.0 * c.kda_heads * c.kda_head_dim * c.kda_head_dim * 4);
#ifdef WREN_HAVE_CUDA
    // Device time without launch gaps from the host: a CUDA graph of one decode step per state over
    // >= 150 MB of states (beyond the L2), beside the reference copy kernel moving the same bytes.
    if (auto* cu = dynamic_cast<CudaBackend*>(&be)) {
      const size_t n = size_t(c.kda_heads) * c.kda_head_dim * c.kda_head_dim, win = 3 * P * (c.conv_kernel - 1);
      const int R = int((150e6 + n * 4 - 1) / (n * 4));
      std::vector<float*> owned;
      std::vector<KdaState> states(R);
      for (KdaState& k : states) owned.push_back(k.S = be.alloc(n)), owned.push_back(k.conv = be.alloc(std::max<size_t>(win, 1)));
      for (int i = 0; i < 2 * R; ++i) owned.push_back(be.alloc(n));
      const double tk = cu->time_recorded([&](int i) {
        be.kda_core(p, l.kda, states[i], buf, buf + P, buf + 2 * P, buf + 3 * P, buf + 4 * P, buf + 5 * P, 1, y);
      }, R, 10);
      const double tc = cu->time_recorded([&](int i) { cu->copy_kernel(owned[2 * R + 2 * i], n, owned[2 * R + 2 * i + 1]); }, R, 10);
      const double b = 2.0 * n * 4;
      row("kda_core T=1 graph-timed, " + std::to_string(R) + " states", tk, b);
      row("copy kernel, same bytes, graph-timed", tc, b);
      std::printf("%-34s %9.0f%% of the copy kernel, %.0f%% of the copy bandwidth below\n", "kda_core T=1 decode step",
                  100 * tc / tk, 100 * b / tk / bw);
      for (float* f : owned) be.release(f);
    }
#endif
    be.release(buf);
  }
  std::printf("(copy bandwidth %.0f GB/s)\n", bw / 1e9);
  be.release(x);
  be.release(y);
}

/// Prefill-shape timings of layer 0's big GEMMs and routed experts at T = 512 and 4096 (or the
/// chunk when smaller), as TFLOP/s against the BF16 tensor-core peak measured in the same run.
void prefill_table(const Model& m, Backend& be, double peak, int chunk) {
  const Config& c = m.config;
  const LayerWeights& l = m.weights.layers[0];
  std::printf("bf16 tensor-core peak (cuBLASLt 8192^3, this run): %.0f TFLOP/s\n", peak);
  std::printf("%-40s %10s %10s %8s\n", "op (layer 0, prefill shapes)", "ms", "TFLOP/s", "of peak");
  auto row = [&](const std::string& name, double s, double flop) {
    std::printf("%-40s %10.3f %10.1f %7.1f%%\n", name.c_str(), s * 1e3, flop / s / 1e12, 100 * flop / s / 1e12 / peak);
  };
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int T : {512, 4096}) {
    T = std::min(T, chunk);
    const size_t D = c.hidden, io = c.expert_io();
    const size_t widest = std::max({size_t(c.kda_width()), size_t(c.n_experts), D, io});
    std::vector<float> hx(size_t(T) * widest);
    for (float& v : hx) v = u(g);
    float* x = be.alloc(hx.size());
    float* y = be.alloc(size_t(T) * std::max({widest, size_t(c.top_k) * io, size_t(c.moe_inter)}));
    be.from_host(hx.data(), hx.size(), x);
    const std::string ts = " T=" + std::to_string(T);
    for (const DenseWeight* w : {&l.kda.q, &l.kda.o, &l.moe.down, &l.moe.shared_gate}) {
      if (c.layers[0].mixer != Mixer::KDA && (w == &l.kda.q || w == &l.kda.o)) continue;
      if (!w->data) continue;
      const double s = time_op(be, y, 5, [&](int) { be.gemm(*w, x, T, y); });
      row("gemm " + std::to_string(w->rows) + "x" + std::to_string(w->cols) + ts, s, 2.0 * T * w->rows * w->cols);
    }
    const RoutedMoeParams p{0, c.n_experts, c.top_k, int(io), c.routed_scale, c.situ_b1, c.situ_b2,
                            c.expert_format, c.act, c.moe_inter};
    float* logits = be.alloc(size_t(T) * c.n_experts);
    const RoutedMoeWork ws{be.alloc(size_t(T) * c.top_k * io), be.alloc(size_t(c.moe_inter)),
                           be.alloc(size_t(c.moe_inter)), be.alloc(size_t(c.moe_inter))};
    float* out = be.alloc(size_t(T) * io);
    be.from_host(hx.data(), size_t(T) * c.n_experts, logits);
    const uint64_t fallbacks = be.fallbacks();
    const double s = time_op(be, y, 3, [&](int) { be.routed_moe(p, l.moe, logits, x, T, ws, out); });
    if (be.fallbacks() == fallbacks)  // on the device (a host-routed fallback is not this row's kernel)
      row("routed_moe (router+grouped experts)" + ts, s, 2.0 * 3 * T * c.top_k * double(io) * c.moe_inter);
    for (float* b : {x, y, logits, ws.ys, ws.g, ws.u, ws.act, out}) be.release(b);
  }
}

void bench_layers(const LayersArgs& a) {
  check(a.preset == "k3" || a.preset == "kimi-linear" || a.preset == "tiny", "--preset: expected k3, kimi-linear or tiny");
  const QuantPlan plan = QuantPlan::preset(a.quant);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const auto start = clock_type::now();
  check(a.kda >= 0 && a.mla >= 0 && a.kda + a.mla >= 1, "--kda/--mla: at least one layer");
  const std::string kind = resolve_backend(a.backend);
  if (!a.expert_forms.empty()) {  // checked before the model is built
#ifdef WREN_HAVE_CUDA
    parse_expert_forms(a.expert_forms, CudaBackend::mx_decode_forms(), CudaBackend::dense_decode_forms());
    usage_check(kind == "cuda" && a.cuda.precision == GpuPrecision::Fast,
                "bench layers: --expert-forms times the decode experts of --backend cuda --gpu-precision fast");
#else
    usage_check(false, "bench layers: --expert-forms needs a CUDA build (this one has no CUDA backend)");
#endif
  }
  auto t0 = clock_type::now();
  const int experts = a.experts > 0 ? a.experts : a.preset == "kimi-linear" ? 256 : 896;
  auto model = make_random_model(bench_config(a), a.seed, std::min(a.distinct, experts), plan);
  const double gen_s = seconds_since(t0);
  progress(start, "random model built");
  t0 = clock_type::now();
  auto be = make_backend(kind, model->weights, {}, "", a.cuda);
  const double upload_s = seconds_since(t0);
  progress(start, std::string("backend ") + be->name() + " ready (weights uploaded)" +
                      (kind == "cuda" ? "; " + describe(a.cuda) : std::string()));
  const Config& c = model->config;
  const double bw = copy_bandwidth(*be, a.preset == "tiny" ? (size_t(1) << 22) : (size_t(1) << 28));
  progress(start, "copy bandwidth " + std::to_string(bw / 1e9) + " GB/s");
  op_table(*model, *be, bw);
  const int chunk = a.chunk > 0 ? a.chunk : default_chunk(kind, a.cuda.precision, model->config, device_free_bytes(*be));
  const double peak = gpu_bf16_peak_tflops(*be);
  if (peak > 0 && a.cuda.precision == GpuPrecision::Fast) prefill_table(*model, *be, peak, chunk);
  else if (peak > 0) std::printf("bf16 tensor-core peak (cuBLASLt 8192^3, this run): %.0f TFLOP/s\n", peak);

  // Per-layer decode: differences of cumulative runs.
  std::vector<double> cum(c.n_layers + 1);
  std::vector<StepCounts> counts(c.n_layers + 1);
  for (int k = 0; k <= c.n_layers; ++k) {
    cum[k] = decode_time(*model, *be, k, a.decode, true, &counts[k]);
    progress(start, "decode with " + std::to_string(k) + " layers: " + std::to_string(cum[k] * 1e3) + " ms/token");
  }
  // The whole model once more op by op (no graph), side by side with the graph run above.
  StepCounts plain;
  const double plain_s = decode_time(*model, *be, c.n_layers, a.decode, false, &plain);
  progress(start, "decode without graph: " + std::to_string(plain_s * 1e3) + " ms/token");
  // The whole model once more with the decode weight streams launched ordinarily (no programmatic
  // dependent launches), side by side with the default above.
  double ordinary_s = 0;
#ifdef WREN_HAVE_CUDA
  if (auto* cu = dynamic_cast<CudaBackend*>(be.get()); cu && a.cuda.precision == GpuPrecision::Fast) {
    cu->set_decode_streams(false, 0);
    ordinary_s = decode_time(*model, *be, c.n_layers, a.decode, true, nullptr);
    cu->set_decode_streams(true, 0);
    progress(start, "decode, streams launched ordinarily: " + std::to_string(ordinary_s * 1e3) + " ms/token");
  }
#endif
  // The whole model once more per --expert-forms entry (the decode experts' forms), side by
  // side with the default above.
  std::vector<std::pair<DecodeForm, double>> form_s;
#ifdef WREN_HAVE_CUDA
  if (auto* cu = dynamic_cast<CudaBackend*>(be.get()); cu && a.cuda.precision == GpuPrecision::Fast) {
    for (const DecodeForm& f :
         parse_expert_forms(a.expert_forms, CudaBackend::mx_decode_forms(), CudaBackend::dense_decode_forms())) {
      set_decode_form(*cu, f);
      form_s.emplace_back(f, decode_time(*model, *be, c.n_layers, a.decode, true, nullptr));
      progress(start, std::string("decode, experts form ") + f.kind + std::to_string(f.n) + ": " +
                          std::to_string(form_s.back().second * 1e3) + " ms/token");
    }
    set_decode_form(*cu, {});
  }
#endif
  double profile_ms = 0;
  const std::vector<GpuOpTime> prof = a.profile ? profile_decode(*model, *be, &profile_ms) : std::vector<GpuOpTime>{};
  if (a.profile) progress(start, "profiled decode token done");
  const DecodeBytes floor_bytes = decode_bytes(*model, 8 + a.decode / 2);
  const std::vector<double>& bytes = floor_bytes.layer;

  // Prefill of a --prompt-token prompt: TTFT (prefill + the first token's logits) and tok/s.
  std::mt19937 g(a.seed);
  std::vector<int> ids(a.prompt);
  for (int& id : ids) id = int(g() % unsigned(c.vocab));
  double ttft = 0;
  {
    Forward fwd(*model, *be, {chunk, -1});
    SequenceState st(*be, c, a.prompt + 8);
    std::vector<float> logits(c.vocab);
    const auto p0 = clock_type::now();
    fwd.run(st, ids.data(), nullptr, a.prompt, logits.data(), false);
    ttft = seconds_since(p0);
  }
  progress(start, "prefill done");

  nlohmann::json out = {{"backend", be->name()}, {"preset", a.preset}, {"quant", plan.describe()}, {"copy_GBps", bw / 1e9},
                        {"model_gen_s", gen_s}, {"upload_s", upload_s}, {"decode_tokens", a.decode},
                        {"full_decode_ms", cum.back() * 1e3}, {"kernels_per_token", counts.back().kernels},
                        {"graph_launches_per_token", counts.back().graph_launches},
                        {"launches_outside_graphs_per_token", counts.back().outside},
                        {"host_syncs_per_token", counts.back().syncs}, {"no_graph_decode_ms", plain_s * 1e3},
                        {"no_graph_launches_per_token", plain.outside}, {"no_graph_host_syncs_per_token", plain.syncs},
                        {"prompt", a.prompt}, {"chunk", chunk}, {"bf16_peak_tflops", peak}, {"ttft_s", ttft}, {"prefill_tok_s", a.prompt / ttft}};
  if (kind == "cuda") out["options"] = describe(a.cuda);
  std::printf("wren bench: backend %s, preset %s (hidden %d, %d KDA + %d MLA layers, %d %s experts top-%d, "
              "%d distinct), dense weights %s, copy bandwidth %.0f GB/s (read+write)\n",
              be->name(), a.preset.c_str(), c.hidden, a.kda, a.mla, c.n_experts,
              c.expert_format == ExpertFormat::MXFP4 ? "MXFP4" : "dense", c.top_k, std::min(a.distinct, experts),
              plan.describe().c_str(), bw / 1e9);
  std::printf("%-6s %-4s %12s %12s %12s %8s %10s\n", "layer", "type", "decode_ms", "MB_read", "floor_ms", "ratio",
              "kernels");
  for (int i = 0; i < c.n_layers; ++i) {
    const double ms = (cum[i + 1] - cum[i]) * 1e3, floor_ms = bytes[i] / bw * 1e3;
    const char* type = c.layers[i].mixer == Mixer::KDA ? "KDA" : "MLA";
    std::printf("%-6d %-4s %12.3f %12.1f %12.3f %8.2f %10llu\n", i, type, ms, bytes[i] / 1e6, floor_ms,
                ms / floor_ms, (unsigned long long)(counts[i + 1].kernels - counts[i].kernels));
    out["layers"].push_back({{"layer", i}, {"type", type}, {"decode_ms", ms}, {"bytes", bytes[i]},
                             {"floor_ms", floor_ms}, {"ratio", ms / floor_ms},
                             {"kernels", counts[i + 1].kernels - counts[i].kernels}});
  }
  const StepCounts& full = counts.back();
  const double floor_all = floor_bytes.total() / bw;
  // Graphs, kernel launches and host syncs are the GPU's; the CPU backend reports none of them.
  const bool gpu = kind == "cuda";
  std::printf("embedding + final mix/norm + lm_head (vocab %d): %.3f ms (floor %.3f ms); whole decode token %.3f ms "
              "= %.2fx its floor %.3f ms (%.1f MB)",
              c.vocab, cum[0] * 1e3, floor_bytes.outside / bw * 1e3, cum.back() * 1e3, cum.back() / floor_all,
              floor_all * 1e3, floor_bytes.total() / 1e6);
  if (gpu)
    std::printf(": %llu graph launches (%llu kernels), %llu kernel launches outside graphs, %llu host syncs",
                (unsigned long long)full.graph_launches, (unsigned long long)full.kernels,
                (unsigned long long)full.outside, (unsigned long long)full.syncs);
  std::printf("\n");
  out["floor_ms"] = floor_all * 1e3;
  out["floor_ratio"] = cum.back() / floor_all;
  if (gpu)
    std::printf("same token without graph: %.3f ms, %llu kernel launches, %llu host syncs (graph speedup %.2fx)\n",
                plain_s * 1e3, (unsigned long long)plain.outside, (unsigned long long)plain.syncs,
                plain_s / cum.back());
  if (ordinary_s > 0) {
    std::printf("same token with the decode weight streams launched ordinarily (no programmatic dependent launch): "
                "%.3f ms (%.2fx)\n", ordinary_s * 1e3, ordinary_s / cum.back());
    out["ordinary_launch_decode_ms"] = ordinary_s * 1e3;
  }
  for (const auto& [f, t] : form_s) {
    std::printf("same token with decode-experts form %c%d: %.3f ms (%.2fx the default's)\n", f.kind, f.n, t * 1e3,
                t / cum.back());
    out["expert_forms"].push_back({{"form", std::string(1, f.kind) + std::to_string(f.n)}, {"decode_ms", t * 1e3}});
  }
  if (a.profile && prof.empty()) std::printf("--profile: this backend has no per-launch device timing (CUDA only)\n");
  if (!prof.empty()) {
    std::printf("profile of one decode token, op by op (%.3f ms of device timeline, launch to launch; host-bound "
                "gaps charged to the launch that waited):\n", profile_ms);
    std::printf("    %-64s %9s %7s %6s\n", "kernel", "ms", "share", "launches");
    out["profile"] = print_profile_rows(prof, profile_ms, int(prof.size()));
    out["profile_total_ms"] = profile_ms;
  }
  std::printf("prefill %d tokens (chunk %d%s%s): TTFT %.3f s, %.1f tok/s\n", a.prompt, chunk,
              gpu ? ", gpu precision " : "", gpu ? gpu_precision_name(a.cuda.precision) : "", ttft, a.prompt / ttft);
  if (a.json) std::printf("%s\n", out.dump().c_str());
}

}  // namespace


void run_layers(const LayersArgs& a) { bench_layers(a); }

}  // namespace wren::bench
