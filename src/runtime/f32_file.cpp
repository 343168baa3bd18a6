// Raw little-endian f32 files for the validation hooks.
#include "runtime/f32_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace wren {

std::vector<float> read_f32(const std::string& path, size_t count, const std::string& what) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  check(!ec, path + ": cannot read " + what + ": " + ec.message());
  check(size == count * 4, path + ": " + std::to_string(size) + " bytes, expected " +
                               std::to_string(count * 4) + " for " + what);
  std::vector<float> v(count);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(count * 4));
  check(bool(f), path + ": read failed");
  return v;
}

void write_f32(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  check(bool(f), path + ": cannot create");
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
  check(bool(f), path + ": write failed");
}

}  // namespace wren
