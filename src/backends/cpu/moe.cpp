// CPU backend: sigmoid router with biased top-k, and one routed expert on the packed MXFP4 layout
// (spec kimi-k3.md §4.4, §5).
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/mxfp4.h"

namespace wren {

namespace cpu {
void mx_gemv(const MxMatrix& m, const float* x, float* y) {
  const int groups = m.cols / mxfp4::kGroup, row_bytes = m.cols / 2;
  for (int r = 0; r < m.rows; ++r) {
    const uint8_t* pk = m.packed + size_t(r) * row_bytes;
    const uint8_t* sc = m.scale + size_t(r) * groups;
    float acc = 0;
    for (int g = 0; g < groups; ++g) {
      float part = 0;  // Σ e2m1 · x over the group, then one exact power-of-two scale
      for (int j = 0; j < mxfp4::kGroup; ++j) {
        const int c = g * mxfp4::kGroup + j;
        part += mxfp4::kE2M1[mxfp4::code_at(pk, c)] * x[c];
      }
      acc += part * mxfp4::scale_value(sc[g]);
    }
    y[r] = acc;
  }
}
}  // namespace cpu

void CpuBackend::router_topk(const float* logits, const DenseWeight& bias, int T, int E, int k,
                             int* ids, float* weights) {
  std::vector<float> s(E), biased(E);
  std::vector<char> taken(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      s[e] = cpu::sigmoid(logits[size_t(t) * E + e]);
      biased[e] = s[e] + bias.f32()[e];
      taken[e] = 0;
    }
    float total = 0;
    for (int j = 0; j < k; ++j) {  // strict '>' scan: ties go to the lower id
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || biased[e] > biased[best])) best = e;
      taken[best] = 1;
      ids[size_t(t) * k + j] = best;
      total += s[best];
    }
    for (int j = 0; j < k; ++j)
      weights[size_t(t) * k + j] = s[ids[size_t(t) * k + j]] / (total + 1e-20f);
  }
}

void CpuBackend::expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) {
  std::vector<float> g(e.w1.rows), u(e.w3.rows);
  cpu::mx_gemv(e.w1, z, g.data());
  cpu::mx_gemv(e.w3, z, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::situ(g[i], u[i], b1, b2);
  cpu::mx_gemv(e.w2, g.data(), y);
}

void CpuBackend::weighted_sum(const float* ys, const float* weights, int m, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] = 0;
  for (int j = 0; j < m; ++j)
    for (int i = 0; i < n; ++i) y[i] += weights[j] * ys[size_t(j) * n + i];
}

}  // namespace wren
