// CUDA backend: benchmark helpers (`wren bench layers` op table, timing prints of the CUDA tests):
// device time of recorded work through a CUDA graph and CUDA events, and the reference copy kernel
// a bandwidth ratio is taken against (docs/gpu-method.md#kda-decode).
#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_common.cuh"

namespace wren {

using cuda::check_cuda;

namespace {

/// dst = src, 16-byte loads and stores, grid-stride; the tail (n % 4) element by element.
__global__ void copy_kernel_f4(const float4* __restrict__ src, float4* __restrict__ dst, size_t n4,
                               const float* tail_src, float* tail_dst, int tail) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) dst[i] = src[i];
  if (blockIdx.x == 0 && int(threadIdx.x) < tail) tail_dst[threadIdx.x] = tail_src[threadIdx.x];
}

}  // namespace

void CudaBackend::copy_kernel(const float* src, size_t n, float* dst) {
  Impl& m = *impl_;
  if (n == 0) return;
  check(reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0,
        "CUDA backend: copy_kernel: buffers must be 16-byte aligned");
  const size_t n4 = n / 4;
  const int tail = int(n % 4);
  // One 16-byte copy per thread (grid-stride beyond 65535 blocks of 256).
  const unsigned grid = cuda::grid_for(n4, 256, 65535u);
  copy_kernel_f4<<<grid, 256, 0, m.stream>>>(reinterpret_cast<const float4*>(src), reinterpret_cast<float4*>(dst), n4,
                                            src + n4 * 4, dst + n4 * 4, tail);
  m.launched("copy_kernel");
}

double CudaBackend::copy_bandwidth(size_t floats) {
  float* src = alloc(floats);
  float* dst = alloc(floats);
  double t = 0;
  try {
    t = time_recorded([&](int) { copy_kernel(src, floats, dst); }, 4, 5);
  } catch (...) {
    release(src);
    release(dst);
    throw;
  }
  release(src);
  release(dst);
  return 2.0 * double(floats) * sizeof(float) / t;
}

double CudaBackend::time_recorded(const std::function<void(int)>& op, int n, int reps) {
  Impl& m = *impl_;
  check(n >= 1 && reps >= 1, "CUDA backend: time_recorded: n and reps must be >= 1");
  check(!m.capturing, "CUDA backend: time_recorded while a graph is being recorded");
  check_cuda(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (time_recorded)");
  check_cuda(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture (time_recorded)");
  m.capturing = true;
  cudaGraph_t g = nullptr;
  try {
    for (int i = 0; i < n; ++i) op(i);
  } catch (...) {
    m.capturing = false;
    if (cudaStreamEndCapture(m.stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  m.capturing = false;
  check_cuda(cudaStreamEndCapture(m.stream, &g), "cudaStreamEndCapture (time_recorded)");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ierr = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  check_cuda(ierr, "cudaGraphInstantiate (time_recorded)");
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  std::vector<double> t;
  cudaError_t err = cudaEventCreate(&e0);
  if (err == cudaSuccess) err = cudaEventCreate(&e1);
  if (err == cudaSuccess) err = cudaGraphLaunch(exec, m.stream);  // warm-up
  for (int r = 0; err == cudaSuccess && r < reps; ++r) {
    err = cudaEventRecord(e0, m.stream);
    if (err == cudaSuccess) err = cudaGraphLaunch(exec, m.stream);
    if (err == cudaSuccess) err = cudaEventRecord(e1, m.stream);
    if (err == cudaSuccess) err = cudaEventSynchronize(e1);
    float ms = 0;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms * 1e-3 / n);
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  check_cuda(err, "time_recorded (graph launch / events)");
  ++m.stats.host_syncs;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace wren
