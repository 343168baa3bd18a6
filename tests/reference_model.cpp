// Naive f64 K3 reference for tests (see reference_model.h).
#include "reference_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/mxfp4.h"

namespace wren::test {

namespace {

using Vec = std::vector<double>;

Vec row(const DenseWeight& w, int64_t r) {
  return Vec(w.f32() + r * w.cols, w.f32() + (r + 1) * w.cols);
}

Vec matvec(const DenseWeight& w, const Vec& x) {
  Vec y(w.rows, 0.0);
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) y[r] += double(w.f32()[r * w.cols + c]) * x[c];
  return y;
}

Vec mx_matvec(const MxMatrix& m, const Vec& x) {
  Vec y(m.rows, 0.0);
  std::vector<float> deq(m.cols);
  for (int r = 0; r < m.rows; ++r) {
    mxfp4::dequant_row(m.packed + size_t(r) * m.cols / 2, m.scale + size_t(r) * m.cols / 32, m.cols, deq.data());
    for (int c = 0; c < m.cols; ++c) y[r] += double(deq[c]) * x[c];
  }
  return y;
}

Vec rms(const Vec& x, const DenseWeight& w, double eps, size_t off = 0, size_t n = 0) {
  if (!n) n = x.size();
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  Vec y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[off + i] * inv * w.f32()[i];
  return y;
}

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double act(const Config& c, double g, double u) {
  if (c.act == Activation::SiLU) return g * sig(g) * u;
  return c.situ_b1 * std::tanh(g / c.situ_b1) * sig(g) * c.situ_b2 * std::tanh(u / c.situ_b2);
}

Vec mix(const std::vector<Vec>& entries, const DenseWeight& norm, const DenseWeight& proj, double eps) {
  const size_t D = entries[0].size();
  Vec score;
  for (const Vec& v : entries) {
    const Vec n = rms(v, norm, eps);
    double s = 0;
    for (size_t i = 0; i < D; ++i) s += n[i] * proj.f32()[i];
    score.push_back(s);
  }
  const double mx = *std::max_element(score.begin(), score.end());
  double sum = 0;
  for (double& s : score) sum += (s = std::exp(s - mx));
  Vec out(D, 0.0);
  for (size_t e = 0; e < entries.size(); ++e)
    for (size_t i = 0; i < D; ++i) out[i] += score[e] / sum * entries[e][i];
  return out;
}

struct KdaHistory {
  std::vector<Vec> q, k, v;       // pre-conv projections of every past token
  std::vector<Vec> S;             // [H] of d*d
};

Vec kda(const Config& c, const KdaWeights& w, KdaHistory& hist, const Vec& x) {
  const int H = c.kda_heads, d = c.kda_head_dim, P = H * d, K = c.conv_kernel;
  hist.q.push_back(matvec(w.q, x));
  hist.k.push_back(matvec(w.k, x));
  hist.v.push_back(matvec(w.v, x));
  if (hist.S.empty()) hist.S.assign(H, Vec(size_t(d) * d, 0.0));
  auto conv = [&](const std::vector<Vec>& h, const DenseWeight& cw) {
    Vec y(P, 0.0);
    const int t = int(h.size()) - 1;
    for (int ch = 0; ch < P; ++ch) {
      for (int j = 0; j < K; ++j) {
        const int src = t - (K - 1) + j;
        if (src >= 0) y[ch] += double(cw.f32()[ch * K + j]) * h[src][ch];
      }
      y[ch] = y[ch] * sig(y[ch]);
    }
    return y;
  };
  Vec q = conv(hist.q, w.q_conv), k = conv(hist.k, w.k_conv), v = conv(hist.v, w.v_conv);
  Vec z = matvec(w.f_b, matvec(w.f_a, x));
  const Vec beta = matvec(w.b, x);
  const Vec gate = c.kda_gate_rank ? matvec(w.g_b, matvec(w.g_a, x)) : matvec(w.g, x);
  Vec out(P);
  for (int h = 0; h < H; ++h) {
    double qs = 0, ks = 0;
    for (int i = 0; i < d; ++i) qs += q[h * d + i] * q[h * d + i], ks += k[h * d + i] * k[h * d + i];
    for (int i = 0; i < d; ++i) {
      q[h * d + i] /= std::sqrt(qs + 1e-6) * std::sqrt(double(d));
      k[h * d + i] /= std::sqrt(ks + 1e-6);
    }
    Vec& S = hist.S[h];
    const double b = sig(beta[h]);
    for (int r = 0; r < d; ++r) {
      const double zz = z[h * d + r] + w.dt_bias.f32()[h * d + r], a = std::exp(double(w.a_log.f32()[h]));
      const double g = c.kda_gate == KdaGate::LowerBound ? c.gate_lower_bound * sig(a * zz)
                                                         : -a * (zz > 20 ? zz : std::log1p(std::exp(zz)));
      for (int cc = 0; cc < d; ++cc) S[r * d + cc] *= std::exp(g);
    }
    // S_t = (I - b k kᵀ) S + b k vᵀ
    Vec kS(d, 0.0);
    for (int r = 0; r < d; ++r)
      for (int cc = 0; cc < d; ++cc) kS[cc] += k[h * d + r] * S[r * d + cc];
    for (int r = 0; r < d; ++r)
      for (int cc = 0; cc < d; ++cc) S[r * d + cc] += b * k[h * d + r] * (v[h * d + cc] - kS[cc]);
    Vec o(d, 0.0);
    for (int r = 0; r < d; ++r)
      for (int cc = 0; cc < d; ++cc) o[cc] += q[h * d + r] * S[r * d + cc];
    const Vec on = rms(o, w.o_norm, c.rms_eps);
    for (int i = 0; i < d; ++i) out[h * d + i] = on[i] * sig(gate[h * d + i]);
  }
  return matvec(w.o, out);
}

struct MlaHistory {
  std::vector<Vec> keys, values;  // per token: [H * (nope + extra)], [H * v]
};

Vec mla(const Config& c, const MlaWeights& w, MlaHistory& hist, const Vec& x) {
  const int H = c.mla_heads, nope = c.qk_nope, ex = c.qk_extra, vh = c.v_head, qh = nope + ex;
  const Vec q = c.q_lora ? matvec(w.q_b, rms(matvec(w.q_a, x), w.q_a_norm, 1e-6)) : matvec(w.q, x);
  const Vec ckv = matvec(w.kv_a, x);
  const Vec lat = rms(ckv, w.kv_a_norm, 1e-6, 0, c.kv_lora);
  const Vec kv = matvec(w.kv_b, lat);  // per head [k_nope | v]
  Vec key(size_t(H) * qh), val(size_t(H) * vh);
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < nope; ++i) key[h * qh + i] = kv[h * (nope + vh) + i];
    for (int i = 0; i < ex; ++i) key[h * qh + nope + i] = ckv[c.kv_lora + i];
    for (int i = 0; i < vh; ++i) val[h * vh + i] = kv[h * (nope + vh) + nope + i];
  }
  hist.keys.push_back(key);
  hist.values.push_back(val);
  const size_t n = hist.keys.size();
  Vec ctx(size_t(H) * vh, 0.0);
  for (int h = 0; h < H; ++h) {
    Vec s(n);
    for (size_t t = 0; t < n; ++t) {
      double dot = 0;
      for (int i = 0; i < qh; ++i) dot += q[h * qh + i] * hist.keys[t][h * qh + i];
      s[t] = dot / std::sqrt(double(qh));
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (size_t t = 0; t < n; ++t)
      for (int i = 0; i < vh; ++i) ctx[h * vh + i] += s[t] / sum * hist.values[t][h * vh + i];
  }
  if (c.mla_out_gate) {
    const Vec g = matvec(w.g, x);
    for (size_t i = 0; i < ctx.size(); ++i) ctx[i] *= sig(g[i]);
  }
  return matvec(w.o, ctx);
}

Vec glu(const DenseWeight& gw, const DenseWeight& uw, const DenseWeight& dw, const Vec& x, const Config& c) {
  const Vec g = matvec(gw, x), u = matvec(uw, x);
  Vec a(g.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = act(c, g[i], u[i]);
  return matvec(dw, a);
}

Vec moe(const Config& c, const MoeWeights& m, const Vec& x, std::vector<int>* picked) {
  const Vec logits = matvec(m.router, x);
  const int E = c.n_experts;
  Vec s(E), biased(E);
  for (int e = 0; e < E; ++e) s[e] = sig(logits[e]), biased[e] = s[e] + m.bias.f32()[e];
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return biased[a] > biased[b]; });
  double total = 0;
  for (int j = 0; j < c.top_k; ++j) total += s[order[j]];
  if (picked) picked->assign(order.begin(), order.begin() + c.top_k);
  const bool latent = c.moe_kind == MoeKind::Latent;
  const Vec z = latent ? matvec(m.down, x) : x;
  Vec u(z.size(), 0.0);
  for (int j = 0; j < c.top_k; ++j) {
    const ExpertRef& e = m.experts[order[j]];
    Vec y;
    if (c.expert_format == ExpertFormat::Dense) {
      y = glu(e.d1, e.d3, e.d2, z, c);
    } else {
      const Vec g = mx_matvec(e.w1, z), up = mx_matvec(e.w3, z);
      Vec a(g.size());
      for (size_t i = 0; i < a.size(); ++i) a[i] = act(c, g[i], up[i]);
      y = mx_matvec(e.w2, a);
    }
    for (size_t i = 0; i < u.size(); ++i) u[i] += c.routed_scale * s[order[j]] / total * y[i];
  }
  Vec y = !latent ? u : matvec(m.up, c.latent_norm ? rms(u, m.norm, c.rms_eps) : u);
  if (c.n_shared == 0) return y;
  const Vec sh = glu(m.shared_gate, m.shared_up, m.shared_down, x, c);
  for (size_t i = 0; i < y.size(); ++i) y[i] += sh[i];
  return y;
}

}  // namespace

std::vector<double> reference_forward(const Model& m, const std::vector<int>& ids, std::vector<double>* trace,
                                      std::vector<std::vector<std::vector<int>>>* routes) {
  const Config& c = m.config;
  const ModelWeights& w = m.weights;
  const int L = c.n_layers, D = c.hidden;
  std::vector<KdaHistory> kh(L);
  std::vector<MlaHistory> mh(L);
  std::vector<double> logits;
  if (trace) trace->clear();
  if (routes) routes->clear();
  for (int id : ids) {
    if (routes) routes->emplace_back(size_t(L));
    Vec P = row(w.embed, id);
    std::vector<Vec> blocks;
    for (int i = 0; i < L; ++i) {
      const LayerWeights& l = w.layers[i];
      auto with_p = [&] { auto e = blocks; e.push_back(P); return e; };
      const bool attnres = c.residual == Residual::AttnRes;
      const Vec h = blocks.empty() ? P : mix(with_p(), l.attn_res_norm, l.attn_res_proj, c.rms_eps);
      if (attnres && i % c.attn_res_block == 0) blocks.push_back(P), P.assign(D, 0.0);
      const Vec xa = rms(h, l.input_norm, c.rms_eps);
      const Vec a = c.layers[i].mixer == Mixer::KDA ? kda(c, l.kda, kh[i], xa) : mla(c, l.mla, mh[i], xa);
      for (int j = 0; j < D; ++j) P[j] += a[j];
      const Vec xm = rms(attnres ? mix(with_p(), l.mlp_res_norm, l.mlp_res_proj, c.rms_eps) : P, l.post_norm, c.rms_eps);
      const Vec f = c.layers[i].ffn == Ffn::Dense ? glu(l.mlp.gate, l.mlp.up, l.mlp.down, xm, c)
                                                      : moe(c, l.moe, xm, routes ? &routes->back()[size_t(i)] : nullptr);
      for (int j = 0; j < D; ++j) P[j] += f[j];
      if (trace) trace->insert(trace->end(), P.begin(), P.end());
    }
    blocks.push_back(P);
    const Vec out = rms(c.residual == Residual::AttnRes ? mix(blocks, w.out_res_norm, w.out_res_proj, c.rms_eps) : P,
                        w.final_norm, c.rms_eps);
    const Vec lg = matvec(w.lm_head, out);
    logits.insert(logits.end(), lg.begin(), lg.end());
  }
  return logits;
}

}  // namespace wren::test
