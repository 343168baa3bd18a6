// CUDA backend: element-wise ops (add, add2, SiTU-GLU, SiLU-GLU, sigmoid gate) over flat f32 device buffers.
// Layout: any [T, n] row-major buffer, treated as one flat array; grid-stride loops. Each is a
// programmatic dependent launch (docs/gpu-method.md#programmatic-dependent-launch) that waits for
// the kernel before it first thing.
#include "backends/cuda/cuda_common.cuh"

namespace wren {

namespace {

constexpr int kThreads = 256;

/// y += x (add), or y += x + x2 with x2 (add2; x is only read).
__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ x2, size_t n) {
  cuda::pdl_wait();  // launched as a programmatic dependent (pdl_launch): nothing is touched before
  cuda::pdl_trigger();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = cuda::plus_delta(y[i], x, x2, i);
}

__global__ void situ_glu_kernel(const float* __restrict__ g, const float* __restrict__ u, size_t n, float b1,
                                float b2, float* __restrict__ out) {
  cuda::pdl_wait();  // launched as a programmatic dependent (pdl_launch): nothing is touched before
  cuda::pdl_trigger();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = cuda::situ_f(g[i], u[i], b1, b2);
}

__global__ void silu_glu_kernel(const float* __restrict__ g, const float* __restrict__ u, size_t n,
                                float* __restrict__ out) {
  cuda::pdl_wait();  // launched as a programmatic dependent (pdl_launch): nothing is touched before
  cuda::pdl_trigger();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = g[i] * cuda::sigmoid_f(g[i]) * u[i];
}

__global__ void sigmoid_gate_kernel(float* __restrict__ y, const float* __restrict__ gate, size_t n) {
  cuda::pdl_wait();  // launched as a programmatic dependent (pdl_launch): nothing is touched before
  cuda::pdl_trigger();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] *= cuda::sigmoid_f(gate[i]);
}

}  // namespace

void CudaBackend::add(float* y, const float* x, size_t n) {
  if (n == 0) return;
  cuda::pdl_launch(*impl_, add_kernel, cuda::grid_for(n, kThreads), kThreads, "add kernel", y, x,
                   static_cast<const float*>(nullptr), n);
}

void CudaBackend::add2(float* y, float* x, const float* x2, size_t n) {
  if (n == 0) return;
  cuda::pdl_launch(*impl_, add_kernel, cuda::grid_for(n, kThreads), kThreads, "add2 kernel", y, x, x2, n);
}

void CudaBackend::situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* out) {
  const size_t N = size_t(T) * n;
  if (N == 0) return;
  cuda::pdl_launch(*impl_, situ_glu_kernel, cuda::grid_for(N, kThreads), kThreads, "situ_glu kernel", g, u, N, b1, b2, out);
}

void CudaBackend::silu_glu(const float* g, const float* u, int T, int n, float* out) {
  const size_t N = size_t(T) * n;
  if (N == 0) return;
  cuda::pdl_launch(*impl_, silu_glu_kernel, cuda::grid_for(N, kThreads), kThreads, "silu_glu kernel", g, u, N, out);
}

void CudaBackend::sigmoid_gate(float* y, const float* gate, size_t n) {
  if (n == 0) return;
  cuda::pdl_launch(*impl_, sigmoid_gate_kernel, cuda::grid_for(n, kThreads), kThreads, "sigmoid_gate kernel", y, gate, n);
}

}  // namespace wren
