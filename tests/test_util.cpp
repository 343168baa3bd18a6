// Shared helpers for the test suites.
#include "test_util.h"

#include "tokenizer/tiktoken_model.h"

#include "runtime/validate.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <cstring>
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

int run_wren(const std::string& args, std::string* out, const std::string& env) {
  const std::string cmd = (env.empty() ? "" : env + " ") + std::string(WREN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  out->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace wren::test
