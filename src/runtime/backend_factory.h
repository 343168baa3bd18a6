// Backend selection: `--backend cpu|cuda|auto` (docs/architecture.md: one op interface, one backend per run).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_options.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "ops/expert_source.h"

namespace wren {

/// True when this build contains the CUDA backend (configured with WREN_CUDA and nvcc found).
bool cuda_built();

/// True when a CUDA backend can run here: built in and a device present. Otherwise false with the
/// reason in *why ("this build has no CUDA backend ..." or "no CUDA device: ...").
bool cuda_usable(std::string* why);

/// Resolves "cpu", "cuda" or "auto" (auto = cuda when cuda_usable(), else cpu) to "cpu" or "cuda".
/// Throws wren::Error for any other name, and for "cuda" when CUDA is not usable (naming why).
std::string resolve_backend(const std::string& name);

/// Creates the backend `name` (resolved as above) and gives it the model's weights (the CUDA
/// backend mirrors them to device memory). Throws wren::Error.
/// `cpu` configures the CPU backend (threads, kernel level, MXFP4 activation mode).
/// `vram_experts` (CUDA, --vram-experts): device memory for routed experts, "" = all that fit
/// with a margin, "all", or a size ("2G", "500M"); experts beyond it stream from the host.
/// `cuda` configures the CUDA backend (precision mode, KDA path, the fault-injection test hook).
/// `device` (create_backend): the CUDA device ordinal (a pipeline stage's GPU); ignored on the CPU.
std::unique_ptr<Backend> make_backend(const std::string& name, const ModelWeights& weights,
                                      const CpuOptions& cpu = {}, const std::string& vram_experts = "",
                                      const CudaOptions& cuda = {});

/// make_backend in two steps, for loading straight to the backend (load_model with
/// LoadOptions::place_on when the backend places_dense()): create_backend makes the backend
/// without weights, give_weights then hands it the model's weights (CUDA: mirrors the host ones,
/// the vectors and the routed experts, to device memory; weights it placed itself stay as they are).
std::unique_ptr<Backend> create_backend(const std::string& name, const CpuOptions& cpu = {},
                                        const std::string& vram_experts = "", const CudaOptions& cuda = {},
                                        int device = 0);
void give_weights(Backend& be, const ModelWeights& weights);
/// give_weights with a chosen list (a pipeline stage's: weight_list(w, first, end, embed, head)).
void give_weights(Backend& be, const WeightList& list);

/// TFLOP/s of a large BF16 GEMM on `be`'s tensor cores, measured now (CUDA); 0 for the CPU backend.
double gpu_bf16_peak_tflops(Backend& be);

/// Switches `be`'s GPU precision mode (CUDA; no-op elsewhere) between calls, for benchmarks that
/// time both modes on one loaded model. Takes effect from the next op.
void set_backend_gpu_precision(Backend& be, GpuPrecision p);

/// Device time of one kind of GPU launch over a profiled span (see gpu_profile_end).
struct GpuOpTime {
  std::string name;
  double ms = 0;
  uint64_t launches = 0;
};
/// Starts per-launch GPU timing on `be` (CUDA; false and nothing done elsewhere).
bool gpu_profile_begin(Backend& be);
/// Ends it: device milliseconds per launch label, largest first (host-bound gaps are charged to
/// the launch that waited); *total_ms = the whole span. Empty for the CPU backend.
std::vector<GpuOpTime> gpu_profile_end(Backend& be, double* total_ms);

/// Counters of a GPU backend so far (CUDA: CudaStats); all zero for the CPU backend.
struct GpuCounters {
  uint64_t launches = 0;        ///< kernel launches outside graphs
  uint64_t host_syncs = 0;      ///< stream synchronizations the host waited for
  uint64_t graph_launches = 0;  ///< recorded steps launched
  uint64_t graph_kernels = 0;   ///< kernels recorded into them
  uint64_t expert_visits = 0;   ///< device-routed experts run (each distinct expert of a call once)
  uint64_t expert_bytes = 0;    ///< their weight bytes
  double record_host_s = 0;     ///< host seconds recording steps (CudaStats::record_host_s)
  uint64_t graph_ahead = 0;     ///< steps recorded while the one before ran, then launched (CudaStats::graph_ahead)
};
GpuCounters gpu_counters(Backend& be);

/// Free device memory of `be` in bytes (cudaMemGetInfo); 0 for the CPU backend.
uint64_t device_free_bytes(Backend& be);

}  // namespace wren
