// `wren chat`: an interactive multi-turn conversation. The sequence state carries the whole
// conversation, so each turn prefills only its new message; /retry draws the last answer again
// from the prefix cache's snapshot of the end of its prompt (runtime/prefix_cache.h; nothing
// re-prefilled while the snapshot is cached); /reset starts over, /exit quits, and
// Ctrl-C stops the current answer; at an idle prompt it ends the program. On a terminal the
// prompt has line editing and history (libedit; history kept in <cache>/chat_history); with
// stdin not a terminal (pipes, tests) lines are read plainly.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>

#include <editline/readline.h>

#include <cstdlib>

#include <string>

#include "cli/commands.h"
#include "runtime/default_model.h"
#include "cli/run_options.h"
#include "core/error.h"
#include "core/sizes.h"
#include "runtime/prefix_cache.h"
#include "runtime/chat_format.h"
#include "tokenizer/stream_decoder.h"

namespace wren::cli {

namespace {

std::atomic<bool> g_cancel{false};
void on_sigint(int) { g_cancel = true; }

struct ChatArgs {
  CommonArgs common;
  std::string prefix_cache = "256M";  ///< --prefix-cache
};

/// One assistant turn: streams reasoning (dimmed) and answer, leaves the state holding the
/// complete, well-formed reply.
/// `seed`: added to the sampling seed (the turn's start position, plus a step per /retry).
void reply(Engine& e, const ChatFormat& fmt, SequenceState& st, const std::vector<int>& prompt,
           const ChatArgs& a, bool tty, PrefixCache& cache, uint64_t seed) {
  const Tokenizer& tok = e.tokenizer();
  GenerateOptions o;
  o.max_new_tokens = a.common.n;
  o.stop_ids = {fmt.end_of_msg()};
  o.sampling = a.common.sampling;
  o.sampling.seed += seed;  // different draws per turn, reproducible per conversation
  o.commit_last = true;
  o.prefix_cache = &cache;
  o.cancel = &g_cancel;
  ReplyParser parser(fmt, a.common.think);
  StreamDecoder text(tok), thought(tok);
  bool thinking_shown = false;
  auto on_token = [&](int id) {
    const ReplyParser::Channel ch = parser.push(id);
    if (ch == ReplyParser::Channel::Think) {
      if (!thinking_shown) std::fputs(tty ? "\033[2m[thinking] " : "[thinking] ", stdout), thinking_shown = true;
      std::fputs(thought.push(id).c_str(), stdout);
    } else if (ch == ReplyParser::Channel::Response) {
      if (thinking_shown) std::fputs(tty ? "\033[0m\n" : "\n", stdout), thinking_shown = false;
      std::fputs(text.push(id).c_str(), stdout);
    }
    std::fflush(stdout);
  };
  g_cancel = false;
  GenerateStats stats;
  generate(e.forward(), st, prompt, o, &stats, on_token);
  std::fputs((thought.finish() + text.finish() + (tty ? "\033[0m\n" : "\n")).c_str(), stdout);
  if (!stats.stopped) {  // cut short: close the reply so the next turn sees a well-formed history
    const std::vector<int> close = fmt.close_reply(parser.channel() == ReplyParser::Channel::Think);
    e.forward().run(st, close.data(), nullptr, int(close.size()), nullptr, false);
    if (stats.cancelled) std::fputs("[stopped]\n", stdout);
  }
  print_stats(stats, e);
}

void chat(ChatArgs& a) {
  Engine e(a.common.engine_options());
  if (const std::string g = describe_gpu(e, a.common.engine); !g.empty()) std::fprintf(stderr, "wren: %s\n", g.c_str());
  const ChatFormat fmt(e.tokenizer());
  auto st = e.new_sequence();
  PrefixCache cache(parse_size(a.prefix_cache, "--prefix-cache"));
  // The whole token sequence at the end of the last prompt, its turn's seed and how often it was
  // retried (/retry restores that point from the cache and samples again).
  std::vector<int> last_prompt;
  uint64_t last_seed = 0, retries = 0;
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  const bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
  std::fprintf(stderr, "wren chat: thinking %s. /help lists commands; Ctrl-C stops an answer, at the prompt it quits.\n",
               a.common.think ? "on" : "off");
  const std::string history = cache_root() + "/chat_history";
  if (tty) {
    using_history();
    read_history(history.c_str());
  }
  // Reads one line: libedit on a terminal (editing, history), else plain getline. Ctrl-C at the
  // prompt is the default action (the program ends); during an answer it only stops the answer.
  auto read_line = [&](std::string& out) {
    signal(SIGINT, SIG_DFL);
    bool ok = false;
    if (tty) {
      if (char* l = readline("> ")) {
        out = l;
        std::free(l);
        if (!out.empty()) add_history(out.c_str()), write_history(history.c_str());
        ok = true;
      }
    } else {
      ok = bool(std::getline(std::cin, out));
    }
    sigaction(SIGINT, &sa, nullptr);
    return ok;
  };
  bool first = true;
  std::string line;
  for (;;) {
    if (!read_line(line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      std::fputs("/reset  start a new conversation\n/retry  answer the last message again (a new draw)\n/exit   quit (also /quit, Ctrl-D, or Ctrl-C at the prompt)\n"
                 "/help   this list\nCtrl-C during an answer stops it; the conversation continues.\n",
                 stdout);
      continue;
    }
    if (line == "/retry") {
      if (last_prompt.empty()) {
        std::fputs("[nothing to retry yet]\n", stdout);
        continue;
      }
      st->reset();  // generate() resumes from the longest cached prefix of the last prompt
      try {
        reply(e, fmt, *st, last_prompt, a, tty, cache, last_seed + 0x9E3779B97F4A7C15ull * ++retries);
      } catch (const Error& err) {
        std::fprintf(stderr, "wren: error: %s (conversation reset)\n", err.what());
        st->reset();
        first = true;
        last_prompt.clear();
      }
      continue;
    }
    if (line == "/reset") {
      st->reset();
      first = true;
      last_prompt.clear();
      std::fputs("[conversation reset]\n", stdout);
      continue;
    }
    if (line.empty()) continue;
    if (line[0] == '/' && line.find_first_of(" \t") == std::string::npos) {  // "/bogus", not "/usr/bin is ..."
      std::fprintf(stdout, "[unknown command %s: /help lists them]\n", line.c_str());
      continue;
    }
    std::vector<ChatMessage> msgs;
    if (first && a.common.system) msgs.push_back({"system", *a.common.system, ""});
    msgs.push_back({"user", line, ""});
    // The first turn is the whole prompt as the encoder renders it (effort message included);
    // later turns append the new message to the state.
    std::vector<int> prompt = first ? fmt.preamble(chat_options(a.common), msgs) : std::vector<int>{};
    const std::vector<int> body = fmt.render(msgs, a.common.think), gen = fmt.generation_prompt(a.common.think);
    prompt.insert(prompt.end(), body.begin(), body.end());
    prompt.insert(prompt.end(), gen.begin(), gen.end());
    if (st->position() + int(prompt.size()) + a.common.n + 16 > st->capacity()) {
      std::fprintf(stderr, "wren: the conversation would exceed the context of %d tokens; /reset or raise --ctx\n",
                   st->capacity());
      continue;
    }
    try {
      last_seed = uint64_t(st->position()), retries = 0;
      last_prompt = st->history();
      last_prompt.insert(last_prompt.end(), prompt.begin(), prompt.end());
      reply(e, fmt, *st, prompt, a, tty, cache, last_seed);
      first = false;
    } catch (const Error& err) {
      std::fprintf(stderr, "wren: error: %s (conversation reset)\n", err.what());
      st->reset();
      first = true;
      last_prompt.clear();
    }
  }
}

}  // namespace

void add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand("chat", "Interactive multi-turn chat (K3 chat format)");
  a->common.add_to(sub, 0.7f);
  a->common.sampling.top_p = 0.95f;
  sub->add_option("--prefix-cache", a->prefix_cache,
                  "Host memory for state snapshots (/retry resumes from them), e.g. 256M; 0 = off (default 256M)");
  sub->callback([a] { chat(*a); });
}

}  // namespace wren::cli
