// The Kimi K3 forward pass (see forward.h). Reads like the block diagram: mix → norm → KDA or MLA →
// mix → norm → dense FFN or LatentMoE, then the final mix, norm and lm_head (spec §4.1).
#include "model/forward.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace wren {

/// Activation buffers [max_chunk, width], allocated from the backend once. Without a backend it
/// only counts (Forward::workspace_bytes).
struct Forward::Buffers {
  Backend* be;
  std::vector<float*> all;
  size_t floats = 0;
  explicit Buffers(Backend* b) : be(b) {}
  ~Buffers() {
    for (float* p : all) be->release(p);
  }
  float* make(size_t n) {
    floats += n;
    if (!be) return nullptr;
    all.push_back(be->alloc(n));
    return all.back();
  }
  void plan(const Config& c, size_t T);
  // Driver
  float* P = nullptr;                 // running block sum [T, D]
  std::vector<float*> blocks;         // AttnRes snapshots, each [T, D]
  float *mixed, *nrm, *att, *ffn, *tmp;  // [T, D]
  // KDA
  float *q, *k, *v, *fa, *ga, *z, *beta, *gate, *o;
  // MLA
  float *qa, *qan, *qfull, *ckv, *ctx, *mgate;
  // FFN
  float *g, *u, *act;                 // [T, max(inter)]
  float *rlog, *lat, *ys, *lsum, *lnorm;
  std::vector<int> ids;               // host [T, k]
  std::vector<float> wts;             // host [T, k]
  // Head
  float *hnorm, *logits;
};

Forward::Forward(const Model& model, Backend& backend, ForwardOptions opts, ExpertSource* experts)
    : model_(model), cfg_(model.config), be_(backend), opts_(opts), experts_(experts) {
  if (!experts_) {
    own_experts_ = std::make_unique<MappedExperts>(weight_list(model.weights));
    experts_ = own_experts_.get();
  }
  const Config& c = cfg_;
  n_layers_ = opts.layers < 0 ? c.n_layers : std::min(opts.layers, c.n_layers);
  check(opts_.max_chunk >= 1, "--chunk must be at least 1");
  buf_ = std::make_unique<Buffers>(&be_);
  buf_->plan(c, opts_.max_chunk);
}

size_t Forward::workspace_bytes(const Config& c, int max_chunk) {
  Buffers b(nullptr);
  b.plan(c, max_chunk);
  return b.floats * sizeof(float);
}

void Forward::Buffers::plan(const Config& c, size_t T) {
  Buffers& b = *this;
  const size_t D = c.hidden, P = c.kda_width();
  b.P = b.make(T * D);
  b.blocks.resize(c.max_mix_entries());
  for (auto& blk : b.blocks) blk = b.make(T * D);
  b.mixed = b.make(T * D), b.nrm = b.make(T * D), b.att = b.make(T * D);
  b.ffn = b.make(T * D), b.tmp = b.make(T * D);
  b.q = b.make(T * P), b.k = b.make(T * P), b.v = b.make(T * P), b.z = b.make(T * P);
  b.gate = b.make(T * P), b.o = b.make(T * P);
  b.fa = b.make(T * c.kda_head_dim), b.beta = b.make(T * c.kda_heads);
  b.ga = b.make(T * std::max(c.kda_gate_rank, 1));
  b.qa = b.make(T * c.q_lora), b.qan = b.make(T * c.q_lora);
  b.qfull = b.make(T * c.mla_heads * c.mla_q_head()), b.ckv = b.make(T * c.mla_cache_width());
  b.ctx = b.make(T * c.mla_heads * c.v_head), b.mgate = b.make(T * c.mla_heads * c.v_head);
  const size_t inter = std::max({c.dense_inter, c.shared_inter(), c.moe_inter});
  b.g = b.make(T * inter), b.u = b.make(T * inter), b.act = b.make(T * inter);
  const size_t io = c.expert_io();
  b.rlog = b.make(T * c.n_experts), b.lat = b.make(T * io);
  b.ys = b.make(T * c.top_k * io), b.lsum = b.make(T * io), b.lnorm = b.make(T * io);
  b.ids.resize(T * c.top_k), b.wts.resize(T * c.top_k);
  b.hnorm = b.make(T * D), b.logits = b.make(T * size_t(c.vocab));
}

Forward::~Forward() = default;

void Forward::run(SequenceState& st, const int* ids, const float* x0, int T, float* logits,
                  bool all_logits, const ForwardHooks* hooks) {
  if (fallback_) return run_fallback(st, ids, x0, T, logits, all_logits, hooks);
  check(&st.backend() == &be_, "forward: the sequence state belongs to another backend");
  try {
    run_here(st, ids, x0, T, logits, all_logits, hooks);
  } catch (const DeviceError& e) {
    if (!make_fallback_ || !st.replayable() || x0) throw;
    std::fprintf(stderr, "wren: the %s backend failed: %s\nwren: continuing on the CPU from here on "
                         "(each sequence's state is rebuilt there from its tokens)\n", be_.name(), e.what());
    fallback_be_ = make_fallback_();
    fallback_ = std::make_unique<Forward>(model_, *fallback_be_, opts_, experts_);
    run_fallback(st, ids, x0, T, logits, all_logits, hooks);
  }
}

void Forward::run_fallback(SequenceState& st, const int* ids, const float* x0, int T, float* logits,
                           bool all_logits, const ForwardHooks* hooks) {
  if (&st.backend() != fallback_be_.get()) {  // rebuild the state on the fallback backend
    check(st.replayable(), "forward: this sequence was fed embeddings (x0), so its state cannot be rebuilt on the "
                           "fallback backend after the device failed");
    const std::vector<int> history = st.history();
    st.move_to(*fallback_be_);
    if (!history.empty()) fallback_->run(st, history.data(), nullptr, int(history.size()), nullptr, false);
  }
  fallback_->run(st, ids, x0, T, logits, all_logits, hooks);
}

void Forward::run_here(SequenceState& st, const int* ids, const float* x0, int T, float* logits,
                       bool all_logits, const ForwardHooks* hooks) {
  const size_t V = cfg_.vocab, D = cfg_.hidden;
  for (int t0 = 0; t0 < T; t0 += opts_.max_chunk) {
    const int n = std::min(opts_.max_chunk, T - t0);
    const bool last = t0 + n == T;
    float* out = logits == nullptr ? nullptr : all_logits ? logits + t0 * V : last ? logits : nullptr;
    chunk(st, ids + t0, x0 ? x0 + t0 * D : nullptr, n, t0, out, all_logits, hooks);
  }
  st.record(ids, T, x0 == nullptr);
}

void Forward::chunk(SequenceState& st, const int* ids, const float* x0, int T, int t0,
                    float* logits, bool all_logits, const ForwardHooks* hooks) {
  // One decode step = one graph submission when nothing in it needs the host (see graph_step).
  const bool graph = graph_step(T, x0, hooks) && be_.graph_begin();
  try {
    chunk_ops(st, ids, x0, T, t0, logits, all_logits, hooks, graph);
  } catch (...) {
    if (graph) be_.graph_abort();
    throw;
  }
}

void Forward::chunk_ops(SequenceState& st, const int* ids, const float* x0, int T, int t0, float* logits,
                        bool all_logits, const ForwardHooks* hooks, bool graph) {
  Buffers& b = *buf_;
  const Config& c = cfg_;
  const ModelWeights& w = model_.weights;
  const size_t D = c.hidden, TD = T * D;
  if (x0) be_.from_host(x0, TD, b.P);
  else be_.embed(w.embed, ids, T, b.P);

  int n_blocks = 0;
  for (int i = 0; i < n_layers_; ++i) {
    const LayerWeights& l = w.layers[i];
    const LayerSpec& spec = c.layers[i];
    if (hooks && hooks->before_layer) hooks->before_layer(i, t0, T, LayerIo{be_, b.P, b.blocks.data(), n_blocks, D});
    // Pre-attention mix (skipped while there is no snapshot: the only candidate is P itself).
    pre_mix(l.attn_mix, b.blocks, n_blocks, T);
    if (spec.snapshot) {  // P becomes a snapshot; a new block starts at zero
      std::swap(b.blocks[n_blocks], b.P);
      ++n_blocks;
      be_.fill_zero(b.P, TD);
    }
    be_.rms_norm(b.mixed, T, int(D), l.input_norm, c.rms_eps, b.nrm);
    if (spec.mixer == Mixer::KDA) kda_layer(l, st.kda(i), T);
    else mla_layer(l, st.mla(i), T);
    be_.add(b.P, b.att, TD);
    pre_mix(l.mlp_mix, b.blocks, n_blocks, T);
    if (hooks && hooks->dump && i == hooks->dump_layer) dump(hooks, -1, t0, T);  // nrm_attn, att
    be_.rms_norm(b.mixed, T, int(D), l.post_norm, c.rms_eps, b.nrm);
    if (spec.ffn == Ffn::Dense) dense_mlp(l, T);
    else moe(i, l.moe, T);
    be_.add(b.P, b.ffn, TD);
    if (hooks && hooks->dump && i == hooks->dump_layer) dump(hooks, i, t0, T);  // nrm_mlp, mlp, hidden
    if (hooks && hooks->trace)
      for (int t = 0; t < T; ++t)
        be_.to_host(b.P + t * D, D, hooks->trace + ((size_t(t0) + t) * n_layers_ + i) * D);
  }
  st.advance(T);
  const int rows = logits ? head(n_blocks, T, all_logits) : 0;
  if (graph) be_.graph_launch();
  if (logits) be_.to_host(b.logits, size_t(rows) * c.vocab, logits);
}

bool Forward::graph_step(int T, const float* x0, const ForwardHooks* hooks) {
  if (!opts_.graph || T != 1 || x0 || (hooks && (hooks->trace || hooks->dump || hooks->before_layer))) return false;
  if (cfg_.expert_format != ExpertFormat::MXFP4) return false;  // dense experts route on the host
  for (int i = 0; i < n_layers_; ++i)
    if (cfg_.layers[i].ffn == Ffn::MoE && !be_.routed_moe_on_device(routed_params(i), model_.weights.layers[i].moe))
      return false;
  return true;
}

RoutedMoeParams Forward::routed_params(int layer) const {
  const Config& c = cfg_;
  return RoutedMoeParams{layer,     c.n_experts, c.top_k, c.expert_io(), c.routed_scale, c.situ_b1, c.situ_b2,
                         c.act == Activation::SiLU};
}

/// b.mixed = Mix(blocks + [P]) (AttnRes, spec §4.1), or P itself when there is nothing to mix:
/// before the first snapshot, and always with the plain residual (Kimi Linear), whose sublayer
/// input is the residual stream.
void Forward::pre_mix(const DenseWeight& w, const std::vector<float*>& blocks, int n_blocks, int T) {
  Buffers& b = *buf_;
  const size_t D = cfg_.hidden;
  if (n_blocks == 0) {
    be_.copy(b.P, T * D, b.mixed);
    return;
  }
  std::vector<const float*> entries(blocks.begin(), blocks.begin() + n_blocks);
  entries.push_back(b.P);
  be_.attnres_mix(entries.data(), int(entries.size()), T, int(D), w, cfg_.rms_eps, b.mixed);
}

void Forward::glu(const float* g, const float* u, int T, int n, float* out) {
  if (cfg_.act == Activation::SiTU) be_.situ_glu(g, u, T, n, cfg_.situ_b1, cfg_.situ_b2, out);
  else be_.silu_glu(g, u, T, n, out);
}

void Forward::kda_layer(const LayerWeights& l, KdaState& s, int T) {
  Buffers& b = *buf_;
  const KdaWeights& k = l.kda;
  be_.gemm(k.q, b.nrm, T, b.q);
  be_.gemm(k.k, b.nrm, T, b.k);
  be_.gemm(k.v, b.nrm, T, b.v);
  be_.gemm(k.f_a, b.nrm, T, b.fa);
  be_.gemm(k.f_b, b.fa, T, b.z);
  be_.gemm(k.b, b.nrm, T, b.beta);
  if (cfg_.kda_gate_rank == 0) {
    be_.gemm(k.g, b.nrm, T, b.gate);
  } else {  // low-rank output gate (Kimi Linear)
    be_.gemm(k.g_a, b.nrm, T, b.ga);
    be_.gemm(k.g_b, b.ga, T, b.gate);
  }
  const KdaParams p{cfg_.kda_heads, cfg_.kda_head_dim, cfg_.conv_kernel, cfg_.gate_lower_bound,
                    cfg_.rms_eps, cfg_.kda_gate};
  be_.kda_core(p, k, s, b.q, b.k, b.v, b.z, b.beta, b.gate, T, b.o);
  be_.gemm(k.o, b.o, T, b.att);
}

void Forward::mla_layer(const LayerWeights& l, MlaCache& cache, int T) {
  Buffers& b = *buf_;
  const MlaWeights& m = l.mla;
  if (cfg_.q_lora > 0) {
    be_.gemm(m.q_a, b.nrm, T, b.qa);
    be_.rms_norm(b.qa, T, cfg_.q_lora, m.q_a_norm, cfg_.mla_latent_eps, b.qan);
    be_.gemm(m.q_b, b.qan, T, b.qfull);
  } else {
    be_.gemm(m.q, b.nrm, T, b.qfull);
  }
  be_.gemm(m.kv_a, b.nrm, T, b.ckv);
  const MlaParams p{cfg_.mla_heads, cfg_.qk_nope, cfg_.qk_extra, cfg_.v_head, cfg_.kv_lora, cfg_.mla_latent_eps};
  be_.mla_attend(p, m, cache, b.qfull, b.ckv, T, b.ctx);
  if (cfg_.mla_out_gate) {
    be_.gemm(m.g, b.nrm, T, b.mgate);
    be_.sigmoid_gate(b.ctx, b.mgate, size_t(T) * cfg_.mla_heads * cfg_.v_head);
  }
  be_.gemm(m.o, b.ctx, T, b.att);
}

void Forward::dense_mlp(const LayerWeights& l, int T) {
  Buffers& b = *buf_;
  be_.gemm(l.mlp.gate, b.nrm, T, b.g);
  be_.gemm(l.mlp.up, b.nrm, T, b.u);
  glu(b.g, b.u, T, cfg_.dense_inter, b.act);
  be_.gemm(l.mlp.down, b.act, T, b.ffn);
}

void Forward::moe(int layer, const MoeWeights& m, int T) {
  Buffers& b = *buf_;
  const Config& c = cfg_;
  const size_t D = c.hidden;
  if (c.moe_kind == MoeKind::Latent) {  // Stable LatentMoE (spec §4.4)
    be_.gemm(m.down, b.nrm, T, b.lat);
    routed_experts(layer, m, b.lat, T, b.lsum);
    const float* u = b.lsum;
    if (c.latent_norm) {
      be_.rms_norm(b.lsum, T, c.latent, m.norm, c.rms_eps, b.lnorm);
      u = b.lnorm;
    }
    be_.gemm(m.up, u, T, b.ffn);
  } else {  // plain MoE on the hidden state (Kimi Linear §3.3)
    routed_experts(layer, m, b.nrm, T, b.ffn);
  }
  if (c.n_shared > 0) {
    const int S = c.shared_inter();
    be_.gemm(m.shared_gate, b.nrm, T, b.g);
    be_.gemm(m.shared_up, b.nrm, T, b.u);
    glu(b.g, b.u, T, S, b.act);
    be_.gemm(m.shared_down, b.act, T, b.tmp);
    be_.add(b.ffn, b.tmp, size_t(T) * D);
  }
}

/// out[T, io] = Σ_k w_k · expert_k(z) over each token's top-k (spec §4.4 steps 1-5).
void Forward::routed_experts(int layer, const MoeWeights& m, const float* z, int T, float* out) {
  Buffers& b = *buf_;
  const Config& c = cfg_;
  const int K = c.top_k, io = c.expert_io();
  be_.gemm(m.router, b.nrm, T, b.rlog);
  if (be_.routed_moe(routed_params(layer), m, b.rlog, z, T, b.ys, out))
    return;  // routed on the device (same result as the host-routed path below, up to the backend's precision mode)
  be_.router_topk(b.rlog, m.bias, T, c.n_experts, K, b.ids.data(), b.wts.data());
  if (c.routed_scale != 1.f)
    for (int j = 0; j < T * K; ++j) b.wts[j] *= c.routed_scale;
  // Each unique expert once over the chunk (batch union); outputs land per (token, slot) so the
  // weighted sum below runs in slot order whatever the grouping or the source's visiting order.
  std::vector<std::vector<int>> uses(c.n_experts);  // expert -> (token * K + slot) entries
  std::vector<int> unique;
  for (int j = 0; j < T * K; ++j) {
    if (uses[b.ids[j]].empty()) unique.push_back(b.ids[j]);
    uses[b.ids[j]].push_back(j);
  }
  if (c.expert_format == ExpertFormat::Dense) {  // dense experts are resident weights
    for (int e : unique)
      for (int j : uses[e]) {
        const ExpertRef& ref = m.experts[e];
        be_.gemm(ref.d1, z + size_t(j / K) * io, 1, b.g);
        be_.gemm(ref.d3, z + size_t(j / K) * io, 1, b.u);
        glu(b.g, b.u, 1, c.moe_inter, b.act);
        be_.gemm(ref.d2, b.act, 1, b.ys + size_t(j) * io);
      }
  } else {
    std::vector<const ExpertRef*> refs;
    std::vector<int> in_rows, out_rows;
    experts_->visit_batches(layer, unique, [&](const int* ids, const ExpertRef* const* views, int n) {
      // Every expert the source hands over at once in one call (so the backend can run them
      // concurrently), each with all its tokens adjacent: the backend streams it once for them.
      refs.clear(), in_rows.clear(), out_rows.clear();
      for (int i = 0; i < n; ++i)
        for (int j : uses[ids[i]]) {
          refs.push_back(views[i]);
          in_rows.push_back(j / K);
          out_rows.push_back(j);
        }
      be_.expert_ffn_batch(refs.data(), in_rows.data(), out_rows.data(), int(refs.size()), z, c.situ_b1,
                           c.situ_b2, b.ys);
    });
  }
  for (int t = 0; t < T; ++t)
    be_.weighted_sum(b.ys + size_t(t) * K * io, b.wts.data() + size_t(t) * K, K, io, out + size_t(t) * io);
}

int Forward::head(int n_blocks, int T, bool all_logits) {
  Buffers& b = *buf_;
  const ModelWeights& w = model_.weights;
  const size_t D = cfg_.hidden;
  pre_mix(w.out_mix, b.blocks, n_blocks, T);  // final mix (the residual itself when plain)
  // Only the last position needs the head unless every position's logits are asked for.
  const int first = all_logits ? 0 : T - 1, n = T - first;
  be_.rms_norm(b.mixed + first * D, n, int(D), w.final_norm, cfg_.rms_eps, b.hnorm);
  be_.gemm(w.lm_head, b.hnorm, n, b.logits);
  return n;
}

void Forward::dump(const ForwardHooks* h, int layer, int t0, int T) {
  const int t = h->dump_token - t0;
  if (t < 0 || t >= T) return;
  Buffers& b = *buf_;
  const size_t D = cfg_.hidden;
  if (layer < 0) {  // after the mixer: nrm_attn, att
    be_.to_host(b.nrm + t * D, D, h->dump);
    be_.to_host(b.att + t * D, D, h->dump + D);
  } else {          // after the FFN: nrm_mlp, mlp, hidden
    be_.to_host(b.nrm + t * D, D, h->dump + 2 * D);
    be_.to_host(b.ffn + t * D, D, h->dump + 3 * D);
    be_.to_host(b.P + t * D, D, h->dump + 4 * D);
  }
}

}  // namespace wren
