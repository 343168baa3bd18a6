// `wren perplexity` (checked against teacher-forced logits on k3-tiny-a), and the trained default
// model models/wren-tiny against the training forward's saved logits (tests/data/wren-tiny, written
// by scripts/train/k3_tiny.py at export: its forward run in float64 on the exported bytes, BF16
// upcast and MXFP4 dequantized). Wren's exact-f32 CPU forward must match the teacher-forced logits
// to rel-L2 1e-4 with every argmax equal, and the greedy continuation up to the first near-tie
// (margin < 0.02). The WrenTiny suites skip, saying so, while models/wren-tiny is not committed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace wren {
namespace {

std::string tiny_dir() { return std::string(WREN_SOURCE_DIR) + "/models/wren-tiny"; }
std::string ref_dir() { return std::string(WREN_SOURCE_DIR) + "/tests/data/wren-tiny"; }

bool have_tiny() { return std::filesystem::exists(tiny_dir() + "/model.safetensors.index.json"); }
#define SKIP_WITHOUT_TINY()                                                                          \
  if (!have_tiny()) GTEST_SKIP() << tiny_dir() << " is not committed yet (scripts/train makes it on the GPU machine)"

struct TinyCase {
  std::vector<int> ids, greedy;
  std::vector<double> margins;
};

std::vector<TinyCase> tiny_cases() {
  std::ifstream f(ref_dir() + "/cases.json");
  const auto j = nlohmann::json::parse(f);
  std::vector<TinyCase> out;
  for (const auto& c : j) out.push_back({c["ids"], c["greedy_next"], c["greedy_margins"]});
  return out;
}

class WrenTiny : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    if (have_tiny()) model_ = load_model(tiny_dir()).release();
  }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
};
Model* WrenTiny::model_ = nullptr;

TEST_P(WrenTiny, TeacherForcedLogitsMatchTrainingForward) {
  SKIP_WITHOUT_TINY();
  const TinyCase tc = tiny_cases().at(size_t(GetParam()));
  const Config& c = model_->config;
  const int T = int(tc.ids.size()), V = c.vocab;
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, c, 256);
  std::vector<float> logits(size_t(T) * V);
  fwd.run(st, tc.ids.data(), nullptr, T, logits.data(), true);
  const auto ref = test::read_all_f32(ref_dir() + "/prompt" + std::to_string(GetParam()) + ".logits.f32");
  ASSERT_EQ(ref.size(), logits.size());
  const double r = test::rel_l2(logits.data(), ref.data(), ref.size());
  EXPECT_LT(r, 1e-4);
  for (int t = 0; t < T; ++t)
    EXPECT_EQ(argmax(logits.data() + size_t(t) * V, V), argmax(ref.data() + size_t(t) * V, V)) << "position " << t;
  std::printf("[ prompt%d ] %d tokens, logits rel-L2 %.3g\n", GetParam(), T, r);
}

TEST_P(WrenTiny, GreedyContinuationMatchesUpToFirstNearTie) {
  SKIP_WITHOUT_TINY();
  const TinyCase tc = tiny_cases().at(size_t(GetParam()));
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState st(be, model_->config, 256);
  GenerateOptions o;
  o.max_new_tokens = int(tc.greedy.size());
  const std::vector<int> out = generate_greedy(fwd, st, tc.ids, o);
  for (size_t i = 0; i < tc.greedy.size(); ++i) {
    if (tc.margins[i] < 0.02) break;
    ASSERT_LT(i, out.size()) << "stopped early at step " << i;
    ASSERT_EQ(out[i], tc.greedy[i]) << "step " << i;
  }
}

/// The JSON object `wren perplexity --json` prints (the one line of the output that starts with '{').
nlohmann::json perplexity_json(const std::string& out) {
  size_t at = 0;
  while (at < out.size()) {
    const size_t end = out.find('\n', at);
    const std::string line = out.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (!line.empty() && line[0] == '{') return nlohmann::json::parse(line);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  ADD_FAILURE() << "no JSON line in: " << out;
  return nlohmann::json::object();
}

TEST(Perplexity, MatchesTeacherForcedLogits) {
  // One window holds the whole text: perplexity = exp(mean over the file tokens of -log softmax of
  // the teacher-forced logits one position earlier), computed here from `wren run --logits`.
  const std::string dir = test::temp_dir("pplx"), text = dir + "/t.txt";
  const std::string body = "The quick brown fox jumps over the lazy dog. Wren reads K3 checkpoints; 12 + 30 = 42.";
  std::ofstream(text) << body;
  std::string out;
  ASSERT_EQ(0, test::run_wren("perplexity --model " + test::golden_dir() + " " + text + " --json", &out)) << out;
  const nlohmann::json p = perplexity_json(out);
  ASSERT_EQ(0, test::run_wren("tokenize --model " + test::golden_dir() + " '" + body + "' --json", &out)) << out;
  const std::vector<int> ids = nlohmann::json::parse(out.substr(out.find('[')));
  std::string csv = "4096";  // [BOS] of k3-tiny-a
  for (int id : ids) csv += "," + std::to_string(id);
  ASSERT_EQ(0, test::run_wren("run --model " + test::golden_dir() + " --ids " + csv + " -n 1 --logits " + dir + "/l.f32", &out)) << out;
  const std::vector<float> lg = test::read_all_f32(dir + "/l.f32");
  const int V = 4352;
  ASSERT_EQ(lg.size(), (ids.size() + 1) * V);
  double nll = 0;
  int top1 = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = lg.data() + t * V;
    double mx = row[0], sum = 0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, double(row[i]));
    for (int i = 0; i < V; ++i) sum += std::exp(double(row[i]) - mx);
    nll += std::log(sum) + mx - row[ids[t]];
    top1 += argmax(row, V) == ids[t];
  }
  EXPECT_EQ(int(p["tokens"]), int(ids.size()));
  EXPECT_EQ(int(p["windows"]), 1);
  EXPECT_NEAR(double(p["perplexity"]), std::exp(nll / ids.size()), 1e-9 * std::exp(nll / ids.size()));
  EXPECT_NEAR(double(p["top1_accuracy"]), double(top1) / ids.size(), 1e-12);
  // Windows of 8: each [BOS] + 7 file tokens from a fresh state; every token still scored once.
  ASSERT_EQ(0, test::run_wren("perplexity --model " + test::golden_dir() + " " + text + " --json --window 8", &out)) << out;
  const nlohmann::json w = perplexity_json(out);
  EXPECT_EQ(int(w["tokens"]), int(ids.size()));
  EXPECT_EQ(int(w["windows"]), int((ids.size() + 6) / 7));
  std::filesystem::remove_all(dir);
}

TEST(Perplexity, BadInputIsAClearError) {
  std::string out;
  EXPECT_NE(0, test::run_wren("perplexity --model " + test::golden_dir() + " /nonexistent/file.txt", &out));
  EXPECT_NE(out.find("/nonexistent/file.txt"), std::string::npos) << out;
  const std::string dir = test::temp_dir("pplempty");
  std::ofstream(dir + "/e.txt").flush();
  EXPECT_NE(0, test::run_wren("perplexity --model " + test::golden_dir() + " " + dir + "/e.txt", &out));
  EXPECT_NE(out.find("no tokens"), std::string::npos) << out;
  EXPECT_NE(0, test::run_wren("perplexity --model " + test::golden_dir() + " " + dir + "/e.txt --window 1", &out));
  std::filesystem::remove_all(dir);
}

TEST(Perplexity, HeldOutTextFarBelowRandomWeights) {
  SKIP_WITHOUT_TINY();
  // tests/data/wren-tiny/heldout.txt: held-out documents of the training sources (never trained on).
  // The same architecture with random weights (`wren synth` on the committed config) is the baseline.
  const std::string text = ref_dir() + "/heldout.txt", dir = test::temp_dir("ppl");
  std::string out;
  ASSERT_EQ(0, test::run_wren("perplexity --model " + tiny_dir() + " " + text + " --json", &out)) << out;
  const nlohmann::json tiny = perplexity_json(out);
  ASSERT_EQ(0, test::run_wren("synth --config " + tiny_dir() + "/config.json --out " + dir + " --seed 7", &out)) << out;
  std::filesystem::copy_file(tiny_dir() + "/tiktoken.model", dir + "/tiktoken.model");
  std::filesystem::copy_file(tiny_dir() + "/tokenizer_config.json", dir + "/tokenizer_config.json");
  ASSERT_EQ(0, test::run_wren("perplexity --model " + dir + " " + text + " --json", &out)) << out;
  const nlohmann::json rnd = perplexity_json(out);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(tiny.contains("perplexity") && rnd.contains("perplexity"));
  EXPECT_EQ(tiny["tokens"], rnd["tokens"]);
  EXPECT_GT(int(tiny["tokens"]), 500);
  const double pt = tiny["perplexity"], pr = rnd["perplexity"];
  std::printf("[ perplexity ] wren-tiny %.2f, random weights %.2f, over %d tokens\n", pt, pr, int(tiny["tokens"]));
  EXPECT_LT(pt * 20, pr);
}

INSTANTIATE_TEST_SUITE_P(Prompts, WrenTiny, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "prompt" + std::to_string(info.param); });

}  // namespace
}  // namespace wren
