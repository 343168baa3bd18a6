// CUDA backend, fast precision mode: the routed experts' grouped products on Hopper warpgroup MMA
// (wgmma, sm_90a; this file alone is built for that target, see CMakeLists.txt).
//
// One block = 2 warpgroups (256 threads) on a tile of up to 128 sorted pairs of one expert × 256
// weight rows (gate/up: 128 rows of W1 and the same 128 rows of W3, giving 128 GLU columns; down:
// 256 io columns). k-steps of 64 BF16 (one 128-byte row, the 128-byte swizzle of the wgmma
// shared-memory layout: 16-byte chunk c of row r stored at chunk c ^ (r mod 8)), staged through a
// 4-deep ring by cp.async (loads run 2 steps ahead; the step before is still being multiplied).
// MXFP4 weights come as their packed codes by cp.async into a second ring and are decoded to BF16
// (exact: e2m1 × 2^(s-127), by byte permutes) into the B stage by the thread that copied them, one
// step ahead of the product. Tiles of more than 64 rows: warpgroup w takes rows 64w.. against all
// 256 weight rows (m64n256k16); tiles of at most 64 rows: both take the same rows, warpgroup w
// against weight rows 128w.. (m64n128k16). f32 accumulators in registers; the gate/up epilogue
// finds a G column and its U column in the same thread (accumulator groups j and j + 8, see
// wg_tile) and writes the GLU as BF16; the down epilogue writes each pair's row of ys.
// The grid is (column blocks, tiles): blocks of one tile run side by side, so a tile's A rows and
// one expert's weights are read from memory about once. An output element is one k-loop in a fixed
// order, whatever tile or position its row has: results do not depend on the chunk.
#include "backends/cuda/moe_wgmma.cuh"

#include <cuda_bf16.h>

#include <string>

#include "backends/cuda/mxfp4_decode.cuh"
#include "backends/cuda/wgmma.cuh"

namespace wren::cuda {

namespace {

constexpr int kBM = kWgTileRows, kBN = 256, kBK = 64, kSt = 4, kThr = 256;
constexpr int kABytes = kBM * kBK * 2;    // 16 KiB per stage
constexpr int kBBytes = kBN * kBK * 2;    // 32 KiB
constexpr int kRawBytes = kBN * kBK / 2;  // 8 KiB of MXFP4 codes
constexpr size_t smem_bytes(bool mx) { return 1024 + size_t(kSt) * (kABytes + kBBytes + (mx ? kRawBytes : 0)); }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int kN>
__device__ __forceinline__ void wgmma_step(float (&d)[kN], uint64_t da, uint64_t db) {
  if constexpr (kN == 128) wgmma_m64n256k16(d, da, db);
  else wgmma_m64n128k16(d, da, db);
}

/// One block's tile. kHalf = false: up to 128 rows, warpgroup wg takes rows 64·wg.. against all
/// 256 weight rows (m64n256). kHalf = true: at most 64 rows, both warpgroups take them, warpgroup
/// wg against weight rows 128·wg.. (m64n128). Weight rows of gate/up in shared memory, by 64-row
/// block b: W1 (b even) or W3 (b odd) rows n0 + 64·(b/2) + 0..63, so the G and U of an output
/// column sit in accumulator groups j and j + 8 of one 128-row half.
template <bool kGateUp, bool kMx, bool kHalf>
__device__ __forceinline__ void wg_tile(const WgArgs& a, int e, int m0, int m_end, int n0, unsigned char* gbase,
                                     uint32_t sbase) {
  constexpr int kAcc = kHalf ? 64 : 128;
  constexpr int kARows = kHalf ? 2 : 4;  // A copies per thread (rows r0 + 32 i)
  const uint32_t sA = sbase, sB = sbase + kSt * kABytes, sRaw = sB + kSt * kBBytes;
  const int tid = int(threadIdx.x), wg = tid / 128, K = a.K, N = a.N, KT = (K + kBK - 1) / kBK;
  // Copies: 16-byte chunk cc of rows r0 + 32 i (A: i < kARows, dense B: i < 8); swizzled position.
  const int cc = tid % 8, r0 = tid / 8;
  const uint32_t swz = uint32_t((cc ^ (r0 & 7)) * 16);
  const __nv_bfloat16* a_src = a.A + size_t(m0 + r0) * K + cc * 8;
  unsigned a_ok = 0;
#pragma unroll
  for (int i = 0; i < kARows; ++i) a_ok |= (m0 + r0 + 32 * i < m_end ? 1u : 0u) << i;
  // Dense B, shared-memory row r = r0 + 32 i: its matrix (h) and weight row.
  auto b_row = [&](int i, int& h) {
    if (kGateUp) {
      h = (i / 2) & 1;
      return n0 + 64 * (i / 4) + r0 + 32 * (i % 2);
    }
    h = 0;
    return n0 + r0 + 32 * i;
  };
  const uint16_t* b_mat[2] = {nullptr, nullptr};
  unsigned b_ok = 0;
  // MXFP4 B: thread tid copies and decodes shared-memory row tid (its 32 code bytes per step).
  const uint8_t* mx_p = nullptr;
  const uint8_t* mx_s = nullptr;
  bool mx_ok = false;
  if (!kMx) {
    const DenseExpertPtrs p = a.dense[e];
    b_mat[0] = kGateUp ? p.w1 : p.w2;
    b_mat[1] = kGateUp ? p.w3 : p.w2;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int h;
      b_ok |= (b_row(i, h) < N ? 1u : 0u) << i;
    }
  } else {
    const ExpertPtrs p = a.mx[e];
    const int b = tid / 64;
    const bool up = kGateUp && (b & 1);
    const int n = kGateUp ? n0 + 64 * (b / 2) + tid % 64 : n0 + tid;
    mx_ok = n < N;
    const uint8_t* pk = kGateUp ? (up ? p.p3 : p.p1) : p.p2;
    const uint8_t* sc = kGateUp ? (up ? p.s3 : p.s1) : p.s2;
    mx_p = pk + size_t(mx_ok ? n : 0) * (K / 2);
    mx_s = sc + size_t(mx_ok ? n : 0) * (K / 32);
  }
  auto load = [&](int kt) {
    const int st = kt % kSt, k = kt * kBK;
    const bool kin = k + cc * 8 < K;  // K % 8 == 0: a chunk is all in or all out
    const uint32_t As = sA + st * kABytes;
#pragma unroll
    for (int i = 0; i < kARows; ++i) {
      const bool ok = (a_ok >> i & 1u) && kin;
      cp16(As + (r0 + 32 * i) * 128 + swz, ok ? a_src + size_t(32 * i) * K + k : a.A, ok);
    }
    if (!kMx) {
      const uint32_t Bs = sB + st * kBBytes;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        int h;
        const int n = b_row(i, h);
        const bool ok = (b_ok >> i & 1u) && kin;
        cp16(Bs + (r0 + 32 * i) * 128 + swz, ok ? b_mat[h] + size_t(n) * K + k + cc * 8 : b_mat[h], ok);
      }
    } else {
      const uint32_t Rs = sRaw + st * kRawBytes + tid * 32;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool ok = mx_ok && k + 32 * h < K;
        cp16(Rs + 16 * h, ok ? mx_p + k / 2 + 16 * h : mx_p, ok);
      }
    }
  };
  // MXFP4: the scale bytes of step kt (2 of the row), read one step ahead into registers.
  auto scales = [&](int kt, uint32_t (&s)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int g = kt * 2 + h;
      s[h] = mx_ok && g < K / 32 ? uint32_t(mx_s[g]) : 127u;
    }
  };
  // MXFP4: this thread's codes of step kt -> BF16 row tid of its B stage (after its copies landed).
  auto decode = [&](int kt, const uint32_t (&s)[2]) {
    const int st = kt % kSt;
    const unsigned char* raw = gbase + (sRaw - sbase) + st * kRawBytes + tid * 32;
    unsigned char* brow = gbase + (sB - sbase) + st * kBBytes + tid * 128;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 o[4];
      decode16(*reinterpret_cast<const uint4*>(raw + 16 * h), s[h], o);
#pragma unroll
      for (int c = 0; c < 4; ++c) *reinterpret_cast<uint4*>(brow + (((4 * h + c) ^ (tid & 7)) * 16)) = o[c];
    }
  };
  float d[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) d[i] = 0.f;
  uint32_t sc_cur[2] = {127u, 127u}, sc_next[2] = {127u, 127u};
  // Prologue: steps 0 and 1 in flight (one commit group per step, empty past the end).
#pragma unroll
  for (int s = 0; s < kSt - 2; ++s) {
    if (s < KT) load(s);
    cp_commit();
  }
  if (kMx) {
    scales(0, sc_cur);
    if (KT > 1) scales(1, sc_next);
    cp_wait<1>();  // step 0 landed (this thread's copies)
    decode(0, sc_cur);
  }
  // This warpgroup's operands inside a stage: A rows 64·wg.. (full) or 0.. (half); B rows 128·wg.. (half).
  const uint32_t a_off = kHalf ? 0u : uint32_t(wg * 64 * 128), b_off = kHalf ? uint32_t(wg * 128 * 128) : 0u;
  for (int kt = 0; kt < KT; ++kt) {
    cp_wait<1>();  // step kt landed (this thread's copies): with kSt = 4, one group may stay open
    fence_async_smem();
    __syncthreads();  // every copy and decode of step kt is in; the products of step kt - 2 are done
    if (kt + kSt - 2 < KT) load(kt + kSt - 2);
    cp_commit();
    const int st = kt % kSt;
    wg_fence();
    fence_acc(d);
    const uint32_t As = sA + st * kABytes + a_off, Bs = sB + st * kBBytes + b_off;
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16) wgmma_step(d, desc_sw128(As + 32 * k16), desc_sw128(Bs + 32 * k16));
    wg_commit();
    fence_acc(d);
    if (kMx && kt + 1 < KT) {  // the next step's weights, while this step's products run
      sc_cur[0] = sc_next[0], sc_cur[1] = sc_next[1];
      if (kt + 2 < KT) scales(kt + 2, sc_next);
      cp_wait<1>();  // step kt + 1 landed
      decode(kt + 1, sc_cur);
    }
    wg_wait<1>();  // the products of step kt - 1 are done: its stage may be refilled
    fence_acc(d);
  }
  wg_wait<0>();
  fence_acc(d);
  // Accumulator layout: register 4j + 2h + q holds row 16·warp + lane/4 + 8h, column 8j + 2(lane%4) + q
  // of this warpgroup's 64 × (2·kAcc) product.
  const int lane = tid % 32, warp = (tid / 32) % 4, c0 = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + (kHalf ? 0 : 64 * wg) + 16 * warp + lane / 4 + 8 * h;
    if (row >= m_end) continue;
    if (kGateUp) {
      __nv_bfloat16* dst = a.act_out + size_t(row) * N;
#pragma unroll
      for (int jj = 0; jj < kAcc / 8; ++jj) {  // output column group: G in group gi, U in gi + 8
        const int gi = (jj / 8) * 16 + jj % 8;
        const int n = n0 + (kHalf ? 64 * wg : 0) + 8 * jj + c0;  // N % 8 == 0: n < N implies n + 1 < N
        if (n >= N) continue;
        float v[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float g = d[4 * gi + 2 * h + q], u = d[4 * (gi + 8) + 2 * h + q];
          v[q] = a.silu ? g / (1.f + __expf(-g)) * u : situ_f(g, u, a.b1, a.b2);
        }
        *reinterpret_cast<__nv_bfloat162*>(dst + n) = __floats2bfloat162_rn(v[0], v[1]);
      }
    } else {
      float* dst = a.ys + size_t(a.order[row]) * N;
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        const int n = n0 + (kHalf ? 128 * wg : 0) + 8 * j + c0;
        if (n < N) *reinterpret_cast<float2*>(dst + n) = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
      }
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool kGateUp, bool kMx>
__global__ void __launch_bounds__(kThr, 1) wg_grouped_kernel(WgArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char wg_smem[];
  const int tile = int(blockIdx.y);
  if (tile >= *a.n_tiles) return;
  const int e = a.tile_e[tile], m0 = a.tile_m0[tile], m_end = min(a.ebase[e + 1], m0 + kBM);
  constexpr int kOutN = kGateUp ? kBN / 2 : kBN;  // output columns per block
  const int n0 = int(blockIdx.x) * kOutN;
  const uint32_t raw0 = uint32_t(__cvta_generic_to_shared(wg_smem));
  const uint32_t sbase = (raw0 + 1023u) & ~1023u;
  unsigned char* gbase = wg_smem + (sbase - raw0);
  // Two bodies (no warpgroup skips its products inside one: wgmma in a divergent branch is serialized).
  if (m_end - m0 <= 64) wg_tile<kGateUp, kMx, true>(a, e, m0, m_end, n0, gbase, sbase);
  else wg_tile<kGateUp, kMx, false>(a, e, m0, m_end, n0, gbase, sbase);
#else
  __trap();  // built only for sm_90a (see the file comment)
#endif
}

template <bool kGateUp, bool kMx>
void set_smem_attr() {
  check_cuda(cudaFuncSetAttribute(wg_grouped_kernel<kGateUp, kMx>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(smem_bytes(kMx))),
             "cudaFuncSetAttribute (grouped wgmma)");
}

}  // namespace

bool wgmma_grouped_available(CudaBackend::Impl& m) {
  static int state = -1;  // per process: -1 unknown, 0 no, 1 yes
  if (state < 0) {
    cudaFuncAttributes attr{};
    const cudaError_t err = cudaFuncGetAttributes(&attr, wg_grouped_kernel<true, false>);
    state = err == cudaSuccess && size_t(m.max_smem_optin) >= smem_bytes(true) ? 1 : 0;
    if (err != cudaSuccess) (void)cudaGetLastError();  // no sm_90a code for this device: not sticky
    if (state) {
      set_smem_attr<true, false>();
      set_smem_attr<false, false>();
      set_smem_attr<true, true>();
      set_smem_attr<false, true>();
    }
  }
  return state == 1;
}

void wgmma_grouped(CudaBackend::Impl& m, bool gate_up, const WgArgs& a, int max_tiles, const char* label) {
  const int out_n = gate_up ? kBN / 2 : kBN;
  const dim3 grid(unsigned((a.N + out_n - 1) / out_n), unsigned(max_tiles));
  const bool mx = a.mx != nullptr;
  const size_t smem = smem_bytes(mx);
  if (gate_up && mx) wg_grouped_kernel<true, true><<<grid, kThr, smem, m.stream>>>(a);
  else if (gate_up) wg_grouped_kernel<true, false><<<grid, kThr, smem, m.stream>>>(a);
  else if (mx) wg_grouped_kernel<false, true><<<grid, kThr, smem, m.stream>>>(a);
  else wg_grouped_kernel<false, false><<<grid, kThr, smem, m.stream>>>(a);
  m.launched(label);
}

}  // namespace wren::cuda
