// `wren perplexity`: perplexity of a model on a text file, like llama.cpp's llama-perplexity.
// The file is tokenized (specials disabled) and cut into windows of --window tokens: each window is
// [BOS] + the next window-1 file tokens (the last window may be shorter), run from a fresh state;
// every file token is scored once, from the logits of the position before it.
// perplexity = exp(mean negative log-likelihood over the scored tokens), log-softmax in f64.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/run_options.h"
#include "core/error.h"
#include "core/nll.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace wren::cli {

namespace {

struct PerplexityArgs {
  EngineOptions engine;
  CpuFlags cpu;
  std::string file;
  int window = 256;
  bool json = false;
};

void perplexity(const PerplexityArgs& a) {
  std::error_code ec;
  check(!std::filesystem::is_directory(a.file, ec), a.file + ": is a folder (expected a UTF-8 text file)");
  std::ifstream f(a.file, std::ios::binary);
  check(bool(f), a.file + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  check(!f.bad(), a.file + ": read error");
  EngineOptions o = a.engine;
  o.plan = a.cpu.plan();
  o.cpu = a.cpu.backend();
  o.ctx = std::max(o.ctx, a.window);
  std::fprintf(stderr, "wren: %s\n", describe(o.cpu, o.plan).c_str());
  Engine e(o);
  const Config& c = e.config();
  const std::vector<int> ids = e.tokenizer().encode(text, SpecialMode::Disabled);
  check(!ids.empty(), a.file + ": no tokens (empty file)");
  const int V = c.vocab, step = a.window - 1;
  std::vector<float> logits(size_t(a.window) * V);
  std::vector<int> win;
  double nll = 0;
  long long scored = 0;
  int windows = 0, top1 = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t start = 0; start < ids.size(); start += size_t(step)) {
    const size_t n = std::min(size_t(step), ids.size() - start);
    win.assign(1, c.bos_id);
    win.insert(win.end(), ids.begin() + long(start), ids.begin() + long(start + n));
    auto st = e.new_sequence();
    e.forward().run(*st, win.data(), nullptr, int(win.size()), logits.data(), true);
    for (size_t j = 0; j + 1 < win.size(); ++j) {
      const float* lg = logits.data() + j * size_t(V);
      const double x = token_nll(lg, V, win[j + 1]);
      check(std::isfinite(x), "perplexity: non-finite log-likelihood at token " + std::to_string(start + j));
      nll += x;
      top1 += argmax(lg, V) == win[j + 1];
      ++scored;
    }
    ++windows;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ppl = std::exp(nll / double(scored));
  if (a.json) {
    const nlohmann::json j = {{"perplexity", ppl}, {"tokens", scored}, {"mean_nll", nll / double(scored)},
                              {"top1_accuracy", double(top1) / double(scored)}, {"windows", windows},
                              {"window", a.window}, {"file", a.file}, {"bytes", text.size()},
                              {"quant", o.plan.describe()}, {"backend", e.backend().name()},
                              {"seconds", secs}, {"tokens_per_s", double(scored + windows) / std::max(secs, 1e-9)}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("perplexity %.4f over %lld tokens (%d windows of up to %d; mean NLL %.4f nats; top-1 %.1f%%)\n", ppl,
                scored, windows, a.window, nll / double(scored), 100.0 * top1 / double(scored));
  }
  std::fprintf(stderr, "wren: backend %s; %.1f s, %.1f tok/s\n", e.backend().name(), secs,
               double(scored + windows) / std::max(secs, 1e-9));
}

}  // namespace

void add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* sub = app.add_subcommand("perplexity", "Perplexity of the model on a text file (like llama-perplexity)");
  sub->add_option("file", a->file, "UTF-8 text file")->required();
  sub->add_option("--model", a->engine.model_dir, "Kimi K3 snapshot folder (default: the built-in model)");
  sub->add_option("--window", a->window, "Tokens per window, [BOS] included (each window starts a fresh state)")
      ->check(CLI::Range(2, 1 << 20));
  sub->add_flag("--json", a->json, "Print one JSON object: perplexity, tokens, mean_nll, top1_accuracy, ...");
  sub->add_option("--backend", a->engine.backend, "Op backend: cpu, cuda, or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_option("--chunk", a->engine.chunk, "Prefill chunk (tokens per layer-major pass)")->check(positive())->default_str("auto");
  sub->add_option("--expert-cache", a->engine.expert_cache, "Expert cache budget, e.g. 8G, 512M");
  a->cpu.add_to(sub);
  a->engine.announce = false;
  sub->callback([a] { perplexity(*a); });
}

}  // namespace wren::cli
