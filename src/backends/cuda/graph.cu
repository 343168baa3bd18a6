// CUDA backend: decode graphs. The forward pass brackets each step with step_begin() and step_end();
// a single-token step that needs nothing from the host becomes graph_begin() ... graph_launch(), and
// every op in between is recorded by stream capture (relaxed mode, so a
// scratch buffer may still grow with cudaMalloc) instead of running. The step is re-recorded every
// time, because kernels bake per-step values into their arguments (the MLA cache length, the token
// id, scratch addresses); the executable graph is then updated in place with cudaGraphExecUpdate
// (cheap: same topology, new arguments) and instantiated again only when the update is refused.
// Launch bookkeeping: kernels recorded count as CudaStats::graph_kernels, not launches.
#include "backends/cuda/cuda_common.cuh"

namespace wren {

using cuda::check_cuda;

bool CudaBackend::step_begin(const StepInfo& s) {
  if (!s.may_record || s.tokens != 1 || s.host_midway) return false;
  for (int i = 0; i < s.n_moe; ++i)
    if (!routed_moe_on_device(s.moe[i].params, *s.moe[i].weights)) return false;
  return graph_begin();
}

bool CudaBackend::graph_begin() {
  Impl& m = *impl_;
  if (m.capturing) return false;
  check_cuda(cudaGetLastError(), "before graph capture");
  check_cuda(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  m.capturing = true;
  return true;
}

void CudaBackend::graph_launch() {
  Impl& m = *impl_;
  check(m.capturing, "CUDA backend: graph_launch without graph_begin");
  cudaGraph_t g = nullptr;
  m.capturing = false;
  check_cuda(cudaStreamEndCapture(m.stream, &g), "cudaStreamEndCapture");
  if (m.graph_exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(m.graph_exec, g, &info) == cudaSuccess) {
      ++m.stats.graph_updates;
    } else {  // a different topology: build a new executable graph
      cudaGetLastError();  // the refused update is not a sticky error
      cudaGraphExecDestroy(m.graph_exec);
      m.graph_exec = nullptr;
    }
  }
  if (!m.graph_exec) {
    const cudaError_t err = cudaGraphInstantiate(&m.graph_exec, g, 0);
    if (err != cudaSuccess) {
      cudaGraphDestroy(g);
      m.graph_exec = nullptr;
      check_cuda(err, "cudaGraphInstantiate");
    }
    ++m.stats.graph_instantiations;
  }
  cudaGraphDestroy(g);
  check_cuda(cudaGraphLaunch(m.graph_exec, m.stream), "cudaGraphLaunch");
  ++m.stats.graph_launches;
  // Buffers replaced while recording: the new graph names their successors and earlier work on
  // them finished before this step began (each step ends with a synchronizing copy), but cudaFree
  // waits for the device anyway.
  for (void* p : m.deferred_free) check_cuda(cudaFree(p), "cudaFree (deferred scratch)");
  m.deferred_free.clear();
}

void CudaBackend::graph_abort() noexcept {
  Impl& m = *impl_;
  if (!m.capturing) return;
  m.capturing = false;
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(m.stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();  // an invalidated capture leaves an error behind; the caller reports its own
}

}  // namespace wren
