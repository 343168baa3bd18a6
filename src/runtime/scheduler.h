// Iteration-level scheduling of many generations on one TokenStep (continuous batching): between
// steps waiting requests are admitted in arrival order (FIFO) up to max_seqs and resume from the
// prefix cache; then one mixed step (TokenStep::run_mixed) advances every decoding sequence by one
// token and feeds the prefilling ones a chunk of their prompts, under a budget of max_batch_tokens
// rows per step: decodes first (one row each), the rest of the budget to the prefilling sequences
// oldest first. A prompt's pieces end on the prefix cache's interval (snapshots there) and at its
// end (snapshot with logits), where its first token is drawn. A sequence that stops, reaches
// max_new_tokens or is cancelled leaves at once and frees its slot. Each sequence keeps its own
// state and sampler, so its tokens are those generate() gives it alone (Batched.*, Serve*).
// Fairness: admission and the prefill budget both go oldest first, and with max_batch_tokens >=
// max_seqs every prefilling sequence gets at least one row per step, so no request waits behind an
// unbounded stream of newer ones. Not thread-safe: one thread calls add() and step().
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/generate.h"

namespace wren {

/// One generation for the Scheduler.
struct SeqRequest {
  std::vector<int> prompt;
  GenerateOptions opts;  ///< max_new_tokens, stop_ids, sampling, cancel, logprobs, prefix_cache (no x0/hooks)
  std::function<void(int)> on_token;
  /// Called once when the sequence leaves normally (stopped, length or cancelled).
  std::function<void(const GenerateStats&)> on_done;
  /// Called once instead of on_done when its prefill or a decode step threw.
  std::function<void(const std::string&)> on_error;
};

/// The step's token budget for `--max-seqs` max_seqs and `--max-batch-tokens` requested (-1 = the
/// default, max(128, max_seqs); 0 = no budget). Throws UsageError when it is below max_seqs (every
/// running sequence needs a row per step). Front ends call it before loading the model.
int resolve_batch_tokens(int max_seqs, int requested);

class Scheduler {
 public:
  /// `make_state`: a fresh, empty sequence state; `max_seqs` >= 1 sequences run together.
  /// `max_batch_tokens`: rows (decode tokens + prefill tokens) per step; 0 = no budget (each
  /// prefilling sequence runs up to its next snapshot point or its end every step); otherwise at
  /// least max_seqs (throws wren::Error below).
  Scheduler(TokenStep& fwd, std::function<std::unique_ptr<SequenceState>()> make_state, int max_seqs,
            int max_batch_tokens = 0);
  ~Scheduler();
  void add(SeqRequest r) { waiting_.push_back(std::move(r)); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  int running() const { return int(running_.size()); }
  int waiting() const { return int(waiting_.size()); }
  int max_seqs() const { return max_seqs_; }
  int max_batch_tokens() const { return max_batch_tokens_; }
  /// Running sequences still prefilling their prompts (they hold a slot, no token drawn yet).
  int prefilling() const;
  /// Rows of the last step: decode tokens and prefill tokens.
  int last_decode_rows() const { return last_decode_rows_; }
  int last_prefill_rows() const { return last_prefill_rows_; }
  /// Admits what fits, then one mixed step over the running sequences.
  void step();

 private:
  struct Seq;
  /// Draws the next token from seq's logits; true when the sequence is finished.
  bool draw(Seq& s);
  void finish(Seq& s);
  /// Runs fn; an exception from it (a callback's) fails this sequence alone (on_error). True when none.
  bool guarded(Seq& s, const std::function<void()>& fn);
  /// Draws the next token (unless `done`) and finishes the sequence when it ends; true while it runs on.
  bool advance(Seq& s, bool done);
  /// Takes the oldest waiting request into a slot (resumed from the prefix cache); it leaves at
  /// once when cancelled, failed, or finished from a snapshot with logits.
  void admit();
  TokenStep& fwd_;
  std::function<std::unique_ptr<SequenceState>()> make_state_;
  int max_seqs_, max_batch_tokens_;
  int last_decode_rows_ = 0, last_prefill_rows_ = 0;
  std::deque<SeqRequest> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  std::vector<float> step_logits_;  ///< [rows, V]: the logits rows of the last step
};

}  // namespace wren
