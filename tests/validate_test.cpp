// `wren validate`'s comparison (runtime/validate.h) and the forward's CPU fallback after a device
// failure (Runner::set_fallback, runtime/runner.h), on the golden k3-tiny-a model with CPU backends; the wrapped
// backend plants bugs and faults. The CUDA fault-injection run is in cuda_model_test.cpp.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/forward.h"
#include "runtime/runner.h"
#include "runtime/validate.h"
#include "test_util.h"
#include "wrapped_backend.h"

namespace wren {
namespace {

class Validate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::golden_dir()).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
  static std::vector<int> prompt() { return {4096, 976, 2328, 2258, 328, 2312, 766, 382, 11, 290, 1001}; }
};
Model* Validate::model_ = nullptr;

TEST_F(Validate, SameBackendIsExact) {
  CpuBackend a, b;
  Forward ref(*model_, a), cand(*model_, b);
  const PromptCheck r = validate_prompt(ref, cand, prompt(), 64, 6);
  ASSERT_EQ(r.layers.size(), size_t(model_->config.n_layers));
  for (const LayerCheck& l : r.layers) {
    EXPECT_EQ(l.trace_rel_l2, 0);
    EXPECT_EQ(l.output_rel_l2, 0);
  }
  EXPECT_EQ(r.logits_rel_l2, 0);
  EXPECT_EQ(r.argmax_equal, r.tokens);
  EXPECT_EQ(r.greedy_equal, 6);
  EXPECT_TRUE(r.greedy_ok());
}

// A bug planted in the first MLA layer (layer 3: its attention output scaled by 1.01) shows at
// that layer only: injection keeps every other layer exact, while the free-running logits move.
TEST_F(Validate, PlantedBugIsLocalizedToItsLayer) {
  CpuBackend a, inner;
  test::WrappedBackend b(inner);
  int mla_calls = 0;
  b.after = [&](const char* op, float* out, size_t n) {
    if (std::string(op) != "mla_attend") return;
    const int mla_layers = model_->config.count(Mixer::MLA);
    if (mla_calls++ % mla_layers == 0)  // the first MLA layer of each chunk (prompt fits one chunk)
      for (size_t i = 0; i < n; ++i) out[i] *= 1.01f;
  };
  Forward ref(*model_, a), cand(*model_, b);
  const PromptCheck r = validate_prompt(ref, cand, prompt(), 64, 4);
  ASSERT_EQ(model_->config.layers[3].mixer, Mixer::MLA);
  for (int i = 0; i < int(r.layers.size()); ++i) {
    if (i == 3) {
      EXPECT_GT(r.layers[i].trace_rel_l2, 1e-4) << "the planted bug must be caught";
      EXPECT_GT(r.layers[i].output_rel_l2, r.layers[i].trace_rel_l2);
    } else {
      EXPECT_EQ(r.layers[i].trace_rel_l2, 0) << "layer " << i << ": errors must not compound";
    }
  }
  EXPECT_GT(r.logits_rel_l2, 0);
}

TEST_F(Validate, QuantizedFormatShowsSmallNonZeroErrors) {
  std::unique_ptr<Model> q8 = load_model(test::golden_dir(), QuantPlan::preset("q8"));
  CpuBackend a, b;
  Forward ref(*model_, a), cand(*q8, b);
  const PromptCheck r = validate_prompt(ref, cand, prompt(), 64, 0);
  double worst = 0;
  for (const LayerCheck& l : r.layers) worst = std::max(worst, l.output_rel_l2);
  EXPECT_GT(worst, 0);
  EXPECT_LT(worst, 0.05);
  EXPECT_GT(r.logits_rel_l2, 0);
}

// A device failure anywhere (first op, prefill, a decode step, the last step): the forward says so
// once, rebuilds the state on the CPU from its tokens and continues; the result is bit-identical
// to a CPU-only run.
TEST_F(Validate, FallbackAfterDeviceFailureIsBitIdentical) {
  const int steps = 6;
  // Greedy steps through a backend; returns the ids, final logits in *last, op counts in *ops
  // (after the prefill, in all).
  auto greedy_via = [&](TokenStep& f, Backend& be, std::vector<float>* last, int* prefill_ops, const int* calls) {
    SequenceState st(be, f.config(), 64);
    std::vector<float> lg(f.config().vocab);
    f.run(st, prompt().data(), nullptr, int(prompt().size()), lg.data(), false);
    if (prefill_ops) *prefill_ops = *calls;
    std::vector<int> got;
    for (int s = 0; s < steps; ++s) {
      got.push_back(int(std::max_element(lg.begin(), lg.end()) - lg.begin()));
      f.run(st, &got.back(), nullptr, 1, lg.data(), false);
    }
    EXPECT_EQ(st.position(), int(prompt().size()) + steps);
    *last = lg;
    return got;
  };
  CpuBackend plain_inner;
  test::WrappedBackend counted(plain_inner);
  int calls = 0, prefill_ops = 0;
  counted.before = [&](const char*) { ++calls; };
  Forward ref(*model_, counted);
  std::vector<float> want_logits, logits;
  const std::vector<int> want = greedy_via(ref, counted, &want_logits, &prefill_ops, &calls);
  const int total = calls;
  ASSERT_GT(total, prefill_ops + steps);

  for (int fail_at : {1, prefill_ops / 2, prefill_ops + 3, total - 5}) {
    CpuBackend inner;
    test::WrappedBackend dev(inner);
    int n = 0;
    bool fired = false;
    dev.before = [&](const char*) {
      if (++n == fail_at) {
        fired = true;
        throw DeviceError("injected device fault");
      }
    };
    Runner f(*model_, dev);
    int made = 0;
    f.set_fallback([&] {
      ++made;
      return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
    });
    testing::internal::CaptureStderr();
    const std::vector<int> got = greedy_via(f, dev, &logits, nullptr, nullptr);
    const std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(fired) << "fail_at " << fail_at;
    EXPECT_TRUE(f.on_fallback());
    EXPECT_EQ(made, 1);
    EXPECT_EQ(got, want) << "fail_at " << fail_at;
    EXPECT_EQ(logits, want_logits) << "fail_at " << fail_at;
    EXPECT_NE(err.find("injected device fault"), std::string::npos) << err;
    EXPECT_EQ(err.find("continuing on the CPU"), err.rfind("continuing on the CPU")) << "said once:\n" << err;
  }
}

TEST_F(Validate, WithoutFallbackTheDeviceErrorPropagates) {
  CpuBackend inner;
  test::WrappedBackend dev(inner);
  dev.before = [](const char*) { throw DeviceError("injected device fault"); };
  Forward f(*model_, dev);
  SequenceState st(dev, f.config(), 64);
  EXPECT_THROW(f.run(st, prompt().data(), nullptr, 3, nullptr, false), DeviceError);
  Runner r(*model_, dev);  // the runner without a fallback: the same
  SequenceState st2(dev, r.config(), 64);
  EXPECT_THROW(r.run(st2, prompt().data(), nullptr, 3, nullptr, false), DeviceError);
  EXPECT_FALSE(r.on_fallback());
}

// The token log the fallback replays is the runner's: each successful run appends its ids; the
// forward pass alone is a pure step and keeps none. An x0 run makes the state unreplayable.
TEST_F(Validate, RunnerKeepsTheTokenLogForwardDoesNot) {
  CpuBackend be;
  Runner r(*model_, be);
  SequenceState st(be, r.config(), 64);
  r.run(st, prompt().data(), nullptr, 3, nullptr, false);
  r.run(st, prompt().data() + 3, nullptr, 1, nullptr, false);
  const std::vector<int> p = prompt();
  EXPECT_EQ(st.history(), std::vector<int>(p.begin(), p.begin() + 4));
  EXPECT_TRUE(st.replayable());
  std::vector<float> x0(size_t(r.config().hidden), 0.25f);
  r.run(st, prompt().data(), x0.data(), 1, nullptr, false);
  EXPECT_FALSE(st.replayable());

  Forward f(*model_, be);
  SequenceState plain(be, f.config(), 64);
  f.run(plain, prompt().data(), nullptr, 3, nullptr, false);
  EXPECT_TRUE(plain.history().empty());
  EXPECT_EQ(plain.position(), 3);
}

TEST_F(Validate, BadInputIsNotAnsweredByFallback) {
  CpuBackend inner;
  test::WrappedBackend dev(inner);
  Runner f(*model_, dev);
  f.set_fallback([] { return std::unique_ptr<Backend>(std::make_unique<CpuBackend>()); });
  SequenceState st(dev, f.config(), 64);
  const int bad = 1 << 30;
  EXPECT_THROW(f.run(st, &bad, nullptr, 1, nullptr, false), Error);
  EXPECT_FALSE(f.on_fallback());
}

}  // namespace
}  // namespace wren
