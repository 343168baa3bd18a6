// The CPU backend: every op of ops/backend.h on the host, in f32 activations. Built with the
// default options it is the exact reference (scalar kernels, one thread); with a SIMD level and
// threads it is the fast path, whose every output is still computed by one thread in a fixed
// order, so results never depend on the thread count or the chunk size.
// Kernels live by family: gemm.cpp (op entry, element-wise), gemv_*.cpp (one per weight format),
// vec.cpp, norm.cpp, kda.cpp, mla.cpp, moe.cpp; the table of one level in kernels.h.
#pragma once
#include <cmath>
#include <memory>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/thread_pool.h"
#include "ops/backend.h"

namespace wren {

namespace cpu {
struct Kernels;

/// Grow-only scratch buffers, reused across calls so steady-state calls do not allocate. A
/// pointer stays valid until the same slot is asked for with a larger size.
class Scratch {
 public:
  float* f(int slot, size_t n);
  int8_t* i8(int slot, size_t n);

 private:
  std::vector<std::vector<float>> f_;
  std::vector<std::vector<int8_t>> i8_;
};
}  // namespace cpu

/// CPU backend options (the numerics-changing ones are echoed by `wren run`).
struct CpuOptions {
  int threads = 1;                 ///< threads in all, the caller included (>= 1)
  cpu::Isa isa = cpu::Isa::Scalar; ///< kernel level; Scalar = the reference kernels
  bool mx_int8_act = false;        ///< MXFP4 experts on per-32-group int8 activations (approximate)
  /// Ops with fewer multiply-adds run on the calling thread (a pool wake-up costs more). Results
  /// do not depend on it; tests set 0 to drive every op through the pool.
  double min_parallel_work = 1 << 17;
};

/// Host backend: f32 activations, f64 for RMS means, L2 sums and AttnRes scores.
class CpuBackend final : public Backend {
 public:
  /// Throws wren::Error if `opts.isa` is not supported by this CPU or threads < 1.
  explicit CpuBackend(const CpuOptions& opts = {});
  ~CpuBackend() override;
  const char* name() const override { return "cpu"; }
  const CpuOptions& options() const { return opts_; }

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
  void expert_ffn_batch(const ExpertRef* const* experts, const int* in_rows, const int* out_rows,
                        int n, const float* z, float b1, float b2, float* ys) override;
  void weighted_sum(const float* ys, const float* weights, int m, int n, float* y) override;

 private:
  /// Runs f(task, thread) for task < n on the pool when `work` (multiply-adds) is worth it.
  template <class F>
  void parallel(int n, double work, F&& f);
  void expert_group(const ExpertRef& e, const float* z, const int* in_rows, const int* out_rows,
                    int T, float b1, float b2, float* ys, cpu::Scratch& s);
  void kda_head(const KdaParams& p, const KdaWeights& w, KdaState& s, float* y, int h,
                const float* z, const float* beta, const float* gate, int T, float* out,
                cpu::Scratch& sc);
  void mla_head(const MlaParams& p, const MlaWeights& w, const MlaCache& cache, const float* q,
                int t, int h, int n, float* ctx, cpu::Scratch& sc);

  CpuOptions opts_;
  const cpu::Kernels* k_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  cpu::Scratch shared_;              ///< buffers shared by all tasks of one op
  std::vector<cpu::Scratch> local_;  ///< [thread]: per-task buffers
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
/// y[rows] = M · x for one MXFP4 matrix, on the packed layout (the reference order).
void mx_gemv(const MxMatrix& m, const float* x, float* y);
}  // namespace cpu

template <class F>
void CpuBackend::parallel(int n, double work, F&& f) {
  if (work < opts_.min_parallel_work || opts_.threads == 1) {
    for (int i = 0; i < n; ++i) f(i, 0);
    return;
  }
  pool_->run(n, f);
}

}  // namespace wren
