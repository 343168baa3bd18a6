// `wren bench tokenizer`: encode throughput (MB/s) of Wren's tokenizer and of the tiktoken core
// (npm `tiktoken`, the Rust core compiled to WASM, driven by tests/tokenizer/oracle.js) on the same
// corpus files in the same run, with the ids of both compared (count and FNV-1a hash).
//
// Corpora (default): english (README + docs), code (the C++/CUDA sources), mixed (the tokenizer
// test strings: every script, emoji, digits, whitespace), each about --mb megabytes, written by
// `oracle.js bench-corpus`. Vocabulary (default): the full o200k_base ranks with the K3 specials,
// written once into the cache folder by `oracle.js o200k`. Both sides: one thread, one warm-up,
// best of --reps runs, timed by CPU time (Wren's thread, node's process: robust on a loaded
// machine; the ratio is the headline) and by the wall clock; reading the file and loading the
// vocabulary are not timed.
// Both sides run the core, encode_ordinary (pre-tokenizer + rank-BPE, specials disabled), on the
// whole file: Wren's encode() would add upstream's 400,000-character slices, which tiktoken's
// encode_ordinary does not have, so the ids would differ at the slice boundaries.
#include <sys/wait.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "bench/bench.h"
#include "core/error.h"
#include "runtime/default_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace wren::bench {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string shq(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

/// Runs a shell command, returning its stdout; throws wren::Error with its output on failure.
std::string run_or_throw(const std::string& cmd, const std::string& what) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  check(p != nullptr, "bench tokenizer: cannot start: " + cmd);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = ::pclose(p);
  const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  if (rc != 0) {  // the child's first error line, not its stack trace
    std::string first;
    std::istringstream lines(out);
    for (std::string l; std::getline(lines, l);)
      if (l.find("Error") != std::string::npos || l.find("error") != std::string::npos) {
        first = l;
        break;
      }
    if (first.empty()) first = out.substr(0, out.find('\n'));
    throw Error("bench tokenizer: " + what + (rc == 124 ? " timed out" : " failed (exit " + std::to_string(rc) + ")") +
                ": " + first);
  }
  return out;
}

/// FNV-1a over 32-bit ids, as oracle.js computes it.
uint32_t fnv(const std::vector<int>& ids) {
  uint32_t h = 0x811c9dc5u;
  for (int id : ids) h = (h ^ uint32_t(id)) * 16777619u;
  return h;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::string read_file(const std::string& path) {
  check(fs::is_regular_file(path), "bench tokenizer: corpus " + path + " is not a readable regular file");
  std::ifstream f(path, std::ios::binary);
  check(bool(f), "bench tokenizer: cannot read corpus file " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

/// The oracle script, checked to be runnable (node + the npm package), or a clear error.
std::string find_oracle(const std::string& given) {
  const std::string oracle = given.empty() ? source_dir() + "/tests/tokenizer/oracle.js" : given;
  check(fs::exists(oracle), "bench tokenizer: the tiktoken driver " + oracle + " is missing (pass --oracle PATH)");
  run_or_throw("node --version", "node (needed to run the tiktoken core; scripts/setup.sh installs nodejs)");
  const fs::path pkg = fs::path(oracle).parent_path() / "node_modules/tiktoken/package.json";
  check(fs::exists(pkg), "bench tokenizer: the npm package 'tiktoken' is missing (" + pkg.string() +
                             "); run `npm ci --prefix " + fs::path(oracle).parent_path().string() +
                             "` (scripts/setup.sh does this)");
  return oracle;
}

/// The full o200k_base vocabulary with the K3 specials, written once into the cache folder.
std::string o200k_model(const std::string& oracle) {
  const std::string dir = cache_root() + "/o200k-k3-tokenizer";
  if (fs::exists(dir + "/tiktoken.model") && fs::exists(dir + "/tokenizer_config.json")) return dir;
  std::fprintf(stderr, "wren: writing the o200k_base vocabulary to %s (first use)...\n", dir.c_str());
  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(tmp);
  std::ofstream(tmp + "/k3_tokenizer_config.json") << default_tokenizer_config();
  run_or_throw("node " + shq(oracle) + " o200k " + shq(tmp + "/k3_tokenizer_config.json") + " " + shq(tmp),
               "writing the o200k vocabulary");
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) fs::remove_all(tmp);
  return dir;
}

struct Row {
  std::string name;
  size_t bytes = 0, ids = 0, oracle_ids = 0;
  uint32_t hash = 0, oracle_hash = 0;
  double wren_s = 0, oracle_s = 0, wren_cpu_s = 0, oracle_cpu_s = 0;
  double wren_mbs() const { return double(bytes) / 1e6 / wren_cpu_s; }      ///< CPU-time MB/s
  double oracle_mbs() const { return double(bytes) / 1e6 / oracle_cpu_s; }
  double wall_ratio() const { return oracle_s / wren_s; }
  bool equal() const { return ids == oracle_ids && hash == oracle_hash; }
};

void bench_tokenizer(const TokenizerArgs& a) {
  const std::string oracle = find_oracle(a.oracle);
  const std::string model = a.model.empty() ? o200k_model(oracle) : a.model;
  std::vector<std::string> files = a.corpus;
  std::string tmp;
  if (files.empty()) {
    tmp = (fs::temp_directory_path() / ("wren-tokbench-" + std::to_string(::getpid()))).string();
    char mb[32];
    std::snprintf(mb, sizeof mb, "%g", a.mb);
    run_or_throw("node " + shq(oracle) + " bench-corpus " + shq(source_dir()) + " " + mb + " " + shq(tmp),
                 "writing the corpora");
    for (const char* n : {"english", "code", "mixed"}) files.push_back(tmp + "/" + n + ".txt");
  }
  const std::string load_before = load_average();
  const Tokenizer tok = Tokenizer::load(model);
  std::vector<Row> rows;
  for (const std::string& f : files) {
    Row r;
    r.name = fs::path(f).stem().string();
    const std::string text = read_file(f);
    r.bytes = text.size();
    check(r.bytes > 0, "bench tokenizer: corpus " + f + " is empty");
    check(utf8::is_valid(text), "bench tokenizer: " + f + " is not well-formed UTF-8 (the compared core, "
                            "encode_ordinary, takes text)");
    std::vector<int> ids = tok.encode_ordinary(text);  // warm-up
    r.wren_s = r.wren_cpu_s = 1e30;
    for (int i = 0; i < a.reps; ++i) {
      const double t0 = now_s(), c0 = thread_cpu_s();
      ids = tok.encode_ordinary(text);
      r.wren_cpu_s = std::min(r.wren_cpu_s, thread_cpu_s() - c0);
      r.wren_s = std::min(r.wren_s, now_s() - t0);
    }
    r.ids = ids.size();
    r.hash = fnv(ids);
    rows.push_back(r);
  }
  // tiktoken's core is quadratic in the length of one pre-tokenizer piece (MBs of one emoji, say):
  // bounded so the benchmark ends with an error instead of hanging.
  std::string cmd = "timeout 600 node ";  // appended in place: GCC 12's -Wrestrict misfires on operator+
  cmd += shq(oracle);
  cmd += " bench ";
  cmd += shq(model);
  cmd += ' ';
  cmd += std::to_string(a.reps);
  for (const std::string& f : files) {
    cmd += ' ';
    cmd += shq(f);
  }
  std::istringstream lines(run_or_throw(cmd, "the tiktoken run"));
  size_t i = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    check(i < rows.size(), "bench tokenizer: the tiktoken run printed more results than files");
    const json j = json::parse(line);
    rows[i].oracle_ids = j.at("ids").get<size_t>();
    rows[i].oracle_hash = j.at("hash").get<uint32_t>();
    rows[i].oracle_s = j.at("best_s").get<double>();
    rows[i].oracle_cpu_s = j.at("best_cpu_s").get<double>();
    check(j.at("bytes").get<size_t>() == rows[i].bytes, "bench tokenizer: tiktoken read a different size of " + files[i]);
    ++i;
  }
  check(i == rows.size(), "bench tokenizer: the tiktoken run printed " + std::to_string(i) + " results for " +
                              std::to_string(rows.size()) + " files");
  if (!tmp.empty()) fs::remove_all(tmp);
  const std::string load_after = load_average();

  if (a.json) {
    json out = {{"model", model}, {"reps", a.reps}, {"load_before", load_before}, {"load_after", load_after}};
    for (const Row& r : rows)
      out["corpora"].push_back({{"name", r.name}, {"bytes", r.bytes}, {"ids", r.ids}, {"ids_equal", r.equal()},
                                {"wren_mb_s", r.wren_mbs()}, {"tiktoken_mb_s", r.oracle_mbs()},
                                {"ratio", r.wren_mbs() / r.oracle_mbs()}, {"wall_ratio", r.wall_ratio()},
                                {"wren_wall_mb_s", double(r.bytes) / 1e6 / r.wren_s},
                                {"tiktoken_wall_mb_s", double(r.bytes) / 1e6 / r.oracle_s}});
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("wren bench tokenizer: vocabulary %s (%d ranks), one thread each, best of %d after a warm-up; "
                "MB/s by CPU time, wall-clock ratio beside; load average %s (after: %s)\n", model.c_str(), tok.n_ranks(), a.reps,
                load_before.c_str(), load_after.c_str());
    std::printf("both: encode_ordinary of each whole file; reference: npm tiktoken (the Rust core as WASM)\n\n");
    std::printf("| corpus   | MB     | tokens    | ids equal | Wren MB/s | tiktoken MB/s | ratio  | wall ratio |\n");
    std::printf("|----------|--------|-----------|-----------|-----------|---------------|--------|------------|\n");
    for (const Row& r : rows)
      std::printf("| %-8s | %6.2f | %9zu | %-9s | %9.2f | %13.2f | %5.2fx | %9.2fx |\n", r.name.c_str(),
                  double(r.bytes) / 1e6, r.ids, r.equal() ? "yes" : "NO", r.wren_mbs(), r.oracle_mbs(),
                  r.wren_mbs() / r.oracle_mbs(), r.wall_ratio());
  }
  for (const Row& r : rows)
    check(r.equal(), "bench tokenizer: " + r.name + ": Wren and tiktoken produced different ids (" +
                         std::to_string(r.ids) + " vs " + std::to_string(r.oracle_ids) + " tokens)");
}

}  // namespace


void run_tokenizer(const TokenizerArgs& a) { bench_tokenizer(a); }

}  // namespace wren::bench
