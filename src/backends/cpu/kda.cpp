// CPU backend: the KDA token recurrence (spec kimi-k3.md §4.2 steps 2-7), token by token.
// Layout: q, k, v [T, P] pre-conv; conv window [3, P, K-1] oldest first; S [H, d, d] as
// S[key][value]; conv weights [P, K] per q/k/v with tap K-1 = current token.
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace wren {

namespace {

/// Causal depthwise conv + SiLU for one token over `n` channels; shifts the window.
void conv_silu(const float* x, const float* wconv, float* win, int n, int K, float* y) {
  for (int c = 0; c < n; ++c) {
    const float* wc = wconv + size_t(c) * K;
    float* wi = win + size_t(c) * (K - 1);
    float acc = wc[K - 1] * x[c];
    for (int j = 0; j < K - 1; ++j) acc += wc[j] * wi[j];
    for (int j = 0; j + 1 < K - 1; ++j) wi[j] = wi[j + 1];
    if (K > 1) wi[K - 2] = x[c];
    y[c] = acc * cpu::sigmoid(acc);
  }
}

/// v / sqrt(Σ v² + 1e-6) · scale (the 1e-6 is inside the root of the SUM; spec §4.2 step 3).
void l2_normalize(float* v, int n, float scale) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(v[i]) * v[i];
  const float inv = float(1.0 / std::sqrt(ss + 1e-6)) * scale;
  for (int i = 0; i < n; ++i) v[i] *= inv;
}

/// One head's delta-rule step: decay rows, read u = kᵀS, write k ⊗ β(v − u), read o = qᵀS.
void delta_step(float* S, const float* q, const float* k, const float* v, const float* alpha,
                float beta, int d, float* u, float* o) {
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < d; ++c) S[r * d + c] *= alpha[r];
  for (int c = 0; c < d; ++c) u[c] = 0;
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < d; ++c) u[c] += k[r] * S[r * d + c];
  for (int c = 0; c < d; ++c) u[c] = beta * (v[c] - u[c]);
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < d; ++c) S[r * d + c] += k[r] * u[c];
  for (int c = 0; c < d; ++c) o[c] = 0;
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < d; ++c) o[c] += q[r] * S[r * d + c];
}

}  // namespace

void CpuBackend::kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* qin,
                          const float* kin, const float* vin, const float* z, const float* beta,
                          const float* gate, int T, float* out) {
  const int H = p.heads, d = p.head_dim, P = H * d, K = p.conv_kernel;
  std::vector<float> y(3 * size_t(P)), alpha(d), u(d), o(d);
  const float qscale = 1.0f / std::sqrt(float(d));
  const DenseWeight* convs[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
  const float* ins[3] = {qin, kin, vin};
  for (int t = 0; t < T; ++t) {
    for (int m = 0; m < 3; ++m)
      conv_silu(ins[m] + size_t(t) * P, convs[m]->f32(), s.conv + size_t(m) * P * (K - 1), P, K,
                y.data() + size_t(m) * P);
    float* q = y.data();
    float* k = y.data() + P;
    const float* v = y.data() + 2 * size_t(P);
    for (int h = 0; h < H; ++h) {
      l2_normalize(q + h * d, d, qscale);
      l2_normalize(k + h * d, d, 1.0f);
      const float a = std::exp(w.a_log.f32()[h]);
      for (int r = 0; r < d; ++r) {
        const int c = h * d + r;
        const float zc = z[size_t(t) * P + c] + w.dt_bias.f32()[c];
        const float g = p.gate == KdaGate::LowerBound ? p.gate_lower_bound * cpu::sigmoid(a * zc)
                                                      : -a * (zc > 20.f ? zc : std::log1p(std::exp(zc)));
        alpha[r] = std::exp(g);
      }
      const float b = cpu::sigmoid(beta[size_t(t) * H + h]);
      delta_step(s.S + size_t(h) * d * d, q + h * d, k + h * d, v + h * d, alpha.data(), b, d,
                 u.data(), o.data());
      float* oh = out + size_t(t) * P + h * d;
      cpu::rms_row(o.data(), w.o_norm.f32(), d, p.eps, oh);
      for (int r = 0; r < d; ++r) oh[r] *= cpu::sigmoid(gate[size_t(t) * P + h * d + r]);
    }
  }
}

}  // namespace wren
