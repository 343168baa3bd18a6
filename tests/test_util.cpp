// Shared helpers for the test suites.
#include "test_util.h"

#include "tokenizer/tiktoken_model.h"

#include <gtest/gtest.h>

#include "runtime/sampler.h"
#include "runtime/validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <cstring>
#include <stdexcept>
#include <sys/wait.h>

namespace wren::test {

std::string data_dir() { return std::string(WREN_SOURCE_DIR) + "/tests/data"; }

std::string golden_dir() { return data_dir() + "/k3-tiny-a"; }

Tokenizer k2_tokenizer() {
  RankTable ranks = load_tiktoken_model(golden_dir() + "/tiktoken.model");
  std::vector<SpecialToken> specials;
  int id = ranks.size();
  for (const char* s : kK2Specials) specials.push_back({id++, s});
  return Tokenizer(std::move(ranks), std::move(specials));
}

std::string kimi_linear_dir() { return data_dir() + "/kimi-linear-tiny"; }

std::string temp_dir(const std::string& tag) {
  static std::random_device rd;
  const auto p = std::filesystem::temp_directory_path() /
                 ("wren-test-" + tag + "-" + std::to_string(rd()));
  std::filesystem::create_directories(p);
  return p.string();
}

std::string patched_golden_copy(const std::string& tag, const std::string& name, uint64_t offset,
                                const std::string& bytes) {
  namespace fs = std::filesystem;
  const std::string dir = temp_dir(tag);
  for (const auto& e : fs::directory_iterator(golden_dir()))
    if (e.is_regular_file())
      fs::copy_file(e.path(), dir + "/" + e.path().filename().string(), fs::copy_options::overwrite_existing);
  std::ifstream ix(dir + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(ix);
  const std::string shard = dir + "/" + index.at("weight_map").at(name).get<std::string>();
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string h(n, '\0');
  f.read(h.data(), std::streamsize(n));
  const auto hdr = nlohmann::json::parse(h);
  const uint64_t begin = hdr.at(name).at("data_offsets")[0].get<uint64_t>(), end = hdr.at(name).at("data_offsets")[1].get<uint64_t>();
  if (offset + bytes.size() > end - begin) throw std::runtime_error("patched_golden_copy: offset beyond " + name);
  f.seekp(std::streamoff(8 + n + begin + offset));
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("patched_golden_copy: cannot write " + shard);
  return dir;
}

std::vector<GoldenCase> golden_cases() {
  std::ifstream f(golden_dir() + "/golden/golden.json");
  const auto j = nlohmann::json::parse(f);
  std::vector<GoldenCase> out;
  for (const auto& c : j["cases"]) out.push_back({c["name"], c["ids"], c["greedy_next"], c["greedy_margins"]});
  return out;
}

GoldenTraceResult expect_golden_trace(const std::vector<float>& trace, const GoldenCase& gc, int L, int D,
                                      const std::string& what) {
  const auto gtrace = read_all_f32(golden_dir() + "/golden/" + gc.name + ".trace.f32");
  GoldenTraceResult res;
  EXPECT_EQ(gtrace.size(), trace.size()) << what;
  if (gtrace.size() != trace.size()) return res;
  const int T = int(gc.ids.size());
  for (int i = 0; i < L; ++i) {
    std::vector<float> a(size_t(T) * D), b(size_t(T) * D);
    for (int t = 0; t < T; ++t) {
      const size_t off = (size_t(t) * L + i) * D;
      std::copy(trace.begin() + off, trace.begin() + off + D, a.begin() + size_t(t) * D);
      std::copy(gtrace.begin() + off, gtrace.begin() + off + D, b.begin() + size_t(t) * D);
      const double r = rel_l2(trace.data() + off, gtrace.data() + off, D);
      res.worst_row = std::max(res.worst_row, r);
      EXPECT_LT(r, 3e-4) << what << " token " << t << " layer " << i;
    }
    const double r = rel_l2(a.data(), b.data(), a.size());
    res.worst_layer = std::max(res.worst_layer, r);
    EXPECT_LT(r, 1e-4) << what << " layer " << i;
  }
  return res;
}

double expect_golden_logits(const std::vector<float>& logits, const GoldenCase& gc, int V, const std::string& what) {
  const auto glogits = read_all_f32(golden_dir() + "/golden/" + gc.name + ".logits.f32");
  EXPECT_EQ(glogits.size(), logits.size()) << what;
  if (glogits.size() != logits.size()) return 1;
  const double lr = rel_l2(logits.data(), glogits.data(), logits.size());
  EXPECT_LT(lr, 1e-4) << what;
  for (size_t t = 0; t < gc.ids.size(); ++t)
    EXPECT_EQ(argmax(logits.data() + t * V, V), argmax(glogits.data() + t * V, V)) << what << " position " << t;
  return lr;
}

std::vector<float> random_vec(std::mt19937& g, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = u(g);
    while (x == 0.f);
  }
  return v;
}

std::vector<int> some_ids(int n, int vocab, int seed) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int((1103515245u * (i + 7u * seed) + 12345u) % vocab));
  return ids;
}

double rel_l2(const float* a, const float* b, size_t n) { return wren::rel_l2(a, b, n); }

std::vector<float> read_all_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

nlohmann::json golden_config(const nlohmann::json& patch) {
  std::ifstream f(golden_dir() + "/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  j["text_config"].merge_patch(patch);
  return j;
}

nlohmann::json second_shape_config() {
  nlohmann::json j = test::golden_config({
      {"hidden_size", 96}, {"num_hidden_layers", 6}, {"vocab_size", 1000}, {"first_k_dense_replace", 2},
      {"intermediate_size", 160}, {"num_attention_heads", 3}, {"num_key_value_heads", 3},
      {"q_lora_rank", 48}, {"kv_lora_rank", 24}, {"qk_nope_head_dim", 16}, {"qk_rope_head_dim", 8},
      {"v_head_dim", 20}, {"num_experts", 12}, {"num_experts_per_token", 3},
      {"moe_intermediate_size", 32}, {"routed_expert_hidden_size", 64}, {"num_shared_experts", 1},
      {"attn_res_block_size", 8},
      {"linear_attn_config", {{"num_heads", 3}, {"head_dim", 16}, {"short_conv_kernel_size", 3},
                              {"kda_layers", {1, 2, 3, 5}}, {"full_attn_layers", {4, 6}}}}});
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  return j;
}

int run_cmd(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  out->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int run_wren(const std::string& args, std::string* out, const std::string& env) {
  return run_cmd((env.empty() ? "" : env + " ") + std::string(WREN_BINARY) + " " + args, out);
}

std::vector<cpu::Isa> cpu_levels() {
  std::vector<cpu::Isa> out;
  for (cpu::Isa i : {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx512})
    if (cpu::isa_supported(i)) out.push_back(i);
  return out;
}

}  // namespace wren::test
