// CUDA backend, fast precision mode: the routed-expert grouped GEMM on Hopper warpgroup MMA
// (moe_wgmma.cu, built for sm_90a only; moe_grouped.cu falls back to its mma.sync kernels where
// that code cannot load). Private to src/backends/cuda/*.cu.
#pragma once
#include <cuda_bf16.h>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/lt_state.cuh"

namespace wren::cuda {

/// Rows of one tile of the sorted pairs (the sort kernel lists tiles of this many rows for it).
constexpr int kWgTileRows = 128;

/// One grouped product over the sorted (token, slot) pairs. gate/up: act_out[p, n] =
/// GLU(A[p]·W1[e]ᵀ, A[p]·W3[e]ᵀ) (N = inter, K = io); down: ys[order[p], n] = A[p]·W2[e]ᵀ
/// (N = io, K = inter). Exactly one of dense / mx is set. A is BF16 [pairs, K] in sorted order.
/// Requirements: K, N multiples of 8 (dense) or 32 (MXFP4).
struct WgArgs {
  const DenseExpertPtrs* dense = nullptr;  ///< [E] device, BF16 experts
  const ExpertPtrs* mx = nullptr;          ///< [E] device, MXFP4 experts (decoded in shared memory)
  const int *order = nullptr, *ebase = nullptr, *tile_e = nullptr, *tile_m0 = nullptr, *n_tiles = nullptr;
  const __nv_bfloat16* A = nullptr;
  __nv_bfloat16* act_out = nullptr;  ///< gate/up: [pairs, N] BF16, sorted order
  float* ys = nullptr;               ///< down: [pairs, N] f32 by pair j (unweighted)
  int K = 0, N = 0;
  float b1 = 0, b2 = 0;
  int silu = 1;  ///< 1: SiLU-GLU, 0: SiTU-GLU(b1, b2)
};

/// True when the sm_90a kernels load on this device (checked once per process).
bool wgmma_grouped_available(CudaBackend::Impl& m);
/// Launches one grouped product over max_tiles (an upper bound on the sort's tile count) tiles of
/// kWgTileRows rows; `label` names the launch in the profile.
void wgmma_grouped(CudaBackend::Impl& m, bool gate_up, const WgArgs& a, int max_tiles, const char* label);

}  // namespace wren::cuda
