// `wren run`: prefill a prompt and greedily generate, with the validation hooks of spec §8.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/cpu_flags.h"
#include "runtime/f32_file.h"
#include "core/error.h"
#include "runtime/generate.h"

namespace wren::cli {

namespace {

struct RunArgs {
  std::string model, ids, trace, logits, x0, dump_dir;
  int n = 16, layers = -1, dump_layer = -1, dump_token = 0, chunk = 32, ctx = 4096;
  bool json = false;
  CpuFlags cpu;
};

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int v = std::stoi(item, &used);
      check(used == item.size(), "");
      out.push_back(v);
    } catch (...) {
      throw Error("--ids: '" + item + "' is not an integer token id (expected e.g. --ids 4096,976,2328)");
    }
  }
  check(!out.empty(), "--ids: no token ids given");
  return out;
}

void run(const RunArgs& a) {
  check(!a.ids.empty(), "no prompt: give --ids (text prompts arrive with the tokenizer)");
  const std::vector<int> prompt = parse_ids(a.ids);
  const QuantPlan plan = a.cpu.plan();
  const CpuOptions bo = a.cpu.backend();
  auto model = load_model(a.model, plan);
  const Config& c = model->config;
  const int T = int(prompt.size());
  CpuBackend be(bo);
  std::fprintf(stderr, "wren: %s; chunk %d\n", describe(bo, plan).c_str(), a.chunk);
  Forward fwd(*model, be, {a.chunk, a.layers});
  SequenceState st(be, c, std::max(a.ctx, T + a.n));

  std::vector<float> x0, trace, logits, dump;
  GenerateOptions opts;
  opts.max_new_tokens = a.n;
  opts.stop_ids = c.eos_ids;
  ForwardHooks hooks;
  if (!a.x0.empty()) {
    x0 = read_f32(a.x0, size_t(T) * c.hidden, "--x0 (f32 [T, D] with T = " + std::to_string(T) +
                                                  ", D = " + std::to_string(c.hidden) + ")");
    opts.x0 = x0.data();
  }
  if (!a.trace.empty()) {
    trace.resize(size_t(T) * fwd.layers_run() * c.hidden);
    hooks.trace = trace.data();
  }
  if (!a.logits.empty()) {
    logits.resize(size_t(T) * c.vocab);
    opts.prompt_logits = logits.data();
  }
  if (a.dump_layer >= 0) {
    check(a.dump_layer < fwd.layers_run(), "--dump-layer " + std::to_string(a.dump_layer) + " is not a layer that runs");
    check(a.dump_token >= 0 && a.dump_token < T, "--dump-token must be a prompt position in [0, " + std::to_string(T) + ")");
    check(!a.dump_dir.empty(), "--dump-layer needs --dump-dir DIR");
    dump.resize(5 * size_t(c.hidden));
    hooks.dump = dump.data();
    hooks.dump_layer = a.dump_layer;
    hooks.dump_token = a.dump_token;
  }
  opts.hooks = &hooks;

  GenerateStats stats;
  const std::vector<int> out = generate_greedy(fwd, st, prompt, opts, &stats);

  if (!trace.empty()) write_f32(a.trace, trace);
  if (!logits.empty()) write_f32(a.logits, logits);
  if (!dump.empty()) {
    std::filesystem::create_directories(a.dump_dir);
    const char* names[5] = {"nrm_attn", "att", "nrm_mlp", "mlp", "hidden"};
    for (int i = 0; i < 5; ++i)
      write_f32(a.dump_dir + "/" + names[i] + ".f32",
                std::vector<float>(dump.begin() + i * c.hidden, dump.begin() + (i + 1) * c.hidden));
  }
  if (a.json) {
    nlohmann::json j = {{"prompt_ids", prompt}, {"output_ids", out}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n");
  }
  std::fprintf(stderr, "wren: %d prompt tokens, prefill %.1f tok/s; %d generated, decode %.1f tok/s\n",
               stats.prompt_tokens, stats.prompt_tokens / std::max(stats.prefill_s, 1e-9),
               stats.generated_tokens,
               stats.generated_tokens > 1 ? (stats.generated_tokens - 1) / std::max(stats.decode_s, 1e-9) : 0.0);
}

}  // namespace

void add_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Run a prompt through the model and generate greedily");
  sub->add_option("--model", a->model, "Kimi K3 snapshot folder")->required();
  sub->add_option("--ids", a->ids, "Prompt token ids, comma-separated (e.g. 4096,976,2328)");
  sub->add_option("-n,--max-tokens", a->n, "Tokens to generate")->check(CLI::NonNegativeNumber);
  sub->add_flag("--json", a->json, "Print {\"prompt_ids\", \"output_ids\"} as one JSON object");
  sub->add_option("--trace", a->trace, "Write f32 [T, L, D]: P after each layer, token-major");
  sub->add_option("--logits", a->logits, "Write f32 [T, V]: teacher-forced logits at every prompt position");
  sub->add_option("--x0", a->x0, "Read f32 [T, D] rows replacing the prompt embeddings");
  sub->add_option("--layers", a->layers, "Run only the first N layers")->check(CLI::PositiveNumber);
  sub->add_option("--dump-layer", a->dump_layer, "Layer whose five vectors are dumped")->check(CLI::NonNegativeNumber);
  sub->add_option("--dump-token", a->dump_token, "Prompt position to dump (default 0)");
  sub->add_option("--dump-dir", a->dump_dir, "Folder for nrm_attn/att/nrm_mlp/mlp/hidden .f32 files");
  sub->add_option("--chunk", a->chunk, "Prefill chunk (tokens per layer-major pass)")->check(CLI::PositiveNumber);
  sub->add_option("--ctx", a->ctx, "Context capacity in tokens (MLA cache size)")->check(CLI::PositiveNumber);
  a->cpu.add_to(sub);
  sub->callback([a] { run(*a); });
}

}  // namespace wren::cli
