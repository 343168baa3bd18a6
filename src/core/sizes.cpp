// Sizes and memory figures (see sizes.h).
#include "core/sizes.h"

#include <sys/resource.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace wren {

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return uint64_t(ru.ru_maxrss) * 1024;
}

std::vector<int> parse_count_list(const std::string& s, const std::string& flag, int lo, int hi,
                                  const std::string& noun) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    usage_check(!item.empty() && end && *end == '\0' && v >= lo && v <= hi,
                flag + ": '" + item + "' is not a " + noun + " in " + std::to_string(lo) + ".." + std::to_string(hi));
    out.push_back(int(v));
  }
  usage_check(!out.empty(), flag + ": give at least one " + noun);
  return out;
}

uint64_t parse_size(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double mult = 1;
  const std::string unit = end ? std::string(end) : "";
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB") mult = 1e3;
  else if (unit == "M" || unit == "MB") mult = 1e6;
  else if (unit == "G" || unit == "GB") mult = 1e9;
  else if (unit == "T" || unit == "TB") mult = 1e12;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else mult = -1;
  if (end == s.c_str() || mult <= 0 || v < 0 || !std::isfinite(v))
    throw UsageError(what + ": '" + s + "' is not a size (expected e.g. 8G, 512M, 300K or a byte count)");
  // The double -> uint64 cast is undefined at 2^64 and beyond: refuse such sizes (no machine has them).
  if (!(v * mult < 18446744073709551616.0)) throw UsageError(what + ": '" + s + "' is beyond 2^64 bytes (16 EiB)");
  return uint64_t(v * mult);
}

uint64_t available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace wren
