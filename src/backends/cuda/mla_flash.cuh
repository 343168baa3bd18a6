// CUDA backend, fast precision mode: the arguments of the flash MLA prefill kernels (mla_fast.cu's
// mma.sync kernels for any sm_80+ device, mla_wgmma.cu's warpgroup-MMA kernel for sm_90a).
// Private to src/backends/cuda/*.cu.
#pragma once
#include <cuda_bf16.h>

#include "backends/cuda/cuda_common.cuh"

namespace wren::cuda {

/// Flash kernel arguments for one group of heads h0 .. h0 + g - 1. q [T, H, qh] f32 (qh = nope +
/// extra); kv [g, n_pad, nope + v] BF16 (rows [k_nope | v] of the group's heads, rows ≥ n unset);
/// vt [g, v, n_pad] BF16, the same v parts transposed (keys ≥ n zero; the wgmma kernel only);
/// c16 [n_pad, W] BF16 cache rows (k_x at column L); ctx [T, H, v] f32. Keys are cache positions
/// 0 .. n - 1 (n = pos0 + T); query t sees keys ≤ pos0 + t.
struct FlashArgs {
  const float* q;
  const __nv_bfloat16* kv;
  const __nv_bfloat16* vt;
  const __nv_bfloat16* c16;
  float* ctx;
  int T, H, h0, nope, extra, v, L, W, pos0, n, n_pad;
  float scale_log2;  ///< log2(e) / sqrt(nope + extra)
};

/// Two f32 as a BF16 pair (round to nearest even), lo in the low half.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const unsigned*>(&p);
}

/// 2^x on the special-function unit (ex2.approx.ftz: relative error ~2^-22, subnormal results
/// flushed to 0, 2^-inf = 0): one instruction where exp2f is a library sequence under this
/// build's exact-f32 flags. Fast mode only; P is rounded to BF16 right after, whose rounding
/// (2^-9) dwarfs it.
__device__ __forceinline__ float ex2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// True when the sm_90a flash kernel loads on this device (checked once per process).
bool mla_wgmma_available(CudaBackend::Impl& m);
/// The warpgroup-MMA flash kernel over g heads: needs nope + extra <= 192, v <= 128, q 16-byte
/// aligned, n_pad a multiple of 8 (mla_wgmma.cu).
void mla_wgmma_flash(CudaBackend::Impl& m, const FlashArgs& a, int g);

}  // namespace wren::cuda
