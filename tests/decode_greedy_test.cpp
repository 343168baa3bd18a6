// Greedy decode with each step recorded while the one before runs (TokenStep::decode_greedy,
// Forward's record-ahead path), on the golden k3-tiny-a model. The recording backend is the test
// wrapper in recording mode (tests/wrapped_backend.h): it queues each recorded op with its
// arguments as the CUDA backend bakes them (an MLA cache's row count advanced when recorded, the
// id of a step recorded ahead read when it runs) and runs them at step_end / step_submit, so a
// held step that is dropped leaves counters to rewind exactly as on the GPU. Every result must
// equal the plain CPU run's: the ids, and the state after (the logits of a later step,
// bit-identical).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "backends/cpu/cpu_backend.h"
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

/// Two turns on one state: generate(first prompt, o), then generate(second prompt, o2); returns
/// both turns' ids, and the logits of one more step (id 7) after them in `after`.
std::vector<std::vector<int>> two_turns(TokenStep& fwd, SequenceState& st, const GenerateOptions& o,
                                        const GenerateOptions& o2, int seed, std::vector<float>& after) {
  const int V = fwd.config().vocab;
  std::vector<std::vector<int>> ids;
  ids.push_back(generate(fwd, st, some_ids(4 + seed % 5, V, seed), o));
  ids.push_back(generate(fwd, st, some_ids(3, V, seed + 100), o2));
  after.resize(size_t(V));
  const int id = 7;
  fwd.run(st, &id, nullptr, 1, after.data(), false);
  return ids;
}

}  // namespace

// The steps recorded ahead give the plain run's ids, and the state after each turn is the plain
// run's whatever ended the turn (the token limit, a stop id midway, a committed last token): a
// dropped step's position and MLA row counts are rewound, so the next turn and a later step
// (logits compared bit for bit) see the same state.
TEST_F(DecodeGreedy, StepsRecordedAheadEqualThePlainRunWhateverEndsTheTurn) {
  const Config& c = model_->config;
  for (int seed : {3, 4, 5}) {
    for (int end = 0; end < 4; ++end) {  // 0: token limit; 1: stop id midway; 2: the same, committed; 3: limit, committed
      GenerateOptions o;
      o.max_new_tokens = 9;
      o.commit_last = end >= 2;
      GenerateOptions o2 = o;
      o2.max_new_tokens = 5;
      CpuBackend plain;
      Runner ref(*model_, plain, {8, -1});
      if (end == 1 || end == 2) {  // stop at the plain run's fourth id
        SequenceState probe(plain, c, 64);
        const std::vector<int> ids = generate(ref, probe, some_ids(4 + seed % 5, c.vocab, seed), o);
        ASSERT_GE(ids.size(), 5u);
        o.stop_ids = {ids[3]};
      }
      std::vector<float> want_after, got_after;
      SequenceState s1(plain, c, 64);
      const auto want = two_turns(ref, s1, o, o2, seed, want_after);

      CpuBackend inner;
      test::WrappedBackend rec(inner);
      rec.record = true;
      Runner fwd(*model_, rec, {8, -1});
      SequenceState s2(rec, c, 64);
      const auto got = two_turns(fwd, s2, o, o2, seed, got_after);
      const std::string where = "seed " + std::to_string(seed) + ", end " + std::to_string(end);
      EXPECT_EQ(got, want) << where;
      EXPECT_EQ(s2.position(), s1.position()) << where;
      EXPECT_EQ(s2.history(), s1.history()) << where;
      EXPECT_EQ(0, std::memcmp(got_after.data(), want_after.data(), want_after.size() * 4)) << where;
      EXPECT_GT(rec.held, 4) << where << ": steps were recorded ahead";
      EXPECT_EQ(rec.held, rec.submitted + rec.discarded) << where;
      // A turn that ends without committing its last token drops the step recorded after it.
      EXPECT_EQ(rec.discarded, end < 2 ? 2 : end == 2 ? 1 : 0) << where;
    }
  }
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
  for (int fail_at : {40, 200, 400}) {
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
