// `wren run`: one prompt (raw text, a chat message, or token ids) through the model, streaming the
// reply, with the validation hooks of docs/model.md#validation-hooks.
#include <unistd.h>

#include <cstdio>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/run_options.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/sizes.h"
#include "runtime/backend_factory.h"
#include "runtime/vram_tier.h"
#include "runtime/chat_format.h"
#include "runtime/f32_file.h"
#include "tokenizer/stream_decoder.h"

namespace wren::cli {

namespace {

struct RunArgs {
  CommonArgs common;
  std::string prompt, ids, trace, logits, x0, dump_dir;
  int dump_layer = -1, dump_token = 0;
  bool json = false, chat = false;
  bool has_prompt = false;  ///< the positional prompt was given (possibly "": an empty prompt is valid)
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

/// The prompt ids: --ids as given; raw text as [BOS] + text (docs/model.md#decisions, item 1); --chat as XTML.
std::vector<int> prompt_ids(const RunArgs& a, Engine& e) {
  if (!a.has_prompt) return parse_ids(a.ids);
  std::string text = a.prompt;
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), {});
  const Tokenizer& tok = e.tokenizer();
  if (!a.chat) {
    std::vector<int> ids{e.config().bos_id};
    const std::vector<int> body = tok.encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }
  const ChatFormat fmt(tok);
  std::vector<ChatMessage> msgs;
  if (a.common.system) msgs.push_back({"system", *a.common.system, ""});
  msgs.push_back({"user", text, ""});
  return fmt.prompt(msgs, chat_options(a.common));
}

/// Streams decoded text: the answer to stdout; in chat mode the think channel to stderr (dimmed
/// on a terminal), so the reasoning is shown apart from the answer.
struct Printer {
  const Tokenizer* tok = nullptr;
  std::unique_ptr<StreamDecoder> text, reasoning;
  std::unique_ptr<ReplyParser> parser;
  std::unique_ptr<ChatFormat> fmt;
  bool quiet = false, dim = false, in_reasoning = false;
  std::string answer, thought;

  void push(int id) {
    if (!tok) return;
    ReplyParser::Channel ch = parser ? parser->push(id) : ReplyParser::Channel::Response;
    if (!parser && std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) return;
    if (ch == ReplyParser::Channel::Think) {
      const std::string s = reasoning->push(id);
      if (!quiet && thought.empty() && !dim) std::fputs("[thinking] ", stderr);  // labelled when not dimmed
      thought += s;
      if (!quiet) std::fprintf(stderr, "%s%s%s", dim ? "\033[2m" : "", s.c_str(), dim ? "\033[0m" : "");
    } else if (ch == ReplyParser::Channel::Response) {
      const std::string s = text->push(id);
      answer += s;
      if (!quiet) std::fputs(s.c_str(), stdout), std::fflush(stdout);
    }
  }
  void finish() {
    if (!tok) return;
    answer += text->finish();
    thought += reasoning->finish();
    if (!quiet && !thought.empty()) std::fputs("\n", stderr);  // the statistics start on a line of their own
    if (!quiet) std::fputs("\n", stdout), std::fflush(stdout);  // before the stderr statistics
  }
  std::vector<int> stop_ids;
};

std::atomic<bool> g_run_cancel{false};
/// First Ctrl-C: stop after the current token (the reply so far and the statistics line are
/// printed); the handler then resets itself, so a second Ctrl-C ends the process at once.
void on_run_sigint(int) {
  g_run_cancel = true;
  signal(SIGINT, SIG_DFL);
}

void run(RunArgs& a) {
  // One rule with the server: an empty text is a valid prompt (raw: just [BOS]; --chat: an empty
  // user message); giving neither a prompt nor --ids, or both, is an error, found before loading.
  check(a.has_prompt != !a.ids.empty(), "give either a text prompt or --ids, not both and not neither");
  const std::string& pipe = a.common.engine.pipeline;
  const bool one_stage = (pipe.empty() || pipe == "1") && a.common.gpus.empty();
  usage_check(one_stage || (a.trace.empty() && a.dump_layer < 0),
              "--trace and --dump-layer need a single stage (drop --pipeline " + pipe + " / --gpus)");
  Engine e(a.common.engine_options());
  if (const std::string g = describe_gpu(e, a.common.engine); !g.empty()) std::fprintf(stderr, "wren: %s\n", g.c_str());
  if (e.is_worker()) return e.run_worker();  // ranks 1..: serve rank 0's steps (docs/parallel.md)
  const Config& c = e.config();
  const std::vector<int> prompt = prompt_ids(a, e);
  const int T = int(prompt.size());
  auto st = e.new_sequence();

  std::vector<float> x0, trace, logits, dump;
  GenerateOptions opts;
  opts.max_new_tokens = a.common.n;
  opts.stop_ids = c.eos_ids;
  opts.sampling = a.common.sampling;
  opts.hash_logits = a.json;
  ForwardHooks hooks;
  if (!a.x0.empty()) {
    x0 = read_f32(a.x0, size_t(T) * c.hidden, "--x0 (f32 [T, D] with T = " + std::to_string(T) +
                                                  ", D = " + std::to_string(c.hidden) + ")");
    opts.x0 = x0.data();
  }
  if (!a.trace.empty()) {
    trace.resize(size_t(T) * e.forward().layers_run() * c.hidden);
    hooks.trace = trace.data();
  }
  if (!a.logits.empty()) {
    logits.resize(size_t(T) * c.vocab);
    opts.prompt_logits = logits.data();
  }
  if (a.dump_layer >= 0) {
    check(a.dump_layer < e.forward().layers_run(), "--dump-layer " + std::to_string(a.dump_layer) + " is not a layer that runs");
    check(a.dump_token >= 0 && a.dump_token < T, "--dump-token must be a prompt position in [0, " + std::to_string(T) + ")");
    check(!a.dump_dir.empty(), "--dump-layer needs --dump-dir DIR");
    dump.resize(5 * size_t(c.hidden));
    hooks.dump = dump.data();
    hooks.dump_layer = a.dump_layer;
    hooks.dump_token = a.dump_token;
  }
  opts.hooks = &hooks;

  Printer pr;
  const bool text_mode = a.ids.empty();
  if (text_mode) {
    pr.tok = &e.tokenizer();
    pr.text = std::make_unique<StreamDecoder>(*pr.tok);
    pr.reasoning = std::make_unique<StreamDecoder>(*pr.tok);
    pr.quiet = a.json;
    pr.dim = isatty(STDERR_FILENO);
    pr.stop_ids = c.eos_ids;
    if (a.chat) {
      pr.fmt = std::make_unique<ChatFormat>(*pr.tok);
      pr.parser = std::make_unique<ReplyParser>(*pr.fmt, a.common.think);
    }
  }
  GenerateStats stats;
  opts.cancel = &g_run_cancel;
  struct sigaction sa {};
  sa.sa_handler = on_run_sigint;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  const std::vector<int> out = generate(e.forward(), *st, prompt, opts, &stats, [&](int id) { pr.push(id); });
  signal(SIGINT, SIG_DFL);
  pr.finish();
  if (stats.cancelled) std::fputs("wren: stopped by Ctrl-C\n", stderr);

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
    nlohmann::json js = {{"prompt_tokens", stats.prompt_tokens}, {"generated_tokens", stats.generated_tokens},
                         {"prefill_s", stats.prefill_s}, {"ttft_s", stats.ttft_s}, {"decode_s", stats.decode_s},
                         {"peak_rss_bytes", peak_rss_bytes()}, {"logits_fnv1a64", hex64(stats.logits_fnv1a64)}};
    if (ExpertStore* s = e.store()) {
      const ExpertStoreStats& x = s->stats();
      js["experts"] = {{"hits", x.hits}, {"misses", x.misses}, {"hit_rate", x.hit_rate()},
                       {"bytes_read", x.bytes_read}, {"read_s", x.read_s}, {"io_wait_s", x.wait_s},
                       {"compute_s", x.compute_s}, {"evictions", x.evictions},
                       {"prefetch", {{"issued", x.prefetch_issued}, {"used", x.prefetch_used},
                                     {"late", x.prefetch_late}, {"wasted", x.prefetch_wasted},
                                     {"failed", x.prefetch_failed}, {"recall", x.recall()},
                                     {"guessed_needed", x.guessed_needed}}}};
    }
    if (VramTierStats v; vram_tier_stats(e.backend(), &v))
      js["vram_tier"] = {{"slots", v.slots}, {"hits", v.hits}, {"misses", v.misses}, {"hit_rate", v.hit_rate()},
                         {"bytes_copied", v.demand_bytes + v.prefetch_bytes}, {"prefetch_bytes", v.prefetch_bytes},
                         {"prefetch", {{"copied", v.prefetch_copied}, {"used", v.prefetch_used},
                                       {"wasted", v.prefetch_wasted}, {"failed", v.prefetch_failed},
                                       {"left_on_disk", v.not_held}, {"recall", v.recall()}, {"guessed_needed", v.guess_needed}}}};
    nlohmann::json j = {{"prompt_ids", prompt}, {"output_ids", out}, {"stats", js}};
    if (text_mode) {
      j["text"] = pr.answer;
      if (a.chat) j["reasoning"] = pr.thought;
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (!text_mode) {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n");
  }
  print_stats(stats, e);
}

}  // namespace

void add_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Run a prompt through the model and stream the reply");
  sub->add_option("prompt", a->prompt, "Prompt text ('-' reads stdin); raw text gets [BOS] first");
  a->common.add_to(sub, 0.0f);
  sub->add_option("--ids", a->ids, "Prompt token ids, comma-separated (e.g. 4096,976,2328)");
  sub->add_flag("--chat", a->chat, "Wrap the prompt as a user message in the K3 chat format");
  sub->add_flag("--json", a->json, "Print one JSON object: prompt_ids, output_ids, text, reasoning, stats");
  sub->add_option("--trace", a->trace, "Write f32 [T, L, D]: P after each layer, token-major");
  sub->add_option("--logits", a->logits, "Write f32 [T, V]: teacher-forced logits at every prompt position");
  sub->add_option("--x0", a->x0, "Read f32 [T, D] rows replacing the prompt embeddings");
  sub->add_option("--layers", a->common.engine.layers, "Run only the first N layers")->check(positive());
  sub->add_option("--dump-layer", a->dump_layer, "Layer whose five vectors are dumped")->check(non_negative());
  sub->add_option("--dump-token", a->dump_token, "Prompt position to dump (default 0)");
  sub->add_option("--dump-dir", a->dump_dir, "Folder for nrm_attn/att/nrm_mlp/mlp/hidden .f32 files");
  sub->callback([a, sub] {
    a->has_prompt = sub->count("prompt") > 0;
    if (!a->common.gpus.empty() && !under_launcher()) {  // the parent: start the ranks, wait for them
      const std::string& ep = a->common.engine.expert_parallel;
      usage_check(ep.empty() || ep == "1", "--expert-parallel with --gpus (NCCL ranks): not wired yet; the expert "
                                           "ranks run as CPU threads of one process (docs/parallel.md)");
      for (int g : a->common.gpus) usage_check(g >= 0, "--gpus: " + std::to_string(g) + " is not a CUDA device index");
      std::string why;
      const bool cuda = a->common.engine.backend != "cpu" && cuda_usable(&why);
      usage_check(cuda, "--gpus: the pipeline ranks need the CUDA backend (" +
                            (a->common.engine.backend == "cpu" ? std::string("--backend cpu was given") : why) + ")");
      const int rc = launch_ranks(a->common.gpus);
      check(rc == 0, "--gpus: a pipeline rank failed (exit status " + std::to_string(rc) + ")");
      return;
    }
    run(*a);
  });
}

}  // namespace wren::cli
