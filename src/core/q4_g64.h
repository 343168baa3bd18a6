// The Q4_G64 weight codec, one definition for the CPU and CUDA backends and the quantizer
// (layout in ops/weights.h): per row ceil(cols/64) groups of 32 bytes and one f32 scale per
// group; byte j of a group holds column j in its low nibble and column j + 32 in its high nibble,
// each stored as q + 8 with q in [-8, 7]; W[r, c] = q · scale. Host-and-device (core/host_device.h).
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace wren::q4 {

constexpr int kGroupCols = 64;   ///< columns per group
constexpr int kGroupBytes = 32;  ///< packed bytes per group

/// Groups of a row of `cols` columns (the last one zero-padded).
WREN_HD constexpr int64_t groups(int64_t cols) { return (cols + kGroupCols - 1) / kGroupCols; }

/// q in [-8, 7] of a stored nibble (its low 4 bits; higher bits ignored).
WREN_HD constexpr int nibble_q(uint32_t nib) { return int(nib & 0xF) - 8; }

/// q of column j (0..63) of one packed group.
WREN_HD inline int q_at(const uint8_t* grp, int j) {
  return nibble_q(j < 32 ? grp[j] : uint32_t(grp[j - 32]) >> 4);
}

/// The stored byte of a column pair: low nibble column j, high nibble column j + 32, q as q + 8.
WREN_HD constexpr uint8_t pack(int q_lo, int q_hi) { return uint8_t((q_lo + 8) | ((q_hi + 8) << 4)); }

}  // namespace wren::q4
