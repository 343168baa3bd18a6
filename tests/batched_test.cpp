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
#include "core/error.h"
#include "runtime/generate.h"
#include "runtime/runner.h"
#include "runtime/scheduler.h"
#include "test_util.h"

namespace wren {
namespace {

using test::some_ids;

int argmax(const float* v, int n) { return int(std::max_element(v, v + n) - v); }

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
