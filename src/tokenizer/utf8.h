// UTF-8 scanning for the tokenizer: well-formedness, U+FFFD repair, code-point iteration.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace wren::utf8 {

/// One step of a UTF-8 scan starting at some byte offset.
struct Step {
  size_t len = 0;      ///< bytes consumed: the whole character, or the maximal ill-formed subpart
  bool valid = false;  ///< true when those bytes form one well-formed character
  bool truncated = false;  ///< ill-formed only because the input ended mid-character
  char32_t cp = 0xFFFD;    ///< the code point (U+FFFD when !valid)
};

/// Scans one character at s[pos] (pos < s.size()). Ill-formed input is consumed one "maximal
/// subpart" at a time (Unicode §3.9 / WHATWG Encoding: the longest prefix of a well-formed
/// sequence, at least one byte), which is what browsers and Node replace with one U+FFFD each.
Step next(std::string_view s, size_t pos);

/// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool is_valid(std::string_view s);

/// `s` with every maximal ill-formed subpart replaced by U+FFFD (EF BF BD); `s` itself when valid.
std::string repair(std::string_view s);

/// Length of a trailing incomplete-but-so-far-well-formed sequence at the end of `s` (0..3):
/// bytes that the next chunk of a stream may still complete.
size_t incomplete_tail(std::string_view s);

/// Appends the UTF-8 encoding of `cp` (a valid scalar value) to `out`.
void append(std::string& out, char32_t cp);

/// The replacement character U+FFFD, UTF-8 encoded.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace wren::utf8
