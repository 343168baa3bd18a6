// Iteration-level scheduler (see scheduler.h).
#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>

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
  /// Plain greedy (GenerateOptions::needs_logits false): decode steps give the greedy id (into
  /// `next`) and leave the logits on the device; `logits` then no longer holds the last row.
  bool greedy_ids = false, host_logits = true;
  int next = -1;
  int fed = 0;       ///< prompt tokens in the state (restored or prefilled)
  bool prefilling = false;
  Clock::time_point t0, t1;
  Seq(SeqRequest r, int V)
      : req(std::move(r)), sampler(req.opts.sampling), logits(size_t(V)), greedy_ids(!req.opts.needs_logits()) {}
};

Scheduler::Scheduler(TokenStep& fwd, std::function<std::unique_ptr<SequenceState>()> make_state, int max_seqs,
                     int max_batch_tokens)
    : fwd_(fwd), make_state_(std::move(make_state)), max_seqs_(max_seqs), max_batch_tokens_(max_batch_tokens) {
  check(max_seqs >= 1, "--max-seqs must be at least 1");
  check(max_batch_tokens == 0 || max_batch_tokens >= max_seqs,
        "--max-batch-tokens " + std::to_string(max_batch_tokens) + " is below --max-seqs " + std::to_string(max_seqs) +
            ": every running sequence needs a row per step (0 = no budget)");
}

int resolve_batch_tokens(int max_seqs, int requested) {
  const int budget = requested >= 0 ? requested : std::max(128, max_seqs);
  usage_check(budget == 0 || budget >= max_seqs, "--max-batch-tokens " + std::to_string(budget) + " is below --max-seqs " +
                                                     std::to_string(max_seqs) +
                                                     ": every running sequence needs a row per step (0 = no budget)");
  return budget;
}

int Scheduler::prefilling() const {
  int n = 0;
  for (const auto& s : running_) n += s->prefilling;
  return n;
}

Scheduler::~Scheduler() = default;

bool Scheduler::draw(Seq& s) {
  const GenerateOptions& o = s.req.opts;
  int id = s.next;  // a greedy-id step's draw
  if (s.host_logits) {
    if (o.constrain) o.constrain(s.logits.data(), int(s.logits.size()));  // as generate(): mask, then draw
    TokenLogprobs lp;
    const bool want_lp = o.top_logprobs >= 0 && o.on_logprobs;
    id = s.sampler.sample(s.logits.data(), int(s.logits.size()), want_lp ? &lp : nullptr, o.top_logprobs);
    if (want_lp) o.on_logprobs(lp);
  }
  if (s.stats.generated_tokens++ == 0) s.stats.ttft_s = secs(Clock::now() - s.t0);
  if (s.req.on_token) s.req.on_token(id);
  s.stats.stopped = std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end();
  s.stats.cancelled = o.cancel && o.cancel->load();
  s.pending = id;
  return s.stats.stopped || s.stats.cancelled || s.stats.generated_tokens == o.max_new_tokens;
}

void Scheduler::finish(Seq& s) {
  // The end of the exchange, as generate() stores it (the last drawn id not run; its logits row).
  // Masked logits (constrain) are not the model's, and a greedy-id step left none on the host:
  // then the snapshot keeps none.
  if (s.cache && s.stats.generated_tokens > 0)
    s.cache->store(*s.state, s.req.opts.constrain || !s.host_logits ? nullptr : s.logits.data(), int(s.logits.size()));
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

void Scheduler::admit() {
  const int V = fwd_.config().vocab;
  auto s = std::make_unique<Seq>(std::move(waiting_.front()), V);
  waiting_.pop_front();
  const GenerateOptions& o = s->req.opts;
  s->t0 = Clock::now();
  s->stats.prompt_tokens = int(s->req.prompt.size());
  if (o.cancel && o.cancel->load()) {  // gone before it started
    s->stats.cancelled = true;
    s->t1 = s->t0;
    if (s->req.on_done) s->req.on_done(s->stats);
    return;
  }
  try {
    const std::vector<int>& p = s->req.prompt;
    check(!p.empty(), "the prompt is empty: at least one token id is needed");
    for (size_t i = 0; i < p.size(); ++i)  // here, so that a bad id fails this request, not its step mates
      check(p[i] >= 0 && p[i] < V, "prompt token " + std::to_string(i) + " is id " + std::to_string(p[i]) +
                                       ", outside the vocabulary of " + std::to_string(V));
    s->state = make_state_();
    check(int(p.size()) + o.max_new_tokens <= s->state->capacity(),
          "context limit: " + std::to_string(p.size()) + " prompt + " + std::to_string(o.max_new_tokens) +
              " to generate exceed the context of " + std::to_string(s->state->capacity()) + " tokens (raise --ctx)");
    // As prefill() (runtime/generate.h): resume from the longest cached prefix.
    if (o.prefix_cache && o.prefix_cache->enabled() && !o.x0 && !o.prompt_logits && !o.hooks) s->cache = o.prefix_cache;
    std::vector<float> restored;
    if (s->cache) s->stats.cached_tokens = s->cache->restore(*s->state, p, &restored);
    s->fed = s->stats.cached_tokens;
    if (!restored.empty()) std::copy(restored.begin(), restored.end(), s->logits.begin());
  } catch (const std::exception& e) {
    if (s->req.on_error) s->req.on_error(e.what());
    return;
  }
  if (s->fed < int(s->req.prompt.size())) {  // the rest of the prompt runs in the next steps
    s->prefilling = true;
    running_.push_back(std::move(s));
    return;
  }
  s->t1 = Clock::now();  // the whole prompt came from a snapshot with its logits
  s->stats.prefill_s = secs(s->t1 - s->t0);
  if (advance(*s, o.max_new_tokens <= 0)) running_.push_back(std::move(s));
}

void Scheduler::step() {
  const int V = fwd_.config().vocab;
  // Admit in arrival order while slots are free.
  while (int(running_.size()) < max_seqs_ && !waiting_.empty()) admit();
  // A cancelled sequence leaves now (its drawn token, if any, was already delivered).
  for (size_t i = 0; i < running_.size();) {
    Seq& s = *running_[i];
    if (s.req.opts.cancel && s.req.opts.cancel->load()) {
      s.stats.cancelled = true;
      if (s.prefilling) s.t1 = Clock::now();
      guarded(s, [&] { finish(s); });
      running_.erase(running_.begin() + long(i));
    } else {
      ++i;
    }
  }
  last_decode_rows_ = last_prefill_rows_ = 0;
  if (running_.empty()) return;
  // The step: every decoding sequence's token, then prefill pieces oldest first under the budget.
  std::vector<BatchEntry> es;
  std::vector<Seq*> who;
  int decodes = 0;
  for (auto& s : running_)
    if (!s->prefilling) ++decodes;
  // The logits rows of the step, consecutive in entry order (so the forward pass copies them from
  // the device in one piece); kept across steps (no allocation once warm).
  if (step_logits_.size() < running_.size() * size_t(V)) step_logits_.resize(running_.size() * size_t(V));
  size_t rows = 0;
  int left = max_batch_tokens_ > 0 ? max_batch_tokens_ - decodes : std::numeric_limits<int>::max();
  for (auto& sp : running_) {
    Seq& s = *sp;
    float* row = step_logits_.data() + rows * size_t(V);
    if (!s.prefilling) {
      if (s.greedy_ids) {
        es.push_back({s.state.get(), &s.pending, 1, nullptr, &s.next});
      } else {
        es.push_back({s.state.get(), &s.pending, 1, row});
        ++rows;
      }
      who.push_back(&s);
      continue;
    }
    if (left <= 0) continue;
    const int T = int(s.req.prompt.size());
    int n = std::min(T - s.fed, left);
    if (s.cache) {  // end on the next snapshot point (the interval)
      const int I = s.cache->interval();
      n = std::min(n, (s.fed / I + 1) * I - s.fed);
    }
    left -= n;
    es.push_back({s.state.get(), s.req.prompt.data() + s.fed, n, s.fed + n == T ? row : nullptr});
    who.push_back(&s);
    rows += s.fed + n == T;
  }
  for (size_t k = 0; k < es.size(); ++k)
    (who[k]->prefilling ? last_prefill_rows_ : last_decode_rows_) += es[k].n;
  try {
    fwd_.run_mixed(es.data(), int(es.size()));
  } catch (const std::exception& e) {  // every sequence of the step is in an unknown state: all fail
    for (Seq* s : who)
      if (s->req.on_error) s->req.on_error(e.what());
    std::erase_if(running_, [&](const std::unique_ptr<Seq>& s) {
      return std::find(who.begin(), who.end(), s.get()) != who.end();
    });
    return;
  }
  std::vector<Seq*> gone;
  for (size_t k = 0; k < es.size(); ++k) {
    Seq& s = *who[k];
    if (es[k].logits) std::copy(es[k].logits, es[k].logits + V, s.logits.begin());
    if (!s.prefilling) s.host_logits = es[k].logits != nullptr;
    if (!s.prefilling) {
      if (!advance(s, false)) gone.push_back(&s);
      continue;
    }
    s.fed += es[k].n;
    const int T = int(s.req.prompt.size());
    if (s.fed < T) {
      if (s.cache && s.fed % s.cache->interval() == 0) s.cache->store(*s.state);
      continue;
    }
    s.prefilling = false;  // the prompt is in: snapshot with its logits, draw the first token
    if (s.cache) s.cache->store(*s.state, s.logits.data(), V);
    s.t1 = Clock::now();
    s.stats.prefill_s = secs(s.t1 - s.t0);
    if (!advance(s, s.req.opts.max_new_tokens <= 0)) gone.push_back(&s);
  }
  std::erase_if(running_, [&](const std::unique_ptr<Seq>& s) {
    return std::find(gone.begin(), gone.end(), s.get()) != gone.end();
  });
}

}  // namespace wren
