// FNV-1a 64, the hash `wren run --json` prints over the logits it sampled from (so two runs show at
// a glance whether they were bit-identical).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace wren {

constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnv1a64Prime = 0x100000001b3ull;

/// FNV-1a 64 of n bytes at p, continuing from `h` (the offset basis to start a new hash).
inline uint64_t fnv1a64(const void* p, size_t n, uint64_t h = kFnv1a64Offset) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * kFnv1a64Prime;
  return h;
}

/// "%016x": 16 lower-case hex digits (a JSON string: numbers above 2^53 lose bits in JavaScript).
inline std::string hex64(uint64_t h) {
  static const char* d = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[size_t(i)] = d[h & 15];
  return s;
}

}  // namespace wren
