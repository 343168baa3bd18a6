// Shared helpers for the test suites: paths, temp dirs, golden files, rel-L2.
#pragma once
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace wren::test {

/// The repository's test data folder, tests/data (see its README: where each file came from).
std::string data_dir();
/// tests/data/k3-tiny-a: the small K3 checkpoint in the published layout, with golden outputs.
std::string golden_dir();
/// tests/data/kimi-linear-tiny: the small Kimi Linear checkpoint with transformers' outputs.
std::string kimi_linear_dir();
/// The K2-style specials k2_tokenizer() adds after the k3-tiny-a ranks, in id order from 4096.
inline const char* const kK2Specials[] = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                          "<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
                                          "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                                          "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
/// A tokenizer with the k3-tiny-a BPE ranks and the K2 chat specials above (ids 4096..4107): the
/// repository has no Kimi Linear / K2 tokenizer, so the K2 chat dialect is tested on this one.
Tokenizer k2_tokenizer();
/// A fresh temporary directory (removed at process exit is not guaranteed; under /tmp).
std::string temp_dir(const std::string& tag);
/// ‖a − b‖ / ‖b‖.
double rel_l2(const float* a, const float* b, size_t n);
/// Reads a whole little-endian f32 file.
std::vector<float> read_all_f32(const std::string& path);
/// The tiny golden config with its text_config overridden by `patch` (merge_patch).
nlohmann::json golden_config(const nlohmann::json& patch = nlohmann::json::object());
/// A second K3 shape for generated checkpoints: every size differs from k3-tiny-a; L = 6 with
/// MLA every 4th plus the last, two dense layers, an AttnRes block larger than L.
nlohmann::json second_shape_config();
/// Runs the wren binary with `args` (and shell environment assignments `env`, e.g. "A=1");
/// returns its exit code, stdout+stderr in *out.
int run_wren(const std::string& args, std::string* out, const std::string& env = "");

/// Sets an environment variable for one scope and restores the previous value (or its absence).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

/// Gives a backend other options for one scope (set_options) and restores the previous ones:
/// `ScopedOptions kda(*be, CudaOptions{CudaKda::Chunked, 16});`.
template <class B, class O>
class ScopedOptions {
 public:
  ScopedOptions(B& be, const O& o) : be_(be), old_(be.options()) { be.set_options(o); }
  ~ScopedOptions() { be_.set_options(old_); }
  ScopedOptions(const ScopedOptions&) = delete;
  ScopedOptions& operator=(const ScopedOptions&) = delete;

 private:
  B& be_;
  O old_;
};

}  // namespace wren::test
