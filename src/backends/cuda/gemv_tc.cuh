// CUDA backend, fast precision mode: the one-token GEMV of a BF16 dense weight on tensor cores
// (gemv_tc.cu). Private to src/backends/cuda/*.cu.
#pragma once
#include "backends/cuda/cuda_common.cuh"
#include "ops/weights.h"

namespace wren::cuda {

/// y[rows] = W · x[cols] for T == 1 in fast mode when W is BF16 with cols % 32 == 0 and x and W's
/// device copy are 16-byte aligned; returns false (nothing launched) otherwise. x is rounded to
/// BF16 once, f32 accumulation; one launch; no host sync. Counts
/// CudaStats::tc_gemvs.
bool gemv_tc(CudaBackend::Impl& m, const DenseWeight& W, const float* x, int T, float* y);

/// gemv_tc of map(a, map.b) (Backend::gemm_mapped): a warp maps each span of the input it reads,
/// 4 values a lane (map_input: the element-wise op's f32 values, rounded to BF16 as gemv_tc
/// rounds x), so y is bit-identical to the element-wise op followed by gemv_tc, in one launch. Takes what
/// gemv_tc takes, with map.b 16-byte aligned; returns false (nothing launched) otherwise. Counts
/// CudaStats::tc_gemvs and CudaStats::mapped_gemvs.
bool gemv_tc_mapped(CudaBackend::Impl& m, const DenseWeight& W, const float* a, const InputMap& map, int T, float* y);

/// gemv_tc for up to 8 independent products in one launch: taken[i] says whether jobs[i] was
/// taken (the first 8 that gemv_tc would take; each y bit-identical to gemv_tc on it alone);
/// returns how many were. Nothing launched when none is taken.
int gemv_tc_batch(CudaBackend::Impl& m, const GemmJob* jobs, int n, int T, bool* taken);

}  // namespace wren::cuda
