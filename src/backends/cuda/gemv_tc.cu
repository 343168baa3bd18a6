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
// blockIdx.y (kb blocks a tile, chosen so that the grid covers each SM once): each block writes
// its partial row sums, and the last of the tile's blocks to finish (a per-tile arrival counter)
// adds the kb partials in order. Every sum has a fixed order: the result does not depend on
// anything but the inputs, nor on which block finishes last. The kernel is a programmatic
// dependent launch (docs/gpu-method.md#programmatic-dependent-launch): its blocks start while the
// kernel before it drains, and wait for it before reading x.
//
// One launch may run up to 8 independent products (Backend::gemm_batch: a layer's projections of
// one input): the job table travels in the kernel parameters, each job owns a range of linear
// block indices and its blocks run exactly what a launch of that job alone would, so each y is
// bit-identical to the job alone. A test hook (set_decode_streams) puts 1, 2 or 4 warps on a tile
// instead of 8 (8 / wt tiles a block): measured, not the default.
#include "backends/cuda/gemv_tc.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <utility>

#include "backends/cuda/gemm_quant.cuh"

namespace wren::cuda {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * kWarp, kRows = 16, kSpan = 128, kMaxJobs = 8;

/// The forms set_decode_streams(…, gemv_form) picks (a benchmark/test hook; 0 = the default): the
/// kernel instance (blocks an SM, spans a step) and the column-split target (blocks an SM; 0: never
/// split): ceil(target / tiles) blocks a tile, or with `fit` floor(target / tiles) (the most that
/// still fit in one wave of the target; at least 1); with `split_below` > 0 only a matrix of fewer
/// tiles than that is split (a rule on the job alone: gemm_batch's jobs must not depend on their
/// batch mates, so a batch cannot turn splitting off for itself). The default (f0) splits the
/// columns only of matrices with fewer than 32 16-row tiles, for a block an SM. Run 35 (H100)
/// measured the split of every matrix with fewer tiles than SMs (f9, the default of runs 35-36)
/// against the split for two blocks an SM (f1, runs 30-34): 66% / 53% of the copy bandwidth
/// instead of 48% / 42% on Kimi Linear's 4096 x 2304 / 2304 x 4096, 74% instead of 53% on its KDA
/// projections in one launch. Run 37 measured f0 against f9: the same on every shape within 1-2%
/// except Kimi Linear's router + shared gate/up in one launch, 46% instead of 33% (a 256-row
/// router split, 1024-row matrices not), and the 48B-size token 1.085-1.090 ms against 1.107-1.113.
struct GemvForm {
  int min_blocks, step, slots_per_sm;
  bool fit = false;
  int split_below = 0;
};
constexpr GemvForm kForms[] = {{2, 2, 1, false, 32}, {2, 2, 2}, {3, 1, 3}, {4, 1, 4}, {3, 1, 1},
                               {4, 1, 1}, {2, 2, 0}, {2, 2, 2, true}, {4, 1, 4, true},
                               {2, 2, 1}, {2, 2, 1, false, 64}};
constexpr int kNumForms = int(sizeof(kForms) / sizeof(kForms[0]));

/// One product of a launch: its blocks are linear blocks [block0, block0 + blocks_x · blocks_y)
/// of the grid, block (bx, by) = tiles bx · (8 / wt) … of 16 rows and spans [by · per, (by + 1) ·
/// per) of 128 columns (by > 0 only with wt == 8: a column split, blocks_y partial sums).
struct GemvJob {
  const uint16_t* w;
  const float* x;
  float* y;
  float* part;      ///< [blocks_y, rows] partial sums (blocks_y > 1)
  unsigned* count;  ///< [blocks_x] arrival counters, zero between launches (blocks_y > 1)
  int rows, cols, wt, per, blocks_x, blocks_y, block0;
  InputMap map;  ///< gemv_tc_mapped's map of x and map.b (read by the kMap instance only)
};

/// One input value as the element-wise op of map m gives it (elementwise.cu: the same
/// expressions; the build contracts no multiply-add, so the same f32 bits).
__device__ __forceinline__ float map_input(const InputMap& m, float a, float b) {
  switch (m.kind) {
    case InputMap::Kind::SiluGlu: return a * sigmoid_f(a) * b;
    case InputMap::Kind::SituGlu: return situ_f(a, b, m.b1, m.b2);
    case InputMap::Kind::SigmoidGate: return a * sigmoid_f(b);
  }
  return a;  // not reached
}

/// The B fragment (xv, as the plain path loads it: lanes g = 0 hold the span's 32 values at
/// columns S + 32·t4 … as BF16 pairs, the other lanes zeros) of the mapped input of span S: each
/// lane loads and maps 4 values (columns S + 4·lane …; zeros past cols, a multiple of 32) and
/// rounds them to BF16 pairs as the plain path rounds x; lane (0, t4) gathers its 16 pairs from
/// lanes 8·t4 … 8·t4 + 7 by shuffles. Spreading the map over the warp's 32 lanes (instead of its
/// 4 lanes g = 0 mapping 32 values each) keeps the f64 exps of sigmoid_f off the critical path.
__device__ __forceinline__ void mapped_span(const GemvJob& J, int S, int lane, uint32_t (&xv)[16]) {
  const int c = S + 4 * lane;
  uint32_t w0 = 0, w1 = 0;
  if (c < J.cols) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(J.x + c)), b = __ldg(reinterpret_cast<const float4*>(J.map.b + c));
    const __nv_bfloat162 p0 = __floats2bfloat162_rn(map_input(J.map, a.x, b.x), map_input(J.map, a.y, b.y));
    const __nv_bfloat162 p1 = __floats2bfloat162_rn(map_input(J.map, a.z, b.z), map_input(J.map, a.w, b.w));
    w0 = *reinterpret_cast<const uint32_t*>(&p0), w1 = *reinterpret_cast<const uint32_t*>(&p1);
  }
  const bool g0 = lane < 4;
  const int src = 8 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t u0 = __shfl_sync(kFull, w0, src + i), u1 = __shfl_sync(kFull, w1, src + i);
    xv[2 * i] = g0 ? u0 : 0u, xv[2 * i + 1] = g0 ? u1 : 0u;
  }
}
/// The products of one launch (independent: no job reads another's y).
struct GemvJobs {
  GemvJob job[kMaxJobs];
  int n;
};

/// Row sums of 16-row tiles over column spans, for the job that owns this linear block: a block
/// is 8 warps, `wt` warps to a tile (8 / wt tiles a block); the wt warps of a tile sum every
/// wt-th span of the block's share, then add their sums in warp order (wt == 1: a warp owns its
/// tile's whole rows, no block-wide step). Column splits (wt == 8 only): each block writes its
/// partial sums into part[by] and the last of a tile's blocks to finish (count[bx], left at 0
/// again) sums them in by order. Launched as a programmatic dependent launch: a warp first asks
/// L2 for `pf` lines of each of its rows (weights only), then waits for the kernel before it (x,
/// y, part and count are touched only after that).
/// kMinBlocks: blocks an SM the registers are budgeted for (2: 128 registers a thread); kStep: spans
/// whose loads a warp issues before its first MMA (the sums are the same for every kStep). kMap: the
/// instance of gemv_tc_mapped (jobs' input maps applied; the plain instances have no map code:
/// with it in the same instance the BF16 GEMVs of a K3-size token ran 2.7x slower, run 48).
template <int kMinBlocks, int kStep, bool kMap>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gemv_tc_kernel(const __grid_constant__ GemvJobs jobs, int pf) {
  __shared__ float red[kWarps][kWarp][2];
  __shared__ bool last;
  int j = 0;
  for (int i = 1; i < jobs.n; ++i)
    if (int(blockIdx.x) >= jobs.job[i].block0) j = i;
  const GemvJob& J = jobs.job[j];
  const uint16_t* __restrict__ w = J.w;
  const float* __restrict__ x = J.x;
  const int rows = J.rows, cols = J.cols, wt = J.wt, kb = J.blocks_y;
  const int local = int(blockIdx.x) - J.block0, bx = local % J.blocks_x, by = local / J.blocks_x;
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp, g = lane / 4, t4 = lane % 4;
  const int tiles_per_block = kWarps / wt, wi = warp % wt;
  const int r0 = (bx * tiles_per_block + warp / wt) * kRows, spans = cols / kSpan + (cols % kSpan ? 1 : 0);
  const int s_begin = by * J.per, s_end = min(spans, s_begin + J.per);
  if (pf > 0 && s_begin + wi < s_end && r0 < rows)
    prefetch_rows(reinterpret_cast<const uint8_t*>(w), size_t(cols) * 2, rows, r0, size_t(s_begin + wi) * kSpan * 2, pf);
  pdl_wait();
  pdl_trigger();  // after the wait: when a dependent starts, everything before this kernel is done
  const int ra = r0 + g, rb = r0 + g + 8;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  // kStep spans a step (s, s + wt, ...): the loads of all are issued before the first MMA, so a warp
  // has kStep times the bytes in flight (the MMAs still run span after span: the same sums).
  for (int s = s_begin + wi; s < s_end; s += kStep * wt) {
    uint32_t lo[kStep][16], hi[kStep][16];
#pragma unroll
    for (int u = 0; u < kStep; ++u) {
      // A span past the block's share loads nothing (col = cols: zeros).
      const int col = s + u * wt < s_end ? (s + u * wt) * kSpan + 32 * t4 : cols;
      load_bf16(w, ra, rows, col, cols, lo[u]);
      load_bf16(w, rb, rows, col, cols, hi[u]);
    }
#pragma unroll
    for (int u = 0; u < kStep; ++u) {
      const int col = (s + u * wt) * kSpan + 32 * t4;
      if (s + u * wt >= s_end) break;
      const bool in = col < cols;
      uint32_t xv[16];
      if constexpr (kMap) {
        mapped_span(J, (s + u * wt) * kSpan, lane, xv);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // the token's 32 values as BF16 pairs (lanes g = 0), else zeros
          const float4 v = g == 0 && in ? __ldg(reinterpret_cast<const float4*>(x + col) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
          const __nv_bfloat162 p0 = __floats2bfloat162_rn(v.x, v.y), p1 = __floats2bfloat162_rn(v.z, v.w);
          xv[2 * i] = *reinterpret_cast<const uint32_t*>(&p0), xv[2 * i + 1] = *reinterpret_cast<const uint32_t*>(&p1);
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned a[4] = {lo[u][2 * i], hi[u][2 * i], lo[u][2 * i + 1], hi[u][2 * i + 1]};
        mma_bf16(c, a, xv[2 * i], xv[2 * i + 1]);
      }
    }
  }
  float* o = kb == 1 ? J.y : J.part + size_t(by) * rows;
  if (wt == 1) {  // column 0 (lanes t4 = 0 hold the product): the warp's own rows
    if (t4 == 0) {
      if (ra < rows) o[ra] = c[0];
      if (rb < rows) o[rb] = c[2];
    }
  } else {
    red[warp][lane][0] = c[0], red[warp][lane][1] = c[2];
    __syncthreads();
    if (wi == 0 && t4 == 0) {  // the tile's wt warp sums, in warp order
      float a = 0.f, b = 0.f;
      for (int v = 0; v < wt; ++v) a += red[warp + v][lane][0], b += red[warp + v][lane][1];
      if (ra < rows) o[ra] = a;
      if (rb < rows) o[rb] = b;
    }
  }
  if (kb == 1) return;
  __threadfence();  // the partials are visible before this block is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(J.count + bx, 1u) == unsigned(kb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int r = bx * tiles_per_block * kRows + int(threadIdx.x);
  if (int(threadIdx.x) < tiles_per_block * kRows && r < rows) {  // the same by order whichever block comes last
    float sum = 0.f;
    for (int b = 0; b < kb; ++b) sum += __ldcg(J.part + size_t(b) * rows + r);
    J.y[r] = sum;
  }
  if (threadIdx.x == 0) J.count[bx] = 0;  // ready for the next launch
}

/// Whether gemv_tc takes y = W · x (fast mode, T = 1, BF16, cols % 32 == 0, 16-byte aligned x and
/// device weights); `data` receives W's device bytes.
bool takes(CudaBackend::Impl& m, const DenseWeight& W, const float* x, int T, const void** data) {
  if (m.opts.precision != GpuPrecision::Fast || T != 1 || W.format != WFormat::BF16) return false;
  if (W.rows <= 0 || W.cols <= 0 || W.cols % 32 != 0 || W.rows > INT32_MAX || W.cols > INT32_MAX ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return false;
  const QuantView v = quant_view(m, W, "gemm (fast, tensor-core gemv)");
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0) return false;
  *data = v.data;
  return true;
}

/// The shape of one job's blocks: 8 warps to a tile (a tile a block) unless set_decode_streams
/// asks otherwise, with the columns split over blocks so that the grid covers the form's slots
/// (the default: a block an SM, and only matrices of fewer than 32 tiles are split). A warp
/// to a tile for long streams of short rows was measured and not kept (run 30, H100: the 163840 ×
/// 2304 lm_head at 97% of the copy bandwidth with a warp a tile, 99% with 8).
GemvJob plan(const CudaBackend::Impl& m, const uint16_t* w, const float* x, float* y, int rows, int cols) {
  GemvJob j{w, x, y, nullptr, nullptr, rows, cols, kWarps, 0, 0, 1, 0, {}};
  const int tiles = (rows + kRows - 1) / kRows, spans = (cols + kSpan - 1) / kSpan;
  const int slots = kForms[m.gemv_form].slots_per_sm * std::max(m.sm_count, 1);
  j.wt = m.gemv_wt > 0 ? m.gemv_wt : kWarps;
  const int tpb = kWarps / j.wt;
  j.blocks_x = (tiles + tpb - 1) / tpb;
  int kb = 1;
  const int below = kForms[m.gemv_form].split_below;
  if (j.wt == kWarps && (below == 0 || tiles < below)) {  // column splits: enough blocks for the form's slots, each warp at least one span
    const int want = kForms[m.gemv_form].fit ? slots / tiles : (slots + tiles - 1) / tiles;
    kb = std::clamp(want, 1, std::max(1, spans / kWarps));
  }
  j.per = (spans + kb - 1) / kb;
  j.blocks_y = (spans + j.per - 1) / j.per;
  return j;
}

/// Launches jobs[0, n) (planned, block0 unset) as one kernel: block offsets, the column-split
/// scratch of each split job (disjoint parts of Impl::gemv_part / gemv_count), one launch; `mapped`:
/// the kernel instance that applies the jobs' input maps (gemv_tc_mapped).
void launch(CudaBackend::Impl& m, GemvJobs& jobs, bool mapped = false) {
  size_t part_floats = 0, counters = 0;
  for (int i = 0; i < jobs.n; ++i)
    if (jobs.job[i].blocks_y > 1)
      part_floats += size_t(jobs.job[i].blocks_y) * jobs.job[i].rows, counters += size_t(jobs.job[i].blocks_x);
  float* part = nullptr;
  unsigned* count = nullptr;
  if (counters > 0) {
    part = static_cast<float*>(m.scratch(m.gemv_part, part_floats * sizeof(float)));
    // Counters: zero when made, and every launch leaves them at zero.
    count = static_cast<unsigned*>(
        m.counter_scratch(m.gemv_count, counters * sizeof(unsigned), "cudaMemsetAsync (tensor-core gemv counters)"));
  }
  long long blocks = 0;
  for (int i = 0; i < jobs.n; ++i) {
    GemvJob& j = jobs.job[i];
    j.block0 = int(blocks);
    blocks += (long long)j.blocks_x * j.blocks_y;
    if (j.blocks_y > 1) {
      j.part = part, j.count = count;
      part += size_t(j.blocks_y) * j.rows, count += j.blocks_x;
    }
  }
  check(blocks <= INT32_MAX, "gemm (fast, tensor-core gemv): too many blocks for one launch");
  const char* what = mapped ? "gemm (fast) bf16 tensor-core gemv kernel, mapped input" : "gemm (fast) bf16 tensor-core gemv kernel";
  // The kernel instance of each form, from kForms itself (forms sharing an instance share its code).
  auto instance = [&]<int... F>(std::integer_sequence<int, F...>) {
    using Kernel = void (*)(const GemvJobs, int);
    constexpr Kernel kernels[] = {gemv_tc_kernel<kForms[F].min_blocks, kForms[F].step, false>...};
    constexpr Kernel mapped_kernels[] = {gemv_tc_kernel<kForms[F].min_blocks, kForms[F].step, true>...};
    return mapped ? mapped_kernels[m.gemv_form] : kernels[m.gemv_form];
  };
  launch_ex(m, instance(std::make_integer_sequence<int, kNumForms>{}), dim3(unsigned(blocks)), dim3(kThreads), 0, 0,
            m.stream_pdl, what, jobs, m.stream_prefetch);
  m.launched(what);
  m.stats.tc_gemvs += uint64_t(jobs.n);
}

}  // namespace

bool gemv_tc(CudaBackend::Impl& m, const DenseWeight& W, const float* x, int T, float* y) {
  const GemmJob job{&W, x, y};
  bool taken = false;
  gemv_tc_batch(m, &job, 1, T, &taken);
  return taken;
}

bool gemv_tc_mapped(CudaBackend::Impl& m, const DenseWeight& W, const float* a, const InputMap& map, int T, float* y) {
  const void* data = nullptr;
  if (map.b == nullptr || reinterpret_cast<uintptr_t>(map.b) % 16 != 0 || !takes(m, W, a, T, &data)) return false;
  GemvJobs jobs{};
  GemvJob& j = jobs.job[jobs.n++] = plan(m, static_cast<const uint16_t*>(data), a, y, int(W.rows), int(W.cols));
  j.map = map;
  launch(m, jobs, true);
  ++m.stats.mapped_gemvs;
  return true;
}

int gemv_tc_batch(CudaBackend::Impl& m, const GemmJob* in, int n, int T, bool* taken) {
  GemvJobs jobs{};
  for (int i = 0; i < n; ++i) {
    const void* data = nullptr;
    taken[i] = jobs.n < kMaxJobs && takes(m, *in[i].W, in[i].x, T, &data);
    if (taken[i])
      jobs.job[jobs.n++] = plan(m, static_cast<const uint16_t*>(data), in[i].x, in[i].y, int(in[i].W->rows), int(in[i].W->cols));
  }
  if (jobs.n > 0) launch(m, jobs);
  return jobs.n;
}

}  // namespace wren::cuda

namespace wren {

int CudaBackend::gemv_forms() { return cuda::kNumForms; }

void CudaBackend::set_decode_streams(bool pdl, int prefetch_lines, int gemv_warps_per_tile, int gemv_form) {
  check(prefetch_lines >= 0 && prefetch_lines <= 64, "CUDA backend: set_decode_streams: expected 0..64 prefetch lines");
  check(cuda::warps_a_tile_ok(gemv_warps_per_tile),
        "CUDA backend: set_decode_streams: expected 0 (the default, 8), 1, 2, 4 or 8 GEMV warps a tile");
  check(gemv_form >= 0 && gemv_form < cuda::kNumForms,
        "CUDA backend: set_decode_streams: expected a GEMV form 0.." + std::to_string(cuda::kNumForms - 1));
  impl_->stream_pdl = pdl;
  impl_->stream_prefetch = prefetch_lines;
  impl_->gemv_wt = gemv_warps_per_tile;
  impl_->gemv_form = gemv_form;
}

}  // namespace wren
