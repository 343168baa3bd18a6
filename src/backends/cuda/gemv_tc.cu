// CUDA backend, fast precision mode: y = W · x for one token (T = 1) and a BF16 weight, on tensor
// cores: the decode GEMV of every BF16 dense matrix (docs/gpu-method.md "BF16 GEMV of a decode
// token").
//
// A decode GEMV is a weight stream: the exact-mode kernels (gemm_quant.cu: a warp per row, f32
// FMAs, 8 rows a block) keep few bytes in flight per SM. Here a warp owns 16 rows and runs the
// product as mma.sync m16n8k16 with the weights as A and the token (BF16) as column 0 of B, as the
// dense decode experts do (moe_decode.cu): per 128-column span, lane (g, t4) loads the 64 bytes at
// columns S + 32·t4 .. + 31 of rows g and g + 8, and MMA step i takes its columns 4i .. 4i + 3 as
// k slots 2·t4, 2·t4 + 1, 2·t4 + 8, 2·t4 + 9 of A and B. A block is 8 warps on one 16-row tile,
// each warp summing every 8th span of the block's share of the columns; the 8 warp sums are added
// in warp order through shared memory. Matrices with few row tiles also split the columns over
// blockIdx.y (kb blocks a tile, chosen so that the grid covers the SMs twice): each block writes
// its partial row sums, and the last of the tile's blocks to finish (a per-tile arrival counter)
// adds the kb partials in order. Every sum has a fixed order: the result does not depend on
// anything but the inputs, nor on which block finishes last. The kernel is a programmatic
// dependent launch (docs/gpu-method.md#programmatic-dependent-launch): its blocks start while the
// kernel before it drains, and wait for it before reading x.
#include "backends/cuda/gemv_tc.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "backends/cuda/gemm_quant.cuh"

namespace wren::cuda {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * kWarp, kRows = 16, kSpan = 128;

/// Row sums of one 16-row tile over the block's column spans: y directly (kb == 1), else the
/// block's partial sums into part[blockIdx.y] and, in the last of the tile's kb blocks to finish
/// (count[tile], left at 0 again), y = Σ_b part[b] in b order. Launched as a programmatic
/// dependent launch: a warp first asks L2 for `pf` lines of each of its rows (weights only), then
/// waits for the kernel before it (x, y, part and count are touched only after that).
__global__ void __launch_bounds__(kThreads, 2) gemv_tc_kernel(const uint16_t* __restrict__ w, const float* __restrict__ x,
                                                              int rows, int cols, int spans_per_block, int pf,
                                                              float* __restrict__ part, unsigned* __restrict__ count,
                                                              float* __restrict__ y) {
  __shared__ float red[kWarps][kWarp][2];
  __shared__ bool last;
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  const int r0 = int(blockIdx.x) * kRows, spans = cols / kSpan + (cols % kSpan ? 1 : 0), kb = int(gridDim.y);
  const int s_begin = int(blockIdx.y) * spans_per_block, s_end = min(spans, s_begin + spans_per_block);
  if (pf > 0 && s_begin + warp < s_end)
    prefetch_rows(reinterpret_cast<const uint8_t*>(w), size_t(cols) * 2, rows, r0, size_t(s_begin + warp) * kSpan * 2, pf);
  pdl_wait();
  pdl_trigger();  // after the wait: when a dependent starts, everything before this kernel is done
  const int ra = r0 + g, rb = r0 + g + 8;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  // Two spans a step (s and s + kWarps): the loads of both are issued before the first MMA, so a
  // warp has twice the bytes in flight (the MMAs still run span after span: the same sums).
  for (int s = s_begin + warp; s < s_end; s += 2 * kWarps) {
    uint32_t lo[2][16], hi[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      // A span past the block's share loads nothing (col = cols: zeros).
      const int col = s + u * kWarps < s_end ? (s + u * kWarps) * kSpan + 32 * t4 : cols;
      load_bf16(w, ra, rows, col, cols, lo[u]);
      load_bf16(w, rb, rows, col, cols, hi[u]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int col = (s + u * kWarps) * kSpan + 32 * t4;
      if (s + u * kWarps >= s_end) break;
      const bool in = col < cols;
      uint32_t xv[16];
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // the token's 32 values as BF16 pairs (lanes g = 0), else zeros
        const float4 v = g == 0 && in ? __ldg(reinterpret_cast<const float4*>(x + col) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        const __nv_bfloat162 p0 = __floats2bfloat162_rn(v.x, v.y), p1 = __floats2bfloat162_rn(v.z, v.w);
        xv[2 * i] = *reinterpret_cast<const uint32_t*>(&p0), xv[2 * i + 1] = *reinterpret_cast<const uint32_t*>(&p1);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned a[4] = {lo[u][2 * i], hi[u][2 * i], lo[u][2 * i + 1], hi[u][2 * i + 1]};
        mma_bf16(c, a, xv[2 * i], xv[2 * i + 1]);
      }
    }
  }
  red[warp][lane][0] = c[0], red[warp][lane][1] = c[2];  // column 0 (lanes t4 = 0 hold the product)
  __syncthreads();
  if (warp == 0 && t4 == 0) {
    float a = 0.f, b = 0.f;
    for (int v = 0; v < kWarps; ++v) a += red[v][lane][0], b += red[v][lane][1];
    float* o = kb == 1 ? y : part + size_t(blockIdx.y) * rows;
    if (ra < rows) o[ra] = a;
    if (rb < rows) o[rb] = b;
    if (kb > 1) __threadfence();  // the partials are visible before this block is counted
  }
  if (kb == 1) return;
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(count + blockIdx.x, 1u) == unsigned(kb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int r = r0 + int(threadIdx.x);
  if (threadIdx.x < kRows && r < rows) {  // the same b order whichever block comes last
    float sum = 0.f;
    for (int b = 0; b < kb; ++b) sum += __ldcg(part + size_t(b) * rows + r);
    y[r] = sum;
  }
  if (threadIdx.x == 0) count[blockIdx.x] = 0;  // ready for the next launch
}

}  // namespace

bool gemv_tc(CudaBackend::Impl& m, const DenseWeight& W, const float* x, int T, float* y) {
  if (m.opts.precision != GpuPrecision::Fast || T != 1 || W.format != WFormat::BF16) return false;
  const int rows = int(W.rows), cols = int(W.cols);
  if (rows <= 0 || cols <= 0 || cols % 32 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  const QuantView v = quant_view(m, W, "gemm (fast, tensor-core gemv)");
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0) return false;
  const int tiles = (rows + kRows - 1) / kRows, spans = (cols + kSpan - 1) / kSpan;
  // Column splits: enough blocks for two per SM, each warp at least one span.
  const int want = (2 * std::max(m.sm_count, 1) + tiles - 1) / tiles;
  const int kb = std::clamp(want, 1, std::max(1, spans / kWarps));
  const int per = (spans + kb - 1) / kb;
  const int blocks_y = (spans + per - 1) / per;
  float* part = nullptr;
  unsigned* count = nullptr;
  if (blocks_y > 1) {
    part = static_cast<float*>(m.scratch(m.gemv_part, size_t(blocks_y) * rows * sizeof(float)));
    // Tile counters: zero when made, and every launch leaves them at zero.
    const void* had = m.gemv_count.ptr;
    count = static_cast<unsigned*>(m.scratch(m.gemv_count, size_t(tiles) * sizeof(unsigned)));
    if (count != had)
      check_cuda(cudaMemsetAsync(count, 0, m.gemv_count.bytes, m.stream), "cudaMemsetAsync (tensor-core gemv counters)");
  }
  const char* what = "gemm (fast) bf16 tensor-core gemv kernel";
  launch_ex(m, gemv_tc_kernel, dim3(unsigned(tiles), unsigned(blocks_y)), dim3(kThreads), 0, 0, m.stream_pdl, what,
            static_cast<const uint16_t*>(v.data), x, rows, cols, per, m.stream_prefetch, part, count, y);
  m.launched(what);
  ++m.stats.tc_gemvs;
  return true;
}

}  // namespace wren::cuda

namespace wren {

void CudaBackend::set_decode_streams(bool pdl, int prefetch_lines) {
  check(prefetch_lines >= 0 && prefetch_lines <= 64, "CUDA backend: set_decode_streams: expected 0..64 prefetch lines");
  impl_->stream_pdl = pdl;
  impl_->stream_prefetch = prefetch_lines;
}

}  // namespace wren
