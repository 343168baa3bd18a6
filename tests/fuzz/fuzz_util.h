// Shared by the libFuzzer targets (built with -DWREN_FUZZ=ON, see docs/reliability.md): the rule
// every target enforces is "bad input -> wren::Error (or the server's RequestError), nothing else".
// Any other exception escapes LLVMFuzzerTestOneInput, aborts, and libFuzzer reports a crash; ASan
// and UBSan report memory and undefined-behaviour faults.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace wren::fuzz {

/// A private directory under /tmp for targets that need files (one per process, reused).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/wren-fuzz-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) std::abort();
    return std::string(d);
  }();
  return dir;
}

/// Writes `size` bytes to `path` (truncating).
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  if (!f) std::abort();
}

}  // namespace wren::fuzz
