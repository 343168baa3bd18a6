// The Kimi tokenizer (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/long_input.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/utf8.h"

namespace wren {

Tokenizer Tokenizer::load(const std::string& dir) {
  RankTable ranks = load_tiktoken_model(dir + "/tiktoken.model");
  const int n = ranks.size();
  return Tokenizer(std::move(ranks), load_special_tokens(dir + "/tokenizer_config.json", n));
}

Tokenizer::Tokenizer(RankTable ranks, std::vector<SpecialToken> specials)
    : ranks_(std::move(ranks)), specials_(std::move(specials)), matcher_(specials_) {
  for (const auto& s : specials_) {
    check(s.id >= ranks_.size() && !s.content.empty(),
          "tokenizer: special token '" + s.content + "' has id " + std::to_string(s.id) +
              ", expected a non-empty string with an id >= " + std::to_string(ranks_.size()));
    const size_t off = size_t(s.id - ranks_.size());
    if (special_by_offset_.size() <= off) special_by_offset_.resize(off + 1);
    check(special_by_offset_[off].empty(), "tokenizer: special id " + std::to_string(s.id) +
                                               " is assigned twice");
    special_by_offset_[off] = s.content;
  }
}

int Tokenizer::vocab_size() const { return ranks_.size() + int(special_by_offset_.size()); }

std::vector<int> Tokenizer::encode(std::string_view text, SpecialMode mode) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  std::vector<int> out;
  out.reserve(text.size() / 3 + 4);
  for (std::string_view cut : split_long_input(text)) encode_chunk(cut, mode, out);
  return out;
}

std::vector<int> Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int> out;
  encode_plain(text, out);
  return out;
}

void Tokenizer::encode_chunk(std::string_view text, SpecialMode mode, std::vector<int>& out) const {
  if (mode == SpecialMode::Disabled) return encode_plain(text, out);
  size_t pos = 0;
  while (auto m = matcher_.find(text, pos)) {
    encode_plain(text.substr(pos, m->pos - pos), out);
    out.push_back(m->id);
    pos = m->pos + m->len;
  }
  encode_plain(text.substr(pos), out);
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int>& out) const {
  pretok_.split(text, [&](std::string_view piece) { bpe_encode(ranks_, piece, out); });
}

std::string_view Tokenizer::token_bytes(int id) const {
  if (id >= 0 && id < ranks_.size()) return ranks_.bytes(id);
  const size_t off = size_t(id) - size_t(ranks_.size());
  if (id >= 0 && off < special_by_offset_.size() && !special_by_offset_[off].empty())
    return special_by_offset_[off];
  throw Error("tokenizer: id " + std::to_string(id) + " is not a token (ranks 0.." +
              std::to_string(ranks_.size() - 1) + ", specials up to " +
              std::to_string(vocab_size() - 1) + ")");
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) out += token_bytes(id);
  return out;
}

}  // namespace wren
