// CUDA backend: the fused KDA decode step (docs/model.md#kda, steps 2-7; docs/gpu-method.md#kda-decode),
// one launch per layer and token, in three forms with the same arithmetic:
// - the split form (kda_decode_split_kernel below; every d <= 128 with a conv kernel <= 4 that the
//   bulk form does not take, and the batched step: one launch, many sequences): a cluster of
//   ceil(d/32) blocks per head, each owning 32 value columns, the state loaded straight into
//   registers before anything else (run 24-kdadec: 11.4 µs at K3 sizes, slower than the bulk form's
//   8.0 µs for one sequence; 4.5 µs per sequence for Kimi Linear in batches of 4);
// - the bulk-copy form (the default where it applies) (kda_decode_bulk_kernel below; d % 4 == 0, a 16-byte aligned state: K3 and
//   Kimi Linear): one block per head, S_h brought into shared memory by the copy engine in chunks
//   of 32 rows while the threads do the conv, gates and norms;
// - the cluster form (every other d <= 128; run 17), described here:
// The delta rule makes the value columns of S_h independent once
// q̂, k̂, α and β are known, so a head is split into ceil(d/32) blocks, each owning 32 value columns,
// grouped as one thread-block cluster per head (Hopper, sm_90); a block is NW warps, warp w holding
// rows [w·RW, (w+1)·RW) of the block's columns (d = 128: 2 warps of 64 rows; else warps of 32):
//
//   1. every thread issues the loads of its part of its column of S_h (kept in registers) before
//      anything else, so the state read overlaps the rest of the prologue;
//   2. thread c of warp 0 does the conv + SiLU of channel c of q, k and v (advancing those three
//      windows: no other thread reads them), its decay α_c and the f64 squares of q_c, k_c;
//   3. cluster barrier; each block gathers q, k, α of the whole head and the partial sums of the
//      other blocks through distributed shared memory, summing the partials in block order (the
//      same order in every block, so every block gets the same L2 factors);
//   4. the delta rule on the thread's column, the CPU's order: S[r][c] ·= α_r and u += k̂_r·S[r][c]
//      for r = 0, 1, … (one chain: warp 1 continues warp 0's partial sum); u = β(v_c − u);
//      S[r][c] += k̂_r·u, o += q̂_r·S[r][c], each row written back as soon as it is final: S is read
//      once and written once;
//   5. the f64 Σo² of the head through the cluster again, then RMSNorm · o_norm · σ(gate).
//
// The arithmetic of each quantity is the token kernel's (kda.cu) expression by expression; only the
// f64 partial sums of the three squared norms are grouped differently (f64, ~1e-16 relative).
#include <cooperative_groups.h>

#include <utility>

#include "backends/cuda/kda_decode.cuh"
#include "core/kda_math.h"

namespace wren::cuda {

namespace {

namespace cg = cooperative_groups;

/// f64 sum over the warp by an xor butterfly (every lane ends with the same bits: each step adds
/// the same two values in either order).
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// ---- Shared pieces of the three forms ----

/// e^x: the token kernel's (f64, rounded once) in exact mode; CUDA's f32 expf in fast mode.
template <bool FAST>
__device__ __forceinline__ float ex(float x) {
  if constexpr (FAST) return expf(x);
  else return exp_f(x);
}
/// σ(x) = 1 / (1 + e^-x) in f32 (exact: kda::sigmoid_b's expression).
template <bool FAST>
__device__ __forceinline__ float sig(float x) {
  return 1.0f / (1.0f + ex<FAST>(-x));
}
/// Log decay of one key channel (kda::log_decay's expression; fast mode: f32 exp).
template <bool FAST>
__device__ __forceinline__ float log_decay_t(bool softplus, float A, float z, float lower) {
  if constexpr (!FAST) return kda::log_decay(softplus, A, z, lower);
  else return softplus ? -A * (z > 20.f ? z : log1pf(expf(z))) : lower * sig<true>(A * z);
}

/// Loads channel `ch`'s conv taps [K] and window [K-1] (oldest first) of input m (0 q, 1 k, 2 v)
/// into registers; N >= K is the arrays' extent (the taps past K are left unset).
template <int N>
__device__ __forceinline__ void load_conv(const float* cw, const float* conv, int P, int m, int ch, int K,
                                          float (&wc)[N], float (&wi)[N]) {
  const float* win = conv + (size_t(m) * P + ch) * (K - 1);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    wc[j] = j < K ? __ldg(cw + size_t(ch) * K + j) : 0.f;
    wi[j] = j < K - 1 ? win[j] : 0.f;
  }
}

/// Conv + SiLU of one channel at one token (kda::conv_silu's expression), the window in registers
/// advanced by the token (kda::conv_push).
template <bool FAST, int N>
__device__ __forceinline__ float conv_step(const float (&wc)[N], float (&wi)[N], int K, float x) {
  float y;
  if constexpr (!FAST) {
    y = kda::conv_silu(wc, K, x, kda::WindowTaps{wi});
  } else {
    float acc = wc[K - 1] * x;
#pragma unroll
    for (int j = 0; j < N - 1; ++j)
      if (j < K - 1) acc += wc[j] * wi[j];
    y = acc * sig<true>(acc);
  }
  kda::conv_push(wi, K, x);
  return y;
}

/// Writes channel `ch`'s advanced window of input m back.
template <int N>
__device__ __forceinline__ void store_conv(float* conv, int P, int m, int ch, int K, const float (&wi)[N]) {
  float* win = conv + (size_t(m) * P + ch) * (K - 1);
#pragma unroll
  for (int j = 0; j < N - 1; ++j)
    if (j < K - 1) win[j] = wi[j];
}


/// One block = 32 value columns of head blockIdx.y (the cluster, along x, is the head), as NW warps:
/// warp w keeps rows [w·RW, (w+1)·RW) of those columns of S_h in registers (RW·NW >= d). The sums
/// over rows stay one sequential chain in row order: warp w continues the partial sum that warp
/// w − 1 handed over in shared memory (the products are formed before the hand-over arrives).
/// FIXED: d == RW·NW at compile time (the row stride is an immediate offset, no guards).
template <int RW, int NW, bool FIXED>
__global__ void __launch_bounds__(kWarp * NW) kda_decode_kernel(KdaDecodeArgs a) {
  constexpr int DMAX = RW * NW;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float xq[kWarp], xk[kWarp], xa[kWarp];  // this block's conv'd q, k (before L2) and α
  __shared__ float vcol[kWarp];                       // conv'd v of this block's columns
  __shared__ float ubuf[kWarp], obuf[kWarp];          // the row chains of u and o, per column
  __shared__ double part[3];                          // this block's Σq², Σk², then Σo²
  __shared__ float qs[DMAX], ks[DMAX], al[DMAX];      // the head's q̂, k̂, α
  const int d = FIXED ? DMAX : a.d, P = a.H * d, K = a.K;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int h = blockIdx.y, rank = blockIdx.x, blocks = gridDim.x;
  const int c = rank * kWarp + lane;  // value column (and channel within the head) of this thread
  const bool live = c < d;
  const int ch = h * d + c, r0 = warp * RW;
  float* Sg = a.S + size_t(h) * d * d;

  // 1. This warp's rows of the column into registers, issued first (a warp reads 32 consecutive
  //    floats per row; nothing waits on them until step 4).
  float s[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) s[i] = (live && (FIXED || r0 + i < d)) ? Sg[size_t(r0 + i) * d + c] : 0.f;

  // 1b. Every other global input of the step into registers, before any store: as far as the
  //    compiler knows the stores to S and to the windows may alias them, and a read issued after a
  //    store waits for it (each such read was one more DRAM round trip on the critical path).
  float xin[3] = {0, 0, 0}, zc = 0, gate_v = 0, onorm_v = 0;
  float wc[3][kKdaDecodeMaxConv], wi[3][kKdaDecodeMaxConv];
  const float alog = __ldg(a.a_log + h), braw = __ldg(a.beta + h);
  if (warp == 0 && live) {
    const float* in[3] = {a.q, a.k, a.v};
    const float* cw[3] = {a.q_conv, a.k_conv, a.v_conv};
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      xin[m] = __ldg(in[m] + ch);
      load_conv(cw[m], a.conv, P, m, ch, K, wc[m], wi[m]);
    }
    zc = __ldg(a.z + ch) + __ldg(a.dt_bias + ch);
    gate_v = __ldg(a.gate + ch);
    onorm_v = __ldg(a.o_norm + c);
  }

  // 2. Warp 0, channel c: conv + SiLU of q, k, v (the window advances), the decay α_c.
  if (warp == 0) {
    float yq = 0, yk = 0, yv = 0, alpha = 0;
    if (live) {
      float y[3];
#pragma unroll
      for (int m = 0; m < 3; ++m) {
        y[m] = conv_step<false>(wc[m], wi[m], K, xin[m]);
        store_conv(a.conv, P, m, ch, K, wi[m]);
      }
      yq = y[0], yk = y[1], yv = y[2];
      const float A = exp_f(alog);
      alpha = exp_f(kda::log_decay(a.softplus_gate, A, zc, a.lower));
    }
  const double sq = warp_sum(double(yq) * yq), sk = warp_sum(double(yk) * yk);
    xq[lane] = yq, xk[lane] = yk, xa[lane] = alpha, vcol[lane] = yv;
    if (lane == 0) part[0] = sq, part[1] = sk;
  }
  cluster.sync();

  // 3. The head's L2 factors (partials in block order) and q̂, k̂, α from every block.
  double tq = 0, tk = 0;
  for (int j = 0; j < blocks; ++j) {
    const double* pj = cluster.map_shared_rank(part, j);
    tq += pj[0];
    tk += pj[1];
  }
  const float invq = kda::l2_factor(tq, 1.0f / sqrtf(float(d))), invk = kda::l2_factor(tk, 1.0f);
  for (int r = tid; r < d; r += kWarp * NW) {
    const int j = r / kWarp, i = r % kWarp;
    qs[r] = cluster.map_shared_rank(xq, j)[i] * invq;
    ks[r] = cluster.map_shared_rank(xk, j)[i] * invk;
    al[r] = cluster.map_shared_rank(xa, j)[i];
  }
  __syncthreads();
  const float b = kda::beta_gate(braw);

  // 4a. Decay this warp's rows; u = kᵀS as one chain over the rows in order.
  float p[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int r = r0 + i;
    if (FIXED || r < d) {
      s[i] = s[i] * al[r];
      p[i] = ks[r] * s[i];
    }
  }
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    if (warp == w) {
      float u = w == 0 ? 0.f : ubuf[lane];
#pragma unroll
      for (int i = 0; i < RW; ++i)
        if (FIXED || r0 + i < d) u += p[i];
      ubuf[lane] = w + 1 < NW ? u : b * (vcol[lane] - u);
    }
    __syncthreads();
  }
  // 4b. S += k ⊗ β(v − u), each row written back at once; o = qᵀS as one chain over the rows.
  const float u = ubuf[lane];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int r = r0 + i;
    if (FIXED || r < d) {
      s[i] = s[i] + ks[r] * u;
      p[i] = qs[r] * s[i];
      if (live) Sg[size_t(r) * d + c] = s[i];
    }
  }
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    if (warp == w) {
      float o = w == 0 ? 0.f : obuf[lane];
#pragma unroll
      for (int i = 0; i < RW; ++i)
        if (FIXED || r0 + i < d) o += p[i];
      obuf[lane] = o;
    }
    __syncthreads();
  }

  // 5. Per-head RMSNorm (f64 Σo², partials in block order), × o_norm, × σ(gate).
  const float o = obuf[lane];
  if (warp == 0) {
    const double so = warp_sum(live ? double(o) * o : 0.0);
    if (lane == 0) part[2] = so;
  }
  cluster.sync();
  if (warp == 0) {
    double to = 0;
    for (int j = 0; j < blocks; ++j) to += cluster.map_shared_rank(part, j)[2];
    const float inv = float(1.0 / sqrt(to / d + a.eps));
    if (live) {
      float y = o * inv * onorm_v;
      y *= sigmoid_f(gate_v);
      a.out[ch] = y;
    }
  }
  cluster.sync();  // no block exits while another still reads its shared memory
}

// ---- The bulk-copy kernel (d % 4 == 0, d <= 128; docs/gpu-method.md#kda-decode) ----

/// Rows of S_h per bulk copy: each has its own mbarrier, so pass 1 starts on the first rows while
/// the later ones are still arriving.
constexpr int kBulkRows = 32;
constexpr int kBulkChunks = (kKdaDecodeMaxDim + kBulkRows - 1) / kBulkRows;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

/// Waits for phase `parity` of the mbarrier at shared address `bar`.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred P1;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
      "@P1 bra DONE_%=;\n\t"
      "bra WAIT_%=;\n"
      "DONE_%=:\n\t}" ::"r"(bar),
      "r"(parity)
      : "memory");
}

/// One block = head blockIdx.x, one thread per value column c (blockDim = d rounded up to 32), the
/// token kernel's (kda.cu) arithmetic for T = 1 expression by expression, with S_h arriving by
/// bulk asynchronous copies (the copy engine, no registers held) while the threads do the conv,
/// gates and norms:
///   0. thread 0 starts ceil(d/32) bulk copies of 32 rows of S_h each into shared memory, one
///      mbarrier each; every thread first loads its channel's inputs, weights and windows;
///   1. conv + SiLU of channel c of q, k, v (the windows advance), L2 factors (block_sum, the token
///      kernel's order), α_c, β;
///   2. pass 1 over the rows in order, waiting for each chunk: u = Σ_r k̂_r·(S[r][c]·α_r);
///   3. pass 2: S'[r][c] = S[r][c]·α_r + k̂_r·u stored straight to global memory, o = Σ_r q̂_r·S'[r][c];
///   4. RMSNorm (block_sum), × o_norm × σ(gate).
/// S is read once (by the copies) and written once. No cluster, one block per head.
/// KC = the conv kernel size at compile time (1..4): the taps and windows stay in registers (with
/// a run-time K they were local memory, and each tap a dependent round trip: run 22-decode).
template <int KC>
__global__ void __launch_bounds__(kKdaDecodeMaxDim) kda_decode_bulk_kernel(KdaDecodeArgs a) {
  extern __shared__ __align__(16) float smem[];
  __shared__ double red[32];
  __shared__ __align__(8) uint64_t bars[kBulkChunks];
  constexpr int K = KC;
  const int d = a.d, P = a.H * d, h = blockIdx.x, c = threadIdx.x;
  const bool live = c < d;
  const int ch = h * d + c;
  float* Ss = smem;        // [d][d] S_h as S[key][value]
  float* qs = Ss + d * d;  // [d] q̂
  float* ks = qs + d;      // [d] k̂
  float* al = ks + d;      // [d] α
  float* Sg = a.S + size_t(h) * d * d;
  const int chunks = (d + kBulkRows - 1) / kBulkRows;

  // 0. This thread's inputs first (they go out ahead of the state's bytes).
  float xin[3] = {0, 0, 0}, zc = 0, gate_v = 0, onorm_v = 0;
  float wc[3][K], wi[3][K];  // wi: K - 1 taps used (K >= 1 keeps the array non-empty)
  const float alog = __ldg(a.a_log + h), braw = __ldg(a.beta + h);
  if (live) {
    const float* in[3] = {a.q, a.k, a.v};
    const float* cw[3] = {a.q_conv, a.k_conv, a.v_conv};
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      xin[m] = __ldg(in[m] + ch);
      load_conv(cw[m], a.conv, P, m, ch, K, wc[m], wi[m]);
    }
    zc = __ldg(a.z + ch) + __ldg(a.dt_bias + ch);
    gate_v = __ldg(a.gate + ch);
    onorm_v = __ldg(a.o_norm + c);
  }
  if (c == 0) {
    for (int j = 0; j < chunks; ++j)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[j])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    for (int j = 0; j < chunks; ++j) {
      const int r0 = j * kBulkRows, rows = min(kBulkRows, d - r0);
      const uint32_t bytes = uint32_t(rows) * d * 4, bar = smem_addr(&bars[j]);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       smem_addr(Ss + size_t(r0) * d)),
                   "l"(Sg + size_t(r0) * d), "r"(bytes), "r"(bar)
                   : "memory");
    }
  }

  // 1. Conv + SiLU of channel c of q, k, v (windows advance: only this thread touches them).
  float yq = 0, yk = 0, yv = 0, alpha = 0;
  if (live) {
    float y[3];
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      y[m] = conv_step<false>(wc[m], wi[m], K, xin[m]);
      store_conv(a.conv, P, m, ch, K, wi[m]);
    }
    yq = y[0], yk = y[1], yv = y[2];
    const float A = exp_f(alog);
    alpha = exp_f(kda::log_decay(a.softplus_gate, A, zc, a.lower));
  }
  // The token kernel's L2 sums: thread c adds channel c, then block_sum (the same tree).
  const double sq = block_sum(live ? double(yq) * yq : 0.0, red);
  const double sk = block_sum(live ? double(yk) * yk : 0.0, red);
  const float invq = kda::l2_factor(sq, 1.0f / sqrtf(float(d))), invk = kda::l2_factor(sk, 1.0f);
  if (live) qs[c] = yq * invq, ks[c] = yk * invk, al[c] = alpha;
  const float b = kda::beta_gate(braw);
  __syncthreads();  // qs, ks, al complete (the mbarrier inits were published by block_sum's barriers)

  // 2. Pass 1: u = Σ_r k̂_r·(S[r][c]·α_r), one chain in row order, chunk by chunk as they land.
  //    Rows go by fours (d % 4 == 0): α, k̂, q̂ of four rows are one 16-byte shared load.
  const float4* al4 = reinterpret_cast<const float4*>(al);
  const float4* ks4 = reinterpret_cast<const float4*>(ks);
  const float4* qs4 = reinterpret_cast<const float4*>(qs);
  float u = 0;
  for (int j = 0; j < chunks; ++j) {
    mbar_wait(smem_addr(&bars[j]), 0);
    const int r1 = min(d, (j + 1) * kBulkRows);
    if (live) {
#pragma unroll 4
      for (int r = j * kBulkRows; r < r1; r += 4) {
        const float4 a4 = al4[r / 4], k4 = ks4[r / 4];
        const float* Sr = Ss + r * d + c;
        u += k4.x * (Sr[0] * a4.x);
        u += k4.y * (Sr[d] * a4.y);
        u += k4.z * (Sr[2 * d] * a4.z);
        u += k4.w * (Sr[3 * d] * a4.w);
      }
    }
  }
  u = b * (yv - u);
  // 3. Pass 2: S' = S·α + k̂·u to global memory (st.global: no alias with the shared reads), o = q̂ᵀS'.
  float o = 0;
  if (live) {
#pragma unroll 4
    for (int r = 0; r < d; r += 4) {
      const float4 a4 = al4[r / 4], k4 = ks4[r / 4], q4 = qs4[r / 4];
      const float* Sr = Ss + r * d + c;
      float* Sw = Sg + size_t(r) * d + c;
      const float s0 = Sr[0] * a4.x + k4.x * u, s1 = Sr[d] * a4.y + k4.y * u;
      const float s2 = Sr[2 * d] * a4.z + k4.z * u, s3 = Sr[3 * d] * a4.w + k4.w * u;
      __stcg(Sw, s0);
      __stcg(Sw + d, s1);
      __stcg(Sw + 2 * d, s2);
      __stcg(Sw + 3 * d, s3);
      o += q4.x * s0;
      o += q4.y * s1;
      o += q4.z * s2;
      o += q4.w * s3;
    }
  }
  // 4. Per-head RMSNorm (the token kernel's block_sum), × o_norm, × σ(gate).
  const double so = block_sum(live ? double(o) * o : 0.0, red);
  if (live) {
    const float inv = float(1.0 / sqrt(so / d + a.eps));
    float y = o * inv * onorm_v;
    y *= sigmoid_f(gate_v);
    a.out[ch] = y;
  }
}

// ---- The split kernel (every d <= 128, K <= 4; the default; docs/gpu-method.md#kda-decode) ----

/// Value columns per block of the split form (one warp's worth: the token kernel's RMSNorm tree
/// sums warps of 32 columns, so one block's partial is one of that tree's warp partials).
constexpr int kSplitCols = 32;

/// One block = value columns [32j, 32j + 32) of head blockIdx.y of sequence blockIdx.z (j =
/// blockIdx.x, the block's rank in the head's cluster of ceil(d/32) blocks), ceil(d/32) warps:
/// warp w holds rows [32w, 32w + 32) of the block's columns of S_h in registers, lane = column.
///   0. every thread issues the loads of its 32 state values, then its channel's conv taps and
///      windows and the other weights (these do not depend on the kernel before: with a
///      programmatic dependent launch they go out while that kernel drains), then waits for the
///      kernel before and loads the step's inputs;
///   1. thread t: conv + SiLU of channel t of q and k, α_t (every block of the head computes all d
///      of them: the inputs are a few KB from L2), the L2 factors by block_sum (the token
///      kernel's tree: its blocks have the same ceil(d/32) warps); warp 0: v of its column;
///   2. products k̂_r·(S[r][c]·α_r) in parallel, then warp 0 adds them in row order (exact: one
///      chain, the CPU's order; fast: each warp adds its 32 rows, warp 0 the ceil(d/32) partials);
///      u = β(v − u);
///   3. S' = S·α + k̂·u stored straight back, products q̂_r·S'[r][c], o summed as in 2;
///   4. Σo² of the block's 32 columns (one warp butterfly = one warp partial of the token kernel's
///      block_sum) pushed into every block of the cluster, one cluster barrier, the partials added
///      in rank order (the token kernel's warp order); RMSNorm × o_norm × σ(gate). The conv windows
///      are written back after that barrier, block j writing channels [32j, 32j + 32) of q, k and
///      its columns of v (every block has read all of q's and k's windows before it arrives).
/// S is read once and written once; one cluster barrier. FIXED: d == 128 at compile time. FAST:
/// fast precision mode (f32 exps, tree sums; within docs/validation.md's fast-mode bounds).
template <int KC, bool FIXED, bool FAST>
__global__ void __launch_bounds__(kKdaDecodeMaxDim) kda_decode_split_kernel(KdaDecodeArgs a, KdaDecodeStates st) {
  constexpr int K = KC, DM = kKdaDecodeMaxDim;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float qs[DM], ks[DM], al[DM];  // the head's q̂, k̂, α
  __shared__ float prod[DM][kSplitCols];    // the products of a pass, [row][column]
  __shared__ float ush[kSplitCols];         // β(v − u) per column
  __shared__ double red[kWarp];
  __shared__ double opart[DM / kSplitCols];  // Σo² of each block of the cluster, by rank
  const int d = FIXED ? DM : a.d, P = a.H * d;
  const int j = blockIdx.x, h = blockIdx.y, seq = blockIdx.z, blocks = gridDim.x;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, nw = blockDim.x / kWarp;
  const int c = j * kSplitCols + lane;  // this thread's value column
  const bool colok = c < d, live = tid < d;
  const int ch = h * d + tid, vch = h * d + c;  // q/k channel of this thread; v channel of its column
  float* Sg = st.S[seq] + size_t(h) * d * d;
  float* conv = st.conv[seq];
  const size_t io = size_t(seq) * P;
  const int r0 = warp * kWarp;

  // 0. The state first, then what does not depend on the kernel before, then the inputs.
  float sv[kWarp];
#pragma unroll
  for (int i = 0; i < kWarp; ++i)
    sv[i] = (colok && (FIXED || r0 + i < d)) ? __ldcg(Sg + size_t(r0 + i) * d + c) : 0.f;
  float wq[K], iq[K], wk[K], ik[K], wv[K], iv[K];
  float dtb = 0, onv = 0;
  const float alog = __ldg(a.a_log + h);
  if (live) {
    load_conv(a.q_conv, conv, P, 0, ch, K, wq, iq);
    load_conv(a.k_conv, conv, P, 1, ch, K, wk, ik);
    dtb = __ldg(a.dt_bias + ch);
  }
  if (warp == 0 && colok) {
    load_conv(a.v_conv, conv, P, 2, vch, K, wv, iv);
    onv = __ldg(a.o_norm + c);
  }
  pdl_wait();
  float xq = 0, xk = 0, zc = 0, xv = 0, gv = 0;
  const float braw = a.beta[size_t(seq) * a.H + h];
  if (live) xq = a.q[io + ch], xk = a.k[io + ch], zc = a.z[io + ch] + dtb;
  if (warp == 0 && colok) xv = a.v[io + vch], gv = a.gate[io + vch];

  // 1. Conv + SiLU, α, L2 factors (the token kernel's block_sum), β.
  float yq = 0, yk = 0, yv = 0, alpha = 0;
  if (live) {
    yq = conv_step<FAST>(wq, iq, K, xq);
    yk = conv_step<FAST>(wk, ik, K, xk);
    const float A = ex<FAST>(alog);
    alpha = ex<FAST>(log_decay_t<FAST>(a.softplus_gate, A, zc, a.lower));
  }
  if (warp == 0 && colok) yv = conv_step<FAST>(wv, iv, K, xv);
  const double sq = block_sum(live ? double(yq) * yq : 0.0, red);
  const double sk = block_sum(live ? double(yk) * yk : 0.0, red);
  const float invq = kda::l2_factor(sq, 1.0f / sqrtf(float(d))), invk = kda::l2_factor(sk, 1.0f);
  if (live) qs[tid] = yq * invq, ks[tid] = yk * invk, al[tid] = alpha;
  const float b = sig<FAST>(braw);  // kda::beta_gate
  __syncthreads();

  // 2. u = Σ_r k̂_r·(S[r][c]·α_r): products in parallel, the sum in row order by warp 0.
  float part = 0;
#pragma unroll
  for (int i = 0; i < kWarp; ++i) {
    const int r = r0 + i;
    if (FIXED || r < d) {
      const float s = sv[i] * al[r];
      sv[i] = s;
      const float p = ks[r] * s;
      if constexpr (FAST) part += p;
      else prod[r][lane] = p;
    }
  }
  if constexpr (FAST) prod[warp][lane] = part;
  __syncthreads();
  if (warp == 0) {
    float u = 0;
    if constexpr (FAST) {
      for (int w = 0; w < nw; ++w) u += prod[w][lane];
    } else {
#pragma unroll 8
      for (int r = 0; r < d; ++r) u += prod[r][lane];
    }
    ush[lane] = b * (yv - u);
  }
  __syncthreads();

  // 3. S' = S·α + k̂·u back to global memory; o = Σ_r q̂_r·S'[r][c] as in 2.
  const float u = ush[lane];
  part = 0;
#pragma unroll
  for (int i = 0; i < kWarp; ++i) {
    const int r = r0 + i;
    if (FIXED || r < d) {
      const float s = sv[i] + ks[r] * u;
      if (colok) __stcg(Sg + size_t(r) * d + c, s);
      const float p = qs[r] * s;
      if constexpr (FAST) part += p;
      else prod[r][lane] = p;
    }
  }
  if constexpr (FAST) prod[warp][lane] = part;
  __syncthreads();

  // 4. Σo² through the cluster (one barrier), RMSNorm × o_norm × σ(gate); the windows back.
  float o = 0;
  if (warp == 0) {
    if constexpr (FAST) {
      for (int w = 0; w < nw; ++w) o += prod[w][lane];
    } else {
#pragma unroll 8
      for (int r = 0; r < d; ++r) o += prod[r][lane];
    }
    const double so = warp_sum(colok ? double(o) * o : 0.0);
    if (lane < blocks) cluster.map_shared_rank(opart, lane)[j] = so;
  }
  cluster.sync();
  if (warp == 0 && colok) {
    double to = 0;
    for (int t = 0; t < blocks; ++t) to += opart[t];
    const float inv = float(1.0 / sqrt(to / d + a.eps));
    float y = o * inv * onv;
    y *= sig<FAST>(gv);
    a.out[io + vch] = y;
    store_conv(conv, P, 2, vch, K, iv);
  }
  if (live && warp == j) {
    store_conv(conv, P, 0, ch, K, iq);
    store_conv(conv, P, 1, ch, K, ik);
  }
}


constexpr const char* kLaunchWhat = "cudaLaunchKernelEx (kda_core decode)";

uint64_t launch_count(const CudaBackend::Impl& m) { return m.stats.launches + m.stats.graph_kernels; }

/// The launch rule of a decode step on the states st.S[0..n): a programmatic dependent launch
/// (it reads its state before the kernel before it has finished) unless a kernel that may still
/// be running touches one of these states. Only decode steps read memory before their wait (the
/// other programmatic launches wait before touching anything but weights, and trigger only after
/// their wait), so what may still run is the run of decode steps launched back to back since the
/// last other launch, and that launch itself (a token or chunked KDA kernel says which state it
/// touched through kda_note_launch). Updates that record; returns whether to launch programmatically.
bool decode_may_overlap(CudaBackend::Impl& m, const KdaDecodeStates& st, int n, size_t bytes) {
  if (launch_count(m) != m.kda_chain_at) m.kda_chain.clear();  // another kernel came between
  bool clash = false;
  for (int i = 0; i < n && !clash; ++i)
    for (size_t t = 0; t + 1 < m.kda_chain.size() && !clash; t += 2)
      clash = reinterpret_cast<const char*>(st.S[i]) < reinterpret_cast<const char*>(m.kda_chain[t + 1]) &&
              reinterpret_cast<const char*>(m.kda_chain[t]) < reinterpret_cast<const char*>(st.S[i]) + bytes;
  const bool pdl = m.kda_decode_pdl && !clash;
  if (!pdl) m.kda_chain.clear();  // an ordinary launch: what came before it has completed when it starts
  for (int i = 0; i < n; ++i) {
    m.kda_chain.push_back(st.S[i]);
    m.kda_chain.push_back(reinterpret_cast<const float*>(reinterpret_cast<const char*>(st.S[i]) + bytes));
  }
  return pdl;
}

/// Impl::kda_decode_form after set_kda_decode_form(KdaDecodeForm::Split): the split form even where
/// the bulk form applies (the initial value, KdaDecodeForm::Split, means bulk first, as Bulk does).
constexpr KdaDecodeForm kSplitForced = static_cast<KdaDecodeForm>(3);

bool split_applies(const KdaDecodeArgs& a) { return a.T == 1 && a.d >= 1 && a.d <= kKdaDecodeMaxDim && a.K >= 1 && a.K <= 4; }

template <int KC, bool FIXED>
void launch_split_k(CudaBackend::Impl& m, const KdaDecodeArgs& a, const KdaDecodeStates& st, int B, dim3 grid,
                    dim3 block, unsigned blocks, bool pdl) {
  if (a.fast) launch_ex(m, kda_decode_split_kernel<KC, FIXED, true>, grid, block, 0, blocks, pdl, kLaunchWhat, a, st);
  else launch_ex(m, kda_decode_split_kernel<KC, FIXED, false>, grid, block, 0, blocks, pdl, kLaunchWhat, a, st);
}

template <bool FIXED>
void launch_split_d(CudaBackend::Impl& m, const KdaDecodeArgs& a, const KdaDecodeStates& st, int B, dim3 grid,
                    dim3 block, unsigned blocks, bool pdl) {
  switch (a.K) {
    case 1: launch_split_k<1, FIXED>(m, a, st, B, grid, block, blocks, pdl); break;
    case 2: launch_split_k<2, FIXED>(m, a, st, B, grid, block, blocks, pdl); break;
    case 3: launch_split_k<3, FIXED>(m, a, st, B, grid, block, blocks, pdl); break;
    default: launch_split_k<4, FIXED>(m, a, st, B, grid, block, blocks, pdl); break;
  }
}

void launch_split(CudaBackend::Impl& m, const KdaDecodeArgs& a, const KdaDecodeStates& st, int B) {
  const unsigned blocks = unsigned((a.d + kSplitCols - 1) / kSplitCols);
  const bool pdl = decode_may_overlap(m, st, B, size_t(a.H) * a.d * a.d * sizeof(float));
  const dim3 grid(blocks, unsigned(a.H), unsigned(B)), block(kWarp * blocks);
  if (a.d == kKdaDecodeMaxDim) launch_split_d<true>(m, a, st, B, grid, block, blocks, pdl);
  else launch_split_d<false>(m, a, st, B, grid, block, blocks, pdl);
  m.launched("kda_core decode kernel (split)");
  m.kda_chain_at = launch_count(m);
  m.stats.kda_decode_calls += uint64_t(B);
  m.stats.kda_decode_split_calls += uint64_t(B);
  if (pdl) ++m.stats.kda_decode_pdl;
}

template <int RW, int NW, bool FIXED>
void launch(CudaBackend::Impl& m, const KdaDecodeArgs& a) {
  const unsigned blocks = unsigned((a.d + kWarp - 1) / kWarp);
  launch_ex(m, kda_decode_kernel<RW, NW, FIXED>, dim3(blocks, unsigned(a.H)), dim3(kWarp * NW), 0, blocks, false,
            kLaunchWhat, a);
}

}  // namespace

void kda_note_launch(CudaBackend::Impl& m, const float* S, size_t bytes) {
  m.kda_chain.assign({S, reinterpret_cast<const float*>(reinterpret_cast<const char*>(S) + bytes)});
  m.kda_chain_at = launch_count(m);
}

bool kda_decode(CudaBackend::Impl& m, const KdaDecodeArgs& a) {
  if (a.T != 1 || a.d < 1 || a.d > kKdaDecodeMaxDim || a.K < 1 || a.K > kKdaDecodeMaxConv) return false;
  const size_t state_bytes = size_t(a.H) * a.d * a.d * sizeof(float);
  constexpr size_t kBulkSmemMax = (size_t(kKdaDecodeMaxDim) * kKdaDecodeMaxDim + 3 * kKdaDecodeMaxDim) * sizeof(float);
  const bool bulk_ok = a.d % 4 == 0 && a.K <= 4 && reinterpret_cast<uintptr_t>(a.S) % 16 == 0 &&
                       kBulkSmemMax <= size_t(m.max_smem_optin);
  // The stored form: the backend's initial value or Bulk = bulk where it applies, else split (the
  // fastest single-sequence forms, run 24-kdadec); kSplitForced = Split asked for explicitly.
  const KdaDecodeForm form = m.kda_decode_form;
  const bool forced_split = form == kSplitForced, bulk_first = form == KdaDecodeForm::Split || form == KdaDecodeForm::Bulk;
  if (split_applies(a) && (forced_split || (bulk_first && !bulk_ok))) {
    KdaDecodeStates st{};
    st.S[0] = a.S, st.conv[0] = a.conv;
    launch_split(m, a, st, 1);
    return true;
  }
  // Rows of 16-byte multiples on a 16-byte aligned state, conv kernel 1..4: the bulk-copy kernel
  // (K3, Kimi Linear).
  if (bulk_first && bulk_ok) {
    const size_t smem = (size_t(a.d) * a.d + 3 * size_t(a.d)) * sizeof(float);
    if (m.kda_decode_optin == 0) {  // once per backend: every form may take the d = 128 maximum
      const void* ks[4] = {reinterpret_cast<const void*>(kda_decode_bulk_kernel<1>),
                           reinterpret_cast<const void*>(kda_decode_bulk_kernel<2>),
                           reinterpret_cast<const void*>(kda_decode_bulk_kernel<3>),
                           reinterpret_cast<const void*>(kda_decode_bulk_kernel<4>)};
      for (const void* k : ks)
        check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBulkSmemMax)),
                   "cudaFuncSetAttribute (kda_core decode shared memory)");
      m.kda_decode_optin = int(kBulkSmemMax);
    }
    const int threads = (a.d + kWarp - 1) / kWarp * kWarp;
    switch (a.K) {
      case 1: kda_decode_bulk_kernel<1><<<a.H, threads, smem, m.stream>>>(a); break;
      case 2: kda_decode_bulk_kernel<2><<<a.H, threads, smem, m.stream>>>(a); break;
      case 3: kda_decode_bulk_kernel<3><<<a.H, threads, smem, m.stream>>>(a); break;
      default: kda_decode_bulk_kernel<4><<<a.H, threads, smem, m.stream>>>(a); break;
    }
    m.launched("kda_core decode kernel (bulk)");
    kda_note_launch(m, a.S, state_bytes);
    ++m.stats.kda_decode_calls;
    ++m.stats.kda_decode_bulk_calls;
    return true;
  }
  // The cluster form. d = 128: 2 warps of 64 rows, stride fixed. Other d: warps of 32 rows
  // (runtime strides cost address registers; 64 rows would spill).
  if (a.d == 128) launch<64, 2, true>(m, a);
  else if (a.d <= 32) launch<32, 1, false>(m, a);
  else if (a.d <= 64) launch<32, 2, false>(m, a);
  else launch<32, 4, false>(m, a);
  m.launched("kda_core decode kernel");
  kda_note_launch(m, a.S, state_bytes);
  ++m.stats.kda_decode_calls;
  return true;
}

bool kda_decode_batch(CudaBackend::Impl& m, const KdaDecodeArgs& a, const KdaDecodeStates& st, int B) {
  if (B < 1 || B > kKdaDecodeMaxBatch || !split_applies(a)) return false;
  launch_split(m, a, st, B);
  return true;
}

}  // namespace wren::cuda

namespace wren {

void CudaBackend::set_kda_decode_form(KdaDecodeForm f) {
  impl_->kda_decode_form = f == KdaDecodeForm::Split ? cuda::kSplitForced : f;
}
void CudaBackend::set_kda_decode_pdl(bool on) { impl_->kda_decode_pdl = on; }

}  // namespace wren
