// CUDA backend, fast precision mode: the MLA attention of one decode token (mla_decode.cu).
// Private to src/backends/cuda/*.cu.
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace wren::cuda {

/// Fast mode, T == 1: writes this token's cache row (RMSNorm of ckv's latent part, raw extra part)
/// at cache.kv[cache.length] and ctx[H, v_head] = attention over rows [0, cache.length] in the
/// absorbed form with the BF16 kv_b (docs/gpu-method.md "MLA decode"). Does not advance
/// cache.length. Returns false, having launched nothing, when the call does not qualify (exact
/// mode, T != 1, kv_b neither F32 nor BF16, kv_lora % 8 != 0 or > 4096, extra % 4 != 0, an f32 kv_b
/// with no BF16 copy yet while a graph is recorded).
bool mla_decode(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const float* q, const float* ckv,
                MlaCache& cache, int T, float* ctx);

/// mla_decode (T == 1) for B sequences on their own caches, up to 32 sequences a launch (fewer
/// where their scores would pass 64 MB of scratch):
/// sequence b reads q + b · H · (nope + extra) and ckv + b · (kv_lora + extra) and writes ctx + b ·
/// H · v_head, each bit-identical to mla_decode on it alone. Does not advance the lengths (nor
/// check capacities). Returns false, having launched no attention kernel, where mla_decode would
/// for any of them (a kv_b BF16 copy may have been made).
bool mla_decode_batch(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, MlaCache* const* caches, int B,
                      const float* q, const float* ckv, float* ctx);

}  // namespace wren::cuda
