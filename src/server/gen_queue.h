// One model, many clients: generation jobs are admitted in arrival order (FIFO) into the engine's
// iteration-level scheduler (runtime/scheduler.h: up to --max-seqs sequences decode together, one
// batched step at a time), each with its own SequenceState. A job streams its text pieces to the HTTP thread that
// waits on it; the client side can cancel it at any time (queued or running).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"
#include "runtime/reply_constraint.h"
#include "server/metrics.h"
#include "server/openai_json.h"
#include "server/stop_matcher.h"
#include "tokenizer/stream_decoder.h"

namespace wren::server {

/// A piece of streamed output: reasoning (think channel), content (answer) or part of a tool call.
struct Piece {
  enum class Kind { Content, Reasoning, Tool };
  Kind kind = Kind::Content;
  std::string text;                    ///< Content / Reasoning
  ToolCallDelta tool;                  ///< Tool: index, name (first piece of a call), arguments text
  std::string tool_id;                 ///< Tool: the call's id (first piece of a call)
  std::vector<LogprobEntry> logprobs;  ///< Content: the logprobs of the tokens this piece covers
};

/// One generation: the prepared prompt and options in, pieces and a GenResult out.
class Job {
 public:
  Job(GenRequest req, std::vector<int> prompt, int max_tokens, std::string id = "")
      : req(std::move(req)), prompt(std::move(prompt)), max_tokens(max_tokens), id(std::move(id)),
        submitted(std::chrono::steady_clock::now()) {}
  const GenRequest req;
  const std::vector<int> prompt;
  const int max_tokens;
  const std::string id;  ///< the response id (tool call ids derive from it)
  const std::chrono::steady_clock::time_point submitted;

  /// Client side: waits up to `timeout` for pieces; moves them into `out`. Returns true once the
  /// job is finished and every piece has been taken.
  bool take(std::vector<Piece>& out, std::chrono::milliseconds timeout);
  /// Client side: blocks until the job is finished.
  void wait();
  /// Client side: the client is gone; the job stops after its current token (or never starts).
  void cancel() { halt_ = true, client_gone_ = true; }
  /// The result; valid after take() returned true or wait() returned.
  const GenResult& result() const { return result_; }
  /// Non-empty when generation failed (the message of the exception).
  const std::string& error() const { return error_; }

  // Worker side.
  void emit(Piece p);
  void finish(GenResult r, std::string error = "");
  void stop() { halt_ = true; }
  const std::atomic<bool>& halt_flag() const { return halt_; }
  bool client_gone() const { return client_gone_; }
  /// Whether the job has finished.
  bool done() {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  /// Whether the client had gone when the job finished.
  bool was_cancelled() const { return was_cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> pieces_;
  bool done_ = false, was_cancelled_ = false;
  GenResult result_;
  std::string error_;
  std::atomic<bool> halt_{false}, client_gone_{false};
};

/// The per-request end of generation: receives each generated id (and, when asked, its logprobs)
/// and turns them into pieces and the GenResult: the chat channels (think, response, tools with
/// tool-call parsing), stop strings, logprobs of content tokens. Whatever drives the model (one
/// sequence at a time now, a batch later) feeds one ReplyStream per request.
class ReplyStream {
 public:
  /// `metrics` (may be null) counts the generation when it finishes, before the client sees it.
  ReplyStream(const Tokenizer& tok, Job& job, std::vector<int> stop_ids, Metrics* metrics = nullptr);
  /// The logprobs of the id pushed next (call before token()).
  void logprobs(const TokenLogprobs& lp) { lp_ = lp, has_lp_ = true; }
  /// One generated id.
  void token(int id);
  /// Prompt tokens the prefix cache supplied (usage.prompt_tokens_details.cached_tokens).
  void cached(int n) { r_.cached_tokens = n; }
  /// Generation ended (`stopped`: on a stop id); flushes and finishes the job.
  void finish(int generated_tokens, bool stopped);
  /// The ids generation stops on (the config's eos list, plus <|end_of_msg|> for chat).
  const std::vector<int>& stop_ids() const { return stop_ids_; }
  /// The request constrains the reply (tool_choice required / named, response_format JSON):
  /// call mask() on each logits row before drawing from it.
  bool constrained() const { return constraint_ != nullptr; }
  void mask(float* logits, int n) const { constraint_->mask(logits, n); }

 private:
  void content(const std::string& s, std::vector<LogprobEntry> lps);
  void reasoning(const std::string& s);
  void tool_deltas();
  LogprobEntry entry(const TokenLogprobs& lp) const;
  const Tokenizer& tok_;
  Job& job_;
  std::vector<int> stop_ids_;
  Metrics* metrics_;
  std::unique_ptr<ChatFormat> fmt_;
  std::unique_ptr<ReplyParser> parser_;
  ReplyRule rule_;
  std::unique_ptr<ReplyConstraint> constraint_;
  StreamDecoder text_, thought_;
  StopMatcher stop_;
  GenResult r_;
  TokenLogprobs lp_;
  bool has_lp_ = false;
  std::chrono::steady_clock::time_point last_;
  int tokens_ = 0;
};

/// Counters shown by GET /health (and /metrics).
struct QueueStats {
  long long queued = 0, completed = 0, cancelled = 0, failed = 0;
  bool busy = false;
  int running = 0;  ///< sequences generating now (at most --max-seqs), prefilling ones included
  int prefilling = 0;  ///< of those, still prefilling their prompts
  int max_seqs = 0, max_batch_tokens = 0;
  uint64_t steps = 0, decode_rows = 0, prefill_rows = 0;  ///< scheduler steps and their rows (sums)
  int last_decode_rows = 0, last_prefill_rows = 0;        ///< rows of the last step
  /// Routed-expert traffic of the engine's backend (Backend::expert_traffic; host-routed MoE
  /// only) and the tokens generated so far: bytes / generated_tokens = expert bytes per token.
  uint64_t expert_visits = 0, expert_bytes = 0, generated_tokens = 0;
  /// The same traffic over the steps that ran decodes only (no prefill row): bytes / tokens =
  /// expert bytes per generated token of the decode itself.
  uint64_t decode_step_expert_bytes = 0, decode_step_tokens = 0;
  bool has_store = false;  ///< the engine streams experts from disk; the counters below are its own
  uint64_t expert_hits = 0, expert_misses = 0, expert_bytes_read = 0;  ///< as of the last finished job
  bool has_prefix_cache = false;  ///< --prefix-cache above 0; the counters below are its own
  PrefixCacheStats prefix;
};

/// The FIFO of jobs and the one worker thread that runs them on the Engine.
class GenQueue {
 public:
  /// `max_queue`: jobs waiting (not counting the running one) beyond which submit() refuses.
  /// `cache` (may be null): prompts resume from and fill it (runtime/prefix_cache.h).
  /// `max_seqs`: sequences decoded together in one batched step.
  /// `max_batch_tokens`: rows per scheduler step (Scheduler; 0 = no budget).
  GenQueue(Engine& engine, int max_queue, PrefixCache* cache = nullptr, int max_seqs = 1, int max_batch_tokens = 0);
  /// Test hook: instead of running the model, job k (in run order) "generates" replay[k % n]
  /// (cut at a stop id or max_tokens) through the same ReplyStream (parsing, streaming, stop
  /// strings). Set before the first submit().
  void set_replay(std::vector<std::vector<int>> replay) { replay_ = std::move(replay); }
  /// Where finished generations are counted (tokens, TTFT, inter-token gaps); may be null.
  void set_metrics(Metrics* m) { metrics_ = m; }
  ~GenQueue();
  GenQueue(const GenQueue&) = delete;
  GenQueue& operator=(const GenQueue&) = delete;
  /// Appends a job; throws RequestError 503 when the queue is full.
  void submit(const std::shared_ptr<Job>& job);
  /// Shutdown: later submit()s get 503, every waiting job finishes with an error at once, every
  /// running one is halted (it ends at its next token). Returns without waiting.
  void drain();
  QueueStats stats();

 private:
  void loop();
  /// The replay test hook's path: one job at a time.
  void run(Job& job);
  /// Hands `job` to the scheduler with its ReplyStream; counts it when it leaves.
  void admit(Scheduler& sched, const std::shared_ptr<Job>& job);
  Engine& engine_;
  const int max_queue_;
  PrefixCache* cache_;
  const int max_seqs_, max_batch_tokens_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  QueueStats stats_;
  std::vector<std::vector<int>> replay_;
  Metrics* metrics_ = nullptr;
  size_t replayed_ = 0;
  bool quit_ = false;
  bool draining_ = false;
  std::vector<std::weak_ptr<Job>> admitted_;  ///< jobs handed to the scheduler (for drain)
  std::thread worker_;
};

}  // namespace wren::server
