// CPU backend: sigmoid router with biased top-k, and the routed experts on the packed MXFP4 layout
// (docs/model.md#moe, #mxfp4). Layout: z [*, latent] rows picked by in_rows; ys [*, latent] rows
// written at out_rows; per expert w1/w3 [inter, latent], w2 [latent, inter] (kernels in
// gemv_mxfp4.cpp). A batch runs each expert once over all its tokens, experts spread over threads.
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"

namespace wren {

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

void CpuBackend::expert_group(const ExpertRef& e, const float* z, const int* in_rows, const int* out_rows,
                              int T, float b1, float b2, float* ys, cpu::Scratch& s) {
  const int L = e.w1.cols, I = e.w1.rows;
  const bool i8 = opts_.mx_int8_act;
  float* zt = s.f(0, size_t(T) * L);
  for (int t = 0; t < T; ++t) std::memcpy(zt + size_t(t) * L, z + size_t(in_rows[t]) * L, size_t(L) * 4);
  const cpu::MxRowsFn mx = i8 ? k_->mx_i8 : k_->mx_f32;
  const cpu::MxAct az = cpu::mx_prep(opts_.isa, zt, T, L, i8, s.f(1, size_t(T) * L), s.i8(0, size_t(T) * L),
                                     s.f(2, size_t(T) * L / 32));
  float* g = s.f(3, size_t(T) * I);
  float* u = s.f(4, size_t(T) * I);
  mx(e.w1, az, g, I, 0, I);
  mx(e.w3, az, u, I, 0, I);
  k_->situ(g, u, size_t(T) * I, b1, b2, g);
  const cpu::MxAct ag = cpu::mx_prep(opts_.isa, g, T, I, i8, s.f(5, size_t(T) * I), s.i8(1, size_t(T) * I),
                                     s.f(6, size_t(T) * I / 32));
  float* y = s.f(7, size_t(T) * L);
  mx(e.w2, ag, y, L, 0, L);
  for (int t = 0; t < T; ++t) std::memcpy(ys + size_t(out_rows[t]) * L, y + size_t(t) * L, size_t(L) * 4);
}

void CpuBackend::expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) {
  const int zero = 0;
  expert_group(e, z, &zero, &zero, 1, b1, b2, y, local_[0]);
}

void CpuBackend::expert_ffn_batch(const ExpertRef* const* experts, const int* in_rows, const int* out_rows,
                                  int n, const float* z, float b1, float b2, float* ys) {
  if (n <= 0) return;
  std::vector<int> start;  // runs of one expert: [start[i], start[i + 1])
  for (int j = 0; j < n; ++j)
    if (j == 0 || experts[j] != experts[j - 1]) start.push_back(j);
  start.push_back(n);
  const ExpertRef& e0 = *experts[0];
  const double work = 3.0 * e0.w1.rows * e0.w1.cols * n;
  parallel(int(start.size()) - 1, work, [&](int i, int th) {
    const int a = start[i], T = start[i + 1] - a;
    expert_group(*experts[a], z, in_rows + a, out_rows + a, T, b1, b2, ys, local_[th]);
  });
}

void CpuBackend::weighted_sum(const float* ys, const float* weights, int m, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] = 0;
  for (int j = 0; j < m; ++j)
    for (int i = 0; i < n; ++i) y[i] += weights[j] * ys[size_t(j) * n + i];
}

}  // namespace wren
