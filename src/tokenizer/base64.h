// Strict standard base64 (RFC 4648 §4, with '=' padding) decoding for tiktoken.model lines.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace wren {

/// Decodes `text` (alphabet A-Z a-z 0-9 + /, length a multiple of 4, '=' only as final padding,
/// unused trailing bits zero). Returns nullopt for anything else, including the empty string.
std::optional<std::string> base64_decode(std::string_view text);

/// Encodes `bytes` as standard padded base64 (used by tests and tools).
std::string base64_encode(std::string_view bytes);

}  // namespace wren
