// CUDA backend, fast precision mode: the routed MXFP4 experts of one decode token (T = 1) on tensor
// cores (moe_decode.cu). Private to src/backends/cuda/*.cu.
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace wren::cuda {

/// True when moe_decode takes a routed_moe call: fast mode, T == 1, MXFP4 experts with io and inter
/// multiples of the 32-value group, z 8-byte aligned, and io small enough for z's BF16 copy in
/// shared memory beside the decode table.
bool moe_decode_ok(const CudaBackend::Impl& m, int T, int io, int inter, const float* z);

/// One token's top-k MXFP4 experts after the router: act[j] = SiTU(W1[e_j]·z, W3[e_j]·z) (BF16,
/// [k, inter] scratch), ys[j] = W2[e_j]·act[j] ([k, io] f32; the caller adds them up with the
/// router weights). table: ExpertPtrs [E] device; ids: the router's device output [k]; z [io]
/// device. Two launches (gate/up, down), no host sync (graph-capturable).
void moe_decode(CudaBackend::Impl& m, const ExpertPtrs* table, const int* ids, const float* z, int k, int io,
                int inter, float b1, float b2, float* ys);

}  // namespace wren::cuda
