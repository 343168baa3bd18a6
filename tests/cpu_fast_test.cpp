// The fast CPU path end to end: the golden criteria with SIMD kernels and threads in exact mode;
// logits bit-identical across thread counts (1, 2, 3, every op forced through the pool) and across
// chunk sizes (chunked prefill = token at a time) for every kernel level, quantized formats and
// int8 expert activations, on the golden model and on a generated one with awkward sizes; the
// --quant plan reaching the loaded weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/tensor_table.h"
#include "runtime/generate.h"
#include "synth/synth.h"
#include "test_util.h"

namespace wren {
namespace {

using cpu::Isa;

std::vector<Isa> levels() { return test::cpu_levels(); }

std::vector<int> some_ids(int n, int vocab, int seed) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int((1103515245u * (i + 7u * seed) + 12345u) % vocab));
  return ids;
}

/// Teacher-forced logits [T, V] with the given backend options and chunk.
std::vector<float> logits(const Model& m, const CpuOptions& o, const std::vector<int>& ids, int chunk) {
  CpuBackend be(o);
  Forward fwd(m, be, {chunk, -1});
  SequenceState st(be, m.config, 128);
  std::vector<float> out(ids.size() * size_t(m.config.vocab));
  fwd.run(st, ids.data(), nullptr, int(ids.size()), out.data(), true);
  return out;
}

CpuOptions opts(Isa isa, int threads, bool i8 = false) {
  CpuOptions o;
  o.isa = isa, o.threads = threads, o.mx_int8_act = i8;
  o.min_parallel_work = 0;  // every op through the pool
  return o;
}

/// Sizes off every SIMD width: hidden 160 (a partial q4 group), KDA head_dim 24, MLA kv_lora 40.
nlohmann::json odd_shape() {
  nlohmann::json j = test::golden_config({
      {"hidden_size", 160}, {"num_hidden_layers", 5}, {"vocab_size", 515}, {"first_k_dense_replace", 1},
      {"intermediate_size", 200}, {"num_attention_heads", 3}, {"num_key_value_heads", 3},
      {"q_lora_rank", 72}, {"kv_lora_rank", 40}, {"qk_nope_head_dim", 24}, {"qk_rope_head_dim", 8},
      {"v_head_dim", 20}, {"num_experts", 10}, {"num_experts_per_token", 3},
      {"moe_intermediate_size", 64}, {"routed_expert_hidden_size", 96}, {"num_shared_experts", 1},
      {"attn_res_block_size", 2},
      {"linear_attn_config", {{"num_heads", 5}, {"head_dim", 24}, {"short_conv_kernel_size", 4},
                              {"kda_layers", {1, 2, 3, 5}}, {"full_attn_layers", {4}}}}});
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  return j;
}

class FastCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("fast"));
    SynthOptions o;
    o.seed = 11;
    write_synthetic_checkpoint(odd_shape(), *dir_, o);
    gen_exact_ = load_model(*dir_).release();
    gen_default_ = load_model(*dir_, QuantPlan::preset("default")).release();
    golden_exact_ = load_model(test::golden_dir()).release();
    golden_q8_ = load_model(test::golden_dir(), QuantPlan::preset("q8")).release();
  }
  static void TearDownTestSuite() {
    for (Model* m : {gen_exact_, gen_default_, golden_exact_, golden_q8_}) delete m;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
  static Model *gen_exact_, *gen_default_, *golden_exact_, *golden_q8_;
};
std::string* FastCpu::dir_ = nullptr;
Model *FastCpu::gen_exact_ = nullptr, *FastCpu::gen_default_ = nullptr, *FastCpu::golden_exact_ = nullptr,
      *FastCpu::golden_q8_ = nullptr;

TEST_F(FastCpu, GoldenLogitsAndArgmaxWithBestKernelsAndThreads) {
  const std::vector<int> ids = {4096, 976, 2328, 2258, 328, 2312, 766, 382};
  const auto golden = test::read_all_f32(test::golden_dir() + "/golden/prompt0.logits.f32");
  for (Isa isa : levels()) {
    const auto l = logits(*golden_exact_, opts(isa, 2), ids, 32);
    ASSERT_EQ(l.size(), golden.size());
    const double r = test::rel_l2(l.data(), golden.data(), l.size());
    EXPECT_LT(r, 1e-4) << cpu::isa_name(isa);
    const int V = golden_exact_->config.vocab;
    for (size_t t = 0; t < ids.size(); ++t)
      EXPECT_EQ(argmax(l.data() + t * V, V), argmax(golden.data() + t * V, V)) << cpu::isa_name(isa) << " " << t;
    std::printf("[ %s ] golden prompt0 logits rel-L2 %.3g\n", cpu::isa_name(isa), r);
  }
}

struct Case {
  const Model* m;
  Isa isa;
  bool i8;
  const char* name;
};

/// Every level on the golden model in exact mode, and the quantized formats and int8 expert
/// activations at the best level (the suite runs under ASan too, so the matrix stays small).
std::vector<Case> invariance_cases(const Model* golden, const Model* golden_q8, const Model* gen_default) {
  std::vector<Case> out;
  for (Isa isa : levels()) out.push_back({golden, isa, false, "golden exact"});
  out.push_back({golden_q8, cpu::best_isa(), true, "golden q8 + int8 act"});
  out.push_back({gen_default, cpu::best_isa(), false, "generated default"});
  out.push_back({gen_default, cpu::best_isa(), true, "generated default + int8 act"});
  return out;
}

TEST_F(FastCpu, ThreadCountDoesNotChangeABit) {
  for (const Case& c : invariance_cases(golden_exact_, golden_q8_, gen_default_)) {
    const auto ids = some_ids(7, c.m->config.vocab, 1);
    const auto one = logits(*c.m, opts(c.isa, 1, c.i8), ids, 32);
    for (int th : {2, 3}) {
      const auto many = logits(*c.m, opts(c.isa, th, c.i8), ids, 32);
      EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * 4)) << c.name << " " << cpu::isa_name(c.isa) << " threads " << th;
    }
  }
}

TEST_F(FastCpu, ChunkedPrefillEqualsTokenAtATime) {
  for (const Case& c : invariance_cases(golden_exact_, golden_q8_, gen_default_)) {
    const auto ids = some_ids(9, c.m->config.vocab, 2);
    const auto one = logits(*c.m, opts(c.isa, 2, c.i8), ids, 1);
    for (int chunk : {4, 32}) {
      const auto big = logits(*c.m, opts(c.isa, 2, c.i8), ids, chunk);
      EXPECT_EQ(0, std::memcmp(one.data(), big.data(), one.size() * 4)) << c.name << " " << cpu::isa_name(c.isa) << " chunk " << chunk;
    }
  }
}

TEST_F(FastCpu, QuantPlanReachesTheWeights) {
  const ModelWeights& w = gen_default_->weights;
  EXPECT_EQ(w.embed.format, WFormat::BF16);
  EXPECT_EQ(w.lm_head.format, WFormat::Q8_ROW);
  EXPECT_EQ(w.final_norm.format, WFormat::F32);
  EXPECT_EQ(w.layers[0].mlp.gate.format, WFormat::Q4_G64);
  EXPECT_EQ(w.layers[0].kda.q.format, WFormat::Q4_G64);
  EXPECT_EQ(w.layers[0].kda.q_conv.format, WFormat::F32);
  EXPECT_EQ(w.layers[3].mla.kv_b.format, WFormat::Q8_ROW);
  EXPECT_EQ(w.layers[1].moe.router.format, WFormat::BF16);
  EXPECT_EQ(w.layers[1].moe.shared_down.format, WFormat::Q4_G64);
  EXPECT_EQ(w.layers[1].moe.up.format, WFormat::Q4_G64);
  EXPECT_EQ(w.layers[1].moe.bias.format, WFormat::F32);
  EXPECT_EQ(w.layers[1].moe.norm.format, WFormat::F32);
  for (const Model* m : {gen_exact_, golden_exact_}) EXPECT_TRUE(m->plan.exact());
}

// The "stored" plan (the CLI's default on CUDA in fast mode: the checkpoint's dtype): on k3-tiny-a
// (101 BF16 tensors, the rest F32/U8) every BF16-stored matrix stays BF16 and decodes to the exact
// plan's f32 values bit for bit (lossless), the F32 ones stay F32, vectors stay F32, and the plan
// is not "exact" (it names itself in the run header).
TEST_F(FastCpu, StoredPlanKeepsBf16MatricesLosslessly) {
  const QuantPlan plan = QuantPlan::preset("stored");
  EXPECT_FALSE(plan.exact());
  EXPECT_EQ(plan.of(WClass::Attn, DType::BF16), WFormat::BF16);
  EXPECT_EQ(plan.of(WClass::Attn, DType::F32), WFormat::F32);
  EXPECT_EQ(plan.of(WClass::Attn, DType::F16), WFormat::F32);
  EXPECT_EQ(plan.of(WClass::Vector, DType::BF16), WFormat::F32);
  EXPECT_EQ(QuantPlan::preset("exact").of(WClass::Attn, DType::BF16), WFormat::F32);
  EXPECT_NE(plan.describe().find("as stored"), std::string::npos) << plan.describe();
  auto stored = load_model(test::golden_dir(), plan);
  std::vector<const DenseWeight*> a, b;
  for_each_tensor(stored->config, stored->weights, [&](const TensorSpec& s) { if (s.dense) a.push_back(s.dense); });
  for_each_tensor(golden_exact_->config, golden_exact_->weights, [&](const TensorSpec& s) { if (s.dense) b.push_back(s.dense); });
  ASSERT_EQ(a.size(), b.size());
  int bf16 = 0, f32 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(b[i]->format, WFormat::F32);
    if (a[i]->format == WFormat::F32) {
      ++f32;
      continue;
    }
    ASSERT_EQ(a[i]->format, WFormat::BF16) << "tensor " << i;
    ASSERT_GT(a[i]->rows, 1) << "a vector must stay f32";
    ++bf16;
    std::vector<float> row(size_t(a[i]->cols));
    for (int64_t r = 0; r < a[i]->rows; ++r) {
      dequant_row(*a[i], r, row.data());
      ASSERT_EQ(0, std::memcmp(row.data(), static_cast<const float*>(b[i]->data) + r * b[i]->cols, row.size() * 4))
          << "tensor " << i << " row " << r << ": BF16 kept must decode to the upcast values";
    }
  }
  EXPECT_GT(bf16, 0);
  EXPECT_GT(f32, 0);
}

TEST_F(FastCpu, QuantizedForwardEqualsExactForwardOnTheDequantizedWeights) {
  // The quantized path end to end: a second copy of the default-plan model has every quantized
  // matrix replaced by its f32 decode; the exact path on it must give the quantized path's logits
  // up to f32 summation order (the weights are then identical).
  auto deq = load_model(*dir_, QuantPlan::preset("default"));
  for_each_tensor(deq->config, deq->weights, [&](const TensorSpec& s) {
    if (!s.dense || s.dense->format == WFormat::F32) return;
    float* f = deq->weights.alloc(size_t(s.dense->rows * s.dense->cols));
    for (int64_t r = 0; r < s.dense->rows; ++r) dequant_row(*s.dense, r, f + r * s.dense->cols);
    *s.dense = DenseWeight{DType::F32, s.dense->rows, s.dense->cols, f};
  });
  const auto ids = some_ids(9, gen_exact_->config.vocab, 3);
  for (Isa isa : levels()) {
    const auto a = logits(*gen_default_, opts(isa, 2), ids, 32);
    const auto b = logits(*deq, opts(isa, 2), ids, 32);
    for (float v : a) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(test::rel_l2(a.data(), b.data(), a.size()), 1e-4) << cpu::isa_name(isa);
  }
}

TEST(CpuCli, RunEchoesFormatsAndRejectsBadNames) {
  const std::string run = "run --model " + test::golden_dir() + " --ids 4096,976,2328 -n 2 ";
  std::string out;
  ASSERT_EQ(0, test::run_wren(run + "--quant default --quant-head bf16 --threads 2 --isa scalar --mx-act int8", &out)) << out;
  for (const char* s : {"cpu scalar, 2 threads", "attn=q4 mla=q8 dense=q4 shared=q4 latent=q4 router=bf16 head=bf16 embed=bf16",
                        "experts mxfp4 x int8 activations"})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  EXPECT_NE(0, test::run_wren(run + "--quant q3", &out));
  EXPECT_NE(out.find("'q3' is not a preset"), std::string::npos) << out;
  EXPECT_NE(0, test::run_wren(run + "--quant-attn int4", &out));
  EXPECT_NE(out.find("--quant-attn: 'int4' is not a weight format"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren(run + "--mx-act int4", &out)) << out;  // a closed set: the parser's usage error
  EXPECT_NE(out.find("--mx-act: int4 not in {f32,int8}"), std::string::npos) << out;
}

TEST(CpuCli, BenchKernelsPrintsEveryFormatAgainstCopy) {
  std::string out;
  ASSERT_EQ(0, test::run_wren("bench kernels --mb 0.25 --cols 256 --reps 1 --chunk 3 --threads 2", &out)) << out;
  for (const char* s : {"| f32 ", "| bf16 ", "| q8 ", "| q4 ", "| mxfp4 x f32 ", "| mxfp4 x int8 ", "copy GB/s"})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
}

TEST(CpuBackendOptions, RejectsBadThreadCount) {
  CpuOptions o;
  o.threads = 0;
  EXPECT_THROW({ CpuBackend be(o); }, Error);
}

}  // namespace
}  // namespace wren
