// `GET /metrics` for `wren serve`: counters, gauges and histograms in the Prometheus text
// exposition format (version 0.0.4).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace wren::server {

/// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void observe(double v);
  /// `NAME_bucket{le=".."}`, `NAME_sum`, `NAME_count` lines with HELP/TYPE headers.
  std::string text(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative)
  uint64_t n_ = 0;
  double sum_ = 0;
};

/// Gauges read at scrape time.
struct MetricsGauges {
  long long queued = 0;   ///< requests waiting
  int running = 0;        ///< sequences generating now
  uint64_t expert_visits = 0, expert_bytes = 0;  ///< routed experts run and their weight bytes (Backend::expert_traffic)
  uint64_t decode_rows = 0, prefill_rows = 0;    ///< rows of the scheduler's steps
  uint64_t expert_hits = 0, expert_misses = 0, expert_bytes_read = 0;  ///< expert store, if any
  bool has_store = false;
  bool has_prefix_cache = false;  ///< the counters below are the prefix cache's (--prefix-cache)
  uint64_t prefix_lookups = 0, prefix_hits = 0, prefix_cached_tokens = 0;
  size_t prefix_bytes = 0, prefix_entries = 0;
};

/// All server metrics; thread-safe.
class Metrics {
 public:
  /// One finished HTTP request: its route (known routes, else "other") and status.
  void request(const std::string& route, int status);
  /// One finished generation: tokens, time to first token (from arrival) and the gaps between
  /// consecutive tokens, in seconds.
  void generation(int prompt_tokens, int completion_tokens, double ttft_s, const std::vector<double>& gaps_s);
  /// The exposition text.
  std::string text(const MetricsGauges& g) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, completion_tokens_ = 0, generations_ = 0;
  Histogram ttft_{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

}  // namespace wren::server
