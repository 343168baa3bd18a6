// The built-in default model: models/wren-tiny, a 21 M-parameter model of the K3 architecture trained by
// scripts/train (models/wren-tiny/README.md); the build copies models/ into share/wren.
#pragma once
#include <string>

namespace wren {

/// <data_dir()>/models/wren-tiny: the built-in model's folder (it may be missing in a broken install).
std::string trained_model_dir();

/// Folder of the default model (trained_model_dir()), read-only: nothing is written on first use.
/// Prints one notice on stderr. Throws wren::Error naming the missing file when the install lacks it.
std::string default_model_dir();

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


}  // namespace wren
