// `wren serve`: an OpenAI-compatible HTTP server (chat and text completions, streaming or not)
// over one loaded model; requests join a batched decode in arrival order (docs/serve.md).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/cpu_flags.h"
#include "cli/run_options.h"
#include "core/error.h"
#include "core/sizes.h"
#include "runtime/scheduler.h"
#include "server/server.h"

namespace wren::cli {

namespace {

struct ServeArgs {
  std::string replay_file;  ///< hidden test flag --replay-ids
  std::string api_key_file;
  std::string prefix_cache = "1G";  ///< --prefix-cache
  int max_seqs = 0;                 ///< --max-seqs (0 = 16)
  int max_batch_tokens = -1;        ///< --max-batch-tokens (-1 = max(128, max_seqs); 0 = no budget)
  EngineOptions engine;
  CpuFlags cpu;  ///< the same CPU engine flags as `wren run` (threads, --isa, --quant, --mx-act)
  CudaFlags cuda;  ///< and the same CUDA ones (--cuda-kda ...)
  bool quiet = false;  ///< --quiet: no load-progress line
  server::ServerOptions server;
};

/// The id clients use in `model`: the snapshot folder's name (the built-in model: "wren-tiny",
/// as `wren run` and `inspect` call it), or "wren-default" for a folder without a name.
std::string model_id(const std::string& dir) {
  if (dir.empty()) return "wren-default";
  const std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  const std::string name = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
  return name.empty() ? "wren-default" : name;
}

std::atomic<bool> g_stop{false};  // set by SIGINT/SIGTERM
void on_stop_signal(int) { g_stop = true; }

/// Watches for SIGINT/SIGTERM on its own thread and stops the server (a handler plus polling, so
/// it works whichever thread the signal lands on, sanitizer threads included).
class SignalStopper {
 public:
  explicit SignalStopper(server::Server& s) {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    thread_ = std::thread([this, &s] {
      while (!quit_ && !g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (g_stop) {
        std::fprintf(stderr, "wren serve: stopping\n");
        s.stop();
      }
    });
  }
  ~SignalStopper() {
    quit_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> quit_{false};
  std::thread thread_;
};

void serve(ServeArgs& a) {
  signal(SIGPIPE, SIG_IGN);                   // a client that hangs up is a failed write, not a crash
  // Batched decode is bit-identical to solo runs on the CPU and in CUDA exact mode (Batched.*,
  // CudaBatched.*, run 22-serve); CUDA fast mode is within its own tolerance (docs/serve.md).
  a.server.max_seqs = a.max_seqs > 0 ? a.max_seqs : 16;
  a.server.max_batch_tokens = resolve_batch_tokens(a.server.max_seqs, a.max_batch_tokens);  // before the load
  a.engine.cpu = a.cpu.backend();
  a.engine.cuda = a.cuda.backend();
  a.engine.plan = a.cpu.plan(gpu_fast(a.engine.backend, a.engine.cuda.precision));
  print_run_header(a.engine.backend, a.engine.cpu, a.engine.plan, a.engine.cuda);
  a.engine.progress = !a.quiet && isatty(STDERR_FILENO);
  Engine e(a.engine);
  if (const std::string g = describe_gpu(e, a.engine); !g.empty()) std::fprintf(stderr, "wren: %s\n", g.c_str());
  check(e.has_tokenizer(), "wren serve needs a model with a tokenizer (tiktoken.model in " + e.dir() + ")");
  a.server.model_id = model_id(e.dir());  // the folder loaded (no --model: the built-in one's)
  if (!a.api_key_file.empty()) {
    std::ifstream f(a.api_key_file);
    check(bool(f), "--api-key-file: cannot read " + a.api_key_file);
    std::getline(f, a.server.api_key);
    while (!a.server.api_key.empty() && std::isspace((unsigned char)a.server.api_key.back())) a.server.api_key.pop_back();
    check(!a.server.api_key.empty(), "--api-key-file " + a.api_key_file + ": the first line (the key) is empty");
  }
  if (!a.replay_file.empty()) {
    std::ifstream f(a.replay_file);
    check(bool(f), "--replay-ids: cannot read " + a.replay_file);
    try {
      a.server.replay = nlohmann::json::parse(f).get<std::vector<std::vector<int>>>();
    } catch (const nlohmann::json::exception& e) {
      throw Error("--replay-ids " + a.replay_file + ": expected a JSON list of lists of token ids (" + e.what() + ")");
    }
    for (const auto& ids : a.server.replay)
      for (int id : ids) check(id >= 0 && id < e.config().vocab, "--replay-ids: id " + std::to_string(id) + " outside the vocabulary");
    std::fprintf(stderr, "wren serve: TEST MODE: replaying %zu id lists from %s instead of running the model\n",
                 a.server.replay.size(), a.replay_file.c_str());
  }
  a.server.ctx = a.engine.ctx;
  a.server.prefix_cache = parse_size(a.prefix_cache, "--prefix-cache");
  server::Server s(e, a.server);
  const int port = s.bind();
  SignalStopper stopper(s);
  std::fprintf(stderr, "wren serve: model '%s', listening on http://%s:%d\n", a.server.model_id.c_str(),
               a.server.host.c_str(), port);
  std::fflush(stderr);
  s.listen();
}

}  // namespace

void add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)");
  sub->add_option("--model", a->engine.model_dir, "Kimi K3 snapshot folder (default: the built-in model wren-tiny)");
  sub->add_option("--host", a->server.host, "Address to listen on (default 127.0.0.1)");
  sub->add_option("--port", a->server.port, "Port to listen on (0 = any free port; default 8000)")->check(CLI::Range(0, 65535));
  sub->add_option("--expert-cache", a->engine.expert_cache, "Expert cache budget, e.g. 8G, 512M (default: from available RAM)");
  sub->add_option("--direct", a->engine.direct, "O_DIRECT expert reads: auto, on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub->add_option("--vram-experts", a->engine.vram_experts,
                  "CUDA: device memory for routed experts, e.g. 2G, 500M, all (default: all that fit)");
  sub->add_option("--chunk", a->engine.chunk, "Prefill chunk (tokens per layer-major pass)")->check(positive())->default_str("auto");
  sub->add_option("--ctx", a->engine.ctx, "Context limit per request in tokens (prompt + max_tokens)")->check(positive());
  sub->add_option("--backend", a->engine.backend, "Op backend: cpu, cuda, or auto (cuda when built in and a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_flag("--cpu-fallback,!--no-cpu-fallback", a->engine.cpu_fallback,
                "On a GPU failure, say so and continue on the CPU (default) or stop with the error");
  a->cpu.add_to(sub);
  a->cuda.add_to(sub);
  sub->add_flag("--quiet", a->quiet, "No load-progress line on stderr (it is shown only when stderr is a terminal)");
  sub->add_flag("--check-finite", a->engine.check_finite,
                "Check every layer's output for NaN/Inf and name the first layer that produced one (slower)");
  sub->add_option("--prefix-cache", a->prefix_cache,
                  "Host memory for prefix-cache snapshots of the sequence state, e.g. 1G, 256M; 0 = off (default 1G)");
  sub->add_option("--prefix-interval", a->server.prefix_interval,
                  "Snapshot a prompt every this many tokens for the prefix cache (default 256)")
      ->check(positive());
  sub->add_option("--max-seqs", a->max_seqs,
                  "Sequences decoded together, one batched step at a time (default 16)")
      ->check(positive())
      ->default_str("16");
  sub->add_option("--max-batch-tokens", a->max_batch_tokens,
                  "Rows per step: the running decodes (one each) plus new prompts' prefill chunks, oldest first "
                  "(default max(128, --max-seqs); 0 = no budget)")
      ->check(non_negative())
      ->default_str("max(128, --max-seqs)");
  sub->add_option("--max-queue", a->server.max_queue, "Requests allowed to wait behind the running one (503 beyond)")
      ->check(positive());
  sub->add_option("--max-body", a->server.max_body, "Largest request body in bytes (413 beyond; default 1 MiB)")
      ->check(positive());
  sub->add_option("-n,--max-tokens", a->server.default_max_tokens, "max_tokens when a request gives none (default 256)")
      ->check(positive());
  auto* key = sub->add_option("--api-key", a->server.api_key,
                              "Require 'Authorization: Bearer KEY' on every route but /health (401 otherwise)");
  sub->add_option("--api-key-file", a->api_key_file, "Read the API key from the first line of this file")->excludes(key);
  sub->add_flag("--log-requests,!--no-log-requests", a->server.log_requests,
                "One line per request on stderr: route, status, tokens, TTFT, duration (default on)");
  // Test hook (tests/serve_test.cpp): hidden from --help (empty group).
  sub->add_option("--replay-ids", a->replay_file, "JSON [[ids...], ...]: request k replays list k mod n")->group("");
  sub->callback([a] { serve(*a); });
}

}  // namespace wren::cli
