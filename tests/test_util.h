// Shared helpers for the test suites: paths, temp dirs, golden files, rel-L2.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "backends/cpu/isa.h"
#include "ops/backend.h"

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
/// A copy of the golden checkpoint (its top-level files) in a fresh temp_dir(tag), with `bytes`
/// written at byte `offset` of tensor `name` (the full stored name, e.g.
/// "language_model.model.embed_tokens.weight") in the shard the index names. Returns the folder.
std::string patched_golden_copy(const std::string& tag, const std::string& name, uint64_t offset,
                                const std::string& bytes);
/// One case of the golden k3-tiny-a outputs (tests/data/k3-tiny-a/golden/golden.json): the prompt
/// ids, the golden greedy continuation and its top1 − top2 margin at every step.
struct GoldenCase {
  std::string name;
  std::vector<int> ids, greedy;
  std::vector<double> margins;
};
/// Every case of golden.json.
std::vector<GoldenCase> golden_cases();
/// Worst rel-L2 values of one comparison with the golden trace.
struct GoldenTraceResult {
  double worst_row = 0, worst_layer = 0;
};
/// The golden criterion for a trace [T, L, D] of case `gc` (docs/model.md#validation-hooks): each
/// layer's [T, D] block within rel-L2 1e-4 of the golden trace, each single row within 3e-4
/// (EXPECT_* failures name `what`, the token and the layer). Returns the worst values.
GoldenTraceResult expect_golden_trace(const std::vector<float>& trace, const GoldenCase& gc, int L, int D,
                                      const std::string& what);
/// The golden criterion for logits [T, V] of case `gc`: rel-L2 within 1e-4 of the golden logits and
/// every position's argmax equal. Returns the rel-L2.
double expect_golden_logits(const std::vector<float>& logits, const GoldenCase& gc, int V, const std::string& what);
/// `n` deterministic pseudo-random token ids in [0, vocab) (an LCG of index and `seed`): prompts for
/// tests that need many different, reproducible inputs.
std::vector<int> some_ids(int n, int vocab, int seed);
/// ‖a − b‖ / ‖b‖.
double rel_l2(const float* a, const float* b, size_t n);
/// Reads a whole little-endian f32 file.
std::vector<float> read_all_f32(const std::string& path);
/// The tiny golden config with its text_config overridden by `patch` (merge_patch).
nlohmann::json golden_config(const nlohmann::json& patch = nlohmann::json::object());
/// A second K3 shape for generated checkpoints: every size differs from k3-tiny-a; L = 6 with
/// MLA every 4th plus the last, two dense layers, an AttnRes block larger than L.
nlohmann::json second_shape_config();
/// Runs a shell command; returns its exit code, stdout+stderr in *out.
int run_cmd(const std::string& cmd, std::string* out);
/// The CPU kernel levels (ISA) this machine runs: Scalar, and AVX2 / AVX-512 when supported.
std::vector<cpu::Isa> cpu_levels();
/// Runs the wren binary with `args` (and shell environment assignments `env`, e.g. "A=1");
/// returns its exit code, stdout+stderr in *out.
int run_wren(const std::string& args, std::string* out, const std::string& env = "");

/// n uniform random floats in [lo, hi), never exactly 0 (a zero input hides missing terms).
std::vector<float> random_vec(std::mt19937& g, size_t n, float lo = -1.f, float hi = 1.f);

/// A dense f32 weight owned by the test: host storage and the DenseWeight view [rows, cols] of it.
struct HostWeight {
  std::vector<float> data;
  DenseWeight w;
  HostWeight(std::vector<float> d, int64_t rows, int64_t cols) : data(std::move(d)) {
    w.rows = rows, w.cols = cols, w.data = data.data();
  }
};

/// Backend buffers of one test, for the per-op device tests (CUDA fixtures): dev() copies host data
/// in, poisoned() gives NaN-filled outputs (an unwritten element shows), host() reads back; every
/// buffer made here (and any given to keep in owned_) is released by release_owned().
class BackendBuffers {
 protected:
  virtual ~BackendBuffers() = default;
  /// The backend the buffers live on.
  virtual Backend& buffers_backend() = 0;
  float* dev(const std::vector<float>& h) {
    float* p = buffers_backend().alloc(h.size());
    buffers_backend().from_host(h.data(), h.size(), p);
    owned_.push_back(p);
    return p;
  }
  float* poisoned(size_t n) { return dev(std::vector<float>(n, std::nanf(""))); }
  std::vector<float> host(const float* d, size_t n) {
    std::vector<float> h(n);
    buffers_backend().to_host(d, n, h.data());
    return h;
  }
  void release_owned() {
    for (float* p : owned_) buffers_backend().release(p);
    owned_.clear();
  }
  std::vector<float*> owned_;
};

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
