// The raw-disk reference of the streaming benchmarks (`bench experts`, `bench stream`).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace wren::bench {

/// Minimum and median of repeated measurements (0, 0 when there are none): the benchmarks report
/// both, so a ratio from a noisy disk says how far it spreads.
struct Spread {
  double min = 0, median = 0;
};
inline Spread spread(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {v[0], n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])};
}

/// Plain sequential read of every file in `files`, 8 MB at a time, one thread (O_DIRECT when
/// `direct`): the speed the expert store is compared with. Returns GB/s over wall time; the bytes
/// read go to `*bytes` when given. Throws wren::Error naming a file that cannot be opened or read.
inline double sequential_read(const std::set<std::string>& files, bool direct, uint64_t* bytes = nullptr) {
  constexpr size_t kChunk = 8 << 20;
  void* buf = nullptr;
  check(posix_memalign(&buf, 4096, kChunk) == 0, "cannot allocate the read buffer");
  uint64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& p : files) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) std::free(buf);
    check(fd >= 0, p + ": cannot open");
    for (;;) {
      const ssize_t r = ::read(fd, buf, kChunk);
      if (r < 0) ::close(fd), std::free(buf);
      check(r >= 0, p + ": read failed");
      if (r == 0) break;
      n += uint64_t(r);
    }
    ::close(fd);
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::free(buf);
  if (bytes) *bytes = n;
  return n / dt / 1e9;
}

}  // namespace wren::bench
