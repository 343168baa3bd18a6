// Loading a `tiktoken.model` file: one base token per line, `base64(bytes) SP rank`.
#pragma once
#include <string>
#include <string_view>

#include "tokenizer/rank_table.h"

namespace wren {

/// Parses the text of a tiktoken.model file. Every non-empty line must be `BASE64 SP RANK`
/// (standard padded base64 of at least one byte; RANK a decimal integer; a trailing CR is
/// tolerated). Ranks must be exactly 0..N-1, each once; token bytes must be unique; all 256
/// single bytes must have a rank (rank-BPE starts from single bytes). Throws wren::Error naming
/// `source`, the line number and what was expected. Source: docs/model.md#tokenizer.
RankTable parse_tiktoken_model(std::string_view text, const std::string& source);

/// Reads and parses the tiktoken.model file at `path` (see parse_tiktoken_model).
RankTable load_tiktoken_model(const std::string& path);

/// Reads a whole file as bytes; throws wren::Error naming `path` if it cannot be read.
std::string read_file_bytes(const std::string& path);

}  // namespace wren
