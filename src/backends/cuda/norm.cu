// CUDA backend: RMSNorm and the AttnRes mix (docs/model.md#attnres).
// Layout: x, y [T, n] f32 row-major, w [n]; mix entries are T×D device buffers, w = norm ⊙ proj [D].
//
// One block per token row. Sums of squares and AttnRes scores are accumulated in f64 (a block
// tree instead of the CPU's sequential f64 loop: the two differ by ~1e-16 relative, far below the
// f32 rounding that follows); the 1/rms factor, the softmax weights and the f32 mix sum are then
// formed exactly as on the CPU (same expressions, same entry order, no FMA contraction).
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"

namespace wren {

namespace {

constexpr int kNormThreads = 256;
constexpr int kMaxMix = 32;  ///< AttnRes entries per mix (K3 needs <= 9: ceil(93/B) + 1)

/// A thread's elements of a row of n, v[j] = p[tid + j·kNormThreads] (0 past n), with all of its
/// loads in flight at once. kNc: through the read-only cache (a weight, never written by a step).
template <bool kNc, int N>
__device__ __forceinline__ void load_row(const float* __restrict__ p, int n, float (&v)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    v[j] = i < n ? (kNc ? __ldg(p + i) : p[i]) : 0.f;
  }
}

/// The instance of a row kernel for rows of n: the fewest of 4, 8, 16, 32 elements a thread that
/// hold the row in registers, else 0 (a strided loop). `pick(std::integral_constant<int, K>{})`
/// returns kernel<K>.
template <class Pick>
auto row_kernel(int n, Pick pick) {
  const int per = (n + kNormThreads - 1) / kNormThreads;
  return per <= 4    ? pick(std::integral_constant<int, 4>{})
         : per <= 8  ? pick(std::integral_constant<int, 8>{})
         : per <= 16 ? pick(std::integral_constant<int, 16>{})
         : per <= 32 ? pick(std::integral_constant<int, 32>{})
                     : pick(std::integral_constant<int, 0>{});
}

/// kPer > 0: the row stays in registers (n <= kPer · kNormThreads; all of a thread's loads issue
/// at once and the row is read once); kPer = 0: any n, the row read twice. Same sums in the same
/// order either way (a thread's elements i = tid, tid + 256, ...; the zeros past n add nothing).
/// With `delta` (add_rms_norm) x[i] += delta[i] first and the sum x[i] written back, then the norm
/// of the new row (add_kernel's sum: bit-identical to add then rms_norm); with `delta2` as well
/// (add2_rms_norm) x[i] += delta[i] + delta2[i] (add_kernel's sum, plus_delta); without delta x is only read.
template <int kPer>
__global__ void rms_norm_kernel(float* __restrict__ x, const float* __restrict__ delta, const float* __restrict__ delta2,
                                int n, const float* __restrict__ w, float eps, float* __restrict__ y) {
  // The weight is never written by a step's kernels: its loads issue before the wait, so they
  // overlap the kernel before this one instead of adding a memory latency after the reduction.
  float wv[kPer > 0 ? kPer : 1];
  if constexpr (kPer > 0) load_row<true>(w, n, wv);
  cuda::pdl_wait();  // launched as a programmatic dependent (pdl_launch): only w is read before
  cuda::pdl_trigger();
  __shared__ double red[32];
  float* xr = x + size_t(blockIdx.x) * n;
  const float* dr = delta ? delta + size_t(blockIdx.x) * n : nullptr;
  const float* d2 = delta2 ? delta2 + size_t(blockIdx.x) * n : nullptr;  // with delta only
  float* yr = y + size_t(blockIdx.x) * n;
  double ss = 0;
  float xv[kPer > 0 ? kPer : 1];
  if constexpr (kPer > 0) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kNormThreads;
      xv[j] = i < n ? xr[i] : 0.f;
      if (dr && i < n) xr[i] = xv[j] = cuda::plus_delta(xv[j], dr, d2, i);
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) ss += double(xv[j]) * xv[j];
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = dr ? (xr[i] = cuda::plus_delta(xr[i], dr, d2, i)) : xr[i];  // a thread re-reads only its own elements
      ss += double(v) * v;
    }
  }
  ss = cuda::block_sum(ss, red);
  const float inv = float(1.0 / sqrt(ss / n + eps));
  if constexpr (kPer > 0) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kNormThreads;
      if (i < n) yr[i] = xv[j] * inv * wv[j];
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
  }
}

/// Entry pointers passed by value (kernel parameters), at most kMaxMix.
struct MixEntries {
  const float* p[kMaxMix];
};

/// One block of kNormThreads per row. Each entry's row is read with all of a thread's loads in
/// flight at once (kPer > 0: elements i = tid, tid + 256, ... in registers; kPer = 0: any D, a
/// strided loop), its f64 dot with w and sum of squares reduced per warp by a butterfly, and the
/// warp partials of every entry wait in shared memory for one barrier; thread e then adds entry
/// e's 8 warp partials in warp order. (Until 2026-12-07 each entry took two block_sums, i.e. four
/// barriers, and a loop of one load at a time: run 46 profiled 28 µs a call at K3 size, D = 7168,
/// 2 entries: 7.5% of a decode token's device time.) Softmax and the f32 mix as before.
template <int kPer>
__global__ void attnres_mix_kernel(MixEntries entries, int n_entries, int D, const float* __restrict__ w,
                                   float eps, float* __restrict__ out) {
  // w is never written by a step's kernels: its loads go out before the wait (as rms_norm_kernel).
  float wv[kPer > 0 ? kPer : 1];
  if constexpr (kPer > 0) load_row<true>(w, D, wv);
  cuda::pdl_wait();  // launched as a programmatic dependent (pdl_launch): only w is read before
  cuda::pdl_trigger();
  constexpr int kWarps = kNormThreads / cuda::kWarp;
  __shared__ double part[kMaxMix][kWarps][2];  // [entry][warp] {w·v, v·v}
  __shared__ float prob[kMaxMix];
  __shared__ double score[kMaxMix];
  const int warp = threadIdx.x / cuda::kWarp, lane = threadIdx.x % cuda::kWarp;
  const size_t off = size_t(blockIdx.x) * D;
  for (int e = 0; e < n_entries; ++e) {
    const float* v = entries.p[e] + off;
    double dotw = 0, ss = 0;
    if constexpr (kPer > 0) {
      float xv[kPer];
      load_row<false>(v, D, xv);
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        dotw += double(xv[j]) * wv[j];
        ss += double(xv[j]) * xv[j];
      }
    } else {
      for (int i = threadIdx.x; i < D; i += kNormThreads) {
        dotw += double(v[i]) * w[i];
        ss += double(v[i]) * v[i];
      }
    }
    for (int o = cuda::kWarp / 2; o > 0; o >>= 1) {
      dotw += __shfl_xor_sync(cuda::kFull, dotw, o);
      ss += __shfl_xor_sync(cuda::kFull, ss, o);
    }
    if (lane == 0) part[e][warp][0] = dotw, part[e][warp][1] = ss;
  }
  __syncthreads();
  if (threadIdx.x < n_entries) {  // entry e's sums: its warp partials in warp order
    const int e = threadIdx.x;
    double dotw = 0, ss = 0;
    for (int k = 0; k < kWarps; ++k) dotw += part[e][k][0], ss += part[e][k][1];
    score[e] = dotw / sqrt(ss / D + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // softmax over entries in f64, in the CPU's order
    double mx = -INFINITY;
    for (int e = 0; e < n_entries; ++e) mx = fmax(mx, score[e]);
    double sum = 0;
    for (int e = 0; e < n_entries; ++e) sum += (score[e] = exp(score[e] - mx));
    for (int e = 0; e < n_entries; ++e) prob[e] = float(score[e] / sum);
  }
  __syncthreads();
  if constexpr (kPer > 0) {  // o = Σ_e p_e·v_e in entry order (the CPU's f32 sum), a thread's loads at once
    float o[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) o[j] = 0.f;
    for (int e = 0; e < n_entries; ++e) {
      const float* v = entries.p[e] + off;
      const float p = prob[e];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = threadIdx.x + j * kNormThreads;
        if (i < D) o[j] += p * v[i];
      }
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kNormThreads;
      if (i < D) out[off + i] = o[j];
    }
  } else {
    for (int i = threadIdx.x; i < D; i += kNormThreads) {
      float o = 0;
      for (int e = 0; e < n_entries; ++e) o += prob[e] * entries.p[e][off + i];
      out[off + i] = o;
    }
  }
}

}  // namespace

/// rms_norm (delta null; x only read), add_rms_norm (x += delta written back) or add2_rms_norm (x +=
/// delta + delta2) of T rows of n.
static void launch_rms_norm(CudaBackend::Impl& m, float* x, const float* delta, const float* delta2, int T, int n,
                            const float* wd, float eps, float* y, const char* what) {
  const auto kernel = row_kernel(n, [](auto k) { return rms_norm_kernel<decltype(k)::value>; });
  cuda::pdl_launch(m, kernel, unsigned(T), kNormThreads, what, x, delta, delta2, n, wd, eps, y);
}

void CudaBackend::rms_norm(const float* x, int T, int n, const DenseWeight& w, float eps, float* y) {
  Impl& m = *impl_;
  if (T <= 0) return;
  // The kernel writes x only when given a delta.
  launch_rms_norm(m, const_cast<float*>(x), nullptr, nullptr, T, n, m.dense(w, "rms_norm"), eps, y, "rms_norm kernel");
}

void CudaBackend::add_rms_norm(float* y, const float* x, int T, int n, const DenseWeight& w, float eps, float* out) {
  Impl& m = *impl_;
  if (T <= 0) return;
  launch_rms_norm(m, y, x, nullptr, T, n, m.dense(w, "add_rms_norm"), eps, out, "add_rms_norm kernel");
}

void CudaBackend::add2_rms_norm(float* y, float* x, const float* x2, int T, int n, const DenseWeight& w, float eps,
                                float* out) {
  Impl& m = *impl_;
  if (T <= 0) return;
  launch_rms_norm(m, y, x, x2, T, n, m.dense(w, "add2_rms_norm"), eps, out, "add2_rms_norm kernel");
}

void CudaBackend::attnres_mix(const float* const* entries, int n_entries, int T, int D, const DenseWeight& w,
                              float eps, float* out) {
  Impl& m = *impl_;
  if (n_entries < 1 || n_entries > kMaxMix)
    throw Error("CUDA backend: attnres_mix: " + std::to_string(n_entries) + " entries (supported: 1.." +
                std::to_string(kMaxMix) + ")");
  if (T <= 0) return;
  MixEntries e{};
  for (int i = 0; i < n_entries; ++i) e.p[i] = entries[i];
  const auto kernel = row_kernel(D, [](auto k) { return attnres_mix_kernel<decltype(k)::value>; });
  cuda::pdl_launch(m, kernel, unsigned(T), kNormThreads, "attnres_mix kernel", e, n_entries, D,
                   m.dense(w, "attnres_mix"), eps, out);
}

}  // namespace wren
