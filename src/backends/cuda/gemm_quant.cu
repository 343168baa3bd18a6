// CUDA backend: GEMV/GEMM on packed dense weights, y[T, rows] = x[T, cols] · Wᵀ, for BF16, Q8_ROW
// and Q4_G64 (layouts in ops/weights.h), plus the row decode used by embed and MLA.
//
// Correctness first: one warp per output row, 8 rows per 256-thread block, blockIdx.y walks token
// tiles of TT (1, 4 or 8) so each weight byte is read once per tile; matrices of fewer than 2048
// rows (the small projections: b_proj, f_a, router, ...) take one 256-thread block per row instead,
// its 8 warp sums added in warp order. The packed bytes are read
// directly (16-byte loads for BF16/Q8_ROW when a row allows it, 4-byte words for Q4_G64) and
// widened to f32 in registers; the whole matrix is never dequantized in VRAM. Accumulation is f32
// with explicit FMA; the summation order differs from the CPU kernels (rows_*_scalar in
// backends/cpu/gemv_*.cpp: 8 strided partials, per-group sums), so results agree to rounding, not
// bit for bit (tests/cuda_ops_test.cpp states the tolerance). Q8_ROW applies the row scale once at
// the end (as the CPU does); Q4_G64 multiplies each lane's group partial by the group scale.
#include <string>

#include "backends/cuda/gemm_quant.cuh"

namespace wren::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRows = kThreads / kWarp;  // one warp per row
/// Below this many rows a warp per row gives fewer than ~2 waves of 8-row blocks on an H200's 132
/// SMs, so each row gets a whole block instead (gemm_quant_row_block_kernel).
constexpr int kRowBlockBelow = 2048;

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float i8_at(uint32_t w, int k) { return float(int8_t(uint8_t(w >> (8 * k)))); }

/// acc[tt] += Σ_k wv[k] · x[tt][c + k] for N consecutive columns.
template <int TT, int N>
__device__ __forceinline__ void fma_cols(const float (&wv)[N], const float* x, int cols, int c, int nt,
                                         float (&acc)[TT]) {
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    if (tt >= nt) break;
    const float* xt = x + size_t(tt) * cols + c;
    float s = acc[tt];
    if constexpr (N % 4 == 0) {
      if ((cols & 3) == 0) {  // x row start and c are 16-byte aligned
#pragma unroll
        for (int k = 0; k < N; k += 4) {
          const float4 xv = __ldg(reinterpret_cast<const float4*>(xt + k));
          s = __fmaf_rn(wv[k], xv.x, s);
          s = __fmaf_rn(wv[k + 1], xv.y, s);
          s = __fmaf_rn(wv[k + 2], xv.z, s);
          s = __fmaf_rn(wv[k + 3], xv.w, s);
        }
        acc[tt] = s;
        continue;
      }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) s = __fmaf_rn(wv[k], __ldg(xt + k), s);
    acc[tt] = s;
  }
}

/// One thread's partial dot products of row `row` with tokens x[0..nt) (x already offset to the
/// tile), `lane` of the `lanes` threads sharing the row (a warp: 32; a block: 256).
template <int TT>
__device__ void row_partials(const QuantView& v, int row, const float* x, int nt, int lane, int lanes,
                             float (&acc)[TT]) {
  const int cols = v.cols;
  if (v.format == WFormat::BF16) {
    const uint16_t* w = static_cast<const uint16_t*>(v.data) + size_t(row) * cols;
    if ((cols & 7) == 0) {  // 16-byte aligned rows: 8 bf16 per load
      for (int c = lane * 8; c < cols; c += lanes * 8) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(w + c));
        const float wv[8] = {bf16_lo(q.x), bf16_hi(q.x), bf16_lo(q.y), bf16_hi(q.y),
                             bf16_lo(q.z), bf16_hi(q.z), bf16_lo(q.w), bf16_hi(q.w)};
        fma_cols<TT, 8>(wv, x, cols, c, nt, acc);
      }
    } else {
      for (int c = lane; c < cols; c += lanes) {
        const float wv[1] = {__uint_as_float(uint32_t(__ldg(w + c)) << 16)};
        fma_cols<TT, 1>(wv, x, cols, c, nt, acc);
      }
    }
  } else if (v.format == WFormat::Q8_ROW) {
    const int8_t* w = static_cast<const int8_t*>(v.data) + size_t(row) * cols;
    if ((cols & 15) == 0) {  // 16-byte aligned rows: 16 int8 per load
      for (int c = lane * 16; c < cols; c += lanes * 16) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(w + c));
        float wv[16];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          wv[k] = i8_at(q.x, k);
          wv[4 + k] = i8_at(q.y, k);
          wv[8 + k] = i8_at(q.z, k);
          wv[12 + k] = i8_at(q.w, k);
        }
        fma_cols<TT, 16>(wv, x, cols, c, nt, acc);
      }
    } else {
      for (int c = lane; c < cols; c += lanes) {
        const float wv[1] = {float(w[c])};
        fma_cols<TT, 1>(wv, x, cols, c, nt, acc);
      }
    }
  } else {  // Q4_G64: lane takes one 4-byte word = 4 low-nibble columns b..b+3 and 4 high ones b+32..b+35
    const int groups = int(q4::groups(cols));
    const uint32_t* w = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(v.data) + size_t(row) * groups * 32);
    const float* sc = v.scale + size_t(row) * groups;
    for (int i = lane; i < groups * 8; i += lanes) {
      const int g = i >> 3, c = g * 64 + (i & 7) * 4;
      const uint32_t q = __ldg(w + i);
      const float s = __ldg(sc + g);
      float lo[4], hi[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        lo[k] = float(q4::nibble_q(q >> (8 * k)));
        hi[k] = float(q4::nibble_q(q >> (8 * k + 4)));
      }
      float part[TT];
#pragma unroll
      for (int tt = 0; tt < TT; ++tt) part[tt] = 0.f;
      if (g * 64 + 64 <= cols) {
        fma_cols<TT, 4>(lo, x, cols, c, nt, part);
        fma_cols<TT, 4>(hi, x, cols, c + 32, nt, part);
      } else {  // last partial group: padded columns (q = 0) have no x
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (c + k < cols) {
            const float wv[1] = {lo[k]};
            fma_cols<TT, 1>(wv, x, cols, c + k, nt, part);
          }
          if (c + 32 + k < cols) {
            const float wv[1] = {hi[k]};
            fma_cols<TT, 1>(wv, x, cols, c + 32 + k, nt, part);
          }
        }
      }
#pragma unroll
      for (int tt = 0; tt < TT; ++tt) acc[tt] = __fmaf_rn(part[tt], s, acc[tt]);
    }
  }
}

template <int TT>
__global__ void __launch_bounds__(kThreads) gemm_quant_kernel(QuantView v, const float* __restrict__ x, int T,
                                                                float* __restrict__ y) {
  // Lets a programmatic dependent launch behind this kernel (the KDA decode step, a decode weight
  // stream) start its blocks and state or weight loads now; it waits for this kernel before reading y.
  cuda::pdl_trigger();
  const int lane = threadIdx.x & (kWarp - 1);
  const int row = blockIdx.x * kRows + (threadIdx.x >> 5);
  const int t0 = blockIdx.y * TT;
  if (row >= v.rows) return;  // whole warps leave together
  const int nt = T - t0 < TT ? T - t0 : TT;
  float acc[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = 0.f;
  row_partials<TT>(v, row, x + size_t(t0) * v.cols, nt, lane, kWarp, acc);
  const float rs = v.format == WFormat::Q8_ROW ? v.scale[row] : 1.f;
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    float s = acc[tt];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
    if (lane == 0 && tt < nt) y[size_t(t0 + tt) * v.rows + row] = s * rs;
  }
}

/// Skinny shapes (few rows): one block per row, its 256 threads striding the columns (8 times the
/// loads in flight per row of the warp-per-row kernel), then the 8 warp sums added in warp order.
template <int TT>
__global__ void __launch_bounds__(kThreads) gemm_quant_row_block_kernel(QuantView v, const float* __restrict__ x,
                                                                          int T, float* __restrict__ y) {
  // Lets a programmatic dependent launch behind this kernel (the KDA decode step, a decode weight
  // stream) start its blocks and state or weight loads now; it waits for this kernel before reading y.
  cuda::pdl_trigger();
  __shared__ float red[kRows][TT];
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x >> 5;
  const int row = blockIdx.x, t0 = blockIdx.y * TT;
  const int nt = T - t0 < TT ? T - t0 : TT;
  float acc[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = 0.f;
  row_partials<TT>(v, row, x + size_t(t0) * v.cols, nt, threadIdx.x, kThreads, acc);
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    float s = acc[tt];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
    if (lane == 0) red[warp][tt] = s;
  }
  __syncthreads();
  if (int(threadIdx.x) < nt) {
    float s = red[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kRows; ++w) s += red[w][threadIdx.x];
    const float rs = v.format == WFormat::Q8_ROW ? v.scale[row] : 1.f;
    y[size_t(t0 + threadIdx.x) * v.rows + row] = s * rs;
  }
}

__global__ void decode_rows_kernel(QuantView v, const int* __restrict__ ids, const float* __restrict__ fids, int row,
                                   float* __restrict__ out) {
  const int i = blockIdx.x;
  const int r = ids ? ids[i] : fids ? float_row(fids[i], v.rows) : row >= 0 ? row : i;
  for (int c = threadIdx.x; c < v.cols; c += blockDim.x) out[size_t(i) * v.cols + c] = quant_at(v, r, c);
}

}  // namespace

QuantView quant_view(const CudaBackend::Impl& m, const DenseWeight& w, const char* op) {
  QuantView v;
  v.format = w.format;
  v.rows = int(w.rows), v.cols = int(w.cols);
  const auto it = m.weights.find(w.data);
  if (it == m.weights.end())
    throw Error(std::string("CUDA backend: ") + op + ": " + wformat_name(w.format) + " weight [" +
                std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                "] has no device copy (call CudaBackend::upload first)");
  v.data = it->second.ptr;
  if (w.format == WFormat::Q8_ROW || w.format == WFormat::Q4_G64) {
    const auto s = w.scale ? m.weights.find(w.scale) : m.weights.end();
    if (s == m.weights.end())
      throw Error(std::string("CUDA backend: ") + op + ": the scale of " + wformat_name(w.format) + " weight [" +
                  std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] has no device copy");
    v.scale = static_cast<const float*>(s->second.ptr);
  }
  return v;
}

void launch_gemm_quant(const QuantView& w, const float* x, int T, float* y, cudaStream_t stream) {
  if (w.rows < kRowBlockBelow) {  // a block per row: enough blocks to fill the GPU
    const unsigned gx = unsigned(w.rows);
    if (T == 1) gemm_quant_row_block_kernel<1><<<dim3(gx, 1), kThreads, 0, stream>>>(w, x, T, y);
    else if (T <= 4) gemm_quant_row_block_kernel<4><<<dim3(gx, 1), kThreads, 0, stream>>>(w, x, T, y);
    else gemm_quant_row_block_kernel<8><<<dim3(gx, unsigned((T + 7) / 8)), kThreads, 0, stream>>>(w, x, T, y);
    return;
  }
  const unsigned gx = unsigned((w.rows + kRows - 1) / kRows);
  if (T == 1) gemm_quant_kernel<1><<<dim3(gx, 1), kThreads, 0, stream>>>(w, x, T, y);
  else if (T <= 4) gemm_quant_kernel<4><<<dim3(gx, 1), kThreads, 0, stream>>>(w, x, T, y);
  else gemm_quant_kernel<8><<<dim3(gx, unsigned((T + 7) / 8)), kThreads, 0, stream>>>(w, x, T, y);
}

void launch_decode_rows(const QuantView& w, const int* ids, int n, float* out, cudaStream_t stream) {
  if (n > 0) decode_rows_kernel<<<n, 256, 0, stream>>>(w, ids, nullptr, -1, out);
}

void launch_decode_row(const QuantView& w, int row, float* out, cudaStream_t stream) {
  decode_rows_kernel<<<1, 256, 0, stream>>>(w, nullptr, nullptr, row, out);
}

void launch_decode_rows_f(const QuantView& w, const float* ids, int n, float* out, cudaStream_t stream) {
  if (n > 0) decode_rows_kernel<<<n, 256, 0, stream>>>(w, nullptr, ids, -1, out);
}

}  // namespace wren::cuda
