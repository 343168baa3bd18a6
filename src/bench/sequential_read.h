// The raw-disk reference of the streaming benchmarks (`bench experts`, `bench stream`).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>
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

/// Plain sequential read of every file in `files`, 8 MB at a time (O_DIRECT when `direct`), by
/// `threads` threads that take the next 8 MB of the files in order (so `threads` reads are in flight:
/// the queue depth the expert store's loaders give the disk; 1 = one read after another): the speed
/// the expert store is compared with. Returns GB/s over wall time; the bytes read go to `*bytes`
/// when given. Throws wren::Error naming a file that cannot be opened or read.
inline double sequential_read(const std::set<std::string>& files, bool direct, int threads = 1,
                              uint64_t* bytes = nullptr) {
  constexpr uint64_t kChunk = 8 << 20;
  struct File {
    std::string path;
    int fd;
    uint64_t size;
  };
  std::vector<File> fs;
  auto close_all = [&] {
    for (const File& f : fs) ::close(f.fd);
  };
  for (const std::string& p : files) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) close_all();
    check(fd >= 0, p + ": cannot open");
    const off_t size = ::lseek(fd, 0, SEEK_END);
    fs.push_back({p, fd, uint64_t(std::max<off_t>(0, size))});
  }
  std::vector<std::pair<size_t, uint64_t>> chunks;  // (file, offset), in file order
  for (size_t i = 0; i < fs.size(); ++i)
    for (uint64_t off = 0; off < fs[i].size; off += kChunk) chunks.push_back({i, off});
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> n{0};
  std::mutex err_mu;
  std::string err;
  auto reader = [&] {
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, kChunk) != 0) {
      std::lock_guard<std::mutex> lk(err_mu);
      err = "cannot allocate the read buffer";
      return;
    }
    for (size_t c; (c = next.fetch_add(1)) < chunks.size();) {
      const File& f = fs[chunks[c].first];
      const ssize_t r = ::pread(f.fd, buf, kChunk, off_t(chunks[c].second));
      if (r < 0) {
        std::lock_guard<std::mutex> lk(err_mu);
        err = f.path + ": read failed";
        break;
      }
      n += uint64_t(r);
    }
    std::free(buf);
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int i = 1; i < std::max(1, threads); ++i) pool.emplace_back(reader);
  reader();
  for (std::thread& t : pool) t.join();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close_all();
  check(err.empty(), err);
  if (bytes) *bytes = n;
  return double(n) / dt / 1e9;
}

}  // namespace wren::bench
