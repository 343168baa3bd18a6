// `wren bench kernels|quality|model`: measurements that carry their own reference, taken in the same run.
//   kernels  GB/s of weights streamed by each GEMV (one token) at sizes far beyond the caches,
//            against a STREAM-like copy measured in the same run (ratio), plus the chunk GEMM.
//   quality  teacher-forced logits of every --quant mode against the exact f32 run (rel-L2, top-1).
//   model    prefill and decode tok/s of every --quant mode, with the exact f32 mode as reference.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "bench/bench.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/nll.h"
#include "model/forward.h"
#include "model/quant.h"
#include "model/tensor_table.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace wren::bench {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// CPU seconds of the calling thread (stops while the OS runs something else).
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// Fast deterministic filler (xorshift64*).
struct Filler {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  void bytes(uint8_t* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t v = next();
      std::memcpy(p + i, &v, 8);
    }
    for (; i < n; ++i) p[i] = uint8_t(next());
  }
  float uniform() { return float(next() >> 40) / float(1 << 24) * 2.0f - 1.0f; }
};

// ---------------------------------------------------------------- kernels

/// Best-of-reps seconds of f(), run on every thread of `pool` over `tasks` tasks.
template <class F>
double best_time(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

/// A STREAM-like copy between two buffers of `bytes`, split over the pool. GB/s counts the bytes
/// read plus the bytes written (STREAM's convention).
struct Copier {
  cpu::ThreadPool& pool;
  std::vector<uint8_t> a, b;
  Copier(cpu::ThreadPool& p, size_t bytes) : pool(p), a(bytes), b(bytes) { Filler().bytes(a.data(), bytes); }
  void run() {
    const size_t bytes = a.size();
    const int tasks = pool.threads() * 16;
    const size_t part = (bytes / tasks + 63) / 64 * 64;
    pool.run(tasks, [&](int i, int) {
      const size_t lo = std::min(bytes, size_t(i) * part), hi = std::min(bytes, lo + part);
      std::memcpy(b.data() + lo, a.data() + lo, hi - lo);
    });
  }
  double gbs(double s) const { return 2.0 * double(a.size()) / s / 1e9; }
};

/// Read-only reference: sum of 64-bit words over `bytes`, split over the pool.
double read_gbs(cpu::ThreadPool& pool, size_t bytes, int reps) {
  std::vector<uint64_t> a(bytes / 8);
  Filler().bytes(reinterpret_cast<uint8_t*>(a.data()), a.size() * 8);
  const int tasks = pool.threads() * 16;
  std::vector<uint64_t> sums(tasks);
  const size_t part = (a.size() + tasks - 1) / tasks;
  const double t = best_time(reps, [&] {
    pool.run(tasks, [&](int i, int) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      const size_t lo = std::min(a.size(), size_t(i) * part), hi = std::min(a.size(), lo + part);
      size_t j = lo;
      for (; j + 4 <= hi; j += 4) s0 += a[j], s1 += a[j + 1], s2 += a[j + 2], s3 += a[j + 3];
      for (; j < hi; ++j) s0 += a[j];
      sums[i] = s0 + s1 + s2 + s3;
    });
  });
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  if (total == 42) std::fprintf(stderr, " ");  // keeps the reads alive
  return double(a.size() * 8) / t / 1e9;
}

/// A random dense matrix [rows, cols] in format f with sane values.
struct DenseBench {
  DenseWeight w;
  std::vector<uint8_t> data;
  std::vector<float> scale;
};

DenseBench make_dense(WFormat f, int rows, int cols) {
  DenseBench b;
  Filler r;
  b.data.resize(wformat_data_bytes(f, rows, cols));
  b.scale.resize(wformat_scale_count(f, rows, cols));
  if (f == WFormat::F32 || f == WFormat::BF16) {
    const size_t n = size_t(rows) * cols;
    for (size_t i = 0; i < n; ++i) {
      const float v = r.uniform() * 0.02f;
      if (f == WFormat::F32) std::memcpy(b.data.data() + 4 * i, &v, 4);
      else {
        const uint16_t h = f32_to_bf16(v);
        std::memcpy(b.data.data() + 2 * i, &h, 2);
      }
    }
  } else {
    r.bytes(b.data.data(), b.data.size());
    for (auto& s : b.scale) s = 0.001f * (1.0f + r.uniform() * 0.5f);
  }
  b.w.rows = rows, b.w.cols = cols, b.w.data = b.data.data(), b.w.format = f;
  b.w.scale = b.scale.empty() ? nullptr : b.scale.data();
  return b;
}

/// Runs `rows_fn(r0, r1)` over row blocks on the pool (the split CpuBackend::gemm uses).
template <class F>
void over_rows(cpu::ThreadPool& pool, int rows, F&& rows_fn) {
  const int block = std::max(4, (rows / (8 * pool.threads()) + 3) / 4 * 4);
  pool.run((rows + block - 1) / block, [&](int i, int) { rows_fn(i * block, std::min(rows, (i + 1) * block)); });
}

struct Row {
  std::string name;
  int rows, cols;
  double bytes, gemv_s, gemm_s, copy_gbs;
};

/// Best-of-reps times of the kernel at T = 1 and T = chunk, each rep preceded by a copy of the
/// same size, so every row has its own reference taken in the same seconds (the machine is shared).
/// Seconds of f() by the wall clock, or by the thread's CPU clock when `cpu` (one thread).
template <class F>
double timed(bool cpu, F&& f) {
  if (cpu) {
    const double t0 = thread_cpu_seconds();
    f();
    return thread_cpu_seconds() - t0;
  }
  const auto t0 = Clock::now();
  f();
  return seconds_since(t0);
}

template <class F>
void measure(Row& row, Copier& copy, int reps, int chunk, bool cpu, F&& kernel) {
  double c = 1e30, g1 = 1e30, gT = 1e30;
  for (int r = 0; r < reps; ++r) {
    c = std::min(c, timed(cpu, [&] { copy.run(); }));
    g1 = std::min(g1, timed(cpu, [&] { kernel(1); }));
    gT = std::min(gT, timed(cpu, [&] { kernel(chunk); }));
  }
  row.gemv_s = g1, row.gemm_s = gT, row.copy_gbs = copy.gbs(c);
}

void print_row(const Row& r, int chunk) {
  const double gbs = r.bytes / r.gemv_s / 1e9;
  std::printf("| %-12s | %6d x %-5d | %6.1f | %9.2f | %9.2f | %5.2fx | %8.2f | %10.1f |\n", r.name.c_str(), r.rows,
              r.cols, r.bytes / 1e6, gbs, r.copy_gbs, gbs / r.copy_gbs, r.gemv_s * 1e3, chunk / r.gemm_s);
}

std::string loadavg() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  char buf[64] = "?";
  if (f) {
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
    std::fclose(f);
  }
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void bench_kernels(const KernelArgs& a) {
  const CpuOptions o = a.cpu;
  const cpu::Kernels& k = cpu::kernels_for(o.isa);
  cpu::ThreadPool pool(o.threads);
  const size_t ref_bytes = size_t(a.mb * 1e6);
  check(a.cols % 64 == 0, "--cols must be a multiple of 64");
  check(!a.cpu_time || o.threads == 1, "--cpu-time needs --threads 1");
  std::printf("wren bench kernels: isa %s, %d threads, cols %d, ~%.0f MB of weights per matrix, best of %d, %s clock; load average %s\n",
              cpu::isa_name(o.isa), o.threads, a.cols, a.mb, a.reps, a.cpu_time ? "thread CPU" : "wall", loadavg().c_str());
  Copier copy(pool, ref_bytes);
  const double read = read_gbs(pool, ref_bytes, a.reps);
  std::vector<Row> rows;
  Filler fx;
  for (int f = 0; f < kWFormats + 2; ++f) {
    const bool mx = f >= kWFormats;
    const double bpw = mx ? 0.5 + 1.0 / 32 : double(wformat_data_bytes(WFormat(f), 1, 64) + 4 * wformat_scale_count(WFormat(f), 1, 64)) / 64;
    const int R = std::max(64, int(double(ref_bytes) / (bpw * a.cols)) / 64 * 64);
    std::vector<float> x(size_t(a.chunk) * a.cols), y(size_t(a.chunk) * R);
    for (float& v : x) v = fx.uniform();
    Row row{mx ? (f == kWFormats ? "mxfp4 x f32" : "mxfp4 x int8") : wformat_name(WFormat(f)), R, a.cols, 0, 0, 0, 0};
    if (!mx) {
      DenseBench b = make_dense(WFormat(f), R, a.cols);
      row.bytes = double(b.data.size() + 4 * b.scale.size());
      const cpu::DenseRowsFn fn = k.dense[f];
      measure(row, copy, a.reps, a.chunk, a.cpu_time, [&](int T) {
        over_rows(pool, R, [&](int r0, int r1) { fn(b.w, x.data(), T, y.data(), R, r0, r1); });
      });
    } else {
      const bool i8 = f == kWFormats + 1;
      std::vector<uint8_t> packed(size_t(R) * a.cols / 2), scale(size_t(R) * a.cols / 32);
      Filler().bytes(packed.data(), packed.size());
      for (auto& s : scale) s = uint8_t(118 + fx.next() % 3);
      const MxMatrix m{R, a.cols, packed.data(), scale.data()};
      row.bytes = double(packed.size() + scale.size());
      std::vector<float> fb(x.size()), sb(x.size() / 32);
      std::vector<int8_t> qb(x.size());
      const cpu::MxRowsFn fn = i8 ? k.mx_i8 : k.mx_f32;
      measure(row, copy, a.reps, a.chunk, a.cpu_time, [&](int T) {
        const cpu::MxAct act = cpu::mx_prep(o.isa, x.data(), T, a.cols, i8, fb.data(), qb.data(), sb.data());
        over_rows(pool, R, [&](int r0, int r1) { fn(m, act, y.data(), R, r0, r1); });
      });
    }
    rows.push_back(row);
  }
  std::printf("reference: STREAM-like copy of %.0f MB (GB/s = read + written bytes), measured before every kernel\n"
              "repetition; read-only sum %.2f GB/s. Load average after: %s\n\n", a.mb, read, loadavg().c_str());
  std::printf("| kernel       | rows x cols    | MB     | GEMV GB/s | copy GB/s | ratio  | GEMV ms  | GEMM T=%-2d tok/s |\n", a.chunk);
  std::printf("|--------------|----------------|--------|-----------|-----------|--------|----------|-----------------|\n");
  for (const Row& r : rows) print_row(r, a.chunk);
}

// ---------------------------------------------------------------- quality

std::vector<int> random_ids(int n, int vocab, int seed) {
  Filler r;
  r.s ^= uint64_t(seed) * 0x2545F4914F6CDD1Dull;
  std::vector<int> ids(n);
  for (int& id : ids) id = int(r.next() % uint64_t(vocab));
  return ids;
}

/// Teacher-forced logits [T, V] of `ids` through model `m`.
std::vector<float> teacher_forced(const Model& m, const CpuOptions& o, const std::vector<int>& ids, int chunk) {
  CpuBackend be(o);
  Forward fwd(m, be, {chunk, -1});
  SequenceState st(be, m.config, int(ids.size()) + 1);
  std::vector<float> out(ids.size() * size_t(m.config.vocab));
  fwd.run(st, ids.data(), nullptr, int(ids.size()), out.data(), true);
  return out;
}

/// The dense tensors of a loaded model, in table order.
std::vector<DenseWeight*> dense_tensors(Model& m) {
  std::vector<DenseWeight*> out;
  for_each_tensor(m.config, m.weights, [&](const TensorSpec& s) {
    if (s.dense) out.push_back(s.dense);
  });
  return out;
}

/// Mean over the matrices `q` stores in another format than f32 of ‖deq(Q) − W‖ / ‖W‖ (0 when none).
double weight_rel_l2(Model& exact, Model& q) {
  const auto a = dense_tensors(exact), b = dense_tensors(q);
  double sum = 0;
  int n = 0;
  std::vector<float> row;
  for (size_t i = 0; i < a.size(); ++i) {
    if (b[i]->format == WFormat::F32) continue;
    double num = 0, den = 0;
    row.resize(size_t(b[i]->cols));
    for (int64_t r = 0; r < b[i]->rows; ++r) {
      dequant_row(*b[i], r, row.data());
      const float* w = a[i]->f32() + r * a[i]->cols;
      for (int64_t c = 0; c < b[i]->cols; ++c) num += (double(row[c]) - w[c]) * (double(row[c]) - w[c]), den += double(w[c]) * w[c];
    }
    sum += den > 0 ? std::sqrt(num / den) : 0.0;
    ++n;
  }
  return n ? sum / n : 0.0;
}

/// rel-L2 over everything and the fraction of positions whose argmax agrees.
std::pair<double, double> compare(const std::vector<float>& a, const std::vector<float>& ref, int V) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]), den += double(ref[i]) * ref[i];
  const size_t T = a.size() / V;
  size_t agree = 0;
  for (size_t t = 0; t < T; ++t) agree += argmax(a.data() + t * V, V) == argmax(ref.data() + t * V, V);
  return {std::sqrt(num / std::max(den, 1e-300)), double(agree) / double(T)};
}

/// Teacher-forced text: windows of `window` ([BOS] + window-1 tokens, each from a fresh state), and
/// per scored row the token it predicts. Logits are kept for the scored rows only.
struct TextCase {
  std::vector<std::vector<int>> windows;
  std::vector<int> targets;
};

TextCase text_case(const std::string& model, const std::string& file, int window, int positions, int bos) {
  std::ifstream f(file, std::ios::binary);
  check(bool(f), file + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<int> ids = Tokenizer::load(model).encode(text, SpecialMode::Disabled);
  check(!ids.empty(), file + ": no tokens (empty file)");
  if (positions > 0 && ids.size() > size_t(positions)) ids.resize(size_t(positions));
  TextCase tc;
  const size_t step = size_t(window - 1);
  for (size_t start = 0; start < ids.size(); start += step) {
    const size_t n = std::min(step, ids.size() - start);
    std::vector<int> w{bos};
    w.insert(w.end(), ids.begin() + long(start), ids.begin() + long(start + n));
    tc.targets.insert(tc.targets.end(), w.begin() + 1, w.end());
    tc.windows.push_back(std::move(w));
  }
  return tc;
}

/// Logits [scored rows, V] of every window of `tc` (the last row of each window dropped).
std::vector<float> teacher_forced_text(const Model& m, const CpuOptions& o, const TextCase& tc, int chunk) {
  const size_t V = size_t(m.config.vocab);
  std::vector<float> out;
  out.reserve(tc.targets.size() * V);
  for (const auto& w : tc.windows) {
    const auto l = teacher_forced(m, o, w, chunk);
    out.insert(out.end(), l.begin(), l.end() - long(V));
  }
  return out;
}

/// exp(mean −log softmax(row)[target]) in f64, as `wren perplexity`.
double perplexity_of(const std::vector<float>& logits, const std::vector<int>& targets, int V) {
  double nll = 0;
  for (size_t t = 0; t < targets.size(); ++t) nll += token_nll(logits.data() + t * size_t(V), V, targets[t]);
  return std::exp(nll / double(targets.size()));
}

void bench_quality(const QualityArgs& a) {
  const CpuOptions o = a.cpu;
  const Config c = load_config(a.model);
  const bool text = !a.text.empty();
  TextCase tc;
  std::vector<int> ids;
  if (text) {
    tc = text_case(a.model, a.text, a.window, a.positions, c.bos_id);
    std::printf("wren bench quality: %s, %zu teacher-forced positions (%s, %zu windows of up to %d), %s kernels, %d threads\n",
                a.model.c_str(), tc.targets.size(), a.text.c_str(), tc.windows.size(), a.window, cpu::isa_name(o.isa),
                o.threads);
  } else {
    check(a.positions > 0, "bench quality: --positions must be positive without --text");
    ids = random_ids(a.positions, c.vocab, a.seed);
    std::printf("wren bench quality: %s, %d teacher-forced positions (random ids, seed %d), %s kernels, %d threads\n",
                a.model.c_str(), a.positions, a.seed, cpu::isa_name(o.isa), o.threads);
  }
  auto exact = load_model(a.model);
  auto forced = [&](const Model& m, const CpuOptions& mo) {
    return text ? teacher_forced_text(m, mo, tc, a.chunk) : teacher_forced(m, mo, ids, a.chunk);
  };
  const auto ref = forced(*exact, o);
  std::printf("reference: --quant exact (every dense weight f32, experts mxfp4 x f32), %s kernels. weight rel-L2 = mean over\n"
              "the matrices the mode stores in another format of ||dequant(W) - W|| / ||W||\n", cpu::isa_name(o.isa));
  if (text)
    std::printf("perplexity of the reference on the text: %.4f\n\n"
                "| mode | formats | expert act | weight rel-L2 | logits rel-L2 | top-1 agree | perplexity |\n|---|---|---|---|---|---|---|\n",
                perplexity_of(ref, tc.targets, c.vocab));
  else
    std::printf("\n| mode | formats | expert act | weight rel-L2 | logits rel-L2 | top-1 agree |\n|---|---|---|---|---|---|\n");
  struct Mode { std::string name; QuantPlan plan; bool i8; cpu::Isa isa; };
  std::vector<Mode> modes;
  for (cpu::Isa isa : {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx512})  // f32 summation order only
    if (isa != o.isa && cpu::isa_supported(isa))
      modes.push_back({std::string("exact, ") + cpu::isa_name(isa) + " kernels", QuantPlan::preset("exact"), false, isa});
  for (const char* p : {"bf16", "q8", "default", "q4"}) modes.push_back({p, QuantPlan::preset(p), false, o.isa});
  modes.push_back({"default", QuantPlan::preset("default"), true, o.isa});
  modes.push_back({"exact", QuantPlan::preset("exact"), true, o.isa});
  if (a.per_class)
    for (int cl = 1; cl < kWClasses; ++cl)
      for (WFormat f : {WFormat::Q8_ROW, WFormat::Q4_G64}) {
        QuantPlan p;
        p.set(WClass(cl), f);
        modes.push_back({std::string("only ") + wclass_name(WClass(cl)) + "=" + wformat_name(f), p, false, o.isa});
      }
  for (const Mode& m : modes) {
    CpuOptions mo = o;
    mo.mx_int8_act = m.i8;
    mo.isa = m.isa;
    auto qm = load_model(a.model, m.plan);
    const auto l = forced(*qm, mo);
    const auto [rel, top1] = compare(l, ref, c.vocab);
    std::printf("| %s | %s | %s | %.3g | %.3g | %.1f%% |", m.name.c_str(), m.plan.describe().c_str(),
                m.i8 ? "int8" : "f32", weight_rel_l2(*exact, *qm), rel, 100 * top1);
    if (text) std::printf(" %.4f |", perplexity_of(l, tc.targets, c.vocab));
    std::printf("\n");
    std::fflush(stdout);
  }
}

// ---------------------------------------------------------------- model speed

/// Prefill `ids`, then `gen` greedy decode steps; seconds of each phase by the chosen clock.
std::pair<double, double> time_generation(Forward& fwd, SequenceState& st, const std::vector<int>& ids, int gen,
                                          bool cpu) {
  const int V = fwd.config().vocab;
  std::vector<float> logits(V);
  const double prefill = timed(cpu, [&] { fwd.run(st, ids.data(), nullptr, int(ids.size()), logits.data(), false); });
  const double decode = timed(cpu, [&] {
    for (int n = 0; n < gen; ++n) {
      const int id = argmax(logits.data(), V);
      fwd.run(st, &id, nullptr, 1, logits.data(), false);
    }
  });
  return {prefill, decode};
}

void bench_model(const SpeedArgs& a) {
  const CpuOptions o = a.cpu;
  check(!a.cpu_time || o.threads == 1, "--cpu-time needs --threads 1");
  const Config c = load_config(a.model);
  const std::vector<int> ids = random_ids(a.prompt, c.vocab, 7);
  std::printf("wren bench model: %s, prompt %d tokens (chunk %d), decode %d tokens, %s kernels, %d threads, %s clock; load average %s\n\n",
              a.model.c_str(), a.prompt, a.chunk, a.gen, cpu::isa_name(o.isa), o.threads,
              a.cpu_time ? "thread CPU" : "wall", loadavg().c_str());
  std::printf("| mode | expert act | prefill tok/s | decode tok/s | prefill vs %s | decode vs %s |\n|---|---|---|---|---|---|\n",
              a.modes[0].c_str(), a.modes[0].c_str());
  double ref_p = 0, ref_d = 0;
  for (const std::string& spec : a.modes) {
    const bool i8 = spec.size() > 5 && spec.compare(spec.size() - 5, 5, "+int8") == 0;
    const std::string name = i8 ? spec.substr(0, spec.size() - 5) : spec;
    auto m = load_model(a.model, QuantPlan::preset(name));
    CpuOptions mo = o;
    mo.mx_int8_act = i8;
    CpuBackend be(mo);
    Forward fwd(*m, be, {a.chunk, -1});
    SequenceState st(be, m->config, a.prompt + a.gen + 1);
    time_generation(fwd, st, ids, 2, a.cpu_time);  // warm-up: touches every page and expert once
    st.reset();
    const auto [ps, ds] = time_generation(fwd, st, ids, a.gen, a.cpu_time);
    const double p = a.prompt / ps, d = a.gen / ds;
    if (ref_p == 0) ref_p = p, ref_d = d;
    std::printf("| %s | %s | %.2f | %.2f | %.2fx | %.2fx |\n", name.c_str(), i8 ? "int8" : "f32", p, d, p / ref_p, d / ref_d);
    std::fflush(stdout);
  }
  std::printf("\nload average after: %s\n", loadavg().c_str());
}

}  // namespace


void run_kernels(const KernelArgs& a) { bench_kernels(a); }
void run_quality(const QualityArgs& a) { bench_quality(a); }
void run_model(const SpeedArgs& a) { bench_model(a); }

}  // namespace wren::bench
