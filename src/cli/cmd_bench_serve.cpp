// `wren bench serve`: the served throughput of one model at several client counts, side by side in
// one run. The server (server/server.h) runs in this process on a free local port; N client
// threads each send R streaming /v1/completions requests one after another over HTTP
// (cpp-httplib), greedy, a distinct prompt per request. Per client count: total completion tokens/s
// (all tokens over the wall time of the round), TTFT (client side: request sent -> first streamed
// chunk; median and max), and the routed-expert bytes read per generated token (GET /health's
// `experts` counters, Backend::expert_traffic: host-routed MoE only) — docs/serve.md.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/cpu_flags.h"
#include "cli/run_options.h"
#include "core/error.h"
#include "core/sizes.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "server/server.h"

namespace wren::cli {

namespace {

struct BenchServeArgs {
  EngineOptions engine;
  std::string clients = "1,4,16";
  int requests = 2;       ///< per client
  int max_tokens = 64;    ///< per request
  int prompt_words = 24;  ///< words of each prompt
  int max_seqs = 16;
  int max_batch_tokens = -1;  ///< -1 = max(128, max_seqs)
  std::string prefix_cache = "0";
  bool json = false;
};

using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// A prompt of `words` words that no other (client, request) shares.
std::string prompt_text(int client, int req, int words) {
  static const char* w[] = {"the", "river", "stone", "light", "north", "garden", "eleven", "quiet", "paper",
                            "engine", "window", "salt", "orange", "tower", "winter", "signal"};
  std::string s = "client " + std::to_string(client) + " request " + std::to_string(req) + ":";
  unsigned x = 2654435761u * unsigned(client * 131 + req + 7);
  for (int i = 0; i < words; ++i) {
    x = x * 1664525u + 1013904223u;
    s += std::string(" ") + w[(x >> 24) % 16];
  }
  return s;
}

struct OneRequest {
  double ttft_s = -1;
  int completion_tokens = 0, prompt_tokens = 0;
  std::string error;
};

OneRequest run_request(int port, const std::string& body) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(600, 0);
  OneRequest r;
  std::string buf;
  const auto t0 = Clock::now();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    if (r.ttft_s < 0 && buf.find("\"text\"") == std::string::npos) {
      buf.append(d, n);
      if (buf.find("\"text\"") != std::string::npos) r.ttft_s = secs(Clock::now() - t0);
      return true;
    }
    buf.append(d, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!cli.send(req, res, err)) {
    r.error = "HTTP error " + std::to_string(int(err));
    return r;
  }
  if (res.status != 200) {
    r.error = "status " + std::to_string(res.status) + ": " + buf.substr(0, 300);
    return r;
  }
  // The usage chunk: the last data line holding "usage" with a non-null value.
  std::istringstream in(buf);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: {", 0) != 0) continue;
    const nlohmann::json j = nlohmann::json::parse(line.substr(6), nullptr, false);
    if (j.is_object() && j.contains("error")) r.error = j["error"].dump();
    if (j.is_object() && j.contains("usage") && j["usage"].is_object()) {
      r.completion_tokens = j["usage"].value("completion_tokens", 0);
      r.prompt_tokens = j["usage"].value("prompt_tokens", 0);
    }
  }
  return r;
}

nlohmann::json health(int port) {
  httplib::Client cli("127.0.0.1", port);
  const auto res = cli.Get("/health");
  check(res && res->status == 200, "bench serve: GET /health failed");
  return nlohmann::json::parse(res->body);
}

void bench_serve(BenchServeArgs& a, CpuFlags& cpu, CudaFlags& cuda) {
  const std::vector<int> counts = parse_count_list(a.clients, "--clients", 1, 1024, "client count");
  const int batch_tokens = resolve_batch_tokens(a.max_seqs, a.max_batch_tokens);  // before the load
  a.engine.plan = cpu.plan(gpu_fast(a.engine.backend, cuda.precision));
  a.engine.cpu = cpu.backend();
  a.engine.cuda = cuda.backend();
  a.engine.announce = false;
  print_run_header(a.engine.backend, a.engine.cpu, a.engine.plan, a.engine.cuda);
  Engine e(a.engine);
  check(e.has_tokenizer(), "wren bench serve needs a model with a tokenizer (tiktoken.model in " + e.dir() +
                               "; bench/synth_tokenizer.py writes one for a synthetic checkpoint)");
  server::ServerOptions so;
  so.port = 0;
  so.model_id = "bench";
  so.ctx = a.engine.ctx;
  so.max_queue = 1024;
  so.log_requests = false;
  so.prefix_cache = parse_size(a.prefix_cache, "--prefix-cache");
  so.max_seqs = a.max_seqs;
  so.max_batch_tokens = batch_tokens;
  server::Server srv(e, so);
  const int port = srv.bind();
  std::thread listener([&] { srv.listen(); });
  struct Stop {
    server::Server& s;
    std::thread& t;
    ~Stop() {
      s.stop();
      t.join();
    }
  } stop{srv, listener};
  auto body = [&](int client, int req) {
    return nlohmann::json{{"model", "bench"},
                          {"prompt", prompt_text(client, req, a.prompt_words)},
                          {"max_tokens", a.max_tokens},
                          {"temperature", 0},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}}
        .dump();
  };
  {  // warm-up (first-touch of the weights, allocations)
    const OneRequest w = run_request(port, body(9999, 0));
    check(w.error.empty(), "bench serve: the warm-up request failed: " + w.error);
  }
  std::fprintf(stderr, "wren bench serve: %s, backend %s, --max-seqs %d, --max-batch-tokens %d, %d requests x %d tokens per client\n",
               e.dir().c_str(), e.backend().name(), so.max_seqs, so.max_batch_tokens, a.requests, a.max_tokens);
  nlohmann::json rows = nlohmann::json::array();
  double base = 0;
  std::printf("| clients | total tok/s | vs 1 client | TTFT p50 | TTFT max | expert MB / decode token | expert MB / generated token (prefill incl.) | prompt tok/req |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int c : counts) {
    const nlohmann::json h0 = health(port);
    std::vector<std::vector<OneRequest>> res(static_cast<size_t>(c));
    const auto t0 = Clock::now();
    std::vector<std::thread> th;
    for (int k = 0; k < c; ++k)
      th.emplace_back([&, k] {
        for (int r = 0; r < a.requests; ++r) res[size_t(k)].push_back(run_request(port, body(c * 1000 + k, r)));
      });
    for (auto& t : th) t.join();
    const double wall = secs(Clock::now() - t0);
    const nlohmann::json h1 = health(port);
    long long tokens = 0, prompt = 0, n = 0;
    std::vector<double> ttft;
    for (const auto& v : res)
      for (const OneRequest& r : v) {
        check(r.error.empty(), "bench serve: a request failed: " + r.error);
        tokens += r.completion_tokens, prompt += r.prompt_tokens, ++n;
        ttft.push_back(r.ttft_s);
      }
    std::sort(ttft.begin(), ttft.end());
    const double tps = double(tokens) / wall;
    if (base == 0) base = tps;
    auto delta = [&](const char* k) { return double(h1["experts"][k].get<uint64_t>() - h0["experts"][k].get<uint64_t>()); };
    const double eb = delta("bytes"), gt = delta("generated_tokens");
    const double db = delta("decode_step_bytes"), dt = delta("decode_step_tokens");
    const double mb_per_tok = gt > 0 ? eb / gt / 1e6 : 0, mb_per_dec = dt > 0 ? db / dt / 1e6 : 0;
    std::printf("| %d | %.1f | %.2fx | %.3f s | %.3f s | %.3f | %.3f | %.0f |\n", c, tps, tps / base, ttft[ttft.size() / 2],
                ttft.back(), mb_per_dec, mb_per_tok, double(prompt) / double(n));
    std::fflush(stdout);
    rows.push_back({{"clients", c}, {"tok_s", tps}, {"ratio", tps / base}, {"ttft_p50_s", ttft[ttft.size() / 2]},
                    {"ttft_max_s", ttft.back()}, {"expert_bytes_per_token", gt > 0 ? eb / gt : 0},
                    {"expert_bytes_per_decode_token", dt > 0 ? db / dt : 0},
                    {"completion_tokens", tokens}, {"wall_s", wall}});
  }
  std::printf("(expert bytes: routed-expert weights visited by the host-routed MoE; per decode token = over the "
              "steps without prefill rows; per generated token = all traffic, prefill included; 0 where the MoE "
              "runs routed on the device)\n");
  if (a.json) std::printf("%s\n", nlohmann::json{{"bench", "serve"}, {"rows", rows}}.dump().c_str());
}

}  // namespace

void add_bench_serve(CLI::App* bench) {
  auto a = std::make_shared<BenchServeArgs>();
  auto cpu = std::make_shared<CpuFlags>();
  auto cuda = std::make_shared<CudaFlags>();
  CLI::App* sub = bench->add_subcommand(
      "serve", "Served total tok/s, TTFT and expert bytes per token at several client counts (in-process server, HTTP clients)");
  sub->add_option("--model", a->engine.model_dir, "Snapshot folder with a tokenizer (default: the built-in model)");
  sub->add_option("--backend", a->engine.backend, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_option("--clients", a->clients, "Comma-separated concurrent client counts (default 1,4,16)");
  sub->add_option("--requests", a->requests, "Requests per client, one after another (default 2)")->check(positive());
  sub->add_option("--max-tokens", a->max_tokens, "max_tokens of each request (default 64)")->check(positive());
  sub->add_option("--prompt-words", a->prompt_words, "Words per prompt (default 24)")->check(positive());
  sub->add_option("--max-seqs", a->max_seqs, "The server's --max-seqs (default 16)")->check(positive());
  sub->add_option("--max-batch-tokens", a->max_batch_tokens, "The server's --max-batch-tokens (default max(128, --max-seqs))")
      ->check(non_negative());
  sub->add_option("--prefix-cache", a->prefix_cache, "The server's --prefix-cache (default 0: every prompt prefilled)");
  sub->add_option("--ctx", a->engine.ctx, "Context per sequence (default 4096)")->check(positive());
  sub->add_option("--chunk", a->engine.chunk, "Tokens per layer-major pass (default: the backend's)")->check(positive())->default_str("auto");
  sub->add_option("--vram-experts", a->engine.vram_experts, "CUDA: device memory for routed experts (default: all that fit)");
  cpu->add_to(sub);
  cuda->add_to(sub);
  sub->add_flag("--json", a->json, "Also print the numbers as one JSON object");
  sub->callback([a, cpu, cuda] { bench_serve(*a, *cpu, *cuda); });
}

}  // namespace wren::cli
