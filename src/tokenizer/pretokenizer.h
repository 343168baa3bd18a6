// The Kimi pre-tokenizer: tiktoken's splitting regex, translated to PCRE2 (UTF + UCP + JIT).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace wren {

/// Splits text into the pieces that rank-BPE encodes one at a time, exactly as tiktoken does
/// with the Kimi pattern (spec kimi-k3.md §6.2): leftmost-first (backtracking) matches scanned
/// left to right, each search starting where the previous match ended. Translation choices,
/// each matching the Rust `regex` semantics tiktoken uses:
///  - `[A&&[^\p{Han}]]` becomes `(?:(?!\p{sc:Han})[A])` (PCRE2 has no class intersection);
///  - `\p{Han}` becomes `\p{sc:Han}` (Script; PCRE2's bare `\p{Han}` means Script_Extensions);
///  - `\s` / `\S` become the explicit Unicode White_Space set (PCRE2's UCP `\s` lacks U+0085).
/// The input must be well-formed UTF-8 (the Tokenizer repairs it first). Thread-safe: matching
/// state is per thread. Throws wren::Error if PCRE2 rejects the pattern or a match fails.
class Pretokenizer {
 public:
  Pretokenizer();
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  /// Calls `piece(p)` for each piece of `text`, in order (pieces are views into `text`).
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;
  /// The pieces of `text`, as views into it.
  std::vector<std::string_view> pieces(std::string_view text) const;

  /// The PCRE2 pattern actually compiled.
  static const std::string& pcre2_pattern();
  /// The original tiktoken/fancy-regex pattern (spec §6.2), for reference and tests.
  static const std::string& tiktoken_pattern();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wren
