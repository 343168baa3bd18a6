// End-to-end checks against tests/data/k3-tiny-a (see its README): every trace row and the
// teacher-forced logits within rel-L2 1e-4, every argmax equal, the greedy continuation equal up
// to the first near-tie, and decode after prefill equal to the teacher-forced pass.
#include <gtest/gtest.h>

#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "runtime/generate.h"
#include "test_util.h"

namespace wren {
namespace {

using test::GoldenCase;
using test::golden_cases;

class Golden : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::golden_dir()).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
};
Model* Golden::model_ = nullptr;

TEST_P(Golden, TraceAndLogitsMatch) {
  const GoldenCase gc = golden_cases()[GetParam()];
  const Config& c = model_->config;
  const int T = int(gc.ids.size()), L = c.n_layers, D = c.hidden, V = c.vocab;
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, c, 256);
  std::vector<float> trace(size_t(T) * L * D), logits(size_t(T) * V);
  ForwardHooks hooks;
  hooks.trace = trace.data();
  fwd.run(st, gc.ids.data(), nullptr, T, logits.data(), true, &hooks);

  // The golden README's criterion is rel-L2 per layer (‖engine − golden‖ / ‖golden‖ over the
  // layer's [T, D] block) within 1e-4. Single rows right after an AttnRes snapshot hold a small P
  // (one layer's outputs), so f32 summation-order noise shows larger there: the golden's own
  // references agree only to ~2.6e-5 per layer, and an f64-accumulating variant of this engine
  // moves such a row further from the golden, not closer. Rows are therefore held to REF's
  // `cmp` threshold 3e-4 (docs/model.md#validation-hooks), layers to 1e-4 (test::expect_golden_trace).
  const auto [worst_row, worst_layer] = test::expect_golden_trace(trace, gc, L, D, gc.name);
  const double lr = test::expect_golden_logits(logits, gc, V, gc.name);
  std::printf("[ %s ] worst layer rel-L2 %.3g, worst row %.3g, logits rel-L2 %.3g\n", gc.name.c_str(),
              worst_layer, worst_row, lr);
}

TEST_P(Golden, GreedyContinuationMatchesUpToFirstNearTie) {
  const GoldenCase gc = golden_cases()[GetParam()];
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, model_->config, 256);
  GenerateOptions o;
  o.max_new_tokens = int(gc.greedy.size());  // no stop id: golden continues past end-of-message
  const std::vector<int> out = generate_greedy(fwd, st, gc.ids, o);
  ASSERT_EQ(out.size(), gc.greedy.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (gc.margins[i] < 0.02) break;  // a near-tie may legitimately flip
    ASSERT_EQ(out[i], gc.greedy[i]) << "step " << i;
  }
}

TEST_P(Golden, DecodeAfterPrefillEqualsTeacherForced) {
  const GoldenCase gc = golden_cases()[GetParam()];
  const Config& c = model_->config;
  const int T = int(gc.ids.size()), V = c.vocab, split = T / 2;
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState full(be, c, 256), inc(be, c, 256);
  std::vector<float> tf(size_t(T) * V), step(size_t(T) * V);
  fwd.run(full, gc.ids.data(), nullptr, T, tf.data(), true);
  fwd.run(inc, gc.ids.data(), nullptr, split, step.data(), true);  // prefill
  for (int t = split; t < T; ++t)                                   // then one token at a time
    fwd.run(inc, gc.ids.data() + t, nullptr, 1, step.data() + size_t(t) * V, false);
  EXPECT_LE(test::rel_l2(step.data(), tf.data(), step.size()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Prompts, Golden, ::testing::Values(0, 1),
                         [](const auto& info) { return "prompt" + std::to_string(info.param); });

}  // namespace
}  // namespace wren
