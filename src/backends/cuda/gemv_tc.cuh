// CUDA backend, fast precision mode: the one-token GEMV of a BF16 dense weight on tensor cores
// (gemv_tc.cu). Private to src/backends/cuda/*.cu.
#pragma once
#include "backends/cuda/cuda_common.cuh"
#include "ops/weights.h"

namespace wren::cuda {

/// y[rows] = W · x[cols] for T == 1 in fast mode when W is BF16 with cols % 32 == 0 and x and W's
/// device copy are 16-byte aligned; returns false (nothing launched) otherwise. x is rounded to
/// BF16 once, f32 accumulation; one launch (two for matrices of few rows); no host sync. Counts
/// CudaStats::tc_gemvs.
bool gemv_tc(CudaBackend::Impl& m, const DenseWeight& W, const float* x, int T, float* y);

}  // namespace wren::cuda
