// CPU backend: the KDA token recurrence (docs/model.md#kda, steps 2-7).
// Layout: q, k, v [T, P] pre-conv; conv window [3, P, K-1] oldest first; S [H, d, d] as
// S[key][value]; conv weights [P, K] per q/k/v with tap K-1 = current token.
// Threads: first the conv + SiLU per channel over the chunk's tokens (a channel's window advances
// in token order), then one task per head running every token in order on that head's own S_h.
// The delta-rule step is the one kernel per level (scalar reference: four passes as written in
// the spec; SIMD: two fused passes over S, vectorised along the value index).
#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/simd.h"
#include "core/kda_math.h"

namespace wren {

namespace cpu {

void delta_step_scalar(float* S, const float* q, const float* k, const float* v, const float* alpha,
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

#if WREN_X86
WREN_AVX512 void delta_step_avx512(float* S, const float* q, const float* k, const float* v,
                                   const float* alpha, float beta, int d, float* u, float* o) {
  for (int c = 0; c < d; c += 16) _mm512_mask_storeu_ps(u + c, lanes16(d - c), _mm512_setzero_ps());
  for (int r = 0; r < d; ++r) {  // S ← Diag(α) S; u = kᵀS
    const __m512 a = _mm512_set1_ps(alpha[r]), kr = _mm512_set1_ps(k[r]);
    for (int c = 0; c < d; c += 16) {
      const __mmask16 m = lanes16(d - c);
      const __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, S + r * d + c), a);
      _mm512_mask_storeu_ps(S + r * d + c, m, s);
      _mm512_mask_storeu_ps(u + c, m, _mm512_fmadd_ps(kr, s, _mm512_maskz_loadu_ps(m, u + c)));
    }
  }
  const __m512 b = _mm512_set1_ps(beta);
  for (int c = 0; c < d; c += 16) {
    const __mmask16 m = lanes16(d - c);
    _mm512_mask_storeu_ps(u + c, m, _mm512_mul_ps(b, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, v + c), _mm512_maskz_loadu_ps(m, u + c))));
    _mm512_mask_storeu_ps(o + c, m, _mm512_setzero_ps());
  }
  for (int r = 0; r < d; ++r) {  // S += k ⊗ u; o = qᵀS
    const __m512 kr = _mm512_set1_ps(k[r]), qr = _mm512_set1_ps(q[r]);
    for (int c = 0; c < d; c += 16) {
      const __mmask16 m = lanes16(d - c);
      const __m512 s = _mm512_fmadd_ps(kr, _mm512_maskz_loadu_ps(m, u + c), _mm512_maskz_loadu_ps(m, S + r * d + c));
      _mm512_mask_storeu_ps(S + r * d + c, m, s);
      _mm512_mask_storeu_ps(o + c, m, _mm512_fmadd_ps(qr, s, _mm512_maskz_loadu_ps(m, o + c)));
    }
  }
}

WREN_AVX2 void delta_step_avx2(float* S, const float* q, const float* k, const float* v,
                               const float* alpha, float beta, int d, float* u, float* o) {
  for (int c = 0; c < d; c += 8) _mm256_maskstore_ps(u + c, lanes8(d - c), _mm256_setzero_ps());
  for (int r = 0; r < d; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]), kr = _mm256_set1_ps(k[r]);
    for (int c = 0; c < d; c += 8) {
      const __m256i m = lanes8(d - c);
      const __m256 s = _mm256_mul_ps(_mm256_maskload_ps(S + r * d + c, m), a);
      _mm256_maskstore_ps(S + r * d + c, m, s);
      _mm256_maskstore_ps(u + c, m, _mm256_fmadd_ps(kr, s, _mm256_maskload_ps(u + c, m)));
    }
  }
  const __m256 b = _mm256_set1_ps(beta);
  for (int c = 0; c < d; c += 8) {
    const __m256i m = lanes8(d - c);
    _mm256_maskstore_ps(u + c, m, _mm256_mul_ps(b, _mm256_sub_ps(_mm256_maskload_ps(v + c, m), _mm256_maskload_ps(u + c, m))));
    _mm256_maskstore_ps(o + c, m, _mm256_setzero_ps());
  }
  for (int r = 0; r < d; ++r) {
    const __m256 kr = _mm256_set1_ps(k[r]), qr = _mm256_set1_ps(q[r]);
    for (int c = 0; c < d; c += 8) {
      const __m256i m = lanes8(d - c);
      const __m256 s = _mm256_fmadd_ps(kr, _mm256_maskload_ps(u + c, m), _mm256_maskload_ps(S + r * d + c, m));
      _mm256_maskstore_ps(S + r * d + c, m, s);
      _mm256_maskstore_ps(o + c, m, _mm256_fmadd_ps(qr, s, _mm256_maskload_ps(o + c, m)));
    }
  }
}
#endif

}  // namespace cpu

namespace {

/// Causal depthwise conv + SiLU of one channel over T tokens (x, y strided by P); shifts the window.
void conv_silu_channel(const float* x, int P, int T, const float* wc, float* win, int K, float* y) {
  for (int t = 0; t < T; ++t) {
    const float xt = x[size_t(t) * P];
    y[size_t(t) * P] = kda::conv_silu(wc, K, xt, kda::WindowTaps{win});
    kda::conv_push(win, K, xt);
  }
}

/// v / sqrt(Σ v² + 1e-6) · scale (the 1e-6 is inside the root of the SUM; docs/model.md#kda, step 3).
void l2_normalize(float* v, int n, float scale) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(v[i]) * v[i];
  const float inv = kda::l2_factor(ss, scale);
  for (int i = 0; i < n; ++i) v[i] *= inv;
}

}  // namespace

void CpuBackend::kda_head(const KdaParams& p, const KdaWeights& w, KdaState& s, float* y, int h,
                          const float* z, const float* beta, const float* gate, int T, float* out,
                          cpu::Scratch& sc) {
  const int H = p.heads, d = p.head_dim, P = H * d;
  const size_t TP = size_t(T) * P;
  float* alpha = sc.f(0, d);
  float* u = sc.f(1, d);
  float* o = sc.f(2, d);
  const float qscale = 1.0f / std::sqrt(float(d));
  const float a = std::exp(w.a_log.f32()[h]);
  for (int t = 0; t < T; ++t) {
    // q and k are normalized in place: each head owns its slice of the op's buffer.
    float* q = y + size_t(t) * P + h * d;
    float* k = q + TP;
    const float* v = q + 2 * TP;
    l2_normalize(q, d, qscale);
    l2_normalize(k, d, 1.0f);
    for (int r = 0; r < d; ++r) {
      const int c = h * d + r;
      const float zc = z[size_t(t) * P + c] + w.dt_bias.f32()[c];
      alpha[r] = std::exp(kda::log_decay(p.gate == KdaGate::Softplus, a, zc, p.gate_lower_bound));
    }
    const float b = kda::beta_gate(beta[size_t(t) * H + h]);
    k_->delta_step(s.S + size_t(h) * d * d, q, k, v, alpha, b, d, u, o);
    float* oh = out + size_t(t) * P + h * d;
    cpu::rms_row(o, w.o_norm.f32(), d, p.eps, oh);
    for (int r = 0; r < d; ++r) oh[r] *= cpu::sigmoid(gate[size_t(t) * P + h * d + r]);
  }
}

void CpuBackend::kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* qin,
                          const float* kin, const float* vin, const float* z, const float* beta,
                          const float* gate, int T, float* out) {
  const int H = p.heads, d = p.head_dim, P = H * d, K = p.conv_kernel;
  float* y = shared_.f(0, 3 * size_t(T) * P);  // [3][T][P]: conv + SiLU outputs of q, k, v
  const DenseWeight* convs[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
  const float* ins[3] = {qin, kin, vin};
  constexpr int kChannels = 256;  // channels per conv task
  const int tasks = (3 * P + kChannels - 1) / kChannels;
  parallel(tasks, 3.0 * P * T * K, [&](int i, int) {
    for (int c = i * kChannels; c < std::min(3 * P, (i + 1) * kChannels); ++c) {
      const int m = c / P, ch = c % P;
      conv_silu_channel(ins[m] + ch, P, T, convs[m]->f32() + size_t(ch) * K,
                        s.conv + (size_t(m) * P + ch) * (K - 1), K, y + size_t(m) * T * P + ch);
    }
  });
  parallel(H, 4.0 * H * d * d * T, [&](int h, int th) {
    kda_head(p, w, s, y, h, z, beta, gate, T, out, local_[th]);
  });
}

}  // namespace wren
