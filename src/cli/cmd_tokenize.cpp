// `wren tokenize`: print the token ids of a text (Kimi tokenizer, docs/model.md#tokenizer).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace wren::cli {

namespace {

struct TokenizeArgs {
  std::string model, text;
  bool json = false, allow_special = false;
};

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  check(!std::cin.bad(), "tokenize: error reading standard input");
  return s;
}

void tokenize(const TokenizeArgs& a) {
  const Tokenizer tok = Tokenizer::load(a.model);
  const std::string text = a.text == "-" ? read_stdin() : a.text;
  const std::vector<int> ids =
      tok.encode(text, a.allow_special ? SpecialMode::Allowed : SpecialMode::Disabled);
  if (a.json) {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
  std::printf("\n");
}

}  // namespace

void add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "Print the token ids of TEXT (no BOS; special-token strings are plain text "
                  "unless --allow-special)");
  sub->add_option("--model", a->model, "Folder with tiktoken.model and tokenizer_config.json")
      ->required();
  sub->add_flag("--json", a->json, "Print the ids as one JSON list");
  sub->add_flag("--allow-special", a->allow_special,
                "Encode special-token strings in TEXT (e.g. <|open|>) as their ids");
  sub->add_option("text", a->text, "The text; '-' reads it from standard input (bytes exact)")
      ->required();
  sub->callback([a] { tokenize(*a); });
}

}  // namespace wren::cli
