// UTF-8 scanning for the tokenizer (see utf8.h).
#include "tokenizer/utf8.h"

namespace wren::utf8 {

namespace {

/// Allowed range of the second byte for a lead byte (Unicode Table 3-7); later bytes are 80..BF.
struct Lead {
  int len;                 // total sequence length; 0 = not a lead byte
  uint8_t lo, hi;          // range of the second byte
};

Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Step next(std::string_view s, size_t pos) {
  const uint8_t b0 = uint8_t(s[pos]);
  const Lead L = lead_info(b0);
  if (L.len == 1) return {1, true, false, char32_t(b0)};
  if (L.len == 0) return {1, false, false, 0xFFFD};
  char32_t cp = b0 & (0x7F >> L.len);
  for (int i = 1; i < L.len; ++i) {
    if (pos + i >= s.size()) return {size_t(i), false, true, 0xFFFD};
    const uint8_t b = uint8_t(s[pos + i]);
    const uint8_t lo = i == 1 ? L.lo : 0x80, hi = i == 1 ? L.hi : 0xBF;
    if (b < lo || b > hi) return {size_t(i), false, false, 0xFFFD};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {size_t(L.len), true, false, cp};
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Step st = next(s, i);
    if (!st.valid) return false;
    i += st.len;
  }
  return true;
}

std::string repair(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const Step st = next(s, i);
    if (st.valid) out.append(s.substr(i, st.len));
    else out.append(kReplacement);
    i += st.len;
  }
  return out;
}

size_t incomplete_tail(std::string_view s) {
  const size_t first = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = first; i < s.size(); ++i) {
    if (lead_info(uint8_t(s[i])).len < 2) continue;
    const Step st = next(s, i);
    if (st.truncated && i + st.len == s.size()) return st.len;
  }
  return 0;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace wren::utf8
