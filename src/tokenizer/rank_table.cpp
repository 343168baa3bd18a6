// Byte-string <-> rank table with a flat open-addressing hash index (see rank_table.h).
#include "tokenizer/rank_table.h"

#include <cstring>

#include "core/error.h"

namespace wren {

namespace {

/// Up to 8 bytes of `p` as one little-endian word (zero-padded).
uint64_t load_word(const char* p, size_t n) {
  uint64_t w = 0;
  if (n) std::memcpy(&w, p, n < 8 ? n : 8);
  return w;
}

/// A fast, well-mixed 64-bit hash of a short byte string (word-at-a-time, murmur3 finalizer).
uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull * (s.size() + 1);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) h = (h ^ load_word(s.data() + i, 8)) * 0xBF58476D1CE4E5B9ull;
  h ^= load_word(s.data() + i, s.size() - i);
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 33);
}

/// The slot tag of a hash: 16 bits not used for the slot index, never 0 (0 marks empty).
uint16_t tag_of(uint64_t h) {
  const uint16_t t = uint16_t(h >> 48);
  return t ? t : 1;
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
  slots_.assign(cap, Slot{});
  tags_.assign(cap, 0);
  mask_ = cap - 1;
  for (int r = 0; r < int(tokens.size()); ++r) {
    if (tokens[r].empty()) throw Error(source + ": rank " + std::to_string(r) + " has empty token bytes");
    const int other = find_hashed(tokens[r]);
    if (other != kNone)
      throw Error(source + ": ranks " + std::to_string(other) + " and " + std::to_string(r) +
                  " have the same token bytes");
    if (tokens[r].size() == 2) pairs_[uint8_t(tokens[r][0]) << 8 | uint8_t(tokens[r][1])] = r;
    const uint64_t h = hash_bytes(tokens[r]);
    uint64_t i = h & mask_;
    while (tags_[i] != 0) i = (i + 1) & mask_;
    tags_[i] = tag_of(h);
    slots_[i] = {load_word(tokens[r].data(), tokens[r].size()), uint32_t(r) + 1,
                 uint32_t(tokens[r].size())};
  }
}

int RankTable::find_hashed(std::string_view b) const {
  if (slots_.empty()) return kNone;
  const uint64_t h = hash_bytes(b);
  const uint16_t tag = tag_of(h);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const uint16_t t = tags_[i];
    if (t == 0) return kNone;
    if (t != tag) continue;
    const Slot& s = slots_[i];
    if (s.len != b.size() || s.head != load_word(b.data(), b.size())) continue;
    if (b.size() <= 8) return int(s.rank1) - 1;
    const uint32_t off = offsets_[s.rank1 - 1];
    if (std::memcmp(arena_.data() + off + 8, b.data() + 8, b.size() - 8) == 0) return int(s.rank1) - 1;
  }
}

}  // namespace wren
