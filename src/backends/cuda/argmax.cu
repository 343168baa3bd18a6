// CUDA backend: greedy ids of logits rows on the device (Backend::argmax_rows), so that a greedy
// decode step copies rows ids to the host instead of rows x vocab floats and the host scans nothing.
// The rule is core/argmax.h's: the first index of the largest value (-0 == +0), -1 for a row holding
// a NaN or an infinity. Comparisons only, so the index is exactly the host's for every input.
#include <algorithm>

#include "backends/cuda/cuda_common.cuh"

namespace wren {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMinPerThread = 16;  ///< fewest values a thread scans (more segments only while each has this many)

/// A candidate: value, index, and whether a non-finite value was seen.
struct Best {
  float v;
  int i;
  bool bad;
};

/// The better of two candidates (larger value; on equal values the lower index; a candidate with
/// i < 0 holds nothing). `bad` is sticky.
__device__ __forceinline__ Best better(Best a, Best b) {
  Best r = (b.i >= 0 && (a.i < 0 || b.v > a.v || (b.v == a.v && b.i < a.i))) ? b : a;
  r.bad = a.bad || b.bad;
  return r;
}

__device__ __forceinline__ Best warp_best(Best b) {
  for (int o = 16; o > 0; o >>= 1) {
    Best x{__shfl_down_sync(0xffffffffu, b.v, o), __shfl_down_sync(0xffffffffu, b.i, o),
           bool(__shfl_down_sync(0xffffffffu, int(b.bad), o))};
    b = better(b, x);
  }
  return b;
}

/// Block-wide best (valid in thread 0).
__device__ Best block_best(Best b) {
  __shared__ float sv[kWarps];
  __shared__ int si[kWarps], sb[kWarps];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  b = warp_best(b);
  if (lane == 0) sv[warp] = b.v, si[warp] = b.i, sb[warp] = b.bad;
  __syncthreads();
  if (warp == 0) {
    b = lane < kWarps ? Best{sv[lane], si[lane], bool(sb[lane])} : Best{0.f, -1, false};
    b = warp_best(b);
  }
  return b;
}

/// Block (row r = blockIdx.x / S, segment s = blockIdx.x % S) scans columns [s · per, (s+1) · per)
/// of row r, a thread every kThreads-th value from its own (ascending, strict '>': its first
/// maximum), then the block's best goes to part[r · S + s]; the last of a row's S blocks to finish
/// (count[r], left at 0 again) takes the best of the S parts and writes out[r]. A programmatic
/// dependent launch: waits for the lm_head before touching memory.
__global__ void argmax_rows_kernel(const float* __restrict__ x, int cols, int S, int per, float2* part,
                                   unsigned* count, float* __restrict__ out) {
  cuda::pdl_wait();
  cuda::pdl_trigger();
  const int r = int(blockIdx.x) / S, s = int(blockIdx.x) % S;
  const float* row = x + size_t(r) * size_t(cols);
  const int c0 = s * per, c1 = min(cols, c0 + per);
  Best b{0.f, -1, false};
#pragma unroll 4
  for (int c = c0 + int(threadIdx.x); c < c1; c += kThreads) {
    const float v = row[c];
    if (!isfinite(v)) b.bad = true;
    else if (b.i < 0 || v > b.v) b.v = v, b.i = c;
  }
  b = block_best(b);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    // The part: value, and ((index + 1) << 1 | non-finite seen) (index -1: the segment held no finite value).
    part[size_t(r) * S + s] = make_float2(b.v, __int_as_float(((b.i + 1) << 1) | int(b.bad)));
    __threadfence();
    last = atomicAdd(count + r, 1u) == unsigned(S - 1);
  }
  __syncthreads();
  if (!last || threadIdx.x >= 32) return;
  // The row's last block, one warp: the best of the S parts (read past L1: other blocks wrote them).
  __threadfence();
  Best t{0.f, -1, false};
  for (int k = int(threadIdx.x); k < S; k += 32) {
    const float2 p = __ldcg(part + size_t(r) * S + k);
    const int code = __float_as_int(p.y);
    t = better(t, Best{p.x, (code >> 1) - 1, bool(code & 1)});
  }
  t = warp_best(t);
  if (threadIdx.x == 0) {
    out[r] = t.bad || t.i < 0 ? -1.f : float(t.i);
    count[r] = 0;
  }
}

}  // namespace

void CudaBackend::argmax_rows(const float* x, int rows, int cols, float* out) {
  check(cols >= 1 && cols <= (1 << 24), "argmax_rows: " + std::to_string(cols) +
                                            " columns; a float holds every index exactly only up to 2^24");
  if (rows <= 0) return;
  Impl& m = *impl_;
  // Segments a row: enough blocks for two an SM, each thread at least kMinPerThread values.
  const int most = std::max(1, cols / (kThreads * kMinPerThread));
  const int S = std::clamp((2 * std::max(m.sm_count, 1) + rows - 1) / rows, 1, most);
  const int per = (cols + S - 1) / S;
  auto* part = static_cast<float2*>(m.scratch(m.argmax_part, size_t(rows) * S * sizeof(float2)));
  auto* count = static_cast<unsigned*>(
      m.counter_scratch(m.argmax_count, size_t(rows) * sizeof(unsigned), "cudaMemsetAsync (argmax counters)"));
  cuda::pdl_launch(m, argmax_rows_kernel, unsigned(rows * S), kThreads, "argmax_rows kernel", x, cols, S, per, part,
                   count, out);
}

}  // namespace wren
