// CUDA backend, fast precision mode: MLA prefill attention (T >= 2) on tensor cores.
//
// Flash path (the default when nope + extra <= 192 and v_head <= 128): the spec's non-absorbed form
// (docs/model.md#mla, steps 3-4), which is the same math as the absorbed one but 3.4x fewer
// products per (query, key) pair at K3 sizes (192 + 128 instead of 576 + 512 multiply-adds):
//   kv[h, s, :]   = c_s · W_kvb[h·(nope+v) .. +nope+v, :]ᵀ     (one batched BF16 product over the
//                                                              heads, f32 accumulation, BF16 out)
//   k[h, s, :]    = [kv[h, s, :nope] | k_x,s]                 (k_x: the cache row's raw extra part)
//   v[h, s, :]    = kv[h, s, nope:]
//   ctx[t, h, :]  = Σ_{s ≤ pos0+t} softmax_s(q[t, h, :] · k[h, s, :] / sqrt(nope + extra)) · v[h, s, :]
// The attention is one kernel in the FlashAttention-2 manner (tiles of 128 queries × 64 keys,
// online softmax, nothing T × n materialized): per block 8 warps of 16 query rows; K and V tiles
// double-buffered in shared memory by cp.async; Q·Kᵀ and P·V as mma.sync m16n8k16 with BF16
// operands (q rounded as it is loaded, P rounded from the f32 exponentials) and f32 accumulators;
// the running max, sum and output in f32 (2^x on the special-function unit, ex2.approx, with the scale · log2(e) folded into one fma).
// Chunk rule: key tiles start at absolute position 0 and are visited in order; a key past a query's
// own position is masked to −inf (p = 0 exactly, a tile entirely past it changes no bit: the
// rescale factor is exp2(0) = 1 and P·V adds zeros), and every product row depends only on its own
// query row. On sm_90a the heads past 64 / 64 take mla_wgmma.cu's warpgroup-MMA kernel instead (the
// same math on tiles of 128 queries × 128 keys, V read from a transposed copy). kv comes from a product whose algorithm is fixed per shape class (lt_product, M = n
// free), so a token's context does not depend on the chunk size or on the other tokens of the call.
//
// Materialized path (fallback for larger heads): the absorbed form
// (docs/model.md#mla-absorbed), as batched BF16 products through cuBLASLt with f32 accumulation:
//   q_abs[t, h, :]  = q_nope[t, h, :] · kv_b_k[h]            (batched over heads; kv_b BF16)
//   q_cat[t, h, :]  = [q_abs | q_extra]                        (BF16, W = kv_lora + extra)
//   S[h, t, s]      = scale · q_cat[t, h, :] · cache[s, :]     (cache rows 0..n-1 as BF16)
//   P[h, t, s]      = softmax over s <= pos0 + t (causal), 0 beyond (BF16)
//   c̄[t, h, :]      = Σ_s P[h, t, s] · cache[s, :kv_lora]
//   ctx[t, h, :]    = c̄[t, h, :] · kv_b_v[h]ᵀ
// The scores are materialized per group of heads (bounded scratch), not tiled flash-style: the
// products run on tensor cores, the softmax is one pass of a bandwidth-bound kernel. The f32 cache
// (written by mla.cu's cache kernel, read by decode) stays the state; only a BF16 copy of its rows
// feeds the products. Positions past a token's own are exact zeros in P and the algorithms are
// fixed per shape class (lt_product), so a token's context does not depend on the chunk size.
// Needs nope, extra, v_head, kv_lora multiples of 8 (16-byte rows for cuBLASLt); else declines.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/lt_state.cuh"
#include "backends/cuda/mla_flash.cuh"

namespace wren::cuda {

namespace {

constexpr int kSoftmaxThreads = 256;
constexpr size_t kScoreBudget = size_t(2) << 30;  ///< bytes of S + P per head group

/// q_cat16[t, h, c] = bf16(c < kv_lora ? q_abs[t, h, c] : q[t, h, nope + c - kv_lora]).
__global__ void qcat_kernel(const float* __restrict__ qabs, const float* __restrict__ q, int T, int H, int nope,
                            int extra, int kv_lora, __nv_bfloat16* __restrict__ out) {
  const int W = kv_lora + extra, qh = nope + extra;
  const size_t n = size_t(T) * H * W;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t th = i / W;
    const int c = int(i % W);
    const float v = c < kv_lora ? qabs[i] : q[th * qh + nope + (c - kv_lora)];
    out[i] = __float2bfloat16_rn(v);
  }
}

/// cache16[s, :] = bf16(cache[s, :]) for s < n, 0 for n <= s < n_pad.
__global__ void cache_bf16_kernel(const float* __restrict__ cache, int n, int n_pad, int W,
                                  __nv_bfloat16* __restrict__ out) {
  const size_t total = size_t(n_pad) * W, valid = size_t(n) * W;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(i < valid ? cache[i] : 0.f);
}

/// One block per (t, head g of the group): P = softmax(S) over s < pos0 + t + 1, zeros after.
/// Fixed thread striding and reduction order: the row's result depends only on its own values.
__global__ void causal_softmax_kernel(const float* __restrict__ S, int T, int n_pad, int pos0,
                                      __nv_bfloat16* __restrict__ P) {
  __shared__ float red[32];
  const int t = blockIdx.x, g = blockIdx.y, L = pos0 + t + 1;
  const float* row = S + (size_t(g) * T + t) * n_pad;
  __nv_bfloat16* out = P + (size_t(g) * T + t) * n_pad;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < L; s += blockDim.x) mx = fmaxf(mx, row[s]);
  mx = block_max(mx, red);
  float sum = 0.f;
  for (int s = threadIdx.x; s < L; s += blockDim.x) sum += __expf(row[s] - mx);
  for (int o = kWarp / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  __syncthreads();
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = sum;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < int(blockDim.x) / kWarp; ++w) total += red[w];
  const float inv = 1.f / total;
  for (int s = threadIdx.x; s < n_pad; s += blockDim.x)
    out[s] = __float2bfloat16_rn(s < L ? __expf(row[s] - mx) * inv : 0.f);
}


// ---- flash path ----

constexpr int kFlashWarps = 8;
constexpr int kFlashThreads = kFlashWarps * kWarp;
constexpr int kBr = kFlashWarps * 16;  ///< query rows per block (16 per warp)
constexpr int kBc = 64;                ///< keys per tile
constexpr size_t kKvBudget = size_t(1) << 30;  ///< bytes of expanded kv per head group

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

/// 16-byte cp.async; `bytes` 0 fills the destination with zeros (rows past the cache length).
__device__ __forceinline__ void cp_async16z(void* dst, const void* src, int bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/// Row strides (BF16 elements) of the K and V tiles: +8 makes a row 16 bytes longer than a multiple
/// of 128, so the 8 rows of an ldmatrix hit 8 different bank groups.
template <int DQK, int DV>
constexpr size_t flash_smem() { return size_t(2) * kBc * (DQK + 8 + DV + 8) * 2; }

/// Copies key tile [s0, s0 + kBc) of head kvh_base into Ks / Vs (rows ≥ n zero); columns ≥ qh / v
/// are never written (zeroed once at the kernel start).
template <int DQK, int DV>
__device__ __forceinline__ void flash_load_tile(const FlashArgs& a, const __nv_bfloat16* head, int s0,
                                                __nv_bfloat16* Ks, __nv_bfloat16* Vs) {
  constexpr int ldk = DQK + 8, ldv = DV + 8;
  const int kvh = a.nope + a.v, sn = a.nope / 8, sk = sn + a.extra / 8, seg = sk + a.v / 8;
  for (int i = threadIdx.x; i < kBc * seg; i += kFlashThreads) {
    const int r = i / seg, c = i % seg, s = s0 + r;
    const bool ok = s < a.n;
    const int sr = ok ? s : 0;
    const __nv_bfloat16* src;
    __nv_bfloat16* dst;
    if (c < sn) {
      src = head + size_t(sr) * kvh + c * 8, dst = Ks + r * ldk + c * 8;
    } else if (c < sk) {
      src = a.c16 + size_t(sr) * a.W + a.L + (c - sn) * 8, dst = Ks + r * ldk + a.nope + (c - sn) * 8;
    } else {
      src = head + size_t(sr) * kvh + a.nope + (c - sk) * 8, dst = Vs + r * ldv + (c - sk) * 8;
    }
    cp_async16z(dst, src, ok ? 16 : 0);
  }
}

template <int DQK, int DV>
__global__ void __launch_bounds__(kFlashThreads, 1) mla_flash_kernel(FlashArgs a) {
  extern __shared__ __align__(16) unsigned char flash_sm[];
  constexpr int ldk = DQK + 8, ldv = DV + 8;
  constexpr int KQ = DQK / 16, NS = kBc / 8, NO = DV / 8;
  constexpr int buf = kBc * (ldk + ldv);  // one K tile then its V tile; two buffers
  __nv_bfloat16* const sm0 = reinterpret_cast<__nv_bfloat16*>(flash_sm);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane >> 2, t4 = lane & 3;
  const int tiles = (a.T + kBr - 1) / kBr, qt = tiles - 1 - int(blockIdx.x);  // long rows first
  const int hl = blockIdx.y, h = a.h0 + hl, qh = a.nope + a.extra, kvh = a.nope + a.v;
  const int q0 = qt * kBr, wr0 = q0 + warp * 16;
  const __nv_bfloat16* head = a.kv + size_t(hl) * a.n_pad * kvh;
  // Padding columns of both buffers stay zero (cp.async writes columns < qh and < v only).
  for (int i = threadIdx.x; i < 2 * kBc; i += kFlashThreads) {
    __nv_bfloat16* kr = sm0 + (i / kBc) * buf + (i % kBc) * ldk;
    __nv_bfloat16* vr = sm0 + (i / kBc) * buf + kBc * ldk + (i % kBc) * ldv;
    for (int c = qh; c < ldk; ++c) kr[c] = __float2bfloat16_rn(0.f);
    for (int c = a.v; c < ldv; ++c) vr[c] = __float2bfloat16_rn(0.f);
  }
  const int last_row = min(q0 + kBr, a.T) - 1;
  const int tiles_k = (a.pos0 + last_row) / kBc + 1;
  flash_load_tile<DQK, DV>(a, head, 0, sm0, sm0 + kBc * ldk);
  cp_async_commit();
  // Q fragments (rows wr0 + g, + 8), rounded to BF16 as loaded; rows ≥ T and columns ≥ qh are 0.
  unsigned qf[KQ][4];
  {
    const int r0 = wr0 + g, r1 = r0 + 8;
    const float* p0 = a.q + (size_t(r0) * a.H + h) * qh;
    const float* p1 = a.q + (size_t(r1) * a.H + h) * qh;
#pragma unroll
    for (int k = 0; k < KQ; ++k) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = k * 16 + half * 8 + 2 * t4;
        float2 x0 = make_float2(0.f, 0.f), x1 = x0;
        if (c < qh && r0 < a.T) x0 = *reinterpret_cast<const float2*>(p0 + c);
        if (c < qh && r1 < a.T) x1 = *reinterpret_cast<const float2*>(p1 + c);
        qf[k][half * 2] = pack_bf16(x0.x, x0.y);
        qf[k][half * 2 + 1] = pack_bf16(x1.x, x1.y);
      }
    }
  }
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int lim0 = a.pos0 + wr0 + g, lim1 = lim0 + 8;  // last key each of this thread's rows may see
  const int warp_lim = a.pos0 + wr0 + 15;
  // ldmatrix lane addresses: matrix mi = lane / 8, row lane % 8.
  const int mi = lane >> 3, lr = lane & 7;
  const int k_row = (mi >> 1) * 8 + lr, k_col = (mi & 1) * 8;  // K: keys × features (b0, b1 of 2 n-tiles)
  const int v_row = (mi & 1) * 8 + lr, v_col = (mi >> 1) * 8;  // V (trans): keys × v features
  for (int kb = 0; kb < tiles_k; ++kb) {
    const int cur = kb & 1;
    if (kb + 1 < tiles_k) {
      __nv_bfloat16* nx = sm0 + (cur ^ 1) * buf;
      flash_load_tile<DQK, DV>(a, head, (kb + 1) * kBc, nx, nx + kBc * ldk);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int s0 = kb * kBc;
    if (s0 <= warp_lim && wr0 < a.T) {  // warp-uniform: a tile past every row of the warp changes nothing
      const __nv_bfloat16* Ks = sm0 + cur * buf;
      const __nv_bfloat16* Vs = Ks + kBc * ldk;
      float sc[NS][4];
#pragma unroll
      for (int j = 0; j < NS; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
      for (int k = 0; k < KQ; ++k) {
#pragma unroll
        for (int np = 0; np < NS / 2; ++np) {
          unsigned b[4];
          ldsm_x4(b, Ks + (np * 16 + k_row) * ldk + k * 16 + k_col);
          mma_bf16(sc[2 * np], qf[k], b[0], b[1]);
          mma_bf16(sc[2 * np + 1], qf[k], b[2], b[3]);
        }
      }
      // Causal mask and online softmax on the raw scores (rows g: elements 0, 1; rows g + 8: 2, 3);
      // the scale (· log2 e, > 0) goes into the exponent as one fma: p = 2^(x·scale − m), and the
      // running max m is the scaled raw max (scaling by a positive number keeps the order).
      const bool edge = s0 + kBc - 1 > a.pos0 + wr0;
      const float sl = a.scale_log2;
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < NS; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = s0 + j * 8 + 2 * t4 + e;
          float x0 = sc[j][e], x1 = sc[j][2 + e];
          if (edge) {
            if (key > lim0) x0 = -INFINITY;
            if (key > lim1) x1 = -INFINITY;
          }
          sc[j][e] = x0, sc[j][2 + e] = x1;
          mx0 = fmaxf(mx0, x0), mx1 = fmaxf(mx1, x1);
        }
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, off));
      }
      // Finite: key 0 is visible to every row, so m is finite after the first tile (a later tile
      // whose keys are all masked for a row gives mx = −inf and keeps m).
      const float n0 = fmaxf(m0, mx0 * sl), n1 = fmaxf(m1, mx1 * sl);
      // 1 exactly when the max did not move (the chunk rule: a tile past a row changes no bit);
      // 2^−inf = 0 on the first tile.
      const float f0 = m0 == n0 ? 1.f : ex2_fast(m0 - n0), f1 = m1 == n1 ? 1.f : ex2_fast(m1 - n1);
      m0 = n0, m1 = n1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int j = 0; j < NS; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sc[j][e] = ex2_fast(fmaf(sc[j][e], sl, -n0));
          sc[j][2 + e] = ex2_fast(fmaf(sc[j][2 + e], sl, -n1));
          rs0 += sc[j][e], rs1 += sc[j][2 + e];
        }
      }
      l0 = l0 * f0 + rs0, l1 = l1 * f1 + rs1;
#pragma unroll
      for (int j = 0; j < NO; ++j) o[j][0] *= f0, o[j][1] *= f0, o[j][2] *= f1, o[j][3] *= f1;
      // O += P · V, P as BF16 A fragments straight from the score accumulators.
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        const unsigned pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                                pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int jp = 0; jp < NO / 2; ++jp) {
          unsigned b[4];
          ldsm_x4_t(b, Vs + (kk * 16 + v_row) * ldv + jp * 16 + v_col);
          mma_bf16(o[2 * jp], pa, b[0], b[1]);
          mma_bf16(o[2 * jp + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this buffer
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l0 += __shfl_xor_sync(kFull, l0, off);
    l1 += __shfl_xor_sync(kFull, l1, off);
  }
  const float i0 = 1.f / l0, i1 = 1.f / l1;
  const int r0 = wr0 + g, r1 = r0 + 8;
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int c = j * 8 + 2 * t4;
    if (c >= a.v) continue;
    if (r0 < a.T) *reinterpret_cast<float2*>(a.ctx + (size_t(r0) * a.H + h) * a.v + c) = make_float2(o[j][0] * i0, o[j][1] * i0);
    if (r1 < a.T) *reinterpret_cast<float2*>(a.ctx + (size_t(r1) * a.H + h) * a.v + c) = make_float2(o[j][2] * i1, o[j][3] * i1);
  }
}

/// vt[hl, d, s] = kv[hl, s, nope + d] for s < n, 0 for n <= s < n_pad (d < v): the V parts of the
/// group's expanded kv, transposed for the wgmma kernel's K-major Vᵀ tiles (32 × 32 tiles through
/// shared memory; grid (n_pad / 32, v / 32, heads), block 32 × 8).
__global__ void v_transpose_kernel(const __nv_bfloat16* __restrict__ kv, int n, int n_pad, int nope, int v,
                                   __nv_bfloat16* __restrict__ vt) {
  __shared__ __nv_bfloat16 t[32][33];
  const int hl = int(blockIdx.z), s0 = int(blockIdx.x) * 32, d0 = int(blockIdx.y) * 32, kvh = nope + v;
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const __nv_bfloat16* src = kv + size_t(hl) * n_pad * kvh + nope;
  for (int i = ty; i < 32; i += 8) {
    const int s = s0 + i, d = d0 + tx;
    t[i][tx] = s < n && d < v ? src[size_t(s) * kvh + d] : __float2bfloat16_rn(0.f);
  }
  __syncthreads();
  __nv_bfloat16* dst = vt + size_t(hl) * v * n_pad;
  for (int i = ty; i < 32; i += 8) {
    const int d = d0 + i, s = s0 + tx;
    if (d < v && s < n_pad) dst[size_t(d) * n_pad + s] = t[tx][i];
  }
}

template <int DQK, int DV>
void launch_flash(CudaBackend::Impl& m, const FlashArgs& a, int g) {
  constexpr size_t smem = flash_smem<DQK, DV>();
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(mla_flash_kernel<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "cudaFuncSetAttribute (mla flash shared memory)");
  const unsigned tiles = unsigned((a.T + kBr - 1) / kBr);
  mla_flash_kernel<DQK, DV><<<dim3(tiles, unsigned(g)), kFlashThreads, smem, m.stream>>>(a);
  m.launched("mla (fast) flash attention kernel");
}

/// The flash path (file comment); false when the head sizes have no kernel instance or a buffer is
/// not 8-byte aligned (float2 loads and stores).
bool mla_flash(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const float* q, const float* cache,
               int pos0, int T, float* ctx) {
  const int H = p.heads, nope = p.nope, extra = p.extra, vh = p.v_head, L = p.kv_lora;
  const int qh = nope + extra, kvh = nope + vh, W = L + extra;
  const bool small = qh <= 64 && vh <= 64;
  if (!small && (qh > 192 || vh > 128)) return false;
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(ctx)) % 8 != 0) return false;
  const int n = pos0 + T, n_pad = (n + 7) / 8 * 8;
  const uint16_t* kvb = bf16_weight(m, w.kv_b, "mla_attend (fast, kv_b)");
  LtState& s = lt_state(m);
  auto* c16 = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[2], size_t(n_pad) * W));
  cache_bf16_kernel<<<grid_for(size_t(n_pad) * W, 256), 256, 0, m.stream>>>(cache, n, n_pad, W, c16);
  m.launched("mla (fast) cache conversion");
  // Heads past 64 / 64 on sm_90a: the warpgroup-MMA kernel (mla_wgmma.cu), which reads V transposed.
  const bool wg = !small && reinterpret_cast<uintptr_t>(q) % 16 == 0 && mla_wgmma_available(m);
  const size_t per_head = size_t(n_pad) * (kvh + (wg ? vh : 0)) * sizeof(uint16_t);
  const int G = int(std::max<size_t>(1, std::min<size_t>(size_t(H), kKvBudget / per_head)));
  uint16_t* kv = bf16_scratch(m, s.mla[3], size_t(G) * n_pad * kvh);
  uint16_t* vt = wg ? bf16_scratch(m, s.mla[4], size_t(G) * vh * n_pad) : nullptr;
  FlashArgs a{};
  a.q = q, a.kv = reinterpret_cast<const __nv_bfloat16*>(kv), a.c16 = c16, a.ctx = ctx;
  a.vt = reinterpret_cast<const __nv_bfloat16*>(vt);
  a.T = T, a.H = H, a.nope = nope, a.extra = extra, a.v = vh, a.L = L, a.W = W, a.pos0 = pos0, a.n = n, a.n_pad = n_pad;
  a.scale_log2 = float(1.4426950408889634 / std::sqrt(double(qh)));
  for (int h0 = 0; h0 < H; h0 += G) {
    const int g = std::min(G, H - h0);
    // kv[h, s, :] = c_s · kv_b[h]ᵀ for the group's heads (batched over heads: N = nope + v fixed).
    LtProduct e;
    e.M = n, e.N = kvh, e.K = L, e.batch = g;
    e.A = c16, e.lda = W, e.sA = 0;
    e.B = kvb + size_t(h0) * kvh * L, e.b_nk = true, e.ldb = L, e.sB = int64_t(kvh) * L;
    e.C = kv, e.ldc = kvh, e.sC = int64_t(n_pad) * kvh, e.c_bf16 = true;
    lt_product(m, e, 5);
    a.h0 = h0;
    if (wg) {
      v_transpose_kernel<<<dim3(unsigned(n_pad + 31) / 32, unsigned(vh + 31) / 32, unsigned(g)), dim3(32, 8), 0,
                           m.stream>>>(a.kv, n, n_pad, nope, vh, reinterpret_cast<__nv_bfloat16*>(vt));
      m.launched("mla (fast) v transpose");
      mla_wgmma_flash(m, a, g);
    } else if (small) launch_flash<64, 64>(m, a, g);
    else launch_flash<192, 128>(m, a, g);
  }
  return true;
}

/// The materialized path (file comment).
void mla_materialized(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const float* q,
                      const float* cache, int pos0, int T, float* ctx) {
  const int H = p.heads, nope = p.nope, extra = p.extra, vh = p.v_head, L = p.kv_lora;
  const int W = L + extra, qh = nope + extra, kvh = nope + vh;
  const int n = pos0 + T, n_pad = (n + 7) / 8 * 8;
  const uint16_t* kvb = bf16_weight(m, w.kv_b, "mla_attend (fast, kv_b)");
  LtState& s = lt_state(m);
  uint16_t* q16 = bf16_scratch(m, s.mla[0], size_t(T) * H * qh);
  launch_f32_to_bf16(q, size_t(T) * H * qh, q16, m.stream);
  m.launched("mla (fast) q conversion");
  // q_abs (f32) into the context scratch, then q_cat (BF16).
  float* qabs = static_cast<float*>(m.scratch(s.mla[5], size_t(T) * H * std::max(W, L) * sizeof(float)));
  LtProduct a;
  a.M = T, a.N = L, a.K = nope, a.batch = H;
  a.A = q16, a.lda = int64_t(H) * qh, a.sA = qh;
  a.B = kvb, a.b_nk = false, a.ldb = L, a.sB = int64_t(kvh) * L;
  a.C = qabs, a.ldc = int64_t(H) * W, a.sC = W;
  lt_product(m, a, 1);
  auto* qcat = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[1], size_t(T) * H * W));
  qcat_kernel<<<grid_for(size_t(T) * H * W, 256), 256, 0, m.stream>>>(qabs, q, T, H, nope, extra, L, qcat);
  m.launched("mla (fast) q_cat kernel");
  auto* c16 = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[2], size_t(n_pad) * W));
  cache_bf16_kernel<<<grid_for(size_t(n_pad) * W, 256), 256, 0, m.stream>>>(cache, n, n_pad, W, c16);
  m.launched("mla (fast) cache conversion");
  const size_t per_head = size_t(T) * n_pad * (sizeof(float) + sizeof(uint16_t));
  const int G = int(std::max<size_t>(1, std::min<size_t>(size_t(H), kScoreBudget / per_head)));
  float* S = static_cast<float*>(m.scratch(s.mla[3], size_t(G) * T * n_pad * sizeof(float)));
  auto* P = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[4], size_t(G) * T * n_pad));
  float* cbar = qabs;  // q_abs is consumed by q_cat: reuse as c̄ [T, H, L] f32
  const float scale = 1.0f / std::sqrt(float(nope + extra));
  for (int h0 = 0; h0 < H; h0 += G) {
    const int g = std::min(G, H - h0);
    LtProduct sc;
    sc.M = T, sc.N = n_pad, sc.K = W, sc.batch = g, sc.alpha = scale;
    sc.A = qcat + size_t(h0) * W, sc.lda = int64_t(H) * W, sc.sA = W;
    sc.B = c16, sc.b_nk = true, sc.ldb = W, sc.sB = 0;
    sc.C = S, sc.ldc = n_pad, sc.sC = int64_t(T) * n_pad;
    lt_product(m, sc, 2);
    causal_softmax_kernel<<<dim3(unsigned(T), unsigned(g)), kSoftmaxThreads, 0, m.stream>>>(S, T, n_pad, pos0, P);
    m.launched("mla (fast) causal softmax kernel");
    LtProduct pv;
    pv.M = T, pv.N = L, pv.K = n_pad, pv.batch = g;
    pv.A = P, pv.lda = n_pad, pv.sA = int64_t(T) * n_pad;
    pv.B = c16, pv.b_nk = false, pv.ldb = W, pv.sB = 0;
    pv.C = cbar + size_t(h0) * L, pv.ldc = int64_t(H) * L, pv.sC = L;
    lt_product(m, pv, 3);
  }
  uint16_t* cbar16 = bf16_scratch(m, s.mla[0], size_t(T) * H * std::max(L, qh));  // q16 is no longer read
  launch_f32_to_bf16(cbar, size_t(T) * H * L, cbar16, m.stream);
  m.launched("mla (fast) context conversion");
  LtProduct o;
  o.M = T, o.N = vh, o.K = L, o.batch = H;
  o.A = cbar16, o.lda = int64_t(H) * L, o.sA = L;
  o.B = kvb + size_t(nope) * L, o.b_nk = true, o.ldb = L, o.sB = int64_t(kvh) * L;
  o.C = ctx, o.ldc = int64_t(H) * vh, o.sC = vh;
  lt_product(m, o, 4);
}

}  // namespace

bool mla_fast(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const float* q, const float* cache,
              int pos0, int T, float* ctx) {
  if (m.opts.precision != GpuPrecision::Fast || T < 2) return false;
  if (p.nope % 8 || p.extra % 8 || p.v_head % 8 || p.kv_lora % 8 || p.heads < 1) return false;
  if (w.kv_b.format != WFormat::F32 && w.kv_b.format != WFormat::BF16) return false;
  if (mla_flash(m, p, w, q, cache, pos0, T, ctx)) return true;
  mla_materialized(m, p, w, q, cache, pos0, T, ctx);
  return true;
}

}  // namespace wren::cuda
