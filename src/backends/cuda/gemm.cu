// CUDA backend: embedding lookup and the f32 GEMM/GEMV; a weight in a packed format (BF16, Q8_ROW,
// Q4_G64) goes to gemm_quant.cu.
// Layout: W [rows, cols] row-major (PyTorch Linear [out, in]); x [T, cols]; y [T, rows]; all f32.
//
// The GEMM reproduces cpu::dot's order exactly: a group of 8 lanes owns one output row; lane j
// accumulates the products at columns i ≡ j (mod 8) in increasing i (one f32 partial per token),
// then the group combines the 8 partials with xor-1, xor-2, xor-4 shuffles, which is the CPU's tree
// ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) (f32 addition commutes). Built with -fmad=false, the result
// is bit-identical to the CPU backend. A block has 256 threads = 32 rows; blockIdx.y walks token
// tiles of TT, so each weight element is read once per tile.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/gemm_quant.cuh"
#include "backends/cuda/gemv_tc.cuh"

namespace wren {

namespace {

constexpr int kGemmThreads = 256;
constexpr int kRowsPerBlock = kGemmThreads / 8;

template <int TT>
__global__ void gemm_kernel(const float* __restrict__ W, const float* __restrict__ x, int T, int rows,
                            int cols, float* __restrict__ y) {
  // Lets a programmatic dependent launch behind this kernel (the KDA decode step, a decode weight
  // stream) start its blocks and state or weight loads now; it waits for this kernel before reading y.
  cuda::pdl_trigger();
  const int lane8 = threadIdx.x & 7;
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 3);
  const int t0 = blockIdx.y * TT;
  if (row >= rows) return;  // whole 8-lane groups leave together; shuffles use the group mask
  const unsigned mask = 0xffu << (threadIdx.x & 24);
  const float* w = W + size_t(row) * cols;
  float acc[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = 0.f;
  const int nt = T - t0 < TT ? T - t0 : TT;
  for (int i = lane8; i < cols; i += 8) {
    const float wv = __ldg(w + i);
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
      if (tt < nt) acc[tt] += wv * __ldg(x + size_t(t0 + tt) * cols + i);
  }
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    float s = acc[tt];
    s = s + __shfl_xor_sync(mask, s, 1);
    s = s + __shfl_xor_sync(mask, s, 2);
    s = s + __shfl_xor_sync(mask, s, 4);
    if (lane8 == 0 && tt < nt) y[size_t(t0 + tt) * rows + row] = s;
  }
}

/// Decode GEMV (T = 1) of a matrix with few rows (rows <= kFewRows: the K3/Kimi Linear f_a, b_proj,
/// router, q_a, kv_a projections), where gemm_kernel's 32-row blocks fill only a few SMs and each
/// lane waits on its loads one column at a time (~106 µs at cols 7168 whatever the row count, run
/// 18). One block per row: all threads stage the row and x in shared memory first (every load in
/// flight at once; 16-byte loads when `vec`), then 8 threads form cpu::dot's 8 partial sums over
/// columns i ≡ j (mod 8) in increasing i and the same xor tree as gemm_kernel: the same sums in
/// the same order, so bit-identical to it and to the CPU.
constexpr int kFewRows = 4096;
constexpr int kMaxDevices = 64;  ///< devices whose shared-memory opt-in is remembered (others: set every call)

__global__ void __launch_bounds__(kGemmThreads) gemv_row_kernel(const float* __restrict__ W, const float* __restrict__ x,
                                                                int cols, bool vec, float* __restrict__ y) {
  // Lets a programmatic dependent launch behind this kernel (the KDA decode step, a decode weight
  // stream) start its blocks and state or weight loads now; it waits for this kernel before reading y.
  cuda::pdl_trigger();
  extern __shared__ __align__(16) float sm[];
  const int row = blockIdx.x, pad = (cols + 3) & ~3;
  float* ws = sm;
  float* xs = sm + pad;
  const float* w = W + size_t(row) * cols;
  if (vec) {
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* ws4 = reinterpret_cast<float4*>(ws);
    float4* xs4 = reinterpret_cast<float4*>(xs);
#pragma unroll 4
    for (int i = threadIdx.x; i < cols / 4; i += kGemmThreads) {
      ws4[i] = __ldg(w4 + i);
      xs4[i] = __ldg(x4 + i);
    }
  } else {
#pragma unroll 4
    for (int i = threadIdx.x; i < cols; i += kGemmThreads) {
      ws[i] = __ldg(w + i);
      xs[i] = __ldg(x + i);
    }
  }
  __syncthreads();
  if (threadIdx.x < 8) {
    float acc = 0.f;
#pragma unroll 16
    for (int i = threadIdx.x; i < cols; i += 8) acc += ws[i] * xs[i];
    acc = acc + __shfl_xor_sync(0xffu, acc, 1);
    acc = acc + __shfl_xor_sync(0xffu, acc, 2);
    acc = acc + __shfl_xor_sync(0xffu, acc, 4);
    if (threadIdx.x == 0) y[row] = acc;
  }
}

/// Up to kArgIds token ids passed by value (decode: no host -> device copy, so the step can be
/// recorded into a graph with the id baked into the kernel's arguments).
constexpr int kArgIds = 8;
struct ArgIds {
  int id[kArgIds];
};

__global__ void embed_kernel(const float* __restrict__ table, const int* __restrict__ ids,
                             const float* __restrict__ fids, int rows, ArgIds small, int D, float* __restrict__ x) {
  const int t = blockIdx.x;
  const float* src = table + size_t(ids ? ids[t] : fids ? cuda::float_row(fids[t], rows) : small.id[t]) * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) x[size_t(t) * D + i] = src[i];
}

}  // namespace

void CudaBackend::embed(const DenseWeight& table, const int* ids, int T, float* x) {
  Impl& m = *impl_;
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= table.rows)
      throw Error("token id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
                  std::to_string(table.rows) + ")");
  if (table.format != WFormat::F32) {  // packed table: decode the rows (dequant_row's values)
    const cuda::QuantView qv = cuda::quant_view(m, table, "embed");
    if (T <= kArgIds || m.capturing) {  // ids by value: no host -> device copy (graph-capturable decode step)
      for (int t = 0; t < T; ++t) {
        cuda::launch_decode_row(qv, ids[t], x + size_t(t) * table.cols, m.stream);
        if (t + 1 < T) m.launched("embed decode kernel");
      }
    } else {
      int* dids = static_cast<int*>(m.scratch(m.ids, size_t(T) * sizeof(int)));
      cuda::check_cuda(cudaMemcpyAsync(dids, ids, size_t(T) * sizeof(int), cudaMemcpyHostToDevice, m.stream),
                       "cudaMemcpyAsync (embed ids)");
      cuda::launch_decode_rows(qv, dids, T, x, m.stream);
    }
    m.launched("embed decode kernel");
    return;
  }
  const float* dt = m.dense(table, "embed");
  if (T > kArgIds && m.capturing) {  // a recorded batched step: groups of kArgIds ids by value
    for (int t0 = 0; t0 < T; t0 += kArgIds) {
      const int n = std::min(kArgIds, T - t0);
      ArgIds g{};
      for (int t = 0; t < n; ++t) g.id[t] = ids[t0 + t];
      embed_kernel<<<n, 256, 0, m.stream>>>(dt, nullptr, nullptr, 0, g, int(table.cols), x + size_t(t0) * table.cols);
      m.launched("embed kernel");
    }
    return;
  }
  ArgIds small{};
  int* dids = nullptr;
  if (T <= kArgIds) {
    for (int t = 0; t < T; ++t) small.id[t] = ids[t];
  } else {
    dids = static_cast<int*>(m.scratch(m.ids, size_t(T) * sizeof(int)));
    // Pageable source: the copy returns once `ids` is staged, so the caller may reuse it.
    cuda::check_cuda(cudaMemcpyAsync(dids, ids, size_t(T) * sizeof(int), cudaMemcpyHostToDevice, m.stream),
                     "cudaMemcpyAsync (embed ids)");
  }
  embed_kernel<<<T, 256, 0, m.stream>>>(dt, dids, nullptr, 0, small, int(table.cols), x);
  m.launched("embed kernel");
}

void CudaBackend::embed_ids(const DenseWeight& table, const float* ids, int T, float* x) {
  Impl& m = *impl_;
  if (T <= 0) return;
  if (table.format != WFormat::F32) {  // packed table: decode the rows (dequant_row's values)
    cuda::launch_decode_rows_f(cuda::quant_view(m, table, "embed_ids"), ids, T, x, m.stream);
    m.launched("embed decode kernel");
    return;
  }
  embed_kernel<<<T, 256, 0, m.stream>>>(m.dense(table, "embed_ids"), nullptr, ids, int(table.rows), ArgIds{},
                                        int(table.cols), x);
  m.launched("embed kernel");
}

void CudaBackend::gemm(const DenseWeight& W, const float* x, int T, float* y) {
  Impl& m = *impl_;
  if (T <= 0 || W.rows == 0) return;
  if (cuda::lt_gemm(m, W, x, T, y)) return;  // fast mode, T >= 2: tensor cores (gemm_lt.cu)
  if (cuda::gemv_tc(m, W, x, T, y)) return;  // fast mode, T = 1, BF16: tensor cores (gemv_tc.cu)
  if (W.format != WFormat::F32) {
    cuda::launch_gemm_quant(cuda::quant_view(m, W, "gemm"), x, T, y, m.stream);
    m.launched("gemm (packed weight) kernel");
    return;
  }
  const float* dw = m.dense(W, "gemm");
  const int rows = int(W.rows), cols = int(W.cols);
  const unsigned gx = unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const size_t row_smem = 2 * size_t((cols + 3) & ~3) * sizeof(float);
  if (T == 1 && rows <= kFewRows && row_smem <= size_t(m.max_smem_optin)) {
    // The opt-in is a property of the kernel on a device: kept per device, raised as needed.
    static std::atomic<int> optin[kMaxDevices];
    const bool tracked = m.device >= 0 && m.device < kMaxDevices;
    if (row_smem > 48 * 1024 && (!tracked || int(row_smem) > optin[m.device].load())) {
      cuda::check_cuda(cudaFuncSetAttribute(gemv_row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(row_smem)),
                       "cudaFuncSetAttribute (gemv shared memory)");
      if (tracked) optin[m.device].store(int(row_smem));
    }
    const bool vec = cols % 4 == 0 && ((reinterpret_cast<uintptr_t>(dw) | reinterpret_cast<uintptr_t>(x)) & 15) == 0;
    gemv_row_kernel<<<unsigned(rows), kGemmThreads, row_smem, m.stream>>>(dw, x, cols, vec, y);
    m.launched("gemv (few rows) kernel");
    return;
  }
  if (T == 1) {
    gemm_kernel<1><<<dim3(gx, 1), kGemmThreads, 0, m.stream>>>(dw, x, T, rows, cols, y);
  } else if (T <= 4) {
    gemm_kernel<4><<<dim3(gx, 1), kGemmThreads, 0, m.stream>>>(dw, x, T, rows, cols, y);
  } else {
    gemm_kernel<8><<<dim3(gx, unsigned((T + 7) / 8)), kGemmThreads, 0, m.stream>>>(dw, x, T, rows, cols, y);
  }
  m.launched("gemm kernel");
}

void CudaBackend::gemm_mapped(const DenseWeight& W, const float* a, const InputMap& map, int T, float* x, float* y) {
  // With set_gemv_map, fast mode, one token, BF16: the map in the GEMV's input loads (x untouched);
  // else the two ops. x must be aligned as the two ops' GEMV would need it: else the fused form
  // would take a product the two ops give to another kernel, and the bits would depend on the hook.
  if (impl_->gemv_map && T > 0 && W.rows > 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      cuda::gemv_tc_mapped(*impl_, W, a, map, T, y))
    return;
  Backend::gemm_mapped(W, a, map, T, x, y);
}

void CudaBackend::set_gemv_map(bool on) { impl_->gemv_map = on; }

void CudaBackend::gemm_batch(const GemmJob* jobs, int n, int T) {
  constexpr int kChunk = 8;  // gemv_tc_batch's jobs a launch
  for (int i0 = 0; i0 < n; i0 += kChunk) {
    const int c = std::min(kChunk, n - i0);
    bool taken[kChunk] = {};
    cuda::gemv_tc_batch(*impl_, jobs + i0, c, T, taken);
    // The jobs' inputs are read-only for the whole batch (jobs are independent), so a cuBLASLt
    // job with the same input as the cuBLASLt job just before it reuses that job's BF16 copy of
    // it: a layer's projections of one normed input convert it once (run 39b: 72 conversions, 0.31
    // ms of a 16-row Kimi-Linear-48B-size step).
    const float* lt_x = nullptr;
    int lt_cols = 0;
    for (int i = 0; i < c; ++i) {
      const GemmJob& j = jobs[i0 + i];
      if (taken[i] || T <= 0 || j.W->rows == 0) continue;  // nothing to do (as gemm)
      if (cuda::lt_gemm(*impl_, *j.W, j.x, T, j.y, j.x == lt_x && int(j.W->cols) == lt_cols)) {
        lt_x = j.x, lt_cols = int(j.W->cols);
        continue;
      }
      gemm(*j.W, j.x, T, j.y);
      lt_x = nullptr;
    }
  }
}

}  // namespace wren
