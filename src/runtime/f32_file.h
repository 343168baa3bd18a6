// Raw little-endian f32 files for the validation hooks.
#pragma once
#include <string>
#include <vector>

namespace wren {

/// Reads exactly `count` floats from `path`; the error names `what` and the sizes.
std::vector<float> read_f32(const std::string& path, size_t count, const std::string& what);
/// Writes the floats to `path` (created or truncated).
void write_f32(const std::string& path, const std::vector<float>& v);

}  // namespace wren
