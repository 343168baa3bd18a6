// The tiktoken vocabulary as an immutable byte-string <-> rank table with a flat hash index.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wren {

/// Base tokens of a tiktoken vocabulary: token rank r (= token id r) <-> its bytes. Ranks are
/// dense 0..size()-1. Lookup by bytes is an open-addressing hash probe (no allocation), which is
/// the hot path of rank-BPE. Copyable and movable (views point into the table's own storage only
/// through offsets). Source: spec kimi-k3.md §6.1.
class RankTable {
 public:
  static constexpr int kNone = -1;

  RankTable() = default;
  /// Builds the table from `tokens[r]` = bytes of rank r. Throws wren::Error naming `source` and
  /// both ranks when two ranks have the same bytes, or when a token is empty.
  explicit RankTable(const std::vector<std::string>& tokens, const std::string& source = "vocabulary");

  /// Rank of exactly these bytes, or kNone.
  int find(std::string_view bytes) const;
  /// Bytes of rank `r` (0 <= r < size(); unchecked).
  std::string_view bytes(int r) const {
    return std::string_view(arena_).substr(offsets_[r], offsets_[r + 1] - offsets_[r]);
  }
  /// Number of ranks.
  int size() const { return int(offsets_.empty() ? 0 : offsets_.size() - 1); }

 private:
  std::string arena_;              // all token bytes, back to back in rank order
  std::vector<uint32_t> offsets_;  // [size()+1]: token r is arena_[offsets_[r], offsets_[r+1])
  std::vector<uint32_t> slots_;    // hash index: rank+1, 0 = empty; power-of-two size
  uint64_t mask_ = 0;
};

}  // namespace wren
