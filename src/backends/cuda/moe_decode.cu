// CUDA backend, fast precision mode: the routed experts of one decode token on tensor cores, MXFP4
// (K3) or BF16 (Kimi Linear's dense experts).
//
// A decode token reads k whole experts (K3: 16 × 17.55 MB) and does 2 FLOPs per weight: the work is
// the weight stream, so the kernels are built to keep DRAM busy with as few instructions per weight
// byte as the decode allows. A warp owns 16 rows of a matrix; lane (g, t4) = (lane / 4, lane % 4)
// holds rows g and g + 8; the sum over a row's columns may run in any order, so the k index of each
// MMA is a permutation of the columns, the same for the weights (A) and the token (B).
//
// MXFP4 (mma.sync m16n8k32, e4m3 × e4m3 → f32; docs/gpu-method.md "MXFP4 experts of one decode
// token"):
// - an e2m1 code is an e4m3 value exactly once moved into place: sign to bit 7, its exponent and
//   mantissa bits (E1 E0 m) to bits 4..2 give 2^-6 · e2m1 for every code, zero and 0.5 (an e4m3
//   subnormal) included. Per 4 code bytes: 7 integer operations make two e4m3 words (the low
//   nibbles, then the high ones), against ~16 for a BF16 decode through a table (run 27's kernel);
// - the token is staged in shared memory as two e4m3 words per value, hi = e4m3(x · 2^σ) and
//   lo = e4m3(x · 2^σ − hi) (σ: a power of two putting max|x| in [128, 256)), together about as
//   precise as BF16;
// - the group scale cannot go into the operands (a k32 step spans 4 groups), so it goes into the
//   columns: lane t4 loads the 16 code bytes of group t4 of a 128-column span (rows g, g + 8), and
//   B's column t4 holds the token's hi values on lane t4's k slots only, column t4 + 4 its lo
//   values, all else zero. After the span's 4 MMAs, C's column c is the partial dot product of one
//   group (c < 4: hi, c >= 4: lo) of each row, which the lane holding it scales in f32 by
//   2^(s−127) and adds up (the f32 promotion every 128 values that FP8 MMA accumulation wants);
//   the 4 lanes' sums of a row are added at the end and scaled by 2^(6−σ);
// - tiles of 128 rows (8 warps of 16 rows): gate/up, ceil(inter / 128) a slot, act[j] = SiTU(g, u)
//   in f32 (staged as the token of down); down, ceil(io / 128) a slot, ys[j] in f32; the default
//   runs them all in one persistent launch that also adds the slots up (mx_experts_kernel), the
//   other forms as a grid each (mx_gate_up_kernel, mx_down_kernel, then launch_slot_sum).
// BF16 (dense experts, mma.sync m16n8k16): lane (g, t4) loads the 32 values (64 bytes) at columns
// C + 32·t4 .. + 31 of rows g and g + 8 for each 128-column block C; MMA step i (0..7) takes its
// columns C + 32·t4 + 4i .. + 3 as k slots 2·t4, 2·t4 + 1, 2·t4 + 8, 2·t4 + 9 of A and of B (the
// token in BF16 as B's column 0, lanes g = 0; the other columns zero); C's column 0 is the product.
//
// Numerics: the fast mode's class (docs/gpu-method.md#modes): exact weights, a token rounded to
// ~8 bits (BF16, or e4m3 hi + lo), f32 accumulation in the tensor core's order; each (slot, row) is
// one fixed loop, so a token's result does not depend on its slot order or on the other slots.
// The dense kernels' warps a tile (dense_warps) follow from the shape, top-k and the device's SM
// count, so their order of a row's sum is fixed for a device but may differ between GPU models.
#include "backends/cuda/moe_decode.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

namespace wren::cuda {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * kWarp, kRows = 16, kCols = 128;

/// c += A · B on m16n8k32 e4m3 operands (f32 accumulators).
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- MXFP4 experts: e4m3 operands ----

/// The 4 low nibbles of a word of 4 code bytes (values 2b of byte b) as 4 e4m3 bytes = 2^-6 · e2m1.
__device__ __forceinline__ uint32_t e4m3_low(uint32_t q) { return ((q << 4) & 0x80808080u) | ((q << 2) & 0x1C1C1C1Cu); }
/// The 4 high nibbles (values 2b + 1) as e4m3 bytes = 2^-6 · e2m1.
__device__ __forceinline__ uint32_t e4m3_high(uint32_t q) { return (q & 0x80808080u) | ((q >> 2) & 0x1C1C1C1Cu); }

/// 2^(s−127) in f32 (a ue8m0 scale byte; 0 → 2^-127, a subnormal; 255 never passes the load checks).
__device__ __forceinline__ float ue8m0(uint32_t s) { return s ? __uint_as_float(s << 23) : 0x1p-127f; }

/// σ for a token whose max|x| is m: the power of two putting m · 2^σ in [128, 256) (0 for m == 0).
__device__ __forceinline__ int token_sigma(float m) {
  int e = 0;
  frexpf(m, &e);                  // m = f · 2^e, f in [0.5, 1)
  return m > 0.f ? 8 - e : 0;
}

/// The token x[n] (n % 32 == 0) staged for the e4m3 MMAs with σ given: for group G (32 values) and
/// word j (0..3) hi[4G + j] = the e4m3 bytes of x' = x · 2^σ at values 8j + {0, 2, 4, 6} (.x) and
/// 8j + {1, 3, 5, 7} (.y), lo[4G + j] the same of x' − hi. Whole block; ends with a barrier. Reads
/// x through L2 only (__ldcg, never the non-coherent path): mx_experts_kernel stages act written in
/// the same launch.
__device__ void stage_scaled(const float* x, int n, int sigma, uint2* hi, uint2* lo) {
  const float mul = ldexpf(1.f, sigma);
  for (int w = int(threadIdx.x); w < n / 8; w += int(blockDim.x)) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(x) + 2 * w), b = __ldcg(reinterpret_cast<const float4*>(x) + 2 * w + 1);
    const float v[8] = {a.x * mul, a.y * mul, a.z * mul, a.w * mul, b.x * mul, b.y * mul, b.z * mul, b.w * mul};
    uint32_t h[2] = {0, 0}, l[2] = {0, 0};
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // values 2p (even word, byte p) and 2p + 1 (odd word, byte p)
      const __nv_fp8x2_storage_t hh = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * p], v[2 * p + 1]), __NV_SATFINITE, __NV_E4M3);
      const float2 back = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(hh, __NV_E4M3)));
      const __nv_fp8x2_storage_t ll =
          __nv_cvt_float2_to_fp8x2(make_float2(v[2 * p] - back.x, v[2 * p + 1] - back.y), __NV_SATFINITE, __NV_E4M3);
      h[0] |= uint32_t(hh & 0xFF) << (8 * p), h[1] |= uint32_t(hh >> 8) << (8 * p);
      l[0] |= uint32_t(ll & 0xFF) << (8 * p), l[1] |= uint32_t(ll >> 8) << (8 * p);
    }
    hi[w] = make_uint2(h[0], h[1]);
    lo[w] = make_uint2(l[0], l[1]);
  }
  __syncthreads();
}

/// stage_scaled with σ from the token's own max|x| (NaN values ignored, as fmaxf does); returns σ.
/// Whole block; `red` is 32 floats of shared memory; ends with a barrier.
__device__ int stage_token(const float* x, int n, uint2* hi, uint2* lo, float* red) {
  float m = 0.f;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) m = fmaxf(m, fabsf(__ldcg(x + i)));
  for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = m;
  __syncthreads();
  m = 0.f;
  for (int w = 0; w < int(blockDim.x) / kWarp; ++w) m = fmaxf(m, red[w]);
  const int sigma = token_sigma(m);
  stage_scaled(x, n, sigma, hi, lo);
  return sigma;
}

constexpr int kU = 4;  // MXFP4: 128-column spans whose loads are issued together (4 · 64 bytes a row)

/// The first `pf` code lines and the first scale line of each of a warp's 16 rows of an MXFP4
/// matrix, asked of L2 (prefetch_rows); nothing when pf == 0.
__device__ __forceinline__ void prefetch_mx_head(const uint8_t* packed, const uint8_t* scale, int rows, int cols, int r0,
                                                 int pf) {
  if (pf <= 0) return;
  prefetch_rows(packed, size_t(cols) / 2, rows, r0, 0, pf);
  prefetch_rows(scale, size_t(cols) / 32, rows, r0, 0, 1);
}

/// (row g, row g + 8) sums of this lane's groups over a warp's 16 rows of an MXFP4 matrix (rows ×
/// cols, cols % 32 == 0) against the staged token; the caller adds the 4 lanes of a row.
/// kVec: the 16 scale bytes of a row's step in one 16-byte load where groups % 16 == 0 and the
/// scale base is 16-byte aligned (checked here), else a byte load each. kAhead > 0: each step first asks
/// L2 for the code lines of the step kAhead steps on (a lane a line: 16 rows × 2 lines of 128
/// bytes), so its loads find them in L2 (no register holds those bytes). Neither changes a sum.
template <bool kVec, int kAhead>
__device__ __forceinline__ void gemv_mx(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scale, int rows,
                                        int cols, int r0, const uint2* xhi, const uint2* xlo, float& sg, float& sh) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4, groups = cols / 32;
  const int ga = 2 * (t4 & 1);  // this lane's C columns 2·t4, 2·t4 + 1 hold groups ga, ga + 1 of a span
  const uint2* xs = g == t4 ? xhi : xlo;
  const bool feeds = g == t4 || g == t4 + 4;  // this lane's B column carries its k slots' values
  const int ra = r0 + g, rb = r0 + g + 8;
  const bool vec = kVec && groups % 16 == 0 && (reinterpret_cast<uintptr_t>(scale) & 15) == 0;
  // kAhead: the 2 code lines (16 groups × 16 bytes) of the warp's 16 rows of the step starting at group s.
  auto ahead = [&](int s) { prefetch_rows(packed, size_t(cols) / 2, rows, r0, size_t(s) * 16, 2); };
  if (kAhead > 0) {
#pragma unroll
    for (int a = 1; a < kAhead; ++a) ahead(4 * kU * a);
  }
  for (int s0 = 0; s0 < groups; s0 += 4 * kU) {
    if (kAhead > 0) ahead(s0 + 4 * kU * kAhead);
    uint4 ca[kU], cb[kU];
    uint32_t sa[kU][2], sb[kU][2];
    uint4 va = make_uint4(0, 0, 0, 0), vb = make_uint4(0, 0, 0, 0);
    if (vec) {  // bytes s0 .. s0 + 15 of the rows' scales (groups % 16 == 0: never past a row)
      if (ra < rows) va = __ldg(reinterpret_cast<const uint4*>(scale + size_t(ra) * groups + s0));
      if (rb < rows) vb = __ldg(reinterpret_cast<const uint4*>(scale + size_t(rb) * groups + s0));
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int G = s0 + 4 * u + t4, Gs = s0 + 4 * u + ga;
      const bool in = G < groups;
      ca[u] = ra < rows && in ? __ldg(reinterpret_cast<const uint4*>(packed + size_t(ra) * (cols / 2)) + G) : make_uint4(0, 0, 0, 0);
      cb[u] = rb < rows && in ? __ldg(reinterpret_cast<const uint4*>(packed + size_t(rb) * (cols / 2)) + G) : make_uint4(0, 0, 0, 0);
      if (vec) {
        const uint32_t wa = u == 0 ? va.x : u == 1 ? va.y : u == 2 ? va.z : va.w;
        const uint32_t wb = u == 0 ? vb.x : u == 1 ? vb.y : u == 2 ? vb.z : vb.w;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows past the matrix: 127 (2^0) times zero codes, as below
          sa[u][h] = ra < rows ? (wa >> (8 * (ga + h))) & 0xFFu : 127u;
          sb[u][h] = rb < rows ? (wb >> (8 * (ga + h))) & 0xFFu : 127u;
        }
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sa[u][h] = ra < rows && Gs + h < groups ? __ldg(scale + size_t(ra) * groups + Gs + h) : 127u;
          sb[u][h] = rb < rows && Gs + h < groups ? __ldg(scale + size_t(rb) * groups + Gs + h) : 127u;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int G = s0 + 4 * u + t4;
      const bool use = feeds && G < groups;
      const uint32_t wa[4] = {ca[u].x, ca[u].y, ca[u].z, ca[u].w}, wb[4] = {cb[u].x, cb[u].y, cb[u].z, cb[u].w};
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint2 b = use ? xs[4 * G + i] : make_uint2(0, 0);
        mma_e4m3(c, e4m3_low(wa[i]), e4m3_low(wb[i]), e4m3_high(wa[i]), e4m3_high(wb[i]), b.x, b.y);
      }
      sg = fmaf(c[0], ue8m0(sa[u][0]), fmaf(c[1], ue8m0(sa[u][1]), sg));
      sh = fmaf(c[2], ue8m0(sb[u][0]), fmaf(c[3], ue8m0(sb[u][1]), sh));
    }
  }
}

/// One step of a warp's MXFP4 ring (gemv_mx_ring): the code bytes each lane loads in gemv_mx for
/// kU spans (rows g and g + 8), at code[u][0 / 1][lane], and the 16 scale bytes of each of the
/// warp's 16 rows for the step's 16 groups, at scale[row].
struct MxStage {
  uint4 code[kU][2][kWarp];
  uint4 scale[kRows];
};

/// Whether gemv_mx_ring can take a matrix of `cols` columns with this scale base: a step's 16
/// scale bytes of a row in one 16-byte copy (groups % 16 == 0, the base 16-byte aligned).
__device__ __forceinline__ bool ring_ok(const uint8_t* scale, int cols) {
  return (cols / 32) % 16 == 0 && (reinterpret_cast<uintptr_t>(scale) & 15) == 0;
}

/// gemv_mx's sums (the same bits) with the step's bytes brought by cp.async into `ring`, this
/// warp's kStages stages in shared memory: the copies of the next kStages − 1 steps are in flight
/// while a step computes, and they hold no register, so a warp keeps (kStages − 1) · 4.25 KB in
/// flight (gemv_mx: 4 KB, in registers). Needs ring_ok. Rows past the matrix read zero codes
/// (cp.async's zero fill) and scale 127 (2^0), as in gemv_mx.
template <int kStages>
__device__ __forceinline__ void gemv_mx_ring(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scale,
                                             int rows, int cols, int r0, const uint2* xhi, const uint2* xlo, float& sg,
                                             float& sh, MxStage* ring) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4, groups = cols / 32;
  const int ga = 2 * (t4 & 1);
  const uint2* xs = g == t4 ? xhi : xlo;
  const bool feeds = g == t4 || g == t4 + 4;
  const int ra = r0 + g, rb = r0 + g + 8, rs = r0 + lane % kRows;
  const uint8_t* pa = packed + size_t(ra < rows ? ra : 0) * (cols / 2);
  const uint8_t* pb = packed + size_t(rb < rows ? rb : 0) * (cols / 2);
  const uint8_t* ps = scale + size_t(rs < rows ? rs : 0) * groups;
  const int steps = groups / (4 * kU);  // ring_ok: groups % 16 == 0
  auto issue = [&](int step) {
    MxStage& st = ring[step % kStages];
    const int s0 = step * 4 * kU;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int G = s0 + 4 * u + t4;
      cp_async16(&st.code[u][0][lane], pa + size_t(G) * 16, ra < rows);
      cp_async16(&st.code[u][1][lane], pb + size_t(G) * 16, rb < rows);
    }
    if (lane < kRows) cp_async16(&st.scale[lane], ps + s0, rs < rows);
  };
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) {
    if (p < steps) issue(p);
    cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    if (step + kStages - 1 < steps) issue(step + kStages - 1);  // into the stage step − 1 used
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // this lane's copies of `step` have landed
    __syncwarp();                  // and every lane's (the scale rows)
    const MxStage& st = ring[step % kStages];
    const uint8_t* sca = reinterpret_cast<const uint8_t*>(&st.scale[g]);
    const uint8_t* scb = reinterpret_cast<const uint8_t*>(&st.scale[g + 8]);
    const int s0 = step * 4 * kU;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int G = s0 + 4 * u + t4;
      const uint4 ca = st.code[u][0][lane], cb = st.code[u][1][lane];
      const uint32_t wa[4] = {ca.x, ca.y, ca.z, ca.w}, wb[4] = {cb.x, cb.y, cb.z, cb.w};
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint2 b = feeds ? xs[4 * G + i] : make_uint2(0, 0);
        mma_e4m3(c, e4m3_low(wa[i]), e4m3_low(wb[i]), e4m3_high(wa[i]), e4m3_high(wb[i]), b.x, b.y);
      }
      const uint32_t sa0 = ra < rows ? sca[4 * u + ga] : 127u, sa1 = ra < rows ? sca[4 * u + ga + 1] : 127u;
      const uint32_t sb0 = rb < rows ? scb[4 * u + ga] : 127u, sb1 = rb < rows ? scb[4 * u + ga + 1] : 127u;
      sg = fmaf(c[0], ue8m0(sa0), fmaf(c[1], ue8m0(sa1), sg));
      sh = fmaf(c[2], ue8m0(sb0), fmaf(c[3], ue8m0(sb1), sh));
    }
    __syncwarp();  // every lane has read the stage before a later step refills it
  }
}

/// A warp's MXFP4 sums: through its cp.async ring when kStages > 0 and ring_ok, else gemv_mx.
template <bool kVec, int kAhead, int kStages>
__device__ __forceinline__ void gemv_mx_any(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scale,
                                            int rows, int cols, int r0, const uint2* xhi, const uint2* xlo, float& sg,
                                            float& sh, MxStage* ring) {
  if constexpr (kStages > 0) {
    if (ring_ok(scale, cols)) return gemv_mx_ring<kStages>(packed, scale, rows, cols, r0, xhi, xlo, sg, sh, ring);
  }
  gemv_mx<kVec, kAhead>(packed, scale, rows, cols, r0, xhi, xlo, sg, sh);
}

/// Bytes of dynamic shared memory before the rings: the staged token (2 bytes a value), rounded
/// up to the 16 bytes of an MxStage.
__host__ __device__ constexpr size_t ring_offset(int n) { return (size_t(n) * 2 + 15) / 16 * 16; }

/// Adds a row's 4 lane sums (lanes t4 = 0..3 of a quad); every lane of the quad gets the total.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFull, v, 1);
  return v + __shfl_xor_sync(kFull, v, 2);
}

/// gemv_mx's sums of row r0 + g alone (lanes g = 0..7: a warp on 8 rows), kSpans 128-column spans a
/// step (gemv_mx: 4 spans of 2 rows; 8 spans of 1 row keep as many bytes in flight in half as many
/// steps). The span's MMA gets zeros for rows g + 8, and each output of an MMA depends on its own
/// row only; the spans whose first group is below groups rounded up to 16 are added in gemv_mx's
/// order with its fmaf expression (the spans gemv_mx adds: those of its 16-group steps), so sg has
/// gemv_mx's bits for the row. Byte scale loads (gemv_mx's kVec = false; the bits do not depend on
/// kVec).
template <int kSpans>
__device__ __forceinline__ void gemv_mx_half(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scale,
                                             int rows, int cols, int r0, const uint2* xhi, const uint2* xlo, float& sg) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4, groups = cols / 32;
  const int ga = 2 * (t4 & 1), limit = (groups + 4 * kU - 1) / (4 * kU) * (4 * kU);
  const uint2* xs = g == t4 ? xhi : xlo;
  const bool feeds = g == t4 || g == t4 + 4;
  const int ra = r0 + g;
  for (int s0 = 0; s0 < groups; s0 += 4 * kSpans) {
    uint4 ca[kSpans];
    uint32_t sa[kSpans][2];
#pragma unroll
    for (int u = 0; u < kSpans; ++u) {
      const int G = s0 + 4 * u + t4, Gs = s0 + 4 * u + ga;
      ca[u] = ra < rows && G < groups ? __ldg(reinterpret_cast<const uint4*>(packed + size_t(ra) * (cols / 2)) + G)
                                      : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int h = 0; h < 2; ++h) sa[u][h] = ra < rows && Gs + h < groups ? __ldg(scale + size_t(ra) * groups + Gs + h) : 127u;
    }
#pragma unroll
    for (int u = 0; u < kSpans; ++u) {
      if (s0 + 4 * u >= limit) break;  // uniform: past gemv_mx's last span
      const int G = s0 + 4 * u + t4;
      const bool use = feeds && G < groups;
      const uint32_t wa[4] = {ca[u].x, ca[u].y, ca[u].z, ca[u].w};
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint2 b = use ? xs[4 * G + i] : make_uint2(0, 0);
        mma_e4m3(c, e4m3_low(wa[i]), 0u, e4m3_high(wa[i]), 0u, b.x, b.y);
      }
      sg = fmaf(c[0], ue8m0(sa[u][0]), fmaf(c[1], ue8m0(sa[u][1]), sg));
    }
  }
}

/// One warp's gate/up rows r0 + g, r0 + g + 8 against the staged token (σ = sigma): act_j[r] =
/// SiTU(W1·z, W3·z)[r] in f32 (lanes t4 = 0 write); returns this lane's max|act| of what it wrote
/// (NaN ignored, as fmaxf does). mx_gate_up_kernel and mx_experts_kernel's gate/up tiles.
template <bool kVec, int kAhead, int kStages>
__device__ __forceinline__ float mx_gate_up_rows(const ExpertPtrs& e, int io, int inter, int r0, const uint2* xst,
                                                 int sigma, float b1, float b2, float* act_j, MxStage* ring) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  float ga = 0.f, gb = 0.f, ua = 0.f, ub = 0.f;
  gemv_mx_any<kVec, kAhead, kStages>(e.p1, e.s1, inter, io, r0, xst, xst + io / 8, ga, gb, ring);
  gemv_mx_any<kVec, kAhead, kStages>(e.p3, e.s3, inter, io, r0, xst, xst + io / 8, ua, ub, ring);
  const float back = ldexpf(1.f, 6 - sigma);
  ga = quad_sum(ga) * back, gb = quad_sum(gb) * back, ua = quad_sum(ua) * back, ub = quad_sum(ub) * back;
  float m = 0.f;
  if (t4 == 0 && r0 + g < inter) {
    const float a = situ_f(ga, ua, b1, b2);
    act_j[r0 + g] = a, m = fmaxf(m, fabsf(a));
  }
  if (t4 == 0 && r0 + g + 8 < inter) {
    const float a = situ_f(gb, ub, b1, b2);
    act_j[r0 + g + 8] = a, m = fmaxf(m, fabsf(a));
  }
  return m;
}

/// One warp's down rows r0 + g, r0 + g + 8 against the staged act (σ = sigma): ys_j[r] = (W2 ·
/// act)[r] in f32 (lanes t4 = 0 write). mx_down_kernel and mx_experts_kernel's down tiles.
template <bool kVec, int kAhead, int kStages>
__device__ __forceinline__ void mx_down_rows(const ExpertPtrs& e, int io, int inter, int r0, const uint2* xst, int sigma,
                                             float* ys_j, MxStage* ring) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  float a = 0.f, b = 0.f;
  gemv_mx_any<kVec, kAhead, kStages>(e.p2, e.s2, io, inter, r0, xst, xst + inter / 8, a, b, ring);
  const float back = ldexpf(1.f, 6 - sigma);
  a = quad_sum(a) * back, b = quad_sum(b) * back;
  if (t4 == 0 && r0 + g < io) ys_j[r0 + g] = a;
  if (t4 == 0 && r0 + g + 8 < io) ys_j[r0 + g + 8] = b;
}

/// mx_down_rows for the 8 rows r0 + g of a warp (gemv_mx_half): the same bits a row.
__device__ __forceinline__ void mx_down_rows8(const ExpertPtrs& e, int io, int inter, int r0, const uint2* xst,
                                              int sigma, float* ys_j) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  float a = 0.f;
  gemv_mx_half<2 * kU>(e.p2, e.s2, io, inter, r0, xst, xst + inter / 8, a);
  a = quad_sum(a) * ldexpf(1.f, 6 - sigma);
  if (t4 == 0 && r0 + g < io) ys_j[r0 + g] = a;
}

/// Gate/up: act[j, r] = SiTU(W1[e]·z, W3[e]·z)[r] in f32 for the 16 rows of each warp (e = ids[j]).
/// kMin: blocks an SM the registers are budgeted for; kVec, kAhead: gemv_mx's; kStages: the warps'
/// cp.async rings (gemv_mx_ring; 0 = none), after the token in dynamic shared memory (MxForm).
template <int kMin, bool kVec, int kAhead, int kStages>
__global__ void __launch_bounds__(kThreads, kMin) mx_gate_up_kernel(const ExpertPtrs* __restrict__ table,
                                                              const int* __restrict__ ids, const float* __restrict__ z,
                                                              int io, int inter, float b1, float b2,
                                                              float* __restrict__ act,
                                                              unsigned long long* __restrict__ traffic,
                                                              unsigned long long ebytes, int pf) {
  extern __shared__ __align__(16) uint2 xst[];  // hi [io / 8], lo [io / 8]
  __shared__ float red[kWarps];
  const int j = int(blockIdx.y);
  pdl_wait();  // ids come from the router kernel just before
  pdl_trigger();
  if (traffic && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(traffic, 1ull), atomicAdd(traffic + 1, ebytes);
  const ExpertPtrs e = table[ids[j]];
  const int r0 = (int(blockIdx.x) * kWarps + int(threadIdx.x) / kWarp) * kRows;
  prefetch_mx_head(e.p1, e.s1, inter, io, r0, pf);  // in flight while the token is staged
  prefetch_mx_head(e.p3, e.s3, inter, io, r0, pf);
  const int sigma = stage_token(z, io, xst, xst + io / 8, red);
  if (r0 >= inter) return;
  MxStage* ring = reinterpret_cast<MxStage*>(reinterpret_cast<char*>(xst) + ring_offset(io)) +
                  (int(threadIdx.x) / kWarp) * (kStages > 0 ? kStages : 1);
  mx_gate_up_rows<kVec, kAhead, kStages>(e, io, inter, r0, xst, sigma, b1, b2, act + size_t(j) * inter, ring);
}

/// Down: ys[j, r] = (W2[e] · act[j])[r] for the 16 rows of each warp (template as mx_gate_up_kernel).
template <int kMin, bool kVec, int kAhead, int kStages>
__global__ void __launch_bounds__(kThreads, kMin) mx_down_kernel(const ExpertPtrs* __restrict__ table,
                                                           const int* __restrict__ ids, const float* __restrict__ act,
                                                           int io, int inter, float* __restrict__ ys, int pf) {
  extern __shared__ __align__(16) uint2 xst[];  // hi [inter / 8], lo [inter / 8]
  __shared__ float red[kWarps];
  const int j = int(blockIdx.y);
  // ids were written before the gate/up kernel passed its pdl_wait, so before this kernel could
  // start: the expert is known now, its act only after the wait.
  const ExpertPtrs e = table[ids[j]];
  const int r0 = (int(blockIdx.x) * kWarps + int(threadIdx.x) / kWarp) * kRows;
  prefetch_mx_head(e.p2, e.s2, io, inter, r0, pf);
  pdl_wait();
  pdl_trigger();
  const int sigma = stage_token(act + size_t(j) * inter, inter, xst, xst + inter / 8, red);
  if (r0 >= io) return;
  MxStage* ring = reinterpret_cast<MxStage*>(reinterpret_cast<char*>(xst) + ring_offset(inter)) +
                  (int(threadIdx.x) / kWarp) * (kStages > 0 ? kStages : 1);
  mx_down_rows<kVec, kAhead, kStages>(e, io, inter, r0, xst, sigma, ys + size_t(j) * io, ring);
}

/// A 32-bit load with acquire semantics at GPU scope (pairs with a writer's __threadfence and atomic).
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The work queue of the persistent decode-experts launches (mx_experts_kernel, dense_experts_kernel):
// queue[0] the next unit, queue[1] the blocks finished, then a kernel's own counters, all zero
// between launches. Each helper is whole-block unless it says otherwise.

/// The next unit for the block, taken by thread 0 from queue[0]. The barrier before it also ends
/// the previous unit's use of shared memory.
__device__ __forceinline__ unsigned take_unit(unsigned* queue) {
  __shared__ unsigned unit_s;
  __syncthreads();
  if (threadIdx.x == 0) unit_s = atomicAdd(queue, 1u);
  __syncthreads();
  return unit_s;
}

/// A gate/up unit of a slot is done: after the barrier that ends its writes, thread 0 counts it in
/// *done_j (a fence first, so a down unit that sees the count sees the writes).
__device__ __forceinline__ void unit_done(unsigned* done_j) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(done_j, 1u);
  }
}

/// Waits until *done_j reaches n (thread 0 spinning on an acquire load, then a barrier).
__device__ __forceinline__ void wait_done(const unsigned* done_j, unsigned n) {
  if (threadIdx.x == 0)
    while (load_acquire(done_j) < n) __nanosleep(128);
  __syncthreads();
}

/// A down unit of a row block is done: after the barrier that ends its ys writes it arrives in
/// *summed_b, and the unit whose arrival is the `arrivals`-th writes out[r] = Σ_j w[j] · ys[j, r]
/// for r in [r0, r0 + n) ∩ [0, io) (n <= blockDim.x) in slot order: slot_sum_kernel's sums.
__device__ __forceinline__ void arrive_and_sum(unsigned* summed_b, unsigned arrivals, const float* w, const float* ys,
                                               int k, int io, int r0, int n, float* out) {
  __shared__ unsigned last_s;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last_s = atomicAdd(summed_b, 1u) == arrivals - 1;
    __threadfence();  // the other units' ys, seen through the counter, before the barrier
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  const int r = r0 + int(threadIdx.x);
  if (int(threadIdx.x) < n && r < io) {
    float acc = 0.f;
    for (int s2 = 0; s2 < k; ++s2) acc += __ldcg(w + s2) * __ldcg(ys + size_t(s2) * io + r);
    out[r] = acc;
  }
}

/// At a block's end (after its last unit): the last block to finish puts queue[0 .. n) back to zero
/// for the next launch, so no block may leave its loop early.
__device__ __forceinline__ void finish_queue(unsigned* queue, unsigned n) {
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(queue + 1, 1u) == gridDim.x - 1) {
    __threadfence();
    queue[0] = 0, queue[1] = 0;
    for (unsigned i = 2; i < n; ++i) queue[i] = 0;
  }
}

/// Both products of one decode token in one persistent launch (docs/gpu-method.md "MXFP4 experts
/// of one decode token"): units of work are the 128-row tiles of the gate/up kernel, slot after
/// slot, then those of the down kernel; a block takes the next unit from queue[0] until none is
/// left, so no wave ends half full and down tiles of the first slots run while the last slots'
/// gate/up tiles finish. The down tiles of the last `split` slots come as two units of 64 rows each
/// (8 rows a warp, gemv_mx_half: the same bits a row), so the launch's last units are half as long
/// and its blocks run out of work closer together. A down unit of slot j starts once queue[2 + j]
/// (gate/up tiles of slot j done) reaches ceil(inter / 128): those tiles were all taken before it
/// by running blocks, which wait on nothing, so the wait ends. Each warp does gemv_mx_any (or
/// gemv_mx_half) over whole rows as in the two kernels: the same bits. The token z is staged once a
/// block, before every down unit (which stages act over it); act[j]'s σ comes from the max|act|
/// its gate/up tiles leave in queue[2 + k + j] (f32 bits; the same max stage_token would find).
/// queue: [2 + 2k + ceil(io / 128)] unsigned (next unit, blocks finished, gate/up tiles done a
/// slot, max|act| a slot, down units done a 128-row tile), zero between launches: the last block to
/// finish puts them back, so no path may leave the loop early. out must not alias z (a block that
/// starts late stages z after others may have written out). kHalves: the half units are compiled
/// in (without them, `split` must be 0 and the kernel is runs 44-45's).
template <int kMin, bool kVec, int kAhead, int kStages, bool kHalves>
__global__ void __launch_bounds__(kThreads, kMin) mx_experts_kernel(const ExpertPtrs* __restrict__ table,
                                                              const int* __restrict__ ids, const float* __restrict__ z,
                                                              int k, int io, int inter, float b1, float b2,
                                                              float* __restrict__ act, float* __restrict__ ys,
                                                              const float* __restrict__ w, float* __restrict__ out,
                                                              unsigned* __restrict__ queue,
                                                              unsigned long long* __restrict__ traffic,
                                                              unsigned long long ebytes, int pf, int split) {
  extern __shared__ __align__(16) uint2 xst[];  // the token (hi [n / 8], lo [n / 8]), then the rings
  __shared__ float red[kWarps];
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int per_block = kWarps * kRows;
  const unsigned tiles_gu = unsigned((inter + per_block - 1) / per_block), tiles_dn = unsigned((io + per_block - 1) / per_block);
  split = kHalves ? min(max(split, 0), k) : 0;  // (the host passes 0 .. k)
  const unsigned units_gu = tiles_gu * unsigned(k), whole_dn = tiles_dn * unsigned(k - split);
  const unsigned units = units_gu + whole_dn + 2 * tiles_dn * unsigned(split), arrivals = unsigned(k + split);
  MxStage* ring = reinterpret_cast<MxStage*>(reinterpret_cast<char*>(xst) + ring_offset(io > inter ? io : inter)) +
                  warp * (kStages > 0 ? kStages : 1);
  // z is not written by the router kernel just before this one, and the router triggers only after
  // its own wait, so every kernel that may write z has completed when this block starts
  // (moe_decode's contract): z may be read before the wait; ids may not.
  const int z_sigma = stage_token(z, io, xst, xst + io / 8, red);
  unsigned* done = queue + 2;                    // [k] gate/up tiles done a slot
  unsigned* amax = queue + 2 + k;                // [k] max|act[j]| (f32 bits)
  unsigned* summed = queue + 2 + 2 * k;          // [tiles_dn] down units done a tile
  pdl_wait();  // ids come from the router kernel just before
  pdl_trigger();
  for (;;) {
    const unsigned u = take_unit(queue);  // (every thread is done with the staged token of a down tile)
    if (u >= units) break;
    if (u < units_gu) {  // gate/up tile of slot j (every one is taken before any down unit: z is staged)
      const int j = int(u / tiles_gu), r0 = (int(u % tiles_gu) * kWarps + warp) * kRows;
      if (traffic && u % tiles_gu == 0 && threadIdx.x == 0) atomicAdd(traffic, 1ull), atomicAdd(traffic + 1, ebytes);
      const ExpertPtrs e = table[ids[j]];
      if (r0 < inter) {
        float m = mx_gate_up_rows<kVec, kAhead, kStages>(e, io, inter, r0, xst, z_sigma, b1, b2, act + size_t(j) * inter, ring);
        for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
        if (lane == 0 && m > 0.f) atomicMax(amax + j, __float_as_uint(m));  // m >= 0: ordered as bits
      }
      unit_done(done + j);  // the tile's act rows and max are written
    } else {  // down unit: a whole 128-row tile of slot j, or (the last `split` slots) half of one
      const unsigned v = u - units_gu;
      const bool half = kHalves && v >= whole_dn;
      const unsigned h = v - whole_dn;  // half units: (slot, tile, half) in that order
      const int j = half ? k - split + int(h / (2 * tiles_dn)) : int(v / tiles_dn);
      const unsigned tile = half ? h % (2 * tiles_dn) / 2 : v % tiles_dn;
      const int r0 = half ? int(tile) * per_block + int(h % 2) * (per_block / 2) + warp * (kRows / 2)
                          : (int(tile) * kWarps + warp) * kRows;
      const ExpertPtrs e = table[ids[j]];
      if (!half) prefetch_mx_head(e.p2, e.s2, io, inter, r0, pf);  // (16 rows a warp)
      wait_done(done + j, tiles_gu);  // act[j] and its max are complete
      const int sigma = token_sigma(__uint_as_float(__ldcg(amax + j)));
      stage_scaled(act + size_t(j) * inter, inter, sigma, xst, xst + inter / 8);
      if (r0 < io) {
        if constexpr (kHalves) {
          if (half) mx_down_rows8(e, io, inter, r0, xst, sigma, ys + size_t(j) * io);
        }
        if (!half) mx_down_rows<kVec, kAhead, kStages>(e, io, inter, r0, xst, sigma, ys + size_t(j) * io, ring);
      }
      arrive_and_sum(summed + tile, arrivals, w, ys, k, io, int(tile) * per_block, per_block, out);
    }
  }
  finish_queue(queue, 2 + 2 * unsigned(k) + tiles_dn);
}

// ---- dense experts: BF16 operands ----

/// The token's 32 BF16 values at columns col .. col + 31 (lanes g = 0), else zeros.
__device__ __forceinline__ void token_values(const uint32_t* pairs, bool mine, uint32_t (&x)[16]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v = mine ? reinterpret_cast<const uint4*>(pairs)[q] : make_uint4(0, 0, 0, 0);
    x[4 * q] = v.x, x[4 * q + 1] = v.y, x[4 * q + 2] = v.z, x[4 * q + 3] = v.w;
  }
}

/// The first `pf` lines of warp wi's share (gemv_bf16's column step wi) of each of its 16 rows of
/// a BF16 matrix (rows × cols), asked of L2; nothing when pf == 0 or the warp has no columns.
__device__ __forceinline__ void prefetch_bf16_head(const uint16_t* w, int rows, int cols, int r0, int pf, int wi) {
  const int c0 = wi * 2 * kCols;
  if (pf > 0 && c0 < cols)
    prefetch_rows(reinterpret_cast<const uint8_t*>(w), size_t(cols) * 2, rows, r0, size_t(c0) * 2, pf);
}

/// c += M[r0 + g, r0 + g + 8, cols of this warp] · x for this warp's 16 rows of a BF16 matrix
/// (rows × cols, cols % 32 == 0, 16-byte aligned), x the token's values as BF16 pairs: the 8 MMA
/// steps of a 128-column block per iteration. The columns come in steps of 256; warp wi of the wt
/// warps sharing the tile takes steps wi, wi + wt, … (wt = 1: all of them).
__device__ __forceinline__ void gemv_bf16(const uint16_t* __restrict__ w, int rows, int cols, int r0,
                                          const uint32_t* x_pairs, float (&c)[4], int wi, int wt) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  // Two 128-column blocks a step: both blocks' loads are issued before the first MMA (twice the
  // bytes in flight; the MMAs still run block after block: the same sums).
  for (int c0 = wi * 2 * kCols; c0 < cols; c0 += wt * 2 * kCols) {
    uint32_t lo[2][16], hi[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int col = c0 + u * kCols + 32 * t4;
      load_bf16(w, r0 + g, rows, col, cols, lo[u]);
      load_bf16(w, r0 + g + 8, rows, col, cols, hi[u]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int col = c0 + u * kCols + 32 * t4;
      if (c0 + u * kCols >= cols) break;
      uint32_t x[16];
      token_values(x_pairs + col / 2, g == 0 && col < cols, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned a[4] = {lo[u][2 * i], hi[u][2 * i], lo[u][2 * i + 1], hi[u][2 * i + 1]};
        mma_bf16(c, a, x[2 * i], x[2 * i + 1]);
      }
    }
  }
}

/// The (row g, row g + 8) sums of the wt warps sharing this warp's tile, added in warp order
/// through `red` (one slot a warp and lane); returns them in the tile's first warp (wi == 0),
/// lanes t4 = 0 (column 0 of the product), for N accumulators. wt == 1: the warp's own. Whole block
/// (a barrier when wt > 1).
template <int N>
using TileRed = float[kWarps][kWarp][2 * N];  ///< tile_sums' shared memory for N accumulators
template <int N>
__device__ __forceinline__ void tile_sums(TileRed<N>& red, float (&c)[N][4], int wt) {
  if (wt == 1) return;
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
#pragma unroll
  for (int n = 0; n < N; ++n) red[warp][lane][2 * n] = c[n][0], red[warp][lane][2 * n + 1] = c[n][2];
  __syncthreads();
  if (warp % wt != 0) return;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    float a = 0.f, b = 0.f;
    for (int v = 0; v < wt; ++v) a += red[warp + v][lane][2 * n], b += red[warp + v][lane][2 * n + 1];
    c[n][0] = a, c[n][2] = b;
  }
}

/// z [io] (f32) as BF16 pairs in zs [io / 2], read through L2 only (__ldcg). Whole block; no barrier.
__device__ __forceinline__ void stage_bf16(const float* z, int io, uint32_t* zs) {
  for (int i = int(threadIdx.x); i < io / 2; i += int(blockDim.x)) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(z) + i);
    const __nv_bfloat162 b = __floats2bfloat162_rn(v.x, v.y);
    zs[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
}

/// Gate/up of one tile of wt warps (this warp: index wi, rows r0 .. r0 + 15): act_j[r] = GLU(W1·z,
/// W3·z)[r] in BF16 (GLU: SiLU(g)·u when silu, else SiTU), z staged as BF16 pairs in zs; the
/// tile's warps' sums added in warp order (tile_sums). Whole block (every warp must call it).
__device__ __forceinline__ void dense_gate_up_rows(const DenseExpertPtrs& e, int io, int inter, int r0, int wi, int wt,
                                                   const uint32_t* zs, float b1, float b2, int silu,
                                                   __nv_bfloat16* act_j, TileRed<2>& red) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // gate, up
  if (r0 < inter) {  // a whole tile or none (inter % 32 == 0); every warp reaches tile_sums' barrier
    gemv_bf16(e.w1, inter, io, r0, zs, c[0], wi, wt);
    gemv_bf16(e.w3, inter, io, r0, zs, c[1], wi, wt);
  }
  tile_sums<2>(red, c, wt);
  if (wi != 0 || t4 != 0 || r0 >= inter) return;  // column 0 of the product: c0 (row g), c2 (row g + 8)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g + 8 * h;
    const float gv = c[0][2 * h], uv = c[1][2 * h];
    act_j[r] = __float2bfloat16_rn(silu ? gv / (1.f + __expf(-gv)) * uv : situ_f(gv, uv, b1, b2));
  }
}

/// Down of one tile of wt warps (as dense_gate_up_rows): ys_j[r] = (W2 · act)[r] in f32, act as
/// BF16 pairs. Whole block.
__device__ __forceinline__ void dense_down_rows(const DenseExpertPtrs& e, int io, int inter, int r0, int wi, int wt,
                                                const uint32_t* act_pairs, float* ys_j, TileRed<1>& red) {
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  float c[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  if (r0 < io) gemv_bf16(e.w2, io, inter, r0, act_pairs, c[0], wi, wt);
  tile_sums<1>(red, c, wt);
  if (wi != 0 || t4 != 0 || r0 >= io) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) ys_j[r0 + g + 8 * h] = c[0][2 * h];
}

/// Gate/up: act[j, r] = GLU(W1[e]·z, W3[e]·z)[r] (BF16) for the 16 rows of each tile; a block is
/// 8 / wt tiles of wt warps each (gemv_bf16's column steps split over the tile's warps, their sums
/// added in warp order).
__global__ void __launch_bounds__(kThreads, 2) dense_gate_up_kernel(
    const DenseExpertPtrs* __restrict__ table, const int* __restrict__ ids, const float* __restrict__ z, int io,
    int inter, float b1, float b2, int silu, __nv_bfloat16* __restrict__ act, unsigned long long* __restrict__ traffic,
    unsigned long long ebytes, int pf, int wt) {
  extern __shared__ __align__(16) uint32_t zs[];  // z as BF16 pairs [io / 2]
  __shared__ TileRed<2> red;
  const int j = int(blockIdx.y), warp = int(threadIdx.x) / kWarp;
  pdl_wait();  // ids come from the router kernel just before
  pdl_trigger();
  if (traffic && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(traffic, 1ull), atomicAdd(traffic + 1, ebytes);
  const DenseExpertPtrs e = table[ids[j]];
  const int r0 = (int(blockIdx.x) * (kWarps / wt) + warp / wt) * kRows, wi = warp % wt;
  prefetch_bf16_head(e.w1, inter, io, r0, pf, wi);  // in flight while the token is staged
  prefetch_bf16_head(e.w3, inter, io, r0, pf, wi);
  stage_bf16(z, io, zs);
  __syncthreads();
  dense_gate_up_rows(e, io, inter, r0, wi, wt, zs, b1, b2, silu, act + size_t(j) * inter, red);
}

/// Down: ys[j, r] = (W2[e] · act[j])[r] for the 16 rows of each tile, tiles as in the gate/up kernel.
__global__ void __launch_bounds__(kThreads, 2) dense_down_kernel(const DenseExpertPtrs* __restrict__ table,
                                                              const int* __restrict__ ids,
                                                              const __nv_bfloat16* __restrict__ act, int io, int inter,
                                                              float* __restrict__ ys, int pf, int wt) {
  __shared__ TileRed<1> red;
  const int j = int(blockIdx.y), warp = int(threadIdx.x) / kWarp;
  const DenseExpertPtrs e = table[ids[j]];  // known before the wait, as in mx_down_kernel
  const int r0 = (int(blockIdx.x) * (kWarps / wt) + warp / wt) * kRows, wi = warp % wt;
  prefetch_bf16_head(e.w2, io, inter, r0, pf, wi);
  pdl_wait();
  pdl_trigger();
  dense_down_rows(e, io, inter, r0, wi, wt, reinterpret_cast<const uint32_t*>(act + size_t(j) * inter),
                  ys + size_t(j) * io, red);
}

/// The dense experts of one decode token in one persistent launch, as mx_experts_kernel: units are
/// the blocks of the gate/up kernel (8 / gu_wt tiles of 16 rows), slot after slot, then those of
/// the down kernel (8 / dn_wt tiles); a down unit of slot j waits until queue[2 + j] (gate/up units
/// of slot j done) reaches their number, stages act[j] (BF16, through L2) and runs the down
/// kernel's rows; the last down unit of a row block (queue[2 + k + b] arrivals) writes out = Σ_j
/// w[j] · ys[j] in slot order (slot_sum_kernel's sums). Each tile runs the two kernels' code with
/// the same warps a tile: the same bits. z is staged before the wait (moe_decode's contract; out
/// must not alias z). queue: [2 + k + down units a slot] unsigned, zero between launches.
__global__ void __launch_bounds__(kThreads, 2) dense_experts_kernel(
    const DenseExpertPtrs* __restrict__ table, const int* __restrict__ ids, const float* __restrict__ z, int k, int io,
    int inter, float b1, float b2, int silu, __nv_bfloat16* __restrict__ act, float* __restrict__ ys,
    const float* __restrict__ w, float* __restrict__ out, unsigned* __restrict__ queue,
    unsigned long long* __restrict__ traffic, unsigned long long ebytes, int pf, int gu_wt, int dn_wt) {
  extern __shared__ __align__(16) uint32_t zs[];  // z as BF16 pairs [io / 2], then act[j]'s [inter / 2]
  uint32_t* as = zs + io / 2;
  __shared__ TileRed<2> red;
  const int warp = int(threadIdx.x) / kWarp;
  const int gu_rows = kWarps / gu_wt * kRows, dn_rows = kWarps / dn_wt * kRows;
  const unsigned blocks_gu = unsigned((inter + gu_rows - 1) / gu_rows), blocks_dn = unsigned((io + dn_rows - 1) / dn_rows);
  const unsigned units_gu = blocks_gu * unsigned(k), units = units_gu + blocks_dn * unsigned(k);
  unsigned* done = queue + 2;        // [k] gate/up units done a slot
  unsigned* summed = queue + 2 + k;  // [blocks_dn] slots done a down block
  stage_bf16(z, io, zs);             // z may be read before the wait (moe_decode's contract); ids may not
  pdl_wait();
  pdl_trigger();
  for (;;) {
    const unsigned u = take_unit(queue);  // (every thread is done with red and the staged act)
    if (u >= units) break;
    if (u < units_gu) {  // gate/up block of slot j
      const int j = int(u / blocks_gu), bx = int(u % blocks_gu);
      if (traffic && bx == 0 && threadIdx.x == 0) atomicAdd(traffic, 1ull), atomicAdd(traffic + 1, ebytes);
      const DenseExpertPtrs e = table[ids[j]];
      const int r0 = (bx * (kWarps / gu_wt) + warp / gu_wt) * kRows;
      prefetch_bf16_head(e.w1, inter, io, r0, pf, warp % gu_wt);
      prefetch_bf16_head(e.w3, inter, io, r0, pf, warp % gu_wt);
      dense_gate_up_rows(e, io, inter, r0, warp % gu_wt, gu_wt, zs, b1, b2, silu, act + size_t(j) * inter, red);
      unit_done(done + j);  // the block's act rows are written
    } else {  // down block of slot j
      const unsigned v = u - units_gu, bx = v % blocks_dn;
      const int j = int(v / blocks_dn), r0 = (int(bx) * (kWarps / dn_wt) + warp / dn_wt) * kRows;
      const DenseExpertPtrs e = table[ids[j]];
      prefetch_bf16_head(e.w2, io, inter, r0, pf, warp % dn_wt);
      wait_done(done + j, blocks_gu);  // act[j] is complete
      const unsigned* aj = reinterpret_cast<const unsigned*>(act + size_t(j) * inter);
      for (int i = int(threadIdx.x); i < inter / 2; i += kThreads) as[i] = __ldcg(aj + i);
      __syncthreads();
      dense_down_rows(e, io, inter, r0, warp % dn_wt, dn_wt, as, ys + size_t(j) * io,
                      *reinterpret_cast<TileRed<1>*>(&red));
      arrive_and_sum(summed + bx, unsigned(k), w, ys, k, io, int(bx) * dn_rows, dn_rows, out);
    }
  }
  finish_queue(queue, 2 + unsigned(k) + blocks_dn);
}

/// Warps a 16-row tile of the dense decode experts (1, 2, 4 or 8) for a kernel over `rows` rows
/// and `cols` columns of k experts: `hook` when set (set_dense_expert_warps), else the fewest that
/// give at least a block an SM, each warp at least one 256-column step.
int dense_warps(const CudaBackend::Impl& m, int hook, int rows, int cols, int k) {
  if (hook > 0) return hook;
  const int tiles = (rows + kRows - 1) / kRows, steps = (cols + 2 * kCols - 1) / (2 * kCols);
  int wt = 1;
  while (wt < kWarps && 2 * wt <= steps && (long long)(tiles * wt + kWarps - 1) / kWarps * k < m.sm_count) wt *= 2;
  return wt;
}

/// Opts `kernel` in to `bytes` of dynamic shared memory when past the default 48 KiB (once per
/// kernel and size: `opted`, the backend's, keeps the largest set so far; the attribute belongs to
/// the device's context, so a second backend on it asks once more, harmlessly).
template <class K>
void opt_in_smem(K kernel, size_t bytes, size_t& opted, const char* what) {
  if (bytes <= 48 * 1024 || bytes <= opted) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), what);
  opted = bytes;
}

/// Blocks of a persistent decode-experts launch: one full wave of `kernel` at `smem` bytes of
/// dynamic shared memory (blocks an SM from the registers and shared memory, asked once per form
/// and size and kept in `occ`: every MoE layer of a model asks the same, and a step is recorded
/// with one call a layer), at most `units`, at least 1.
template <class K>
int persistent_blocks(const CudaBackend::Impl& m, CudaBackend::Impl::Occupancy& occ, K kernel, int form, size_t smem,
                      int units, const char* what) {
  if (occ.form != form || occ.smem != smem) {
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem), what);
    occ = {form, smem, per_sm};
  }
  return std::max(1, std::min(units, std::max(occ.blocks, 1) * std::max(m.sm_count, 1)));
}

/// The instances of the MXFP4 decode kernels set_mx_decode_form picks (a benchmark/test hook; 0 =
/// the default): {blocks an SM the registers are budgeted for, 16-byte scale loads, L2 asks kAhead
/// steps on, cp.async ring stages a warp (0 = none)}, and for the persistent launch the slots whose
/// down tiles come as half units. Every form gives the same bits (the sums are the same; only
/// loads, occupancy, unit sizes and launches differ).
/// - m0, the default (run 46): gate/up, down and the weighted sum in one persistent launch
///   (mx_experts_kernel, `experts`; gate_up and down null), gemv_mx's loads, registers for 2
///   blocks an SM, the last slot's down tiles as half units (run 46, H100, K3 size: 128.6 µs
///   against 131.9 for whole tiles, profiled 126.5 against 131.0). m17: the same with whole
///   down tiles only (runs 44-45's default); m16 / m18: the last 2 / 4 slots' down tiles in
///   halves (m16 128.3 µs, m18 132.3 in run 46). m13 / m14: rings of 2 / 3 stages (2 blocks);
///   m15: 3 blocks an SM.
/// - m1-m12: a gate/up and a down launch, then launch_slot_sum. m12 is runs 28-43's default
///   (registers for 1 block, 2 fit: 108-112 registers). m10: rings of 3 stages, 2 blocks an SM;
///   m11: 2 stages, registers for 3 blocks an SM (run 42's ncu: m12 waits on its loads with 16
///   warps an SM; a ring keeps bytes in flight outside the registers). On an H100 (228 KB of shared
///   memory an SM, 1 KB of it reserved a block) m11's down kernel at K3 size gets 3 blocks, its
///   gate/up (token 7 KB) 96 bytes too few for a third.
/// A shape whose token and rings do not fit the shared memory runs form 0 (no ring).
struct MxForm {
  void (*gate_up)(const ExpertPtrs*, const int*, const float*, int, int, float, float, float*, unsigned long long*,
                  unsigned long long, int);
  void (*down)(const ExpertPtrs*, const int*, const float*, int, int, float*, int);
  int stages;
  void (*experts)(const ExpertPtrs*, const int*, const float*, int, int, int, float, float, float*, float*,
                  const float*, float*, unsigned*, unsigned long long*, unsigned long long, int, int);
  int split = 0;  ///< experts: slots (the last ones) whose down tiles come as two half units
};
#define WREN_MX_FORM(kMin, kVec, kAhead, kStages) \
  {mx_gate_up_kernel<kMin, kVec, kAhead, kStages>, mx_down_kernel<kMin, kVec, kAhead, kStages>, kStages, nullptr}
#define WREN_MX_ONE(kMin, kVec, kAhead, kStages, split) \
  {nullptr, nullptr, kStages, mx_experts_kernel<kMin, kVec, kAhead, kStages, (split > 0)>, split}
constexpr MxForm kMxForms[] = {WREN_MX_ONE(2, false, 0, 0, 1),  WREN_MX_FORM(2, true, 0, 0),    WREN_MX_FORM(2, true, 1, 0),
                               WREN_MX_FORM(2, true, 2, 0),     WREN_MX_FORM(4, true, 0, 0),    WREN_MX_FORM(4, true, 1, 0),
                               WREN_MX_FORM(3, true, 0, 0),     WREN_MX_FORM(3, true, 1, 0),    WREN_MX_FORM(3, true, 2, 0),
                               WREN_MX_FORM(3, false, 0, 0),    WREN_MX_FORM(2, false, 0, 3),   WREN_MX_FORM(3, false, 0, 2),
                               WREN_MX_FORM(1, false, 0, 0),    WREN_MX_ONE(2, false, 0, 2, 0), WREN_MX_ONE(2, false, 0, 3, 0),
                               WREN_MX_ONE(3, false, 0, 0, 0),  WREN_MX_ONE(2, false, 0, 0, 2), WREN_MX_ONE(2, false, 0, 0, 0),
                               WREN_MX_ONE(2, false, 0, 0, 4)};
#undef WREN_MX_FORM
#undef WREN_MX_ONE
constexpr int kNumMxForms = int(sizeof(kMxForms) / sizeof(kMxForms[0]));
static_assert(kNumMxForms <= CudaBackend::Impl::kMaxMxForms, "Impl::mx_opted has a row for each form");

}  // namespace

bool moe_decode_ok(const CudaBackend::Impl& m, int T, int io, int inter, const float* z, bool mx) {
  // Shared memory: MXFP4 stages the token as 2 bytes a value (hi, lo), dense as BF16 (2 bytes);
  // static: MXFP4 a float a warp, dense gate/up tile_sums' TileRed<2> (4 KiB).
  const size_t fixed = mx ? 64 : sizeof(TileRed<2>) + 64;
  return m.opts.precision == GpuPrecision::Fast && T == 1 && io > 0 && inter > 0 && io % 32 == 0 && inter % 32 == 0 &&
         reinterpret_cast<uintptr_t>(z) % (mx ? 16 : 8) == 0 &&
         size_t(std::max(io, mx ? inter : 0)) * 2 + fixed <= size_t(m.max_smem_optin);
}

void moe_decode(CudaBackend::Impl& m, const ExpertPtrs* table, const int* ids, const float* w, const float* z, int k,
                int io, int inter, float b1, float b2, float* ys, float* out) {
  // The backend's own act scratch (not the fast-mode LtState's: a decode step may be recorded into
  // a graph before anything has created that state, and creating it there would allocate).
  auto* act = static_cast<float*>(m.scratch(m.act, size_t(k) * inter * sizeof(float)));
  // A form with rings needs the token and 8 warps' rings in shared memory; where they do not fit,
  // form 0 runs (the same bits).
  // (io, inter % 32 == 0: ring_offset is the token's bytes exactly, so form 0 asks what it did.)
  auto rings_of = [](int form) { return size_t(kWarps) * kMxForms[form].stages * sizeof(MxStage); };
  const bool fits = ring_offset(std::max(io, inter)) + rings_of(m.mx_form) + 64 <= size_t(m.max_smem_optin);
  const int form = fits ? m.mx_form : 0;
  const MxForm& f = kMxForms[form];
  const unsigned long long ebytes = device_expert_bytes(true, io, inter);
  const int per_block = kWarps * kRows;
  if (f.experts) {
    const size_t smem = ring_offset(std::max(io, inter)) + rings_of(form);
    opt_in_smem(f.experts, smem, m.mx_opted[form][0], "cudaFuncSetAttribute (mxfp4 decode experts)");
    const int split = std::min(f.split, k), tiles_dn = (io + per_block - 1) / per_block;
    const int units = ((inter + per_block - 1) / per_block + tiles_dn) * k + tiles_dn * split;  // half units: 2 a tile
    auto* queue = static_cast<unsigned*>(m.counter_scratch(m.mx_queue, size_t(2 + 2 * k + tiles_dn) * sizeof(unsigned),
                                                           "cudaMemsetAsync (mxfp4 decode queue)"));
    const int blocks = persistent_blocks(m, m.mx_occupancy, f.experts, form, smem, units,
                                         "cudaOccupancyMaxActiveBlocksPerMultiprocessor (mxfp4 decode experts)");
    const char* what = "routed_moe (fast) mxfp4 decode experts kernel";
    launch_ex(m, f.experts, dim3(unsigned(blocks)), dim3(kThreads), smem, 0, m.stream_pdl, what, table, ids, z, k, io,
              inter, b1, b2, act, ys, w, out, queue, m.traffic_counters(), ebytes, m.stream_prefetch,
              split);
    m.launched(what);
    return;
  }
  const size_t gu_smem = ring_offset(io) + rings_of(form), dn_smem = ring_offset(inter) + rings_of(form);
  opt_in_smem(f.gate_up, gu_smem, m.mx_opted[form][0], "cudaFuncSetAttribute (mxfp4 decode gate/up)");
  opt_in_smem(f.down, dn_smem, m.mx_opted[form][1], "cudaFuncSetAttribute (mxfp4 decode down)");
  const char* gu = "routed_moe (fast) mxfp4 decode gate/up kernel";
  launch_ex(m, f.gate_up, dim3(unsigned((inter + per_block - 1) / per_block), unsigned(k)), dim3(kThreads),
            gu_smem, 0, m.stream_pdl, gu, table, ids, z, io, inter, b1, b2, act, m.traffic_counters(), ebytes,
            m.stream_prefetch);
  m.launched(gu);
  const char* dn = "routed_moe (fast) mxfp4 decode down kernel";
  launch_ex(m, f.down, dim3(unsigned((io + per_block - 1) / per_block), unsigned(k)), dim3(kThreads), dn_smem,
            0, m.stream_pdl, dn, table, ids, static_cast<const float*>(act), io, inter, ys, m.stream_prefetch);
  m.launched(dn);
  launch_slot_sum(m, ys, w, k, io, 1, out);
}

void moe_decode_dense(CudaBackend::Impl& m, const DenseExpertPtrs* table, const int* ids, const float* w, const float* z,
                      int k, int io, int inter, float b1, float b2, bool silu, float* ys, float* out) {
  auto* act = static_cast<__nv_bfloat16*>(m.scratch(m.act, size_t(k) * inter * sizeof(__nv_bfloat16)));
  const unsigned long long ebytes = device_expert_bytes(false, io, inter);
  const int gu_wt = dense_warps(m, m.dense_gu_wt, inter, io, k), dn_wt = dense_warps(m, m.dense_dn_wt, io, inter, k);
  const int gu_rows = kWarps / gu_wt * kRows, dn_rows = kWarps / dn_wt * kRows;  // rows a block
  const int gu_blocks = (inter + gu_rows - 1) / gu_rows, dn_blocks = (io + dn_rows - 1) / dn_rows;
  const size_t both = size_t(io + inter) * 2;  // z and act[j] as BF16
  if (m.dense_form == 1 && both + sizeof(TileRed<2>) + 64 <= size_t(m.max_smem_optin)) {
    opt_in_smem(dense_experts_kernel, both, m.dense_opted.experts, "cudaFuncSetAttribute (dense decode experts)");
    const int blocks = persistent_blocks(m, m.dense_occupancy, dense_experts_kernel, 0, both, (gu_blocks + dn_blocks) * k,
                                         "cudaOccupancyMaxActiveBlocksPerMultiprocessor (dense decode experts)");
    auto* queue = static_cast<unsigned*>(m.counter_scratch(m.dense_queue, size_t(2 + k + dn_blocks) * sizeof(unsigned),
                                                           "cudaMemsetAsync (dense decode queue)"));
    const char* what = "routed_moe (fast) dense decode experts kernel";
    launch_ex(m, dense_experts_kernel, dim3(unsigned(blocks)), dim3(kThreads), both, 0, m.stream_pdl, what, table, ids,
              z, k, io, inter, b1, b2, silu ? 1 : 0, act, ys, w, out, queue, m.traffic_counters(), ebytes,
              m.stream_prefetch, gu_wt, dn_wt);
    m.launched(what);
    return;
  }
  const size_t zs_bytes = size_t(io) * 2;  // z as BF16
  opt_in_smem(dense_gate_up_kernel, zs_bytes, m.dense_opted.gate_up, "cudaFuncSetAttribute (dense decode gate/up)");
  const char* gu = "routed_moe (fast) dense decode gate/up kernel";
  launch_ex(m, dense_gate_up_kernel, dim3(unsigned(gu_blocks), unsigned(k)), dim3(kThreads), zs_bytes, 0, m.stream_pdl,
            gu, table, ids, z, io, inter, b1, b2, silu ? 1 : 0, act, m.traffic_counters(), ebytes, m.stream_prefetch,
            gu_wt);
  m.launched(gu);
  const char* dn = "routed_moe (fast) dense decode down kernel";
  launch_ex(m, dense_down_kernel, dim3(unsigned(dn_blocks), unsigned(k)), dim3(kThreads), 0, 0, m.stream_pdl, dn,
            table, ids, static_cast<const __nv_bfloat16*>(act), io, inter, ys, m.stream_prefetch, dn_wt);
  m.launched(dn);
  launch_slot_sum(m, ys, w, k, io, 1, out);
}

}  // namespace wren::cuda

namespace wren {

void CudaBackend::set_mx_decode_form(int form) {
  check(form >= 0 && form < cuda::kNumMxForms,
        "CUDA backend: set_mx_decode_form: expected a form 0.." + std::to_string(cuda::kNumMxForms - 1));
  impl_->mx_form = form;
}

int CudaBackend::mx_decode_forms() { return cuda::kNumMxForms; }

int CudaBackend::dense_decode_forms() { return 2; }

void CudaBackend::set_dense_decode_form(int form) {
  check(form >= 0 && form < dense_decode_forms(), "CUDA backend: set_dense_decode_form: expected 0 (the default: two "
                                                   "launches and the weighted-sum kernel) or 1 (one persistent launch)");
  impl_->dense_form = form;
}

void CudaBackend::set_dense_expert_warps(int gate_up, int down) {
  check(cuda::warps_a_tile_ok(gate_up) && cuda::warps_a_tile_ok(down),
        "CUDA backend: set_dense_expert_warps: expected 0 (the default rule), 1, 2, 4 or 8 warps a tile for each kernel");
  impl_->dense_gu_wt = gate_up;
  impl_->dense_dn_wt = down;
}

}  // namespace wren
