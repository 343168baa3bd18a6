// Byte-string <-> rank table with a flat open-addressing hash index (see rank_table.h).
#include "tokenizer/rank_table.h"

#include <cstring>

#include "core/error.h"

namespace wren {

namespace {

/// A fast 64-bit hash of a short byte string (8-byte words, multiply-xorshift mixing).
uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t(s.size()) * 0xD6E8FEB86659FD93ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  if (i < s.size()) std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

}  // namespace

RankTable::RankTable(const std::vector<std::string>& tokens, const std::string& source) {
  size_t total = 0;
  for (const auto& t : tokens) total += t.size();
  check(total < UINT32_MAX, source + ": vocabulary too large (" + std::to_string(total) + " bytes)");
  arena_.reserve(total);
  offsets_.reserve(tokens.size() + 1);
  offsets_.push_back(0);
  for (const auto& t : tokens) {
    arena_ += t;
    offsets_.push_back(uint32_t(arena_.size()));
  }
  size_t cap = 16;
  while (cap < 2 * tokens.size()) cap *= 2;
  slots_.assign(cap, 0);
  mask_ = cap - 1;
  for (int r = 0; r < int(tokens.size()); ++r) {
    check(!tokens[r].empty(), source + ": rank " + std::to_string(r) + " has empty token bytes");
    uint64_t i = hash_bytes(tokens[r]) & mask_;
    while (slots_[i] != 0) {
      const int other = int(slots_[i]) - 1;
      check(bytes(other) != tokens[r], source + ": ranks " + std::to_string(other) + " and " +
                                           std::to_string(r) + " have the same token bytes");
      i = (i + 1) & mask_;
    }
    slots_[i] = uint32_t(r) + 1;
  }
}

int RankTable::find(std::string_view b) const {
  if (slots_.empty()) return kNone;
  uint64_t i = hash_bytes(b) & mask_;
  while (slots_[i] != 0) {
    const int r = int(slots_[i]) - 1;
    const uint32_t off = offsets_[r], len = offsets_[r + 1] - off;
    if (len == b.size() && std::memcmp(arena_.data() + off, b.data(), len) == 0) return r;
    i = (i + 1) & mask_;
  }
  return kNone;
}

}  // namespace wren
