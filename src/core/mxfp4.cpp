// The one MXFP4 codec (see mxfp4.h for the layout).
#include "core/mxfp4.h"

namespace wren::mxfp4 {

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
