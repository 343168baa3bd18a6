// `wren bench`: benchmarks that measure a reference in the same run (a ratio, not a bare time).
// The benchmarks themselves are src/bench/ (bench/bench.h); this file only registers their flags.
#include <cmath>
#include <cstdlib>
#include <memory>

#include "bench/bench.h"
#include "cli/commands.h"
#include "cli/cpu_flags.h"
#include "cli/run_options.h"

namespace wren::cli {

void add_bench_cpu(CLI::App* bench) {
  auto ka = std::make_shared<bench::KernelArgs>();
  CLI::App* kern = bench->add_subcommand("kernels", "GEMV/GEMM bandwidth of every weight format vs a STREAM-like copy");
  kern->add_option("--cols", ka->cols, "Columns of each matrix")->check(CLI::Range(64, 1 << 20));
  kern->add_option("--mb", ka->mb, "Weight MB per matrix (rows follow)")->check(positive());
  kern->add_option("--chunk", ka->chunk, "Tokens of the GEMM column")->check(CLI::Range(1, 256));
  kern->add_option("--reps", ka->reps, "Repetitions (best is kept)")->check(positive());
  kern->add_flag("--cpu-time", ka->cpu_time, "Time by the thread's CPU clock (with --threads 1): per-core rates on a loaded machine");
  auto ka_cpu = std::make_shared<CpuFlags>();
  ka_cpu->add_to(kern);
  kern->callback([ka, ka_cpu] {
    ka->cpu = ka_cpu->backend();
    bench::run_kernels(*ka);
  });

  auto qa = std::make_shared<bench::QualityArgs>();
  CLI::App* qual = bench->add_subcommand("quality", "Teacher-forced logits of every --quant mode vs exact f32");
  qual->add_option("--model", qa->model, "Kimi K3 snapshot folder")->required();
  qual->add_option("--positions", qa->positions, "Teacher-forced positions (with --text: the first N tokens, 0 = all)")
      ->check(non_negative());
  qual->add_option("--seed", qa->seed, "Seed of the random prompt ids");
  qual->add_option("--chunk", qa->chunk, "Prefill chunk")->check(positive())->default_str("auto");
  qual->add_option("--text", qa->text, "Teacher-force this text file's tokens instead of random ids (adds perplexity)");
  qual->add_option("--window", qa->window, "With --text: tokens per window, [BOS] included (as wren perplexity)")
      ->check(CLI::Range(2, 1 << 20));
  qual->add_flag("--per-class", qa->per_class, "Also each class alone at q8 and q4 (the rest f32)");
  auto qa_cpu = std::make_shared<CpuFlags>();
  qa_cpu->add_to(qual);
  qual->callback([qa, qa_cpu] {
    qa->cpu = qa_cpu->backend();
    bench::run_quality(*qa);
  });

  auto sa = std::make_shared<bench::SpeedArgs>();
  CLI::App* mod = bench->add_subcommand("model", "Prefill and decode tok/s of every --quant mode, exact as reference");
  mod->add_option("--model", sa->model, "Kimi K3 snapshot folder")->required();
  mod->add_option("--prompt", sa->prompt, "Prompt tokens")->check(positive());
  mod->add_option("--gen", sa->gen, "Generated tokens")->check(CLI::Range(2, 1 << 20));
  mod->add_option("--chunk", sa->chunk, "Prefill chunk")->check(positive())->default_str("auto");
  mod->add_flag("--cpu-time", sa->cpu_time, "Time by the thread's CPU clock (with --threads 1): per-core rates on a loaded machine");
  mod->add_option("--modes", sa->modes, "Presets to run, first is the reference; NAME+int8 = int8 expert activations");
  auto sa_cpu = std::make_shared<CpuFlags>();
  sa_cpu->add_to(mod);
  mod->callback([sa, sa_cpu] {
    sa->cpu = sa_cpu->backend();
    bench::run_model(*sa);
  });
}

void add_bench_experts(CLI::App* bench) {
  auto a = std::make_shared<bench::ExpertsArgs>();
  CLI::App* sub = bench->add_subcommand("experts", "Expert store vs a sequential read; decode at three cache budgets");
  sub->add_option("--model", a->model, "K3 snapshot folder with MXFP4 experts (e.g. from wren synth)")->required();
  sub->add_option("-n,--tokens", a->tokens, "Tokens to decode per budget")->check(positive());
  sub->add_option("--runs", a->runs, "Runs of each measurement (min / median)")->check(positive())->capture_default_str();
  sub->add_option("--direct", a->direct, "O_DIRECT reads: auto, on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub->callback([a] { bench::run_experts(*a); });
}

void add_bench_stream(CLI::App* bench) {
  auto a = std::make_shared<bench::StreamArgs>();
  CLI::App* sub = bench->add_subcommand(
      "stream", "Experts of K3 size streamed from disk: raw read vs prefill/decode at several budgets, prediction off/on");
  sub->add_option("--dir", a->dir, "Bench checkpoint folder (written when missing or different)")->capture_default_str();
  sub->add_option("--moe-layers", a->moe_layers, "MoE layers")->check(positive())->capture_default_str();
  sub->add_option("--experts", a->experts, "Routed experts per layer (top-16; at least 16)")->capture_default_str();
  sub->add_option("--prompt", a->prompt, "Prompt tokens")->check(positive())->capture_default_str();
  sub->add_option("-n,--tokens", a->tokens, "Tokens to decode per run")->check(positive())->capture_default_str();
  sub->add_option("--chunk", a->chunk, "Prefill chunk")->check(positive())->capture_default_str();
  sub->add_option("--runs", a->runs, "Runs per setting (min / median)")->check(positive())->capture_default_str();
  sub->add_option("--loaders", a->loaders, "Expert store loader threads")->check(positive())->capture_default_str();
  sub->add_option("--budgets", a->budgets, "Expert cache budgets, fractions of all expert bytes")->capture_default_str();
  sub->add_option("--direct", a->direct, "O_DIRECT reads: auto, on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub->add_option("--backend", a->backend, "cpu (budgets = host cache) or cuda (budgets = VRAM slots)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  sub->add_option("--host-cache", a->host_cache, "CUDA: host expert cache, fraction of all expert bytes")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--predict", a->predict, "Prediction modes run at each budget: off, on or both")
      ->check(CLI::IsMember({"off", "on", "both"}))->capture_default_str();
  auto cpu = std::make_shared<CpuFlags>();
  cpu->add_to(sub);
  sub->callback([a, cpu] {
    a->cpu = cpu->backend();
    bench::run_stream(*a);
  });
}

void add_bench_pieces(CLI::App* bench) {
  auto a = std::make_shared<bench::PiecesArgs>();
  CLI::App* sub = bench->add_subcommand(
      "pieces", "Expert store on a simulated disk: whole-expert reads vs pieces the loaders share, by compute per expert");
  sub->add_option("--dir", a->dir, "Folder of the bench file (written when missing or different)")->capture_default_str();
  sub->add_option("--gbps", a->gbps, "Simulated disk bandwidth, GB/s, shared by the reads in flight")
      ->check(CLI::Range(0.001, 100.0))->capture_default_str();
  sub->add_option("--expert-mb", a->expert_mb, "Expert size, MB")->check(CLI::Range(0.01, 256.0))->capture_default_str();
  sub->add_option("--compute-ms", a->compute_ms, "Compute per expert, ms (comma-separated list)")->capture_default_str();
  sub->add_option("--misses", a->misses, "Experts of the visit, all read")->check(CLI::Range(1, 256))->capture_default_str();
  sub->add_option("--loaders", a->loaders, "Expert store loader threads")->check(CLI::Range(1, 64))->capture_default_str();
  sub->add_option("--runs", a->runs, "Runs per setting (min / median)")->check(positive())->capture_default_str();
  sub->callback([a] { bench::run_pieces(*a); });
}

void add_bench_layers(CLI::App* bench) {
  auto a = std::make_shared<bench::LayersArgs>();
  CLI::App* sub = bench->add_subcommand("layers", "Per-layer decode time vs the memory floor, TTFT and prefill tok/s on a random in-memory model");
  sub->add_option("--backend", a->backend, "cpu, cuda or auto (default)")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_option("--preset", a->preset, "k3 (true K3 layer sizes, default), kimi-linear (48B-A3B sizes) or tiny");
  sub->add_option("--quant", a->quant, "Dense weight formats: exact (f32, default), bf16, q8, default or q4");
  sub->add_option("--kda", a->kda, "KDA layers (default 3)")->check(non_negative());
  sub->add_option("--mla", a->mla, "MLA layers after them (default 1)")->check(non_negative());
  sub->add_option("--experts", a->experts, "Routed experts per layer (default: k3 896, kimi-linear 256)")->check(positive());
  sub->add_option("--distinct-experts", a->distinct, "Distinct random experts backing them (default 64)")
      ->check(positive());
  sub->add_option("--vocab", a->vocab, "Vocabulary size (default 16384)")->check(positive());
  sub->add_option("--prompt", a->prompt, "Prefill prompt length (default 1024)")->check(positive());
  sub->add_option("--decode", a->decode, "Decode tokens timed per configuration (default 16)")->check(positive());
  sub->add_option("--chunk", a->chunk, "Prefill chunk (default: the backend's, see runtime/engine.h)")->check(positive())->default_str("auto");
  sub->add_option("--seed", a->seed, "Weight seed (default 1)");
  sub->add_option("--expert-forms", a->expert_forms,
                  "CUDA fast mode: the whole token again per decode-kernel form, mN MXFP4 experts, dN dense experts, "
                  "g0/g1 GLU and output gate as own launches/inside the GEMV (e.g. m16,m17,d1,g1; every form gives the "
                  "same bits)");
  sub->add_flag("--profile", a->profile,
                "GPU: one more decode token of the whole model op by op, with per-launch device timing per kernel "
                "(--kda 0 --mla 1 gives one MLA layer's)");
  sub->add_flag("--json", a->json, "Also print the numbers as one JSON object");
  auto cuda = std::make_shared<CudaFlags>();
  cuda->add_to(sub);
  sub->callback([a, cuda] {
    a->cuda = cuda->backend();
    bench::run_layers(*a);
  });
}

void add_bench_routing(CLI::App* bench) {
  auto a = std::make_shared<bench::RoutingArgs>();
  CLI::App* sub = bench->add_subcommand("routing", "Per-layer expert load and expert-cache hit rate vs budget on a text file");
  sub->add_option("file", a->text, "UTF-8 text file (e.g. held-out text)")->required();
  sub->add_option("--model", a->model, "Kimi K3 snapshot folder with MXFP4 experts (default: the built-in model)");
  sub->add_option("--window", a->window, "Tokens per window, [BOS] included (each window starts a fresh state)")
      ->check(CLI::Range(2, 1 << 20));
  sub->add_option("--tokens", a->tokens, "Use only the first N file tokens (0 = all)")->check(non_negative());
  sub->add_option("--budgets", a->budgets, "Expert-cache budgets, comma-separated fractions of all routed experts");
  sub->add_flag("--json", a->json, "Print one JSON object: per-layer counts and load statistics, hit rate per budget");
  auto cpu = std::make_shared<CpuFlags>();
  cpu->add_to(sub);
  sub->callback([a, cpu] {
    a->cpu = cpu->backend();
    a->plan = cpu->plan();
    bench::run_routing(*a);
  });
}

void add_bench_tokenizer(CLI::App* bench) {
  auto a = std::make_shared<bench::TokenizerArgs>();
  CLI::App* c = bench->add_subcommand("tokenizer", "Encode MB/s of Wren's tokenizer vs the tiktoken core, same corpus, same run");
  c->add_option("--model", a->model, "Tokenizer folder (tiktoken.model + tokenizer_config.json); default: full o200k_base");
  c->add_option("--corpus", a->corpus, "Text file(s) to encode (default: english, code and mixed corpora)");
  c->add_option("--mb", a->mb, "Megabytes per built-in corpus")->check(CLI::Range(0.001, 512.0))->check(
      CLI::Validator([](std::string& s) { return std::isfinite(std::strtod(s.c_str(), nullptr)) ? "" : "must be a finite number"; },
                     "FINITE"));
  c->add_option("--reps", a->reps, "Timed repetitions (best is kept)")->check(CLI::Range(1, 100));
  c->add_option("--oracle", a->oracle, "Path of tests/tokenizer/oracle.js (default: in the source tree)");
  c->add_flag("--json", a->json, "Print JSON");
  c->callback([a] { bench::run_tokenizer(*a); });
}

void add_bench_batch(CLI::App* bench);  // cmd_bench_prefill.cpp

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks with a reference measured in the same run");
  bench->require_subcommand(1);
  add_bench_experts(bench);
  add_bench_stream(bench);
  add_bench_pieces(bench);
  add_bench_layers(bench);
  add_bench_prefill(bench);
  add_bench_batch(bench);
  add_bench_serve(bench);
  add_bench_cpu(bench);
  add_bench_routing(bench);
  add_bench_tokenizer(bench);
}

}  // namespace wren::cli
