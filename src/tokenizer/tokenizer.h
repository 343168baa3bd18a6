// The Kimi tokenizer: tiktoken-exact encoding (pre-tokenizer regex + rank-BPE + specials), decoding.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/rank_table.h"
#include "tokenizer/special_tokens.h"

namespace wren {

/// How special-token strings in text are treated by Tokenizer::encode.
enum class SpecialMode {
  Disabled,  ///< a literal "<|open|>" is ordinary text (tiktoken encode_ordinary); the default
  Allowed,   ///< every special string found in the text becomes its id (tiktoken encode, "all")
};

/// Encodes text to token ids and back, identical to the tiktoken core with the Kimi pattern
/// (docs/model.md#tokenizer). Ids 0..n_ranks()-1 are BPE ranks; specials follow (tokenizer_config.json).
///
/// Encoding pipeline: repair ill-formed UTF-8 -> upstream long-input cuts (long_input.h) ->
/// per cut: specials (if Allowed) -> pre-tokenizer pieces -> rank-BPE per piece.
///
/// Ill-formed UTF-8 input: each maximal ill-formed subpart (Unicode §3.9, as WHATWG decoders and
/// Node do) is replaced by U+FFFD before encoding, so encode(bytes) equals tiktoken's encoding of
/// Node's `Buffer.toString("utf8")` of those bytes; decode() then returns the repaired text, not
/// the original bytes. For well-formed input, decode(encode(x)) == x.
///
/// Immutable after construction; encode/decode are thread-safe.
class Tokenizer {
 public:
  /// Loads DIR/tiktoken.model and DIR/tokenizer_config.json (added_tokens_decoder). Throws
  /// wren::Error naming the file and what was wrong.
  static Tokenizer load(const std::string& dir);
  /// A tokenizer from an already-loaded vocabulary and specials (ids >= ranks.size(), unique).
  Tokenizer(RankTable ranks, std::vector<SpecialToken> specials);

  /// The ids of `text` (any bytes; see the class comment for ill-formed UTF-8).
  std::vector<int> encode(std::string_view text, SpecialMode mode = SpecialMode::Disabled) const;
  /// The ids of well-formed UTF-8 `text` with specials disabled and no long-input cuts: exactly
  /// tiktoken's encode_ordinary (used by tests to isolate the core).
  std::vector<int> encode_ordinary(std::string_view text) const;

  /// Concatenated bytes of `ids` (may be ill-formed UTF-8 for arbitrary id sequences). Throws
  /// wren::Error for an id that is neither a rank nor an assigned special.
  std::string decode(const std::vector<int>& ids) const;
  /// Bytes of one id (see decode).
  std::string_view token_bytes(int id) const;

  /// Number of BPE ranks (the first special id of Kimi vocabularies).
  int n_ranks() const { return ranks_.size(); }
  /// One more than the largest id (ranks and specials).
  int vocab_size() const;
  /// The id of a special token string, e.g. "[BOS]" or "<|end_of_msg|>".
  std::optional<int> special_id(std::string_view content) const { return matcher_.id_of(content); }
  /// All specials, sorted by id.
  const std::vector<SpecialToken>& specials() const { return specials_; }

 private:
  void encode_chunk(std::string_view text, SpecialMode mode, std::vector<int>& out) const;
  void encode_plain(std::string_view text, std::vector<int>& out) const;

  RankTable ranks_;
  std::vector<SpecialToken> specials_;
  std::vector<std::string> special_by_offset_;  // [id - n_ranks]: content, "" = unassigned
  SpecialMatcher matcher_;
  Pretokenizer pretok_;
};

}  // namespace wren
