// CPU backend: gated NoPE MLA, absorbed form over the latent cache (spec kimi-k3.md §4.3).
// Layout: q [T, H, nope+extra]; ckv [T, kv_lora+extra]; cache rows [kv_lora normed latent | extra
// raw key]; kv_b [H*(nope+v), kv_lora] in any WFormat with per head rows [k_nope (nope) | v (v_head)].
// The chunk's tokens are appended to the cache first (a row depends only on its own token); then
// every (token, head) pair is one task attending over the rows up to and including its token, so
// the result equals token-by-token decoding. Scores, softmax weights and the latent context use
// the level's dot/axpy kernels, the value rows of kv_b its GEMV kernel (scalar = the reference
// order in both).
#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "ops/weights.h"

namespace wren {

namespace {
/// Row r of W as f32: the weight itself when F32, else decoded into buf [W.cols].
const float* row_f32(const DenseWeight& W, int64_t r, float* buf) {
  if (W.format == WFormat::F32) return W.f32() + r * W.cols;
  dequant_row(W, r, buf);
  return buf;
}
}  // namespace

void CpuBackend::mla_head(const MlaParams& p, const MlaWeights& w, const MlaCache& cache, const float* q,
                          int t, int h, int n, float* ctx, cpu::Scratch& sc) {
  const int W = p.kv_lora + p.extra, qh = p.nope + p.extra, kvh = p.nope + p.v_head;
  const float scale = 1.0f / std::sqrt(float(qh));
  float* q_abs = sc.f(0, p.kv_lora);
  float* cbar = sc.f(1, p.kv_lora);
  float* rowbuf = sc.f(2, p.kv_lora);
  float* scores = sc.f(3, n);
  const float* qn = q + (size_t(t) * p.heads + h) * qh;
  const float* qx = qn + p.nope;
  // q_abs[j] = Σ_d q_nope[d] · W_kvb[h·kvh + d, j]
  std::fill(q_abs, q_abs + p.kv_lora, 0.0f);
  for (int dd = 0; dd < p.nope; ++dd)
    k_->axpy(qn[dd], row_f32(w.kv_b, int64_t(h) * kvh + dd, rowbuf), q_abs, p.kv_lora);
  float mx = -INFINITY;
  for (int s = 0; s < n; ++s) {
    const float* c = cache.kv + size_t(s) * W;
    scores[s] = (k_->dot(q_abs, c, p.kv_lora) + k_->dot(qx, c + p.kv_lora, p.extra)) * scale;
    mx = std::max(mx, scores[s]);
  }
  double sum = 0;
  for (int s = 0; s < n; ++s) sum += (scores[s] = std::exp(scores[s] - mx));
  std::fill(cbar, cbar + p.kv_lora, 0.0f);
  for (int s = 0; s < n; ++s) k_->axpy(float(scores[s] / sum), cache.kv + size_t(s) * W, cbar, p.kv_lora);
  // ctx_h = W_kvb[v rows of head h] · c̄: a GEMV over those rows in kv_b's own format.
  float* vout = sc.f(4, size_t(w.kv_b.rows));
  const int r0 = h * kvh + p.nope;
  k_->dense[size_t(w.kv_b.format)](w.kv_b, cbar, 1, vout, 0, r0, r0 + p.v_head);
  std::copy(vout + r0, vout + r0 + p.v_head, ctx + (size_t(t) * p.heads + h) * p.v_head);
}

void CpuBackend::mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& cache, const float* q,
                            const float* ckv, int T, float* ctx) {
  const int W = p.kv_lora + p.extra;
  check(cache.length + T <= cache.capacity,
        "context limit reached: the MLA cache holds " + std::to_string(cache.capacity) +
            " tokens (raise --ctx)");
  const int base = cache.length;
  for (int t = 0; t < T; ++t) {
    float* row = cache.kv + size_t(base + t) * W;
    const float* in = ckv + size_t(t) * W;
    cpu::rms_row(in, w.kv_a_norm.f32(), p.kv_lora, p.latent_eps, row);
    for (int j = 0; j < p.extra; ++j) row[p.kv_lora + j] = in[p.kv_lora + j];
  }
  cache.length += T;
  const double per_head = double(p.kv_lora) * (p.nope + p.v_head) + 2.0 * W * (base + T);
  parallel(T * p.heads, per_head * T * p.heads, [&](int i, int th) {
    const int t = i / p.heads, h = i % p.heads;
    mla_head(p, w, cache, q, t, h, base + t + 1, ctx, local_[th]);
  });
}

}  // namespace wren
