// Kimi K3 config.json, parsed and validated once (docs/model.md#config, #layers, #decisions).
#include "loader/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/mxfp4.h"
#include "loader/json_brief.h"

namespace wren {

using nlohmann::json;

namespace {

constexpr double kF32Max = 3.4028234663852886e38;  // FLT_MAX
constexpr int64_t kMaxLayers = 4096;                 // K3: 93 (docs/model.md#layers)
constexpr int64_t kMaxExperts = 1 << 16;             // K3: 896 per layer
constexpr int64_t kMaxExpertsTotal = int64_t(1) << 20;  // K3: 83328 in all

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

  /// A number the engine uses as f32: it must lie in [lo, hi] (both finite) and stay finite and,
  /// when `positive`, non-zero after rounding to f32 (1e300 would become Inf, 1e-50 zero).
  float f32(const std::string& key, double lo, double hi, const std::string& expected) const {
    const double v = number(key);
    const float f = float(v);
    if (!(v >= lo && v <= hi) || !std::isfinite(f) || (lo >= 0 && v > 0 && f == 0.f)) fail(key, expected);
    return f;
  }
  float f32_or(const std::string& key, float dflt, double lo, double hi, const std::string& expected) const {
    return has(key) ? f32(key, lo, hi, expected) : dflt;
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

  /// The first of `keys` present (Kimi Linear configs may use transformers' aliases), else the
  /// first. Two aliases present with different values are an error naming both.
  std::string alias(std::initializer_list<const char*> keys) const {
    const char* found = nullptr;
    for (const char* k : keys) {
      if (!has(k)) continue;
      if (!found) found = k;
      else if (obj_[k] != obj_[found])
        throw Error(where(found) + " = " + json_brief(obj_[found]) + " and " + path_ + k + " = " +
                    json_brief(obj_[k]) + " name the same setting with different values; keep one");
    }
    return found ? found : *keys.begin();
  }

  Reader child(const std::string& key) const {
    const json& v = need(key, "an object");
    if (!v.is_object()) fail(key, "an object");
    return Reader(v, source_, path_ + key + ".");
  }

  /// Rejects a flag value the engine does not implement (docs/model.md#decisions): names key, value, accepted.
  [[noreturn]] void unsupported(const std::string& key, const std::string& accepted) const {
    throw Error(where(key) + ": value " + json_brief(obj_[key]) + " is not supported by Wren (accepted: " +
                accepted + ")");
  }

 private:
  const json& obj_;
  std::string source_, path_;
};

/// Flags both families share (docs/model.md#decisions, #kimi-linear).
void check_common_flags(const Reader& t, const Reader& root) {
  if (t.has("moe_router_activation_func") && t.string("moe_router_activation_func") != "sigmoid")
    t.unsupported("moe_router_activation_func", "\"sigmoid\"");
  t.boolean_or("use_grouped_topk", false);
  const std::string groups = t.alias({"num_expert_group", "n_group"});
  if (t.integer_or(groups, 1, 0) != 1)
    t.unsupported(groups, "1 (grouped top-k with several groups is not implemented)");
  if (t.integer_or("topk_group", 1, 0) != 1) t.unsupported("topk_group", "1");
  if (t.has("topk_method") && t.string("topk_method") != "noaux_tc")
    t.unsupported("topk_method", "\"noaux_tc\" or absent");
  if (t.has("mla_use_nope") && !t.boolean("mla_use_nope"))
    t.unsupported("mla_use_nope", "true (RoPE is not implemented)");
  if (t.integer_or("num_nextn_predict_layers", 0, 0) != 0)
    t.unsupported("num_nextn_predict_layers", "0 (no MTP head)");
  if (t.integer_or("moe_layer_freq", 1, 0) != 1) t.unsupported("moe_layer_freq", "1");
  // tie_word_embeddings: root first (where the published file has it), then text_config.
  const Reader& tw = root.has("tie_word_embeddings") ? root : t;
  if (tw.boolean("tie_word_embeddings")) tw.unsupported("tie_word_embeddings", "false");
}

/// K3-only flags (docs/model.md#decisions), all required.
void check_k3_flags(const Reader& t, Config& c) {
  t.string("moe_router_activation_func");
  if (!t.boolean("moe_renormalize")) t.unsupported("moe_renormalize", "true");
  c.latent_norm = t.boolean("latent_moe_use_norm");
  const double scaling = t.f32_or("routed_scaling_factor", 1.f, 0, kF32Max, "a non-negative number finite in f32");
  if (!c.latent_norm && scaling != 1.0)
    t.unsupported("routed_scaling_factor",
                  "1.0, or any value while latent_moe_use_norm is true (the latent RMSNorm "
                  "cancels it)");
  if (!t.boolean("mla_use_nope")) t.unsupported("mla_use_nope", "true (RoPE is not implemented)");
  if (!t.boolean("mla_use_output_gate")) t.unsupported("mla_use_output_gate", "true");
  if (t.string("hidden_act") != "situ") t.unsupported("hidden_act", "\"situ\"");
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
                        i < c.first_dense ? Ffn::Dense : Ffn::MoE, false});
}

/// eos_token_id: one id or a list, each a token of the vocabulary [0, vocab).
std::vector<int> eos_list(const Reader& r, const std::string& key, int vocab) {
  const std::string exp = "a token id in [0, " + std::to_string(vocab - 1) + "] or a list of them (vocab_size " +
                          std::to_string(vocab) + ")";
  const json& v = r.need(key, exp);
  std::vector<int> ids;
  if (v.is_number_integer()) {
    if (v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) r.fail(key, exp);
    ids = {v.get<int>()};
  } else {
    if (!v.is_array() || v.empty()) r.fail(key, exp);
    for (const auto& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab) r.fail(key, exp);
      ids.push_back(e.get<int>());
    }
  }
  return ids;
}

}  // namespace

int64_t Config::expert_bytes() const {
  // w1, w3: [moe_inter, io]; w2: [io, moe_inter]. MXFP4: packed n/2 bytes + n/32 scales per
  // matrix. Dense experts: the bytes depend on the stored dtype; this counts f32 after load.
  const int64_t n = int64_t(moe_inter) * expert_io();
  return expert_format == ExpertFormat::MXFP4 ? 3 * (n / 2 + n / mxfp4::kGroup) : 3 * n * 4;
}

int Config::count(Mixer m) const {
  return int(std::count_if(layers.begin(), layers.end(), [m](const LayerSpec& l) { return l.mixer == m; }));
}

namespace {

/// Sizes and layout both families share.
void parse_common(const Reader& root, const Reader& t, Config& c) {
  c.hidden = int(t.integer("hidden_size"));
  // Bounds far above any Kimi model, so that a typo cannot make the loader allocate per-layer and
  // per-expert tables of billions of entries before the first tensor is checked.
  c.n_layers = int(t.integer("num_hidden_layers", 1, kMaxLayers));
  c.vocab = int(t.integer("vocab_size"));
  c.first_dense = int(t.integer("first_k_dense_replace", 0, c.n_layers));
  c.dense_inter = c.first_dense > 0 ? int(t.integer("intermediate_size")) : 0;
  c.rms_eps = t.f32_or("rms_norm_eps", 1e-5f, 0, 1, "a positive number at most 1 (f32; the spec's value is 1e-5)");
  if (!(c.rms_eps > 0)) t.fail("rms_norm_eps", "a positive number at most 1 (f32; the spec's value is 1e-5)");
  const std::string maxpos = t.alias({"max_position_embeddings", "model_max_length"});
  c.max_positions = t.integer_or(maxpos, int64_t(1) << 20, 1, INT64_MAX);

  c.mla_heads = int(t.integer("num_attention_heads"));
  c.kv_lora = int(t.integer("kv_lora_rank", 1, 4096));
  c.qk_nope = int(t.integer("qk_nope_head_dim"));
  c.qk_extra = int(t.integer("qk_rope_head_dim", 0));
  c.v_head = int(t.integer("v_head_dim"));

  const std::string experts = t.alias({"num_experts", "num_local_experts"});
  c.n_experts = int(t.integer(experts, 1, kMaxExperts));
  if (int64_t(c.n_experts) * c.n_layers > kMaxExpertsTotal)
    t.fail(experts, "at most " + std::to_string(kMaxExpertsTotal) + " routed experts in all layers together (" +
                        std::to_string(c.n_layers) + " layers)");
  c.top_k = int(t.integer(t.alias({"num_experts_per_token", "num_experts_per_tok"}), 1, c.n_experts));
  c.moe_inter = int(t.integer("moe_intermediate_size"));
  c.n_shared = int(t.integer(t.alias({"num_shared_experts", "n_shared_experts"}), 0));

  const Reader la = t.child("linear_attn_config");
  c.kda_heads = int(la.integer("num_heads"));
  c.kda_head_dim = int(la.integer("head_dim", 1, 512));
  c.conv_kernel = int(la.integer("short_conv_kernel_size"));

  // Token ids: root first (where the published file has them), then text_config; in [0, vocab).
  c.bos_id = int(root.has("bos_token_id") ? root.integer("bos_token_id", 0, c.vocab - 1)
                                          : t.integer("bos_token_id", 0, c.vocab - 1));
  c.eos_ids = root.has("eos_token_id") ? eos_list(root, "eos_token_id", c.vocab)
                                       : eos_list(t, "eos_token_id", c.vocab);
  check_common_flags(t, root);
  derive_layers(la, c);
}

/// Kimi K3 (docs/model.md): AttnRes, bounded KDA gate, full-rank gates, LatentMoE on MXFP4, SiTU.
void parse_k3(const Reader& root, const Reader& t, Config& c) {
  c.attn_res_block = int(t.integer("attn_res_block_size"));
  c.q_lora = int(t.integer("q_lora_rank"));
  c.latent = int(t.integer("routed_expert_hidden_size"));
  if (c.moe_inter % mxfp4::kGroup) t.fail("moe_intermediate_size", "a multiple of 32 (MXFP4 groups)");
  if (c.latent % mxfp4::kGroup) t.fail("routed_expert_hidden_size", "a multiple of 32 (MXFP4 groups)");
  // SiTU computes b·tanh(x/b): b must be positive and finite in f32 (Inf·tanh(x/Inf) is NaN).
  const std::string pos = "a positive number finite in f32 (at most 3.4e38)";
  c.situ_b1 = t.f32("activation_situ_beta", 0, kF32Max, pos);
  c.situ_b2 = t.f32("activation_situ_linear_beta", 0, kF32Max, pos);
  if (!(c.situ_b1 > 0)) t.fail("activation_situ_beta", pos);
  if (!(c.situ_b2 > 0)) t.fail("activation_situ_linear_beta", pos);

  const Reader la = t.child("linear_attn_config");
  // Required for kimi_k3 (docs/model.md#open-points, 3: a silent default could build the wrong gate).
  const std::string neg = "a negative number finite in f32 (at least -3.4e38)";
  c.gate_lower_bound = la.f32("gate_lower_bound", -kF32Max, 0, neg);
  if (!(c.gate_lower_bound < 0)) la.fail("gate_lower_bound", neg);
  if (!la.boolean("use_full_rank_gate"))
    la.unsupported("use_full_rank_gate", "true (kimi_k3 uses the full-rank output gate)");
  // A_log is stored zero-padded: [128] for 96 heads x 128 dims at K3, [32] for 4 x 32 in
  // golden/k3-tiny-a. Both equal max(heads, head_dim); the spec does not state the rule.
  c.a_log_len = std::max(c.kda_heads, c.kda_head_dim);

  check_k3_flags(t, c);
  check_quantization(root, t);
  for (int i = 0; i < c.n_layers; ++i) c.layers[i].snapshot = i % c.attn_res_block == 0;
  if ((int64_t(c.n_layers) + c.attn_res_block - 1) / c.attn_res_block + 1 > 16)  // max_mix_entries, in int64
    t.fail("attn_res_block_size", "a block size giving at most 16 AttnRes entries (ceil(L/B)+1)");
}

/// Kimi Linear (docs/model.md#kimi-linear): plain residual, softplus KDA gate, low-rank KDA output
/// gate, MLA without output gate (q LoRA optional), plain MoE with SiLU and dense experts, routed
/// scaling. K3-only keys are rejected: transformers would silently drop them.
void parse_kimi_linear(const Reader& t, Config& c) {
  c.residual = Residual::Plain;
  c.kda_gate = KdaGate::Softplus;
  c.kda_gate_rank = c.kda_head_dim;  // g_a_proj [head_dim, D] (docs/model.md#kimi-linear)
  c.mla_out_gate = false;
  c.moe_kind = MoeKind::Plain;
  c.act = Activation::SiLU;
  c.expert_format = ExpertFormat::Dense;
  c.a_log_4d = true;
  c.a_log_len = c.kda_heads;
  c.latent_norm = false;
  c.q_lora = t.has("q_lora_rank") ? int(t.integer("q_lora_rank")) : 0;
  c.routed_scale = t.f32_or("routed_scaling_factor", 2.446f, 0, kF32Max,  // transformers' default
                            "a non-negative number finite in f32");
  const std::string renorm = t.alias({"moe_renormalize", "norm_topk_prob"});
  if (!t.boolean_or(renorm, true)) t.unsupported(renorm, "true (unnormalized routing weights are not implemented)");
  if (t.string("hidden_act") != "silu") t.unsupported("hidden_act", "\"silu\" (kimi_linear)");
  const Reader la = t.child("linear_attn_config");
  for (const char* k : {"attn_res_block_size", "routed_expert_hidden_size", "latent_moe_use_norm",
                        "activation_situ_beta", "activation_situ_linear_beta", "quantization_config"})
    if (t.has(k)) t.unsupported(k, "absent in a kimi_linear config (a kimi_k3 key that transformers' kimi_linear ignores)");
  if (t.has("mla_use_output_gate") && t.boolean("mla_use_output_gate"))
    t.unsupported("mla_use_output_gate", "false or absent (kimi_linear MLA has no output gate)");
  if (la.has("gate_lower_bound"))
    la.unsupported("gate_lower_bound", "absent (kimi_linear uses the unbounded softplus gate)");
  if (la.has("use_full_rank_gate") && la.boolean("use_full_rank_gate"))
    la.unsupported("use_full_rank_gate", "false or absent (kimi_linear uses the low-rank output gate)");
  for (LayerSpec& l : c.layers) l.snapshot = false;
}

}  // namespace

/// Derived widths are ints (and index device buffers): each product or sum of config sizes must
/// fit in int32. Checked in int64 before any of them is computed as int.
void check_derived(const Reader& t, const Config& c) {
  const int64_t heads = c.mla_heads;
  const struct { const char* key; int64_t v; const char* what; } sums[] = {
      {"linear_attn_config", int64_t(c.kda_heads) * c.kda_head_dim, "num_heads x head_dim"},
      {"qk_nope_head_dim", int64_t(c.qk_nope) + c.qk_extra, "qk_nope_head_dim + qk_rope_head_dim"},
      {"num_attention_heads", heads * (int64_t(c.qk_nope) + c.qk_extra), "num_attention_heads x q head dim"},
      {"num_attention_heads", heads * (int64_t(c.qk_nope) + c.v_head), "num_attention_heads x (qk_nope + v_head_dim)"},
      {"v_head_dim", heads * c.v_head, "num_attention_heads x v_head_dim"},
      {"kv_lora_rank", int64_t(c.kv_lora) + c.qk_extra, "kv_lora_rank + qk_rope_head_dim"},
      {"moe_intermediate_size", int64_t(c.moe_inter) * c.n_shared, "moe_intermediate_size x num_shared_experts"},
      {"num_hidden_layers", int64_t(c.n_layers) + c.attn_res_block, "num_hidden_layers + attn_res_block_size"},
      {"num_experts_per_token", int64_t(c.top_k) * std::max(c.hidden, c.latent), "top-k x expert width"},
  };
  for (const auto& s : sums)
    if (s.v > INT32_MAX) t.fail(s.key, std::string("sizes whose ") + s.what + " fits in 32 bits (is " + std::to_string(s.v) + ")");
}

Config parse_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) throw Error(source + ": expected a JSON object at the top level");
  const Reader root(doc, source, "");
  const std::string mt = root.string("model_type");
  if (mt != "kimi_k3" && mt != "kimi_linear") root.unsupported("model_type", "\"kimi_k3\" or \"kimi_linear\"");
  const Reader t = root.has("text_config") ? root.child("text_config") : root;
  Config c;
  parse_common(root, t, c);
  if (mt == "kimi_k3") parse_k3(root, t, c);
  else parse_kimi_linear(t, c);
  check_derived(t, c);
  return c;
}

Config load_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(model_dir, ec))
    throw Error(model_dir + ": is a file; a model is a folder (the Hugging Face snapshot: config.json, "
                "*.safetensors, the tokenizer files)");
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open (is --model a Kimi K3 snapshot folder?)");
  json doc = json::parse(f, nullptr, false);
  if (doc.is_discarded()) throw Error(path + ": not valid JSON");
  return parse_config(doc, path);
}

}  // namespace wren
