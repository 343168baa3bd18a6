// CUDA backend: the KDA core in chunked (parallel-within-chunk) form, for prefill.
//
// The math is the spec's recurrence (docs/model.md#kda, step 6) rewritten per chunk; nothing else is
// assumed. The spec itself gives no chunked algorithm (docs/gpu-method.md#kda-chunked: colibri has none; "not
// bit-identical to the recurrence; it belongs to fast mode"); the rewrite below is the chunkwise
// form of the Kimi Linear paper (per-channel-decay gated delta rule, WY/UT form, as in fla's
// chunk_kda), derived here from the recurrence by unrolling it, so every step can be checked:
//
// Per head, per token t: S_t = Diag(α_t) S_{t-1} + k_t δ_tᵀ with δ_t = β_t (v_t − (Diag(α_t) S_{t-1})ᵀ k_t),
// o_t = S_tᵀ q_t. In a chunk of n tokens starting from S_0 let G_t = Σ_{i≤t} g_i (g = log α, per
// key channel, cumulated from the chunk start, so G_t ≤ 0) and γ_t = exp(G_t). Unrolling,
//   S_t = Diag(γ_t) S_0 + Σ_{i≤t} Diag(γ_t/γ_i) k_i δ_iᵀ,
// so with A_{t,i} = β_t Σ_r k_t[r] k_i[r] e^{G_t[r]−G_i[r]} (i < t) and k̃_t = k_t ⊙ γ_t:
//   δ_t + Σ_{i<t} A_{t,i} δ_i = β_t v_t − β_t S_0ᵀ k̃_t,
// a unit lower-triangular system L δ = Diag(β)(V − K̃ S_0). Solving it once per chunk for the two
// right-hand sides (UT transform) gives U = L⁻¹ Diag(β) V and W = L⁻¹ Diag(β) K̃, and then
//   δ = U − W S_0,
//   o_t = S_0ᵀ (q_t ⊙ γ_t) + Σ_{i≤t} Q_{t,i} δ_i,  Q_{t,i} = Σ_r q_t[r] k_i[r] e^{G_t[r]−G_i[r]},
//   S_n = Diag(γ_n) S_0 + Σ_i (k_i ⊙ e^{G_n−G_i}) δ_iᵀ.
// Only the last three lines need S_0; they are matrix products whose value columns are
// independent, so the sequential part (chunk after chunk) runs on (head, 32-column slice) blocks.
//
// Numerics (f32 storage and sums, f64 where it is cheap; the O(C²·d) and O(C·d²) products use
// explicit fmaf, one rounding per term, although the backend is built with -fmad=false: this path
// does not follow the CPU's order anyway):
// - Decay products are never formed as γ_t/γ_i: a factor is always exp(G_t − G_i) with t ≥ i
//   (≤ 1, no overflow), or exp(G_t) ≤ 1 relative to the chunk start. The K3 gate allows g down to
//   −5 per token, so over a 64-token chunk G reaches −320 (e^−320 underflows f32): such factors
//   become 0 or subnormal, which is the correctly rounded f32 value of a product that small.
// - G is cumulated in f64 and the differences G_t − G_i are taken in f64 (then rounded to f32):
//   a difference of two f32 cumulative sums of size ~100 would lose ~1e-5 absolute in the
//   exponent, i.e. 1e-5 relative in every intra-chunk term. In these f32 kernels the O(C²·d) pair
//   factors use CUDA's expf (≤ 2 ulp, no fast math) and the O(C·d) ones exp in f64, rounded once;
//   the tensor-core kernels of kda_chunked_mma.cu (fast mode) use __expf throughout.
// - The conv + SiLU, L2 norms, gates and the per-head RMSNorm + output gate are the token kernel's
//   arithmetic (same operations and order), so q, k, v, α, β are bit-identical to the recurrence's
//   and the conv windows come out bit-identical; only the delta-rule sums are reordered. In fast
//   precision mode (d <= 128) the prep and output-norm kernels run a warp per (token, head): the same
//   formulas, the f64 sums of squares in a warp-shuffle order and the SiLU/gate exps in f32 (expf,
//   ≤ 2 ulp, instead of f64 rounded once); the conv windows are still bit-identical.
#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/kda_chunked.cuh"
#include "core/kda_math.h"

namespace wren {
namespace cuda {

namespace {

constexpr int kIntraThreads = 256;
constexpr int kStateThreads = 256;
constexpr int kSlice = 32;  // value columns per block of the state pass

int round_warp(int n) { return n < kWarp ? kWarp : (n > 1024 ? 1024 : (n + kWarp - 1) / kWarp * kWarp); }

size_t intra_smem(int d, int C) {
  const size_t ld = size_t(d) + 1;  // padded row: pair sums read rows i of a warp without bank conflicts
  return size_t(C) * ld * sizeof(double) + 3 * size_t(C) * ld * sizeof(float) +
         (2 * size_t(C) * C + C) * sizeof(float);
}

/// The conv taps of channel ch at token t of this call: tap j is token τ = t − (K−1) + j, read
/// from the inputs x [T, P], or for τ < 0 (before this call's first token) from the window.
struct ChunkTaps {
  const float* x;
  const float* win;
  int P, ch, t, K;
  WREN_HD float operator()(int j) const {
    const int tau = t - (K - 1) + j;
    return tau >= 0 ? x[size_t(tau) * P + ch] : win[K - 1 + tau];
  }
};

/// Per (token, head): conv + SiLU from the inputs and the incoming window (not advanced here),
/// L2 norms, log decay g and β. Writes qn, kn, vc, g [T, P] and bs [T, H].
__global__ void kda_prep_kernel(KdaChunkArgs a, float* qn, float* kn, float* vc, float* gl, float* bs) {
  extern __shared__ float sm[];
  __shared__ double red[32];
  const int t = blockIdx.x, h = blockIdx.y, d = a.d, P = a.H * d, K = a.K;
  float* qs = sm;
  float* ks = qs + d;
  float* vs = ks + d;
  const float* convw[3] = {a.q_conv, a.k_conv, a.v_conv};
  const float* ins[3] = {a.q, a.k, a.v};
  float* outs[3] = {qs, ks, vs};
  for (int i = threadIdx.x; i < 3 * d; i += blockDim.x) {
    const int m = i / d, r = i % d, ch = h * d + r;
    const float* wc = convw[m] + size_t(ch) * K;
    const float* win = a.conv + (size_t(m) * P + ch) * (K - 1);
    outs[m][r] = kda::conv_silu(wc, K, ins[m][size_t(t) * P + ch], ChunkTaps{ins[m], win, P, ch, t, K});
  }
  __syncthreads();
  double sq = 0, sk = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    sq += double(qs[i]) * qs[i];
    sk += double(ks[i]) * ks[i];
  }
  sq = block_sum(sq, red);
  sk = block_sum(sk, red);
  const float qscale = 1.0f / sqrtf(float(d));
  const float invq = kda::l2_factor(sq, qscale), invk = kda::l2_factor(sk, 1.0f);
  const float A = exp_f(a.a_log[h]);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const size_t at = size_t(t) * P + size_t(h) * d + i;
    qn[at] = qs[i] * invq;
    kn[at] = ks[i] * invk;
    vc[at] = vs[i];
    const float zc = a.z[at] + a.dt_bias[h * d + i];
    gl[at] = kda::log_decay(a.softplus_gate, A, zc, a.lower);
  }
  if (threadIdx.x == 0) bs[size_t(t) * a.H + h] = kda::beta_gate(a.beta[size_t(t) * a.H + h]);
}

/// Fast precision mode, d <= 128 (kWarpMaxDim): the prep kernel's formulas with one warp per
/// (token, head) and 8 heads of a token per block, the sums of squares reduced by warp shuffles
/// (f64, another order than block_sum's) and the gates' exps in f32 (kda::Exp::F32: CUDA expf,
/// ≤ 2 ulp, where the exact kernels round an f64 exp once); fast mode only: exact mode keeps
/// kda_prep_kernel so its q, k, v, α, β stay the token kernel's bits. No shared memory and no
/// barrier: each lane keeps its ≤ 4 channels of q, k, v in registers.
constexpr int kWarpMaxDim = 128;
constexpr int kPrepWarps = 8;
constexpr kda::Exp kFastExp = kda::Exp::F32;  // the fast-mode warp kernels' gate exp

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

/// KC > 0: the conv width as a compile-time constant (a.K == KC), kFullDim: d == kWarpMaxDim. Both
/// let the compiler unroll every loop and issue all of a lane's loads (conv taps, weights, gate
/// inputs) before the first use: with a run-time width and a per-channel exit, each tap was a
/// load and a wait in turn, and the kernel stalled on memory latency (Nsight Compute, 2026-12-04:
/// 73% of warp samples on long scoreboard at ~0.9 TB/s). Same arithmetic in the same order.
template <int KC, bool kFullDim>
__global__ void __launch_bounds__(kPrepWarps * kWarp) kda_prep_warp_kernel(KdaChunkArgs a, float* qn, float* kn,
                                                                           float* vc, float* gl, float* bs) {
  constexpr int kPer = kWarpMaxDim / kWarp;
  const int lane = threadIdx.x % kWarp, t = blockIdx.x, h = blockIdx.y * kPrepWarps + threadIdx.x / kWarp;
  if (h >= a.H) return;  // warp-uniform
  const int d = kFullDim ? kWarpMaxDim : a.d, P = a.H * d, K = KC > 0 ? KC : a.K;
  const float* convw[3] = {a.q_conv, a.k_conv, a.v_conv};
  const float* ins[3] = {a.q, a.k, a.v};
  float y[3][kPer], zc[kPer];
  const float braw = a.beta[size_t(t) * a.H + h];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int r = lane + kWarp * j;
    if (!kFullDim && r >= d) break;
    zc[j] = a.z[size_t(t) * P + size_t(h) * d + r] + a.dt_bias[h * d + r];
  }
  double sq = 0, sk = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int r = lane + kWarp * j, ch = h * d + r;
    if (!kFullDim && r >= d) break;
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      const float* win = a.conv + (size_t(m) * P + ch) * (K - 1);
      y[m][j] = kda::conv_silu<kFastExp>(convw[m] + size_t(ch) * K, K, ins[m][size_t(t) * P + ch],
                                         ChunkTaps{ins[m], win, P, ch, t, K});
    }
    sq += double(y[0][j]) * y[0][j];
    sk += double(y[1][j]) * y[1][j];
  }
  sq = warp_sum_d(sq);
  sk = warp_sum_d(sk);
  const float invq = kda::l2_factor(sq, 1.0f / sqrtf(float(d))), invk = kda::l2_factor(sk, 1.0f);
  const float A = exp_f(a.a_log[h]);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int r = lane + kWarp * j;
    if (!kFullDim && r >= d) break;
    const size_t at = size_t(t) * P + size_t(h) * d + r;
    qn[at] = y[0][j] * invq;
    kn[at] = y[1][j] * invk;
    vc[at] = y[2][j];
    gl[at] = kda::log_decay<kFastExp>(a.softplus_gate, A, zc[j], a.lower);
  }
  if (lane == 0) bs[size_t(t) * a.H + h] = kda::beta_gate<kFastExp>(braw);
}

/// Fast precision mode, d <= 128: kda_out_kernel's arithmetic with one warp per (token, head), the
/// output gate's σ with the f32 exp (kFastExp) like the prep kernel's gates. kFullDim (d ==
/// kWarpMaxDim): no per-channel exit, so the gate loads issue with the output's, before the reduction.
template <bool kFullDim>
__global__ void __launch_bounds__(kPrepWarps * kWarp) kda_out_warp_kernel(KdaChunkArgs a) {
  constexpr int kPer = kWarpMaxDim / kWarp;
  const int lane = threadIdx.x % kWarp, t = blockIdx.x, h = blockIdx.y * kPrepWarps + threadIdx.x / kWarp;
  if (h >= a.H) return;
  const int d = kFullDim ? kWarpMaxDim : a.d, P = a.H * d;
  float* o = a.out + size_t(t) * P + size_t(h) * d;
  const float* gate = a.gate + size_t(t) * P + size_t(h) * d;
  float ov[kPer], gv[kPer];
  double so = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int r = lane + kWarp * j;
    ov[j] = kFullDim || r < d ? o[r] : 0.f;
    gv[j] = kFullDim || r < d ? gate[r] : 0.f;
    so += double(ov[j]) * ov[j];
  }
  so = warp_sum_d(so);
  const float inv = float(1.0 / sqrt(so / d + a.eps));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int r = lane + kWarp * j;
    if (!kFullDim && r >= d) break;
    float v = ov[j] * inv * a.o_norm[r];
    v *= kda::sigmoid_b<kFastExp>(gv[j]);
    o[r] = v;
  }
}

/// Advances the conv windows over the T tokens: window j = pre-conv input of token T-(K-1)+j.
/// In place, j ascending: entry j reads old entry T+j > j, not yet overwritten.
__global__ void kda_window_kernel(KdaChunkArgs a) {
  const int P = a.H * a.d, K = a.K, T = a.T;
  const float* ins[3] = {a.q, a.k, a.v};
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size_t(3) * P; i += size_t(gridDim.x) * blockDim.x) {
    const int m = int(i / P), ch = int(i % P);
    float* win = a.conv + (size_t(m) * P + ch) * (K - 1);
    for (int j = 0; j < K - 1; ++j) {
      const int tau = T - (K - 1) + j;
      win[j] = tau >= 0 ? ins[m][size_t(tau) * P + ch] : win[K - 1 + tau];
    }
  }
}

/// Per (chunk, head), independent of the state: G, the pair matrices A (strict, × β_t) and Q
/// (incl. diagonal), the UT solve for W and U. In place: qn → q ⊙ γ_t, kn → k ⊙ e^{G_n−G_t},
/// vc → U, gl → W. Qm [chunks, H, C, C]; egc [chunks, P] = γ_n.
__global__ void kda_intra_kernel(int T, int H, int d, int C, float* qn, float* kn, float* vc, float* gl,
                                 const float* bs, float* Qm, float* egc) {
  extern __shared__ double smd[];
  const int c = blockIdx.x, h = blockIdx.y, P = H * d, ld = d + 1;
  const int t0 = c * C, n = min(C, T - t0);
  double* G = smd;                                      // [C][ld]
  float* qs = reinterpret_cast<float*>(G + size_t(C) * ld);  // [C][ld]
  float* ks = qs + C * ld;                              // [C][ld], then W
  float* vs = ks + C * ld;                              // [C][ld], then U
  float* Am = vs + C * ld;                              // [C][C]
  float* Qs = Am + C * C;                               // [C][C]
  float* b = Qs + C * C;                                // [C]
  const size_t base = size_t(t0) * P + size_t(h) * d;
  for (int i = threadIdx.x; i < n * d; i += blockDim.x) {
    const int t = i / d, r = i % d;
    const size_t at = base + size_t(t) * P + r;
    qs[t * ld + r] = qn[at];
    ks[t * ld + r] = kn[at];
    vs[t * ld + r] = vc[at];
  }
  for (int t = threadIdx.x; t < n; t += blockDim.x) b[t] = bs[size_t(t0 + t) * H + h];
  for (int r = threadIdx.x; r < d; r += blockDim.x) {
    double acc = 0;
    for (int t = 0; t < n; ++t) {
      acc += double(gl[base + size_t(t) * P + r]);
      G[t * ld + r] = acc;
    }
  }
  __syncthreads();
  // Pair sums; one exp per (t, i, r) shared by A and Q.
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int t = idx / n, i = idx % n;
    float kk = 0, qk = 0;
    if (i <= t)
      for (int r = 0; r < d; ++r) {
        const float ki = ks[i * ld + r] * expf(float(G[t * ld + r] - G[i * ld + r]));
        kk = fmaf(ks[t * ld + r], ki, kk);
        qk = fmaf(qs[t * ld + r], ki, qk);
      }
    Am[t * C + i] = i < t ? b[t] * kk : 0.f;
    Qs[t * C + i] = qk;
  }
  // State-pass factors (read q, k, G before k is overwritten by W).
  float* Qg = Qm + (size_t(c) * H + h) * C * C;
  for (int i = threadIdx.x; i < n * d; i += blockDim.x) {
    const int t = i / d, r = i % d;
    const size_t at = base + size_t(t) * P + r;
    const double Gt = G[t * ld + r];
    qn[at] = qs[t * ld + r] * float(exp(Gt));
    kn[at] = ks[t * ld + r] * float(exp(G[(n - 1) * ld + r] - Gt));
  }
  for (int r = threadIdx.x; r < d; r += blockDim.x) egc[size_t(c) * P + size_t(h) * d + r] = float(exp(G[(n - 1) * ld + r]));
  __syncthreads();
  for (int i = threadIdx.x; i < n * n; i += blockDim.x) Qg[(i / n) * C + i % n] = Qs[(i / n) * C + i % n];
  kda_ut_solve_store<double, false>(n, d, C, ld, G, b, Am, ks, vs, gl, vc, base, P);  // W → gl, U → vc
}

/// Per (head, 32-column slice of the value index), chunk after chunk: δ = U − W S_0, raw
/// o = q̃ S_0 + Q δ into out, S ← Diag(γ_n) S_0 + k̂ᵀ δ. The slice of S stays in shared memory;
/// each chunk's rows of W, q̃, k̂ and its Q are staged there (coalesced), so the products read
/// shared memory only. Lane = value column, warp = a group of rows (t for δ and o, r for S), kRows
/// rows per thread in registers (independent accumulators); products use explicit fmaf (this path
/// is not the CPU's order anyway; one rounding per term instead of two).
constexpr int kWarps = kStateThreads / kWarp;
constexpr int kRows = 8;  // rows per thread: C <= kWarps · kRows = 64

size_t state_smem(int d, int C) {
  return (size_t(d) * kSlice + size_t(C) * kSlice + 3 * size_t(C) * d + size_t(C) * C) * sizeof(float);
}

__global__ void kda_state_kernel(int T, int H, int d, int C, const float* qd, const float* kd, const float* W,
                                 const float* U, const float* Qm, const float* egc, float* S, float* out) {
  extern __shared__ float sm[];
  const int h = blockIdx.x, c0 = blockIdx.y * kSlice, w = min(kSlice, d - c0), P = H * d;
  const int lane = threadIdx.x % kWarp, wq = threadIdx.x / kWarp;
  float* Ss = sm;                 // [d][kSlice]
  float* D = Ss + d * kSlice;     // [C][kSlice] δ
  float* Ws = D + C * kSlice;     // [C][d] W rows
  float* Qd = Ws + C * d;         // [C][d] q ⊙ γ_t rows
  float* Kd = Qd + C * d;         // [C][d] k ⊙ e^{G_n − G_t} rows
  float* Qc = Kd + C * d;         // [C][C] Q
  float* Sg = S + size_t(h) * d * d;
  for (int i = threadIdx.x; i < d * kSlice; i += blockDim.x) {
    const int r = i / kSlice, cc = i % kSlice;
    Ss[i] = cc < w ? Sg[size_t(r) * d + c0 + cc] : 0.f;
  }
  const int chunks = (T + C - 1) / C;
  for (int c = 0; c < chunks; ++c) {
    const int t0 = c * C, n = min(C, T - t0);
    const size_t base = size_t(t0) * P + size_t(h) * d;
    for (int i = threadIdx.x; i < n * d; i += blockDim.x) {
      const int t = i / d, r = i % d;
      const size_t at = base + size_t(t) * P + r;
      Ws[i] = W[at];
      Qd[i] = qd[at];
      Kd[i] = kd[at];
    }
    const float* Qg = Qm + (size_t(c) * H + h) * C * C;
    for (int i = threadIdx.x; i < n * C; i += blockDim.x) Qc[i] = Qg[i];
    __syncthreads();
    // δ rows t = wq + kWarps·k.
    float acc[kRows];
#pragma unroll
    for (int k = 0; k < kRows; ++k) acc[k] = 0.f;
    for (int r = 0; r < d; ++r) {
      const float s = Ss[r * kSlice + lane];
#pragma unroll
      for (int k = 0; k < kRows; ++k)
        if (wq + kWarps * k < n) acc[k] = fmaf(Ws[(wq + kWarps * k) * d + r], s, acc[k]);
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int t = wq + kWarps * k;
      if (t < n) D[t * kSlice + lane] = lane < w ? U[base + size_t(t) * P + c0 + lane] - acc[k] : 0.f;
    }
    __syncthreads();
    // o rows t: q̃_t S_0 + Σ_{j≤t} Q_{t,j} δ_j.
#pragma unroll
    for (int k = 0; k < kRows; ++k) acc[k] = 0.f;
    for (int r = 0; r < d; ++r) {
      const float s = Ss[r * kSlice + lane];
#pragma unroll
      for (int k = 0; k < kRows; ++k)
        if (wq + kWarps * k < n) acc[k] = fmaf(Qd[(wq + kWarps * k) * d + r], s, acc[k]);
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int t = wq + kWarps * k;
      if (t >= n) continue;
      float o = acc[k];
      for (int j = 0; j <= t; ++j) o = fmaf(Qc[t * C + j], D[j * kSlice + lane], o);
      if (lane < w) out[base + size_t(t) * P + c0 + lane] = o;
    }
    __syncthreads();  // o read S_0
    // S rows r = r0 + kWarps·k: γ_n[r] S_0[r] + Σ_t k̂_t[r] δ_t.
    const float* eg = egc + size_t(c) * P + size_t(h) * d;
    for (int r0 = wq; r0 < d; r0 += kWarps * kRows) {
      float sa[kRows];
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int r = r0 + kWarps * k;
        sa[k] = r < d ? eg[r] * Ss[r * kSlice + lane] : 0.f;
      }
      for (int t = 0; t < n; ++t) {
        const float dv = D[t * kSlice + lane];
#pragma unroll
        for (int k = 0; k < kRows; ++k)
          if (r0 + kWarps * k < d) sa[k] = fmaf(Kd[t * d + r0 + kWarps * k], dv, sa[k]);
      }
#pragma unroll
      for (int k = 0; k < kRows; ++k)
        if (r0 + kWarps * k < d) Ss[(r0 + kWarps * k) * kSlice + lane] = sa[k];
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < d * kSlice; i += blockDim.x) {
    const int r = i / kSlice, cc = i % kSlice;
    if (cc < w) Sg[size_t(r) * d + c0 + cc] = Ss[i];
  }
}

/// Per (token, head), in place on out: per-head RMSNorm (shared o_norm weight) then × σ(gate),
/// the token kernel's arithmetic.
__global__ void kda_out_kernel(KdaChunkArgs a) {
  __shared__ double red[32];
  const int t = blockIdx.x, h = blockIdx.y, d = a.d, P = a.H * d;
  float* o = a.out + size_t(t) * P + size_t(h) * d;
  double so = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) so += double(o[i]) * o[i];
  so = block_sum(so, red);
  const float inv = float(1.0 / sqrt(so / d + a.eps));
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float y = o[i] * inv * a.o_norm[i];
    y *= sigmoid_f(a.gate[size_t(t) * P + size_t(h) * d + i]);
    o[i] = y;
  }
}

}  // namespace

int kda_chunk_fit(int d, int want, int max_smem, bool tensor_cores) {
  for (int C : {64, 32, 16}) {
    const size_t need = tensor_cores ? kda_mma_smem(d, C) : std::max(intra_smem(d, C), state_smem(d, C));
    if (C <= want && need + 1024 <= size_t(max_smem)) return C;
  }
  return 0;
}

void kda_chunked(CudaBackend::Impl& m, const KdaChunkArgs& a, int C) {
  const int H = a.H, d = a.d, T = a.T, P = H * d, chunks = (T + C - 1) / C;
  const size_t TP = size_t(T) * P;
  // Scratch: qn, kn, vc, gl [T, P]; bs [T, H]; Qm [chunks, H, C, C]; egc [chunks, P]. m.scores is
  // per-op scratch (stream-ordered; no op holds it across calls).
  const size_t floats = 4 * TP + size_t(T) * H + size_t(chunks) * H * C * C + size_t(chunks) * P;
  float* qn = static_cast<float*>(m.scratch(m.scores, floats * sizeof(float)));
  float* kn = qn + TP;
  float* vc = kn + TP;
  float* gl = vc + TP;
  float* bs = gl + TP;
  float* Qm = bs + size_t(T) * H;
  float* egc = Qm + size_t(chunks) * H * C * C;

  const int tpb = round_warp(d);
  const bool fast = m.opts.precision == GpuPrecision::Fast;
  const bool warp_rows = fast && d <= kWarpMaxDim;  // fast mode: a warp per (token, head)
  const dim3 warp_grid(unsigned(T), unsigned((H + kPrepWarps - 1) / kPrepWarps));
  if (warp_rows) {
    // K3 and Kimi Linear: conv width 4, head_dim 128 (the unrolled instance); any other shape the general one.
    if (a.K == 4 && d == kWarpMaxDim)
      kda_prep_warp_kernel<4, true><<<warp_grid, kPrepWarps * kWarp, 0, m.stream>>>(a, qn, kn, vc, gl, bs);
    else
      kda_prep_warp_kernel<0, false><<<warp_grid, kPrepWarps * kWarp, 0, m.stream>>>(a, qn, kn, vc, gl, bs);
  } else {
    kda_prep_kernel<<<dim3(T, H), tpb, 3 * size_t(d) * sizeof(float), m.stream>>>(a, qn, kn, vc, gl, bs);
  }
  m.launched("kda_core chunked: prep kernel");
  if (a.K > 1) {
    kda_window_kernel<<<grid_for(size_t(3) * P, 256), 256, 0, m.stream>>>(a);
    m.launched("kda_core chunked: conv window kernel");
  }
  if (fast) {
    kda_chunk_passes_mma(m, T, H, d, C, qn, kn, vc, gl, bs, Qm, egc, a.S, a.out);
  } else {
    const size_t ism = intra_smem(d, C);
    if (ism > 48 * 1024)
      check_cuda(cudaFuncSetAttribute(kda_intra_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ism)),
                 "cudaFuncSetAttribute (kda_core chunked intra shared memory)");
    kda_intra_kernel<<<dim3(chunks, H), kIntraThreads, ism, m.stream>>>(T, H, d, C, qn, kn, vc, gl, bs, Qm, egc);
    m.launched("kda_core chunked: intra-chunk kernel");
    const size_t ssm = state_smem(d, C);
    if (ssm > 48 * 1024)
      check_cuda(cudaFuncSetAttribute(kda_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ssm)),
                 "cudaFuncSetAttribute (kda_core chunked state shared memory)");
    kda_state_kernel<<<dim3(H, (d + kSlice - 1) / kSlice), kStateThreads, ssm, m.stream>>>(T, H, d, C, qn, kn, gl, vc, Qm,
                                                                                          egc, a.S, a.out);
    m.launched("kda_core chunked: state kernel");
  }
  if (warp_rows && d == kWarpMaxDim) kda_out_warp_kernel<true><<<warp_grid, kPrepWarps * kWarp, 0, m.stream>>>(a);
  else if (warp_rows) kda_out_warp_kernel<false><<<warp_grid, kPrepWarps * kWarp, 0, m.stream>>>(a);
  else kda_out_kernel<<<dim3(T, H), tpb, 0, m.stream>>>(a);
  m.launched("kda_core chunked: output norm kernel");
}

}  // namespace cuda
}  // namespace wren
