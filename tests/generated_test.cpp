// Generated checkpoints (the checkpoint writer) against an independent naive f64 reference
// (tests/reference_model.h): a second shape with different sizes, no "language_model." prefix,
// an AttnRes block larger than the layer count, two dense layers and the layer-type rule; plus
// chunk-size invariance, decode-after-prefill and state copy on the golden and generated models.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "reference_model.h"
#include "runtime/generate.h"
#include "synth/synth.h"
#include "test_util.h"

namespace wren {
namespace {

using test::some_ids;

std::vector<float> logits_with_chunk(const Model& m, const std::vector<int>& ids, int chunk) {
  CpuBackend be;
  Forward fwd(m, be, {chunk, -1});
  SequenceState st(be, m.config, 256);
  std::vector<float> out(ids.size() * size_t(m.config.vocab));
  fwd.run(st, ids.data(), nullptr, int(ids.size()), out.data(), true);
  return out;
}

double rel_l2_vs(const std::vector<float>& a, const std::vector<double>& b) {
  std::vector<float> bf(b.begin(), b.end());
  return test::rel_l2(a.data(), bf.data(), a.size());
}

class Generated : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("gen"));
    SynthOptions o;
    o.seed = 7;
    o.prefix = false;
    o.shard_bytes = 200'000;
    write_synthetic_checkpoint(test::second_shape_config(), *dir_, o);
    model_ = load_model(*dir_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
  static Model* model_;
};
std::string* Generated::dir_ = nullptr;
Model* Generated::model_ = nullptr;

TEST(Reference, MatchesGoldenK3TinyA) {
  // Validates the naive reference itself against the golden data before it judges anything.
  auto m = load_model(test::golden_dir());
  const std::vector<int> ids = {4096, 976, 2328, 2258, 328, 2312, 766, 382};
  const auto ref = test::reference_forward(*m, ids);
  const auto golden = test::read_all_f32(test::golden_dir() + "/golden/prompt0.logits.f32");
  EXPECT_LT(rel_l2_vs(golden, ref), 1e-4);
}

TEST_F(Generated, LayerRuleAndTraitsDerivedFromConfig) {
  const Config& c = model_->config;
  ASSERT_EQ(c.n_layers, 6);
  const Mixer expect[6] = {Mixer::KDA, Mixer::KDA, Mixer::KDA, Mixer::MLA, Mixer::KDA, Mixer::MLA};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(c.layers[i].mixer, expect[i]) << "layer " << i;
    EXPECT_EQ(c.layers[i].ffn, i < 2 ? Ffn::Dense : Ffn::MoE) << "layer " << i;
    EXPECT_EQ(c.layers[i].snapshot, i == 0) << "block size 8 > 6 layers: one snapshot";
  }
  EXPECT_EQ(model_->ckpt->prefix(), "");
  for (const ExpertRef& e : model_->weights.layers[2].moe.experts) EXPECT_TRUE(e.contiguous) << e.name;
}

TEST_F(Generated, TraceAndLogitsMatchIndependentReference) {
  const Config& c = model_->config;
  const std::vector<int> ids = some_ids(19, c.vocab, 1);
  const int T = int(ids.size()), L = c.n_layers, D = c.hidden;
  std::vector<double> rtrace;
  const auto ref = test::reference_forward(*model_, ids, &rtrace);
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, c, 64);
  std::vector<float> trace(size_t(T) * L * D), logits(size_t(T) * c.vocab);
  ForwardHooks hooks;
  hooks.trace = trace.data();
  fwd.run(st, ids.data(), nullptr, T, logits.data(), true, &hooks);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < L; ++i) {
      const size_t off = (size_t(t) * L + i) * D;
      std::vector<float> r(rtrace.begin() + off, rtrace.begin() + off + D);
      EXPECT_LT(test::rel_l2(trace.data() + off, r.data(), D), 1e-4) << "token " << t << " layer " << i;
    }
  EXPECT_LT(rel_l2_vs(logits, ref), 1e-4);
}

TEST_F(Generated, ChunkSizeDoesNotChangeABit) {
  const std::vector<int> ids = some_ids(23, model_->config.vocab, 2);
  const auto one = logits_with_chunk(*model_, ids, 1);
  for (int chunk : {3, 8, 32}) {
    const auto other = logits_with_chunk(*model_, ids, chunk);
    EXPECT_EQ(0, std::memcmp(one.data(), other.data(), one.size() * 4)) << "chunk " << chunk;
  }
}

TEST(GoldenChunks, ChunkSizeDoesNotChangeABit) {
  auto m = load_model(test::golden_dir());
  const std::vector<int> ids = some_ids(37, m->config.vocab, 3);
  const auto one = logits_with_chunk(*m, ids, 1);
  const auto big = logits_with_chunk(*m, ids, 16);
  EXPECT_EQ(0, std::memcmp(one.data(), big.data(), one.size() * 4));
}

TEST_F(Generated, DecodeAfterPrefillEqualsTeacherForced) {
  const Config& c = model_->config;
  const std::vector<int> ids = some_ids(15, c.vocab, 4);
  const auto tf = logits_with_chunk(*model_, ids, 32);
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, c, 64);
  std::vector<float> step(tf.size());
  fwd.run(st, ids.data(), nullptr, 9, step.data(), true);
  for (size_t t = 9; t < ids.size(); ++t) fwd.run(st, &ids[t], nullptr, 1, step.data() + t * c.vocab, false);
  EXPECT_LE(test::rel_l2(step.data(), tf.data(), tf.size()), 1e-5);
}

TEST_F(Generated, StateCopyResumesIdentically) {
  const Config& c = model_->config;
  const std::vector<int> ids = some_ids(12, c.vocab, 5);
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState a(be, c, 64), b(be, c, 64);
  fwd.run(a, ids.data(), nullptr, 8, nullptr, false);
  b.copy_from(a);
  EXPECT_EQ(b.position(), 8);
  std::vector<float> la(4 * size_t(c.vocab)), lb(la.size());
  fwd.run(a, ids.data() + 8, nullptr, 4, la.data(), true);
  fwd.run(b, ids.data() + 8, nullptr, 4, lb.data(), true);
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
  b.reset();
  EXPECT_EQ(b.position(), 0);
}

TEST_F(Generated, ShardingAndPrefixDoNotChangeTheModel) {
  const std::string dir = test::temp_dir("gen2");
  SynthOptions o;
  o.seed = 7;
  o.prefix = true;
  o.shard_bytes = 1'000'000'000;  // one text shard
  write_synthetic_checkpoint(test::second_shape_config(), dir, o);
  auto m2 = load_model(dir);
  EXPECT_EQ(m2->ckpt->prefix(), "language_model.");
  const std::vector<int> ids = some_ids(6, model_->config.vocab, 6);
  const auto a = logits_with_chunk(*model_, ids, 4), b = logits_with_chunk(*m2, ids, 4);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  std::filesystem::remove_all(dir);
}

TEST(Config, RootLevelKeysWithoutTextConfig) {
  nlohmann::json j = test::golden_config();
  nlohmann::json flat = j["text_config"];
  for (const char* k : {"model_type", "bos_token_id", "eos_token_id", "quantization_config", "tie_word_embeddings"})
    flat[k] = j[k];
  const Config a = parse_config(j, "nested"), b = parse_config(flat, "flat");
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.layers.size(), b.layers.size());
  EXPECT_EQ(a.eos_ids, b.eos_ids);
}

}  // namespace
}  // namespace wren
