// The one MXFP4 codec (see mxfp4.h for the layout).
#include "core/mxfp4.h"

#include <bit>

namespace wren::mxfp4 {

namespace {
/// e2m1_value() (used by the device kernels) must equal the table bit for bit, -0 included.
constexpr bool e2m1_function_matches_table() {
  for (int c = 0; c < 16; ++c)
    if (std::bit_cast<uint32_t>(e2m1_value(uint8_t(c))) != std::bit_cast<uint32_t>(kE2M1[c])) return false;
  return true;
}
static_assert(e2m1_function_matches_table(), "mxfp4::e2m1_value disagrees with kE2M1");
}  // namespace

void dequant_row(const uint8_t* packed_row, const uint8_t* scale_row, int cols, float* out) {
  for (int g = 0; g < cols / kGroup; ++g) {
    const float s = scale_value(scale_row[g]);
    for (int j = 0; j < kGroup; ++j) {
      const int c = g * kGroup + j;
      out[c] = kE2M1[code_at(packed_row, c)] * s;
    }
  }
}

uint8_t nearest_code(float v, float scale) {
  const float x = v / scale;
  uint8_t best = 0;
  float best_err = INFINITY;
  for (uint8_t c = 0; c < 16; ++c) {
    const float err = std::fabs(kE2M1[c] - x);
    if (err < best_err) {
      best_err = err;
      best = c;
    }
  }
  return best;
}

}  // namespace wren::mxfp4
