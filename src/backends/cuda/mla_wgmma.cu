// CUDA backend, fast precision mode: the flash MLA prefill attention on Hopper warpgroup MMA (wgmma,
// sm_90a; this file is built for that target alone, see CMakeLists.txt). Same math, masking and
// chunk rule as mla_fast.cu's mma.sync kernel (its file comment); what changes is the machine:
//
// One block = 2 warpgroups (256 threads) on 128 query rows of one head; warpgroup w owns rows
// 64w .. 64w + 63. Key tiles of 128. Shared memory (128-byte swizzled K-major tiles, wgmma.cuh):
//   Q   [128 rows][192]  bf16, converted from f32 once (3 sub-tiles of 64 features)     48 KiB
//   K   [128 keys][192]  bf16, 2 stages by cp.async: k_nope from kv, k_x from the cache 2 × 48 KiB
//   Vᵀ  [128 dims][128 keys] bf16, 2 stages by cp.async from the transposed copy vt   2 × 32 KiB
// Per key tile and warpgroup: S = Q·Kᵀ as 12 wgmma m64n128k16 (both operands in shared memory),
// the causal mask and online softmax in f32 on the accumulators (a thread holds 2 rows × 32
// columns: the same per-row quad reductions as the mma.sync kernel), P rounded to BF16 straight
// into the register A operand of O += P·V (8 wgmma m64n128k16, V from shared memory). Columns past
// nope + extra and dims past v are zero in shared memory, so one instance serves every head size
// up to 192 / 128. A warpgroup skips a tile that lies past all of its rows (warpgroup-uniform:
// wgmma must not diverge); a row that sees none of a processed tile's keys gets p = 0 and a
// rescale of exactly 1, so its bits are those of a skip (the chunk rule).
#include <cuda_bf16.h>

#include "backends/cuda/mla_flash.cuh"
#include "backends/cuda/wgmma.cuh"

namespace wren::cuda {

namespace {

constexpr int kBr = 128, kThr = 256;
constexpr int kSub = 128 * 128;             // bytes of one [128 rows][64 BF16] swizzled sub-tile
constexpr int kQBytes = 3 * kSub;           // Q: 192 features
constexpr int kKBytes = 3 * kSub;           // one K stage
constexpr int kVBytes = 2 * kSub;           // one Vᵀ stage: 128 keys
constexpr size_t kSmem = 1024 + kQBytes + 2 * size_t(kKBytes + kVBytes);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kBc = 128, kDQK = 192, kDV = 128;

/// Byte offset of 16-byte chunk c (8 BF16) of row r in one swizzled [rows][64 BF16] sub-tile.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 128 + ((c ^ (r % 8)) * 16)); }

/// Key tile kb of this head into stage st: K rows (k_nope from kv, k_x from c16; keys ≥ n and
/// features ≥ nope + extra zero) and Vᵀ rows (dims ≥ v and keys ≥ n_pad zero; vt itself is zero
/// for n ≤ key < n_pad). Thread tid copies chunk tid % 8 of rows tid / 8 + 32i of every sub-tile,
/// so its shared-memory offsets are one base plus constants.
__device__ __forceinline__ void load_kv(const FlashArgs& a, const __nv_bfloat16* head, const __nv_bfloat16* vt_head,
                                        int kb, uint32_t sK, uint32_t sV) {
  const int kvh = a.nope + a.v, sn = a.nope / 8, sk = sn + a.extra / 8, s0 = kb * kBc;
  const int cc = int(threadIdx.x) % 8, r0 = int(threadIdx.x) / 8;
  const uint32_t base = sK + swz(r0, cc);
#pragma unroll
  for (int sub = 0; sub < kDQK / 64; ++sub) {
    const int c = sub * 8 + cc;  // feature chunk
    const bool feat = c < sk;
    const __nv_bfloat16* col = c < sn ? head + c * 8 : a.c16 + a.L + (c - sn) * 8;
    const int ld = c < sn ? kvh : a.W;
#pragma unroll
    for (int i = 0; i < kBc / 32; ++i) {
      const int s = s0 + r0 + 32 * i;
      const bool in = feat && s < a.n;
      cp16(base + sub * kSub + 32 * i * 128, in ? col + size_t(s) * ld : a.kv, in);
    }
  }
  const uint32_t vbase = sV + swz(r0, cc);
#pragma unroll
  for (int sub = 0; sub < kBc / 64; ++sub) {
    const int s = s0 + 64 * sub + 8 * cc;  // 8 keys
#pragma unroll
    for (int i = 0; i < kDV / 32; ++i) {
      const int d = r0 + 32 * i;
      const bool in = d < a.v && s < a.n_pad;
      cp16(vbase + sub * kSub + 32 * i * 128, in ? vt_head + size_t(d) * a.n_pad + s : a.vt, in);
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

__global__ void __launch_bounds__(kThr, 1) mla_wg_flash_kernel(FlashArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char wg_sm[];
  const uint32_t raw0 = uint32_t(__cvta_generic_to_shared(wg_sm)), sQ = (raw0 + 1023u) & ~1023u;
  unsigned char* gQ = wg_sm + (sQ - raw0);
  const uint32_t sK0 = sQ + kQBytes, sV0 = sK0 + 2 * kKBytes;
  const int tid = int(threadIdx.x), wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int tiles = (a.T + kBr - 1) / kBr, q0 = (tiles - 1 - int(blockIdx.x)) * kBr;  // long rows first
  const int hl = int(blockIdx.y), h = a.h0 + hl, qh = a.nope + a.extra;
  const __nv_bfloat16* head = a.kv + size_t(hl) * a.n_pad * (a.nope + a.v);
  const __nv_bfloat16* vt_head = a.vt + size_t(hl) * a.v * a.n_pad;
  const int last_row = min(q0 + kBr, a.T) - 1, tiles_k = (a.pos0 + last_row) / kBc + 1;
  load_kv(a, head, vt_head, 0, sK0, sV0);
  cp_commit();
  // Q rows q0 .. q0 + 127 as BF16 (rows ≥ T and features ≥ qh zero): chunk tid % 8 of rows tid / 8 + 32i.
  {
    const int cc = tid % 8, r0 = tid / 8;
#pragma unroll
    for (int sub = 0; sub < kDQK / 64; ++sub) {
      const int c = sub * 8 + cc;
#pragma unroll
      for (int i = 0; i < kBr / 32; ++i) {
        const int r = r0 + 32 * i, row = q0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row < a.T && c * 8 < qh) {
          const float4* p = reinterpret_cast<const float4*>(a.q + (size_t(row) * a.H + h) * qh + c * 8);
          const float4 x = p[0], y = p[1];
          v = make_uint4(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w), pack_bf16(y.x, y.y), pack_bf16(y.z, y.w));
        }
        *reinterpret_cast<uint4*>(gQ + sub * kSub + swz(r, cc)) = v;
      }
    }
  }
  fence_async_smem();  // the generic-proxy Q stores, before wgmma reads them
  const int wrow0 = q0 + 64 * wg;                          // this warpgroup's first row
  const bool active = wrow0 < a.T;
  const int wlim = a.pos0 + min(wrow0 + 63, a.T - 1);      // the last key any of its rows sees
  int lim[2];                                              // the last key each of this thread's rows sees
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) lim[hh] = a.pos0 + wrow0 + 16 * warp + g + 8 * hh;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float sl = a.scale_log2;
  const uint32_t qa = sQ + uint32_t(wg * 64 * 128);
  for (int kb = 0; kb < tiles_k; ++kb) {
    const int st = kb & 1;
    if (kb + 1 < tiles_k) {
      load_kv(a, head, vt_head, kb + 1, sK0 + (st ^ 1) * kKBytes, sV0 + (st ^ 1) * kVBytes);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    fence_async_smem();
    __syncthreads();  // tile kb (and Q) in shared memory for every thread
    const int s0 = kb * kBc;
    if (active && s0 <= wlim) {
      const uint32_t sK = sK0 + st * kKBytes, sV = sV0 + st * kVBytes;
      float s[64];
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kDQK / 16; ++kk)
        wgmma_m64n128k16(s, desc_sw128(qa + (kk / 4) * kSub + 32 * (kk % 4)),
                         desc_sw128(sK + (kk / 4) * kSub + 32 * (kk % 4)), kk > 0 ? 1 : 0);
      wg_commit();
      wg_wait<0>();
      fence_acc(s);
      // Register 4j + 2hh + q: row 16·warp + g + 8hh of the warpgroup, key s0 + 8j + 2·t4 + q.
      const bool edge = s0 + kBc - 1 > a.pos0 + wrow0;  // some key may lie past some row
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            float& x = s[4 * j + 2 * hh + q];
            if (edge && s0 + 8 * j + 2 * t4 + q > lim[hh]) x = -INFINITY;
            mx[hh] = fmaxf(mx[hh], x);
          }
        }
      }
      float f[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(kFull, mx[hh], 1));
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(kFull, mx[hh], 2));
        // Key 0 is visible to every row, so m is finite after the first tile; a tile whose keys
        // are all past a row gives mx = −inf and keeps m (f = 1 exactly).
        const float n = fmaxf(m[hh], mx[hh] * sl);
        f[hh] = m[hh] == n ? 1.f : ex2_fast(m[hh] - n);
        m[hh] = n;
      }
      float rs[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            float& x = s[4 * j + 2 * hh + q];
            x = ex2_fast(fmaf(x, sl, -m[hh]));
            rs[hh] += x;
          }
        }
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) l[hh] = l[hh] * f[hh] + rs[hh];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[4 * j] *= f[0], o[4 * j + 1] *= f[0], o[4 * j + 2] *= f[1], o[4 * j + 3] *= f[1];
      }
      // P as BF16 A fragments: keys 16kk .. 16kk + 15 are accumulator registers 8kk .. 8kk + 7.
      uint32_t p[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) p[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
      }
      wg_fence();
      fence_acc(o);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
        wgmma_m64n128k16_rs(o, p[kk], desc_sw128(sV + (kk / 4) * kSub + 32 * (kk % 4)));
      wg_commit();
      wg_wait<0>();
      fence_acc(o);
    }
    __syncthreads();  // the next iteration's copies overwrite this stage
  }
  if (!active) return;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] += __shfl_xor_sync(kFull, l[hh], 1);
    l[hh] += __shfl_xor_sync(kFull, l[hh], 2);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = wrow0 + 16 * warp + g + 8 * hh;
    if (row >= a.T) continue;
    const float inv = 1.f / l[hh];
    float* dst = a.ctx + (size_t(row) * a.H + h) * a.v;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int c = 8 * j + 2 * t4;  // v % 8 == 0: c < v implies c + 1 < v
      if (c < a.v) *reinterpret_cast<float2*>(dst + c) = make_float2(o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
    }
  }
#else
  __trap();  // built only for sm_90a (see the file comment)
#endif
}

}  // namespace

bool mla_wgmma_available(CudaBackend::Impl& m) {
  static int state = -1;  // per process: -1 unknown, 0 no, 1 yes
  if (state < 0) {
    cudaFuncAttributes attr{};
    const cudaError_t err = cudaFuncGetAttributes(&attr, mla_wg_flash_kernel);
    state = err == cudaSuccess && size_t(m.max_smem_optin) >= kSmem ? 1 : 0;
    if (err != cudaSuccess) (void)cudaGetLastError();  // no sm_90a code for this device: not sticky
    if (state)
      check_cuda(cudaFuncSetAttribute(mla_wg_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)),
                 "cudaFuncSetAttribute (mla wgmma flash)");
  }
  return state == 1;
}

void mla_wgmma_flash(CudaBackend::Impl& m, const FlashArgs& a, int g) {
  const unsigned tiles = unsigned((a.T + kBr - 1) / kBr);
  mla_wg_flash_kernel<<<dim3(tiles, unsigned(g)), kThr, kSmem, m.stream>>>(a);
  m.launched("mla (fast) flash attention kernel (wgmma)");
}

}  // namespace wren::cuda
