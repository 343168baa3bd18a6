// The one MXFP4 codec (compressed-tensors "mxfp4-pack-quantized"), shared by every backend and test.
//
// Layout (docs/model.md#mxfp4): a logical [rows, cols] matrix is stored as
//   packed [rows, cols/2] u8: byte j of a row holds column 2j in the LOW nibble, 2j+1 in the high;
//   scale  [rows, cols/32] u8: ue8m0, factor 2^(s - 127) for 32 consecutive columns.
// Nibble = e2m1 with bit 3 = sign. Scale byte 255 (NaN in OCP MX) is rejected by the engine.
//
// The decode functions are `__host__ __device__` when compiled by nvcc (WREN_HD), so the CUDA
// kernels use this very header; kE2M1 is the definition and e2m1_value() is checked against it at
// compile time (mxfp4.cpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace wren::mxfp4 {

constexpr int kGroup = 32;          ///< columns per ue8m0 scale
constexpr uint8_t kBadScale = 255;  ///< NaN in OCP MX: rejected (docs/model.md#decisions, item 4)

/// e2m1 code -> value, codes 0..15.
constexpr float kE2M1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                             -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

/// e2m1 code (0..15) -> value, computed from the bits (sign bit 3, exponent bits 2-1, mantissa
/// bit 0; exponent 0 is subnormal: m · 0.5). Equal to kE2M1[code] for every code, signed zero included.
WREN_HD constexpr float e2m1_value(uint8_t code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const float mag = e == 0 ? 0.5f * float(m) : float(1 << (e - 1)) * (1.0f + 0.5f * float(m));
  return (code & 8) ? -mag : mag;
}

/// ue8m0 byte -> 2^(s - 127), exact (s = 0 gives the subnormal 2^-127; docs/model.md#open-points, 4).
WREN_HD inline float scale_value(uint8_t s) {
#ifdef __CUDA_ARCH__
  // Built from the bits: s << 23 is 2^(s-127) for s >= 1; s = 0 is the subnormal 2^-127, i.e.
  // mantissa bit 22 (2^22 · 2^-149).
  return s ? __uint_as_float(uint32_t(s) << 23) : __uint_as_float(0x00400000u);
#else
  return std::ldexp(1.0f, int(s) - 127);
#endif
}

/// e2m1 code of logical column `col` in one packed row.
WREN_HD inline uint8_t code_at(const uint8_t* packed_row, int col) {
  const uint8_t b = packed_row[col >> 1];
  return (col & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
}

/// Dequantized value W[row][col] of one packed row with its scale row.
inline float value_at(const uint8_t* packed_row, const uint8_t* scale_row, int col) {
  return kE2M1[code_at(packed_row, col)] * scale_value(scale_row[col / kGroup]);
}

/// Dequantizes one row of `cols` values into out[cols]. Exact.
void dequant_row(const uint8_t* packed_row, const uint8_t* scale_row, int cols, float* out);

/// Encodes f32 values to the nearest e2m1 code given the group's scale (test/synth use only:
/// the engine never re-encodes checkpoint experts).
uint8_t nearest_code(float v, float scale);

}  // namespace wren::mxfp4
