// Backend selection: `--backend cpu|cuda|auto` (design.md §1: one op interface, one backend per run).
#pragma once
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "ops/gpu_precision.h"
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
/// `precision` (CUDA, --gpu-precision): exact (the f32 path) or fast (tensor cores for prefill).
std::unique_ptr<Backend> make_backend(const std::string& name, const ModelWeights& weights,
                                      const CpuOptions& cpu = {}, const std::string& vram_experts = "",
                                      GpuPrecision precision = GpuPrecision::Exact);

/// True when `be` reads routed experts from an ExpertSource during the forward pass (the CPU
/// backend; the CUDA backend when its VRAM expert budget does not hold every expert), so a
/// bounded host expert store is worth opening.
bool backend_streams_experts(Backend& be);

/// TFLOP/s of a large BF16 GEMM on `be`'s tensor cores, measured now (CUDA); 0 for the CPU backend.
double gpu_bf16_peak_tflops(Backend& be);

/// Switches `be`'s GPU precision mode (CUDA; no-op elsewhere). Takes effect from the next op.
void set_backend_gpu_precision(Backend& be, GpuPrecision p);

/// Free device memory of `be` in bytes (cudaMemGetInfo); 0 for the CPU backend.
uint64_t device_free_bytes(Backend& be);

/// Gives `be` the host tier it streams experts from (the CUDA VRAM tier; no-op elsewhere).
void set_backend_host_tier(Backend& be, ExpertSource* source);

}  // namespace wren
