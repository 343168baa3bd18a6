// Upstream long-input cutting (see long_input.h).
#include "tokenizer/long_input.h"

#include <cstdint>

#include "tokenizer/utf8.h"

namespace wren {

bool is_python_space(char32_t c) {
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

/// Splits one slice at over-long whitespace / non-whitespace runs (appends views to `out`).
void split_runs(std::string_view s, size_t max_run, std::vector<std::string_view>& out) {
  size_t piece_start = 0, run = 0;
  bool run_is_space = false;
  for (size_t i = 0; i < s.size();) {
    const uint8_t b = uint8_t(s[i]);
    size_t len = 1;
    bool space;
    if (b < 0x80) {
      space = is_python_space(b);
    } else {
      const utf8::Step st = utf8::next(s, i);
      space = is_python_space(st.cp);
      len = st.len;
    }
    if (i == 0 || space != run_is_space) {
      run = 1;
      run_is_space = space;
    } else if (++run > max_run) {
      out.push_back(s.substr(piece_start, i - piece_start));
      piece_start = i;
      run = 1;
    }
    i += len;
  }
  out.push_back(s.substr(piece_start));
}

/// True for a UTF-8 continuation byte (10xxxxxx): not the first byte of a code point.
bool is_continuation(char c) { return (uint8_t(c) & 0xC0) == 0x80; }

}  // namespace

std::vector<std::string_view> split_long_input(std::string_view text, size_t max_slice,
                                               size_t max_run) {
  std::vector<std::string_view> out;
  if (text.size() <= max_run && text.size() <= max_slice) {  // bytes >= code points: no cut
    out.push_back(text);
    return out;
  }
  size_t slice_start = 0, chars = 0;
  for (size_t i = 0; i < text.size();) {
    if (chars == max_slice) {
      split_runs(text.substr(slice_start, i - slice_start), max_run, out);
      slice_start = i;
      chars = 0;
    }
    ++i;
    while (i < text.size() && is_continuation(text[i])) ++i;
    ++chars;
  }
  split_runs(text.substr(slice_start), max_run, out);
  return out;
}

}  // namespace wren
