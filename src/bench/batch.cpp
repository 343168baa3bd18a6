// `bench batch`: the batched decode step on its own (see bench.h), at several batch sizes side by
// side in one process, so the server's scaling (docs/serve.md) can be split into the forward call,
// the host draw and, with --profile, the device timeline per kernel label.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench/bench.h"
#include "bench/decode_floor.h"
#include "bench/profile_rows.h"
#include "core/error.h"
#include "core/sizes.h"
#include "model/forward.h"
#include "ops/state.h"
#include "runtime/backend_factory.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#ifdef WREN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace wren::bench {

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<DecodeForm> parse_expert_forms(const std::string& s, int mx_forms, int dense_forms) {
  std::vector<DecodeForm> out;
  if (s.empty()) return out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    const char kind = item.empty() ? 0 : item[0];
    const int hi = kind == 'm' ? mx_forms - 1 : kind == 'g' ? 1 : dense_forms - 1;
    char* end = nullptr;
    const long v = item.size() > 1 && std::isdigit(static_cast<unsigned char>(item[1])) ? std::strtol(item.c_str() + 1, &end, 10) : -1;
    usage_check((kind == 'm' || kind == 'd' || kind == 'g') && end && *end == '\0' && v >= 0 && v <= hi,
                "--expert-forms: '" + item + "' is not mN (an MXFP4 decode-experts form, N in 0.." +
                    std::to_string(mx_forms - 1) + "), dN (a dense decode-experts form, N in 0.." +
                    std::to_string(dense_forms - 1) + ") or g0 / g1 (the GLU and output gate as their own launches / " +
                    "inside the GEMV)");
    out.push_back({kind, int(v)});
  }
  usage_check(!out.empty(), "--expert-forms: give at least one form");
  return out;
}

void set_decode_form(Backend& be, DecodeForm f) {
#ifdef WREN_HAVE_CUDA
  auto* cu = dynamic_cast<CudaBackend*>(&be);
  if (!cu) return;
  cu->set_decode_streams(true, 0, 0, f.kind == 'f' ? f.n : 0);
  cu->set_mx_decode_form(f.kind == 'm' ? f.n : 0);
  cu->set_dense_decode_form(f.kind == 'd' ? f.n : 0);
  cu->set_gemv_map(f.kind == 'g' && f.n == 1);
#else
  (void)be, (void)f;
#endif
}

void run_batch(BatchArgs a) {
  const std::vector<int> batches = parse_count_list(a.batches, "--batches", 1, 4096, "batch size");
  // --gemv-forms, --expert-forms: every size once per form of a CUDA fast-mode decode kernel, side
  // by side (a form: 'f' GEMV, 'm' MXFP4 decode experts, 'd' dense decode experts; the others at
  // their defaults). Without either: the backend's own settings, once.
  using Form = DecodeForm;
  std::vector<Form> forms;
#ifdef WREN_HAVE_CUDA
  const int mx_forms = CudaBackend::mx_decode_forms(), dense_forms = CudaBackend::dense_decode_forms();
#else
  const int mx_forms = 1 << 20, dense_forms = 1 << 20;  // the syntax only: the flag needs a CUDA build
#endif
  const std::vector<Form> expert = parse_expert_forms(a.expert_forms, mx_forms, dense_forms);
  const bool hooks = !a.gemv_forms.empty() || !expert.empty();
  if (hooks) {
#ifdef WREN_HAVE_CUDA
    usage_check(a.engine.cuda.precision == GpuPrecision::Fast,
                "bench batch: --gemv-forms and --expert-forms time kernels of --gpu-precision fast (exact mode has none)");
    if (!a.gemv_forms.empty())
      for (const int f : parse_count_list(a.gemv_forms, "--gemv-forms", 0, CudaBackend::gemv_forms() - 1, "GEMV form"))
        forms.push_back({'f', f});
    forms.insert(forms.end(), expert.begin(), expert.end());
#else
    usage_check(false, "bench batch: --gemv-forms and --expert-forms need a CUDA build (this one has no CUDA backend)");
#endif
  }
  if (forms.empty()) forms.push_back({});
  check(a.prompt >= 1 && a.steps >= 1, "bench batch: --prompt and --steps must be at least 1");
  a.engine.ctx = std::max(a.engine.ctx, a.prompt + a.steps + 8);
  a.engine.cpu_fallback = false;
  a.engine.announce = false;
  const auto t0 = Clock::now();
  Engine e(a.engine);
  const double load_s = secs(Clock::now() - t0);
  const bool gpu = std::string(e.backend().name()) != "cpu";
  const std::string options = gpu ? describe(a.engine.cuda) : a.cpu_line;
  std::fprintf(stderr, "wren bench batch: %s loaded in %.1f s; backend %s, chunk %d; %s\n",
               e.dir().c_str(), load_s, e.backend().name(), e.chunk(), options.c_str());
#ifdef WREN_HAVE_CUDA
  CudaBackend* const cu = hooks ? dynamic_cast<CudaBackend*>(&e.backend()) : nullptr;
  usage_check(!hooks || cu != nullptr, "bench batch: --gemv-forms and --expert-forms need the CUDA backend (--backend cuda)");
#endif
  const auto set_form = [&](Form f) {  // only with a forms list: else the backend's own settings stay
    if (hooks) set_decode_form(e.backend(), f);
  };
  const int V = e.config().vocab;
  nlohmann::json out = {{"model", e.dir()},   {"backend", e.backend().name()},
                        {"load_s", load_s},   {"options", options},
                        {"chunk", e.chunk()}, {"prompt", a.prompt},
                        {"steps", a.steps}};
  // The floor of a one-sequence step: its bytes (decode_floor.h) at this run's copy bandwidth.
  const double bw = copy_bandwidth(e.backend(), gpu ? (size_t(1) << 28) : (size_t(1) << 24));
  const DecodeBytes floor_bytes = decode_bytes(e.model(), a.prompt + a.steps / 2);
  const double floor_s = floor_bytes.total() / bw;
  std::printf("one-sequence decode floor: %.1f MB a token (%.1f MB outside the layers) at %.0f GB/s (copy, read+write, "
              "this run) = %.3f ms\n",
              floor_bytes.total() / 1e6, floor_bytes.outside / 1e6, bw / 1e9, floor_s * 1e3);
  out["copy_GBps"] = bw / 1e9, out["floor_bytes_per_token"] = floor_bytes.total(), out["floor_ms"] = floor_s * 1e3;
  std::printf("%-6s %10s %10s %10s %10s %8s %10s %9s %8s %8s %12s\n", "batch", "ms/step", "forward",
              "draw", "tok/s", "vs 1st", "launches", "graphs", "syncs", "kernels", "expert MB/tok");
  // Each size through the engine's forward pass (pass 0) and, with --eager, one that never records
  // a step (rows "Be"), with --record-batched one that records batched steps too (rows "Br").
  std::vector<std::pair<std::string, std::unique_ptr<Forward>>> passes;
  passes.emplace_back("", nullptr);
  for (const auto& [on, suffix] : {std::pair{a.eager, "e"}, std::pair{a.record_batched, "r"}}) {
    if (!on) continue;
    ForwardOptions fo;
    fo.max_chunk = e.chunk();
    fo.graph = suffix[0] == 'r', fo.graph_rows = 1 << 20;
    passes.emplace_back(suffix, std::make_unique<Forward>(e.model(), e.backend(), fo));
  }
  double first = 0;
  // Each batch size once per form (the defaults alone without a forms list).
  std::vector<std::pair<Form, int>> runs;  // (form, batch size)
  for (const Form& form : forms)
    for (const int B : batches) runs.emplace_back(form, B);
  for (const auto& [form, B] : runs) {
    set_form(form);
    // draw 0: each sequence's greedy id from the step (BatchEntry::greedy: arg-max on the device,
    // what the scheduler does for plain greedy requests); 1 (--host-draw): the logits rows to the
    // host and the arg-max there (what sampled, logprob and constrained requests take).
    // One sequence drawn on the device through the engine's pass runs as `wren run` decodes
    // (TokenStep::decode_greedy: CUDA records each step while the one before runs), and again
    // step by step through run_mixed beside it (row "1s": each step recorded, then waited for).
    for (int draw = 0; draw < (a.host_draw ? 2 : 1); ++draw)
    for (size_t mode = 0; mode < passes.size(); ++mode)
    for (int stepwise = 0; stepwise < (B == 1 && draw == 0 && mode == 0 ? 2 : 1); ++stepwise) {
      const bool pipelined = B == 1 && draw == 0 && mode == 0 && !stepwise;
      TokenStep& fwd = mode == 0 ? static_cast<TokenStep&>(e.forward()) : *passes[mode].second;
      std::mt19937 g(uint32_t(a.seed) + uint32_t(B));
      std::vector<std::unique_ptr<SequenceState>> st;
      std::vector<float> logits(size_t(B) * V);
      std::vector<int> pending(static_cast<size_t>(B)), next(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {  // each sequence prefilled alone
        std::vector<int> ids(size_t(a.prompt));
        for (int& id : ids) id = int(g() % unsigned(V));
        st.push_back(e.new_sequence());
        fwd.run(*st.back(), ids.data(), nullptr, a.prompt, logits.data() + size_t(b) * V, false);
        pending[size_t(b)] = argmax(logits.data() + size_t(b) * V, V);
      }
      std::vector<BatchEntry> es(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b)
        es[size_t(b)] = draw == 0 ? BatchEntry{st[size_t(b)].get(), &pending[size_t(b)], 1, nullptr, &next[size_t(b)]}
                                  : BatchEntry{st[size_t(b)].get(), &pending[size_t(b)], 1, logits.data() + size_t(b) * V};
      double fwd_s = 0, draw_s = 0;
      auto step = [&](bool timed) {
        const auto s0 = Clock::now();
        fwd.run_mixed(es.data(), B);
        const auto s1 = Clock::now();
        if (draw == 0) pending = next;
        else
          for (int b = 0; b < B; ++b) pending[size_t(b)] = argmax(logits.data() + size_t(b) * V, V);
        if (timed) fwd_s += secs(s1 - s0), draw_s += secs(Clock::now() - s1);
      };
      auto take = [&](int id) { return pending[0] = id, true; };
      if (pipelined) fwd.decode_greedy(*st[0], pending[0], 2, take);  // warm-up, as below
      else
        step(false),
            step(false);  // warm-up: first use of this batch size (tables, algorithms, graphs)
      const GpuCounters c0 = gpu_counters(e.backend());
      if (pipelined) {
        const auto s0 = Clock::now();
        fwd.decode_greedy(*st[0], pending[0], a.steps, take);
        fwd_s = secs(Clock::now() - s0);
      } else {
        for (int s = 0; s < a.steps; ++s) step(true);
      }
      const GpuCounters c1 = gpu_counters(e.backend());
      const double per = (fwd_s + draw_s) / a.steps, tok_s = B / per;
      if (first == 0) first = tok_s;  // the first size through the engine's forward pass
      const double n = a.steps;
      const double mb_tok = double(c1.expert_bytes - c0.expert_bytes) / 1e6 / (n * B);
      const std::string label = std::to_string(B) + passes[mode].first + (draw ? "h" : "") + (stepwise ? "s" : "") +
                                (forms.size() > 1 ? "/" + std::string(1, form.kind) + std::to_string(form.n) : "");
      std::printf("%-6s %10.3f %10.3f %10.3f %10.1f %7.2fx %10.1f %9.1f %8.1f %8.1f %12.2f\n",
                  label.c_str(), per * 1e3, fwd_s / n * 1e3,
                  draw_s / n * 1e3, tok_s, tok_s / first, (c1.launches - c0.launches) / n,
                  (c1.graph_launches - c0.graph_launches) / n, (c1.host_syncs - c0.host_syncs) / n,
                  (c1.graph_kernels - c0.graph_kernels) / n, mb_tok);
      nlohmann::json row = {
          {"batch", B},
          {"pass", stepwise ? "step by step" : mode == 0 ? "default" : passes[mode].first == "e" ? "eager" : "record-batched"},
          {"recorded_ahead_per_step", double(c1.graph_ahead - c0.graph_ahead) / a.steps},
          {"recorded", c1.graph_launches > c0.graph_launches},
          {"host_draw", draw == 1},
          {"gemv_form", form.kind == 'f' ? form.n : 0},
          {"mx_decode_form", form.kind == 'm' ? form.n : 0},
          {"dense_decode_form", form.kind == 'd' ? form.n : 0},
          {"gemv_map", form.kind == 'g' && form.n == 1},
          {"ms_per_step", per * 1e3},
          {"forward_ms", fwd_s / n * 1e3},
          {"draw_ms", draw_s / n * 1e3},
          {"tok_s", tok_s},
          {"vs_first", tok_s / first},
          {"launches_per_step", (c1.launches - c0.launches) / n},
          {"graph_launches_per_step", (c1.graph_launches - c0.graph_launches) / n},
          {"graph_kernels_per_step", (c1.graph_kernels - c0.graph_kernels) / n},
          {"host_syncs_per_step", (c1.host_syncs - c0.host_syncs) / n},
          {"expert_visits_per_step", double(c1.expert_visits - c0.expert_visits) / n},
          {"expert_mb_per_token", mb_tok},
          {"record_host_ms_per_step", (c1.record_host_s - c0.record_host_s) / n * 1e3}};
      if (B == 1) {
        row["vs_floor"] = per / floor_s;
        std::printf("       batch %s: %.3f ms a token = %.2fx the floor (%.3f ms)\n",
                    label.c_str(), per * 1e3, per / floor_s, floor_s * 1e3);
      }
      if (c1.graph_launches > c0.graph_launches) {  // the device idles while the host records a step
        std::printf("       batch %s: host time recording a step %.3f ms (capture, graph update, launch)%s\n",
                    label.c_str(), (c1.record_host_s - c0.record_host_s) / n * 1e3,
                    c1.graph_ahead > c0.graph_ahead ? ", while the step before ran" : "");
      }
      if (a.profile && gpu &&
          mode == 0) {  // one more step, every launch followed by an event (same numerics)
        gpu_profile_begin(e.backend());
        fwd.run_mixed(es.data(), B);
        double total = 0;
        const std::vector<GpuOpTime> prof = gpu_profile_end(e.backend(), &total);
        std::printf(
            "  profile, batch %s: %.3f ms of device timeline (launch-to-launch; host-bound gaps "
            "charged to the "
            "launch that waited)\n",
            label.c_str(), total);
        row["profile"] = print_profile_rows(prof, total, 16);
        row["profile_total_ms"] = total;
      }
      out["runs"].push_back(row);
    }
  }
  set_form({});
  if (a.json) std::printf("%s\n", out.dump().c_str());
}

}  // namespace wren::bench
