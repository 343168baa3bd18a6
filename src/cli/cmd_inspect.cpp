// `wren inspect`: the architecture of a snapshot, from config.json and the safetensors headers only
// (no weights are read).
#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "core/sizes.h"
#include "io/checkpoint.h"
#include "model/forward.h"
#include "model/load.h"
#include "model/pipeline.h"
#include "model/tensor_table.h"
#include "ops/state.h"
#include "runtime/default_model.h"
#include "runtime/expert_store.h"

namespace wren::cli {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) b /= 1000, ++u;
  char s[32];
  std::snprintf(s, sizeof s, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return s;
}

struct InspectArgs {
  std::string dir, expert_cache;
  int ctx = 4096, chunk = 32;
  std::string pipeline, pipeline_split = "even";  ///< --pipeline / --pipeline-split to plan for
};

/// The --pipeline plan: per stage its layers, resident weight bytes (dense f32 + experts as
/// stored, layer_bytes) and sequence-state bytes; the embedding goes with stage 0 and the head
/// with the last stage (docs/parallel.md).
void print_stages(const InspectArgs& a, const Config& c) {
  const std::vector<uint64_t> bytes = layer_bytes(c);
  const StagePlan p = parse_pipeline(a.pipeline, c.n_layers, parse_stage_split(a.pipeline_split), bytes);
  const uint64_t per_token_kda = uint64_t(c.kda_heads) * c.kda_head_dim * c.kda_head_dim +
                                 uint64_t(3) * c.kda_width() * uint64_t(c.conv_kernel - 1);
  const uint64_t embed = uint64_t(c.vocab) * c.hidden * 4;
  std::printf("pipeline plan (%s split): %s\n", a.pipeline_split.c_str(), p.describe().c_str());
  for (int s = 0; s < p.stages(); ++s) {
    uint64_t w = 0, st = 0;
    for (int i = p.first(s); i < p.end(s); ++i) {
      w += bytes[size_t(i)];
      st += (c.layers[size_t(i)].mixer == Mixer::KDA ? per_token_kda : uint64_t(a.ctx) * c.mla_cache_width()) * 4;
    }
    if (s == 0) w += embed;
    if (s + 1 == p.stages()) w += embed;  // lm_head [V, D] (untied)
    std::printf("  stage %d: layers %d-%d, weights %s, sequence state %s\n", s, p.first(s), p.end(s) - 1,
                human_bytes(double(w)).c_str(), human_bytes(double(st)).c_str());
  }
  const int cross = p.stages() > 1 ? 1 + Forward::snapshots_before(c, p.first(p.stages() - 1)) : 0;
  std::printf("  per token and boundary: P plus the AttnRes snapshots so far (at most %d x %d floats)\n", cross,
              c.hidden);
}

void inspect(const InspectArgs& a) {
  const std::string dir = a.dir.empty() ? default_model_dir() : a.dir;
  Checkpoint ck(dir);
  const Config& c = ck.config();
  check_layer_count(ck, c);
  std::printf("model: %s\n", dir.c_str());
  std::printf("layers: %d (%d KDA, %d %sMLA), hidden %d, vocab %d\n", c.n_layers, c.count(Mixer::KDA),
              c.count(Mixer::MLA), c.mla_out_gate ? "gated " : "", c.hidden, c.vocab);
  std::printf("layer types:");
  for (int i = 0; i < c.n_layers; ++i)
    std::printf(" %d:%s+%s%s", i, c.layers[i].mixer == Mixer::KDA ? "KDA" : "MLA",
                c.layers[i].ffn == Ffn::Dense ? "dense" : "MoE", c.layers[i].snapshot ? "*" : "");
  if (c.residual == Residual::AttnRes)
    std::printf("\n  (* = AttnRes block snapshot, block size %d)", c.attn_res_block);
  std::printf("\n");
  std::printf("residual: %s\n", c.residual == Residual::AttnRes ? "AttnRes" : "plain pre-norm");
  if (c.kda_gate == KdaGate::LowerBound)
    std::printf("KDA: %d heads x %d, conv %d, decay gate lower bound %g, full-rank output gate\n",
                c.kda_heads, c.kda_head_dim, c.conv_kernel, c.gate_lower_bound);
  else
    std::printf("KDA: %d heads x %d, conv %d, softplus decay gate, output gate rank %d\n", c.kda_heads,
                c.kda_head_dim, c.conv_kernel, c.kda_gate_rank);
  std::printf("MLA: %d heads, q_lora %d, kv_lora %d, nope %d, extra %d, v %d; cache %d floats/token/layer\n",
              c.mla_heads, c.q_lora, c.kv_lora, c.qk_nope, c.qk_extra, c.v_head, c.mla_cache_width());
  std::printf("MoE: %s, %d routed experts (%s), top-%d, expert io %d, expert width %d, %d shared (width %d), %s GLU; dense MLP width %d\n",
              c.moe_kind == MoeKind::Latent ? "LatentMoE" : "plain", c.n_experts,
              c.expert_format == ExpertFormat::MXFP4 ? "MXFP4" : "dense", c.top_k, c.expert_io(),
              c.moe_inter, c.n_shared, c.shared_inter(), c.act == Activation::SiTU ? "SiTU" : "SiLU",
              c.dense_inter);

  ModelWeights w;
  int64_t params = 0, expert_params = 0;
  std::map<std::string, uint64_t> bytes_by_dtype;
  uint64_t expert_bytes = 0, resident_f32 = 0;
  for_each_tensor(c, w, [&](const TensorSpec& s) {
    const TensorRef r = ck.require(s.name, s.alt_name);
    check_tensor(r, s);  // the validator: every stored shape and dtype against the config
    bytes_by_dtype[dtype_name(r.info->dtype)] += r.info->nbytes;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    if (s.kind == TensorKind::ExpertPacked) n *= 2;  // two e2m1 values per byte
    if (s.kind == TensorKind::ExpertScale) n = 0;
    params += n;
    if (!s.is_expert()) resident_f32 += uint64_t(n) * 4;  // dense weights are upcast to f32 at load
    if (s.expert) {
      expert_params += n;
      expert_bytes += r.info->nbytes;
    }
  });
  std::printf("parameters: %.3f M total, %.3f M in routed experts\n", params / 1e6, expert_params / 1e6);
  std::printf("bytes by dtype:");
  for (const auto& [name, b] : bytes_by_dtype) std::printf(" %s %s;", name.c_str(), human_bytes(double(b)).c_str());
  const long long n_exp = (long long)c.n_experts * (c.n_layers - c.first_dense);
  std::printf("\nexperts: %d per MoE layer x %d MoE layers = %lld, %s each as stored (%s in all)\n",
              c.n_experts, c.n_layers - c.first_dense, n_exp,
              human_bytes(n_exp ? double(expert_bytes) / n_exp : 0).c_str(),
              human_bytes(double(expert_bytes)).c_str());
  // Memory plan: what `wren run` holds with these settings, before anything is loaded.
  const bool streamed = c.expert_format == ExpertFormat::MXFP4;
  uint64_t cache = 0;
  if (streamed) {
    const uint64_t want = a.expert_cache.empty() ? std::min<uint64_t>(expert_bytes, available_memory() / 2)
                                                 : parse_size(a.expert_cache, "--expert-cache");
    cache = std::min<uint64_t>(expert_bytes, std::max<uint64_t>(c.expert_bytes(), want)) / c.expert_bytes() * c.expert_bytes();
  }
  const uint64_t state = SequenceState::bytes_for(c, a.ctx), work = Forward::workspace_bytes(c, a.chunk);
  std::printf("memory plan (ctx %d, chunk %d):\n", a.ctx, a.chunk);
  std::printf("  dense weights resident (f32): %s\n", human_bytes(double(resident_f32)).c_str());
  if (streamed && (long long)(cache / c.expert_bytes()) >= n_exp)
    std::printf("  expert cache: %s%s (all %lld experts fit; nothing streams from disk after first use)\n",
                human_bytes(double(cache)).c_str(), a.expert_cache.empty() ? " (default: every expert when that fits in half of available RAM)" : "",
                n_exp);
  else if (streamed)
    std::printf("  expert cache: %s%s (%llu of %lld experts; the rest streams from disk)\n",
                human_bytes(double(cache)).c_str(), a.expert_cache.empty() ? " (default: half of available RAM)" : "",
                (unsigned long long)(cache / c.expert_bytes()), n_exp);
  std::printf("  sequence state: %s; working buffers: %s\n", human_bytes(double(state)).c_str(),
              human_bytes(double(work)).c_str());
  std::printf("  total: %s\n", human_bytes(double(resident_f32 + cache + state + work)).c_str());
  if (!a.pipeline.empty()) print_stages(a, c);
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand("inspect", "Print the architecture, sizes, byte counts and memory plan of a snapshot");
  sub->add_option("--model", a->dir, "Kimi K3 snapshot folder (default: the built-in model wren-tiny)");
  sub->add_option("--expert-cache", a->expert_cache, "Expert cache budget to plan for, e.g. 8G");
  sub->add_option("--ctx", a->ctx, "Context capacity to plan for")->check(positive());
  sub->add_option("--chunk", a->chunk, "Prefill chunk to plan for")->check(positive())->default_str("auto");
  sub->add_option("--pipeline", a->pipeline, "Pipeline stages to plan for: N or layers per stage, e.g. 3+2+1");
  sub->add_option("--pipeline-split", a->pipeline_split, "How --pipeline N splits: even or bytes")
      ->check(CLI::IsMember({"even", "bytes"}))
      ->capture_default_str();
  sub->callback([a] { inspect(*a); });
}

}  // namespace wren::cli
