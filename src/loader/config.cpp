// Kimi K3 config.json, parsed and validated once (spec kimi-k3.md §1, §2, §10).
#include "loader/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/mxfp4.h"
#include "loader/json_brief.h"

namespace wren {

using nlohmann::json;

namespace {

/// Typed, path-aware access to one JSON object of config.json; every error names file and key.
class Reader {
 public:
  Reader(const json& obj, std::string source, std::string path)
      : obj_(obj), source_(std::move(source)), path_(std::move(path)) {}

  bool has(const std::string& key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  std::string where(const std::string& key) const { return source_ + ": " + path_ + key; }

  [[noreturn]] void fail(const std::string& key, const std::string& expected) const {
    const std::string found = has(key) ? json_brief(obj_[key]) : std::string("nothing (key missing)");
    throw Error(where(key) + ": expected " + expected + ", found " + found);
  }

  const json& need(const std::string& key, const std::string& expected) const {
    if (!has(key)) fail(key, expected);
    return obj_[key];
  }

  int64_t integer(const std::string& key, int64_t lo = 1, int64_t hi = INT32_MAX) const {
    const std::string exp = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    const json& v = need(key, exp);
    if (!v.is_number_integer()) fail(key, exp);
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(key, exp);
    return x;
  }
  int64_t integer_or(const std::string& key, int64_t dflt, int64_t lo = 0,
                     int64_t hi = INT32_MAX) const {
    return has(key) ? integer(key, lo, hi) : dflt;
  }

  double number(const std::string& key) const {
    const json& v = need(key, "a number");
    if (!v.is_number()) fail(key, "a number");
    return v.get<double>();
  }
  double number_or(const std::string& key, double dflt) const {
    return has(key) ? number(key) : dflt;
  }

  bool boolean(const std::string& key) const {
    const json& v = need(key, "true or false");
    if (!v.is_boolean()) fail(key, "true or false");
    return v.get<bool>();
  }
  bool boolean_or(const std::string& key, bool dflt) const {
    return has(key) ? boolean(key) : dflt;
  }

  std::string string(const std::string& key) const {
    const json& v = need(key, "a string");
    if (!v.is_string()) fail(key, "a string");
    return v.get<std::string>();
  }

  std::vector<int> int_list(const std::string& key) const {
    const json& v = need(key, "a list of integers");
    if (!v.is_array()) fail(key, "a list of integers");
    std::vector<int> out;
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail(key, "a list of integers");
      out.push_back(e.get<int>());
    }
    return out;
  }

  Reader child(const std::string& key) const {
    const json& v = need(key, "an object");
    if (!v.is_object()) fail(key, "an object");
    return Reader(v, source_, path_ + key + ".");
  }

  /// Rejects a flag value the engine does not implement (spec §10): names key, value, accepted.
  [[noreturn]] void unsupported(const std::string& key, const std::string& accepted) const {
    throw Error(where(key) + ": value " + json_brief(obj_[key]) + " is not supported by Wren (accepted: " +
                accepted + ")");
  }

 private:
  const json& obj_;
  std::string source_, path_;
};

void check_flags(const Reader& t, const Reader& root, Config& c) {
  if (t.string("moe_router_activation_func") != "sigmoid")
    t.unsupported("moe_router_activation_func", "\"sigmoid\"");
  if (!t.boolean("moe_renormalize")) t.unsupported("moe_renormalize", "true");
  c.latent_norm = t.boolean("latent_moe_use_norm");
  const double scaling = t.number_or("routed_scaling_factor", 1.0);
  if (!c.latent_norm && scaling != 1.0)
    t.unsupported("routed_scaling_factor",
                  "1.0, or any value while latent_moe_use_norm is true (the latent RMSNorm "
                  "cancels it)");
  t.boolean_or("use_grouped_topk", false);
  if (t.integer_or("num_expert_group", 1, 0) != 1)
    t.unsupported("num_expert_group", "1 (grouped top-k with several groups is not implemented)");
  if (t.integer_or("topk_group", 1, 0) != 1) t.unsupported("topk_group", "1");
  if (t.has("topk_method") && t.string("topk_method") != "noaux_tc")
    t.unsupported("topk_method", "\"noaux_tc\" or absent");
  if (!t.boolean("mla_use_nope")) t.unsupported("mla_use_nope", "true (RoPE is not implemented)");
  if (!t.boolean("mla_use_output_gate")) t.unsupported("mla_use_output_gate", "true");
  if (t.string("hidden_act") != "situ") t.unsupported("hidden_act", "\"situ\"");
  if (t.integer_or("num_nextn_predict_layers", 0, 0) != 0)
    t.unsupported("num_nextn_predict_layers", "0 (no MTP head)");
  if (t.integer_or("moe_layer_freq", 1, 0) != 1) t.unsupported("moe_layer_freq", "1");
  // tie_word_embeddings: root first (where the published file has it), then text_config.
  const Reader& tw = root.has("tie_word_embeddings") ? root : t;
  if (tw.boolean("tie_word_embeddings")) tw.unsupported("tie_word_embeddings", "false");
}

void check_quantization(const Reader& root, const Reader& t) {
  // Root first (where the published file has it); when absent everywhere, the error names the root.
  const Reader& where = !root.has("quantization_config") && t.has("quantization_config") ? t : root;
  const Reader q = where.child("quantization_config");
  const std::string accepted = "compressed-tensors mxfp4-pack-quantized, 4 bits, group 32, weights only";
  if (q.string("quant_method") != "compressed-tensors") q.unsupported("quant_method", accepted);
  if (q.has("format") && q.string("format") != "mxfp4-pack-quantized")
    q.unsupported("format", accepted);
  const Reader groups = q.child("config_groups");
  const json& gobj = q.need("config_groups", "an object");
  if (gobj.empty()) q.fail("config_groups", "at least one group");
  for (const auto& [name, _] : gobj.items()) {
    const Reader g = groups.child(name);
    if (g.string("format") != "mxfp4-pack-quantized") g.unsupported("format", accepted);
    const Reader w = g.child("weights");
    if (w.integer("num_bits") != 4) w.unsupported("num_bits", "4");
    if (w.integer("group_size") != mxfp4::kGroup) w.unsupported("group_size", "32");
    if (w.has("type") && w.string("type") != "float") w.unsupported("type", "\"float\"");
    if (g.has("input_activations")) g.unsupported("input_activations", "null (weights only)");
  }
}

void derive_layers(const Reader& la, Config& c) {
  const std::vector<int> kda = la.int_list("kda_layers");
  std::vector<bool> is_kda(c.n_layers, false);
  for (int v : kda) {
    if (v < 1 || v > c.n_layers || is_kda[v - 1])
      la.fail("kda_layers", "distinct 1-based layer numbers in [1, " + std::to_string(c.n_layers) + "]");
    is_kda[v - 1] = true;
  }
  if (la.has("full_attn_layers")) {
    std::vector<bool> is_full(c.n_layers, false);
    for (int v : la.int_list("full_attn_layers")) {
      if (v < 1 || v > c.n_layers || is_full[v - 1] || is_kda[v - 1])
        la.unsupported("full_attn_layers", "absent, or exactly the complement of kda_layers");
      is_full[v - 1] = true;
    }
    for (int i = 0; i < c.n_layers; ++i)
      if (!is_full[i] && !is_kda[i])
        la.unsupported("full_attn_layers", "absent, or exactly the complement of kda_layers (layer " +
                                               std::to_string(i + 1) + " is in neither)");
  }
  c.layers.clear();
  for (int i = 0; i < c.n_layers; ++i)
    c.layers.push_back({is_kda[i] ? Mixer::KDA : Mixer::MLA,
                        i < c.first_dense ? Ffn::Dense : Ffn::LatentMoE,
                        i % c.attn_res_block == 0});
}

std::vector<int> eos_list(const Reader& r, const std::string& key) {
  const json& v = r.need(key, "an integer or a list of integers");
  if (v.is_number_integer()) return {v.get<int>()};
  return r.int_list(key);
}

}  // namespace

int64_t Config::expert_bytes() const {
  // w1, w3: [moe_inter, latent]; w2: [latent, moe_inter]; packed = n/2 bytes, scales = n/32.
  const int64_t n = int64_t(moe_inter) * latent;
  return 3 * (n / 2 + n / mxfp4::kGroup);
}

int Config::count(Mixer m) const {
  return int(std::count_if(layers.begin(), layers.end(), [m](const LayerSpec& l) { return l.mixer == m; }));
}

Config parse_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) throw Error(source + ": expected a JSON object at the top level");
  const Reader root(doc, source, "");
  const std::string mt = root.string("model_type");
  if (mt != "kimi_k3") root.unsupported("model_type", "\"kimi_k3\"");
  const bool nested = root.has("text_config");
  const Reader t = nested ? root.child("text_config") : root;

  Config c;
  c.hidden = int(t.integer("hidden_size"));
  c.n_layers = int(t.integer("num_hidden_layers"));
  c.vocab = int(t.integer("vocab_size"));
  c.first_dense = int(t.integer("first_k_dense_replace", 0, c.n_layers));
  c.dense_inter = c.first_dense > 0 ? int(t.integer("intermediate_size")) : 0;
  c.rms_eps = float(t.number_or("rms_norm_eps", 1e-5));
  if (!(c.rms_eps > 0)) t.fail("rms_norm_eps", "a positive number");
  c.attn_res_block = int(t.integer("attn_res_block_size"));
  c.max_positions = t.integer_or("max_position_embeddings", int64_t(1) << 20, 1, INT64_MAX);

  c.mla_heads = int(t.integer("num_attention_heads"));
  c.q_lora = int(t.integer("q_lora_rank"));
  c.kv_lora = int(t.integer("kv_lora_rank", 1, 4096));
  c.qk_nope = int(t.integer("qk_nope_head_dim"));
  c.qk_extra = int(t.integer("qk_rope_head_dim", 0));
  c.v_head = int(t.integer("v_head_dim"));

  c.n_experts = int(t.integer("num_experts"));
  c.top_k = int(t.integer("num_experts_per_token", 1, c.n_experts));
  c.moe_inter = int(t.integer("moe_intermediate_size"));
  c.latent = int(t.integer("routed_expert_hidden_size"));
  if (c.moe_inter % mxfp4::kGroup) t.fail("moe_intermediate_size", "a multiple of 32 (MXFP4 groups)");
  if (c.latent % mxfp4::kGroup) t.fail("routed_expert_hidden_size", "a multiple of 32 (MXFP4 groups)");
  c.n_shared = int(t.integer("num_shared_experts"));
  c.situ_b1 = float(t.number("activation_situ_beta"));
  c.situ_b2 = float(t.number("activation_situ_linear_beta"));
  if (!(c.situ_b1 > 0)) t.fail("activation_situ_beta", "a positive number");
  if (!(c.situ_b2 > 0)) t.fail("activation_situ_linear_beta", "a positive number");

  const Reader la = t.child("linear_attn_config");
  c.kda_heads = int(la.integer("num_heads"));
  c.kda_head_dim = int(la.integer("head_dim", 1, 512));
  c.conv_kernel = int(la.integer("short_conv_kernel_size"));
  // Required for kimi_k3 (spec open question 17: a silent default could build the wrong gate).
  c.gate_lower_bound = float(la.number("gate_lower_bound"));
  if (!(c.gate_lower_bound < 0)) la.fail("gate_lower_bound", "a negative number");
  if (!la.boolean("use_full_rank_gate"))
    la.unsupported("use_full_rank_gate", "true (the low-rank output gate is not implemented)");
  // A_log is stored zero-padded: [128] for 96 heads x 128 dims at K3, [32] for 4 x 32 in
  // golden/k3-tiny-a. Both equal max(heads, head_dim); the spec does not state the rule.
  c.a_log_len = std::max(c.kda_heads, c.kda_head_dim);

  c.bos_id = int(root.has("bos_token_id") ? root.integer("bos_token_id", 0)
                                          : t.integer("bos_token_id", 0));
  c.eos_ids = root.has("eos_token_id") ? eos_list(root, "eos_token_id") : eos_list(t, "eos_token_id");

  check_flags(t, root, c);
  check_quantization(root, t);
  derive_layers(la, c);
  if (c.max_mix_entries() > 16)
    t.fail("attn_res_block_size", "a block size giving at most 16 AttnRes entries (ceil(L/B)+1)");
  return c;
}

Config load_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open (is --model a Kimi K3 snapshot folder?)");
  json doc = json::parse(f, nullptr, false);
  if (doc.is_discarded()) throw Error(path + ": not valid JSON");
  return parse_config(doc, path);
}

}  // namespace wren
