// The built-in default model: a small K3-architecture checkpoint with RANDOM weights and a real
// BPE vocabulary (the first 16,384 ranks of o200k_base), created deterministically on first use
// in the user's cache folder. It shows the machinery (tokenizer, chat format, streaming, expert
// store), not language.
#pragma once
#include <string>

namespace wren {

/// Folder of the default model, creating it on first use (atomically: a temporary folder renamed
/// into place). The vocabulary comes from `vocab_file` (written by scripts/setup.sh from the npm
/// tiktoken package); cache folder: $XDG_CACHE_HOME/wren or ~/.cache/wren. Prints one notice on
/// stderr saying the weights are random. Throws wren::Error naming what is missing.
std::string ensure_default_model(const std::string& vocab_file);

/// Wren's cache folder: $XDG_CACHE_HOME/wren, else ~/.cache/wren, else /tmp/wren-cache.
std::string cache_root();

/// The default model's tokenizer_config.json text (the K3 specials after its 16,384 ranks).
std::string default_tokenizer_config();

/// The source tree this binary was built from. Only the developer benchmark `wren bench tokenizer`
/// uses it (its tiktoken oracle lives in tests/tokenizer); nothing a user runs needs it.
std::string source_dir();

/// Wren's read-only data folder, found from the executable's own path: `<prefix>/share/wren` for an
/// installed binary (`<prefix>/bin/wren`), `<build>/share/wren` in a build folder (the build copies
/// the repository's data/ there). Returns the installed location when neither exists.
std::string data_dir();

/// The default model's vocabulary: <data_dir()>/default-vocab.tiktoken (scripts/setup.sh writes it
/// into data/; the build copies it).
std::string default_vocab_file();

}  // namespace wren
