// The built-in default model (see default_model.h).
#include "runtime/default_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

#ifndef WREN_SOURCE_DIR
#define WREN_SOURCE_DIR "."
#endif

namespace wren {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kRanks = 16384;

/// The K3 special tokens at their offsets after the BPE ranks (docs/model.md#tokenizer-specials).
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

std::string trained_model_dir() { return data_dir() + "/models/wren-tiny"; }

std::string default_model_dir() {
  const std::string trained = trained_model_dir();
  check(fs::exists(trained + "/model.safetensors.index.json"),
        trained + "/model.safetensors.index.json: the built-in model wren-tiny is missing (the build copies the "
        "repository's models/ folder into share/wren, cmake --install installs it): rebuild or reinstall Wren, "
        "or pass --model DIR");
  std::fprintf(stderr, "wren: no --model given: using the built-in model wren-tiny (%s)\n", trained.c_str());
  return trained;  // committed weights (models/wren-tiny): read-only, nothing written on first use
}

}  // namespace wren
