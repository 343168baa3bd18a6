// CPU backend: gated NoPE MLA, absorbed form over the latent cache (spec kimi-k3.md §4.3).
// Layout: q [T, H, nope+extra]; ckv [T, kv_lora+extra]; cache rows [kv_lora normed latent | extra
// raw key]; kv_b [H*(nope+v), kv_lora] with per head rows [k_nope (nope) | v (v_head)].
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

namespace wren {

void CpuBackend::mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& cache, const float* q,
                            const float* ckv, int T, float* ctx) {
  const int W = p.kv_lora + p.extra, qh = p.nope + p.extra, kvh = p.nope + p.v_head;
  const float scale = 1.0f / std::sqrt(float(qh));
  const float* kvb = w.kv_b.f32();
  std::vector<float> q_abs(p.kv_lora), cbar(p.kv_lora), scores;
  for (int t = 0; t < T; ++t) {
    check(cache.length < cache.capacity,
          "context limit reached: the MLA cache holds " + std::to_string(cache.capacity) +
              " tokens (raise --ctx)");
    float* row = cache.kv + size_t(cache.length) * W;
    const float* in = ckv + size_t(t) * W;
    cpu::rms_row(in, w.kv_a_norm.f32(), p.kv_lora, p.latent_eps, row);
    for (int j = 0; j < p.extra; ++j) row[p.kv_lora + j] = in[p.kv_lora + j];
    const int n = ++cache.length;
    scores.resize(n);
    for (int h = 0; h < p.heads; ++h) {
      const float* qn = q + (size_t(t) * p.heads + h) * qh;
      const float* qx = qn + p.nope;
      // q_abs[j] = Σ_d q_nope[d] · W_kvb[h·kvh + d, j]
      for (int j = 0; j < p.kv_lora; ++j) q_abs[j] = 0;
      for (int dd = 0; dd < p.nope; ++dd) {
        const float* wr = kvb + (size_t(h) * kvh + dd) * p.kv_lora;
        for (int j = 0; j < p.kv_lora; ++j) q_abs[j] += qn[dd] * wr[j];
      }
      float mx = -INFINITY;
      for (int s = 0; s < n; ++s) {
        const float* c = cache.kv + size_t(s) * W;
        scores[s] = (cpu::dot(q_abs.data(), c, p.kv_lora) + cpu::dot(qx, c + p.kv_lora, p.extra)) * scale;
        mx = std::max(mx, scores[s]);
      }
      double sum = 0;
      for (int s = 0; s < n; ++s) sum += (scores[s] = std::exp(scores[s] - mx));
      for (int j = 0; j < p.kv_lora; ++j) cbar[j] = 0;
      for (int s = 0; s < n; ++s) {
        const float pr = float(scores[s] / sum);
        const float* c = cache.kv + size_t(s) * W;
        for (int j = 0; j < p.kv_lora; ++j) cbar[j] += pr * c[j];
      }
      float* out = ctx + (size_t(t) * p.heads + h) * p.v_head;
      for (int dd = 0; dd < p.v_head; ++dd)
        out[dd] = cpu::dot(kvb + (size_t(h) * kvh + p.nope + dd) * p.kv_lora, cbar.data(), p.kv_lora);
    }
  }
}

}  // namespace wren
