// Bad input never crashes, hangs or yields garbage: every broken config key, unsupported flag
// (docs/model.md#decisions, item 3), missing/misshapen/mistyped tensor, corrupt safetensors shard, broken
// index and MXFP4 scale byte 255 (docs/model.md#decisions, item 4) must give a wren::Error that names the file, tensor or
// key and what was expected — from load_model/Forward, and as "wren: error: ..." with a non-zero
// exit from `wren run`. Each case copies one small, several-shard synthetic checkpoint and breaks
// exactly one thing. A fuzz test throws random and mutated headers at the safetensors parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/mxfp4.h"
#include "io/safetensors.h"
#include "model/load.h"
#include "model/tensor_table.h"
#include "runtime/generate.h"
#include "synth/synth.h"
#include "test_util.h"
#include "wrapped_backend.h"

namespace wren {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Words = std::vector<std::string>;

const std::string kPfx = "language_model.";
// Tensors the cases break (full names as in the synthetic checkpoint).
const std::string kQ = kPfx + "model.layers.1.self_attn.q_proj.weight";  // BF16 [128, 128]
const std::string kDt = kPfx + "model.layers.1.self_attn.dt_bias";       // F32 [128]
const std::string kPacked = kPfx + expert_name(2, 3) + ".w1.weight_packed";  // U8 [64, 32]
const std::string kScale = kPfx + expert_name(2, 3) + ".w2.weight_scale";    // U8 [64, 2]
const std::string kNorm0 = kPfx + "model.layers.0.input_layernorm.weight";    // BF16 [128]
const std::string kEmbed = kPfx + "model.embed_tokens.weight";                // BF16 [4352, 128]

// ---------------------------------------------------------------- files and checkpoints

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(bool(f)) << path;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

void edit_json(const std::string& path, const std::function<void(json&)>& edit) {
  json j = read_json(path);
  edit(j);
  write_bytes(path, j.dump(1));
}

std::string index_path(const std::string& dir) { return dir + "/model.safetensors.index.json"; }

/// File name (not path) of the shard the index assigns `tensor` to.
std::string shard_of(const std::string& dir, const std::string& tensor) {
  return read_json(index_path(dir))["weight_map"].at(tensor).get<std::string>();
}

/// The golden config shrunk to 4 layers (KDA+dense, KDA+MoE, KDA+MoE, MLA+MoE), 16 experts.
json small_config() {
  return test::golden_config(
      {{"num_hidden_layers", 4},
       {"linear_attn_config", {{"kda_layers", {1, 2, 3}}, {"full_attn_layers", {4}}}}});
}

/// The valid checkpoint every case starts from: written once per process; 7 text shards + vision.
const std::string& base_checkpoint() {
  static const struct Base {
    std::string dir = test::temp_dir("bad-input-base");
    Base() { write_synthetic_checkpoint(small_config(), dir, SynthOptions{.shard_bytes = 300'000}); }
    ~Base() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } base;
  return base.dir;
}

/// A private copy of the base checkpoint, removed when the case ends.
class CaseDir {
 public:
  explicit CaseDir(const std::string& tag) : dir_(test::temp_dir("bad-input-" + tag)) {
    fs::copy(base_checkpoint(), dir_, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  ~CaseDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

/// One safetensors shard split into its parsed header and raw data section, for header surgery.
/// save() writes the 8-byte length prefix, the (space-padded) header and the data unchanged.
struct ShardFile {
  std::string path;
  json header;
  std::string data;

  /// A new, empty shard at `p` (written by save()).
  ShardFile(std::string p, json h) : path(std::move(p)), header(std::move(h)) {}
  explicit ShardFile(std::string p) : path(std::move(p)) {
    const std::string bytes = read_bytes(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    header = json::parse(bytes.substr(8, n));
    data = bytes.substr(8 + n);
  }

  void save() const {
    std::string h = header.dump();
    while (h.size() % 8) h += ' ';
    const uint64_t n = h.size();
    std::string prefix(8, '\0');
    std::memcpy(prefix.data(), &n, 8);
    write_bytes(path, prefix + h + data);
  }

  uint64_t begin(const std::string& name) const { return header.at(name)["data_offsets"][0]; }
  uint64_t end(const std::string& name) const { return header.at(name)["data_offsets"][1]; }

  /// Tensor names in data-offset order.
  std::vector<std::string> by_offset() const {
    std::vector<std::string> names;
    for (const auto& [k, _] : header.items())
      if (k != "__metadata__") names.push_back(k);
    std::sort(names.begin(), names.end(), [&](auto& a, auto& b) { return begin(a) < begin(b); });
    return names;
  }

  /// Relabels `name` as `dtype` (elements of `elem` bytes, same shape); zero bytes of the new
  /// size are appended to the data section and the offsets point there.
  void retype(const std::string& name, const std::string& dtype, uint64_t elem) {
    uint64_t count = 1;
    for (const auto& d : header[name]["shape"]) count *= d.get<uint64_t>();
    const uint64_t b = data.size();
    data.append(count * elem, '\0');
    header[name]["dtype"] = dtype;
    header[name]["data_offsets"] = {b, b + count * elem};
  }
};

/// Opens the shard holding `tensor` in the case dir.
ShardFile shard_holding(const std::string& dir, const std::string& tensor) {
  return ShardFile(dir + "/" + shard_of(dir, tensor));
}

// ---------------------------------------------------------------- expectations

void expect_words(const std::string& msg, const Words& want) {
  for (const std::string& w : want)
    EXPECT_NE(msg.find(w), std::string::npos) << "expected '" << w << "' in:\n  " << msg;
}

/// A message blaming "SHARD.safetensors: tensor 'NAME'" must name the shard that really holds NAME.
void expect_right_shard(const std::string& dir, const std::string& msg) {
  static const std::regex re(R"(([^\s:/]+\.safetensors): tensor '([^']+)')");
  std::smatch m;
  if (!std::regex_search(msg, m, re)) return;
  const json wm = read_json(index_path(dir))["weight_map"];
  ASSERT_TRUE(wm.contains(m[2].str())) << "error names a tensor the index does not have: " << msg;
  EXPECT_EQ(wm[m[2].str()].get<std::string>(), m[1].str()) << "wrong shard named: " << msg;
}

/// Runs `f` and returns its wren::Error message; fails the test if nothing or something else is thrown.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-wren exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "bad input was accepted";
  return "";
}

/// `wren run` on `dir` exits non-zero through the error path (no signal, no sanitizer report)
/// and prints "wren: error:" with every word of `want`.
void expect_cli_error(const std::string& dir, const Words& want) {
  std::string out;
  const int rc = test::run_wren("run --model " + dir + " --ids 4096,976 -n 2", &out);
  EXPECT_GT(rc, 0) << "exit " << rc << " (-1 = killed by a signal):\n" << out;
  EXPECT_NE(out.find("wren: error: "), std::string::npos) << out;
  EXPECT_EQ(out.find("Sanitizer"), std::string::npos) << out;
  EXPECT_EQ(out.find("runtime error"), std::string::npos) << out;
  expect_words(out, want);
  expect_right_shard(dir, out);
}

// ---------------------------------------------------------------- table of broken checkpoints

/// One broken checkpoint: `breaks` damages a fresh copy and returns words the error must contain
/// that depend on the copy (e.g. a shard name); `want` lists the fixed ones.
struct BadCase {
  std::string name;
  std::function<Words(const std::string& dir)> breaks;
  Words want;
  bool inspect = true;  ///< `wren inspect` (headers only, no weights read) must refuse it too
};
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

/// A config.json case: `patch` is an RFC 7396 merge patch on the whole document (null deletes).
BadCase config_case(std::string name, json patch, Words want) {
  want.insert(want.begin(), "config.json");
  return {std::move(name),
          [patch](const std::string& dir) {
            edit_json(dir + "/config.json", [&](json& j) { j.merge_patch(patch); });
            return Words{};
          },
          std::move(want)};
}

/// A case that edits the header of the shard holding `tensor`; the shard's name is expected too.
BadCase header_case(std::string name, const std::string& tensor,
                    std::function<void(ShardFile&)> edit, Words want) {
  return {std::move(name),
          [tensor, edit](const std::string& dir) {
            ShardFile s = shard_holding(dir, tensor);
            edit(s);
            s.save();
            return Words{shard_of(dir, tensor)};
          },
          std::move(want)};
}

/// A case that writes the little-endian element `bytes` at element `at` (-1: every element) of
/// `tensor`'s data; the load (not `wren inspect`, which reads no weights) must refuse it.
BadCase nonfinite_case(std::string name, const std::string& tensor, int at, std::vector<uint8_t> bytes, Words want) {
  BadCase c = header_case(
      std::move(name), tensor,
      [tensor, at, bytes](ShardFile& s) {
        const uint64_t b = s.begin(tensor), e = s.end(tensor), k = bytes.size();
        for (uint64_t i = at < 0 ? 0 : uint64_t(at); i < (e - b) / k; ++i) {
          for (uint64_t j = 0; j < k; ++j) s.data[b + i * k + j] = char(bytes[j]);
          if (at >= 0) break;
        }
      },
      std::move(want));
  c.inspect = false;
  return c;
}

/// A case that rewrites the raw bytes of the shard holding kQ.
BadCase bytes_case(std::string name, std::function<void(std::string&)> edit, Words want) {
  return {std::move(name),
          [edit](const std::string& dir) {
            const std::string path = dir + "/" + shard_of(dir, kQ);
            std::string b = read_bytes(path);
            edit(b);
            write_bytes(path, b);
            return Words{shard_of(dir, kQ)};
          },
          std::move(want)};
}

json text(json patch) { return {{"text_config", std::move(patch)}}; }
json linear(json patch) { return text({{"linear_attn_config", std::move(patch)}}); }
json group0(json patch) { return {{"quantization_config", {{"config_groups", {{"group_0", std::move(patch)}}}}}}; }

// docs/model.md#config, #decisions (item 3): a missing or mistyped key, and every unsupported flag value, is refused with
// the key path, the value found and what is accepted.
std::vector<BadCase> config_cases() {
  const std::string na = "is not supported by Wren";
  return {
      config_case("missing_hidden_size", text({{"hidden_size", nullptr}}),
                  {"text_config.hidden_size", "expected an integer", "key missing"}),
      config_case("hidden_size_string", text({{"hidden_size", "128"}}),
                  {"text_config.hidden_size", "expected an integer", "found \"128\""}),
      config_case("kda_layers_non_integer", linear({{"kda_layers", {1, 2.5, 3}}}),
                  {"text_config.linear_attn_config.kda_layers", "expected a list of integers", "2.5"}),
      config_case("kda_layers_not_list", linear({{"kda_layers", "1,2,3"}}),
                  {"text_config.linear_attn_config.kda_layers", "expected a list of integers"}),
      {"hidden_size_nested_100k_deep",
       [](const std::string& dir) {
         std::string cfg = read_bytes(dir + "/config.json");
         const std::string key = "\"hidden_size\": 128";
         cfg.replace(cfg.find(key), key.size(),
                     "\"hidden_size\": " + std::string(100000, '[') + std::string(100000, ']'));
         write_bytes(dir + "/config.json", cfg);
         return Words{};
       },
       {"config.json: text_config.hidden_size", "expected an integer", "found [[...]]"}},
      config_case("router_softmax", text({{"moe_router_activation_func", "softmax"}}),
                  {"text_config.moe_router_activation_func", "\"softmax\"", na, "\"sigmoid\""}),
      config_case("renormalize_false", text({{"moe_renormalize", false}}),
                  {"text_config.moe_renormalize", "value false", na, "accepted: true"}),
      config_case("scaling_without_latent_norm",
                  text({{"latent_moe_use_norm", false}, {"routed_scaling_factor", 2.5}}),
                  {"text_config.routed_scaling_factor", "2.5", na, "latent_moe_use_norm"}),
      config_case("two_expert_groups", text({{"num_expert_group", 2}}),
                  {"text_config.num_expert_group", "value 2", na, "accepted: 1"}),
      config_case("topk_group_2", text({{"topk_group", 2}}), {"text_config.topk_group", "value 2", na}),
      config_case("topk_method_other", text({{"topk_method", "greedy"}}),
                  {"text_config.topk_method", "\"greedy\"", na, "\"noaux_tc\""}),
      config_case("mla_rope", text({{"mla_use_nope", false}}), {"text_config.mla_use_nope", "false", na}),
      config_case("mla_no_output_gate", text({{"mla_use_output_gate", false}}),
                  {"text_config.mla_use_output_gate", "false", na}),
      config_case("low_rank_kda_gate", linear({{"use_full_rank_gate", false}}),
                  {"text_config.linear_attn_config.use_full_rank_gate", "false", na}),
      config_case("hidden_act_silu", text({{"hidden_act", "silu"}}),
                  {"text_config.hidden_act", "\"silu\"", na, "\"situ\""}),
      config_case("mtp_layer", text({{"num_nextn_predict_layers", 1}}),
                  {"text_config.num_nextn_predict_layers", "value 1", na}),
      config_case("moe_layer_freq_2", text({{"moe_layer_freq", 2}}), {"text_config.moe_layer_freq", "value 2", na}),
      config_case("full_attn_overlaps_kda", linear({{"full_attn_layers", {3, 4}}}),
                  {"text_config.linear_attn_config.full_attn_layers", "[3,4]", na, "complement of kda_layers"}),
      config_case("full_attn_gap", linear({{"full_attn_layers", json::array()}}),
                  {"text_config.linear_attn_config.full_attn_layers", "layer 4 is in neither"}),
      config_case("tied_embeddings", {{"tie_word_embeddings", true}},
                  {"config.json: tie_word_embeddings", "value true", na, "accepted: false"}),
      config_case("tied_embeddings_in_text_config",
                  {{"tie_word_embeddings", nullptr}, {"text_config", {{"tie_word_embeddings", true}}}},
                  {"text_config.tie_word_embeddings", "value true", na}),
      config_case("quant_method_gptq", {{"quantization_config", {{"quant_method", "gptq"}}}},
                  {"quantization_config.quant_method", "\"gptq\"", na, "compressed-tensors"}),
      config_case("quant_format_other", group0({{"format", "nvfp4-pack-quantized"}}),
                  {"quantization_config.config_groups.group_0.format", "\"nvfp4-pack-quantized\"", na}),
      config_case("quant_num_bits_8", group0({{"weights", {{"num_bits", 8}}}}),
                  {"quantization_config.config_groups.group_0.weights.num_bits", "value 8", na, "accepted: 4"}),
      config_case("quant_group_size_16", group0({{"weights", {{"group_size", 16}}}}),
                  {"quantization_config.config_groups.group_0.weights.group_size", "value 16", na, "accepted: 32"}),
      config_case("quant_input_activations", group0({{"input_activations", {{"num_bits", 8}, {"type", "float"}}}}),
                  {"quantization_config.config_groups.group_0.input_activations", na, "weights only"}),
      config_case("quant_config_missing", {{"quantization_config", nullptr}},
                  {"quantization_config", "expected an object", "key missing"}),
      config_case("missing_gate_lower_bound", linear({{"gate_lower_bound", nullptr}}),
                  {"text_config.linear_attn_config.gate_lower_bound", "expected a number", "key missing"}),
      config_case("moe_inter_not_multiple_of_32", text({{"moe_intermediate_size", 48}}),
                  {"text_config.moe_intermediate_size", "multiple of 32", "found 48"}),
      config_case("latent_not_multiple_of_32", text({{"routed_expert_hidden_size", 40}}),
                  {"text_config.routed_expert_hidden_size", "multiple of 32", "found 40"}),
      config_case("kda_head_dim_over_512", linear({{"head_dim", 1024}}),
                  {"text_config.linear_attn_config.head_dim", "[1, 512]", "found 1024"}),
      config_case("model_type_other", {{"model_type", "deepseek_v3"}},
                  {"config.json: model_type", "\"deepseek_v3\"", na, "\"kimi_k3\""}),
      // Issue #19: values that parse as numbers but become Inf (or a wrong sign) in f32.
      config_case("situ_beta_1e300", text({{"activation_situ_beta", 1e300}}),
                  {"text_config.activation_situ_beta", "finite in f32", "1e+300"}),
      config_case("situ_linear_beta_zero", text({{"activation_situ_linear_beta", 0}}),
                  {"text_config.activation_situ_linear_beta", "positive number"}),
      config_case("rms_norm_eps_1e300", text({{"rms_norm_eps", 1e300}}),
                  {"text_config.rms_norm_eps", "at most 1", "1e+300"}),
      config_case("rms_norm_eps_underflows", text({{"rms_norm_eps", 1e-60}}),
                  {"text_config.rms_norm_eps", "positive number"}),
      config_case("gate_lower_bound_minus_1e300", linear({{"gate_lower_bound", -1e300}}),
                  {"text_config.linear_attn_config.gate_lower_bound", "finite in f32", "-1e+300"}),
      config_case("eos_beyond_vocab", {{"eos_token_id", 5000}},
                  {"config.json: eos_token_id", "[0, 4351]", "vocab_size 4352", "found 5000"}),
      config_case("eos_list_beyond_vocab", {{"eos_token_id", {4098, 4352}}},
                  {"config.json: eos_token_id", "[0, 4351]", "found [4098,4352]"}),
      config_case("bos_beyond_vocab", {{"bos_token_id", 4352}},
                  {"config.json: bos_token_id", "[0, 4351]", "found 4352"}),
      config_case("aliases_disagree", text({{"num_local_experts", 8}}),
                  {"text_config.num_experts = 16", "text_config.num_local_experts = 8", "different values"}),
      {"more_layers_than_config",
       [](const std::string& dir) {  // a fifth layer's norm in the index
         const std::string extra = kPfx + "model.layers.4.input_layernorm.weight";
         const std::string from = kPfx + "model.layers.3.input_layernorm.weight";
         edit_json(index_path(dir), [&](json& j) { j["weight_map"][extra] = shard_of(dir, from); });
         return Words{};
       },
       {"model.safetensors.index.json", "model.layers.4.input_layernorm.weight", "layer 4",
        "num_hidden_layers 4"}},
  };
}

// docs/model.md#tensors: a tensor the table needs that is absent, has another shape or a dtype the engine
// cannot read is refused naming the shard (or index), the tensor, what was found and expected.
std::vector<BadCase> tensor_cases() {
  auto remove_tensor = [](const std::string& t) {
    return [t](const std::string& dir) {
      ShardFile s = shard_holding(dir, t);
      s.header.erase(t);
      s.save();
      edit_json(index_path(dir), [&](json& j) { j["weight_map"].erase(t); });
      return Words{};
    };
  };
  return {
      {"missing_dense_tensor", remove_tensor(kQ), {"model.safetensors.index.json", "missing tensor '" + kQ + "'"}},
      {"missing_expert_tensor", remove_tensor(kScale),
       {"model.safetensors.index.json", "missing tensor '" + kScale + "'"}},
      header_case("tensor_in_index_not_in_header", kQ, [](ShardFile& s) { s.header.erase(kQ); },
                  {"model.safetensors.index.json says tensor '" + kQ + "' is in", "header has no such tensor"}),
      header_case("wrong_shape_dense", kQ, [](ShardFile& s) { s.header[kQ]["shape"] = {64, 256}; },
                  {"tensor '" + kQ + "'", "shape [64, 256], expected [128, 128]"}),
      header_case("wrong_shape_expert", kPacked, [](ShardFile& s) { s.header[kPacked]["shape"] = {32, 64}; },
                  {"tensor '" + kPacked + "'", "shape [32, 64], expected [64, 32]"}),
      header_case("bf16_weight_as_i32", kQ, [](ShardFile& s) { s.retype(kQ, "I32", 4); },
                  {"tensor '" + kQ + "'", "dtype I32, expected BF16, F16 or F32"}),
      header_case("f32_vector_as_i32", kDt, [](ShardFile& s) { s.header[kDt]["dtype"] = "I32"; },
                  {"tensor '" + kDt + "'", "dtype I32, expected BF16, F16 or F32"}),
      header_case("expert_packed_as_f32", kPacked, [](ShardFile& s) { s.retype(kPacked, "F32", 4); },
                  {"tensor '" + kPacked + "'", "dtype F32, expected U8 (MXFP4 e2m1 pairs)"}),
      header_case("expert_scale_as_i8", kScale, [](ShardFile& s) { s.header[kScale]["dtype"] = "I8"; },
                  {"tensor '" + kScale + "'", "dtype I8, expected U8 (MXFP4 ue8m0 scales)"}),
      // Issue #19: non-finite weights are refused at load (one scan over the upcast floats).
      nonfinite_case("bf16_nan_in_layer0_norm", kNorm0, 5, {0xc0, 0x7f},
                     {"tensor '" + kNorm0 + "'", "element 5 (row 0, column 5) is nan", "finite"}),
      nonfinite_case("embedding_all_inf", kEmbed, -1, {0x80, 0x7f},
                     {"tensor '" + kEmbed + "'", "element 0 (row 0, column 0) is inf", "finite"}),
      nonfinite_case("f32_neg_inf_in_dt_bias", kDt, 9, {0x00, 0x00, 0x80, 0xff},
                     {"tensor '" + kDt + "'", "element 9", "is -inf"}),
  };
}

/// Moves the second tensor (by offset) of kQ's shard 2 bytes back so it overlaps the first.
BadCase overlap_case() {
  return {"overlapping_offsets",
          [](const std::string& dir) {
            ShardFile s = shard_holding(dir, kQ);
            const std::vector<std::string> names = s.by_offset();
            const std::string &a = names[0], &b = names[1];
            s.header[b]["data_offsets"] = {s.begin(b) - 2, s.end(b) - 2};
            s.save();
            return Words{shard_of(dir, kQ), "tensors '" + a + "' and '" + b + "' overlap"};
          },
          {"in the data section"}};
}

// Safetensors format: truncation, a bad length prefix, a non-JSON header, offsets outside the
// data section / reversed / overlapping, byte count != shape x dtype size, unknown dtypes and
// malformed entries are refused while the shard is opened, naming the shard (and tensor).
std::vector<BadCase> shard_cases() {
  auto set_prefix = [](std::string& b, uint64_t n) { std::memcpy(b.data(), &n, 8); };
  auto header_len = [](const std::string& b) {
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    return n;
  };
  return {
      bytes_case("truncated_shard", [](std::string& b) { b.resize(b.size() - 1000); },
                 {"data_offsets", "run past the end of the data section", "truncated"}),
      bytes_case("shard_under_8_bytes", [](std::string& b) { b.resize(5); }, {"5 bytes, too short"}),
      bytes_case("cut_inside_header", [=](std::string& b) { b.resize(8 + header_len(b) / 2); },
                 {"header length", "exceeds the file size"}),
      bytes_case("header_length_past_file", [=](std::string& b) { set_prefix(b, b.size()); },
                 {"header length", "exceeds the file size"}),
      bytes_case("header_length_huge", [=](std::string& b) { set_prefix(b, ~uint64_t(0)); },
                 {"header length 18446744073709551615 exceeds the file size"}),
      bytes_case("header_not_json",
                 [=](std::string& b) { b.replace(8, 16, "this isn't JSON!"); },
                 {"safetensors header is not a JSON object"}),
      bytes_case("header_json_array",
                 [=](std::string& b) {
                   const uint64_t n = header_len(b);
                   b.replace(8, n, "[1, 2, 3]" + std::string(n - 9, ' '));
                 },
                 {"safetensors header is not a JSON object"}),
      header_case("offsets_past_data", kQ,
                  [](ShardFile& s) {
                    const uint64_t n = s.data.size();
                    s.header[kQ]["data_offsets"] = {n, n + 32768};
                  },
                  {"tensor '" + kQ + "'", "run past the end of the data section"}),
      header_case("offsets_reversed", kQ,
                  [](ShardFile& s) { s.header[kQ]["data_offsets"] = {s.end(kQ), s.begin(kQ)}; },
                  {"tensor '" + kQ + "'", "are reversed"}),
      header_case("offsets_negative", kQ, [](ShardFile& s) { s.header[kQ]["data_offsets"] = {-2, 32766}; },
                  {"tensor '" + kQ + "'", "'data_offsets' must be two non-negative integers"}),
      header_case("offsets_missing", kQ, [](ShardFile& s) { s.header[kQ].erase("data_offsets"); },
                  {"tensor '" + kQ + "'", "'data_offsets' must be two non-negative integers"}),
      overlap_case(),
      header_case("size_not_shape_times_dtype", kQ, [](ShardFile& s) { s.header[kQ]["shape"] = {128, 127}; },
                  {"tensor '" + kQ + "'", "32768 bytes for shape [128, 127] x BF16, expected 32512"}),
      header_case("unknown_dtype", kQ, [](ShardFile& s) { s.header[kQ]["dtype"] = "F8_E4M3"; },
                  {"tensor '" + kQ + "'", "unknown dtype \"F8_E4M3\""}),
      header_case("negative_shape", kQ, [](ShardFile& s) { s.header[kQ]["shape"] = {-128, -128}; },
                  {"tensor '" + kQ + "'", "shape entries must be non-negative integers"}),
      header_case("entry_not_object", kQ, [](ShardFile& s) { s.header[kQ] = "BF16"; },
                  {"tensor '" + kQ + "'", "expected an object {dtype, shape, data_offsets}"}),
  };
}

// The index: a shard it names that does not exist, a path instead of a file name, or an index
// (or config.json) that is missing or not JSON, is refused naming the index (or config) file.
std::vector<BadCase> index_cases() {
  auto point_q_to = [](const std::string& file) {
    return [file](const std::string& dir) {
      edit_json(index_path(dir), [&](json& j) { j["weight_map"][kQ] = file; });
      return Words{};
    };
  };
  return {
      {"shard_file_deleted",
       [](const std::string& dir) {
         fs::remove(dir + "/" + shard_of(dir, kQ));
         return Words{"names shard '" + shard_of(dir, kQ) + "'"};
       },
       {"model.safetensors.index.json", "which does not exist"}},
      {"index_names_unknown_shard", point_q_to("model-00077-of-000099.safetensors"),
       {"model.safetensors.index.json names shard 'model-00077-of-000099.safetensors'", "which does not exist"}},
      {"index_names_path", point_q_to("../model-00001-of-000099.safetensors"),
       {"model.safetensors.index.json", "weight_map['" + kQ + "']", "is not a plain file name"}},
      {"index_names_dot", point_q_to("."),
       {"model.safetensors.index.json", "weight_map['" + kQ + "'] = '.'", "is not a plain file name"}},
      {"index_not_json",
       [](const std::string& dir) {
         write_bytes(index_path(dir), "{\"weight_map\": {");
         return Words{};
       },
       {"model.safetensors.index.json: not a valid JSON object"}},
      {"index_without_weight_map",
       [](const std::string& dir) {
         write_bytes(index_path(dir), "{\"metadata\": {}}");
         return Words{};
       },
       {"model.safetensors.index.json: missing object 'weight_map'"}},
      {"config_missing",
       [](const std::string& dir) {
         fs::remove(dir + "/config.json");
         return Words{};
       },
       {"config.json: cannot open"}},
      {"config_not_json",
       [](const std::string& dir) {
         write_bytes(dir + "/config.json", "{\"model_type\": \"kimi_k3\",");
         return Words{};
       },
       {"config.json: not valid JSON"}},
  };
}

// ---------------------------------------------------------------- the table-driven tests

class BadInputCheckpoint : public ::testing::TestWithParam<BadCase> {};

// Library and CLI both refuse the broken checkpoint with every expected word in the message.
TEST_P(BadInputCheckpoint, RefusedWithClearError) {
  const BadCase& bc = GetParam();
  CaseDir d(bc.name);
  Words want = bc.want;
  for (std::string& w : bc.breaks(d.path())) want.push_back(std::move(w));
  const std::string msg = error_of([&] { load_model(d.path()); });
  expect_words(msg, want);
  expect_right_shard(d.path(), msg);
  expect_cli_error(d.path(), want);
  if (bc.inspect) {  // the validator reads headers only and must find the same fault
    std::string out;
    const int rc = test::run_wren("inspect --model " + d.path(), &out);
    EXPECT_GT(rc, 0) << "wren inspect exit " << rc << ":\n" << out;
    expect_words(out, want);
  }
}

std::string case_name(const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(BadInputConfig, BadInputCheckpoint, ::testing::ValuesIn(config_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BadInputTensor, BadInputCheckpoint, ::testing::ValuesIn(tensor_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BadInputShard, BadInputCheckpoint, ::testing::ValuesIn(shard_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BadInputIndex, BadInputCheckpoint, ::testing::ValuesIn(index_cases()), case_name);

// ---------------------------------------------------------------- MXFP4 scale byte 255

/// Sets ue8m0 scale byte (row, group) of `part` ("w1"/"w2"/"w3") to 255 in every expert of `layer`.
void poison_scales(const std::string& dir, const Config& c, int layer, const std::string& part, int row,
                   int group, uint8_t byte = 255) {
  const int cols = part == "w2" ? c.moe_inter : c.latent;
  for (int e = 0; e < c.n_experts; ++e) {
    const std::string name = kPfx + expert_name(layer, e) + "." + part + ".weight_scale";
    ShardFile s = shard_holding(dir, name);
    s.data.at(s.begin(name) + size_t(row) * (cols / mxfp4::kGroup) + group) = char(byte);
    s.save();
  }
}

/// Loads `dir` (which must succeed: scales are checked when an expert is first read), runs the
/// prompt, and expects the library and the CLI to refuse the poisoned expert with `want`.
void expect_scale_error(const std::string& dir, const Words& want) {
  std::unique_ptr<Model> m;
  ASSERT_NO_THROW(m = load_model(dir));
  const std::string msg = error_of([&] {
    CpuBackend be;
    Forward fwd(*m, be);
    SequenceState st(be, m->config, 64);
    GenerateOptions o;
    o.max_new_tokens = 2;
    generate_greedy(fwd, st, {4096, 976}, o);
  });
  expect_words(msg, want);
  expect_right_shard(dir, msg);
  expect_cli_error(dir, want);
}

/// Moves `names` out of their shards into a new shard `file` and points the index there.
void move_to_new_shard(const std::string& dir, const std::vector<std::string>& names, const std::string& file) {
  ShardFile dst(dir + "/" + file, json::object());
  for (const std::string& n : names) {
    ShardFile src = shard_holding(dir, n);
    const uint64_t b = dst.data.size();
    dst.data += src.data.substr(src.begin(n), src.end(n) - src.begin(n));
    dst.header[n] = src.header[n];
    dst.header[n]["data_offsets"] = {b, dst.data.size()};
    src.header.erase(n);
    src.save();
  }
  dst.save();
  edit_json(index_path(dir), [&](json& j) {
    for (const std::string& n : names) j["weight_map"][n] = file;
  });
}

const Words kScaleWant = {"tensor '" + kPfx + "model.layers.2.block_sparse_moe.experts.", ".w3.weight_scale'",
                          "row 7, group 1", "scale byte 255"};

// docs/model.md#decisions, item 4: a 255 scale in an expert the router selects is refused when the expert is first
// read, naming the shard, the tensor (as stored, with its prefix), the row and the group. Every
// expert of layer 2 carries it, so the run must route to one.
TEST(BadInputScale, ByteFfInSelectedExpertNamesTensorRowGroup) {
  CaseDir d("scale255");
  poison_scales(d.path(), load_config(d.path()), 2, "w3", 7, 1);
  expect_scale_error(d.path(), kScaleWant);
}

// The same with each poisoned w3.weight_scale moved to a shard of its own (legal: the index maps
// every tensor): the error must not blame the shard of the expert's other tensors.
TEST(BadInputScale, ByteFfInSplitExpertNamesNoWrongShard) {
  CaseDir d("scale255-split");
  const Config c = load_config(d.path());
  poison_scales(d.path(), c, 2, "w3", 7, 1);
  std::vector<std::string> names;
  for (int e = 0; e < c.n_experts; ++e) names.push_back(kPfx + expert_name(2, e) + ".w3.weight_scale");
  move_to_new_shard(d.path(), names, "model-00099-of-000099.safetensors");
  expect_scale_error(d.path(), kScaleWant);
}

// Issue #19: byte 254 (2^127) is a valid ue8m0 code, but times the e2m1 values 2..6 it overflows
// f32 to Inf; bytes 253 and 254 are refused like 255, when the expert is first read.
TEST(BadInputScale, Byte254OverflowsAndIsRefused) {
  CaseDir d("scale254");
  poison_scales(d.path(), load_config(d.path()), 2, "w1", 3, 0, 254);
  expect_scale_error(d.path(), {"tensor '" + kPfx + "model.layers.2.block_sparse_moe.experts.", ".w1.weight_scale'",
                                "row 3, group 0", "scale byte 254", "overflows f32"});
}

// ---------------------------------------------------------------- non-finite values at run time

/// The base checkpoint, loaded once.
const Model& base_model() {
  static const std::unique_ptr<Model> m = load_model(base_checkpoint());
  return *m;
}

// Issue #19: NaN in --x0 rows is refused naming row and column (it would only give NaN logits).
TEST(BadInputNonFinite, X0WithNanNamesRowAndColumn) {
  const Model& m = base_model();
  CpuBackend be;
  Forward fwd(m, be);
  SequenceState st(be, m.config, 16);
  const int D = m.config.hidden, ids[2] = {4096, 976};
  std::vector<float> x0(2 * D);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (float& v : x0) v = nd(rng);
  std::vector<float> logits(m.config.vocab);
  EXPECT_NO_THROW(fwd.run(st, ids, x0.data(), 2, logits.data(), false));
  x0[D + 7] = std::nanf("");
  SequenceState st2(be, m.config, 16);
  expect_words(error_of([&] { fwd.run(st2, ids, x0.data(), 2, logits.data(), false); }),
               {"x0", "row 1, column 7", "NaN", "finite"});
}

/// Runs 3 prompt tokens then 2 decode steps with a NaN planted into the output of the `nth`
/// (0-based) call of op `op`; returns the error.
std::string planted_nan_error(const char* op, int nth, bool check_finite) {
  const Model& m = base_model();
  CpuBackend inner;
  test::WrappedBackend be(inner);
  int calls = 0;
  be.after = [&](const char* name, float* out, size_t n) {
    if (std::strcmp(name, op) == 0 && calls++ == nth && n > 3) out[3] = std::nanf("");
  };
  ForwardOptions o;
  o.check_finite = check_finite;
  Forward fwd(m, be, o);
  SequenceState st(be, m.config, 16);
  GenerateOptions g;
  g.max_new_tokens = 3;
  return error_of([&] { generate_greedy(fwd, st, {4096, 976, 2328}, g); });
}

// The logits are checked every step in every mode: a NaN that appears anywhere is an error, never
// a token (NaN logits made greedy pick id 0 and print "!!"). Strict mode names the layer.
TEST(BadInputNonFinite, NanInsideTheForwardIsCaughtAtTheLogits) {
  // kda_core runs once per KDA layer per chunk: the prompt chunk covers layers 0-2 (calls 0-2),
  // the first decode step calls 3-5. Call 4 = layer 1 at the first decode step (position 3).
  expect_words(planted_nan_error("kda_core", 4, false),
               {"NaN in the logits at token position 3", "run again with --check-finite"});
  expect_words(planted_nan_error("kda_core", 4, true), {"NaN in the layer 1 KDA output", "token position 3",
                                                         "found by --check-finite"});
  expect_words(planted_nan_error("kda_core", 1, true), {"layer 1 KDA output", "token position 0"});
  // An FFN: expert_ffn / situ_glu outputs feed the MoE; the dense MLP is layer 0.
  expect_words(planted_nan_error("situ_glu", 0, true), {"NaN in the layer 0 dense MLP output"});
}

// The control: a clean run raises no false alarm in either mode.
TEST(BadInputNonFinite, CleanRunPassesBothModes) {
  for (bool strict : {false, true}) {
    const Model& m = base_model();
    CpuBackend be;
    ForwardOptions o;
    o.check_finite = strict;
    Forward fwd(m, be, o);
    SequenceState st(be, m.config, 16);
    GenerateOptions g;
    g.max_new_tokens = 4;
    EXPECT_NO_THROW(generate_greedy(fwd, st, {4096, 976, 2328}, g)) << "strict " << strict;
  }
}

// ---------------------------------------------------------------- engine options vs the config

/// `wren run` with `args` on `dir` fails with every word of `want` (and no crash).
void expect_run_error(const std::string& dir, const std::string& args, const Words& want) {
  std::string out;
  const int rc = test::run_wren("run --model " + dir + " " + args, &out);
  EXPECT_GT(rc, 0) << args << ": exit " << rc << ":\n" << out;
  EXPECT_NE(out.find("wren: error: "), std::string::npos) << out;
  EXPECT_EQ(out.find("bad_alloc"), std::string::npos) << out;
  EXPECT_EQ(out.find("runtime error"), std::string::npos) << out;
  expect_words(out, want);
}

TEST(BadInputOptions, LayersCtxChunkAndCacheBeyondWhatExists) {
  const std::string& dir = base_checkpoint();
  const std::string ids = "--ids 4096,976 -n 1 ";
  expect_run_error(dir, ids + "--layers 5", {"--layers 5", "only 4 layers", "num_hidden_layers"});
  expect_run_error(dir, ids + "--ctx 2000000", {"--ctx 2000000", "1048576 positions", "max_position_embeddings"});
  expect_run_error(dir, ids + "--chunk 2147483647", {"--chunk 2147483647", "need", "GB of memory", "GB activation workspace", "is available"});
  expect_run_error(dir, ids + "--expert-cache 1e30", {"--expert-cache", "'1e30'", "beyond 2^64"});
  std::string out;
  EXPECT_EQ(test::run_wren("run --model " + dir + " " + ids + "--layers 4", &out), 0) << out;
}

// --model naming a file (a shard, the config) says that a model is a folder, in the library and
// the CLI (it said "FILE/config.json: cannot open").
TEST(BadInputOptions, ModelPathThatIsAFileSaysAModelIsAFolder) {
  const std::string file = base_checkpoint() + "/config.json";
  const std::string msg = error_of([&] { load_model(file); });
  expect_words(msg, {file, "is a file; a model is a folder"});
  expect_run_error(file, "--ids 4096 -n 1", {"is a file; a model is a folder"});
}

TEST(BadInputOptions, CtxBeyondMaxPositionEmbeddings) {
  CaseDir d("maxpos");
  edit_json(d.path() + "/config.json", [](json& j) { j["text_config"]["max_position_embeddings"] = 256; });
  expect_run_error(d.path(), "--ids 4096,976 -n 1 --ctx 512",
                   {"--ctx 512", "256 positions", "max_position_embeddings"});
  std::string out;
  EXPECT_EQ(test::run_wren("run --model " + d.path() + " --ids 4096,976 -n 1 --ctx 256", &out), 0) << out;
}

/// A private copy of the golden checkpoint (its files, not its reference outputs).
class GoldenCopy {
 public:
  explicit GoldenCopy(const std::string& tag) : dir_(test::temp_dir("golden-" + tag)) {
    for (const auto& e : fs::directory_iterator(test::golden_dir()))
      if (e.is_regular_file()) fs::copy_file(e.path(), dir_ + "/" + e.path().filename().string());
  }
  ~GoldenCopy() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

// Issue #19: a number nlohmann cannot hold (1e400) in tokenizer_config.json names the file.
TEST(BadInputTokenizer, NumberOverflowInTokenizerConfigNamesTheFile) {
  GoldenCopy g("tokcfg");
  std::string cfg = read_bytes(g.path() + "/tokenizer_config.json");
  cfg.insert(cfg.find('{') + 1, "\"model_max_length\": 1e400, ");
  write_bytes(g.path() + "/tokenizer_config.json", cfg);
  expect_run_error(g.path(), "hello -n 1", {"tokenizer_config.json", "not valid JSON", "number overflow"});
}

// A special token id the model has no embedding row for is refused naming both files.
TEST(BadInputTokenizer, SpecialIdBeyondTheVocabulary) {
  GoldenCopy g("special");
  edit_json(g.path() + "/tokenizer_config.json", [](json& j) {
    j["added_tokens_decoder"]["4352"] = {{"content", "<|extra|>"}, {"special", true}};
  });
  expect_run_error(g.path(), "hello -n 1", {"tokenizer_config.json", "'<|extra|>'", "id 4352", "vocab_size 4352"});
}

// One rule for `wren run` and the server: an empty text is a valid prompt ([BOS] alone; in chat
// mode an empty user message); no prompt at all is refused before the model loads.
TEST(BadInputOptions, EmptyPromptIsValidNoPromptIsNot) {
  std::string out;
  EXPECT_EQ(test::run_wren("run --model " + test::golden_dir() + " '' -n 2 --json", &out), 0) << out;
  EXPECT_NE(out.find("\"prompt_ids\":[4096]"), std::string::npos) << out;
  EXPECT_EQ(test::run_wren("run --model " + test::golden_dir() + " '' --chat -n 2", &out), 0) << out;
  EXPECT_GT(test::run_wren("run --model /nonexistent -n 2", &out), 0);
  EXPECT_NE(out.find("give either a text prompt or --ids"), std::string::npos) << out;  // before loading
}

// ---------------------------------------------------------------- header fuzzing

/// Random and mutated safetensors headers for the fuzz test.
class HeaderFuzzer {
 public:
  explicit HeaderFuzzer(const json& seed) : seed_(seed) {}

  /// A header string: a structurally mutated seed, then sometimes byte-level damage.
  std::string next() {
    json h = seed_;
    const int edits = 1 + int(rng_() % 3);
    for (int i = 0; i < edits; ++i) mutate(h);
    std::string s = h.dump();
    if (rng_() % 3 == 0) damage(s);
    return s;
  }
  uint64_t below(uint64_t n) { return rng_() % n; }

 private:
  json random_value(int depth = 0) {
    switch (rng_() % 12) {
      case 0: return nullptr;
      case 1: return int64_t(rng_());  // either sign, any magnitude
      case 2: return ~uint64_t(0) - rng_() % 4;
      case 3: return double(rng_() % 1000) / 7.0;
      case 4: return rng_() % 100000;
      case 5: return -int64_t(rng_() % 100);
      case 6: return std::string(1 + rng_() % 4, char('A' + rng_() % 26));
      case 7: return json::array({rng_() % 64, rng_() % 64});
      case 8: return json::array({uint64_t(1) << (rng_() % 64), uint64_t(1) << (rng_() % 64)});
      case 9: return depth < 3 ? json::array({random_value(depth + 1), random_value(depth + 1)}) : json(1);
      case 10: return depth < 3 ? json::object({{"dtype", random_value(depth + 1)}}) : json(true);
      default: return json::array();
    }
  }

  /// Element i of e[field], turning the field into a list first if it is not one.
  static json& element(json& e, const char* field, size_t i) {
    if (!e[field].is_array()) e[field] = json::array();
    return e[field][i];
  }

  /// Changes, removes or adds one field of one entry, or adds/removes an entry.
  void mutate(json& h) {
    std::vector<std::string> names;
    for (const auto& [k, _] : h.items()) names.push_back(k);
    if (names.empty() || rng_() % 10 == 0) {
      h["t" + std::to_string(rng_() % 8)] = random_value();
      return;
    }
    json& e = h[names[rng_() % names.size()]];
    if (!e.is_object() || rng_() % 12 == 0) {
      e = random_value();
      return;
    }
    static const char* kFields[] = {"dtype", "shape", "data_offsets"};
    const std::string f = kFields[rng_() % 3];
    static const char* kDtypes[] = {"F32", "F16", "BF16", "U8", "I8", "I32", "I64", "F64", "F8_E4M3", "bf16", ""};
    switch (rng_() % 6) {
      case 0: e.erase(f); break;
      case 1: e["dtype"] = kDtypes[rng_() % 11]; break;
      case 2: element(e, "shape", rng_() % 3) = random_value(); break;
      case 3: element(e, "data_offsets", rng_() % 2) = rng_() % 2 ? json(rng_() % 70000) : random_value(); break;
      default: e[f] = random_value(); break;
    }
  }

  /// Byte-level damage: overwrite, insert, delete or truncate.
  void damage(std::string& s) {
    static const char kJsonish[] = "{}[]\",:-.0123456789eE \\ufnt";
    const size_t at = s.empty() ? 0 : rng_() % s.size();
    const char ch = rng_() % 2 ? kJsonish[rng_() % (sizeof kJsonish - 1)] : char(rng_());
    switch (rng_() % 4) {
      case 0: if (!s.empty()) s[at] = ch; break;
      case 1: s.insert(at, 1, ch); break;
      case 2: if (!s.empty()) s.erase(at, 1 + rng_() % 8); break;
      default: s.resize(at); break;
    }
  }

  json seed_;
  std::mt19937_64 rng_{20240521};
};

/// A small valid header: U8 [4, 2], BF16 [3], F32 [2, 2] back to back (30 data bytes).
json fuzz_seed() {
  return json::parse(R"({"__metadata__": {"format": "pt"},
    "a": {"dtype": "U8", "shape": [4, 2], "data_offsets": [0, 8]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [8, 14]},
    "c": {"dtype": "F32", "shape": [2, 2], "data_offsets": [14, 30]}})");
}

/// A successful parse must describe tensors that lie inside the data section with exact sizes.
void expect_sane(const std::map<std::string, TensorInfo>& ts, uint64_t start, uint64_t size) {
  for (const auto& [name, t] : ts) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= uint64_t(d);
    EXPECT_EQ(t.nbytes, n) << name;
    EXPECT_GE(t.offset, start) << name;
    EXPECT_LE(t.offset + t.nbytes, start + size) << name;
  }
}

// parse_safetensors_header on thousands of random/mutated headers either succeeds with sane
// entries or throws a wren::Error naming the source; nothing else (run under ASan/UBSan too).
TEST(BadInputFuzz, HeaderParserThrowsOrSucceeds) {
  HeaderFuzzer fz(fuzz_seed());
  int ok = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::string h = fz.next();
    const uint64_t size = fz.below(4) == 0 ? fz.below(100000) : 30;
    try {
      expect_sane(parse_safetensors_header(h, 8 + h.size(), size, "fuzz.safetensors"), 8 + h.size(), size);
      ++ok;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("fuzz.safetensors"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "non-wren exception " << e.what() << " for header: " << h;
    }
  }
  std::printf("[ fuzz ] %d of 4000 mutated headers accepted\n", ok);
}

// Pathological values a fuzzer rarely builds: deep nesting, huge numbers, odd keys.
TEST(BadInputFuzz, PathologicalHeadersThrow) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<std::string> headers = {
      "", "{", "null", "{}x", "\"str\"", deep,
      R"({"a": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 4]}})",
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": )" + deep + "}}",
      R"({"a": {"dtype": "U8", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 0]}})",
      R"({"a": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 0]}})",
      R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [18446744073709551615, 18446744073709551615]}})",
      R"({"a": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}})",
      R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})",
      R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1.0]}})",
      R"({"a": {"dtype": 7, "shape": [1], "data_offsets": [0, 1]}})",
      R"({"\u0000": {"dtype": "U8", "shape": [2], "data_offsets": [0, 1]}})",
  };
  for (const std::string& h : headers) {
    const std::string shown = h.substr(0, 120);
    try {
      parse_safetensors_header(h, 8 + h.size(), 30, "fuzz.safetensors");
      ADD_FAILURE() << "accepted: " << shown;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fuzz.safetensors"), std::string::npos) << e.what();
      EXPECT_LT(std::strlen(e.what()), 2000u) << "unreadably long message for: " << shown;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-wren exception " << e.what() << " for: " << shown;
    }
  }
}

// SafetensorsFile on files with mutated headers, wrong length prefixes and random data lengths:
// it opens with sane entries or throws a wren::Error naming the path.
TEST(BadInputFuzz, SafetensorsFileThrowsOrOpens) {
  HeaderFuzzer fz(fuzz_seed());
  const std::string dir = test::temp_dir("bad-input-fuzz"), path = dir + "/f.safetensors";
  for (int i = 0; i < 400; ++i) {
    const std::string h = fz.next();
    uint64_t n = h.size();
    if (fz.below(8) == 0) n = fz.below(4) == 0 ? ~uint64_t(0) - fz.below(16) : n + fz.below(64) - 32;
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    bytes += h + std::string(fz.below(4) == 0 ? fz.below(64) : 30, '\x5a');
    if (fz.below(16) == 0) bytes.resize(fz.below(12));
    write_bytes(path, bytes);
    try {
      SafetensorsFile f(path);
      expect_sane(f.tensors(), 0, f.size());
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "non-wren exception " << e.what() << " for header: " << h;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wren
