// The routed MoE as one op of the contract (Backend::routed_moe): on the CPU it is the host-routed
// reference whatever the expert source; a backend's slow fallback is counted, said once on stderr,
// and an error under strict mode. Golden k3-tiny-a model (MXFP4 experts), CPU backends.
#include <gtest/gtest.h>

#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/forward.h"
#include "model/load.h"
#include "ops/expert_source.h"
#include "test_util.h"
#include "wrapped_backend.h"

namespace wren {
namespace {

class RoutedMoe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::golden_dir()).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;

  /// Teacher-forced logits of a fixed prompt (chunk 3, so chunks hold several tokens).
  std::vector<float> logits(Backend& be) {
    const Config& c = model_->config;
    std::vector<int> ids;
    for (int i = 0; i < 7; ++i) ids.push_back((131 * i + 7) % c.vocab);
    Forward fwd(*model_, be, {3, -1});
    SequenceState st(be, c, 64);
    std::vector<float> out(ids.size() * size_t(c.vocab));
    fwd.run(st, ids.data(), nullptr, int(ids.size()), out.data(), true);
    return out;
  }
};
Model* RoutedMoe::model_ = nullptr;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(RoutedMoe, CpuSourceGivenAtConstructionMatchesMappings) {
  CpuBackend plain;
  const auto ref = logits(plain);
  MappedExperts mapped(weight_list(model_->weights));
  CpuBackend with_source({}, &mapped);
  EXPECT_EQ(with_source.expert_source(), &mapped);
  EXPECT_TRUE(same_bits(logits(with_source), ref));
  EXPECT_EQ(plain.fallbacks(), 0u);
  EXPECT_EQ(with_source.fallbacks(), 0u);
  with_source.set_strict(true);  // the CPU never falls back: strict changes nothing
  EXPECT_TRUE(same_bits(logits(with_source), ref));
}

TEST_F(RoutedMoe, FallbackCountedLoggedOnceAndFatalWhenStrict) {
  CpuBackend cpu;
  const auto ref = logits(cpu);
  int moe_layers = 0;
  for (const LayerSpec& l : model_->config.layers) moe_layers += l.ffn == Ffn::MoE;
  ASSERT_GT(moe_layers, 1);
  test::WrappedBackend w(cpu);
  w.decline_moe = true;
  testing::internal::CaptureStderr();
  const auto got = logits(w);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(same_bits(got, ref)) << "the fallback is the host-routed reference";
  EXPECT_EQ(w.fallbacks(), uint64_t(moe_layers) * 3) << "7 tokens in chunks of 3: 3 calls per MoE layer";
  size_t lines = 0;
  for (size_t at = err.find("planted decline"); at != std::string::npos; at = err.find("planted decline", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << err;
  w.set_strict(true);
  try {
    logits(w);
    ADD_FAILURE() << "strict mode let a fallback through";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--strict"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wren
