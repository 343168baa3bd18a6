// Prometheus text for `wren serve` (see metrics.h).
#include "server/metrics.h"

#include <charconv>

namespace wren::server {

namespace {
/// The shortest decimal that reads back as v (0.025, not 0.025000000000000001): bucket labels
/// are matched as strings by Prometheus queries.
std::string num(double v) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}
std::string header(const std::string& name, const char* type, const std::string& help) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}
}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  if (i < bounds_.size()) ++counts_[i];
  ++n_;
  sum_ += v;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::string s = header(name, "histogram", help);
  uint64_t acc = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    acc += counts_[i];
    s += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(acc) + "\n";
  }
  s += name + "_bucket{le=\"+Inf\"} " + std::to_string(n_) + "\n";
  s += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(n_) + "\n";
  return s;
}

void Metrics::request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{route, status}];
}

void Metrics::generation(int prompt_tokens, int completion_tokens, double ttft_s, const std::vector<double>& gaps_s) {
  std::lock_guard<std::mutex> lk(mu_);
  ++generations_;
  prompt_tokens_ += uint64_t(prompt_tokens);
  completion_tokens_ += uint64_t(completion_tokens);
  if (completion_tokens > 0) ttft_.observe(ttft_s);
  for (double g : gaps_s) itl_.observe(g);
}

std::string Metrics::text(const MetricsGauges& g) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string s = header("wren_requests_total", "counter", "HTTP requests by route and status.");
  for (const auto& [k, n] : requests_)
    s += "wren_requests_total{route=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " +
         std::to_string(n) + "\n";
  s += header("wren_generations_total", "counter", "Generations finished (completed, cancelled or cut).");
  s += "wren_generations_total " + std::to_string(generations_) + "\n";
  s += header("wren_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
  s += "wren_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  s += header("wren_generation_tokens_total", "counter", "Tokens generated.");
  s += "wren_generation_tokens_total " + std::to_string(completion_tokens_) + "\n";
  s += ttft_.text("wren_time_to_first_token_seconds", "Time from a request's arrival to its first generated token.");
  s += itl_.text("wren_inter_token_latency_seconds", "Time between consecutive generated tokens of one request.");
  s += header("wren_queue_depth", "gauge", "Requests waiting to run.");
  s += "wren_queue_depth " + std::to_string(g.queued) + "\n";
  s += header("wren_running_sequences", "gauge", "Sequences generating now.");
  s += "wren_running_sequences " + std::to_string(g.running) + "\n";
  s += header("wren_step_rows_total", "counter", "Rows of the scheduler's steps, by kind (decode token, prefill token).");
  s += "wren_step_rows_total{kind=\"decode\"} " + std::to_string(g.decode_rows) + "\n";
  s += "wren_step_rows_total{kind=\"prefill\"} " + std::to_string(g.prefill_rows) + "\n";
  s += header("wren_expert_visits_total", "counter", "Routed experts run (each unique expert of a step once; host-routed MoE).");
  s += "wren_expert_visits_total " + std::to_string(g.expert_visits) + "\n";
  s += header("wren_expert_weight_bytes_total", "counter", "Bytes of routed-expert weights those visits read.");
  s += "wren_expert_weight_bytes_total " + std::to_string(g.expert_bytes) + "\n";
  if (g.has_store) {
    const uint64_t all = g.expert_hits + g.expert_misses;
    s += header("wren_expert_cache_hits_total", "counter", "Routed-expert lookups served from the cache.");
    s += "wren_expert_cache_hits_total " + std::to_string(g.expert_hits) + "\n";
    s += header("wren_expert_cache_misses_total", "counter", "Routed-expert lookups that read from disk.");
    s += "wren_expert_cache_misses_total " + std::to_string(g.expert_misses) + "\n";
    s += header("wren_expert_cache_hit_rate", "gauge", "Expert cache hits / lookups since start.");
    s += "wren_expert_cache_hit_rate " + num(all ? double(g.expert_hits) / double(all) : 0.0) + "\n";
    s += header("wren_expert_bytes_read_total", "counter", "Bytes of routed experts read from disk.");
    s += "wren_expert_bytes_read_total " + std::to_string(g.expert_bytes_read) + "\n";
  }
  if (g.has_prefix_cache) {
    s += header("wren_prefix_cache_lookups_total", "counter", "Prompts looked up in the prefix cache.");
    s += "wren_prefix_cache_lookups_total " + std::to_string(g.prefix_lookups) + "\n";
    s += header("wren_prefix_cache_hits_total", "counter", "Prompts resumed from a cached prefix.");
    s += "wren_prefix_cache_hits_total " + std::to_string(g.prefix_hits) + "\n";
    s += header("wren_prefix_cache_cached_tokens_total", "counter", "Prompt tokens restored instead of prefilled.");
    s += "wren_prefix_cache_cached_tokens_total " + std::to_string(g.prefix_cached_tokens) + "\n";
    s += header("wren_prefix_cache_bytes", "gauge", "Host bytes the prefix cache's snapshots take.");
    s += "wren_prefix_cache_bytes " + std::to_string(g.prefix_bytes) + "\n";
    s += header("wren_prefix_cache_entries", "gauge", "Snapshots in the prefix cache.");
    s += "wren_prefix_cache_entries " + std::to_string(g.prefix_entries) + "\n";
  }
  return s;
}

}  // namespace wren::server
