// CUDA backend: decode graphs. The forward pass brackets each step with step_begin() and step_end();
// a decode step that needs nothing from the host (one token, or a batched step of B sequences
// with one token each, when the forward pass offers it: ForwardOptions::graph_rows, by default
// single-token steps only) becomes graph_begin() ... graph_launch(), and
// every op in between is recorded by stream capture (relaxed mode, so a
// scratch buffer may still grow with cudaMalloc) instead of running. The step is re-recorded every
// time, because kernels bake per-step values into their arguments (the MLA cache length, the token
// id, scratch addresses); the executable graph is then updated in place with cudaGraphExecUpdate
// (cheap: same topology, new arguments) and instantiated again only when the update is refused.
// One executable graph per row count and ending (with or without the greedy ids of argmax_rows:
// graph_execs keyed by graph_key), so a server alternating batch sizes updates each in place
// instead of re-instantiating.
// A step recorded ahead (Forward::decode_greedy, StepInfo::ahead: recorded while the step before
// still runs, its id read on the device by embed_ids) goes to a second executable graph of its
// shape (slot 1 - the slot launched last), so the update never touches a graph that may be
// running; graph_launch(true) keeps it (step_hold) until step_submit launches it or step_discard
// drops it (its recorded counter zeroing then redone on the stream).
// Launch bookkeeping: kernels recorded count as CudaStats::graph_kernels, not launches.
#include "backends/cuda/cuda_common.cuh"

namespace wren {

using cuda::check_cuda;

bool CudaBackend::step_begin(const StepInfo& s) {
  Impl& m = *impl_;
  // Any step would run or update graphs before the held one (or update its own executable graph).
  check(!m.held_exec, "CUDA backend: a step begun while another is held (step_submit or step_discard first)");
  if (!s.may_record || s.tokens < 1 || s.host_midway || m.profiling || m.capturing) return false;
  for (int i = 0; i < s.n_moe; ++i)
    if (!routed_moe_on_device(s.moe[i].params, *s.moe[i].weights)) return false;
  // A batched step (T > 1 rows) runs op by op the first time its row count comes in this precision
  // mode since the last upload, so everything built lazily for its shapes (BF16 copies, cuBLASLt
  // algorithms, tables, scratch) exists before a recording, which may not wait for the host. (Run
  // 24-serve: keyed by the row count alone, a fast-mode step of a size first seen in exact mode was
  // recorded before its BF16 weight copies existed and threw.)
  const int seen = s.tokens * 2 + (m.opts.precision == GpuPrecision::Fast ? 1 : 0);
  if (s.tokens > 1 && m.eager_rows.insert(seen).second) return false;
  m.recording_ahead = s.ahead;
  m.graph_key = (s.tokens * 2 + (s.greedy_ids ? 1 : 0)) * 2 + (s.ahead ? 1 - m.last_slot : 0);
  const auto it = m.graph_execs.find(m.graph_key);
  m.graph_exec = it == m.graph_execs.end() ? nullptr : it->second;
  if (uint64_t(s.tokens) > m.stats.graph_rows_max) m.stats.graph_rows_max = uint64_t(s.tokens);
  return graph_begin();
}

bool CudaBackend::graph_begin() {
  Impl& m = *impl_;
  if (m.capturing) return false;
  check_cuda(cudaGetLastError(), "before graph capture");
  m.record_t0 = std::chrono::steady_clock::now();
  check_cuda(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  m.capturing = true;
  return true;
}

namespace {

/// graph_launch's capture end, update or instantiation, and launch.
void graph_finish(CudaBackend::Impl& m, cudaGraph_t& g) {
  check_cuda(cudaStreamEndCapture(m.stream, &g), "cudaStreamEndCapture");
  if (m.graph_exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(m.graph_exec, g, &info) == cudaSuccess) {
      ++m.stats.graph_updates;
    } else {  // a different topology: build a new executable graph
      cudaGetLastError();  // the refused update is not a sticky error
      cudaGraphExecDestroy(m.graph_exec);
      m.graph_exec = nullptr;
      if (m.graph_key > 0) m.graph_execs.erase(m.graph_key);
    }
  }
  if (!m.graph_exec) {
    const cudaError_t err = cudaGraphInstantiate(&m.graph_exec, g, 0);
    if (err != cudaSuccess) {
      cudaGraphDestroy(g);
      m.graph_exec = nullptr;
      if (m.graph_key > 0) m.graph_execs.erase(m.graph_key);
      check_cuda(err, "cudaGraphInstantiate");
    }
    ++m.stats.graph_instantiations;
  }
  cudaGraphDestroy(g);
  if (m.graph_key > 0) m.graph_execs[m.graph_key] = m.graph_exec;  // kept per row count
}

/// Launches `exec` of slot `slot` (graph_launch, step_submit).
void launch_exec(CudaBackend::Impl& m, cudaGraphExec_t exec, int slot) {
  check_cuda(cudaGraphLaunch(exec, m.stream), "cudaGraphLaunch");
  ++m.stats.graph_launches;
  m.last_slot = slot;
}

}  // namespace

void CudaBackend::graph_launch(bool hold) {
  Impl& m = *impl_;
  check(m.capturing, "CUDA backend: graph_launch without graph_begin");
  check(hold == m.recording_ahead, hold ? "CUDA backend: step_hold of a step not recorded ahead"
                                        : "CUDA backend: step_end of a step recorded ahead (step_hold)");
  cudaGraph_t g = nullptr;
  m.capturing = false;
  const int slot = m.graph_key & 1;
  cudaGraphExec_t exec = nullptr;
  try {
    graph_finish(m, g);
    exec = m.graph_exec;
    if (!hold) launch_exec(m, exec, slot);
  } catch (...) {
    m.rezero_pending();  // the step's counter zeroing never ran
    if (m.graph_key > 0) m.graph_exec = nullptr;  // owned by graph_execs (or erased)
    m.graph_key = 0;
    m.recording_ahead = false;
    throw;
  }
  if (m.graph_key > 0) m.graph_exec = nullptr;  // owned by graph_execs
  m.graph_key = 0;
  m.recording_ahead = false;
  m.stats.record_host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - m.record_t0).count();
  // Buffers replaced while recording: the new graph names their successors. Earlier work on them
  // may still run (a step recorded ahead), and cudaFree waits for the device before freeing.
  std::vector<void*> freed;
  freed.swap(m.deferred_free);
  try {
    for (void* p : freed) check_cuda(cudaFree(p), "cudaFree (deferred scratch)");
  } catch (...) {
    if (hold) m.rezero_pending();  // the step is not held: its counter zeroing never runs
    m.zero_pending.clear();
    throw;
  }
  if (hold) m.held_exec = exec, m.held_slot = slot, m.held_zero.swap(m.zero_pending);
  m.zero_pending.clear();
}

void CudaBackend::step_submit() {
  Impl& m = *impl_;
  check(m.held_exec != nullptr, "CUDA backend: step_submit without a held step");
  cudaGraphExec_t exec = m.held_exec;
  m.held_exec = nullptr;
  try {
    launch_exec(m, exec, m.held_slot);
  } catch (...) {
    m.zero_pending.swap(m.held_zero);
    m.rezero_pending();  // the step's counter zeroing never ran
    throw;
  }
  m.held_zero.clear();
  ++m.stats.graph_ahead;
}

void CudaBackend::step_discard() noexcept {
  Impl& m = *impl_;
  if (!m.held_exec) return;
  m.held_exec = nullptr;  // owned by graph_execs: updated again by the next recording of its key
  m.zero_pending.swap(m.held_zero);
  m.rezero_pending();  // the step's counter zeroing never ran
  m.held_zero.clear();
  ++m.stats.graph_dropped;
}

void CudaBackend::graph_abort() noexcept {
  Impl& m = *impl_;
  if (!m.capturing) return;
  m.capturing = false;
  m.recording_ahead = false;
  if (m.graph_key > 0) m.graph_exec = nullptr;  // owned by graph_execs
  m.graph_key = 0;
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(m.stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();  // an invalidated capture leaves an error behind; the caller reports its own
  m.rezero_pending();  // the step's counter zeroing never ran
}

}  // namespace wren
