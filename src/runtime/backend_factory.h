// Backend selection: `--backend cpu|cuda|auto` (design.md §1: one op interface, one backend per run).
#pragma once
#include <memory>
#include <string>

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
/// `cuda` configures the CUDA backend (KDA path, the fault-injection test hook).
std::unique_ptr<Backend> make_backend(const std::string& name, const ModelWeights& weights,
                                      const CpuOptions& cpu = {}, const std::string& vram_experts = "",
                                      const CudaOptions& cuda = {});

/// True when `be` reads routed experts from an ExpertSource during the forward pass (the CPU
/// backend; the CUDA backend when its VRAM expert budget does not hold every expert), so a
/// bounded host expert store is worth opening.
bool backend_streams_experts(Backend& be);

/// Gives `be` the host tier it streams experts from (the CUDA VRAM tier; no-op elsewhere).
void set_backend_host_tier(Backend& be, ExpertSource* source);

}  // namespace wren
