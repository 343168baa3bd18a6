// The GPU precision mode (--gpu-precision): a typed knob that changes numerics, echoed in the run
// header (never an environment variable).
//   exact: the f32 path (CUDA cores, f32 operands, the CPU reference's order where cheap), bit-
//          identical across chunk sizes, within 1e-4 of the golden files.
//   fast:  prefill (T > 1) on tensor cores: dense GEMMs through cuBLASLt and routed experts through
//          one grouped GEMM per layer, BF16 operands with f32 accumulation and f32 outputs; chunked
//          KDA. Bound (docs/backends.md): per-layer rel-L2 <= 5e-3, logits rel-L2 <= 1e-2 vs the CPU.
#pragma once
#include <string>

#include "core/error.h"

namespace wren {

enum class GpuPrecision { Exact, Fast };

inline const char* gpu_precision_name(GpuPrecision p) { return p == GpuPrecision::Fast ? "fast" : "exact"; }

/// "exact" or "fast"; anything else throws wren::Error naming `flag`.
inline GpuPrecision parse_gpu_precision(const std::string& s, const char* flag = "--gpu-precision") {
  if (s == "exact") return GpuPrecision::Exact;
  if (s == "fast") return GpuPrecision::Fast;
  throw Error(std::string(flag) + ": '" + s + "' is not a precision mode (expected exact or fast)");
}

}  // namespace wren
