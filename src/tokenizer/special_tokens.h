// Special (added) tokens: loading from tokenizer_config.json and finding them in text.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace wren {

/// One added token: its id (>= the number of BPE ranks) and its literal text.
struct SpecialToken {
  int id = 0;
  std::string content;
};

/// Reads `added_tokens_decoder` of a tokenizer_config.json: {"ID": {"content": TEXT, ...}, ...}.
/// Every entry becomes a special token (whatever its "special" flag), sorted by id. Ids must be
/// canonical decimal integers >= `n_ranks` (they follow the BPE ranks); contents must be
/// non-empty and unique. Ids without an entry stay unassigned. Throws wren::Error naming
/// `source` and the entry. Source: docs/model.md#tokenizer-specials.
std::vector<SpecialToken> parse_special_tokens(const nlohmann::json& config, int n_ranks,
                                               const std::string& source);

/// Reads and parses the tokenizer_config.json at `path` (see parse_special_tokens).
std::vector<SpecialToken> load_special_tokens(const std::string& path, int n_ranks);

/// Finds special-token strings in text. At a position where several specials start, the
/// longest wins (tiktoken leaves that case to hash-map order; no Kimi special is a prefix of
/// another, so this never matters for real vocabularies).
class SpecialMatcher {
 public:
  SpecialMatcher() = default;
  explicit SpecialMatcher(const std::vector<SpecialToken>& specials);

  /// A special occurrence: byte offset, length in bytes, token id.
  struct Match {
    size_t pos = 0, len = 0;
    int id = 0;
  };
  /// The leftmost special at or after byte `from` in `text`, if any.
  std::optional<Match> find(std::string_view text, size_t from) const;
  /// The id of exactly this special string, if it is one.
  std::optional<int> id_of(std::string_view content) const;

 private:
  std::vector<SpecialToken> by_length_;               // longest first
  std::array<std::vector<int>, 256> by_first_byte_;   // indices into by_length_
};

}  // namespace wren
