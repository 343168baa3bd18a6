// CUDA backend, fast precision mode: the routed experts of a chunk on tensor cores (BF16 operands,
// f32 accumulation), grouped by expert.
//
// On Hopper (where the sm_90a code of moe_wgmma.cu loads; the default there), dense and MXFP4
// experts alike: the sort below (128-row tiles), the pairs' inputs gathered in expert order as
// BF16, one warpgroup-MMA launch per matrix over every touched expert (gate/up with the GLU fused,
// MXFP4 decoded to BF16 in shared memory; down writing each pair's row), then the weighted sum; no
// host sync, also while a graph is recorded. Elsewhere:
//
// Dense experts (Kimi Linear; BF16 or f32 checkpoints, f32 weights converted to BF16 once): after
// the sort below, one pipelined tensor-core launch per matrix over every touched expert
// (mma_grouped_kernel: mma.sync + ldmatrix + a cp.async ring; gate/up with the GLU fused, down
// writing each pair's row), then the weighted sum; no host sync, no per-expert launches.
//
// MXFP4 experts (run 15 path): after the sort below, the expert row counts come to the host (one sync
// per layer), the pairs' inputs are gathered in expert order as BF16, and each touched expert runs
// as cuBLASLt products on its contiguous rows: [gate | up] (MXFP4 experts decoded to BF16 scratch,
// kDequantBatch at a time; dense experts from their BF16 copies), a GLU kernel, down; then a
// scatter to ys [pair j, io] and the weighted sum in slot order. The algorithms are fixed per
// shape class (lt_product), so a row's result does not depend on how many rows its expert has.
// While a graph is being recorded (no host sync allowed) the single-launch WMMA kernels below run:
//
// After the router has written ids/weights [T·k] on the device (moe.cu):
//  1. sort: one block counts the (token, slot) pairs per expert, lays the experts out in id order
//     (ebase), lists the 64-row (wgmma: 128-row) tiles of every touched expert (tile_e, tile_m0)
//     and writes the pair order (sorted position -> pair j = t·k + slot). No host sync.
//  2. gate/up: one launch, grid (tiles upper bound, inter / 64): a block takes 64 sorted pairs of
//     one expert × 64 intermediate columns, gathers the tokens' z rows (f32 -> BF16 into shared
//     memory), the expert's W1 and W3 rows (BF16 as stored, or MXFP4 decoded to BF16 in shared
//     memory: e2m1 × 2^(s-127) is exact in BF16), accumulates G and U in f32 and applies SiTU-GLU
//     (K3) or SiLU-GLU (Kimi Linear) in the epilogue; act [pairs, inter] BF16 in sorted order.
//  3. down: one launch, same tiling over io columns, act × W2ᵀ -> ys [pair j, io] f32 (unweighted).
//  4. out[t] = Σ_slot w · ys[t·k + slot] in slot order (deterministic; no atomics on outputs).
// Blocks past the real tile count exit at once. A token's outputs depend only on its own row (the
// tensor-core k-loop order is fixed), so neither the chunk size nor the other tokens of the chunk
// change them. Requirements: io and inter multiples of 8 (dense) or 32 (MXFP4, as stored).
// (These WMMA kernels are the simple first version; docs/gpu-results.md has their rate.)
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/lt_state.cuh"
#include "backends/cuda/moe_decode.cuh"
#include "backends/cuda/moe_wgmma.cuh"
#include "core/mxfp4.h"

namespace wren::cuda {

namespace {

/// out[t, i] = Σ_j w[t·k + j] · ys[(t·k + j), i] in slot order, kVec columns a thread (kVec = 4:
/// io % 4 == 0 and 16-byte aligned rows; the sum of each element is the same for either width).
template <int kVec>
__global__ void slot_sum_kernel(const float* __restrict__ ys, const float* __restrict__ w, int k, int io, int T,
                                float* __restrict__ out) {
  pdl_wait();  // a programmatic dependent launch (pdl_launch): nothing is touched before
  pdl_trigger();
  const int per_row = io / kVec;
  const size_t n = size_t(T) * per_row;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t t = i / per_row, c = (i % per_row) * kVec;
    if constexpr (kVec == 4) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = 0; j < k; ++j) {
        const float wj = w[t * k + j];
        const float4 y = *reinterpret_cast<const float4*>(ys + (t * k + j) * io + c);
        acc.x += wj * y.x, acc.y += wj * y.y, acc.z += wj * y.z, acc.w += wj * y.w;
      }
      *reinterpret_cast<float4*>(out + t * io + c) = acc;
    } else {
      float acc = 0.f;
      for (int j = 0; j < k; ++j) acc += w[t * k + j] * ys[(t * k + j) * io + c];
      out[t * io + c] = acc;
    }
  }
}

}  // namespace

void launch_slot_sum(CudaBackend::Impl& m, const float* ys, const float* w, int k, int io, int T, float* out) {
  const bool vec = io % 4 == 0 && reinterpret_cast<uintptr_t>(ys) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const char* what = "routed_moe weighted-sum kernel";
  if (vec)
    pdl_launch(m, slot_sum_kernel<4>, grid_for(size_t(T) * io / 4, 256), 256, what, ys, w, k, io, T, out);
  else
    pdl_launch(m, slot_sum_kernel<1>, grid_for(size_t(T) * io, 256), 256, what, ys, w, k, io, T, out);
}

namespace {

using namespace nvcuda;

constexpr int BM = 64, BN = 64, BK = 32, kThreads = 128;
constexpr int kLdA = BK + 8;   // bf16 elements per shared row (80 bytes: 16-byte and WMMA aligned)
constexpr int kLdC = BN + 4;   // f32 elements per epilogue row

/// Exclusive prefix sums over the block of (a, b), one pair a thread (blockDim.x a multiple of 32, at
/// most 1024); returns the block's totals in *ta, *tb. Integer sums: any order gives the same.
__device__ __forceinline__ void block_exclusive_scan2(int& a, int& b, int* ta, int* tb) {
  __shared__ int wa[32], wb[32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32, nw = int(blockDim.x) / 32;
  int ia = a, ib = b;  // inclusive within the warp
  for (int o = 1; o < 32; o <<= 1) {
    const int na = __shfl_up_sync(0xffffffffu, ia, o), nb = __shfl_up_sync(0xffffffffu, ib, o);
    if (lane >= o) ia += na, ib += nb;
  }
  if (lane == 31) wa[warp] = ia, wb[warp] = ib;
  __syncthreads();
  if (warp == 0) {
    int va = lane < nw ? wa[lane] : 0, vb = lane < nw ? wb[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int na = __shfl_up_sync(0xffffffffu, va, o), nb = __shfl_up_sync(0xffffffffu, vb, o);
      if (lane >= o) va += na, vb += nb;
    }
    if (lane < nw) wa[lane] = va, wb[lane] = vb;  // inclusive over warps
  }
  __syncthreads();
  const int pa = warp > 0 ? wa[warp - 1] : 0, pb = warp > 0 ? wb[warp - 1] : 0;
  *ta = wa[nw - 1], *tb = wb[nw - 1];
  a = pa + ia - a, b = pb + ib - b;
  __syncthreads();  // wa / wb read by every thread before a later call writes them
}

/// The pairs of a routed MoE call grouped by expert: cnt[e] pairs of expert e, ebase[e] their first
/// row (experts in id order), order[row] = the pair j (token·k + slot) of each row, and the tiles
/// of `rows` rows (tile_e, tile_m0; n_tiles) in expert order. Thread t owns the experts [t·per,
/// (t + 1)·per): two block-wide prefix sums (rows and tiles) place its experts, so no thread walks
/// all E (one thread did: ~21 µs a call at E = 256 on an H100, run 39d). Same outputs as the walk.
/// traffic (may be null): device counters [2] += the call's distinct experts and ebytes each.
__global__ void sort_pairs_kernel(const int* __restrict__ ids, int pairs, int E, int rows, int* __restrict__ order,
                                  int* __restrict__ ebase, int* __restrict__ tile_e, int* __restrict__ tile_m0,
                                  int* __restrict__ n_tiles, unsigned long long* __restrict__ traffic,
                                  unsigned long long ebytes) {
  extern __shared__ int sh[];
  int* cnt = sh;
  int* pos = sh + E;
  __shared__ int touched;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  if (threadIdx.x == 0) touched = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) atomicAdd(&cnt[ids[j]], 1);
  __syncthreads();
  const int per = (E + int(blockDim.x) - 1) / int(blockDim.x);
  const int e0 = min(E, int(threadIdx.x) * per), e1 = min(E, e0 + per);
  int base = 0, tiles = 0, mine = 0;
  for (int e = e0; e < e1; ++e) base += cnt[e], tiles += (cnt[e] + rows - 1) / rows, mine += cnt[e] > 0;
  int total_rows = 0, total_tiles = 0;
  block_exclusive_scan2(base, tiles, &total_rows, &total_tiles);
  for (int e = e0; e < e1; ++e) {
    ebase[e] = base, pos[e] = base;
    for (int r = 0; r < cnt[e]; r += rows) tile_e[tiles] = e, tile_m0[tiles] = base + r, ++tiles;
    base += cnt[e];
  }
  if (mine) atomicAdd(&touched, mine);
  __syncthreads();
  if (threadIdx.x == 0) {
    ebase[E] = total_rows;
    *n_tiles = total_tiles;
    if (traffic) traffic[0] += (unsigned long long)touched, traffic[1] += (unsigned long long)touched * ebytes;
  }
  // The position inside an expert's rows is arbitrary (atomics): each row's result is its own.
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) order[atomicAdd(&pos[ids[j]], 1)] = j;
}

struct GroupArgs {
  const ExpertPtrs* mx;          ///< MXFP4 experts [E] (null: dense)
  const DenseExpertPtrs* dense;  ///< dense BF16 experts [E]
  const int *order, *ebase, *tile_e, *tile_m0, *n_tiles;
  const float* z;                ///< gate/up: inputs [T, Kd] f32
  const __nv_bfloat16* act_in;   ///< down: inputs [pairs, Kd] BF16, sorted order
  __nv_bfloat16* act_out;        ///< gate/up: outputs [pairs, N] BF16, sorted order
  float* ys;                     ///< down: outputs [pairs, N] f32 by pair j
  int top_k, Kd, N;
  float b1, b2;
  int silu;                      ///< 1: SiLU-GLU, 0: SiTU-GLU(b1, b2)
};

/// B tile rows n0.. of matrix [N, Kd] (row-major BF16), columns k0..k0+BK, into bs [BN][kLdA].
__device__ __forceinline__ void load_b_dense(const uint16_t* w, int N, int Kd, int n0, int k0, __nv_bfloat16* bs) {
  for (int idx = threadIdx.x; idx < BN * (BK / 8); idx += kThreads) {
    const int r = idx / (BK / 8), c = (idx % (BK / 8)) * 8, n = n0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (n < N && k0 + c < Kd) v = *reinterpret_cast<const uint4*>(w + size_t(n) * Kd + k0 + c);
    *reinterpret_cast<uint4*>(bs + r * kLdA + c) = v;
  }
}

/// The same for an MXFP4 matrix (packed [N, Kd/2], ue8m0 scale [N, Kd/32]); BK = one group.
__device__ __forceinline__ void load_b_mx(const uint8_t* packed, const uint8_t* scale, int N, int Kd, int n0, int k0,
                                          __nv_bfloat16* bs) {
  for (int idx = threadIdx.x; idx < BN * 2; idx += kThreads) {
    const int r = idx / 2, h = idx % 2, n = n0 + r;
    __nv_bfloat16* dst = bs + r * kLdA + h * 16;
    if (n >= N) {
      for (int i = 0; i < 16; ++i) dst[i] = __float2bfloat16_rn(0.f);
      continue;
    }
    const int g = k0 / mxfp4::kGroup;
    const uint2 raw = *reinterpret_cast<const uint2*>(packed + size_t(n) * (Kd / 2) + size_t(g) * 16 + h * 8);
    const float s = mxfp4::scale_value(scale[size_t(n) * (Kd / 32) + g]);
    const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t byte = (words[w] >> (8 * b)) & 0xFFu;  // column 2i low nibble, 2i+1 high
        dst[(w * 4 + b) * 2] = __float2bfloat16_rn(mxfp4::e2m1_value(uint8_t(byte & 0xF)) * s);
        dst[(w * 4 + b) * 2 + 1] = __float2bfloat16_rn(mxfp4::e2m1_value(uint8_t(byte >> 4)) * s);
      }
  }
}

/// kGateUp: act_out = GLU(A·W1ᵀ, A·W3ᵀ), A = gathered z rows; else ys = act_in·W2ᵀ.
template <bool kGateUp, bool kMx>
__global__ void __launch_bounds__(kThreads) grouped_kernel(GroupArgs a) {
  constexpr int NB = kGateUp ? 2 : 1;
  constexpr int kTileBytes = (BM * kLdA + NB * BN * kLdA) * 2;
  constexpr int kEpiBytes = NB * BM * kLdC * 4;
  __shared__ __align__(128) unsigned char smem[kTileBytes > kEpiBytes ? kTileBytes : kEpiBytes];
  if (int(blockIdx.x) >= *a.n_tiles) return;
  const int e = a.tile_e[blockIdx.x], m0 = a.tile_m0[blockIdx.x], m_end = a.ebase[e + 1];
  const int n0 = blockIdx.y * BN;
  __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Bs = As + BM * kLdA;
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][2][2];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[b][i][j], 0.f);
  for (int k0 = 0; k0 < a.Kd; k0 += BK) {
    // A tile: 64 sorted rows × 32 columns.
    for (int idx = threadIdx.x; idx < BM * BK; idx += kThreads) {
      const int r = idx / BK, c = idx % BK, row = m0 + r, k = k0 + c;
      float v = 0.f;
      if (row < m_end && k < a.Kd) {
        if (kGateUp) v = a.z[size_t(a.order[row] / a.top_k) * a.Kd + k];
        else v = __bfloat162float(a.act_in[size_t(row) * a.Kd + k]);
      }
      As[r * kLdA + c] = __float2bfloat16_rn(v);
    }
    if (kMx) {
      const ExpertPtrs p = a.mx[e];
      if (kGateUp) {
        load_b_mx(p.p1, p.s1, a.N, a.Kd, n0, k0, Bs);
        load_b_mx(p.p3, p.s3, a.N, a.Kd, n0, k0, Bs + BN * kLdA);
      } else {
        load_b_mx(p.p2, p.s2, a.N, a.Kd, n0, k0, Bs);
      }
    } else {
      const DenseExpertPtrs p = a.dense[e];
      if (kGateUp) {
        load_b_dense(p.w1, a.N, a.Kd, n0, k0, Bs);
        load_b_dense(p.w3, a.N, a.Kd, n0, k0, Bs + BN * kLdA);
      } else {
        load_b_dense(p.w2, a.N, a.Kd, n0, k0, Bs);
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], As + (wm * 32 + i * 16) * kLdA + kk, kLdA);
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, Bs + b * BN * kLdA + (wn * 32 + j * 16) * kLdA + kk, kLdA);
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[b][i][j], fa[i], fb, acc[b][i][j]);
        }
    }
    __syncthreads();
  }
  float* Cs = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(Cs + b * BM * kLdC + (wm * 32 + i * 16) * kLdC + wn * 32 + j * 16, acc[b][i][j], kLdC,
                                wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < BM * BN; idx += kThreads) {
    const int r = idx / BN, c = idx % BN, row = m0 + r, n = n0 + c;
    if (row >= m_end || n >= a.N) continue;
    const float g = Cs[r * kLdC + c];
    if (kGateUp) {
      const float u = Cs[BM * kLdC + r * kLdC + c];
      const float v = a.silu ? g / (1.f + __expf(-g)) * u : situ_f(g, u, a.b1, a.b2);
      a.act_out[size_t(row) * a.N + n] = __float2bfloat16_rn(v);
    } else {
      a.ys[size_t(a.order[row]) * a.N + n] = g;
    }
  }
}

// ---- per-expert cuBLASLt path (the default of the fast mode) ----

constexpr int kDequantBatch = 8;  ///< MXFP4 experts decoded to BF16 scratch at a time

struct ExpertList {
  int id[kDequantBatch];
  int n;
};

/// MXFP4 experts list.id[b] decoded to BF16 (exact): w13[b] = [w1; w3] [2·inter, io], w2[b] [io, inter].
__global__ void mx_dequant_kernel(const ExpertPtrs* __restrict__ table, ExpertList list, int inter, int io,
                                  __nv_bfloat16* __restrict__ w13, __nv_bfloat16* __restrict__ w2) {
  const int b = blockIdx.y;
  if (b >= list.n) return;
  const ExpertPtrs p = table[list.id[b]];
  const size_t c13 = size_t(io) / 16, c2 = size_t(inter) / 16;  // 16-value chunks per row
  const size_t n13 = size_t(2) * inter * c13, n2 = size_t(io) * c2;
  __nv_bfloat16* o13 = w13 + size_t(b) * 2 * inter * io;
  __nv_bfloat16* o2 = w2 + size_t(b) * io * inter;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n13 + n2; i += size_t(gridDim.x) * blockDim.x) {
    const uint8_t *pk, *sc;
    __nv_bfloat16* out;
    if (i < n13) {
      const size_t r = i / c13, ch = i % c13;
      const bool up = r >= size_t(inter);
      const size_t row = up ? r - inter : r;
      pk = (up ? p.p3 : p.p1) + row * (io / 2) + ch * 8;
      sc = (up ? p.s3 : p.s1) + row * (io / 32) + ch / 2;
      out = o13 + r * io + ch * 16;
    } else {
      const size_t j = i - n13, row = j / c2, ch = j % c2;
      pk = p.p2 + row * (inter / 2) + ch * 8;
      sc = p.s2 + row * (inter / 32) + ch / 2;
      out = o2 + row * inter + ch * 16;
    }
    const uint2 raw = *reinterpret_cast<const uint2*>(pk);
    const float s = mxfp4::scale_value(*sc);
    const uint32_t words[2] = {raw.x, raw.y};
    __align__(16) __nv_bfloat16 v[16];
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t byte = (words[w] >> (8 * q)) & 0xFFu;
        v[(w * 4 + q) * 2] = __float2bfloat16_rn(mxfp4::e2m1_value(uint8_t(byte & 0xF)) * s);
        v[(w * 4 + q) * 2 + 1] = __float2bfloat16_rn(mxfp4::e2m1_value(uint8_t(byte >> 4)) * s);
      }
    reinterpret_cast<uint4*>(out)[0] = reinterpret_cast<const uint4*>(v)[0];
    reinterpret_cast<uint4*>(out)[1] = reinterpret_cast<const uint4*>(v)[1];
  }
}

/// zs[p, :] = bf16(z[order[p] / k, :]) (the pairs' inputs in expert order), 8 values a thread
/// (io % 8 == 0: two 16-byte loads, one 16-byte store).
__global__ void gather_rows_kernel(const float* __restrict__ z, const int* __restrict__ order, int pairs, int k, int io,
                                   __nv_bfloat16* __restrict__ zs) {
  const int per_row = io / 8;
  const size_t n = size_t(pairs) * per_row;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t p = i / per_row, c = (i % per_row) * 8;
    const float4* src = reinterpret_cast<const float4*>(z + size_t(order[p] / k) * io + c);
    const float4 v0 = src[0], v1 = src[1];
    __align__(16) __nv_bfloat162 o[4] = {__floats2bfloat162_rn(v0.x, v0.y), __floats2bfloat162_rn(v0.z, v0.w),
                                         __floats2bfloat162_rn(v1.x, v1.y), __floats2bfloat162_rn(v1.z, v1.w)};
    *reinterpret_cast<uint4*>(zs + p * io + c) = *reinterpret_cast<const uint4*>(o);
  }
}

/// act[p, c] = bf16(GLU(gu[p, c], gu[p, inter + c])) for rows [p0, p1).
__global__ void glu_rows_kernel(const float* __restrict__ gu, int p0, int p1, int inter, int silu, float b1, float b2,
                                __nv_bfloat16* __restrict__ act) {
  const size_t n = size_t(p1 - p0) * inter;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t p = p0 + i / inter, c = i % inter;
    const float g = gu[p * 2 * inter + c], u = gu[p * 2 * inter + inter + c];
    act[p * inter + c] = __float2bfloat16_rn(silu ? g / (1.f + __expf(-g)) * u : situ_f(g, u, b1, b2));
  }
}

/// ys[order[p], :] = y[p, :].
__global__ void scatter_rows_kernel(const float* __restrict__ y, const int* __restrict__ order, int pairs, int io,
                                    float* __restrict__ ys) {
  const size_t n = size_t(pairs) * io;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    ys[size_t(order[i / io]) * io + i % io] = y[i];
}

// ---- dense experts: one pipelined tensor-core launch per matrix (the default for dense experts) ----
//
// mma.sync m16n8k16 (BF16 in, f32 accumulate) on 64-row × 128-column block tiles, 8 warps of 32 × 32,
// k-steps of 32 staged by cp.async through a 4-deep shared-memory ring (rows padded to 40 BF16 =
// 80 bytes, so ldmatrix's 8 row addresses hit 8 distinct 16-byte bank groups). The A operand is the
// pairs' inputs gathered in expert order (BF16, contiguous rows); B is the expert's BF16 weight
// [N, K] as stored (row n = output column n), which is ldmatrix's non-transposed B fragment.
// gate/up: the 128 B rows are 64 rows of W1 and the same 64 rows of W3, so one block yields 64 GLU
// columns (G and U meet in shared memory in the epilogue). Each output element is one k-loop in a
// fixed order (k-steps ascending, the mma's internal order per step): a row's result does not depend
// on the other rows of its tile, its expert's row count or the chunk.
constexpr int kMB = 64, kMN = 128, kMK = 32, kStages = 4, kMmaThreads = 256;
constexpr int kMLd = kMK + 8;                                   // BF16 per shared row
constexpr int kStageElems = (kMB + kMN) * kMLd;                 // A rows then B rows
constexpr size_t kMmaSmem = size_t(kStages) * kStageElems * 2;  // 61,440 bytes
constexpr int kCLd = kMN + 4;                                   // f32 per epilogue row (gate/up)
static_assert(size_t(kMB) * kCLd * 4 <= kMmaSmem, "epilogue tile fits the ring");
static_assert(kMB == BM, "the sort kernel lists tiles of kMB rows");

struct MmaArgs {
  const DenseExpertPtrs* dense;  ///< [E] device
  const int *order, *ebase, *tile_e, *tile_m0, *n_tiles;
  const __nv_bfloat16* A;        ///< [pairs, K] BF16, sorted (expert) order
  __nv_bfloat16* act_out;        ///< gate/up: [pairs, N] BF16, sorted order
  float* ys;                     ///< down: [pairs, N] f32 by pair j
  int K, N;                      ///< gate/up: K = io, N = inter; down: K = inter, N = io
  float b1, b2;
  int silu;
};

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

template <bool kGateUp>
__global__ void __launch_bounds__(kMmaThreads) mma_grouped_kernel(MmaArgs a) {
  extern __shared__ __align__(16) unsigned char mma_smem[];
  if (int(blockIdx.x) >= *a.n_tiles) return;
  const int e = a.tile_e[blockIdx.x], m0 = a.tile_m0[blockIdx.x], m_end = a.ebase[e + 1];
  constexpr int kOutN = kGateUp ? kMN / 2 : kMN;  // output columns per block
  const int n0 = int(blockIdx.y) * kOutN;
  const DenseExpertPtrs p = a.dense[e];
  __nv_bfloat16* sm = reinterpret_cast<__nv_bfloat16*>(mma_smem);
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, wm = warp / 4, wn = warp % 4;
  const int K = a.K, KT = (K + kMK - 1) / kMK;
  // Copy assignments: one 16-byte chunk of A (row tid/4) and two of B (rows tid/4, tid/4 + 64) per stage.
  const int lr = tid / 4, lc = (tid % 4) * 8;
  const bool a_ok = m0 + lr < m_end;
  const __nv_bfloat16* a_src = a.A + size_t(a_ok ? m0 + lr : m0) * K + lc;
  const uint16_t* b_src[2];
  bool b_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint16_t* w = kGateUp ? (i == 0 ? p.w1 : p.w3) : p.w2;
    const int n = kGateUp ? n0 + lr : n0 + lr + 64 * i;
    b_ok[i] = n < a.N;
    b_src[i] = w + size_t(b_ok[i] ? n : 0) * K + lc;
  }
  auto load = [&](int stage, int kt) {
    const int k = kt * kMK;
    const bool kin = k + lc < K;  // K % 8 == 0: a chunk is all in or all out
    __nv_bfloat16* As = sm + stage * kStageElems;
    __nv_bfloat16* Bs = As + kMB * kMLd;
    cp_async16(As + lr * kMLd + lc, a_src + (kin ? k : 0), a_ok && kin);
#pragma unroll
    for (int i = 0; i < 2; ++i) cp_async16(Bs + (lr + 64 * i) * kMLd + lc, b_src[i] + (kin ? k : 0), b_ok[i] && kin);
  };
  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.f;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < KT) load(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt-1 is no longer read
    if (kt + kStages - 1 < KT) load((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();
    const __nv_bfloat16* As = sm + (kt % kStages) * kStageElems;
    const __nv_bfloat16* Bs = As + kMB * kMLd;
#pragma unroll
    for (int kk = 0; kk < kMK; kk += 16) {
      unsigned af[2][4], bfr[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], As + (wm * 32 + mi * 16 + lane % 16) * kMLd + kk + (lane / 16) * 8);
#pragma unroll
      for (int nj = 0; nj < 2; ++nj)
        ldmatrix_x4(bfr[nj], Bs + (wn * 32 + nj * 16 + lane % 8 + (lane / 16) * 8) * kMLd + kk + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
          mma_bf16(acc[mi][ni], af[mi], bfr[ni / 2][(ni % 2) * 2], bfr[ni / 2][(ni % 2) * 2 + 1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is reused by the epilogue
  const int g = lane / 4, c2 = (lane % 4) * 2;
  if (kGateUp) {
    float* Cs = reinterpret_cast<float*>(mma_smem);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm * 32 + mi * 16 + g + 8 * h, c = wn * 32 + ni * 8 + c2;
          Cs[r * kCLd + c] = acc[mi][ni][2 * h];
          Cs[r * kCLd + c + 1] = acc[mi][ni][2 * h + 1];
        }
    __syncthreads();
    for (int idx = tid; idx < kMB * kOutN; idx += kMmaThreads) {
      const int r = idx / kOutN, c = idx % kOutN, row = m0 + r, n = n0 + c;
      if (row >= m_end || n >= a.N) continue;
      const float gv = Cs[r * kCLd + c], uv = Cs[r * kCLd + kOutN + c];
      const float v = a.silu ? gv / (1.f + __expf(-gv)) * uv : situ_f(gv, uv, a.b1, a.b2);
      a.act_out[size_t(row) * a.N + n] = __float2bfloat16_rn(v);
    }
  } else {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * 32 + mi * 16 + g + 8 * h;
        if (row >= m_end) continue;
        float* dst = a.ys + size_t(a.order[row]) * a.N;
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int n = n0 + wn * 32 + ni * 8 + c2;  // N % 8 == 0: n < N implies n + 1 < N
          if (n < a.N) *reinterpret_cast<float2*>(dst + n) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        }
      }
  }
}

/// The dense-expert path: gather, gate/up + GLU, down, weighted sum; no host sync.
void mma_grouped_dense(CudaBackend::Impl& m, const RoutedMoeParams& p, const DenseTable& dt, const int* order,
                       const int* ebase, const int* tile_e, const int* tile_m0, const int* n_tiles, int max_tiles,
                       const float* dw, const float* z, int T, float* ys, float* out) {
  LtState& s = lt_state(m);
  const int k = p.top_k, pairs = T * k, io = p.io, inter = dt.inter;
  static bool attr_set = false;  // per process: the attribute belongs to the kernel, not the device context
  if (!attr_set) {
    check_cuda(cudaFuncSetAttribute(mma_grouped_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMmaSmem)),
               "cudaFuncSetAttribute (grouped MMA gate/up)");
    check_cuda(cudaFuncSetAttribute(mma_grouped_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMmaSmem)),
               "cudaFuncSetAttribute (grouped MMA down)");
    attr_set = true;
  }
  auto* zs = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.xb, size_t(pairs) * io));
  gather_rows_kernel<<<grid_for(size_t(pairs) * io / 8, 256), 256, 0, m.stream>>>(z, order, pairs, k, io, zs);
  m.launched("routed_moe (fast) gather kernel");
  auto* act = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.act, size_t(pairs) * inter));
  MmaArgs g{};
  g.dense = dt.dev, g.order = order, g.ebase = ebase, g.tile_e = tile_e, g.tile_m0 = tile_m0, g.n_tiles = n_tiles;
  g.A = zs, g.act_out = act, g.K = io, g.N = inter, g.b1 = p.b1, g.b2 = p.b2, g.silu = p.act == Activation::SiLU ? 1 : 0;
  mma_grouped_kernel<true><<<dim3(unsigned(max_tiles), unsigned((inter + kMN / 2 - 1) / (kMN / 2))), kMmaThreads,
                             kMmaSmem, m.stream>>>(g);
  m.launched("routed_moe (fast) dense gate/up grouped MMA");
  MmaArgs d = g;
  d.A = act, d.act_out = nullptr, d.ys = ys, d.K = inter, d.N = io;
  mma_grouped_kernel<false><<<dim3(unsigned(max_tiles), unsigned((io + kMN - 1) / kMN)), kMmaThreads, kMmaSmem,
                              m.stream>>>(d);
  m.launched("routed_moe (fast) dense down grouped MMA");
  launch_slot_sum(m, ys, dw, k, io, T, out);
}

/// The device table of `mw`'s dense experts as BF16 (converted once), or null when an expert is
/// not f32/BF16 or the shapes do not fit the kernel.
const DenseTable* dense_table(CudaBackend::Impl& m, const MoeWeights& mw, int io) {
  LtState& s = lt_state(m);
  const int E = int(mw.experts.size());
  const void* first = E ? mw.experts[0].d1.data : nullptr;
  if (const auto it = s.dense_tables.find(&mw); it != s.dense_tables.end()) {
    if (it->second.first == first && it->second.E == E) return it->second.dev ? &it->second : nullptr;
    if (it->second.dev) check_cuda(cudaFree(it->second.dev), "cudaFree (dense expert table)");
    s.dense_tables.erase(it);
  }
  DenseTable& t = s.dense_tables[&mw];
  t.first = first, t.E = E;
  if (E == 0 || mw.experts[0].w1.packed) return nullptr;
  const int inter = int(mw.experts[0].d1.rows);
  if (io % 8 != 0 || inter % 8 != 0) return nullptr;
  std::vector<DenseExpertPtrs> host(E);
  for (int i = 0; i < E; ++i) {
    const ExpertRef& e = mw.experts[i];
    if (e.d1.rows != inter || e.d3.rows != inter || e.d1.cols != io || e.d3.cols != io || e.d2.rows != io ||
        e.d2.cols != inter)
      throw Error("CUDA backend: routed_moe (fast): expert " + e.name + " has a shape unlike expert 0's");
    host[i].w1 = bf16_weight(m, e.d1, "routed_moe (fast, w1)");
    host[i].w3 = bf16_weight(m, e.d3, "routed_moe (fast, w3)");
    host[i].w2 = bf16_weight(m, e.d2, "routed_moe (fast, w2)");
    if (!host[i].w1 || !host[i].w3 || !host[i].w2) return nullptr;
  }
  check_cuda(cudaMalloc(&t.dev, size_t(E) * sizeof(DenseExpertPtrs)), "cudaMalloc (dense expert table)");
  check_cuda(cudaMemcpyAsync(t.dev, host.data(), size_t(E) * sizeof(DenseExpertPtrs), cudaMemcpyHostToDevice, m.stream),
             "cudaMemcpyAsync (dense expert table)");
  m.sync("dense expert table");
  t.E = E, t.inter = inter, t.io = io;
  t.aligned16 = true;
  for (const DenseExpertPtrs& d : host)
    for (const uint16_t* w : {d.w1, d.w3, d.w2}) t.aligned16 = t.aligned16 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  t.host = std::move(host);
  return &t;
}

}  // namespace

bool grouped_moe_ok(CudaBackend::Impl& m, const RoutedMoeParams& p, const MoeWeights& mw, int T, bool mx) {
  if (m.opts.precision != GpuPrecision::Fast || T < 1 || p.n_experts <= 0) return false;
  if (size_t(p.n_experts) * 2 * sizeof(int) + 1024 > size_t(m.max_smem_optin)) return false;
  if (mx) return T >= 2 && mw.experts.size() == size_t(p.n_experts) && p.io % mxfp4::kGroup == 0 &&
                 mw.experts[0].w1.rows % mxfp4::kGroup == 0;
  if (m.capturing) {  // recording: only a table built before (building it is host work)
    const LtState& s = lt_state(m);
    const auto it = s.dense_tables.find(&mw);
    if (it == s.dense_tables.end() || !it->second.dev || it->second.E != int(mw.experts.size()) ||
        it->second.first != (mw.experts.empty() ? nullptr : mw.experts[0].d1.data))
      return false;
  }
  return dense_table(m, mw, p.io) != nullptr;
}

bool grouped_moe(CudaBackend::Impl& m, const RoutedMoeParams& p, const MoeWeights& mw, const ExpertPtrs* table,
                 const int* dids, const float* dw, const float* z, int T, float* ys, float* out) {
  const int E = p.n_experts, k = p.top_k, pairs = T * k, io = p.io;
  LtState& s = lt_state(m);
  const DenseTable* dt = table ? nullptr : dense_table(m, mw, io);
  if (!table && !dt) return false;
  const int inter = table ? int(mw.experts[0].w1.rows) : dt->inter;
  // One token, dense experts: the decode kernels (moe_decode.cu; MXFP4 tokens never come here, T = 1
  // goes to moe_decode from moe.cu), reading each chosen expert's rows once at a stream's pace.
  if (T == 1 && dt && dt->aligned16 && moe_decode_ok(m, T, io, inter, z, false)) {  // (io % 32: slot_sum's io % 4)
    moe_decode_dense(m, dt->dev, dids, dw, z, k, io, inter, p.b1, p.b2, p.act == Activation::SiLU, ys, out);
    ++m.stats.grouped_moe_calls;
    return true;
  }
  // Hopper warpgroup MMA (moe_wgmma.cu) where its sm_90a code loads: dense and MXFP4 experts, one
  // launch per matrix, no host sync, also while a graph is recorded; tiles of kWgTileRows rows.
  const bool wg = wgmma_grouped_available(m);
  const int rows = wg ? kWgTileRows : BM;
  const int max_tiles = pairs / rows + std::min(E, pairs) + 1;
  const size_t ints = size_t(pairs) + size_t(E + 1) + 2 * size_t(max_tiles) + 1;
  int* base = static_cast<int*>(m.scratch(s.sort, ints * sizeof(int)));
  int *order = base, *ebase = order + pairs, *tile_e = ebase + E + 1, *tile_m0 = tile_e + max_tiles,
      *n_tiles = tile_m0 + max_tiles;
  const size_t sort_smem = size_t(E) * 2 * sizeof(int);
  if (sort_smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(sort_pairs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sort_smem)),
               "cudaFuncSetAttribute (grouped MoE sort)");
  m.traffic_counters();  // the device counters of CudaStats::device_expert_*
  const unsigned long long ebytes = device_expert_bytes(table != nullptr, io, inter);
  sort_pairs_kernel<<<1, 1024, sort_smem, m.stream>>>(dids, pairs, E, rows, order, ebase, tile_e, tile_m0, n_tiles,
                                                      m.expert_traffic, ebytes);
  m.launched("routed_moe (fast) sort kernel");
  if (wg) {
    auto* zs = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.xb, size_t(pairs) * io));
    gather_rows_kernel<<<grid_for(size_t(pairs) * io / 8, 256), 256, 0, m.stream>>>(z, order, pairs, k, io, zs);
    m.launched("routed_moe (fast) gather kernel");
    auto* act = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.act, size_t(pairs) * inter));
    WgArgs g;
    g.dense = dt ? dt->dev : nullptr, g.mx = table;
    g.order = order, g.ebase = ebase, g.tile_e = tile_e, g.tile_m0 = tile_m0, g.n_tiles = n_tiles;
    g.A = zs, g.act_out = act, g.K = io, g.N = inter, g.b1 = p.b1, g.b2 = p.b2, g.silu = p.act == Activation::SiLU ? 1 : 0;
    wgmma_grouped(m, true, g, max_tiles,
                  table ? "routed_moe (fast) mxfp4 gate/up grouped wgmma" : "routed_moe (fast) dense gate/up grouped wgmma");
    WgArgs d = g;
    d.A = act, d.act_out = nullptr, d.ys = ys, d.K = inter, d.N = io;
    wgmma_grouped(m, false, d, max_tiles,
                  table ? "routed_moe (fast) mxfp4 down grouped wgmma" : "routed_moe (fast) dense down grouped wgmma");
    launch_slot_sum(m, ys, dw, k, io, T, out);
    ++m.stats.grouped_moe_calls;
    return true;
  }
  if (dt) {  // dense experts: the pipelined grouped MMA kernels (no host sync)
    mma_grouped_dense(m, p, *dt, order, ebase, tile_e, tile_m0, n_tiles, max_tiles, dw, z, T, ys, out);
    ++m.stats.grouped_moe_calls;
    return true;
  }
  if (!m.capturing) {  // per-expert cuBLASLt products (see the file comment)
    std::vector<int> base(size_t(E) + 1);
    check_cuda(cudaMemcpyAsync(base.data(), ebase, base.size() * sizeof(int), cudaMemcpyDeviceToHost, m.stream),
               "cudaMemcpyAsync (expert row bases)");
    m.sync("routed_moe (fast): expert row counts");
    auto* zs = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.xb, size_t(pairs) * io));
    gather_rows_kernel<<<grid_for(size_t(pairs) * io / 8, 256), 256, 0, m.stream>>>(z, order, pairs, k, io, zs);
    m.launched("routed_moe (fast) gather kernel");
    float* gu = static_cast<float*>(m.scratch(s.mla[3], size_t(pairs) * 2 * inter * sizeof(float)));
    auto* act16 = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.act, size_t(pairs) * inter));
    float* y = static_cast<float*>(m.scratch(s.mla[5], size_t(pairs) * io * sizeof(float)));
    std::vector<int> touched;
    for (int e = 0; e < E; ++e)
      if (base[e + 1] > base[e]) touched.push_back(e);
    __nv_bfloat16 *w13 = nullptr, *w2 = nullptr;
    if (table) {
      const size_t per = size_t(3) * inter * io;
      w13 = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[4], size_t(kDequantBatch) * per));
      w2 = w13 + size_t(kDequantBatch) * 2 * inter * io;
    }
    const DenseExpertPtrs* dhost = table ? nullptr : dt->host.data();  // no copy of the host table
    for (size_t b0 = 0; b0 < touched.size(); b0 += kDequantBatch) {
      const int nb = int(std::min<size_t>(kDequantBatch, touched.size() - b0));
      if (table) {
        ExpertList list{};
        list.n = nb;
        for (int i = 0; i < nb; ++i) list.id[i] = touched[b0 + i];
        mx_dequant_kernel<<<dim3(256, unsigned(nb)), 256, 0, m.stream>>>(table, list, inter, io, w13, w2);
        m.launched("routed_moe (fast) MXFP4 -> BF16 decode kernel");
      }
      for (int i = 0; i < nb; ++i) {
        const int e = touched[b0 + i], p0 = base[e], ne = base[e + 1] - base[e];
        LtProduct g1;
        g1.M = ne, g1.K = io, g1.A = zs + size_t(p0) * io, g1.lda = io, g1.b_nk = true, g1.ldb = io;
        g1.ldc = 2 * int64_t(inter);
        if (table) {
          g1.N = 2 * inter, g1.B = w13 + size_t(i) * 2 * inter * io, g1.C = gu + size_t(p0) * 2 * inter;
          lt_product(m, g1, 10);
        } else {
          g1.N = inter, g1.B = dhost[e].w1, g1.C = gu + size_t(p0) * 2 * inter;
          lt_product(m, g1, 12);
          g1.B = dhost[e].w3, g1.C = gu + size_t(p0) * 2 * inter + inter;
          lt_product(m, g1, 12);
        }
      }
      const int r0 = base[touched[b0]], r1 = base[touched[b0 + nb - 1] + 1];
      glu_rows_kernel<<<grid_for(size_t(r1 - r0) * inter, 256), 256, 0, m.stream>>>(gu, r0, r1, inter, p.act == Activation::SiLU ? 1 : 0,
                                                                                   p.b1, p.b2, act16);
      m.launched("routed_moe (fast) GLU kernel");
      for (int i = 0; i < nb; ++i) {
        const int e = touched[b0 + i], p0 = base[e], ne = base[e + 1] - base[e];
        LtProduct g2;
        g2.M = ne, g2.N = io, g2.K = inter, g2.A = act16 + size_t(p0) * inter, g2.lda = inter, g2.b_nk = true;
        g2.B = table ? static_cast<const void*>(w2 + size_t(i) * io * inter) : static_cast<const void*>(dhost[e].w2);
        g2.ldb = inter, g2.C = y + size_t(p0) * io, g2.ldc = io;
        lt_product(m, g2, 11);
      }
    }
    scatter_rows_kernel<<<grid_for(size_t(pairs) * io, 256), 256, 0, m.stream>>>(y, order, pairs, io, ys);
    m.launched("routed_moe (fast) scatter kernel");
    launch_slot_sum(m, ys, dw, k, io, T, out);
    ++m.stats.grouped_moe_calls;
    return true;
  }
  auto* act = static_cast<__nv_bfloat16*>(m.scratch(s.act, size_t(pairs) * inter * sizeof(uint16_t)));
  GroupArgs g{};
  g.mx = table, g.dense = dt ? dt->dev : nullptr;
  g.order = order, g.ebase = ebase, g.tile_e = tile_e, g.tile_m0 = tile_m0, g.n_tiles = n_tiles;
  g.z = z, g.act_out = act, g.top_k = k, g.Kd = io, g.N = inter, g.b1 = p.b1, g.b2 = p.b2, g.silu = p.act == Activation::SiLU ? 1 : 0;
  const dim3 grid1(unsigned(max_tiles), unsigned((inter + BN - 1) / BN));
  if (table) grouped_kernel<true, true><<<grid1, kThreads, 0, m.stream>>>(g);
  else grouped_kernel<true, false><<<grid1, kThreads, 0, m.stream>>>(g);
  m.launched("routed_moe (fast) gate/up grouped GEMM");
  GroupArgs d = g;
  d.z = nullptr, d.act_out = nullptr, d.act_in = act, d.ys = ys, d.Kd = inter, d.N = io;
  const dim3 grid2(unsigned(max_tiles), unsigned((io + BN - 1) / BN));
  if (table) grouped_kernel<false, true><<<grid2, kThreads, 0, m.stream>>>(d);
  else grouped_kernel<false, false><<<grid2, kThreads, 0, m.stream>>>(d);
  m.launched("routed_moe (fast) down grouped GEMM");
  launch_slot_sum(m, ys, dw, k, io, T, out);
  ++m.stats.grouped_moe_calls;
  return true;
}

}  // namespace wren::cuda
