// `wren tokenize`: print the token ids of a text (Kimi tokenizer, docs/model.md#tokenizer).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "cli/commands.h"
#include "core/error.h"
#include "runtime/default_model.h"
#include "tokenizer/tokenizer.h"

namespace wren::cli {

namespace {

struct TokenizeArgs {
  std::string model, text;
  bool json = false, allow_special = false, tokens = false;
};

/// The model folder, or the built-in default model's.
std::string model_dir(const std::string& m) { return m.empty() ? default_model_dir() : m; }

/// A token's bytes, printable: JSON string escapes (invalid UTF-8 as U+FFFD) without the quotes.
std::string printable(std::string_view b) {
  const std::string j = nlohmann::json(std::string(b)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return j.substr(1, j.size() - 2);
}

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  check(!std::cin.bad(), "tokenize: error reading standard input");
  return s;
}

void tokenize(const TokenizeArgs& a) {
  const Tokenizer tok = Tokenizer::load(model_dir(a.model));
  const std::string text = a.text == "-" ? read_stdin() : a.text;
  const std::vector<int> ids =
      tok.encode(text, a.allow_special ? SpecialMode::Allowed : SpecialMode::Disabled);
  if (a.tokens && a.json) {
    nlohmann::json out = nlohmann::json::array();
    for (int id : ids) out.push_back({{"id", id}, {"token", std::string(tok.token_bytes(id))}});
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  if (a.tokens) {  // one line per token: id, tab, its bytes as a JSON-escaped string
    for (int id : ids) std::printf("%d\t\"%s\"\n", id, printable(tok.token_bytes(id)).c_str());
    return;
  }
  if (a.json) {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
  std::printf("\n");
}

struct DetokenizeArgs {
  std::string model;
  std::vector<std::string> ids;
};

void detokenize(const DetokenizeArgs& a) {
  const Tokenizer tok = Tokenizer::load(model_dir(a.model));
  std::vector<std::string> words = a.ids;
  if (words.size() == 1 && words[0] == "-") {  // ids from standard input: spaces, commas, brackets
    std::string in = read_stdin();
    for (char& c : in)
      if (c == ',' || c == '[' || c == ']') c = ' ';
    std::istringstream ss(in);
    words.assign(std::istream_iterator<std::string>(ss), {});
  }
  std::vector<int> ids;
  for (const std::string& w : words) {
    size_t used = 0;
    long v = -1;
    try {
      v = std::stol(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == w.size() && v >= 0 && v < tok.vocab_size(),
          "detokenize: '" + w + "' is not a token id (0 .. " + std::to_string(tok.vocab_size() - 1) + ")");
    ids.push_back(int(v));
  }
  const std::string text = tok.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::printf("\n");
}

}  // namespace

void add_detokenize(CLI::App& app) {
  auto a = std::make_shared<DetokenizeArgs>();
  CLI::App* sub = app.add_subcommand("detokenize", "Print the text of token ids (the inverse of tokenize)");
  sub->add_option("--model", a->model, "Folder with tiktoken.model and tokenizer_config.json (default: the built-in model)");
  sub->add_option("ids", a->ids, "Token ids; '-' reads them from standard input (spaces, commas or a JSON list)")->required();
  sub->callback([a] { detokenize(*a); });
}

void add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "Print the token ids of TEXT (no BOS; special-token strings are plain text "
                  "unless --allow-special)");
  sub->add_option("--model", a->model, "Folder with tiktoken.model and tokenizer_config.json (default: the built-in model)");
  sub->add_flag("--json", a->json, "Print the ids as one JSON list");
  sub->add_flag("--tokens", a->tokens, "Print each token's id and text (one per line; with --json a list of {id, token})");
  sub->add_flag("--allow-special", a->allow_special,
                "Encode special-token strings in TEXT (e.g. <|open|>) as their ids");
  sub->add_option("text", a->text, "The text; '-' reads it from standard input (bytes exact)")
      ->required();
  sub->callback([a] { tokenize(*a); });
}

}  // namespace wren::cli
