// CUDA backend: the chunked (parallel-within-chunk) form of the KDA core for prefill (issue 6,
// docs/gpu-method.md#kda-chunked). Private to src/backends/cuda; kda.cu chooses between it and the
// token-by-token kernel (see kda.cu's header for the selection and WREN_CUDA_KDA).
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace wren {
namespace cuda {

/// Inputs of one kda_core call on the device. Layouts as ops/backend.h: q, k, v, z, gate,
/// out [T, P] (P = H·d); beta [T, H] logits; S [H, d, d] as S[key][value]; conv windows
/// [3, P, K-1] oldest first; conv weights [P, K] with tap K-1 = the current token.
struct KdaChunkArgs {
  const float *q, *k, *v, *z, *beta, *gate;                         ///< activations
  const float *q_conv, *k_conv, *v_conv, *a_log, *dt_bias, *o_norm;  ///< weights
  float *S, *conv, *out;                                            ///< state (advanced), output
  int H, d, K, T;
  float lower, eps;
  bool softplus_gate;  ///< Kimi Linear: g = -exp(A)·softplus(z); K3: g = lower·σ(exp(A)·z)
};

/// e^g of a cumulative log decay, as each intra-chunk kernel keeps G: f64 (exp in f64, rounded
/// once: the f32 kernels) or f32 (the tensor-core kernels, fast mode only, for every decay factor,
/// g <= 0): __expf, i.e. 2^(g·log2 e) by ex2.approx, relative error about 2^-21 + 2^-22·|g|, two
/// instructions where expf is a library sequence of about twenty under the exact-f32 build flags
/// (-fmad=false, -ftz=false). The diagonal blocks take one per (t, i, r): with expf they were half
/// of the intra kernel's instructions (Nsight Compute, 2026-12-04). Far below TF32's 2^-11.
__device__ inline float kda_decay_exp(double g) { return float(exp(g)); }
__device__ inline float kda_decay_exp(float g) { return __expf(g); }

/// x rounded to TF32 (cvt.rna: 10-bit mantissa, ties away from zero), kept as an f32 whose low 13
/// bits are zero: an mma.sync .tf32 operand that needs no conversion where it is read, and that
/// rounds to itself (the fast-mode chunk passes store their state-pass operands this way).
__device__ __forceinline__ float kda_tf32_round(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

/// The tail both intra-chunk kernels share (kda_chunked.cu, kda_chunked_mma.cu): the UT solve, one
/// column per thread, forward substitution with the unit lower-triangular L = I + A (Am [C][C],
/// strictly lower, × β_t) in place on the [C][ld] tiles: columns 0..d-1 of W (rhs β_t k_t γ_t from
/// ks) then d of U (rhs β_t v_t from vs); then, after a barrier, W → gl and U → vc at rows
/// base + t·P (t < n). kFma: each substitution term as one fmaf (tensor-core kernel) or a multiply
/// then a subtraction (the f32 kernel, built with -fmad=false). kRoundW: W is stored rounded to TF32
/// (kda_tf32_round; the tensor-core state pass reads it as an operand only). Called by every thread of the block.
template <class GT, bool kFma, bool kRoundW = false>
__device__ inline void kda_ut_solve_store(int n, int d, int C, int ld, const GT* G, const float* b, const float* Am,
                                          float* ks, float* vs, float* gl, float* vc, size_t base, int P) {
  for (int j = threadIdx.x; j < 2 * d; j += blockDim.x) {
    const bool w = j < d;
    float* X = w ? ks : vs;
    const int col = w ? j : j - d;
    for (int t = 0; t < n; ++t) {
      float x = w ? b[t] * (X[t * ld + col] * kda_decay_exp(G[t * ld + col])) : b[t] * X[t * ld + col];
      for (int i = 0; i < t; ++i) {
        if constexpr (kFma) x = fmaf(-Am[t * C + i], X[i * ld + col], x);
        else x -= Am[t * C + i] * X[i * ld + col];
      }
      X[t * ld + col] = x;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n * d; i += blockDim.x) {
    const int t = i / d, r = i % d;
    const size_t at = base + size_t(t) * P + r;
    gl[at] = kRoundW ? kda_tf32_round(ks[t * ld + r]) : ks[t * ld + r];
    vc[at] = vs[t * ld + r];
  }
}

/// Chunk length for head_dim d: the largest of 64, 32, 16 that is <= `want` and whose
/// chunk kernels (the f32 ones, or with `tensor_cores` those of kda_chunked_mma.cu) fit in
/// `max_smem` bytes of shared memory; 0 when none fits (the caller then runs the token-by-token kernel).
int kda_chunk_fit(int d, int want, int max_smem, bool tensor_cores = false);

/// Shared memory (bytes) the tensor-core chunk passes need at head_dim d, chunk C (single-buffered
/// state pass; it double-buffers when that fits too).
size_t kda_mma_smem(int d, int C);

/// The intra-chunk and state passes on tensor cores (kda_chunked_mma.cu; fast precision mode):
/// same inputs, outputs and scratch layout as kda_chunked.cu's f32 kernels (qn, kn, vc, gl [T, P]
/// in, rewritten to q̃, k̂, U, W; bs [T, H]; Qm [chunks, H, C, C]; egc [chunks, P]); advances S
/// [H, d, d] and writes the raw (pre-norm) output out [T, P]. C is 16, 32 or 64. Throws wren::Error
/// for any other C.
void kda_chunk_passes_mma(CudaBackend::Impl& m, int T, int H, int d, int C, float* qn, float* kn, float* vc,
                          float* gl, const float* bs, float* Qm, float* egc, float* S, float* out);

/// Runs the KDA core for a.T >= 1 tokens in the chunked form with chunk length C (from
/// kda_chunk_fit): 5 launches on m's stream, scratch from m.scores. Same outputs, final S and
/// conv windows as the recurrence up to f32 rounding (conv windows bit-identical); in fast
/// precision mode (m.opts.precision) the two chunk passes run on tensor cores with TF32 operands
/// (kda_chunk_passes_mma: rel-L2 ~1e-3 instead of ~1e-6; conv windows still bit-identical).
void kda_chunked(CudaBackend::Impl& m, const KdaChunkArgs& a, int C);

}  // namespace cuda
}  // namespace wren
