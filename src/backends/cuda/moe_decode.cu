// CUDA backend, fast precision mode: the routed MXFP4 experts of one decode token on tensor cores.
//
// A decode token reads k whole experts (K3: 16 × 17.55 MB) and does 2 FLOPs per weight: the work is
// the weight stream, so the kernels are built to keep DRAM busy and every SM's issue slots light.
// The exact-order kernels (moe.cu: one warp per row, lane 0 adding 112 group terms in order) reach
// under a quarter of the copy bandwidth; here a matrix-vector product is an mma.sync m16n8k16 with
// the weights as the 16-row A operand and the token as column 0 of the 8-column B operand (the
// tensor core's spare columns cost nothing in a bandwidth-bound kernel):
//
// - one warp = 16 rows (gate/up: the same 16 rows of W1, then of W3, so the GLU is done in
//   registers); lane (g, t4) = (lane / 4, lane % 4) loads, per 128-column block C, the 16 code
//   bytes (one 32-value group) and the scale of columns C + 32·t4 .. +31 of rows g and g + 8, two
//   column blocks' loads issued together;
// - a code byte (two e2m1 values) becomes a BF16 pair through a table in shared memory, 256 entries
//   × 32 copies (lane l reads copy l: one bank per lane, no conflicts), then one bf16x2 multiply by
//   the group's scale 2^(s−127) (exact for scales 2 .. 252; other scales take mxfp4_decode.cuh's
//   path through f32). Measured on the H200 (run 27), the table took the routed experts of a K3
//   token from 227 µs (byte permutes, ~3.5 instructions a value) to 170 µs;
// - the sum over columns may run in any order, so the k index of the MMA is a permutation of the
//   columns: MMA step i (0..7) takes, from lane (g, t4), columns C + 32·t4 + 4i .. 4i + 3 as its
//   k slots 2·t4, 2·t4 + 1, 2·t4 + 8, 2·t4 + 9 for A (rows g, g + 8) and for B (the token's values,
//   BF16, in lanes g = 0; lanes g > 0 give the unused columns zeros). One 16-byte load of each row
//   feeds 8 MMAs; no shuffles;
// - the f32 accumulator's column 0 (lanes t4 = 0: rows g and g + 8) is the product.
// Gate/up: grid (ceil(inter / 128), k): 8 warps of 16 rows; act[j] = SiTU(g, u) as BF16 (the down
// product's B operand). Down: grid (ceil(io / 128), k); ys[j] in f32. 80 registers: 3 blocks (24
// warps) an SM, so K3's 16 × 192 gate/up warps run as one wave. Numerics: BF16 inputs (z and act
// rounded once), exact BF16 weights, f32 accumulation in the tensor core's order, the fast mode's
// class (docs/gpu-method.md#modes); each (slot, row) is one fixed loop, so a token's result does not
// depend on its slot order or on the other slots.
#include "backends/cuda/moe_decode.cuh"

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/mxfp4_decode.cuh"

namespace wren::cuda {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * kWarp, kRows = 16, kCols = 128;

/// One lane's group of one row: its 16 code bytes and scale byte (zeros, scale 2^0, where the group
/// lies past the row (col ≥ cols) or the row past the matrix: they decode to zeros).
struct Group {
  uint4 raw;
  uint32_t sb;
};
__device__ __forceinline__ Group fetch(const uint8_t* packed, const uint8_t* scale, int row, int rows, int col,
                                       int cols) {
  if (row >= rows || col >= cols) return {make_uint4(0, 0, 0, 0), 127u};
  return {__ldg(reinterpret_cast<const uint4*>(packed + size_t(row) * (cols / 2) + col / 2)),
          uint32_t(__ldg(scale + size_t(row) * (cols / 32) + col / 32))};
}
/// The group's 32 values as 16 BF16 pairs (columns 2i, 2i + 1 in pair i), by mxfp4_decode.cuh's
/// byte permutes (decode_lut's path for scales outside 2 .. 252).
__device__ __forceinline__ void decode(const Group& gr, uint32_t (&r)[16]) {
  uint4 o[4];
  decode16(gr.raw, gr.sb, o);
#pragma unroll
  for (int i = 0; i < 4; ++i) r[4 * i] = o[i].x, r[4 * i + 1] = o[i].y, r[4 * i + 2] = o[i].z, r[4 * i + 3] = o[i].w;
}
/// 256 entries (one per code byte: bf16x2 (e2m1(low nibble), e2m1(high nibble)), unscaled) × 32
/// copies, entry b of copy l at word 32·b + l: lane l reads only its copy, one bank, no conflicts.
constexpr int kLutWords = 256 * 32;
__device__ __forceinline__ void fill_lut(uint32_t* lut) {
  for (int i = int(threadIdx.x); i < kLutWords; i += int(blockDim.x)) {
    const int b = i / 32;
    const __nv_bfloat162 v = __floats2bfloat162_rn(mxfp4::e2m1_value(uint8_t(b & 15)), mxfp4::e2m1_value(uint8_t(b >> 4)));
    lut[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}
/// decode through the table: per code byte one shared load and one bf16x2 multiply by the scale.
__device__ __forceinline__ void decode_lut(const Group& gr, const uint32_t* lut, uint32_t (&r)[16]) {
  if (gr.sb < 2 || gr.sb > 252) {
    decode(gr, r);
    return;
  }
  const unsigned char* base = reinterpret_cast<const unsigned char*>(lut);
  const uint32_t lane4 = (threadIdx.x % 32) * 4, sc = (gr.sb << 7) | (gr.sb << 23);
  const uint32_t w[4] = {gr.raw.x, gr.raw.y, gr.raw.z, gr.raw.w};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const uint32_t word = w[j / 4], k = j % 4;
    const uint32_t t = k == 0 ? word << 7 : word >> (8 * k - 7);
    const uint32_t v = *reinterpret_cast<const uint32_t*>(base + ((t & 0x7F80u) | lane4));
    const __nv_bfloat162 p = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                     *reinterpret_cast<const __nv_bfloat162*>(&sc));
    r[j] = *reinterpret_cast<const uint32_t*>(&p);
  }
}
/// The token's 32 BF16 values at columns col .. col + 31 (lanes g = 0), else zeros.
__device__ __forceinline__ void token_values(const uint32_t* pairs, bool mine, uint32_t (&x)[16]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v = mine ? reinterpret_cast<const uint4*>(pairs)[q] : make_uint4(0, 0, 0, 0);
    x[4 * q] = v.x, x[4 * q + 1] = v.y, x[4 * q + 2] = v.z, x[4 * q + 3] = v.w;
  }
}

/// c += M[rows r0 + g, r0 + g + 8] · x over one 128-column block: the 8 MMA steps of the file comment.
__device__ __forceinline__ void mma_block(float (&c)[4], const uint32_t (&lo)[16], const uint32_t (&hi)[16],
                                          const uint32_t (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const unsigned a[4] = {lo[2 * i], hi[2 * i], lo[2 * i + 1], hi[2 * i + 1]};
    mma_bf16(c, a, x[2 * i], x[2 * i + 1]);
  }
}

/// c += M[r0 + g, r0 + g + 8, :] · x for this warp's 16 rows of M (rows × cols MXFP4), x the token's
/// values as BF16 pairs: kU column blocks' loads issued together, then decoded and multiplied.
__device__ __forceinline__ void gemv_rows(const uint8_t* packed, const uint8_t* scale, int rows, int cols, int r0,
                                          const uint32_t* x_pairs, float (&c)[4], const uint32_t* lut) {
  constexpr int kU = 2;
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  for (int c0 = 0; c0 < cols; c0 += kU * kCols) {
    Group gr[kU][2];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int col = c0 + u * kCols + 32 * t4;
      gr[u][0] = fetch(packed, scale, r0 + g, rows, col, cols);
      gr[u][1] = fetch(packed, scale, r0 + g + 8, rows, col, cols);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int col = c0 + u * kCols + 32 * t4;
      uint32_t x[16], lo[16], hi[16];
      token_values(x_pairs + col / 2, g == 0 && col < cols, x);
      decode_lut(gr[u][0], lut, lo);
      decode_lut(gr[u][1], lut, hi);
      mma_block(c, lo, hi, x);
    }
  }
}

/// Gate/up: act[j, r] = SiTU(W1[e]·z, W3[e]·z)[r] for the 16 rows of each warp (e = ids[j]).
__global__ void __launch_bounds__(kThreads, 3) decode_gate_up_kernel(const ExpertPtrs* __restrict__ table,
                                                                  const int* __restrict__ ids,
                                                                  const float* __restrict__ z, int io, int inter,
                                                                  float b1, float b2, __nv_bfloat16* __restrict__ act) {
  extern __shared__ __align__(16) uint32_t zs[];  // z as BF16 pairs [io / 2]
  __shared__ uint32_t lut[kLutWords];
  fill_lut(lut);
  const int j = int(blockIdx.y), lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  for (int i = int(threadIdx.x); i < io / 2; i += kThreads) {
    const float2 v = reinterpret_cast<const float2*>(z)[i];
    const __nv_bfloat162 b = __floats2bfloat162_rn(v.x, v.y);
    zs[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  __syncthreads();
  const ExpertPtrs e = table[ids[j]];
  const int r0 = (int(blockIdx.x) * kWarps + int(threadIdx.x) / kWarp) * kRows;
  if (r0 >= inter) return;
  float cg[4] = {0.f, 0.f, 0.f, 0.f}, cu[4] = {0.f, 0.f, 0.f, 0.f};
  gemv_rows(e.p1, e.s1, inter, io, r0, zs, cg, lut);
  gemv_rows(e.p3, e.s3, inter, io, r0, zs, cu, lut);
  if (t4 != 0) return;  // column 0 of the product: c0 (row g) and c2 (row g + 8) of lanes t4 = 0
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g + 8 * h;
    if (r < inter) act[size_t(j) * inter + r] = __float2bfloat16_rn(situ_f(cg[2 * h], cu[2 * h], b1, b2));
  }
}

/// Down: ys[j, r] = (W2[e] · act[j])[r] for the 16 rows of each warp.
__global__ void __launch_bounds__(kThreads, 3) decode_down_kernel(const ExpertPtrs* __restrict__ table,
                                                               const int* __restrict__ ids,
                                                               const __nv_bfloat16* __restrict__ act, int io, int inter,
                                                               float* __restrict__ ys) {
  const int j = int(blockIdx.y), lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  __shared__ uint32_t lut[kLutWords];
  fill_lut(lut);
  __syncthreads();
  const ExpertPtrs e = table[ids[j]];
  const int r0 = (int(blockIdx.x) * kWarps + int(threadIdx.x) / kWarp) * kRows;
  if (r0 >= io) return;
  const __nv_bfloat16* a = act + size_t(j) * inter;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  gemv_rows(e.p2, e.s2, io, inter, r0, reinterpret_cast<const uint32_t*>(a), c, lut);
  if (t4 != 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g + 8 * h;
    if (r < io) ys[size_t(j) * io + r] = c[2 * h];
  }
}

}  // namespace

bool moe_decode_ok(const CudaBackend::Impl& m, int T, int io, int inter, const float* z) {
  return m.opts.precision == GpuPrecision::Fast && T == 1 && io > 0 && inter > 0 && io % 32 == 0 && inter % 32 == 0 &&
         reinterpret_cast<uintptr_t>(z) % 8 == 0 && size_t(kLutWords) * 4 + size_t(io) * 2 <= size_t(m.max_smem_optin);
}

void moe_decode(CudaBackend::Impl& m, const ExpertPtrs* table, const int* ids, const float* z, int k, int io,
                int inter, float b1, float b2, float* ys) {
  // The backend's own act scratch (not the fast-mode LtState's: a decode step may be recorded into
  // a graph before anything has created that state, and creating it there would allocate).
  auto* act = static_cast<__nv_bfloat16*>(m.scratch(m.act, size_t(k) * inter * sizeof(__nv_bfloat16)));
  const size_t zs_bytes = size_t(io) * 2;  // z as BF16, next to the table's 32 KiB of static shared memory
  if (zs_bytes + size_t(kLutWords) * 4 > 48 * 1024) {
    static size_t opted = 0;  // the largest opt-in set so far (per process)
    if (zs_bytes > opted) {
      check_cuda(cudaFuncSetAttribute(decode_gate_up_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(zs_bytes)),
                 "cudaFuncSetAttribute (mxfp4 decode gate/up)");
      opted = zs_bytes;
    }
  }
  const int per_block = kWarps * kRows;
  decode_gate_up_kernel<<<dim3(unsigned((inter + per_block - 1) / per_block), unsigned(k)), kThreads, zs_bytes,
                          m.stream>>>(table, ids, z, io, inter, b1, b2, act);
  m.launched("routed_moe (fast) mxfp4 decode gate/up kernel");
  decode_down_kernel<<<dim3(unsigned((io + per_block - 1) / per_block), unsigned(k)), kThreads, 0, m.stream>>>(
      table, ids, act, io, inter, ys);
  m.launched("routed_moe (fast) mxfp4 decode down kernel");
}

}  // namespace wren::cuda
