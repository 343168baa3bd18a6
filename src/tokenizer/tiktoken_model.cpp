// tiktoken.model parsing and validation (see tiktoken_model.h).
#include "tokenizer/tiktoken_model.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/base64.h"

namespace wren {

namespace {

constexpr int kMaxRank = (1 << 30);  // far above any real vocabulary; keeps ids in int range

std::string shorten(std::string_view s) {
  return std::string(s.size() > 60 ? std::string(s.substr(0, 57)) + "..." : std::string(s));
}

/// One parsed line: token bytes and rank.
struct Entry {
  std::string bytes;
  int rank = 0;
  size_t line = 0;
};

Entry parse_line(std::string_view line, size_t lineno, const std::string& source) {
  auto fail = [&](const std::string& what) {
    throw Error(source + " line " + std::to_string(lineno) + ": " + what);
  };
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
    fail("expected 'BASE64 RANK' (two fields separated by one space), found '" + shorten(line) + "'");
  const std::string_view b64 = line.substr(0, sp), num = line.substr(sp + 1);
  Entry e;
  e.line = lineno;
  auto decoded = base64_decode(b64);
  if (!decoded) fail("token '" + shorten(b64) + "' is not valid padded base64 of at least one byte");
  e.bytes = std::move(*decoded);
  const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), e.rank);
  if (num.empty() || ec != std::errc() || end != num.data() + num.size() || e.rank < 0 ||
      e.rank >= kMaxRank)
    fail("rank '" + shorten(num) + "' is not an integer in [0, " + std::to_string(kMaxRank) + ")");
  return e;
}

std::vector<Entry> parse_lines(std::string_view text, const std::string& source) {
  std::vector<Entry> entries;
  size_t lineno = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) entries.push_back(parse_line(line, lineno, source));
  }
  return entries;
}

/// The smallest rank in 0..n-1 that no entry has (n when none is missing).
size_t first_missing_rank(const std::vector<Entry>& entries, size_t n) {
  std::vector<bool> seen(n, false);
  for (const auto& e : entries)
    if (size_t(e.rank) < n) seen[e.rank] = true;
  size_t r = 0;
  while (r < n && seen[r]) ++r;
  return r;
}

/// Places entries by rank; ranks must be 0..N-1 with no gaps or repeats.
std::vector<std::string> order_by_rank(std::vector<Entry>& entries, const std::string& source) {
  check(!entries.empty(), source + ": no tokens (expected lines 'BASE64 RANK')");
  const size_t n = entries.size();
  std::unordered_map<int, size_t> line_of;
  line_of.reserve(n);
  for (const auto& e : entries) {
    const auto [it, fresh] = line_of.emplace(e.rank, e.line);
    if (!fresh)
      throw Error(source + " line " + std::to_string(e.line) + ": duplicate rank " +
                  std::to_string(e.rank) + " (already on line " + std::to_string(it->second) + ")");
  }
  std::vector<std::string> tokens(n);
  for (auto& e : entries) {
    if (size_t(e.rank) >= n)
      throw Error(source + ": rank " + std::to_string(first_missing_rank(entries, n)) +
                  " is missing (ranks must be 0.." + std::to_string(n - 1) + " for " +
                  std::to_string(n) + " tokens; line " + std::to_string(e.line) + " has rank " +
                  std::to_string(e.rank) + ")");
    tokens[e.rank] = std::move(e.bytes);
  }
  return tokens;
}

void require_all_bytes(const RankTable& t, const std::string& source) {
  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    if (t.find(std::string_view(&c, 1)) != RankTable::kNone) continue;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", b);
    throw Error(source + ": the single byte " + hex +
                " has no rank; rank-BPE needs all 256 single bytes in the vocabulary");
  }
}

}  // namespace

RankTable parse_tiktoken_model(std::string_view text, const std::string& source) {
  std::vector<Entry> entries = parse_lines(text, source);
  RankTable table(order_by_rank(entries, source), source);
  require_all_bytes(table, source);
  return table;
}

RankTable load_tiktoken_model(const std::string& path) {
  return parse_tiktoken_model(read_file_bytes(path), path);
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  check(f.good(), path + ": cannot open file");
  const std::streamoff size = f.tellg();
  check(size >= 0, path + ": cannot determine the file size");
  std::string bytes(size_t(size), '\0');
  f.seekg(0);
  f.read(bytes.data(), size);
  check(f.gcount() == size, path + ": read error (expected " + std::to_string(size) + " bytes)");
  return bytes;
}

}  // namespace wren
