// CUDA backend: the chunked KDA core's two chunk passes on tensor cores, fast precision mode only
// (issue 13; docs/gpu-method.md#kda-chunked-tc). Same math and the same scratch layout as the f32
// kernels of kda_chunked.cu (whose header derives the WY/UT form); kda_chunked() picks these when
// CudaOptions::precision is Fast. Exact precision with --cuda-kda chunked keeps the f32 kernels.
//
// Products run as mma.sync m16n8k8 with TF32 operands (cvt.rna: 10-bit mantissa, relative rounding
// ≤ 2^-11 per operand) and f32 accumulation; everything kept across chunks (the state S) is f32.
// TF32 rather than BF16 because these passes are latency-bound (a chain of small products per
// chunk), not throughput-bound, so the 2x operand rate of BF16 buys little and TF32's 8x smaller
// operand rounding keeps the recurrent state closer to the f32 path.
//
// Intra-chunk pass (per chunk, head; 16-token sub-blocks a, b of the chunk):
// - Pair sums A_{t,i} = β_t Σ_r k_t[r] k_i[r] e^{G_t[r]−G_i[r]} and Q_{t,i} = Σ_r q_t[r] k_i[r] e^{…}.
//   For t in block a > b ∋ i, with s = 16a the first row of block a, e^{G_t−G_i} = e^{G_t−G_s} ·
//   e^{G_s−G_i}: both factors ≤ 1 (G is non-increasing along the chunk, t ≥ s > i), so the block is
//   the product (k_t ⊙ e^{G_t−G_s}) · (k_i ⊙ e^{G_s−G_i})ᵀ on tensor cores, the factors formed as
//   the fragments are loaded. The diagonal 16×16 blocks keep the per-(t, i, r) factor (a warp per
//   pair, lanes over r), as fla's chunk_kda does: there no split point gives two factors ≤ 1.
// - The UT solve (unit lower-triangular, forward substitution per column) and the state-pass factors
//   are the f32 kernel's, with G kept in f32 (cumulated in f64, rounded once; rounding is monotone,
//   so G_t − G_i ≤ 0 still holds for t ≥ i and no factor exceeds 1 beyond the exp's own error).
//   Every decay factor e^x (x ≤ 0) is __expf (ex2.approx: see kda_decay_exp in kda_chunked.cuh).
// The state pass's operands W, q̃, k̂ and Q are stored rounded to TF32 by the intra pass (and δ by
// the state pass itself), so the state pass reads their bits without a conversion per use (each was
// converted once per warp that read it): the same products, bit for bit.
// State pass (per head, 32-column slice of the value index, chunk after chunk; S in shared memory,
// f32):  δ = U − W·S,  o = q̃·S + Q·δ,  S ← Diag(γ_n)·S + k̂ᵀ·δ,  all three on tensor cores; the next
// chunk's W, q̃, k̂, Q, U and γ_n are copied in by cp.async while this chunk computes (double buffer
// when it fits in shared memory). Results do not depend on T or on the call's split: each chunk's
// arithmetic is fixed (fast mode's chunk rule, docs/backends.md "Precision modes").
#include <algorithm>
#include <string>

#include "backends/cuda/kda_chunked.cuh"

namespace wren {
namespace cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kNWarps = kThreads / kWarp;
constexpr int kSliceN = 32;    // value columns per state-pass block
constexpr int kLdS = 40;       // row stride of S, δ and U tiles: (4·t4 + g)-style B loads hit 32 banks

int round16(int x) { return (x + 15) / 16 * 16; }

__device__ __forceinline__ unsigned to_tf32(float x) { return __float_as_uint(kda_tf32_round(x)); }

/// c += a · b, m16n8k8, TF32 operands, f32 accumulators (PTX fragment layouts: a0 (g, t4), a1 (g+8, t4),
/// a2 (g, t4+4), a3 (g+8, t4+4); b0 (k t4, n g), b1 (k t4+4, n g); c0/c1 (g, 2·t4 + 0/1), c2/c3 (g+8, …)).
__device__ __forceinline__ void mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// An operand already rounded to TF32 where it was stored (kda_tf32_round): its bits as they are.
__device__ __forceinline__ unsigned tf32_bits(float x) { return __float_as_uint(x); }

__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- intra-chunk pass ----

/// Row stride (floats) of the intra pass's [C][ld] tiles: ≥ d rounded to 16, ≡ 4 mod 8 so the
/// fragment loads (row g, column t4) of a warp hit 32 different banks.
int intra_ld(int d) { return round16(d) + 4; }

size_t intra_mma_smem(int d, int C) {
  return (4 * size_t(C) * intra_ld(d) + 2 * size_t(C) * C + C) * sizeof(float);
}

template <int C>
__global__ void __launch_bounds__(kThreads) kda_intra_mma_kernel(int T, int H, int d, float* qn, float* kn, float* vc,
                                                                   float* gl, const float* bs, float* Qm, float* egc) {
  extern __shared__ __align__(16) float smf[];
  constexpr int nb = C / 16;
  constexpr int kOffTiles = nb * (nb - 1);  // off-diagonal 16 × 8 tiles
  const int c = blockIdx.x, h = blockIdx.y, P = H * d, dp = (d + 15) / 16 * 16, ld = dp + 4;
  const int t0 = c * C, n = min(C, T - t0);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane >> 2, t4 = lane & 3;
  float* G = smf;           // [C][ld] cumulative log decay (rows ≥ n: G_{n-1}; columns ≥ d: 0)
  float* qs = G + C * ld;   // [C][ld] (zero outside n × d)
  float* ks = qs + C * ld;  // [C][ld], then W
  float* vs = ks + C * ld;  // [C][ld], then U
  float* Am = vs + C * ld;  // [C][C]
  float* Qs = Am + C * C;   // [C][C]
  float* b = Qs + C * C;    // [C] (0 for rows ≥ n)
  const size_t base = size_t(t0) * P + size_t(h) * d;
  for (int t = warp; t < C; t += kNWarps)  // a row per warp, columns over the lanes
    for (int r = lane; r < ld; r += kWarp) {
      const int i = t * ld + r;
      const bool in = t < n && r < d;
      const size_t at = base + size_t(t) * P + r;
      qs[i] = in ? qn[at] : 0.f;
      ks[i] = in ? kn[at] : 0.f;
      vs[i] = in ? vc[at] : 0.f;
      G[i] = in ? gl[at] : 0.f;  // the per-token log decay, cumulated below
    }
  for (int i = threadIdx.x; i < C * C; i += blockDim.x) Am[i] = 0.f, Qs[i] = 0.f;
  for (int t = threadIdx.x; t < C; t += blockDim.x) b[t] = t < n ? bs[size_t(t0 + t) * H + h] : 0.f;
  __syncthreads();
  // G in place, a column per thread: the same f32 terms added in the same order (f64) as when each
  // term came from global memory, which left C dependent global loads on every column's chain.
  for (int r = threadIdx.x; r < ld; r += blockDim.x) {
    double acc = 0;
    for (int t = 0; t < C; ++t) {
      acc += double(G[t * ld + r]);  // 0 for rows >= n and columns >= d
      G[t * ld + r] = float(acc);
    }
  }
  __syncthreads();
  // Work split between the two loops below, balanced per warp (there is no barrier between them):
  // the off-diagonal tiles go to the last warps (tile j to warp kNWarps − 1 − j mod kNWarps), each
  // counted as kTileCost pairs (16 k-steps of 8 columns against one pass of 4 columns and two warp
  // reductions), and the diagonal pairs (t ≥ i only) fill each warp up to an equal share. (Striding
  // over all 256 (t, i) of a block left warp 0 with 2.4x warp 7's pairs, plus a tile.) Which warp
  // computes a pair or tile changes no bit.
  constexpr int kPairs = nb * 136;  // pairs t ≥ i of the nb diagonal 16×16 blocks
  constexpr int kTileCost = 8;
  int p0 = 0, p1 = 0;
  {
    const int share = (kPairs + kTileCost * kOffTiles + kNWarps - 1) / kNWarps;
    int acc = 0;
    for (int v = 0; v <= warp; ++v) {
      int tiles = 0;
      for (int j = kNWarps - 1 - v; j < kOffTiles; j += kNWarps) ++tiles;
      p0 = acc;
      acc = v == kNWarps - 1 ? kPairs : min(kPairs, acc + max(0, share - kTileCost * tiles));
      p1 = acc;
    }
  }
  // Diagonal 16×16 blocks: a warp per pair (t ≥ i), lanes over r.
  for (int idx = p0; idx < p1; ++idx) {
    const int blk = idx / 136, q = idx % 136;
    int tl = 0;
    while ((tl + 1) * (tl + 2) / 2 <= q) ++tl;
    const int il = q - tl * (tl + 1) / 2;
    const int t = blk * 16 + tl, i = blk * 16 + il;
    if (t >= n) continue;  // warp-uniform
    float kk = 0.f, qk = 0.f;
    for (int r = lane; r < d; r += kWarp) {
      const float ki = ks[i * ld + r] * kda_decay_exp(G[t * ld + r] - G[i * ld + r]);
      kk = fmaf(ks[t * ld + r], ki, kk);
      qk = fmaf(qs[t * ld + r], ki, qk);
    }
    kk = warp_sum(kk);
    qk = warp_sum(qk);
    if (lane == 0) {
      Am[t * C + i] = i < t ? b[t] * kk : 0.f;
      Qs[t * C + i] = qk;
    }
  }
  // Off-diagonal blocks (a > bb) on tensor cores: 16 × 8 output tiles, two per block pair.
  for (int tile = kNWarps - 1 - warp; tile < kOffTiles; tile += kNWarps) {
    int p = tile >> 1, a = 1;
    while (p >= a) p -= a, ++a;  // pairs in order (1,0), (2,0), (2,1), (3,0), ...
    const int bb = p, s = 16 * a, ta = s + g, tb = ta + 8, ib = 16 * bb + (tile & 1) * 8 + g;
    const float* Gs = G + s * ld;
    float ak[4] = {0.f, 0.f, 0.f, 0.f}, aq[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < dp; k += 8) {
      const int r0 = k + t4, r1 = r0 + 4;
      const float e00 = kda_decay_exp(G[ta * ld + r0] - Gs[r0]), e10 = kda_decay_exp(G[tb * ld + r0] - Gs[r0]);
      const float e01 = kda_decay_exp(G[ta * ld + r1] - Gs[r1]), e11 = kda_decay_exp(G[tb * ld + r1] - Gs[r1]);
      const unsigned b0 = to_tf32(ks[ib * ld + r0] * kda_decay_exp(Gs[r0] - G[ib * ld + r0]));
      const unsigned b1 = to_tf32(ks[ib * ld + r1] * kda_decay_exp(Gs[r1] - G[ib * ld + r1]));
      mma_tf32(ak, to_tf32(ks[ta * ld + r0] * e00), to_tf32(ks[tb * ld + r0] * e10), to_tf32(ks[ta * ld + r1] * e01),
               to_tf32(ks[tb * ld + r1] * e11), b0, b1);
      mma_tf32(aq, to_tf32(qs[ta * ld + r0] * e00), to_tf32(qs[tb * ld + r0] * e10), to_tf32(qs[ta * ld + r1] * e01),
               to_tf32(qs[tb * ld + r1] * e11), b0, b1);
    }
    const int ic = 16 * bb + (tile & 1) * 8 + 2 * t4;
    Am[ta * C + ic] = b[ta] * ak[0];
    Am[ta * C + ic + 1] = b[ta] * ak[1];
    Am[tb * C + ic] = b[tb] * ak[2];
    Am[tb * C + ic + 1] = b[tb] * ak[3];
    Qs[ta * C + ic] = aq[0];
    Qs[ta * C + ic + 1] = aq[1];
    Qs[tb * C + ic] = aq[2];
    Qs[tb * C + ic + 1] = aq[3];
  }
  __syncthreads();
  // State-pass factors (read q, k, G before k is overwritten by W): q ⊙ γ_t, k ⊙ e^{G_n − G_t}, γ_n.
  for (int t = warp; t < n; t += kNWarps)
    for (int r = lane; r < d; r += kWarp) {
      const size_t at = base + size_t(t) * P + r;
      const float Gt = G[t * ld + r];
      qn[at] = kda_tf32_round(qs[t * ld + r] * kda_decay_exp(Gt));
      kn[at] = kda_tf32_round(ks[t * ld + r] * kda_decay_exp(G[(n - 1) * ld + r] - Gt));
    }
  for (int r = threadIdx.x; r < d; r += blockDim.x) egc[size_t(c) * P + size_t(h) * d + r] = kda_decay_exp(G[(n - 1) * ld + r]);
  float* Qg = Qm + (size_t(c) * H + h) * C * C;
  for (int i = threadIdx.x; i < C * C; i += blockDim.x) Qg[i] = kda_tf32_round(Qs[i]);
  __syncthreads();
  kda_ut_solve_store<float, true, true>(n, d, C, ld, G, b, Am, ks, vs, gl, vc, base, P);  // W → gl, U → vc
}

// ---- state pass ----

/// Shared-memory layout of the state pass (floats): S [dp][kLdS], δ [C][kLdS], then nbuf buffers of
/// W, q̃ [C][lda], k̂ [C][ldk], Q [C][C+4], U [C][kLdS], γ_n [dp]. lda ≡ 4 mod 8 (row-major A
/// fragments), ldk ≡ 8 mod 16 (k̂ is read transposed). Every part is a multiple of 4 floats (16-byte
/// cp.async targets).
struct StateLayout {
  int dp, lda, ldk, nbuf;
  int buf;  ///< floats per buffer
  __host__ __device__ int fixed(int C) const { return dp * kLdS + C * kLdS; }
};

StateLayout state_layout(int d, int C, int nbuf) {
  StateLayout L{};
  L.dp = round16(d), L.lda = L.dp + 4, L.ldk = L.dp + 8, L.nbuf = nbuf;
  L.buf = 2 * C * L.lda + C * L.ldk + C * (C + 4) + C * kLdS + L.dp;
  return L;
}

size_t state_mma_smem(const StateLayout& L, int C) { return (size_t(L.fixed(C)) + size_t(L.nbuf) * L.buf) * sizeof(float); }

template <int C>
__global__ void __launch_bounds__(kThreads) kda_state_mma_kernel(int T, int H, int d, StateLayout L, const float* qd,
                                                                   const float* kd, const float* W, const float* U,
                                                                   const float* Qm, const float* egc, float* S,
                                                                   float* out) {
  extern __shared__ __align__(16) float smf[];
  constexpr int ldq = C + 4;
  constexpr int kMt = C / 16;                           // 16-row tiles of δ and o
  constexpr int kOT = (kMt * 4 + kNWarps - 1) / kNWarps;  // (δ, o) tiles per warp
  const int h = blockIdx.x, c0 = blockIdx.y * kSliceN, w = min(kSliceN, d - c0), P = H * d;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane >> 2, t4 = lane & 3;
  const int dp = L.dp, lda = L.lda, ldk = L.ldk;
  float* Ss = smf;              // [dp][kLdS] the state slice, f32
  float* D = Ss + dp * kLdS;    // [C][kLdS] δ
  float* bufs = D + C * kLdS;
  const bool vec = d % 4 == 0;  // 16-byte copies (rows and the slice start are 16-byte aligned)
  const int total = L.fixed(C) + L.nbuf * L.buf;
  for (int i = threadIdx.x; i < total; i += blockDim.x) smf[i] = 0.f;  // pads stay zero
  __syncthreads();
  float* Sg = S + size_t(h) * d * d;
  for (int i = threadIdx.x; i < d * kSliceN; i += blockDim.x) {
    const int r = i / kSliceN, cc = i % kSliceN;
    if (cc < w) Ss[r * kLdS + cc] = Sg[size_t(r) * d + c0 + cc];
  }
  // Copies chunk c's operands into buffer B (cp.async; rows ≥ n zeroed with plain stores).
  auto stage = [&](int c, float* B) {
    const int t0 = c * C, n = min(C, T - t0);
    const size_t base = size_t(t0) * P + size_t(h) * d;
    float* Wb = B;
    float* Qb = Wb + C * lda;
    float* Kb = Qb + C * lda;
    float* Qcb = Kb + C * ldk;
    float* Ub = Qcb + C * ldq;
    float* eb = Ub + C * kLdS;
    if (vec) {
      const int d4 = d / 4;
      for (int i = threadIdx.x; i < n * d4; i += blockDim.x) {
        const int t = i / d4, r = (i % d4) * 4;
        const size_t at = base + size_t(t) * P + r;
        cp_async16(Wb + t * lda + r, W + at);
        cp_async16(Qb + t * lda + r, qd + at);
        cp_async16(Kb + t * ldk + r, kd + at);
      }
      const int w4 = w / 4;
      for (int i = threadIdx.x; i < n * w4; i += blockDim.x) {
        const int t = i / w4, cc = (i % w4) * 4;
        cp_async16(Ub + t * kLdS + cc, U + base + size_t(t) * P + c0 + cc);
      }
    } else {
      for (int i = threadIdx.x; i < n * d; i += blockDim.x) {
        const int t = i / d, r = i % d;
        const size_t at = base + size_t(t) * P + r;
        cp_async4(Wb + t * lda + r, W + at);
        cp_async4(Qb + t * lda + r, qd + at);
        cp_async4(Kb + t * ldk + r, kd + at);
      }
      for (int i = threadIdx.x; i < n * w; i += blockDim.x) {
        const int t = i / w, cc = i % w;
        cp_async4(Ub + t * kLdS + cc, U + base + size_t(t) * P + c0 + cc);
      }
    }
    const float* Qg = Qm + (size_t(c) * H + h) * C * C;
    for (int i = threadIdx.x; i < C * C; i += blockDim.x) {
      const int t = i / C, j = i % C;
      if (t < n && j < n)
        cp_async4(Qcb + t * ldq + j, Qg + i);
      else
        Qcb[t * ldq + j] = 0.f;
    }
    for (int r = threadIdx.x; r < d; r += blockDim.x) cp_async4(eb + r, egc + size_t(c) * P + size_t(h) * d + r);
    if (n < C) {
      for (int i = threadIdx.x; i < (C - n) * d; i += blockDim.x) {
        const int t = n + i / d, r = i % d;
        Wb[t * lda + r] = 0.f, Qb[t * lda + r] = 0.f, Kb[t * ldk + r] = 0.f;
      }
      for (int i = threadIdx.x; i < (C - n) * kSliceN; i += blockDim.x) Ub[(n + i / kSliceN) * kLdS + i % kSliceN] = 0.f;
    }
  };
  const int chunks = (T + C - 1) / C;
  if (L.nbuf == 2) stage(0, bufs);
  cp_async_commit();
  for (int c = 0; c < chunks; ++c) {
    float* B = bufs + (L.nbuf == 2 ? (c & 1) * L.buf : 0);
    if (L.nbuf == 1) stage(c, B);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();  // chunk c's operands and the previous chunk's S are in shared memory
    if (L.nbuf == 2 && c + 1 < chunks) stage(c + 1, bufs + ((c + 1) & 1) * L.buf);  // overlaps this chunk
    const float* Wb = B;
    const float* Qb = Wb + C * lda;
    const float* Kb = Qb + C * lda;
    const float* Qcb = Kb + C * ldk;
    const float* Ub = Qcb + C * ldq;
    const float* eb = Ub + C * kLdS;
    const int t0 = c * C, n = min(C, T - t0);
    const size_t base = size_t(t0) * P + size_t(h) * d;
    // δ = U − W·S and o = q̃·S, tile (m, nn) of 16 rows × 8 columns per warp.
    float oacc[kOT][4];
#pragma unroll
    for (int j = 0; j < kOT; ++j) {
      const int tile = warp + kNWarps * j;
      oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.f;
      if (tile >= kMt * 4) continue;
      const int m16 = (tile >> 2) * 16, n8 = (tile & 3) * 8;
      const float* w0 = Wb + (m16 + g) * lda + t4;
      const float* q0 = Qb + (m16 + g) * lda + t4;
      const float* sb = Ss + t4 * kLdS + n8 + g;
      float dacc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
      for (int k = 0; k < dp; k += 8) {
        const unsigned b0 = to_tf32(sb[k * kLdS]), b1 = to_tf32(sb[(k + 4) * kLdS]);
        mma_tf32(dacc, tf32_bits(w0[k]), tf32_bits(w0[8 * lda + k]), tf32_bits(w0[k + 4]), tf32_bits(w0[8 * lda + k + 4]), b0,
                 b1);
        mma_tf32(oacc[j], tf32_bits(q0[k]), tf32_bits(q0[8 * lda + k]), tf32_bits(q0[k + 4]), tf32_bits(q0[8 * lda + k + 4]),
                 b0, b1);
      }
      const int r0 = m16 + g, col = n8 + 2 * t4;
      // δ is only an operand below (Q·δ, k̂ᵀ·δ): stored rounded to TF32 once, read as is.
      D[r0 * kLdS + col] = kda_tf32_round(Ub[r0 * kLdS + col] - dacc[0]);
      D[r0 * kLdS + col + 1] = kda_tf32_round(Ub[r0 * kLdS + col + 1] - dacc[1]);
      D[(r0 + 8) * kLdS + col] = kda_tf32_round(Ub[(r0 + 8) * kLdS + col] - dacc[2]);
      D[(r0 + 8) * kLdS + col + 1] = kda_tf32_round(Ub[(r0 + 8) * kLdS + col + 1] - dacc[3]);
    }
    __syncthreads();  // δ complete
    // o += Q·δ (Q is zero above the diagonal and outside n × n); store rows < n, columns < w.
#pragma unroll
    for (int j = 0; j < kOT; ++j) {
      const int tile = warp + kNWarps * j;
      if (tile >= kMt * 4) continue;
      const int m16 = (tile >> 2) * 16, n8 = (tile & 3) * 8;
      const float* qc = Qcb + (m16 + g) * ldq + t4;
      const float* db = D + t4 * kLdS + n8 + g;
#pragma unroll
      for (int k = 0; k < C; k += 8)
        mma_tf32(oacc[j], tf32_bits(qc[k]), tf32_bits(qc[8 * ldq + k]), tf32_bits(qc[k + 4]), tf32_bits(qc[8 * ldq + k + 4]),
                 tf32_bits(db[k * kLdS]), tf32_bits(db[(k + 4) * kLdS]));
      const int r0 = m16 + g, col = n8 + 2 * t4;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = r0 + (e >> 1) * 8, cc = col + (e & 1);
        if (t < n && cc < w) out[base + size_t(t) * P + c0 + cc] = oacc[j][e];
      }
    }
    // S ← Diag(γ_n)·S + k̂ᵀ·δ, tile (m, nn) of 16 key rows × 8 columns; A = k̂ᵀ read transposed.
    for (int tile = warp; tile < (dp / 16) * 4; tile += kNWarps) {
      const int m16 = (tile >> 2) * 16, n8 = (tile & 3) * 8, r0 = m16 + g, col = n8 + 2 * t4;
      float acc[4] = {eb[r0] * Ss[r0 * kLdS + col], eb[r0] * Ss[r0 * kLdS + col + 1],
                      eb[r0 + 8] * Ss[(r0 + 8) * kLdS + col], eb[r0 + 8] * Ss[(r0 + 8) * kLdS + col + 1]};
      const float* ka = Kb + t4 * ldk + m16 + g;
      const float* db = D + t4 * kLdS + n8 + g;
#pragma unroll
      for (int k = 0; k < C; k += 8)
        mma_tf32(acc, tf32_bits(ka[k * ldk]), tf32_bits(ka[k * ldk + 8]), tf32_bits(ka[(k + 4) * ldk]),
                 tf32_bits(ka[(k + 4) * ldk + 8]), tf32_bits(db[k * kLdS]), tf32_bits(db[(k + 4) * kLdS]));
      Ss[r0 * kLdS + col] = acc[0];
      Ss[r0 * kLdS + col + 1] = acc[1];
      Ss[(r0 + 8) * kLdS + col] = acc[2];
      Ss[(r0 + 8) * kLdS + col + 1] = acc[3];
    }
    cp_async_commit();
    __syncthreads();  // S updated; this buffer and δ free for reuse
  }
  cp_async_wait_all();
  for (int i = threadIdx.x; i < d * kSliceN; i += blockDim.x) {
    const int r = i / kSliceN, cc = i % kSliceN;
    if (cc < w) Sg[size_t(r) * d + c0 + cc] = Ss[r * kLdS + cc];
  }
}

template <int C>
void launch_passes(CudaBackend::Impl& m, int T, int H, int d, float* qn, float* kn, float* vc, float* gl,
                   const float* bs, float* Qm, float* egc, float* S, float* out) {
  const int chunks = (T + C - 1) / C;
  const size_t ism = intra_mma_smem(d, C);
  if (ism > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kda_intra_mma_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ism)),
               "cudaFuncSetAttribute (kda_core chunked intra, tensor cores)");
  kda_intra_mma_kernel<C><<<dim3(chunks, H), kThreads, ism, m.stream>>>(T, H, d, qn, kn, vc, gl, bs, Qm, egc);
  m.launched("kda_core chunked: intra-chunk kernel (tensor cores)");
  StateLayout L = state_layout(d, C, 2);
  if (state_mma_smem(L, C) + 1024 > size_t(m.max_smem_optin)) L = state_layout(d, C, 1);
  const size_t ssm = state_mma_smem(L, C);
  if (ssm > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kda_state_mma_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ssm)),
               "cudaFuncSetAttribute (kda_core chunked state, tensor cores)");
  kda_state_mma_kernel<C><<<dim3(H, (d + kSliceN - 1) / kSliceN), kThreads, ssm, m.stream>>>(T, H, d, L, qn, kn, gl, vc,
                                                                                            Qm, egc, S, out);
  m.launched("kda_core chunked: state kernel (tensor cores)");
}

}  // namespace

size_t kda_mma_smem(int d, int C) {
  return std::max(intra_mma_smem(d, C), state_mma_smem(state_layout(d, C, 1), C));
}

void kda_chunk_passes_mma(CudaBackend::Impl& m, int T, int H, int d, int C, float* qn, float* kn, float* vc,
                          float* gl, const float* bs, float* Qm, float* egc, float* S, float* out) {
  switch (C) {
    case 16: launch_passes<16>(m, T, H, d, qn, kn, vc, gl, bs, Qm, egc, S, out); break;
    case 32: launch_passes<32>(m, T, H, d, qn, kn, vc, gl, bs, Qm, egc, S, out); break;
    case 64: launch_passes<64>(m, T, H, d, qn, kn, vc, gl, bs, Qm, egc, S, out); break;
    default: throw Error("CUDA backend: kda_core chunked (tensor cores): chunk " + std::to_string(C) + " (16, 32, 64)");
  }
}

}  // namespace cuda
}  // namespace wren
