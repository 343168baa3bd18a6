// CUDA backend: element-wise ops (add, SiTU-GLU, sigmoid gate) over flat f32 device buffers.
// Layout: any [T, n] row-major buffer, treated as one flat array; grid-stride loops.
#include "backends/cuda/cuda_common.cuh"

namespace wren {

namespace {

constexpr int kThreads = 256;

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, size_t n) {
  cuda::pdl_trigger();  // an ordinary launch: a programmatic dependent behind it may start now
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void situ_glu_kernel(const float* __restrict__ g, const float* __restrict__ u, size_t n, float b1,
                                float b2, float* __restrict__ out) {
  cuda::pdl_trigger();  // an ordinary launch: a programmatic dependent behind it may start now
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = cuda::situ_f(g[i], u[i], b1, b2);
}

__global__ void silu_glu_kernel(const float* __restrict__ g, const float* __restrict__ u, size_t n,
                                float* __restrict__ out) {
  cuda::pdl_trigger();  // an ordinary launch: a programmatic dependent behind it may start now
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = g[i] * cuda::sigmoid_f(g[i]) * u[i];
}

__global__ void sigmoid_gate_kernel(float* __restrict__ y, const float* __restrict__ gate, size_t n) {
  cuda::pdl_trigger();  // an ordinary launch: a programmatic dependent behind it may start now
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] *= cuda::sigmoid_f(gate[i]);
}

}  // namespace

void CudaBackend::add(float* y, const float* x, size_t n) {
  if (n == 0) return;
  add_kernel<<<cuda::grid_for(n, kThreads), kThreads, 0, impl_->stream>>>(y, x, n);
  impl_->launched("add kernel");
}

void CudaBackend::situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* out) {
  const size_t N = size_t(T) * n;
  if (N == 0) return;
  situ_glu_kernel<<<cuda::grid_for(N, kThreads), kThreads, 0, impl_->stream>>>(g, u, N, b1, b2, out);
  impl_->launched("situ_glu kernel");
}

void CudaBackend::silu_glu(const float* g, const float* u, int T, int n, float* out) {
  const size_t N = size_t(T) * n;
  if (N == 0) return;
  silu_glu_kernel<<<cuda::grid_for(N, kThreads), kThreads, 0, impl_->stream>>>(g, u, N, out);
  impl_->launched("silu_glu kernel");
}

void CudaBackend::sigmoid_gate(float* y, const float* gate, size_t n) {
  if (n == 0) return;
  sigmoid_gate_kernel<<<cuda::grid_for(n, kThreads), kThreads, 0, impl_->stream>>>(y, gate, n);
  impl_->launched("sigmoid_gate kernel");
}

}  // namespace wren
