// Element types found in safetensors files, and exact conversions to f32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace wren {

/// Safetensors dtypes the engine understands (others are rejected by name at header parse).
enum class DType { F32, F16, BF16, U8, I8, I32, I64, F64 };

/// Size of one element in bytes.
size_t dtype_size(DType t);
/// Safetensors spelling ("F32", "BF16", ...).
const char* dtype_name(DType t);
/// Parses a safetensors dtype string; returns false if unknown.
bool parse_dtype(const std::string& s, DType* out);

/// bf16 -> f32 is exact: the bf16 bits are the top half of the f32.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// f32 -> bf16 with round-to-nearest-even (NaN kept quiet). Used by the checkpoint writer.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

/// IEEE half -> f32, exact (subnormals included).
float f16_to_f32(uint16_t h);

}  // namespace wren
