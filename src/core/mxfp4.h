// The one MXFP4 codec (compressed-tensors "mxfp4-pack-quantized"), shared by every backend and test.
//
// Layout (spec kimi-k3.md §5): a logical [rows, cols] matrix is stored as
//   packed [rows, cols/2] u8: byte j of a row holds column 2j in the LOW nibble, 2j+1 in the high;
//   scale  [rows, cols/32] u8: ue8m0, factor 2^(s - 127) for 32 consecutive columns.
// Nibble = e2m1 with bit 3 = sign. Scale byte 255 (NaN in OCP MX) is rejected by the engine.
#pragma once
#include <cmath>
#include <cstdint>

namespace wren::mxfp4 {

constexpr int kGroup = 32;          ///< columns per ue8m0 scale
constexpr uint8_t kBadScale = 255;  ///< NaN in OCP MX: rejected (spec §10.4)

/// e2m1 code -> value, codes 0..15.
constexpr float kE2M1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                             -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

/// ue8m0 byte -> 2^(s - 127), exact (s = 0 gives the subnormal 2^-127; spec open question 18).
inline float scale_value(uint8_t s) { return std::ldexp(1.0f, int(s) - 127); }

/// e2m1 code of logical column `col` in one packed row.
inline uint8_t code_at(const uint8_t* packed_row, int col) {
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
