// `wren bench routing` (per-layer expert load and expert-cache hit rate on a text file) and
// `wren bench quality --text` (the --quant table on real text, with perplexity).
// BenchRouting.CountsAreTheReferenceRoutersTopK checks the recorded routing against the independent
// f64 reference forward (tests/reference_model.h), window by window; the cache checks use what any
// LRU must satisfy (inclusion: the hit rate never falls as the budget grows; with every expert
// resident, the misses are exactly the distinct experts used).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/load.h"
#include "reference_model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace wren {
namespace {

/// The one line of `out` that starts with '{', parsed.
nlohmann::json json_line(const std::string& out) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') return nlohmann::json::parse(line);
  ADD_FAILURE() << "no JSON line in: " << out;
  return nlohmann::json::object();
}

const char* kText =
    "The quick brown fox jumps over the lazy dog. Wren reads K3 checkpoints; 12 + 30 = 42. "
    "A small bird sings in the morning, and the river runs to the sea.";

std::string write_text(const std::string& dir) {
  const std::string p = dir + "/t.txt";
  std::ofstream(p) << kText;
  return p;
}

TEST(BenchRouting, CountsAreTheReferenceRoutersTopK) {
  const std::string dir = test::temp_dir("routing"), text = write_text(dir);
  const int window = 16;
  std::string out;
  ASSERT_EQ(0, test::run_wren("bench routing --model " + test::golden_dir() + " " + text + " --json --window " +
                                  std::to_string(window), &out)) << out;
  const nlohmann::json j = json_line(out);
  const auto model = load_model(test::golden_dir());
  const Config& c = model->config;
  const std::vector<int> ids = Tokenizer::load(test::golden_dir()).encode(kText, SpecialMode::Disabled);
  // The reference, window by window from a fresh state: [BOS] + up to window-1 tokens.
  std::vector<std::vector<long long>> counts(size_t(c.n_layers), std::vector<long long>(size_t(c.n_experts), 0));
  int windows = 0;
  for (size_t start = 0; start < ids.size(); start += size_t(window - 1), ++windows) {
    std::vector<int> w{c.bos_id};
    w.insert(w.end(), ids.begin() + long(start), ids.begin() + long(std::min(ids.size(), start + window - 1)));
    std::vector<std::vector<std::vector<int>>> routes;
    test::reference_forward(*model, w, nullptr, &routes);
    for (const auto& step : routes)
      for (int l = 0; l < c.n_layers; ++l)
        for (int e : step[size_t(l)]) ++counts[size_t(l)][size_t(e)];
  }
  EXPECT_EQ(int(j["tokens"]), int(ids.size()));
  EXPECT_EQ(int(j["windows"]), windows);
  EXPECT_EQ(int(j["top_k"]), c.top_k);
  ASSERT_EQ(j["layers"].size(), size_t(c.n_layers - c.first_dense));
  long long mismatched = 0, picks = 0;
  for (const auto& l : j["layers"]) {
    const int layer = l["layer"];
    const std::vector<long long> got = l["counts"];
    ASSERT_EQ(got.size(), size_t(c.n_experts));
    long long sum = 0;
    for (int e = 0; e < c.n_experts; ++e) {
      sum += got[size_t(e)];
      mismatched += std::llabs(got[size_t(e)] - counts[size_t(layer)][size_t(e)]);
    }
    picks += sum;
    EXPECT_EQ(sum, (long long)(ids.size() + size_t(windows)) * c.top_k) << "layer " << layer;  // every step routes
    EXPECT_GE(double(l["entropy"]), 0.0);
    EXPECT_LE(double(l["entropy"]), 1.0 + 1e-12);
    EXPECT_GE(double(l["max_over_mean"]), 1.0);
  }
  // f32 vs f64 can swap two experts whose biased scores tie to ~1e-6; none do on this text.
  EXPECT_EQ(mismatched, 0) << "of " << picks << " expert picks";
  std::filesystem::remove_all(dir);
}

TEST(BenchRouting, HitRateIsAnLruOfTheTrace) {
  const std::string dir = test::temp_dir("routing2"), text = write_text(dir);
  std::string out;
  ASSERT_EQ(0, test::run_wren("bench routing --model " + test::golden_dir() + " " + text +
                                  " --json --budgets 0.05,0.25,0.5,0.75,1", &out)) << out;
  const nlohmann::json j = json_line(out);
  long long distinct = 0;
  for (const auto& l : j["layers"])
    for (long long v : std::vector<long long>(l["counts"])) distinct += v > 0;
  const auto& cache = j["expert_cache"];
  ASSERT_EQ(cache.size(), 5u);
  double prev = -1, prev_u = -1;
  const long long picks = (long long)(j["requests"]) * int(j["top_k"]);
  for (const auto& b : cache) {
    EXPECT_EQ((long long)(b["hits"]) + (long long)(b["misses"]), picks);
    EXPECT_GE(double(b["hit_rate"]), prev) << b.dump();  // LRU inclusion property
    EXPECT_GE(double(b["uniform_hit_rate"]), prev_u) << b.dump();
    EXPECT_LE(double(b["hit_rate"]), double(b["static_top_hit_rate"]) + 1e-12) << b.dump();
    prev = b["hit_rate"], prev_u = b["uniform_hit_rate"];
  }
  EXPECT_EQ((long long)(cache.back()["misses"]), distinct);  // all resident: cold misses only
  EXPECT_DOUBLE_EQ(double(cache.back()["static_top_hit_rate"]), 1.0);
  // Decode perplexity = `wren perplexity` (same windows; prefill vs decode differ by f32 rounding).
  ASSERT_EQ(0, test::run_wren("perplexity --model " + test::golden_dir() + " " + text + " --json", &out)) << out;
  const nlohmann::json p = json_line(out);
  EXPECT_NEAR(double(j["perplexity"]), double(p["perplexity"]), 1e-4 * double(p["perplexity"]));
  std::filesystem::remove_all(dir);
}

TEST(BenchRouting, BadInputIsAClearError) {
  std::string out;
  EXPECT_NE(0, test::run_wren("bench routing --model " + test::golden_dir() + " /nonexistent/t.txt", &out));
  EXPECT_NE(out.find("/nonexistent/t.txt"), std::string::npos) << out;
  const std::string dir = test::temp_dir("routing3"), text = write_text(dir);
  EXPECT_NE(0, test::run_wren("bench routing --model " + test::golden_dir() + " " + text + " --budgets 0.5,2", &out));
  EXPECT_NE(out.find("--budgets"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

TEST(BenchQuality, TextModeExactPerplexityIsWrenPerplexity) {
  // The reference row of `bench quality --text` is the exact f32 prefill `wren perplexity` runs:
  // the same windows, so the same perplexity to the printed digits.
  const std::string dir = test::temp_dir("qualtext"), text = write_text(dir);
  std::string out;
  ASSERT_EQ(0, test::run_wren("bench quality --model " + test::golden_dir() + " --text " + text +
                                  " --window 16 --positions 0", &out)) << out;
  const std::string key = "perplexity of the reference on the text: ";
  const size_t at = out.find(key);
  ASSERT_NE(at, std::string::npos) << out;
  const double q = std::stod(out.substr(at + key.size()));
  ASSERT_EQ(0, test::run_wren("perplexity --model " + test::golden_dir() + " " + text + " --json --window 16", &out)) << out;
  const double p = json_line(out)["perplexity"];
  EXPECT_NEAR(q, p, 1e-4 * p);
  std::filesystem::remove_all(dir);
}

TEST(QuantQuality, PresetsCostLittlePerplexityOnTrainedWeights) {
  // docs/cpu-performance.md#on-trained-weights-modelswren-tiny-2026-12-01: on the trained built-in
  // model the int4 default costs +0.22 % perplexity on this held-out text and q8 +0.03 %
  // (random weights of the same shape decorrelate under both). Bounds with a margin: 1 % and 0.2 %.
  const std::string tiny = std::string(WREN_SOURCE_DIR) + "/models/wren-tiny";
  if (!std::filesystem::exists(tiny + "/model.safetensors.index.json")) GTEST_SKIP() << tiny << " is not committed yet";
  const std::string text = std::string(WREN_SOURCE_DIR) + "/tests/data/wren-tiny/heldout.txt";
  auto ppl = [&](const std::string& quant) {
    std::string out;
    EXPECT_EQ(0, test::run_wren("perplexity --model " + tiny + " " + text + " --json --quant " + quant, &out)) << out;
    return double(json_line(out)["perplexity"]);
  };
  const double exact = ppl("exact"), q8 = ppl("q8"), def = ppl("default");
  std::printf("[ quant ] perplexity exact %.4f, q8 %.4f, default %.4f\n", exact, q8, def);
  EXPECT_LT(q8 / exact, 1.002);
  EXPECT_LT(def / exact, 1.01);
  EXPECT_GT(def / exact, 0.99);  // a mode that changed nothing (or everything) would not land here by chance
}

}  // namespace
}  // namespace wren
