// Greedy decode with each step recorded while the one before runs (TokenStep::decode_greedy,
// Forward's record-ahead path), on the golden k3-tiny-a model. The recording backend is the test
// wrapper in recording mode (tests/wrapped_backend.h): it queues each recorded op with its
// arguments as the CUDA backend bakes them (an MLA cache's row count advanced when recorded, the
// id of a step recorded ahead read when it runs) and runs them at step_end / step_submit, so a
// held step that is dropped leaves counters to rewind exactly as on the GPU. Every result must
// equal the plain CPU run's: the ids, and the state after (the logits of a later step,
// bit-identical).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "core/argmax.h"
#include "core/error.h"
#include "runtime/generate.h"
#include "runtime/runner.h"
#include "test_util.h"
#include "wrapped_backend.h"

namespace wren {
namespace {

using test::some_ids;

class DecodeGreedy : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::golden_dir()).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
};
Model* DecodeGreedy::model_ = nullptr;

/// The plain greedy loop, written out: prefill, then the arg-max of each step's logits, ending
/// after max_new ids or at a stop id (the step consuming the last id runs when `commit`).
std::vector<int> greedy_by_hand(TokenStep& fwd, SequenceState& st, const std::vector<int>& prompt, int max_new,
                                const std::vector<int>& stop, bool commit) {
  const int V = fwd.config().vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  fwd.run(st, prompt.data(), nullptr, int(prompt.size()), logits.data(), false);
  std::vector<int> ids;
  for (;;) {
    const int id = argmax(logits.data(), V);
    ids.push_back(id);
    const bool last = int(ids.size()) == max_new || std::find(stop.begin(), stop.end(), id) != stop.end();
    if (last && !commit) return ids;
    fwd.run(st, &id, nullptr, 1, logits.data(), false);
    if (last) return ids;
  }
}

}  // namespace

// The steps recorded ahead give the plain greedy loop's ids, and the state after each turn is the
// loop's whatever ended the turn (the token limit, a stop id midway, either with the last token
// committed; one token only): a dropped step's position and MLA row counts are rewound, so the
// next turn and a later step (logits compared bit for bit) see the same state. A held step is
// dropped only when a turn ends before its token limit.
TEST_F(DecodeGreedy, StepsRecordedAheadEqualThePlainLoopWhateverEndsTheTurn) {
  const Config& c = model_->config;
  const int V = c.vocab;
  for (int seed : {3, 4, 5}) {
    for (int end = 0; end < 5; ++end) {  // 0: limit; 1: stop id midway; 2: both committed; 4: one token
      const bool commit = end == 2 || end == 3;
      const int max_new = end == 4 ? 1 : 9, max2 = end == 4 ? 1 : 5;
      const std::vector<int> p1 = some_ids(4 + seed % 5, V, seed), p2 = some_ids(3, V, seed + 100);
      std::vector<int> stop;
      CpuBackend plain;
      Forward ref(*model_, plain, {8, -1});
      if (end == 1 || end == 2) {  // stop at the loop's fourth id
        SequenceState probe(plain, c, 64);
        const std::vector<int> ids = greedy_by_hand(ref, probe, p1, 9, {}, false);
        stop = {ids[3]};
      }
      SequenceState s1(plain, c, 64);
      std::vector<std::vector<int>> want;
      want.push_back(greedy_by_hand(ref, s1, p1, max_new, stop, commit));
      want.push_back(greedy_by_hand(ref, s1, p2, max2, stop, commit));
      std::vector<float> want_after(static_cast<size_t>(V)), got_after(static_cast<size_t>(V));
      const int probe_id = 7;
      ref.run(s1, &probe_id, nullptr, 1, want_after.data(), false);

      CpuBackend inner;
      test::WrappedBackend rec(inner);
      rec.record = true;
      Runner fwd(*model_, rec, {8, -1});
      SequenceState s2(rec, c, 64);
      GenerateOptions o;
      o.stop_ids = stop, o.commit_last = commit;
      std::vector<std::vector<int>> got;
      int early = 0;  // turns ended before their token limit
      for (const auto& [prompt, n] : {std::pair{p1, max_new}, std::pair{p2, max2}}) {
        o.max_new_tokens = n;
        GenerateStats gs;
        got.push_back(generate(fwd, s2, prompt, o, &gs));
        early += gs.generated_tokens < n ? 1 : 0;
        EXPECT_EQ(gs.stopped, got.back().back() == (stop.empty() ? -1 : stop[0]));
      }
      fwd.run(s2, &probe_id, nullptr, 1, got_after.data(), false);
      const std::string where = "seed " + std::to_string(seed) + ", end " + std::to_string(end);
      EXPECT_EQ(got, want) << where;
      EXPECT_EQ(s2.position(), s1.position()) << where;
      EXPECT_EQ(int(s2.history().size()), s2.position()) << where;
      EXPECT_EQ(0, std::memcmp(got_after.data(), want_after.data(), want_after.size() * 4)) << where;
      if (max_new > 2) {
        EXPECT_GT(rec.held, 2) << where << ": steps were recorded ahead";
      }
      EXPECT_EQ(rec.held, rec.submitted + rec.discarded) << where;
      EXPECT_EQ(rec.discarded, early) << where;
    }
  }
}

// A cancel after the third token ends the turn there; the state holds the consumed ids only.
TEST_F(DecodeGreedy, ACancelEndsTheTurnAndDropsTheHeldStep) {
  const Config& c = model_->config;
  const std::vector<int> p = some_ids(5, c.vocab, 41);
  CpuBackend plain;
  Forward ref(*model_, plain, {8, -1});
  SequenceState s1(plain, c, 64);
  const std::vector<int> want = greedy_by_hand(ref, s1, p, 3, {}, false);
  CpuBackend inner;
  test::WrappedBackend rec(inner);
  rec.record = true;
  Runner fwd(*model_, rec, {8, -1});
  SequenceState s2(rec, c, 64);
  std::atomic<bool> cancel{false};
  GenerateOptions o;
  o.max_new_tokens = 9, o.cancel = &cancel;
  GenerateStats gs;
  int seen = 0;
  const std::vector<int> got = generate(fwd, s2, p, o, &gs, [&](int) { cancel = ++seen == 3; });
  EXPECT_EQ(got, want);
  EXPECT_TRUE(gs.cancelled);
  EXPECT_EQ(s2.position(), s1.position());
  EXPECT_EQ(rec.discarded, 1);
}

// decode_greedy itself: on_id sees each step's id in order, the steps run equal the ids taken,
// and a step recorded ahead is dropped when on_id says stop (also on the last allowed step).
TEST_F(DecodeGreedy, StopsWhereOnIdSaysAndAtMaxSteps) {
  const Config& c = model_->config;
  const std::vector<int> p = some_ids(6, c.vocab, 11);
  std::vector<float> logits(c.vocab);
  CpuBackend plain;
  Forward ref(*model_, plain, {8, -1});
  SequenceState s1(plain, c, 64);
  ref.run(s1, p.data(), nullptr, int(p.size()), logits.data(), false);
  std::vector<int> want;
  EXPECT_EQ(ref.decode_greedy(s1, 5, 6, [&](int id) { return want.push_back(id), true; }), 6);
  ASSERT_EQ(want.size(), 6u);

  for (int stop_after : {1, 3, 6}) {
    CpuBackend inner;
    test::WrappedBackend rec(inner);
    rec.record = true;
    Forward fwd(*model_, rec, {8, -1});
    SequenceState s2(rec, c, 64);
    fwd.run(s2, p.data(), nullptr, int(p.size()), logits.data(), false);
    std::vector<int> got;
    const int ran = fwd.decode_greedy(s2, 5, 6, [&](int id) { return got.push_back(id), int(got.size()) < stop_after; });
    EXPECT_EQ(ran, stop_after);
    EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + stop_after));
    EXPECT_EQ(s2.position(), int(p.size()) + stop_after) << "the dropped step is rewound";
    EXPECT_EQ(rec.discarded, stop_after < 6 ? 1 : 0);
    EXPECT_EQ(fwd.decode_greedy(s2, 5, 0, [](int) { return true; }), 0);
  }
}

// An error while recording ahead does not cost the id of the step that ran: a fault in one
// recording drops it (rewound) and the step runs again unrecorded, with the plain ids; a context
// that fills up delivers every id that fits, as the step-by-step path does, then throws.
TEST_F(DecodeGreedy, AnErrorWhileRecordingAheadKeepsTheIdsThatRan) {
  const Config& c = model_->config;
  const std::vector<int> p = some_ids(6, c.vocab, 51);
  CpuBackend plain;
  Forward ref(*model_, plain, {8, -1});
  std::vector<int> want;
  {
    SequenceState s1(plain, c, 16);
    ref.run(s1, p.data(), nullptr, int(p.size()), nullptr, false);
    EXPECT_THROW(ref.decode_greedy(s1, 5, 20, [&](int id) { return want.push_back(id), true; }), Error);
    EXPECT_EQ(int(want.size()), 16 - int(p.size())) << "one step per free row";
  }
  for (int fault_at : {0, 25, 130}) {  // 0: no transient fault, only the context limit
    CpuBackend inner;
    test::WrappedBackend rec(inner);
    rec.record = true;
    Forward fwd(*model_, rec, {8, -1});
    SequenceState s2(rec, c, 16);
    fwd.run(s2, p.data(), nullptr, int(p.size()), nullptr, false);
    int n = 0;  // ops recorded into steps recorded ahead
    bool ahead = false;
    rec.on_step = [&](const StepInfo& st) { ahead = st.ahead; };
    rec.on_record = [&](const char*) {
      if (ahead && ++n == fault_at) throw Error("injected fault while recording ahead");
    };
    std::vector<int> got;
    EXPECT_THROW(fwd.decode_greedy(s2, 5, 20, [&](int id) { return got.push_back(id), true; }), Error);
    EXPECT_EQ(got, want) << "fault_at " << fault_at;
    EXPECT_EQ(s2.position(), 16) << "fault_at " << fault_at;
    EXPECT_EQ(rec.held, rec.submitted + rec.discarded) << "fault_at " << fault_at;
    EXPECT_EQ(n >= fault_at, true) << "the fault fired (fault_at " << fault_at << ")";
  }
}

// An exception from on_id propagates; the held step is dropped and the state holds exactly the
// steps that ran (a later step gives the plain run's logits).
TEST_F(DecodeGreedy, AThrowingOnIdDropsTheHeldStep) {
  const Config& c = model_->config;
  const int V = c.vocab;
  const std::vector<int> p = some_ids(5, V, 61);
  CpuBackend plain;
  Forward ref(*model_, plain, {8, -1});
  SequenceState s1(plain, c, 64);
  ref.run(s1, p.data(), nullptr, int(p.size()), nullptr, false);
  ref.decode_greedy(s1, 5, 3, [](int) { return true; });
  std::vector<float> want(static_cast<size_t>(V)), got(static_cast<size_t>(V));
  const int id = 9;
  ref.run(s1, &id, nullptr, 1, want.data(), false);

  CpuBackend inner;
  test::WrappedBackend rec(inner);
  rec.record = true;
  Forward fwd(*model_, rec, {8, -1});
  SequenceState s2(rec, c, 64);
  fwd.run(s2, p.data(), nullptr, int(p.size()), nullptr, false);
  int seen = 0;
  EXPECT_THROW(fwd.decode_greedy(s2, 5, 10, [&](int) -> bool {
    if (++seen == 3) throw Error("caller failed");
    return true;
  }), Error);
  EXPECT_EQ(rec.discarded, 1);
  EXPECT_EQ(s2.position(), s1.position() - 1);
  fwd.run(s2, &id, nullptr, 1, got.data(), false);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), size_t(V) * 4));
}

// A device failure midway (the runner's CPU fallback, runtime/runner.h): the ids taken before it
// are kept, the state is rebuilt from its log, and the turn ends with the plain run's ids.
TEST_F(DecodeGreedy, ADeviceFaultMidwayContinuesOnTheFallbackWithThePlainIds) {
  const Config& c = model_->config;
  const std::vector<int> p = some_ids(5, c.vocab, 21);
  GenerateOptions o;
  o.max_new_tokens = 10;
  CpuBackend plain;
  Runner ref(*model_, plain, {8, -1});
  SequenceState s1(plain, c, 64);
  const std::vector<int> want = generate(ref, s1, p, o);
  for (int fail_at : {40, 200, 400, -30, -150}) {  // < 0: while recording a step ahead (op -fail_at of those)
    CpuBackend inner;
    test::WrappedBackend rec(inner);
    rec.record = true;
    int n = 0;
    bool fired = false;
    Runner fwd(*model_, rec, {8, -1});
    fwd.set_fallback([] { return std::unique_ptr<Backend>(std::make_unique<CpuBackend>()); });
    SequenceState s2(rec, c, 64);
    fwd.run(s2, p.data(), nullptr, int(p.size()) - 1, nullptr, false);  // all but the last prompt token
    rec.before = [&](const char*) {
      if (++n == fail_at) fired = true, throw DeviceError("injected device fault");
    };
    bool ahead = false;
    int recorded_ahead = 0;  // ops recorded into steps recorded ahead
    rec.on_step = [&](const StepInfo& s) { ahead = s.ahead; };
    rec.on_record = [&](const char*) {
      if (ahead && ++recorded_ahead == -fail_at) fired = true, throw DeviceError("injected device fault while recording");
    };
    testing::internal::CaptureStderr();
    std::vector<int> got;
    const int last = p.back();
    // The last prompt token, then greedy steps: the same ids as generate's decode (its first id
    // is drawn from the prompt's logits, here by the first step).
    fwd.decode_greedy(s2, last, o.max_new_tokens, [&](int id) { return got.push_back(id), true; });
    testing::internal::GetCapturedStderr();
    ASSERT_TRUE(fired) << "fail_at " << fail_at;
    EXPECT_TRUE(fwd.on_fallback());
    EXPECT_EQ(got, want) << "fail_at " << fail_at;
    EXPECT_EQ(s2.history().size(), p.size() + want.size() - 1) << "fail_at " << fail_at;
  }
}

// The default path (a backend that records nothing, the CPU): decode_greedy runs the steps one
// after another and gives run_mixed's ids; an ahead step the backend will not record runs nothing.
TEST_F(DecodeGreedy, WithoutRecordingTheStepsRunOneByOne) {
  const Config& c = model_->config;
  CpuBackend inner;
  test::WrappedBackend be(inner);  // records nothing
  int ahead = 0;
  be.on_step = [&](const StepInfo& s) { ahead += s.ahead ? 1 : 0; };
  Forward fwd(*model_, be, {8, -1});
  SequenceState st(be, c, 64);
  const std::vector<int> p = some_ids(4, c.vocab, 31);
  fwd.run(st, p.data(), nullptr, int(p.size()), nullptr, false);
  std::vector<int> got;
  EXPECT_EQ(fwd.decode_greedy(st, 9, 5, [&](int id) { return got.push_back(id), true; }), 5);
  EXPECT_EQ(st.position(), int(p.size()) + 5);
  EXPECT_EQ(ahead, 4) << "each step but the last was offered ahead and declined";
  // The same ids step by step through run_mixed.
  SequenceState s2(be, c, 64);
  fwd.run(s2, p.data(), nullptr, int(p.size()), nullptr, false);
  int in = 9;
  for (int i = 0; i < 5; ++i) {
    int id = -1;
    const BatchEntry e{&s2, &in, 1, nullptr, &id};
    fwd.run_mixed(&e, 1);
    EXPECT_EQ(id, got[size_t(i)]) << "step " << i;
    in = id;
  }
}

}  // namespace wren
