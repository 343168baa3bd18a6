// `bench prefill`: prefill tok/s of a checkpoint at several prompt lengths in one process (the
// model loads once), for the side-by-side comparison with transformers + fla (bench/gpu_vs_fla.sh).
// Each length: random ids (fixed seed), one untimed warm-up prefill, then the median of --repeat
// timed prefills, each on a fresh sequence: host clock around the forward pass (all chunks, then
// the last position's logits copied to the host, so the device work is complete).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench/bench.h"
#include "core/error.h"
#include "core/sizes.h"
#include "model/forward.h"
#include "ops/state.h"
#include "runtime/backend_factory.h"
#include "runtime/engine.h"

namespace wren::bench {

namespace {

}  // namespace

void run_prefill(PrefillArgs a) {
  const std::vector<int> lengths = parse_count_list(a.prompts, "--prompts", 1, 1 << 22, "prompt length");
  a.engine.ctx = std::max(a.engine.ctx, *std::max_element(lengths.begin(), lengths.end()) + 8);
  a.engine.cpu_fallback = false;
  a.engine.announce = false;
  const auto t0 = std::chrono::steady_clock::now();
  Engine e(a.engine);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool gpu = std::string(e.backend().name()) != "cpu";
  const std::string options = gpu ? describe(a.engine.cuda) : a.cpu_line;
  std::fprintf(stderr, "wren bench prefill: %s loaded in %.1f s; backend %s, prefill chunk %d; %s\n", e.dir().c_str(),
               load_s, e.backend().name(), e.chunk(), options.c_str());
  nlohmann::json out = {{"model", e.dir()}, {"backend", e.backend().name()}, {"load_s", load_s},
                        {"options", options},
                        {"gpu_precision", gpu ? gpu_precision_name(a.engine.cuda.precision) : "exact"},
                        {"chunk", e.chunk()}};
  const int V = e.config().vocab;
  std::vector<float> logits(V);
  if (a.profile && gpu) {  // the tensor-core ceiling of this run, for the profile's TFLOP/s column
    const double peak = gpu_bf16_peak_tflops(e.backend());
    std::printf("bf16 tensor-core peak (cuBLASLt 8192^3, this run): %.0f TFLOP/s\n", peak);
    out["bf16_peak_tflops"] = peak;
  }
  std::printf("%-8s %12s %12s\n", "tokens", "prefill_s", "tok/s");
  for (int n : lengths) {
    std::mt19937 g(uint32_t(a.seed) + uint32_t(n));
    std::vector<int> ids(n);
    for (int& id : ids) id = int(g() % unsigned(V));
    std::vector<double> t;
    for (int r = 0; r <= a.repeat; ++r) {
      auto st = e.new_sequence();
      const auto p0 = std::chrono::steady_clock::now();
      e.forward().run(*st, ids.data(), nullptr, n, logits.data(), false);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
      if (r > 0 || a.repeat == 0) t.push_back(s);  // r = 0 is the warm-up
    }
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    std::printf("%-8d %12.4f %12.1f\n", n, med, n / med);
    out["runs"].push_back({{"tokens", n}, {"prefill_s", med}, {"tok_s", n / med}, {"times_s", t}});
    if (a.profile && gpu) {  // one more prefill, every launch followed by an event (same numerics)
      auto st = e.new_sequence();
      gpu_profile_begin(e.backend());
      e.forward().run(*st, ids.data(), nullptr, n, logits.data(), false);
      double total = 0;
      const std::vector<GpuOpTime> prof = gpu_profile_end(e.backend(), &total);
      std::printf("profile, %d tokens: %.2f ms of device timeline (launch-to-launch; host-bound gaps charged to "
                  "the launch that waited)\n", n, total);
      std::printf("  %-64s %10s %7s %9s %9s\n", "launch", "ms", "%", "launches", "TFLOP/s");
      nlohmann::json pj = nlohmann::json::array();
      const double tpl = std::min(n, e.chunk());  // tokens per launch (the lengths here are chunk multiples)
      const Config& c = e.config();
      for (const GpuOpTime& op : prof) {
        // Useful FLOPs of the labels with a known shape: dense GEMMs (RxC) and the grouped experts.
        double flop = 0;
        int r = 0, cc = 0;
        if (std::sscanf(op.name.c_str(), "gemm (fast, cuBLASLt) %dx%d", &r, &cc) == 2) flop = 2.0 * r * cc * tpl * op.launches;
        // The grouped experts (moe_grouped.cu: "... gate/up grouped MMA", "... down grouped wgmma", ...).
        else if (op.name.rfind("routed_moe (fast) ", 0) == 0 && op.name.find("gate/up grouped") != std::string::npos)
          flop = 2.0 * tpl * c.top_k * 2.0 * c.moe_inter * c.expert_io() * op.launches;
        else if (op.name.rfind("routed_moe (fast) ", 0) == 0 && op.name.find("down grouped") != std::string::npos)
          flop = 2.0 * tpl * c.top_k * double(c.moe_inter) * c.expert_io() * op.launches;
        const double tf = flop > 0 && op.ms > 0 ? flop / (op.ms * 1e-3) / 1e12 : 0;
        if (op.ms >= 0.005 * total) {
          std::printf("  %-64s %10.3f %6.1f%% %9llu", op.name.c_str(), op.ms, 100 * op.ms / std::max(total, 1e-9),
                      (unsigned long long)op.launches);
          if (tf > 0) std::printf(" %9.1f", tf);
          std::printf("\n");
        }
        pj.push_back({{"name", op.name}, {"ms", op.ms}, {"launches", op.launches}, {"tflops", tf}});
      }
      out["runs"].back()["profile"] = pj;
      out["runs"].back()["profile_total_ms"] = total;
    }
  }
  if (a.also_exact > 0 && std::string(e.backend().name()) != "cpu") {
    // The exact mode on the same loaded weights (the "before" number, same run): chunk 32.
    set_backend_gpu_precision(e.backend(), GpuPrecision::Exact);
    Forward fwd(e.model(), e.backend(), ForwardOptions{32, -1});
    const int n = a.also_exact;
    std::mt19937 g(uint32_t(a.seed) + uint32_t(n));
    std::vector<int> ids(n);
    for (int& id : ids) id = int(g() % unsigned(V));
    SequenceState st(e.backend(), e.config(), n + 8);
    const auto p0 = std::chrono::steady_clock::now();
    fwd.run(st, ids.data(), nullptr, n, logits.data(), false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
    std::printf("%-8d %12.4f %12.1f   (gpu precision exact, chunk 32, one run)\n", n, s, n / s);
    out["exact"] = {{"tokens", n}, {"prefill_s", s}, {"tok_s", n / s}};
    set_backend_gpu_precision(e.backend(), a.engine.cuda.precision);
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
}

}  // namespace wren::bench
