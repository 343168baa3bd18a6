// Batched decode (Forward::run_batch, Runner::run_batch) on the golden model, CPU: one step over B
// sequences must give each sequence exactly what its solo run gives (logits bit-identical), whoever
// its batch mates are and however they join and leave; no state aliasing between sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "core/argmax.h"
#include "core/error.h"
#include "runtime/generate.h"
#include "runtime/runner.h"
#include "runtime/scheduler.h"
#include "test_util.h"
#include "wrapped_backend.h"

namespace wren {
namespace {

using test::some_ids;

class Batched : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::golden_dir()).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
};
Model* Batched::model_ = nullptr;

/// Solo greedy decode: the logits rows [steps, V] each id was drawn from, after prefilling `p`.
std::vector<float> solo(Runner& fwd, Backend& be, const Config& c, const std::vector<int>& p, int steps) {
  SequenceState st(be, c, 256);
  const size_t V = c.vocab;
  std::vector<float> rows(steps * V);
  fwd.run(st, p.data(), nullptr, int(p.size()), rows.data(), false);
  for (int s = 0; s + 1 < steps; ++s) {
    const int id = argmax(&rows[s * V], int(V));
    fwd.run(st, &id, nullptr, 1, &rows[(s + 1) * V], false);
  }
  return rows;
}

TEST_F(Batched, EightSequencesJoiningAndLeavingEqualTheirSoloRuns) {
  const Config& c = model_->config;
  const size_t V = c.vocab;
  CpuBackend be;
  Runner fwd(*model_, be, {8, -1});  // chunk 8: a batch of 8 fills it; the 9th starts a second group
  const int N = 9, steps = 7;
  std::vector<std::vector<int>> prompts;
  std::vector<std::vector<float>> want;
  for (int i = 0; i < N; ++i) {
    prompts.push_back(some_ids(3 + 5 * i, c.vocab, i + 1));
    want.push_back(solo(fwd, be, c, prompts.back(), steps));
  }
  // Sequence i joins at step i / 2 (its prefill runs alone, between steps) and leaves after `steps`
  // decoded rows: the batch grows from 1 to 9 and shrinks again.
  std::vector<std::unique_ptr<SequenceState>> st;
  std::vector<std::vector<float>> got(N);
  std::vector<int> next(N, -1);
  for (int step = 0; step < steps + N; ++step) {
    for (int i = 0; i < N; ++i)
      if (i / 2 == step) {
        st.push_back(std::make_unique<SequenceState>(be, c, 256));
        std::vector<float> row(V);
        fwd.run(*st.back(), prompts[i].data(), nullptr, int(prompts[i].size()), row.data(), false);
        got[i] = row;
        next[i] = argmax(row.data(), int(V));
      }
    std::vector<SequenceState*> batch;
    std::vector<int> ids, who;
    for (int i = 0; i < int(st.size()); ++i)
      if (int(got[i].size()) < steps * int(V)) batch.push_back(st[i].get()), ids.push_back(next[i]), who.push_back(i);
    if (batch.empty()) continue;
    std::vector<float> logits(batch.size() * V);
    fwd.run_batch(batch.data(), ids.data(), int(batch.size()), logits.data());
    for (size_t b = 0; b < batch.size(); ++b) {
      const int i = who[b];
      got[i].insert(got[i].end(), logits.begin() + b * V, logits.begin() + (b + 1) * V);
      next[i] = argmax(&logits[b * V], int(V));
    }
  }
  for (int i = 0; i < N; ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "sequence " << i;
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * 4)) << "sequence " << i;
    EXPECT_EQ(st[i]->position(), int(prompts[i].size()) + steps - 1);
    EXPECT_EQ(int(st[i]->history().size()), st[i]->position()) << "the runner logs batched ids too";
  }
}

TEST_F(Batched, AStateTwiceInOneBatchIsAnError) {
  CpuBackend be;
  Runner fwd(*model_, be);
  SequenceState a(be, model_->config, 64), b(be, model_->config, 64);
  const int id = 5;
  fwd.run(a, &id, nullptr, 1, nullptr, false);
  fwd.run(b, &id, nullptr, 1, nullptr, false);
  SequenceState* twice[] = {&a, &b, &a};
  const int ids[] = {1, 2, 3};
  EXPECT_THROW(fwd.run_batch(twice, ids, 3, nullptr), Error);
}

// The scheduler over 8 different prompts at once (max_seqs 3: they queue, join and leave), sampled
// with per-request seeds: every sequence's ids equal its solo generate(); a request whose token
// callback throws fails alone (on_error) and the others finish.
TEST_F(Batched, SchedulerEightPromptsEqualSoloAndAThrowingCallbackFailsOnlyItsSequence) {
  const Config& c = model_->config;
  CpuBackend be;
  Runner fwd(*model_, be);
  std::vector<std::vector<int>> prompts, want;
  for (int i = 0; i < 8; ++i) prompts.push_back(some_ids(4 + 3 * i, c.vocab, 70 + i));
  auto opts = [](int i) {
    GenerateOptions o;
    o.max_new_tokens = 4 + i % 3;
    o.sampling.temperature = 0.9f;
    o.sampling.seed = 100 + i;
    return o;
  };
  for (int i = 0; i < 8; ++i) {
    SequenceState st(be, c, 128);
    want.push_back(generate(fwd, st, prompts[i], opts(i)));
  }
  Scheduler sched(fwd, [&] { return std::make_unique<SequenceState>(be, c, 128); }, 3);
  std::vector<std::vector<int>> got(9);
  std::vector<int> done(9, 0), failed(9, 0);
  for (int i = 0; i < 9; ++i) {
    SeqRequest r;
    r.prompt = prompts[i % 8];
    r.opts = opts(i % 8);
    r.on_token = [&, i](int id) {
      if (i == 8 && !got[8].empty()) throw Error("the reply side failed");
      got[i].push_back(id);
    };
    r.on_done = [&, i](const GenerateStats&) { ++done[i]; };
    r.on_error = [&, i](const std::string&) { ++failed[i]; };
    sched.add(std::move(r));
  }
  for (int n = 0; n < 200 && !sched.idle(); ++n) {
    sched.step();
    EXPECT_LE(sched.running(), 3);
  }
  EXPECT_TRUE(sched.idle());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(got[i], want[i]) << "sequence " << i;
    EXPECT_EQ(done[i], 1);
    EXPECT_EQ(failed[i], 0);
  }
  EXPECT_EQ(failed[8], 1);
  EXPECT_EQ(done[8], 0);
}

// Continuous batching (--max-batch-tokens): a long prompt that arrives while a sequence decodes is
// prefilled in pieces between that sequence's tokens (the decode never stalls for the whole
// prefill), the prefill budget goes oldest first (a newer, shorter prompt does not overtake an
// older long one), no step exceeds the budget, and every sequence's ids and logprobs (f64 from the
// logits rows) equal its solo generate(): the result does not depend on how a prompt is cut nor
// on its step mates.
TEST_F(Batched, SchedulerInterleavesALongPrefillWithRunningDecodesUnderTheTokenBudget) {
  const Config& c = model_->config;
  CpuBackend be;
  Runner fwd(*model_, be);
  struct Want {
    std::vector<int> ids;
    std::vector<double> lps;
  };
  const std::vector<std::vector<int>> prompts = {some_ids(5, c.vocab, 91), some_ids(180, c.vocab, 92),
                                                 some_ids(40, c.vocab, 93)};
  const int max_new[3] = {60, 5, 5};
  auto opts = [&](int i, std::vector<double>* lps) {
    GenerateOptions o;
    o.max_new_tokens = max_new[i];
    o.top_logprobs = 0;
    o.on_logprobs = [lps](const TokenLogprobs& lp) { lps->push_back(lp.logprob); };
    return o;
  };
  std::vector<Want> want(3);
  for (int i = 0; i < 3; ++i) {
    SequenceState st(be, c, 256);
    want[i].ids = generate(fwd, st, prompts[i], opts(i, &want[i].lps));
  }
  const int budget = 16;
  Scheduler sched(fwd, [&] { return std::make_unique<SequenceState>(be, c, 256); }, 4, budget);
  std::vector<Want> got(3);
  std::vector<int> first_step(3, -1);
  std::vector<std::vector<int>> tok_step(3);  // the step each token came in
  int step = 0;
  auto add = [&](int i) {
    SeqRequest r;
    r.prompt = prompts[i];
    r.opts = opts(i, &got[i].lps);
    r.on_token = [&, i](int id) {
      if (got[i].ids.empty()) first_step[i] = step;
      got[i].ids.push_back(id);
      tok_step[i].push_back(step);
    };
    r.on_error = [i](const std::string& m) { ADD_FAILURE() << "sequence " << i << ": " << m; };
    sched.add(std::move(r));
  };
  add(0);
  for (; got[0].ids.size() < 3; ++step) sched.step();
  const int b_added = step;
  add(1);  // the long prompt, then a newer shorter one
  add(2);
  for (int n = 0; n < 400 && !sched.idle(); ++n, ++step) {
    sched.step();
    EXPECT_LE(sched.last_decode_rows() + sched.last_prefill_rows(), budget) << "step " << step;
    EXPECT_LE(sched.running(), 4);
  }
  ASSERT_TRUE(sched.idle());
  ASSERT_GE(first_step[1], 0);
  ASSERT_GE(first_step[2], 0);
  // While the 180-token prompt was prefilled (>= 180 / 15 steps), the running sequence kept
  // decoding a token per step.
  const int steps_b = first_step[1] - b_added + 1;  // its last piece runs in first_step[1]
  EXPECT_GE(steps_b, 180 / (budget - 1)) << "the long prompt ran in fewer steps than the budget allows";
  const int a_during = int(std::count_if(tok_step[0].begin(), tok_step[0].end(),
                                         [&](int t) { return t >= b_added && t <= first_step[1]; }));
  EXPECT_GE(a_during, steps_b - 1) << "the running decode stalled while the long prompt was prefilled";
  EXPECT_LT(first_step[1], first_step[2]) << "the newer, shorter prompt overtook the older long one";
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].ids, want[i].ids) << "sequence " << i;
    EXPECT_EQ(got[i].lps, want[i].lps) << "sequence " << i << ": logprobs differ from the solo run";
  }
}

// A budget below --max-seqs could starve a prefill behind the decodes: refused.
TEST_F(Batched, SchedulerRefusesABudgetBelowMaxSeqs) {
  CpuBackend be;
  Runner fwd(*model_, be);
  auto mk = [&] { return std::make_unique<SequenceState>(be, model_->config, 64); };
  EXPECT_THROW(Scheduler(fwd, mk, 8, 4), Error);
  EXPECT_NO_THROW(Scheduler(fwd, mk, 8, 8));
  EXPECT_NO_THROW(Scheduler(fwd, mk, 8, 0));
}

// Forward::run_mixed: decodes and prefill chunks of several sequences in one step, with more rows
// than the chunk (an entry split between two groups), give each sequence the logits its solo run
// gives, bit for bit.
TEST_F(Batched, MixedStepOfDecodesAndPrefillChunksEqualsSoloRuns) {
  const Config& c = model_->config;
  const size_t V = c.vocab;
  CpuBackend be;
  Runner fwd(*model_, be, {8, -1});
  const std::vector<int> pa = some_ids(6, c.vocab, 31), pb = some_ids(11, c.vocab, 32), pc = some_ids(9, c.vocab, 33);
  // Solo: a decodes one id after its prompt; b prefills its 11 in one call; c its first 4, then 5.
  std::vector<float> wa(V), wb(V), wc(V), ga(V), gb(V), gc(V);
  {
    SequenceState a(be, c, 64), b(be, c, 64), cc(be, c, 64);
    fwd.run(a, pa.data(), nullptr, int(pa.size()), nullptr, false);
    const int id = 7;
    fwd.run(a, &id, nullptr, 1, wa.data(), false);
    fwd.run(b, pb.data(), nullptr, int(pb.size()), wb.data(), false);
    fwd.run(cc, pc.data(), nullptr, 9, wc.data(), false);
  }
  SequenceState a(be, c, 64), b(be, c, 64), cc(be, c, 64);
  fwd.run(a, pa.data(), nullptr, int(pa.size()), nullptr, false);
  fwd.run(cc, pc.data(), nullptr, 4, nullptr, false);
  const int id = 7;
  const BatchEntry es[] = {{&a, &id, 1, ga.data()}, {&b, pb.data(), 11, gb.data()}, {&cc, pc.data() + 4, 5, gc.data()}};
  fwd.run_mixed(es, 3);  // 17 rows in chunks of 8: b spans groups 1-2, c groups 2-3
  EXPECT_EQ(0, std::memcmp(ga.data(), wa.data(), V * 4));
  EXPECT_EQ(0, std::memcmp(gb.data(), wb.data(), V * 4));
  EXPECT_EQ(0, std::memcmp(gc.data(), wc.data(), V * 4));
  EXPECT_EQ(a.position(), 7);
  EXPECT_EQ(b.position(), 11);
  EXPECT_EQ(cc.position(), 9);
  EXPECT_EQ(int(b.history().size()), 11) << "the runner logs mixed ids";
  const BatchEntry twice[] = {{&a, &id, 1, nullptr}, {&a, &id, 1, nullptr}};
  EXPECT_THROW(fwd.run_mixed(twice, 2), Error);
}

// Greedy ids (BatchEntry::greedy): a greedy-only entry gets the host argmax of the logits its solo
// run gives, without those logits leaving the backend; an entry may ask for both. Mixed with
// logits-only entries, in groups that split entries, the logits rows stay bit-identical.
TEST_F(Batched, GreedyIdsOfAMixedStepAreTheArgmaxOfTheSoloLogits) {
  const Config& c = model_->config;
  const size_t V = c.vocab;
  CpuBackend be;
  Runner fwd(*model_, be, {8, -1});
  const std::vector<int> pa = some_ids(6, c.vocab, 41), pb = some_ids(11, c.vocab, 42), pc = some_ids(9, c.vocab, 43),
                         pd = some_ids(5, c.vocab, 44);
  std::vector<float> wa(V), wb(V), wc(V), wd(V), gb(V), gd(V);
  const int id = 7;
  {
    SequenceState a(be, c, 64), b(be, c, 64), cc(be, c, 64), d(be, c, 64);
    fwd.run(a, pa.data(), nullptr, int(pa.size()), nullptr, false);
    fwd.run(a, &id, nullptr, 1, wa.data(), false);
    fwd.run(b, pb.data(), nullptr, int(pb.size()), wb.data(), false);
    fwd.run(cc, pc.data(), nullptr, 9, wc.data(), false);
    fwd.run(d, pd.data(), nullptr, int(pd.size()), nullptr, false);
    fwd.run(d, &id, nullptr, 1, wd.data(), false);
  }
  SequenceState a(be, c, 64), b(be, c, 64), cc(be, c, 64), d(be, c, 64);
  fwd.run(a, pa.data(), nullptr, int(pa.size()), nullptr, false);
  fwd.run(cc, pc.data(), nullptr, 4, nullptr, false);
  fwd.run(d, pd.data(), nullptr, int(pd.size()), nullptr, false);
  int ia = -1, ib = -1, ic = -1;
  const BatchEntry es[] = {{&a, &id, 1, nullptr, &ia},
                           {&b, pb.data(), 11, gb.data(), &ib},
                           {&cc, pc.data() + 4, 5, nullptr, &ic},
                           {&d, &id, 1, gd.data()}};
  fwd.run_mixed(es, 4);  // 18 rows in groups of 8: b spans groups 1-2, c groups 2-3
  EXPECT_EQ(ia, argmax(wa.data(), int(V)));
  EXPECT_EQ(ib, argmax(wb.data(), int(V)));
  EXPECT_EQ(ic, argmax(wc.data(), int(V)));
  EXPECT_EQ(0, std::memcmp(gb.data(), wb.data(), V * 4));
  EXPECT_EQ(0, std::memcmp(gd.data(), wd.data(), V * 4));
  EXPECT_EQ(a.position(), 7);
  EXPECT_EQ(cc.position(), 9);
  // The backend's rule itself: first index of the maximum, -0 == +0, -1 for a non-finite row.
  const float inf = INFINITY, nan = std::nanf("");
  const std::vector<float> rows = {1.f, 3.f, 3.f, 2.f, -2.f, -0.f, 0.f, -1.f, 5.f, 4.f, inf, 0.f, 0.f, nan, 9.f, 1.f};
  float* dr = be.alloc(rows.size());
  float* dout = be.alloc(4);
  be.from_host(rows.data(), rows.size(), dr);
  be.argmax_rows(dr, 4, 4, dout);
  std::vector<float> got(4);
  be.to_host(dout, 4, got.data());
  EXPECT_EQ(got, (std::vector<float>{1.f, 1.f, -1.f, -1.f}));
  be.release(dr), be.release(dout);
}

// generate() of a plain greedy request draws from each step's greedy id (the logits stay with the
// backend); with the logits hash on it draws on the host from the copied rows: the same ids.
TEST_F(Batched, GreedyGenerateDrawsTheSameIdsWithoutTheHostLogits) {
  const Config& c = model_->config;
  CpuBackend be;
  Runner fwd(*model_, be, {8, -1});
  for (int seed : {51, 52, 53}) {
    const std::vector<int> p = some_ids(5 + seed % 7, c.vocab, seed);
    GenerateOptions o;
    o.max_new_tokens = 12;
    ASSERT_FALSE(o.needs_logits());
    SequenceState s1(be, c, 64), s2(be, c, 64);
    const std::vector<int> device_draw = generate(fwd, s1, p, o);
    o.hash_logits = true;
    ASSERT_TRUE(o.needs_logits());
    const std::vector<int> host_draw = generate(fwd, s2, p, o);
    EXPECT_EQ(device_draw, host_draw) << "seed " << seed;
    EXPECT_EQ(s1.position(), s2.position());
  }
}

TEST_F(Batched, OnlyTheRowsThatWantLogitsComeToTheHost) {
  // A step of three decode entries, greedy-only, logits, greedy-only: one logits row and the three
  // ids come to the host, not three logits rows (the greedy rows' logits stay on the device).
  const Config& c = model_->config;
  const size_t V = c.vocab;
  CpuBackend inner;
  test::WrappedBackend be(inner);
  Runner fwd(*model_, be, {8, -1});
  std::vector<std::unique_ptr<SequenceState>> st;
  std::vector<float> want(V), got(V);
  for (int i = 0; i < 3; ++i) {
    st.push_back(std::make_unique<SequenceState>(be, c, 64));
    const std::vector<int> p = some_ids(4 + i, c.vocab, 60 + i);
    fwd.run(*st.back(), p.data(), nullptr, int(p.size()), want.data(), false);
  }
  {
    SequenceState solo(be, c, 64);
    const std::vector<int> p = some_ids(5, c.vocab, 61);
    fwd.run(solo, p.data(), nullptr, int(p.size()), nullptr, false);
    const int id = 3;
    fwd.run(solo, &id, nullptr, 1, want.data(), false);
  }
  const int ids[3] = {1, 3, 5};
  int g0 = -1, g2 = -1;
  const BatchEntry es[] = {{st[0].get(), &ids[0], 1, nullptr, &g0},
                           {st[1].get(), &ids[1], 1, got.data()},
                           {st[2].get(), &ids[2], 1, nullptr, &g2}};
  const size_t before = be.host_floats;
  fwd.run_mixed(es, 3);
  EXPECT_EQ(be.host_floats - before, V + 3) << "one logits row and three ids";
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), V * 4)) << "the logits row is its solo run's";
  EXPECT_GE(g0, 0);
  EXPECT_GE(g2, 0);
  EXPECT_EQ(ForwardOptions{}.graph_rows, 1) << "by default only single-token steps are recorded";
}

TEST_F(Batched, OnlySingleTokenStepsAreOfferedForRecordingByDefault) {
  // ForwardOptions::graph_rows: the default pass offers a single-token step for recording and runs
  // a batched step and a prefill chunk op by op; with graph_rows = 4 a batched decode step of up to
  // 4 sequences is offered too; with graph off, nothing.
  const Config& c = model_->config;
  CpuBackend inner;
  test::WrappedBackend be(inner);
  std::vector<std::pair<int, bool>> seen;  // (tokens, may_record) of each step
  be.on_step = [&](const StepInfo& s) { seen.emplace_back(s.tokens, s.may_record); };
  for (const int rows : {1, 4, 0}) {
    ForwardOptions o;
    o.max_chunk = 8, o.graph_rows = std::max(rows, 1), o.graph = rows > 0;
    Runner fwd(*model_, be, o);
    std::vector<std::unique_ptr<SequenceState>> st;
    std::vector<SequenceState*> batch;
    std::vector<float> logits(size_t(5) * c.vocab);
    for (int i = 0; i < 5; ++i) {
      st.push_back(std::make_unique<SequenceState>(be, c, 64));
      batch.push_back(st.back().get());
      const std::vector<int> p = some_ids(3 + i, c.vocab, 90 + i);
      fwd.run(*st.back(), p.data(), nullptr, int(p.size()), logits.data(), false);
    }
    seen.clear();
    const int ids[5] = {1, 2, 3, 4, 5};
    fwd.run(*st[0], ids, nullptr, 1, logits.data(), false);  // a single-token step
    for (const int B : {2, 4, 5}) fwd.run_batch(batch.data(), ids, B, logits.data());
    const std::vector<std::pair<int, bool>> want = {
        {1, rows > 0}, {2, rows >= 2}, {4, rows >= 4}, {5, false}};
    EXPECT_EQ(seen, want) << "graph_rows " << rows;
  }
}

// A measurement, not a check (disabled; run with --gtest_also_run_disabled_tests): decode
// throughput of one batched step over B sequences, B = 1, 4, 16, side by side in one run, on the
// golden model or the snapshot in WREN_BATCH_MODEL (docs/serve.md records the numbers).
TEST_F(Batched, DISABLED_DecodeTokensPerSecondAtOneFourAndSixteenSequences) {
  const char* dir = std::getenv("WREN_BATCH_MODEL");
  std::unique_ptr<Model> other = dir ? load_model(dir) : nullptr;
  const Model& m = other ? *other : *model_;
  const Config& c = m.config;
  CpuBackend be;
  Runner fwd(m, be, {16, -1});
  const int steps = 12;
  double tps[3] = {0, 0, 0};
  const int Bs[3] = {1, 4, 16};
  for (int k = 0; k < 3; ++k) {
    const int B = Bs[k];
    std::vector<std::unique_ptr<SequenceState>> st;
    std::vector<SequenceState*> batch;
    for (int b = 0; b < B; ++b) {
      st.push_back(std::make_unique<SequenceState>(be, c, 256));
      const std::vector<int> p = some_ids(16, c.vocab, 60 + b);
      fwd.run(*st.back(), p.data(), nullptr, int(p.size()), nullptr, false);
      batch.push_back(st.back().get());
    }
    std::vector<float> logits(size_t(B) * c.vocab);
    std::vector<int> ids(B);
    for (int b = 0; b < B; ++b) ids[b] = (b * 37 + 11) % c.vocab;
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      fwd.run_batch(batch.data(), ids.data(), B, logits.data());
      for (int b = 0; b < B; ++b) ids[b] = argmax(&logits[size_t(b) * c.vocab], c.vocab);
    }
    tps[k] = B * steps / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("[ batched decode ] %s CPU: %.0f tok/s at B=1, %.0f at B=4 (%.2fx), %.0f at B=16 (%.2fx)\n", dir ? dir : "k3-tiny-a", tps[0],
              tps[1], tps[1] / tps[0], tps[2], tps[2] / tps[0]);
}

}  // namespace
}  // namespace wren
