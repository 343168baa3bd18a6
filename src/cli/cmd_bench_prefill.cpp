// `wren bench prefill`: the flags of bench::run_prefill (src/bench/prefill.cpp).
#include "bench/bench.h"
#include "cli/commands.h"
#include "cli/cpu_flags.h"

#include <memory>

namespace wren::cli {

void add_bench_prefill(CLI::App* bench) {
  auto a = std::make_shared<bench::PrefillArgs>();
  auto cpu = std::make_shared<CpuFlags>();
  auto cuda = std::make_shared<CudaFlags>();
  CLI::App* sub = bench->add_subcommand("prefill", "Prefill tok/s of a checkpoint at several prompt lengths (model loaded once)");
  sub->add_option("--model", a->engine.model_dir, "Snapshot folder (default: the built-in model wren-tiny)");
  sub->add_option("--backend", a->engine.backend, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_option("--prompts", a->prompts, "Comma-separated prompt lengths (default 512,4096,16384)");
  sub->add_option("--repeat", a->repeat, "Timed prefills per length after one warm-up (default 3)")->check(non_negative());
  sub->add_option("--chunk", a->engine.chunk, "Prefill chunk (default: the backend's)")->check(positive())->default_str("auto");
  sub->add_option("--vram-experts", a->engine.vram_experts, "CUDA: device memory for routed experts (default: all that fit)");
  sub->add_option("--seed", a->seed, "Seed of the random prompt ids");
  sub->add_option("--also-exact", a->also_exact, "GPU: then one exact-mode prefill of N tokens on the same weights")
      ->check(non_negative());
  sub->add_flag("--profile", a->profile,
               "GPU: after the timed runs, one more prefill per length with per-launch device timing (table by kernel)");
  cpu->add_to(sub);
  cuda->add_to(sub);
  sub->add_flag("--json", a->json, "Also print the numbers as one JSON object");
  sub->callback([a, cpu, cuda] {
    a->engine.cpu = cpu->backend();
    a->engine.cuda = cuda->backend();
    a->engine.plan = cpu->plan(gpu_fast(a->engine.backend, a->engine.cuda.precision));
    a->cpu_line = describe(a->engine.cpu, a->engine.plan);
    bench::run_prefill(*a);
  });
}

void add_bench_batch(CLI::App* bench) {
  auto a = std::make_shared<bench::BatchArgs>();
  auto cpu = std::make_shared<CpuFlags>();
  auto cuda = std::make_shared<CudaFlags>();
  CLI::App* sub = bench->add_subcommand("batch", "Batched decode step (run_mixed of B one-token sequences) at several batch sizes");
  sub->add_option("--model", a->engine.model_dir, "Snapshot folder (default: the built-in model wren-tiny)");
  sub->add_option("--backend", a->engine.backend, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_option("--batches", a->batches, "Comma-separated batch sizes (default 1,4,16)");
  sub->add_option("--prompt", a->prompt, "Prompt tokens prefilled per sequence (default 64)")->check(positive());
  sub->add_option("--steps", a->steps, "Timed decode steps per batch size (default 32)")->check(positive());
  sub->add_option("--chunk", a->engine.chunk, "Rows per forward group (default: the backend's)")->check(positive());
  sub->add_option("--vram-experts", a->engine.vram_experts, "CUDA: device memory for routed experts (default: all that fit)");
  sub->add_option("--seed", a->seed, "Seed of the random prompt ids");
  sub->add_flag("--profile", a->profile, "GPU: one more step per batch size with per-launch device timing");
  sub->add_flag("--eager", a->eager, "Also time each batch size with no step recorded (rows 'Be')");
  sub->add_flag("--record-batched", a->record_batched,
                "Also time each batch size with batched steps recorded too (rows 'Br'; by default only single-token steps are)");
  sub->add_flag("--host-draw", a->host_draw,
                "Also time each batch size with the logits copied to the host and drawn there (rows 'Bh')");
  sub->add_option("--gemv-forms", a->gemv_forms,
                  "CUDA fast mode: time every size once per tensor-core GEMV form (e.g. 0,1,4; rows 'B/fN')");
  sub->add_option("--expert-forms", a->expert_forms,
                  "CUDA fast mode: time every size once per decode-kernel form, mN MXFP4 experts, dN dense experts, g0/g1 "
                  "GLU and output gate as own launches/inside the GEMV (e.g. m0,m16,d0,d1,g0,g1; rows 'B/mN', 'B/dN', "
                  "'B/gN'; every form gives the same bits)");
  cpu->add_to(sub);
  cuda->add_to(sub);
  sub->add_flag("--json", a->json, "Also print the numbers as one JSON object");
  sub->callback([a, cpu, cuda] {
    a->engine.cpu = cpu->backend();
    a->engine.cuda = cuda->backend();
    a->engine.plan = cpu->plan(gpu_fast(a->engine.backend, a->engine.cuda.precision));
    a->cpu_line = describe(a->engine.cpu, a->engine.plan);
    bench::run_batch(*a);
  });
}

}  // namespace wren::cli
