// CUDA backend, fast precision mode: the routed experts (MXFP4 or BF16) of one decode token (T = 1)
// on tensor cores (moe_decode.cu). Private to src/backends/cuda/*.cu.
#pragma once
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/lt_state.cuh"

namespace wren::cuda {

/// Device bytes of one routed expert (w1, w3, w2 of [inter, io]): MXFP4 codes + ue8m0 scales, or
/// BF16 (the device_expert_bytes counters of the decode and grouped paths).
inline unsigned long long device_expert_bytes(bool mx, int io, int inter) {
  const unsigned long long n = (unsigned long long)inter * (unsigned long long)io;
  return mx ? 3ull * (n / 2 + n / 32) : 3ull * n * 2;
}

/// True when moe_decode (mx) or moe_decode_dense takes a routed_moe call: fast mode, T == 1, io and
/// inter multiples of 32 (the MXFP4 group; a lane's column span), z 16-byte (MXFP4) or 8-byte
/// (dense) aligned, and the staged token (2 bytes a value of io, and of inter for MXFP4) within the
/// device's shared memory. Dense tables must also hold 16-byte aligned matrices
/// (DenseTable::aligned16).
bool moe_decode_ok(const CudaBackend::Impl& m, int T, int io, int inter, const float* z, bool mx);

/// One token's top-k MXFP4 experts after the router: act[j] = SiTU(W1[e_j]·z, W3[e_j]·z) (f32,
/// [k, inter] scratch), ys[j] = W2[e_j]·act[j] ([k, io] f32), out [io] = Σ_j w[j] · ys[j] in slot
/// order (launch_slot_sum's sums). table: ExpertPtrs [E] device; ids, w: the router kernel's
/// device outputs [k], the router launched just before this: it must not write z and must trigger
/// only after its own wait, so that every kernel before it has completed when this one starts and
/// the persistent kernel may stage z ahead of its wait; z [io] device, not aliased by out. The
/// default form: one persistent launch (mx_experts_kernel); the others: gate/up, down, weighted
/// sum. No host sync (graph-capturable). Counts the visits into device_expert_*.
void moe_decode(CudaBackend::Impl& m, const ExpertPtrs* table, const int* ids, const float* w, const float* z, int k,
                int io, int inter, float b1, float b2, float* ys, float* out);

/// moe_decode for dense BF16 experts (DenseExpertPtrs [E] device, every matrix 16-byte aligned;
/// act BF16), with the same contract on the router, z and out; the GLU is SiLU(g)·u when silu,
/// else SiTU(b1, b2). The default form (0): gate/up, down, weighted sum; form 1
/// (set_dense_decode_form): one persistent launch (dense_experts_kernel) where z and act fit the
/// shared memory together, else the default (the same bits).
void moe_decode_dense(CudaBackend::Impl& m, const DenseExpertPtrs* table, const int* ids, const float* w, const float* z,
                      int k, int io, int inter, float b1, float b2, bool silu, float* ys, float* out);

/// out [T, io] = Σ_j w[t·k + j] · ys[t·k + j] over the k slots of each row, in slot order (the
/// routed experts' outputs ys [T·k, io] weighted by the router's w [T·k], all on the device): one
/// programmatic dependent launch, 4 columns a thread where io % 4 == 0 and ys, out are 16-byte
/// aligned (moe_grouped.cu). The sums do not depend on the width.
void launch_slot_sum(CudaBackend::Impl& m, const float* ys, const float* w, int k, int io, int T, float* out);

}  // namespace wren::cuda
