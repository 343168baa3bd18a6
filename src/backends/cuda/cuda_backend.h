// The CUDA backend: every op of backends/backend.h on one NVIDIA GPU (built for sm_90), with
// device-resident weights, activations and sequence state. Plain C++ header (no CUDA types), so
// the factory, the CLI and the tests include it from ordinary .cpp files.
//
// Memory: every buffer from alloc() is device memory (cudaMalloc, never managed memory). Weights
// are mirrored once by upload(): each DenseWeight's bytes as stored in its WFormat (f32, bf16,
// int8 or Q4_G64 groups; model/weights.h) plus, for Q8_ROW / Q4_G64, its f32 scale array as a
// second tensor keyed by the scale's host pointer, and each expert's MXFP4
// packed [rows, cols/2] and ue8m0 scale [rows, cols/32] bytes exactly as stored; ops find the
// device copy through a host-pointer -> device-pointer map. The map is only as fresh as the last
// upload: model weights are immutable while their Model lives, and every upload() re-copies a
// tensor it already knows, so a host address reused by new data is refreshed, never served stale
// (gpu-backend.md lesson 11). An op handed a weight that was never uploaded throws rather than
// reading host memory. Host-side inputs of the interface (token ids, router
// outputs, expert weights) stay host memory as backend.h says.
//
// Numerics ("exact mode", gpu-backend.md §3.5): f32 activations, f32 accumulation in the CPU
// reference's order wherever that order is cheap to reproduce (the 8-accumulator dot of gemm and
// MLA, the per-group MXFP4 sums, the KDA column recurrences, the mix sums), f64 for the RMS means
// and AttnRes scores; built without fast math, flush-to-zero or FMA contraction; exp/tanh evaluated
// in f64 and rounded to f32 (glibc's expf is within 0.502 ulp, so this agrees with the CPU far more
// often than CUDA's 2-ulp expf). Kernels live by family: gemm.cu (embed, gemm), gemm_quant.cu (gemm
// and row decode on BF16 / Q8_ROW / Q4_G64 weights, f32 accumulation, not CPU order), norm.cu (rms_norm,
// attnres_mix), elementwise.cu, kda.cu, mla.cu, moe.cu (router, expert_ffn, weighted_sum).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"

namespace wren {

/// Counters of one CudaBackend, for tests and reports ("prove the GPU did the work", §3.7).
struct CudaStats {
  uint64_t launches = 0;         ///< kernel launches
  uint64_t host_syncs = 0;       ///< stream synchronizations the host waited for
  uint64_t uploaded_bytes = 0;   ///< weight bytes copied to the device by upload()
  uint64_t resident_tensors = 0; ///< distinct host tensors with a device copy
  uint64_t expert_calls = 0;     ///< expert_ffn calls
};

/// The CUDA implementation of Backend. Construction selects the device and creates the compute
/// stream; throws wren::Error("no CUDA device: ...") when there is none.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }

  /// Mirrors every dense weight and every routed expert of `w` to device memory (one arena).
  /// Throws wren::Error when a packed dense weight lacks its scale or device memory runs out.
  void upload(const ModelWeights& w);
  /// Mirrors one dense weight's current contents, any WFormat (data, and scale when it has one; a
  /// repeated call refreshes the device copy).
  void upload(const DenseWeight& w);
  /// Mirrors one expert's packed/scale bytes (a repeated call refreshes the device copy).
  void upload(const ExpertRef& e);
  /// Counters so far.
  CudaStats stats() const;
  /// Waits for all queued device work (timing, tests).
  void synchronize();
  /// Fault injection (tests of the CPU fallback): the kernel launch numbered `at_launch` (counting
  /// from 1 over the backend's life, as CudaStats::launches) throws DeviceError; 0 turns it off.
  /// The environment variable WREN_CUDA_FAULT_AT=N sets it at construction.
  void inject_fault(uint64_t at_launch);

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

  struct Impl;  ///< device, stream, weight map, scratch, counters (cuda_common.cuh)

 private:
  std::unique_ptr<Impl> impl_;
};

/// True when a CUDA device can be used; otherwise false with the reason in *why (e.g. the
/// cudaGetDeviceCount error string, or "0 devices").
bool cuda_device_available(std::string* why);

}  // namespace wren
