// CUDA backend, fast precision mode: the routed experts of one decode token on tensor cores, MXFP4
// (K3) or BF16 (Kimi Linear's dense experts: the same kernels without the decode, 64 bytes a row
// per lane and column block).
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

#include "backends/cuda/lt_state.cuh"
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
__device__ __forceinline__ Group fetch_group(const uint8_t* packed, const uint8_t* scale, int row, int rows, int col,
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

/// The MXFP4 matrix of one expert (rows × cols; codes [rows, cols/2], scales [rows, cols/32]) as a
/// lane reads it: 16 code bytes + one scale per (row, 32-column group), decoded through the table.
struct MxRows {
  const uint8_t *packed, *scale;
  int rows, cols;
  const uint32_t* lut;
  static constexpr int kUnroll = 2;  // column blocks whose loads are issued together (run 27c)
  using Raw = Group;
  __device__ __forceinline__ Raw fetch(int row, int col) const { return fetch_group(packed, scale, row, rows, col, cols); }
  __device__ __forceinline__ void decode(const Raw& r, uint32_t (&v)[16]) const { decode_lut(r, lut, v); }
};
/// A BF16 matrix (rows × cols, row-major, 16-byte aligned rows) as a lane reads it: the 32 values
/// (64 bytes, four 16-byte loads) of a (row, 32-column group), already BF16 pairs: no decode.
struct Bf16Rows {
  const uint16_t* w;
  int rows, cols;
  static constexpr int kUnroll = 1;  // 64 bytes a row per lane already in flight
  struct Raw {
    uint4 q[4];
  };
  __device__ __forceinline__ Raw fetch(int row, int col) const {
    Raw r;
    const bool in = row < rows && col < cols;
    const uint4* src = reinterpret_cast<const uint4*>(w + size_t(in ? row : 0) * cols + (in ? col : 0));
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = in ? __ldg(src + i) : make_uint4(0, 0, 0, 0);
    return r;
  }
  __device__ __forceinline__ void decode(const Raw& r, uint32_t (&v)[16]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[4 * i] = r.q[i].x, v[4 * i + 1] = r.q[i].y, v[4 * i + 2] = r.q[i].z, v[4 * i + 3] = r.q[i].w;
  }
};

/// c += M[r0 + g, r0 + g + 8, :] · x for this warp's 16 rows of M (an MxRows or Bf16Rows), x the
/// token's values as BF16 pairs: R::kUnroll column blocks' loads issued together, then decoded and
/// multiplied.
template <class R>
__device__ __forceinline__ void gemv_rows(const R& W, int r0, const uint32_t* x_pairs, float (&c)[4]) {
  constexpr int kU = R::kUnroll;
  const int lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  for (int c0 = 0; c0 < W.cols; c0 += kU * kCols) {
    typename R::Raw gr[kU][2];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int col = c0 + u * kCols + 32 * t4;
      gr[u][0] = W.fetch(r0 + g, col);
      gr[u][1] = W.fetch(r0 + g + 8, col);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int col = c0 + u * kCols + 32 * t4;
      uint32_t x[16], lo[16], hi[16];
      token_values(x_pairs + col / 2, g == 0 && col < W.cols, x);
      W.decode(gr[u][0], lo);
      W.decode(gr[u][1], hi);
      mma_block(c, lo, hi, x);
    }
  }
}

/// The three matrices of expert e, as MxRows (MX) or Bf16Rows: w1 (gate), w3 (up) [inter, io],
/// w2 (down) [io, inter].
template <bool MX>
struct ExpertRows;
template <>
struct ExpertRows<true> {
  using Table = ExpertPtrs;
  MxRows w1, w3, w2;
  __device__ ExpertRows(const Table& e, int io, int inter, const uint32_t* lut)
      : w1{e.p1, e.s1, inter, io, lut}, w3{e.p3, e.s3, inter, io, lut}, w2{e.p2, e.s2, io, inter, lut} {}
};
template <>
struct ExpertRows<false> {
  using Table = DenseExpertPtrs;
  Bf16Rows w1, w3, w2;
  __device__ ExpertRows(const Table& e, int io, int inter, const uint32_t*)
      : w1{e.w1, inter, io}, w3{e.w3, inter, io}, w2{e.w2, io, inter} {}
};

/// Counts the token's expert visits and bytes into CudaStats::device_expert_* (block 0 of each
/// slot; traffic may be null).
__device__ __forceinline__ void count_visit(unsigned long long* traffic, unsigned long long ebytes) {
  if (traffic && blockIdx.x == 0 && threadIdx.x == 0) {
    atomicAdd(traffic, 1ull);
    atomicAdd(traffic + 1, ebytes);
  }
}

/// Gate/up: act[j, r] = GLU(W1[e]·z, W3[e]·z)[r] for the 16 rows of each warp (e = ids[j]; GLU:
/// SiTU, or SiLU(g)·u when silu).
template <bool MX>
__global__ void __launch_bounds__(kThreads, 3) decode_gate_up_kernel(
    const typename ExpertRows<MX>::Table* __restrict__ table, const int* __restrict__ ids, const float* __restrict__ z,
    int io, int inter, float b1, float b2, int silu, __nv_bfloat16* __restrict__ act,
    unsigned long long* __restrict__ traffic, unsigned long long ebytes) {
  extern __shared__ __align__(16) uint32_t zs[];  // z as BF16 pairs [io / 2]
  __shared__ uint32_t lut[MX ? kLutWords : 1];
  if constexpr (MX) fill_lut(lut);
  const int j = int(blockIdx.y), lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  count_visit(traffic, ebytes);
  for (int i = int(threadIdx.x); i < io / 2; i += kThreads) {
    const float2 v = reinterpret_cast<const float2*>(z)[i];
    const __nv_bfloat162 b = __floats2bfloat162_rn(v.x, v.y);
    zs[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  __syncthreads();
  const ExpertRows<MX> e(table[ids[j]], io, inter, lut);
  const int r0 = (int(blockIdx.x) * kWarps + int(threadIdx.x) / kWarp) * kRows;
  if (r0 >= inter) return;
  float cg[4] = {0.f, 0.f, 0.f, 0.f}, cu[4] = {0.f, 0.f, 0.f, 0.f};
  gemv_rows(e.w1, r0, zs, cg);
  gemv_rows(e.w3, r0, zs, cu);
  if (t4 != 0) return;  // column 0 of the product: c0 (row g) and c2 (row g + 8) of lanes t4 = 0
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g + 8 * h;
    const float gv = cg[2 * h], uv = cu[2 * h];
    if (r < inter)
      act[size_t(j) * inter + r] = __float2bfloat16_rn(silu ? gv / (1.f + __expf(-gv)) * uv : situ_f(gv, uv, b1, b2));
  }
}

/// Down: ys[j, r] = (W2[e] · act[j])[r] for the 16 rows of each warp.
template <bool MX>
__global__ void __launch_bounds__(kThreads, 3) decode_down_kernel(const typename ExpertRows<MX>::Table* __restrict__ table,
                                                               const int* __restrict__ ids,
                                                               const __nv_bfloat16* __restrict__ act, int io, int inter,
                                                               float* __restrict__ ys) {
  const int j = int(blockIdx.y), lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  __shared__ uint32_t lut[MX ? kLutWords : 1];
  if constexpr (MX) {
    fill_lut(lut);
    __syncthreads();
  }
  const ExpertRows<MX> e(table[ids[j]], io, inter, lut);
  const int r0 = (int(blockIdx.x) * kWarps + int(threadIdx.x) / kWarp) * kRows;
  if (r0 >= io) return;
  const __nv_bfloat16* a = act + size_t(j) * inter;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  gemv_rows(e.w2, r0, reinterpret_cast<const uint32_t*>(a), c);
  if (t4 != 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g + 8 * h;
    if (r < io) ys[size_t(j) * io + r] = c[2 * h];
  }
}

template <bool MX>
void launch_decode(CudaBackend::Impl& m, const typename ExpertRows<MX>::Table* table, const int* ids, const float* z,
                   int k, int io, int inter, float b1, float b2, bool silu, float* ys) {
  // The backend's own act scratch (not the fast-mode LtState's: a decode step may be recorded into
  // a graph before anything has created that state, and creating it there would allocate).
  auto* act = static_cast<__nv_bfloat16*>(m.scratch(m.act, size_t(k) * inter * sizeof(__nv_bfloat16)));
  const size_t zs_bytes = size_t(io) * 2;  // z as BF16, next to the table's 32 KiB of static shared memory (MX)
  const size_t static_bytes = MX ? size_t(kLutWords) * 4 : 4;
  if (zs_bytes + static_bytes > 48 * 1024) {
    static size_t opted = 0;  // the largest opt-in set so far (per process and instance)
    if (zs_bytes > opted) {
      check_cuda(cudaFuncSetAttribute(decode_gate_up_kernel<MX>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(zs_bytes)),
                 "cudaFuncSetAttribute (expert decode gate/up)");
      opted = zs_bytes;
    }
  }
  const unsigned long long ebytes =
      MX ? 3ull * (size_t(inter) * io / 2 + size_t(inter) * io / 32) : 3ull * size_t(inter) * io * 2;
  const int per_block = kWarps * kRows;
  decode_gate_up_kernel<MX><<<dim3(unsigned((inter + per_block - 1) / per_block), unsigned(k)), kThreads, zs_bytes,
                              m.stream>>>(table, ids, z, io, inter, b1, b2, silu ? 1 : 0, act, m.traffic_counters(), ebytes);
  m.launched(MX ? "routed_moe (fast) mxfp4 decode gate/up kernel" : "routed_moe (fast) dense decode gate/up kernel");
  decode_down_kernel<MX><<<dim3(unsigned((io + per_block - 1) / per_block), unsigned(k)), kThreads, 0, m.stream>>>(
      table, ids, act, io, inter, ys);
  m.launched(MX ? "routed_moe (fast) mxfp4 decode down kernel" : "routed_moe (fast) dense decode down kernel");
}

}  // namespace

bool moe_decode_ok(const CudaBackend::Impl& m, int T, int io, int inter, const float* z, bool mx) {
  const size_t static_bytes = mx ? size_t(kLutWords) * 4 : 4;
  return m.opts.precision == GpuPrecision::Fast && T == 1 && io > 0 && inter > 0 && io % 32 == 0 && inter % 32 == 0 &&
         reinterpret_cast<uintptr_t>(z) % 8 == 0 && static_bytes + size_t(io) * 2 <= size_t(m.max_smem_optin);
}

void moe_decode(CudaBackend::Impl& m, const ExpertPtrs* table, const int* ids, const float* z, int k, int io,
                int inter, float b1, float b2, float* ys) {
  launch_decode<true>(m, table, ids, z, k, io, inter, b1, b2, false, ys);
}

void moe_decode_dense(CudaBackend::Impl& m, const DenseExpertPtrs* table, const int* ids, const float* z, int k, int io,
                      int inter, float b1, float b2, bool silu, float* ys) {
  launch_decode<false>(m, table, ids, z, k, io, inter, b1, b2, silu, ys);
}

}  // namespace wren::cuda
