// CPU backend: RMSNorm and the AttnRes mix (docs/model.md#attnres).
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace wren {

namespace cpu {
void rms_row(const float* x, const float* w, int n, float eps, float* y) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}
}  // namespace cpu

void CpuBackend::rms_norm(const float* x, int T, int n, const DenseWeight& w, float eps, float* y) {
  for (int t = 0; t < T; ++t) cpu::rms_row(x + size_t(t) * n, w.f32(), n, eps, y + size_t(t) * n);
}

void CpuBackend::attnres_mix(const float* const* entries, int n_entries, int T, int D,
                             const DenseWeight& w, float eps, float* out) {
  std::vector<double> score(n_entries);
  const float* wv = w.f32();
  for (int t = 0; t < T; ++t) {
    double mx = -INFINITY;
    for (int e = 0; e < n_entries; ++e) {
      const float* v = entries[e] + size_t(t) * D;
      double dotw = 0, ss = 0;
      for (int i = 0; i < D; ++i) {
        dotw += double(v[i]) * wv[i];
        ss += double(v[i]) * v[i];
      }
      score[e] = dotw / std::sqrt(ss / D + eps);
      mx = std::max(mx, score[e]);
    }
    double sum = 0;
    for (int e = 0; e < n_entries; ++e) sum += (score[e] = std::exp(score[e] - mx));
    float* o = out + size_t(t) * D;
    for (int i = 0; i < D; ++i) o[i] = 0;
    for (int e = 0; e < n_entries; ++e) {
      const float p = float(score[e] / sum);
      const float* v = entries[e] + size_t(t) * D;
      for (int i = 0; i < D; ++i) o[i] += p * v[i];
    }
  }
}

}  // namespace wren
