// The MXFP4 codec (core/mxfp4.h) on the device, for the tensor-core kernels that decode expert
// weights to BF16 operands in registers or shared memory (moe_wgmma.cu, moe_decode.cu): per 32
// codes of one group and its ue8m0 scale, 32 exact BF16 values. Private to src/backends/cuda/*.cu.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "core/mxfp4.h"

namespace wren::cuda {

/// 16 MXFP4 code bytes (32 values, low nibble first) scaled by 2^(sb-127) -> 4 chunks of 8 BF16,
/// exact. For 2 <= sb <= 252 every product is a normal BF16 whose bits are the e2m1 value's plus
/// (sb - 127) << 7 (the exponent field): per 4 codes, byte permutes from 8-entry tables of the
/// scaled values' high and low bytes, then the signs; other scales go through f32.
__device__ __forceinline__ void decode16(uint4 raw, uint32_t sb, uint4 (&o)[4]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if (sb < 2 || sb > 252) {
    const float s = mxfp4::scale_value(uint8_t(sb));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t r[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t byte = (w[i] >> (8 * b)) & 0xFFu;
        const __nv_bfloat162 v = __floats2bfloat162_rn(mxfp4::e2m1_value(uint8_t(byte & 0xF)) * s,
                                                       mxfp4::e2m1_value(uint8_t(byte >> 4)) * s);
        r[b] = *reinterpret_cast<const uint32_t*>(&v);
      }
      o[i] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    return;
  }
  // Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as BF16 (0, 3F00, 3F80, 3FC0, 4000, 4040, 4080, 40C0),
  // the nonzero ones with the scale's exponent added (16-bit lanes: no carry between entries).
  const uint32_t off = (uint32_t(int(sb) - 127) << 7) & 0xFFFFu, o2 = off | (off << 16);
  const uint32_t t01 = __vadd2(0x3F000000u, off << 16), t23 = __vadd2(0x3FC03F80u, o2);
  const uint32_t t45 = __vadd2(0x40404000u, o2), t67 = __vadd2(0x40C04080u, o2);
  const uint32_t h0 = __byte_perm(t01, t23, 0x7531), h1 = __byte_perm(t45, t67, 0x7531);
  const uint32_t l0 = __byte_perm(t01, t23, 0x6420), l1 = __byte_perm(t45, t67, 0x6420);
  uint32_t r[16];
#pragma unroll
  for (int q = 0; q < 8; ++q) {  // codes 4q .. 4q + 3: 16 bits of word q / 2
    const uint32_t c = (q % 2 ? w[q / 2] >> 16 : w[q / 2]) & 0xFFFFu, sel = c & 0x7777u;
    const uint32_t hi = __byte_perm(h0, h1, sel), lo = __byte_perm(l0, l1, sel);
    r[2 * q] = __byte_perm(lo, hi, 0x5140) | ((c << 12) & 0x8000u) | ((c << 24) & 0x80000000u);
    r[2 * q + 1] = __byte_perm(lo, hi, 0x7362) | ((c << 4) & 0x8000u) | ((c << 16) & 0x80000000u);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = make_uint4(r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
}

}  // namespace wren::cuda
