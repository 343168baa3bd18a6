// Kimi Linear (`model_type: kimi_linear`) against transformers' reference data in
// tests/data/kimi-linear-tiny (its README says how it was made): full forward, prefill-70-then-decode,
// token-by-token decode, the residual stream after layers 0-2, and the cached greedy generation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "reference_model.h"
#include "runtime/generate.h"
#include "synth/synth.h"
#include "test_util.h"

namespace wren {
namespace {

std::string kl_dir() { return test::kimi_linear_dir(); }

/// Reference tensors from reference.safetensors (F32 as floats, I64 ids as ints).
struct Reference {
  SafetensorsFile file{kl_dir() + "/reference.safetensors"};
  std::vector<float> f32(const std::string& name) const {
    const TensorInfo* t = file.find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> v(t->nbytes / 4);
    std::memcpy(v.data(), file.data(*t), t->nbytes);
    return v;
  }
  std::vector<int> ids(const std::string& name) const {
    const TensorInfo* t = file.find(name);
    std::vector<int> v(t->nbytes / 8);
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t x;
      std::memcpy(&x, file.data(*t) + 8 * i, 8);
      v[i] = int(x);
    }
    return v;
  }
};

class KimiLinear : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = load_model(kl_dir()).release();
    ref_ = new Reference;
  }
  static void TearDownTestSuite() {
    delete model_;
    delete ref_;
  }
  static Model* model_;
  static Reference* ref_;
};
Model* KimiLinear::model_ = nullptr;
Reference* KimiLinear::ref_ = nullptr;

TEST_F(KimiLinear, ConfigTraits) {
  const Config& c = model_->config;
  EXPECT_EQ(c.residual, Residual::Plain);
  EXPECT_EQ(c.kda_gate, KdaGate::Softplus);
  EXPECT_EQ(c.kda_gate_rank, 16);
  EXPECT_EQ(c.moe_kind, MoeKind::Plain);
  EXPECT_EQ(c.act, Activation::SiLU);
  EXPECT_EQ(c.q_lora, 0);
  EXPECT_FLOAT_EQ(c.routed_scale, 2.446f);
  const Mixer expect[4] = {Mixer::KDA, Mixer::KDA, Mixer::MLA, Mixer::KDA};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.layers[i].mixer, expect[i]);
}

TEST_F(KimiLinear, FullForwardLogitsAndHiddenStates) {
  const Config& c = model_->config;
  const std::vector<int> ids = ref_->ids("input_ids");
  const int T = int(ids.size()), V = c.vocab, D = c.hidden, L = c.n_layers;
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, c, 128);
  std::vector<float> logits(size_t(T) * V), trace(size_t(T) * L * D);
  ForwardHooks hooks;
  hooks.trace = trace.data();
  fwd.run(st, ids.data(), nullptr, T, logits.data(), true, &hooks);
  const auto full = ref_->f32("logits_full");
  const double r = test::rel_l2(logits.data(), full.data(), full.size());
  double max_abs = 0;
  for (size_t i = 0; i < full.size(); ++i) max_abs = std::max(max_abs, double(std::fabs(logits[i] - full[i])));
  EXPECT_LT(r, 1e-5);
  EXPECT_LT(max_abs, 1e-4);
  for (int t = 0; t < T; ++t)
    EXPECT_EQ(argmax(logits.data() + size_t(t) * V, V), argmax(full.data() + size_t(t) * V, V)) << "pos " << t;
  // The plain residual stream after layer i is trace row i; transformers' hidden_{i+1}.
  for (int i = 0; i < 3; ++i) {
    const auto h = ref_->f32("hidden_" + std::to_string(i + 1));
    std::vector<float> ours(size_t(T) * D);
    for (int t = 0; t < T; ++t)
      std::memcpy(ours.data() + size_t(t) * D, trace.data() + (size_t(t) * L + i) * D, D * 4);
    EXPECT_LT(test::rel_l2(ours.data(), h.data(), h.size()), 1e-5) << "after layer " << i;
  }
  std::printf("[ kimi-linear-tiny ] logits rel-L2 %.3g, max abs %.3g\n", r, max_abs);
}

TEST_F(KimiLinear, Prefill70ThenDecodeAndStepwise) {
  const Config& c = model_->config;
  const std::vector<int> ids = ref_->ids("input_ids");
  const int T = int(ids.size()), V = c.vocab;
  CpuBackend be;
  Forward fwd(*model_, be);
  for (int prefill : {70, 1}) {
    SequenceState st(be, c, 128);
    std::vector<float> logits(size_t(T) * V);
    fwd.run(st, ids.data(), nullptr, prefill, logits.data(), true);
    for (int t = prefill; t < T; ++t) fwd.run(st, &ids[t], nullptr, 1, logits.data() + size_t(t) * V, false);
    const auto want = ref_->f32(prefill == 70 ? "logits_prefill70_decode" : "logits_stepwise_from1");
    EXPECT_LT(test::rel_l2(logits.data(), want.data(), want.size()), 1e-5) << "prefill " << prefill;
  }
}

TEST_F(KimiLinear, GreedyGenerationEqualsCachedReference) {
  const std::vector<int> all = ref_->ids("generate_greedy_cache");
  const std::vector<int> prompt(all.begin(), all.begin() + 20), want(all.begin() + 20, all.end());
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, model_->config, 128);
  GenerateOptions o;
  o.max_new_tokens = int(want.size());
  EXPECT_EQ(generate_greedy(fwd, st, prompt, o), want);
}

nlohmann::json kl_config(const nlohmann::json& patch = nlohmann::json::object()) {
  std::ifstream f(kl_dir() + "/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  j.merge_patch(patch);
  return j;
}

// An MoE's shared-experts output is added to the residual together with the routed one (Backend::
// add2 / add2_rms_norm) unless something reads the FFN output (a hook, --check-finite): the
// logits are the same bits either way, on Kimi Linear (plain residual: add2_rms_norm) and on the
// K3-style golden model (AttnRes: add2), prompt and decode.
TEST_F(KimiLinear, SharedExpertsAddedWithTheRoutedChangesNoBit) {
  const auto k3 = load_model(test::golden_dir());
  for (const Model* m : {static_cast<const Model*>(model_), static_cast<const Model*>(k3.get())}) {
    const Config& c = m->config;
    ASSERT_GT(c.n_shared, 0);
    const std::vector<int> ids = {1, 5, 9, 2, 7, 3, 11, 4};
    const int T = int(ids.size());
    std::vector<std::vector<float>> got;
    for (bool strict : {false, true}) {
      CpuBackend be;
      ForwardOptions o;
      o.check_finite = strict;
      Forward fwd(*m, be, o);
      SequenceState st(be, c, 64);
      std::vector<float> logits(size_t(T + 2) * c.vocab);
      fwd.run(st, ids.data(), nullptr, T, logits.data(), true);
      for (int t = 0; t < 2; ++t) fwd.run(st, &ids[size_t(t)], nullptr, 1, logits.data() + size_t(T + t) * c.vocab, false);
      got.push_back(std::move(logits));
    }
    EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4)) << c.n_layers << " layers";
  }
}

// Other shapes, written by the checkpoint writer (`mlp.*` names for the dense layer, BF16 weights),
// against the naive f64 reference: q LoRA on, two shared experts, six layers.
TEST(KimiLinearGenerated, OtherShapesMatchIndependentReference) {
  const nlohmann::json cfg = kl_config({
      {"hidden_size", 48}, {"num_hidden_layers", 6}, {"vocab_size", 300}, {"intermediate_size", 80},
      {"q_lora_rank", 24}, {"num_attention_heads", 2}, {"kv_lora_rank", 16}, {"qk_nope_head_dim", 12},
      {"qk_rope_head_dim", 4}, {"v_head_dim", 10}, {"num_experts", 6}, {"num_experts_per_token", 3},
      {"moe_intermediate_size", 24}, {"num_shared_experts", 2}, {"routed_scaling_factor", 1.7},
      {"linear_attn_config", {{"num_heads", 3}, {"head_dim", 8}, {"short_conv_kernel_size", 3},
                              {"kda_layers", {1, 2, 3, 5}}, {"full_attn_layers", {4, 6}}}}});
  const std::string dir = test::temp_dir("kl");
  SynthOptions o;
  o.seed = 11;
  o.prefix = false;
  write_synthetic_checkpoint(cfg, dir, o);
  auto m = load_model(dir);
  std::vector<int> ids;
  for (int i = 0; i < 17; ++i) ids.push_back((37 * i + 5) % 300);
  const auto ref = test::reference_forward(*m, ids);
  CpuBackend be;
  Forward fwd(*m, be, {5, -1});
  SequenceState st(be, m->config, 64);
  std::vector<float> logits(ids.size() * 300);
  fwd.run(st, ids.data(), nullptr, int(ids.size()), logits.data(), true);
  std::vector<float> reff(ref.begin(), ref.end());
  EXPECT_LT(test::rel_l2(logits.data(), reff.data(), reff.size()), 1e-5);
  std::filesystem::remove_all(dir);
}

// Kimi Linear flags Wren does not implement, and K3-only keys (which transformers' kimi_linear
// would silently ignore), are rejected naming the key.
TEST(KimiLinearConfig, UnsupportedFlagsRejected) {
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {{{"hidden_act", "gelu"}}, "hidden_act"},
      {{{"moe_renormalize", false}}, "moe_renormalize"},
      {{{"num_expert_group", 4}}, "num_expert_group"},
      {{{"mla_use_nope", false}}, "mla_use_nope"},
      {{{"mla_use_output_gate", true}}, "mla_use_output_gate"},
      {{{"attn_res_block_size", 4}}, "attn_res_block_size"},
      {{{"routed_expert_hidden_size", 64}}, "routed_expert_hidden_size"},
      {{{"linear_attn_config", {{"gate_lower_bound", -5.0}}}}, "gate_lower_bound"},
      {{{"linear_attn_config", {{"use_full_rank_gate", true}}}}, "use_full_rank_gate"},
      {{{"moe_router_activation_func", "softmax"}}, "moe_router_activation_func"},
      {{{"num_nextn_predict_layers", 1}}, "num_nextn_predict_layers"},
      {{{"tie_word_embeddings", true}}, "tie_word_embeddings"},
      {{{"model_type", "deepseek_v3"}}, "model_type"},
  };
  for (const auto& [patch, key] : bad) {
    try {
      parse_config(kl_config(patch), "config.json");
      ADD_FAILURE() << "accepted " << patch.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace wren
