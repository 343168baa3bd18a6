// The engine's step with the CPU fallback (see runner.h).
#include "runtime/runner.h"

#include <cstdio>
#include <vector>

#include "core/argmax.h"
#include "core/error.h"

namespace wren {

Runner::Runner(const Model& model, Backend& backend, ForwardOptions opts) : fwd_(model, backend, opts) {}

Runner::~Runner() = default;

void Runner::run(SequenceState& st, const int* ids, const float* x0, int T, float* logits, bool all_logits,
                 const ForwardHooks* hooks) {
  if (fallback_) return run_fallback(st, ids, x0, T, logits, all_logits, hooks);
  check(&st.backend() == &fwd_.backend(), "forward: the sequence state belongs to another backend");
  try {
    if (pipe_) pipe_->run(st, ids, x0, T, logits, all_logits, hooks);
    else fwd_.run(st, ids, x0, T, logits, all_logits, hooks);
  } catch (const DeviceError& e) {
    if (!make_fallback_ || !st.replayable() || x0) throw;
    start_fallback(e);
    return run_fallback(st, ids, x0, T, logits, all_logits, hooks);
  }
  st.record(ids, T, x0 == nullptr);
}

void Runner::start_fallback(const DeviceError& e) {
  std::fprintf(stderr, "wren: the %s backend failed: %s\nwren: continuing on the CPU from here on "
                       "(each sequence's state is rebuilt there from its tokens)\n", fwd_.backend().name(), e.what());
  Fallback fb = make_fallback_();
  fallback_be_ = std::move(fb.backend);
  fallback_be_->set_expert_source(fwd_.backend().expert_source());  // the same experts (e.g. the store)
  fallback_ = std::make_unique<Forward>(fb.model ? *fb.model : fwd_.model(), *fallback_be_, fwd_.options());
}

void Runner::run_batch(SequenceState* const* sts, const int* ids, int B, float* logits) {
  if (!fallback_) {
    for (int b = 0; b < B; ++b)
      check(&sts[b]->backend() == &fwd_.backend(), "forward: a sequence state of the batch belongs to another backend");
    try {
      if (pipe_) pipe_->run_batch(sts, ids, B, logits);
      else fwd_.run_batch(sts, ids, B, logits);
      for (int b = 0; b < B; ++b) sts[b]->record(ids + b, 1, true);
      return;
    } catch (const DeviceError& e) {
      if (!make_fallback_) throw;
      for (int b = 0; b < B; ++b)
        if (!sts[b]->replayable()) throw;
      start_fallback(e);
    }
  }
  const size_t V = config().vocab;  // on the fallback: one by one (each state rebuilt first)
  for (int b = 0; b < B; ++b)
    run_fallback(*sts[b], ids + b, nullptr, 1, logits ? logits + size_t(b) * V : nullptr, false, nullptr);
}

void Runner::run_mixed(const BatchEntry* es, int n) {
  if (!fallback_) {
    for (int i = 0; i < n; ++i)
      check(&es[i].st->backend() == &fwd_.backend(), "forward: a sequence state of the step belongs to another backend");
    try {
      if (pipe_) pipe_->run_mixed(es, n);  // pipeline stages: entry by entry (TokenStep's default)
      else fwd_.run_mixed(es, n);
      for (int i = 0; i < n; ++i) es[i].st->record(es[i].ids, es[i].n, true);
      return;
    } catch (const DeviceError& e) {
      if (!make_fallback_) throw;
      for (int i = 0; i < n; ++i)
        if (!es[i].st->replayable()) throw;
      start_fallback(e);
    }
  }
  std::vector<float> own;  // on the fallback: one by one (each state rebuilt first)
  for (int i = 0; i < n; ++i) {
    const BatchEntry& e = es[i];
    float* row = e.logits;
    if (!row && e.greedy) own.resize(config().vocab), row = own.data();
    run_fallback(*e.st, e.ids, nullptr, e.n, row, false, nullptr);
    if (e.greedy) *e.greedy = argmax(row, config().vocab);
  }
}

int Runner::decode_greedy(SequenceState& st, int first, int max_steps, const std::function<bool(int)>& on_id) {
  if (fallback_ || pipe_) return TokenStep::decode_greedy(st, first, max_steps, on_id);  // through run_mixed
  check(&st.backend() == &fwd_.backend(), "forward: the sequence state belongs to another backend");
  int in = first, done = 0;  // the id the next step consumes; steps completed
  try {
    return fwd_.decode_greedy(st, first, max_steps, [&](int id) {
      st.record(&in, 1, true);
      ++done, in = id;
      return on_id(id);
    });
  } catch (const DeviceError& e) {
    if (!make_fallback_ || !st.replayable()) throw;
    start_fallback(e);
  }
  return done + TokenStep::decode_greedy(st, in, max_steps - done, on_id);  // rebuilt from its log first
}

void Runner::run_fallback(SequenceState& st, const int* ids, const float* x0, int T, float* logits,
                          bool all_logits, const ForwardHooks* hooks) {
  if (&st.backend() != fallback_be_.get()) {  // rebuild the state on the fallback backend
    check(st.replayable(), "forward: this sequence was fed embeddings (x0), so its state cannot be rebuilt on the "
                           "fallback backend after the device failed");
    const std::vector<int> history = st.history();
    st.move_to(*fallback_be_);
    if (!history.empty()) {
      fallback_->run(st, history.data(), nullptr, int(history.size()), nullptr, false);
      st.record(history.data(), int(history.size()), true);
    }
  }
  fallback_->run(st, ids, x0, T, logits, all_logits, hooks);
  st.record(ids, T, x0 == nullptr);
}

}  // namespace wren
