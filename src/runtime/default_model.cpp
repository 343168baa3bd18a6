// The built-in default model (see default_model.h).
#include "runtime/default_model.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "synth/synth.h"

#ifndef WREN_SOURCE_DIR
#define WREN_SOURCE_DIR "."
#endif

namespace wren {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kRanks = 16384;
constexpr const char* kName = "default-k3-v1";  // bump when the config or writer changes

/// The K3 special tokens at their offsets after the BPE ranks (spec kimi-k3.md §6.3).
json tokenizer_config() {
  const std::pair<int, const char*> named[] = {
      {0, "[BOS]"}, {1, "[EOS]"}, {2, "<|end_of_msg|>"}, {3, "<|open|>"}, {4, "<|close|>"},
      {5, "<|sep|>"}, {6, "[start_header_id]"}, {7, "[end_header_id]"}, {9, "[EOT]"},
      {18, "<|media_begin|>"}, {19, "<|media_content|>"}, {20, "<|media_end|>"}, {21, "<|media_pad|>"},
      {65, "<osagent_mode>"}, {254, "[UNK]"}, {255, "[PAD]"}};
  json dec = json::object();
  for (int off = 0; off < 256; ++off) {
    std::string content = "<|reserved_token_" + std::to_string(off) + "|>";
    for (const auto& [o, n] : named)
      if (o == off) content = n;
    dec[std::to_string(kRanks + off)] = {{"content", content}, {"special", true}, {"lstrip", false},
                                         {"rstrip", false}, {"normalized", false}, {"single_word", false}};
  }
  return {{"tokenizer_class", "TikTokenTokenizer"}, {"bos_token", "[BOS]"}, {"eos_token", "[EOS]"},
          {"pad_token", "[PAD]"}, {"unk_token", "[UNK]"},
          {"additional_special_tokens", {"<|end_of_msg|>"}}, {"added_tokens_decoder", dec}};
}

/// A small K3: 8 layers (MLA at 4 and 8, 1-based), AttnRes blocks of 4, 32 MXFP4 experts, top-4.
json model_config() {
  const json text = {
      {"model_type", "kimi_linear"}, {"hidden_size", 256}, {"num_hidden_layers", 8},
      {"vocab_size", kRanks + 256}, {"first_k_dense_replace", 1}, {"intermediate_size", 768},
      {"num_attention_heads", 4}, {"num_key_value_heads", 4}, {"q_lora_rank", 128}, {"kv_lora_rank", 64},
      {"qk_nope_head_dim", 32}, {"qk_rope_head_dim", 16}, {"v_head_dim", 32}, {"num_experts", 32},
      {"num_experts_per_token", 4}, {"moe_intermediate_size", 128}, {"routed_expert_hidden_size", 128},
      {"num_shared_experts", 2}, {"attn_res_block_size", 4}, {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0}, {"rms_norm_eps", 1e-5}, {"hidden_act", "situ"},
      {"latent_moe_use_norm", true}, {"moe_router_activation_func", "sigmoid"}, {"moe_renormalize", true},
      {"routed_scaling_factor", 1.0}, {"use_grouped_topk", true}, {"num_expert_group", 1}, {"topk_group", 1},
      {"topk_method", "noaux_tc"}, {"moe_layer_freq", 1}, {"mla_use_nope", true}, {"mla_use_output_gate", true},
      {"num_nextn_predict_layers", 0}, {"max_position_embeddings", 1048576},
      {"linear_attn_config", {{"num_heads", 4}, {"head_dim", 64}, {"short_conv_kernel_size", 4},
                              {"gate_lower_bound", -5.0}, {"use_full_rank_gate", true},
                              {"kda_layers", {1, 2, 3, 5, 6, 7}}, {"full_attn_layers", {4, 8}}}}};
  const json group = {{"format", "mxfp4-pack-quantized"}, {"targets", {"Linear"}},
                      {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 32}}},
                      {"input_activations", nullptr}};
  return {{"architectures", {"KimiK3ForConditionalGeneration"}}, {"model_type", "kimi_k3"},
          {"bos_token_id", kRanks}, {"eos_token_id", kRanks + 2}, {"pad_token_id", kRanks + 255},
          {"tie_word_embeddings", false}, {"text_config", text},
          {"quantization_config", {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"},
                                   {"config_groups", {{"group_0", group}}},
                                   {"ignore", {"re:.*(?<!experts\\.\\d+\\.w[123])$"}}}}};
}

}  // namespace

std::string cache_root() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/wren";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/wren";
  return "/tmp/wren-cache";
}

std::string default_tokenizer_config() { return tokenizer_config().dump(1) + "\n"; }

std::string source_dir() { return WREN_SOURCE_DIR; }

std::string data_dir() {
  // Found from the executable, never from the source tree: <bin>/../share/wren once installed
  // (cmake --install), <build>/share/wren in a build folder (CMake copies data/ there).
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& d : {exe.parent_path() / "share" / "wren", exe.parent_path().parent_path() / "share" / "wren"})
      if (fs::is_directory(d, ec)) return d.string();
    return (exe.parent_path().parent_path() / "share" / "wren").string();
  }
  return "share/wren";
}

std::string default_vocab_file() { return data_dir() + "/default-vocab.tiktoken"; }

std::string ensure_default_model(const std::string& vocab_file) {
  const std::string dir = cache_root() + "/" + kName;
  if (!fs::exists(dir + "/model.safetensors.index.json")) {
    check(fs::exists(vocab_file), vocab_file + ": the default model's vocabulary is missing (run "
                                                "scripts/setup.sh, which writes it from the npm tiktoken package), or "
                                                "pass --model DIR");
    std::fprintf(stderr, "wren: creating the built-in default model in %s (first use)...\n", dir.c_str());
    const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    SynthOptions o;
    o.seed = 2026;
    o.vision_shard = false;
    write_synthetic_checkpoint(model_config(), tmp, o);
    fs::copy_file(vocab_file, tmp + "/tiktoken.model");
    std::ofstream(tmp + "/tokenizer_config.json") << default_tokenizer_config();
    std::error_code ec;
    fs::rename(tmp, dir, ec);  // another process may have won the race: then use its copy
    if (ec) fs::remove_all(tmp);
  }
  std::fprintf(stderr, "wren: no --model given: using the built-in default model (%s). Its weights are "
                       "RANDOM: it shows the machinery, not language.\n", dir.c_str());
  return dir;
}

}  // namespace wren
