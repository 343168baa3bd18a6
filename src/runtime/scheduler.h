// Iteration-level scheduling of many generations on one TokenStep: between decode steps waiting
// requests are admitted in arrival order (FIFO) up to max_seqs, each prefilled on its own
// (through the prefix cache) and its first token drawn; then one batched decode step
// (TokenStep::run_batch) advances every running sequence by one token. A sequence that stops,
// reaches max_new_tokens or is cancelled leaves at once and frees its slot. Each sequence keeps its
// own state and sampler, so its tokens are those generate() gives it alone (Batched.*, Serve*).
// Not thread-safe: one thread calls add() and step().
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

class Scheduler {
 public:
  /// `make_state`: a fresh, empty sequence state; `max_seqs` >= 1 sequences decode together.
  Scheduler(TokenStep& fwd, std::function<std::unique_ptr<SequenceState>()> make_state, int max_seqs);
  ~Scheduler();
  void add(SeqRequest r) { waiting_.push_back(std::move(r)); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  int running() const { return int(running_.size()); }
  int waiting() const { return int(waiting_.size()); }
  int max_seqs() const { return max_seqs_; }
  /// Admits what fits, then one decode step over the running sequences.
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
  TokenStep& fwd_;
  std::function<std::unique_ptr<SequenceState>()> make_state_;
  int max_seqs_;
  std::deque<SeqRequest> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
};

}  // namespace wren
