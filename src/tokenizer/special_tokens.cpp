// Special tokens from tokenizer_config.json and their matcher (see special_tokens.h).
#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace wren {

using nlohmann::json;

namespace {

/// Parses a decimal id key ("163584"); rejects signs, leading zeros and junk.
std::optional<int> parse_id(const std::string& key) {
  if (key.empty() || key.size() > 9 || (key.size() > 1 && key[0] == '0')) return std::nullopt;
  int v = 0;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), v);
  if (ec != std::errc() || end != key.data() + key.size() || v < 0) return std::nullopt;
  return v;
}

SpecialToken parse_entry(const std::string& key, const json& value, int n_ranks,
                         const std::string& where) {
  const auto id = parse_id(key);
  check(id.has_value(), where + ": key '" + key + "' is not a decimal token id");
  check(*id >= n_ranks, where + ": id " + key + " collides with the BPE ranks 0.." +
                            std::to_string(n_ranks - 1) + " of tiktoken.model");
  // Specials follow the ranks; the tokenizer keeps a table from n_ranks to the largest id, so a
  // far-away id would allocate gigabytes (K3 has 256 specials). 2^20 slots is ample.
  check(int64_t(*id) - n_ranks < (int64_t(1) << 20),
        where + ": id " + key + " lies more than 2^20 past the last BPE rank " + std::to_string(n_ranks - 1) +
            " (specials follow the ranks)");
  check(value.is_object() && value.contains("content") && value["content"].is_string(),
        where + "[\"" + key + "\"]: expected an object with a string 'content'");
  SpecialToken t{*id, value["content"].get<std::string>()};
  check(!t.content.empty(), where + "[\"" + key + "\"].content: expected a non-empty string");
  return t;
}

}  // namespace

std::vector<SpecialToken> parse_special_tokens(const json& config, int n_ranks,
                                               const std::string& source) {
  const std::string where = source + ": added_tokens_decoder";
  check(config.is_object() && config.contains("added_tokens_decoder") &&
            config["added_tokens_decoder"].is_object(),
        where + ": expected an object {\"ID\": {\"content\": TEXT, ...}, ...}");
  std::vector<SpecialToken> out;
  std::set<std::string> seen;
  for (const auto& [key, value] : config["added_tokens_decoder"].items()) {
    out.push_back(parse_entry(key, value, n_ranks, where));
    check(seen.insert(out.back().content).second,
          where + "[\"" + key + "\"]: content '" + out.back().content + "' is used twice");
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

std::vector<SpecialToken> load_special_tokens(const std::string& path, int n_ranks) {
  std::ifstream f(path);
  check(f.good(), path + ": cannot open file");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
  return parse_special_tokens(j, n_ranks, path);
}

SpecialMatcher::SpecialMatcher(const std::vector<SpecialToken>& specials) : by_length_(specials) {
  std::stable_sort(by_length_.begin(), by_length_.end(),
                   [](const auto& a, const auto& b) { return a.content.size() > b.content.size(); });
  for (int i = 0; i < int(by_length_.size()); ++i)
    by_first_byte_[uint8_t(by_length_[i].content[0])].push_back(i);
}

std::optional<SpecialMatcher::Match> SpecialMatcher::find(std::string_view text, size_t from) const {
  if (by_length_.empty()) return std::nullopt;
  for (size_t pos = from; pos < text.size(); ++pos) {
    for (int i : by_first_byte_[uint8_t(text[pos])]) {
      const std::string& c = by_length_[i].content;
      if (text.compare(pos, c.size(), c) == 0) return Match{pos, c.size(), by_length_[i].id};
    }
  }
  return std::nullopt;
}

std::optional<int> SpecialMatcher::id_of(std::string_view content) const {
  for (const auto& t : by_length_)
    if (t.content == content) return t.id;
  return std::nullopt;
}

}  // namespace wren
