// The tiktoken vocabulary as an immutable byte-string <-> rank table with a flat hash index.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wren {

/// Base tokens of a tiktoken vocabulary: token rank r (= token id r) <-> its bytes. Ranks are
/// dense 0..size()-1. Lookup by bytes is the hot path of rank-BPE: two-byte strings (every
/// initial BPE pair) read a direct 64K table; others probe a compact 16-bit tag array (1 MiB for
/// K3-sized vocabularies, mostly cache-resident) before touching the slot with the inline bytes. Copyable and movable (views point into the table's own storage only
/// through offsets). Source: docs/model.md#tokenizer.
class RankTable {
 public:
  static constexpr int kNone = -1;

  RankTable() = default;
  /// Builds the table from `tokens[r]` = bytes of rank r. Throws wren::Error naming `source` and
  /// both ranks when two ranks have the same bytes, or when a token is empty.
  explicit RankTable(const std::vector<std::string>& tokens, const std::string& source = "vocabulary");

  /// Rank of exactly these bytes, or kNone.
  int find(std::string_view bytes) const {
    if (bytes.size() == 2) return pairs_[uint8_t(bytes[0]) << 8 | uint8_t(bytes[1])];
    return find_hashed(bytes);
  }
  /// Bytes of rank `r` (0 <= r < size(); unchecked).
  std::string_view bytes(int r) const {
    return std::string_view(arena_).substr(offsets_[r], offsets_[r + 1] - offsets_[r]);
  }
  /// Number of ranks.
  int size() const { return int(offsets_.empty() ? 0 : offsets_.size() - 1); }

 private:
  int find_hashed(std::string_view bytes) const;

  /// One hash slot: the token's first 8 bytes inline, so a probe that passes the tag check
  /// touches one more cache line only.
  struct Slot {
    uint64_t head = 0;   // first min(len, 8) bytes, little-endian, zero-padded
    uint32_t rank1 = 0;  // rank + 1; 0 = empty
    uint32_t len = 0;
  };

  std::string arena_;              // all token bytes, back to back in rank order
  std::vector<uint32_t> offsets_;  // [size()+1]: token r is arena_[offsets_[r], offsets_[r+1])
  std::vector<uint16_t> tags_;     // per slot: 16 bits of the hash, never 0; 0 = empty
  std::vector<Slot> slots_;        // open addressing, linear probing; power-of-two size
  uint64_t mask_ = 0;
  std::vector<int> pairs_ = std::vector<int>(65536, kNone);  // rank of each two-byte string
};

}  // namespace wren
