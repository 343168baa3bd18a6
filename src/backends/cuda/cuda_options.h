// The CUDA backend's options: the knobs that change its numerics, fixed at construction and
// echoed in the run header (describe). Plain C++ (no CUDA types): the CLI parses them in every
// build, with or without the CUDA backend.
#pragma once
#include <cstdint>
#include <string>

#include "ops/gpu_precision.h"

namespace wren {

/// KDA path for calls of T > 1 tokens (prefill); T = 1 always runs the token kernel.
///   Recurrent  the token-by-token kernel: the CPU's summation order (exact mode, the default)
///   Chunked    the chunked WY/UT form (kda_chunked.cu): parallel within chunks, same results up
///              to f32 rounding, not bit-identical (fast mode)
enum class CudaKda { Recurrent, Chunked };

/// The CUDA backend's options, given at construction (CudaBackend(device, options)).
struct CudaOptions {
  CudaKda kda = CudaKda::Recurrent;  ///< --cuda-kda
  int kda_chunk = 32;                ///< --cuda-kda-chunk: 16, 32 or 64 (Chunked only; smaller
                                     ///< when the head size does not fit its shared memory)
  /// Test hook (--cuda-fault-at, CudaBackend::inject_fault): kernel launch number (from 1 over the
  /// backend's life) that throws DeviceError, to exercise the CPU fallback; 0 = never.
  uint64_t fault_at = 0;
  /// --gpu-precision (ops/gpu_precision.h): exact (the f32 path; the library default) or fast
  /// (prefill on tensor cores: cuBLASLt GEMMs, grouped routed experts incl. dense ones, MLA
  /// prefill products; the CLI default). docs/gpu-method.md#modes.
  GpuPrecision precision = GpuPrecision::Exact;
};

/// "recurrent" or "chunked".
const char* cuda_kda_name(CudaKda k);
/// Parses "recurrent" | "chunked"; throws wren::Error naming `what` and the accepted values.
CudaKda parse_cuda_kda(const std::string& s, const std::string& what);
/// Throws wren::Error naming `what` unless the options are valid (kda_chunk 16, 32 or 64).
void check_cuda_options(const CudaOptions& o, const std::string& what);
/// One line for the run header: "cuda precision exact; kda recurrent" or "cuda precision fast; kda chunked (chunk 32)", plus
/// "; fault injected at launch N" when the test hook is set.
std::string describe(const CudaOptions& o);

}  // namespace wren
