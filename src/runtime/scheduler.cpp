// Iteration-level scheduler (see scheduler.h).
#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace wren {

namespace {
using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

struct Scheduler::Seq {
  SeqRequest req;
  std::unique_ptr<SequenceState> state;
  Sampler sampler;
  std::vector<float> logits;  ///< [V]: the row the next token is drawn from
  PrefixCache* cache = nullptr;
  GenerateStats stats;
  int pending = -1;  ///< the drawn id the next decode step consumes
  Clock::time_point t0, t1;
  Seq(SeqRequest r, int V) : req(std::move(r)), sampler(req.opts.sampling), logits(size_t(V)) {}
};

Scheduler::Scheduler(TokenStep& fwd, std::function<std::unique_ptr<SequenceState>()> make_state, int max_seqs)
    : fwd_(fwd), make_state_(std::move(make_state)), max_seqs_(max_seqs) {
  check(max_seqs >= 1, "--max-seqs must be at least 1");
}

Scheduler::~Scheduler() = default;

bool Scheduler::draw(Seq& s) {
  const GenerateOptions& o = s.req.opts;
  if (o.constrain) o.constrain(s.logits.data(), int(s.logits.size()));  // as generate(): mask, then draw
  TokenLogprobs lp;
  const bool want_lp = o.top_logprobs >= 0 && o.on_logprobs;
  const int id = s.sampler.sample(s.logits.data(), int(s.logits.size()), want_lp ? &lp : nullptr, o.top_logprobs);
  if (want_lp) o.on_logprobs(lp);
  if (s.stats.generated_tokens++ == 0) s.stats.ttft_s = secs(Clock::now() - s.t0);
  if (s.req.on_token) s.req.on_token(id);
  s.stats.stopped = std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end();
  s.stats.cancelled = o.cancel && o.cancel->load();
  s.pending = id;
  return s.stats.stopped || s.stats.cancelled || s.stats.generated_tokens == o.max_new_tokens;
}

void Scheduler::finish(Seq& s) {
  // The end of the exchange, as generate() stores it (the last drawn id not run; its logits row).
  // Masked logits (constrain) are not the model's: then the snapshot keeps none.
  if (s.cache && s.stats.generated_tokens > 0)
    s.cache->store(*s.state, s.req.opts.constrain ? nullptr : s.logits.data(), int(s.logits.size()));
  s.stats.decode_s = secs(Clock::now() - s.t1);
  if (s.req.on_done) s.req.on_done(s.stats);
}

bool Scheduler::guarded(Seq& s, const std::function<void()>& fn) {
  try {
    fn();
    return true;
  } catch (const std::exception& e) {  // e.g. the reply side could not decode an id: this sequence fails
    if (s.req.on_error) s.req.on_error(e.what());
    return false;
  }
}

bool Scheduler::advance(Seq& s, bool done) {
  bool running = false;
  const bool ok = guarded(s, [&] {
    if (!done && !draw(s)) {
      running = true;
      return;
    }
    finish(s);
  });
  return ok && running;
}

void Scheduler::step() {
  const int V = fwd_.config().vocab;
  // Admit in arrival order while slots are free; each prefill runs alone, between decode steps.
  while (int(running_.size()) < max_seqs_ && !waiting_.empty()) {
    auto s = std::make_unique<Seq>(std::move(waiting_.front()), V);
    waiting_.pop_front();
    const GenerateOptions& o = s->req.opts;
    s->t0 = Clock::now();
    s->stats.prompt_tokens = int(s->req.prompt.size());
    if (o.cancel && o.cancel->load()) {  // gone before it started
      s->stats.cancelled = true;
      s->t1 = s->t0;
      if (s->req.on_done) s->req.on_done(s->stats);
      continue;
    }
    try {
      check(!s->req.prompt.empty(), "the prompt is empty: at least one token id is needed");
      s->state = make_state_();
      check(int(s->req.prompt.size()) + o.max_new_tokens <= s->state->capacity(),
            "context limit: " + std::to_string(s->req.prompt.size()) + " prompt + " + std::to_string(o.max_new_tokens) +
                " to generate exceed the context of " + std::to_string(s->state->capacity()) + " tokens (raise --ctx)");
      s->cache = prefill(fwd_, *s->state, s->req.prompt, o, s->logits.data(), s->stats);
    } catch (const std::exception& e) {
      if (s->req.on_error) s->req.on_error(e.what());
      continue;
    }
    s->t1 = Clock::now();
    s->stats.prefill_s = secs(s->t1 - s->t0);
    if (advance(*s, o.max_new_tokens <= 0)) running_.push_back(std::move(s));
  }
  // A cancelled sequence leaves now (its drawn token was already delivered).
  for (size_t i = 0; i < running_.size();) {
    Seq& s = *running_[i];
    if (s.req.opts.cancel && s.req.opts.cancel->load()) {
      s.stats.cancelled = true;
      guarded(s, [&] { finish(s); });
      running_.erase(running_.begin() + long(i));
    } else {
      ++i;
    }
  }
  if (running_.empty()) return;
  // One decode step over every running sequence.
  const int B = int(running_.size());
  std::vector<SequenceState*> states(static_cast<size_t>(B));
  std::vector<int> ids(static_cast<size_t>(B));
  std::vector<float> logits(size_t(B) * size_t(V));
  for (int b = 0; b < B; ++b) states[size_t(b)] = running_[size_t(b)]->state.get(), ids[size_t(b)] = running_[size_t(b)]->pending;
  try {
    fwd_.run_batch(states.data(), ids.data(), B, logits.data());
  } catch (const std::exception& e) {  // every sequence of the step is in an unknown state: all fail
    for (auto& s : running_)
      if (s->req.on_error) s->req.on_error(e.what());
    running_.clear();
    return;
  }
  std::vector<std::unique_ptr<Seq>> still;
  for (int b = 0; b < B; ++b) {
    auto& s = running_[size_t(b)];
    std::copy(logits.begin() + long(b) * V, logits.begin() + long(b + 1) * V, s->logits.begin());
    if (advance(*s, false)) still.push_back(std::move(s));
  }
  running_ = std::move(still);
}

}  // namespace wren
