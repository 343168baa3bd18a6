// Incremental detokenization for streaming output: emits only complete UTF-8 characters.
#pragma once
#include <string>

#include "tokenizer/tokenizer.h"

namespace wren {

/// Turns ids into text one id at a time. A token may end inside a multi-byte character (byte
/// fallback for rare characters, emoji split across tokens): such a trailing incomplete sequence
/// is held back until later tokens complete it. Bytes that can no longer form a character come
/// out as U+FFFD (one per maximal ill-formed subpart), so every returned string is well-formed
/// UTF-8 and the concatenation of all push() results plus finish() equals
/// utf8::repair(tokenizer.decode(ids)). Not thread-safe (one decoder per stream).
class StreamDecoder {
 public:
  /// Decodes with `tok`, which must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}

  /// Adds one id; returns the text completed by it (possibly empty). Throws wren::Error for an
  /// unknown id (see Tokenizer::token_bytes); the decoder state is unchanged then.
  std::string push(int id);
  /// Ends the stream: returns the held-back bytes as U+FFFD (empty if none) and resets.
  std::string finish();
  /// Number of bytes currently held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace wren
