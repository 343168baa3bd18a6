// `wren bench pieces`: the expert store's read pieces on a simulated disk (see bench.h).
//
// Why a simulated disk: what pieces change is the order in which a visit's misses land. With
// whole-expert reads, the loaders read `loaders` experts side by side and they land together at the
// end, so the compute of the last ones runs after the disk has finished; with pieces the loaders
// share one expert at a time and the misses land one after another. On the development VM the
// disk's own speed varies run to run by more than this effect (and its host caches repeated
// reads), so the bench holds each read back to a fixed bandwidth shared by the reads in flight.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "bench/sequential_read.h"
#include "core/error.h"
#include "io/expert_store.h"

namespace wren::bench {

namespace {

using Clock = std::chrono::steady_clock;

/// --compute-ms: comma-separated non-negative milliseconds. Throws UsageError naming the bad item.
std::vector<double> parse_ms(const std::string& list) {
  std::vector<double> out;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    usage_check(!item.empty() && *end == '\0' && v >= 0 && v <= 10000,
                "--compute-ms: '" + item + "' is not a time in ms in [0, 10000] (e.g. 0,20,40)");
    out.push_back(v);
  }
  usage_check(!out.empty(), "--compute-ms: give at least one time (e.g. 0,20,40)");
  return out;
}

/// A disk of `gbps` GB/s: one server that the reads in flight pass through in 256 KB steps, so
/// concurrent reads share the bandwidth (each read still copies its bytes from the page cache).
class SimulatedDisk {
 public:
  explicit SimulatedDisk(double gbps) : bytes_per_s_(gbps * 1e9) {}
  long pread(int fd, void* buf, size_t n, uint64_t off) {
    const long r = long(::pread(fd, buf, n, off_t(off)));
    constexpr size_t kStep = 256 << 10;
    for (size_t done = 0; done < n; done += kStep) {
      const auto dt = std::chrono::nanoseconds(int64_t(double(std::min(kStep, n - done)) / bytes_per_s_ * 1e9));
      Clock::time_point end;
      {
        std::lock_guard<std::mutex> lk(mu_);
        free_at_ = std::max(free_at_, Clock::now()) + dt;
        end = free_at_;
      }
      std::this_thread::sleep_until(end);
    }
    return r;
  }

 private:
  double bytes_per_s_;
  std::mutex mu_;
  Clock::time_point free_at_ = Clock::now();
};

}  // namespace

void run_pieces(const PiecesArgs& a) {
  const std::vector<double> compute = parse_ms(a.compute_ms);
  const uint64_t eb = uint64_t(a.expert_mb * 1e6);
  const int n_experts = a.misses * a.runs;  // each run reads experts no earlier run touched
  std::filesystem::create_directories(a.dir);
  const std::string path = a.dir + "/experts.bin";
  const uint64_t size = eb * uint64_t(n_experts);
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) != size || ec) {
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    check(fd >= 0, path + ": cannot create the bench file");
    std::vector<char> block(1 << 20, 1);
    for (uint64_t w = 0; w < size;) {
      const ssize_t r = ::write(fd, block.data(), size_t(std::min<uint64_t>(block.size(), size - w)));
      if (r <= 0) ::close(fd);
      check(r > 0, path + ": write failed (disk full?)");
      w += uint64_t(r);
    }
    ::close(fd);
  }
  std::vector<std::vector<ExpertExtent>> extents(1);
  for (int e = 0; e < n_experts; ++e)
    extents[0].push_back({path, uint64_t(e) * eb, eb, "experts." + std::to_string(e)});
  const double floor_ms = double(eb) * a.misses / (a.gbps * 1e9) * 1e3;
  std::printf("simulated disk %.3f GB/s (shared by the reads in flight, 256 KB steps); one visit of %d misses of %.2f MB, "
              "%d loaders; I/O floor %.1f ms; min / median of %d runs\n\n",
              a.gbps, a.misses, eb / 1e6, a.loaders, floor_ms, a.runs);
  std::printf("| compute / expert | whole-expert reads: ms | x floor | pieces (default): ms | x floor | whole / pieces (median) |\n"
              "|---|---|---|---|---|---|\n");
  for (double c_ms : compute) {
    Spread res[2];
    for (int form = 0; form < 2; ++form) {
      std::vector<double> ms;
      for (int run = 0; run < a.runs; ++run) {
        SimulatedDisk disk(a.gbps);
        ExpertStoreOptions o;
        o.cache_bytes = eb * uint64_t(a.misses);
        o.loader_threads = a.loaders;
        o.piece_bytes = form == 0 ? eb + (8 << 10) : 0;  // form 0: an expert is one read
        o.pread_hook = [&disk](int fd, void* buf, size_t n, uint64_t off) { return disk.pread(fd, buf, n, off); };
        ExpertByteStore store(extents, eb, o);
        std::vector<int> ids;
        for (int i = 0; i < a.misses; ++i) ids.push_back(run * a.misses + i);
        const auto t0 = Clock::now();
        store.visit_batches(0, ids, [&](const int*, const uint8_t* const*, int n) {
          std::this_thread::sleep_for(std::chrono::microseconds(int64_t(c_ms * 1e3 * n)));
        });
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      res[form] = spread(ms);
    }
    std::printf("| %.1f ms | %.1f / %.1f | %.2fx | %.1f / %.1f | %.2fx | %.2fx |\n", c_ms, res[0].min, res[0].median,
                res[0].median / floor_ms, res[1].min, res[1].median, res[1].median / floor_ms,
                res[0].median / res[1].median);
  }
}

}  // namespace wren::bench
