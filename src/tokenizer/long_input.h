// Upstream's cutting of long inputs before tiktoken (tokenization_kimi.py), in code points.
#pragma once
#include <cstddef>
#include <string_view>
#include <vector>

namespace wren {

/// Upstream limits: slice length, and the longest run of whitespace or of non-whitespace code
/// points kept in one piece (docs/model.md#tokenizer).
inline constexpr size_t kMaxSliceChars = 400000;
inline constexpr size_t kMaxRunChars = 25000;

/// Python's str.isspace() for one code point (general category Zs, or bidi class WS, B or S):
/// U+0009..000D, U+001C..001F, U+0020, U+0085, U+00A0, U+1680, U+2000..200A, U+2028, U+2029,
/// U+202F, U+205F, U+3000.
bool is_python_space(char32_t cp);

/// Cuts well-formed UTF-8 `text` as tokenization_kimi.py does before calling tiktoken: first
/// into slices of `max_slice` code points, then each slice wherever a run of consecutive
/// whitespace (is_python_space) or non-whitespace code points would exceed `max_run`: the piece
/// ends before the code point that would be number max_run+1 of the run, and the run count
/// restarts at 1 there. Runs are counted per slice. Returns views into `text` that concatenate
/// to it (one empty view for empty text). Each view is then encoded on its own.
std::vector<std::string_view> split_long_input(std::string_view text,
                                               size_t max_slice = kMaxSliceChars,
                                               size_t max_run = kMaxRunChars);

}  // namespace wren
