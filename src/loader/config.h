// Kimi K3 config.json, parsed and validated once into an immutable struct with derived sizes.
// Source: docs/model.md#config (keys), #layers (layer layout), #decisions (accepted values).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace wren {

/// Mixer of one layer: Kimi Delta Attention or gated NoPE MLA (docs/model.md#layers).
enum class Mixer { KDA, MLA };
/// FFN of one layer: dense GLU MLP (i < first_k_dense_replace) or MoE (kind: Config::moe_kind).
enum class Ffn { Dense, MoE };

/// Residual stream: K3's AttnRes block mixes, or Kimi Linear's plain pre-norm residual.
enum class Residual { AttnRes, Plain };
/// KDA decay gate: K3's bounded `lb·σ(exp(A)·z)` or Kimi Linear's `−exp(A)·softplus(z)`.
enum class KdaGate { LowerBound, Softplus };
/// MoE kind: K3's LatentMoE (down/up latent projections, latent RMSNorm) or a plain MoE on the
/// hidden state (Kimi Linear, DeepSeek-style).
enum class MoeKind { Latent, Plain };
/// GLU activation of the dense MLP, experts and shared experts.
enum class Activation { SiTU, SiLU };
/// How routed experts are stored: MXFP4 packed + ue8m0 scales, or plain dense `.weight` tensors.
enum class ExpertFormat { MXFP4, Dense };

/// Per-layer traits derived at load; the forward pass branches only on these.
struct LayerSpec {
  Mixer mixer;
  Ffn ffn;
  bool snapshot;  ///< AttnRes: P becomes a block snapshot before this layer's attention (i % B == 0)
};

/// The text model's configuration (all sizes in elements).
struct Config {
  // Global
  int hidden = 0;          ///< D (hidden_size)
  int n_layers = 0;        ///< L (num_hidden_layers)
  int vocab = 0;           ///< V (vocab_size)
  int first_dense = 0;     ///< first_k_dense_replace
  int dense_inter = 0;     ///< intermediate_size (dense MLP width)
  float rms_eps = 1e-5f;   ///< rms_norm_eps (default 1e-5)
  float mla_latent_eps = 1e-6f;  ///< q_a/kv_a latent norms (docs/model.md#mla, vendor code)
  int attn_res_block = 0;  ///< attn_res_block_size
  int64_t max_positions = 0;
  int bos_id = -1;
  std::vector<int> eos_ids;
  // Model-wide variant traits (K3 values first; Kimi Linear: docs/model.md#kimi-linear)
  Residual residual = Residual::AttnRes;
  KdaGate kda_gate = KdaGate::LowerBound;
  int kda_gate_rank = 0;       ///< KDA output gate: 0 = full-rank g_proj, else g_a/g_b rank
  bool mla_out_gate = true;    ///< sigmoid output gate on MLA
  MoeKind moe_kind = MoeKind::Latent;
  Activation act = Activation::SiTU;
  ExpertFormat expert_format = ExpertFormat::MXFP4;
  float routed_scale = 1.f;    ///< applied to routing weights (Kimi Linear); K3 leaves it 1
  bool a_log_4d = false;       ///< A_log stored [1, 1, H, 1] (Kimi Linear) instead of [a_log_len]
  // KDA (linear_attn_config)
  int kda_heads = 0, kda_head_dim = 0, conv_kernel = 0;
  float gate_lower_bound = 0.f;
  int a_log_len = 0;  ///< stored A_log length (per-head values zero-padded; see config.cpp)
  // MLA
  int mla_heads = 0, q_lora = 0, kv_lora = 0, qk_nope = 0, qk_extra = 0, v_head = 0;  ///< q_lora 0 = plain q_proj
  // MoE
  int n_experts = 0, top_k = 0, moe_inter = 0, latent = 0, n_shared = 0;
  float situ_b1 = 0.f, situ_b2 = 0.f;
  bool latent_norm = true;

  std::vector<LayerSpec> layers;  ///< one per layer, derived

  // Derived sizes
  int kda_width() const { return kda_heads * kda_head_dim; }     ///< P = H * d
  int mla_q_head() const { return qk_nope + qk_extra; }          ///< 192 at K3
  int mla_cache_width() const { return kv_lora + qk_extra; }     ///< 576 floats/token/layer at K3
  int shared_inter() const { return moe_inter * n_shared; }      ///< fused shared-expert width
  int max_mix_entries() const {
    return residual == Residual::AttnRes ? (n_layers + attn_res_block - 1) / attn_res_block + 1 : 1;
  }
  /// Width of the routed experts' input/output: the latent (LatentMoE) or the hidden size.
  int expert_io() const { return moe_kind == MoeKind::Latent ? latent : hidden; }
  /// Bytes of one routed expert's six tensors (w1, w2, w3 packed + ue8m0 scales).
  int64_t expert_bytes() const;
  int count(Mixer m) const;
};

/// Parses and validates a config.json document. `source` names the file in errors.
/// `model_type` "kimi_k3" (docs/model.md) or "kimi_linear" (docs/model.md#kimi-linear) selects the
/// variant traits. Model keys come from `text_config` when present, else the root. Throws wren::Error naming the
/// key, the value found and what is accepted (docs/model.md#decisions) for anything unsupported or malformed.
Config parse_config(const nlohmann::json& doc, const std::string& source);

/// Reads and parses DIR/config.json.
Config load_config(const std::string& model_dir);

}  // namespace wren
