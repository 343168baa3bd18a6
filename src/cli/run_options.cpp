// Flags shared by `wren run` and `wren chat`.
#include "cli/run_options.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "core/sizes.h"
#include "runtime/backend_factory.h"
#include "runtime/vram_tier.h"

#include <cstdio>
#include <unistd.h>
#include <map>
#include <string>

namespace wren::cli {

std::string describe_gpu(Engine& e, const EngineOptions& o) {
  (void)o;
  const std::string stages = e.stages_line();  // --pipeline (docs/parallel.md)
  if (std::string(e.backend().name()) == "cpu") return stages;
  return "prefill chunk " + std::to_string(e.chunk()) + (stages.empty() ? "" : "\nwren: " + stages);
}

void CommonArgs::add_to(CLI::App* sub, float default_temperature) {
  sampling.temperature = default_temperature;
  sub->add_option("--model", engine.model_dir, "Kimi K3 snapshot folder (default: the built-in model wren-tiny)");
  sub->add_option("-n,--max-tokens", n, "Tokens to generate at most")->check(non_negative());
  sub->add_option("--temperature", sampling.temperature, "Sampling temperature (0 = greedy)")->check(non_negative());
  sub->add_option("--top-p", sampling.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--top-k", sampling.top_k, "Sample from the k most likely tokens (0 = all)")->check(non_negative());
  sub->add_option("--seed", sampling.seed, "Random seed for sampling");
  sub->add_option("--system", system, "System message (chat format; --system \"\" renders an empty one)");
  sub->add_flag("--think,!--no-think", think, "Thinking on (default) or off (chat format)");
  sub->add_option("--effort", effort, "Thinking effort, rendered as the encoder's thinking-effort system message")
      ->check(CLI::IsMember({"low", "high", "max"}))
      ->capture_default_str();
  sub->add_option("--expert-cache", engine.expert_cache, "Expert cache budget, e.g. 8G, 512M (default: from available RAM)");
  sub->add_option("--direct", engine.direct, "O_DIRECT expert reads: auto, on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub->add_option("--predict", engine.predict,
                  "Expert prediction: read the next MoE layer's guessed experts while this layer computes (timing only)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--vram-experts", engine.vram_experts,
                  "CUDA: device memory for routed experts, e.g. 2G, 500M, all (default: all that fit)");
  sub->add_option("--chunk", engine.chunk, "Prefill chunk (tokens per layer-major pass)")->check(positive())->default_str("auto");
  sub->add_option("--backend", engine.backend, "Op backend: cpu, cuda, or auto (cuda when built in and a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_flag("--cpu-fallback,!--no-cpu-fallback", engine.cpu_fallback,
                "On a GPU failure, say so and continue on the CPU (default) or stop with the error");
  sub->add_flag("--strict", engine.strict,
                "Fail instead of taking a backend's slow fallback (e.g. CUDA routing the MoE on the host)");
  cpu.add_to(sub);
  cuda.add_to(sub);
  sub->add_flag("--check-finite", engine.check_finite,
                "Check every layer's output for NaN/Inf and name the first layer that produced one (slower)");
  sub->add_option("--ctx", engine.ctx, "Context capacity in tokens (MLA cache size)")->check(positive());
  sub->add_option("--pipeline", engine.pipeline,
                  "Pipeline stages in this process, each on its own backend: N (split by --pipeline-split) or "
                  "layers per stage, e.g. 3+2+1 (docs/parallel.md)");
  sub->add_option("--pipeline-split", engine.pipeline_split, "How --pipeline N splits the layers: even or bytes")
      ->check(CLI::IsMember({"even", "bytes"}))
      ->capture_default_str();
  sub->add_option("--stage-gpus", engine.gpus, "CUDA devices of the --pipeline stages, e.g. 0,1 (stage s on entry s)")
      ->delimiter(',');
  sub->add_option("--gpus", gpus,
                  "Multi-process pipeline: one rank per listed CUDA device, e.g. 0,1, linked by NCCL (docs/parallel.md)")
      ->delimiter(',');
  sub->add_option("--nccl-id-file", engine.nccl_id_file,
                  "Where the pipeline ranks meet (rank 0 writes NCCL's id there; --gpus makes a fresh one)");
  sub->add_option("--expert-parallel", engine.expert_parallel,
                  "Shard each MoE layer's routed experts over N ranks (CPU threads of this process), or experts "
                  "per rank, e.g. 1+3+12 (docs/parallel.md)");
  sub->add_flag("--quiet", quiet, "No load-progress line on stderr (it is shown only when stderr is a terminal)");
}

ChatOptions chat_options(const CommonArgs& a) {
  ChatOptions o;
  o.thinking = a.think;
  o.effort = a.effort;
  return o;
}

EngineOptions CommonArgs::engine_options() const {
  EngineOptions o = engine;
  o.progress = !quiet && isatty(STDERR_FILENO);
  o.cuda = cuda.backend();
  o.plan = cpu.plan(gpu_fast(o.backend, o.cuda.precision));
  o.cpu = cpu.backend();
  check(gpus.empty() || under_launcher(), "--gpus: only `wren run` starts pipeline ranks (or run under a launcher "
                                          "that sets RANK and WORLD_SIZE)");
  apply_rank_env(o, gpus);  // a rank of --gpus or of an outside launcher (RANK / WORLD_SIZE)
  print_run_header(o.backend, o.cpu, o.plan, o.cuda, o.strict, o.predict == "on");
  return o;
}

void print_stats(const GenerateStats& s, Engine& e) {
  if (ExpertStore* st = e.store()) {
    const ExpertStoreStats& x = st->stats();
    std::fprintf(stderr, "wren: experts: %llu hits, %llu misses (hit rate %.1f%%), %.1f MB read, I/O wait %.3f s, expert compute %.3f s\n",
                 (unsigned long long)x.hits, (unsigned long long)x.misses, 100 * x.hit_rate(), x.bytes_read / 1e6,
                 x.wait_s, x.compute_s);
    if (x.guessed_needed || x.prefetch_issued)
      std::fprintf(stderr, "wren: prediction: recall %.1f%% of %llu needed experts; prefetch %llu read, %llu used (%llu late), %llu evicted unused, %llu failed\n",
                   100 * x.recall(), (unsigned long long)x.guessed_needed, (unsigned long long)x.prefetch_issued,
                   (unsigned long long)x.prefetch_used, (unsigned long long)x.prefetch_late,
                   (unsigned long long)x.prefetch_wasted, (unsigned long long)x.prefetch_failed);
    if (!x.last_prefetch_error.empty())
      std::fprintf(stderr, "wren: a prefetch read failed (read again on demand): %s\n", x.last_prefetch_error.c_str());
  }
  if (VramTierStats v; vram_tier_stats(e.backend(), &v)) {
    std::fprintf(stderr, "wren: VRAM expert tier: %llu slots, %llu hits, %llu misses (hit rate %.1f%%), %.3f GB copied host -> device (%.3f GB by prefetch)\n",
                 (unsigned long long)v.slots, (unsigned long long)v.hits, (unsigned long long)v.misses,
                 100 * v.hit_rate(), (v.demand_bytes + v.prefetch_bytes) / 1e9, v.prefetch_bytes / 1e9);
    if (v.guess_needed || v.prefetch_copied)
      std::fprintf(stderr, "wren: VRAM prediction: recall %.1f%% of %llu needed experts; %llu guesses copied, %llu used, %llu evicted unused, %llu failed reads, %llu left on disk\n",
                   100 * v.recall(), (unsigned long long)v.guess_needed, (unsigned long long)v.prefetch_copied,
                   (unsigned long long)v.prefetch_used, (unsigned long long)v.prefetch_wasted,
                   (unsigned long long)v.prefetch_failed, (unsigned long long)v.not_held);
  }
  if (const uint64_t n = e.backend().fallbacks(); n != 0)
    std::fprintf(stderr, "wren: %llu slow fallbacks of the %s backend (see the first one above)\n", (unsigned long long)n,
                 e.backend().name());
  const int decoded = s.generated_tokens > 1 ? s.generated_tokens - 1 : 0;
  const std::string cached = s.cached_tokens ? " (" + std::to_string(s.cached_tokens) + " from the prefix cache)" : "";
  // The prefill rate counts the tokens actually prefilled (a cached prefix is restored, not computed).
  const int fresh = s.prompt_tokens - s.cached_tokens;
  char rate[64] = "none (all cached)";
  if (fresh > 0) std::snprintf(rate, sizeof rate, "%.1f tok/s", fresh / std::max(s.prefill_s, 1e-9));
  std::fprintf(stderr,
               "wren: backend %s; %d prompt token%s%s, prefill %s, TTFT %.3f s; %d generated, decode %.1f tok/s; peak RSS %.1f MB\n",
               e.forward().on_fallback() ? "cpu (fallback after a GPU failure)" : e.backend().name(), s.prompt_tokens,
               s.prompt_tokens == 1 ? "" : "s", cached.c_str(), rate, s.ttft_s, s.generated_tokens,
               decoded ? decoded / std::max(s.decode_s, 1e-9) : 0.0, peak_rss_bytes() / 1e6);
}

}  // namespace wren::cli
