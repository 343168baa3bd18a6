// The CPU backend: the exact-f32 reference implementation of every op (see backends/backend.h).
// Kernels live by family: gemm.cpp, norm.cpp, kda.cpp, mla.cpp, moe.cpp.
#pragma once
#include <cmath>

#include "backends/backend.h"

namespace wren {

/// Reference backend: host memory, f32 activations, f64 for RMS means and AttnRes scores.
class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }

  float* alloc(size_t n) override;
  void release(float* p) override;
  void to_host(const float* src, size_t n, float* dst) override;
  void from_host(const float* src, size_t n, float* dst) override;
  void copy(const float* src, size_t n, float* dst) override;
  void fill_zero(float* p, size_t n) override;

  void embed(const DenseWeight& table, const int* ids, int T, float* x) override;
  void gemm(const DenseWeight& W, const float* x, int T, float* y) override;
  void rms_norm(const float* x, int T, int n, const DenseWeight& w, float eps, float* y) override;
  void add(float* y, const float* x, size_t n) override;
  void situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* out) override;
  void silu_glu(const float* g, const float* u, int T, int n, float* out) override;
  void sigmoid_gate(float* y, const float* gate, size_t n) override;

  void attnres_mix(const float* const* entries, int n_entries, int T, int D, const DenseWeight& w,
                   float eps, float* out) override;
  void kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* q, const float* k,
                const float* v, const float* z, const float* beta, const float* gate, int T,
                float* out) override;
  void mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& cache, const float* q,
                  const float* ckv, int T, float* ctx) override;
  void router_topk(const float* logits, const DenseWeight& bias, int T, int E, int k, int* ids,
                   float* weights) override;
  void expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) override;
  void weighted_sum(const float* ys, const float* weights, int m, int n, float* y) override;
};

namespace cpu {
/// f32 dot product with 8 partial sums (fixed order, so results are reproducible).
float dot(const float* a, const float* b, int n);
/// RMSNorm of one row: y = x / sqrt(mean(x²) + eps) ⊙ w, mean in f64.
void rms_row(const float* x, const float* w, int n, float eps, float* y);
/// σ(x).
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
/// SiTU-GLU of one pair (spec §4.4).
float situ(float g, float u, float b1, float b2);
/// y[rows] = M · x for one MXFP4 matrix, on the packed layout.
void mx_gemv(const MxMatrix& m, const float* x, float* y);
}  // namespace cpu

}  // namespace wren
