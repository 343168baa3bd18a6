// Element types found in safetensors files, and exact conversions to f32.
#include "core/dtype.h"

#include <cmath>

namespace wren {

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::U8, "U8", 1},   {DType::I8, "I8", 1},   {DType::I32, "I32", 4},
    {DType::I64, "I64", 8}, {DType::F64, "F64", 8},
};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  for (const auto& d : kDTypes) {
    if (s == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(float(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(float(man | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

}  // namespace wren
