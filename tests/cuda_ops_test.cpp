// Every CUDA op against the CPU reference backend (docs/gpu-method.md#per-op): random non-zero inputs,
// many shapes including awkward ones (sizes not multiples of 32, T = 1, T = 33, K3 sizes), outputs
// poisoned with NaN before each GPU call so an unwritten element fails, state carried over several
// calls. Each op states its tolerance next to its test (rel-L2 = ‖gpu − cpu‖ / ‖cpu‖); a summary
// of the worst error per op is printed at the end. Without a device every test skips with
// "no CUDA device: ..."; without the CUDA build, with "CUDA backend not built".
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/argmax.h"
#include "core/error.h"
#include "core/mxfp4.h"
#include "model/quant.h"
#include "test_util.h"
#ifdef WREN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace wren {
namespace {

#ifndef WREN_HAVE_CUDA
TEST(CudaOps, NotBuilt) { GTEST_SKIP() << "CUDA backend not built (configure with -DWREN_CUDA=ON; nvcc needed)"; }
#else

// ---- comparison and reporting ----

struct Diff {
  double max_abs = 0, rel_l2 = 0;
  size_t nan_mismatch = 0;  ///< positions where exactly one side is NaN (e.g. unwritten poison)
  bool identical = true;
};

Diff diff(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  Diff d;
  double num = 0, den = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const bool gn = std::isnan(gpu[i]), cn = std::isnan(cpu[i]);
    if (gn || cn) {
      d.nan_mismatch += gn != cn;
      d.identical = d.identical && gn && cn;
      continue;
    }
    if (std::memcmp(&gpu[i], &cpu[i], 4) != 0) d.identical = false;
    const double e = std::fabs(double(gpu[i]) - cpu[i]);
    d.max_abs = std::max(d.max_abs, e);
    num += e * e;
    den += double(cpu[i]) * cpu[i];
  }
  d.rel_l2 = std::sqrt(num / (den > 0 ? den : 1e-300));
  if (den == 0 && num == 0) d.rel_l2 = 0;
  return d;
}

struct OpReport {
  double worst_rel = 0, worst_abs = 0, tol = 0;
  int cases = 0, identical = 0;
};
std::map<std::string, OpReport>& reports() {
  static std::map<std::string, OpReport> r;
  return r;
}

/// Records and checks one comparison: no NaN mismatch, rel-L2 <= tol.
void expect_close(const std::string& op, const std::string& shape, const std::vector<float>& gpu,
                  const std::vector<float>& cpu, double tol) {
  ASSERT_EQ(gpu.size(), cpu.size()) << op << " " << shape;
  const Diff d = diff(gpu, cpu);
  OpReport& r = reports()[op];
  r.worst_rel = std::max(r.worst_rel, d.rel_l2);
  r.worst_abs = std::max(r.worst_abs, d.max_abs);
  r.tol = tol;
  ++r.cases;
  r.identical += d.identical;
  EXPECT_EQ(d.nan_mismatch, 0u) << op << " " << shape << ": NaN on one side only (unwritten output?)";
  EXPECT_LE(d.rel_l2, tol) << op << " " << shape << ": max |Δ| " << d.max_abs;
}

class ReportEnv : public ::testing::Environment {
 public:
  void TearDown() override {
    if (reports().empty()) return;
    std::printf("[ cuda ops ] op: cases, bit-identical cases, worst rel-L2, worst max|Δ| (tolerance rel-L2)\n");
    for (const auto& [op, r] : reports())
      std::printf("[ cuda ops ] %-14s %4d cases, %4d identical, rel-L2 %.3g, max|Δ| %.3g (tol %.0e)\n", op.c_str(),
                  r.cases, r.identical, r.worst_rel, r.worst_abs, r.tol);
  }
};
const auto* const kReportEnv = ::testing::AddGlobalTestEnvironment(new ReportEnv);

// ---- fixture and buffers ----

using test::HostWeight;
using test::random_vec;

class CudaOps : public ::testing::Test, protected test::BackendBuffers {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (cuda_device_available(&why)) be_ = new CudaBackend();
    else why_ = new std::string(why);
  }
  static void TearDownTestSuite() {
    delete be_;
    be_ = nullptr;
    delete why_;
    why_ = nullptr;
  }
  void SetUp() override {
    if (!be_) GTEST_SKIP() << "no CUDA device: " << *why_;
  }
  Backend& buffers_backend() override { return *be_; }
  void TearDown() override { release_owned(); }
  static CudaBackend* be_;
  static std::string* why_;
  CpuBackend cpu_;
};
CudaBackend* CudaOps::be_ = nullptr;
std::string* CudaOps::why_ = nullptr;

std::string shape(std::initializer_list<std::pair<const char*, long>> kv) {
  std::string s;
  for (const auto& [k, v] : kv) s += std::string(s.empty() ? "" : " ") + k + "=" + std::to_string(v);
  return s;
}

// ---- memory ----

TEST_F(CudaOps, MemoryAllocZeroCopyRoundTrip) {
  std::mt19937 g(1);
  const size_t n = 1000;
  float* a = be_->alloc(n);
  owned_.push_back(a);
  EXPECT_EQ(host(a, n), std::vector<float>(n, 0.f)) << "alloc must zero-fill";
  const auto x = random_vec(g, n);
  float* b = dev(x);
  EXPECT_EQ(host(b, n), x);
  be_->copy(b, n, a);
  EXPECT_EQ(host(a, n), x);
  be_->copy(a, n - 10, a + 10);  // overlapping: memmove semantics
  std::vector<float> want = x;
  std::memmove(want.data() + 10, want.data(), (n - 10) * 4);
  EXPECT_EQ(host(a, n), want);
  be_->fill_zero(a + 5, 7);
  std::fill(want.begin() + 5, want.begin() + 12, 0.f);
  EXPECT_EQ(host(a, n), want);
}

TEST_F(CudaOps, WeightNotUploadedIsAnError) {
  HostWeight w({1, 2, 3, 4}, 2, 2);
  float* x = dev({1, 1});
  float* y = poisoned(2);
  try {
    be_->gemm(w.w, x, 1, y);
    FAIL() << "gemm with a weight that was never uploaded must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device copy"), std::string::npos) << e.what();
  }
}

// ---- dense ----

// gemm: reproduces cpu::dot's order (8 lanes, CPU tree) -> expected bit-identical; tolerance rel-L2 1e-6.
TEST_F(CudaOps, GemmMatchesCpu) {
  std::mt19937 g(2);
  const int cases[][3] = {{1, 1, 1},    {7, 5, 1},     {33, 31, 1},   {64, 128, 1}, {100, 257, 3},
                          {129, 96, 8}, {257, 33, 9},  {31, 1000, 33}, {1000, 7, 17}, {4352, 128, 2},
                          {96, 7168, 1}, {300, 3584, 5}, {12, 12288, 33}};
  for (const auto& c : cases) {
    const int rows = c[0], cols = c[1], T = c[2];
    HostWeight w(random_vec(g, size_t(rows) * cols), rows, cols);
    const auto x = random_vec(g, size_t(T) * cols);
    be_->upload(w.w);
    float* dx = dev(x);
    float* dy = poisoned(size_t(T) * rows);
    be_->gemm(w.w, dx, T, dy);
    std::vector<float> ref(size_t(T) * rows);
    cpu_.gemm(w.w, x.data(), T, ref.data());
    expect_close("gemm", shape({{"rows", rows}, {"cols", cols}, {"T", T}}), host(dy, ref.size()), ref, 1e-6);
  }
}

// The decode GEMV of few-row f32 matrices (gemm.cu gemv_row_kernel: rows <= 4096, T = 1, a block
// per row staging the row and x in shared memory) keeps cpu::dot's order: bit-identical to the CPU
// on the K3 / Kimi Linear small projections, odd column counts and a misaligned x (scalar staging),
// and at the 4096 / 4097-row boundary (4097 takes the 32-row kernel). Every element compared exactly.
TEST_F(CudaOps, GemvFewRowsBitIdenticalToCpu) {
  std::mt19937 g(21);
  const int cases[][3] = {{96, 7168, 0}, {128, 7168, 0}, {896, 7168, 0}, {1536, 7168, 1}, {32, 2304, 0},
                          {4096, 2304, 0}, {4097, 64, 0},  {5, 13, 0},     {3, 100, 1},     {1, 1, 0},
                          {7, 12289, 0}};
  for (const auto& c : cases) {
    const int rows = c[0], cols = c[1], off = c[2];  // off: x starts 1 float into its buffer
    HostWeight w(random_vec(g, size_t(rows) * cols), rows, cols);
    const auto x = random_vec(g, size_t(cols) + off);
    be_->upload(w.w);
    float* dx = dev(x) + off;
    float* dy = poisoned(size_t(rows));
    be_->gemm(w.w, dx, 1, dy);
    std::vector<float> ref(static_cast<size_t>(rows));
    cpu_.gemm(w.w, x.data() + off, 1, ref.data());
    const std::vector<float> got = host(dy, ref.size());
    int differ = 0;
    for (int r = 0; r < rows; ++r) differ += std::memcmp(&got[r], &ref[r], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0) << "gemv rows " << rows << " cols " << cols << " x offset " << off << ": " << differ
                         << " rows not bit-identical to the CPU";
  }
}

// gemm on packed weights (BF16 / Q8_ROW / Q4_G64, ops/weights.h) against the CPU scalar reference
// kernels rows_{bf16,q8,q4}_scalar on the same packed bytes. Weights quantized by quantize_matrix
// from random non-zero f32; odd cols give a partial last q4 group and the unaligned (scalar-load)
// paths. Tolerance rel-L2 1e-5: the decoded weights are identical, only the summation order differs
// (CPU 8 strided partials or per-group sums, GPU 32 lanes + FMA + shuffle tree); f32 sums of n terms
// of mixed sign differ by ~sqrt(n)·2^-24 relative to ‖y‖ for these inputs (worst seen is printed
// in the summary; 1e-5 leaves room for the 12288-column rows).
struct PackedWeight {
  std::vector<uint8_t> data;
  std::vector<float> scale;
  DenseWeight w;
  PackedWeight(const std::vector<float>& src, int64_t rows, int64_t cols, WFormat f)
      : data(wformat_data_bytes(f, rows, cols) + 1), scale(wformat_scale_count(f, rows, cols) + 1) {
    quantize_matrix(src.data(), rows, cols, f, data.data(), scale.data());
    w.rows = rows, w.cols = cols, w.format = f, w.data = data.data();
    w.dtype = f == WFormat::BF16 ? DType::BF16 : f == WFormat::Q8_ROW ? DType::I8 : DType::U8;
    w.scale = wformat_scale_count(f, rows, cols) ? scale.data() : nullptr;
  }
};

cpu::DenseRowsFn scalar_rows(WFormat f) {
  switch (f) {
    case WFormat::BF16: return cpu::rows_bf16_scalar;
    case WFormat::Q8_ROW: return cpu::rows_q8_scalar;
    case WFormat::Q4_G64: return cpu::rows_q4_scalar;
    default: return cpu::rows_f32_scalar;
  }
}

TEST_F(CudaOps, GemmPackedMatchesCpuScalar) {
  std::mt19937 g(22);
  const int cases[][3] = {{1, 1, 1},      {7, 5, 1},     {33, 31, 3},    {64, 128, 1},   {100, 257, 3},
                          {129, 96, 8},   {257, 33, 9},  {31, 1000, 33}, {1000, 7, 17},  {9, 63, 1},
                          {9, 65, 4},     {17, 129, 33}, {40, 200, 2},   {4352, 128, 3}, {96, 7168, 1},
                          {300, 3584, 5}, {12, 12288, 33}, {513, 1024, 33}};
  for (const WFormat f : {WFormat::Q8_ROW, WFormat::BF16, WFormat::Q4_G64}) {
    const std::string op = std::string("gemm ") + wformat_name(f);
    for (const auto& c : cases) {
      const int rows = c[0], cols = c[1], T = c[2];
      const auto src = random_vec(g, size_t(rows) * cols);
      PackedWeight w(src, rows, cols, f);
      const auto x = random_vec(g, size_t(T) * cols);
      be_->upload(w.w);
      float* dx = dev(x);
      float* dy = poisoned(size_t(T) * rows);
      be_->gemm(w.w, dx, T, dy);
      std::vector<float> ref(size_t(T) * rows);
      scalar_rows(f)(w.w, x.data(), T, ref.data(), rows, 0, rows);
      expect_close(op, shape({{"rows", rows}, {"cols", cols}, {"T", T}}), host(dy, ref.size()), ref, 1e-5);
    }
  }
}

// Not a correctness test: GEMV (T = 1) bandwidth of each packed format against the f32 kernel on
// the same [8192, 8192] shape in the same run (weight bytes incl. scales / time, best of 3 x 20
// calls). Printed for docs/gpu-results.md; only checks that every timing is positive.
TEST_F(CudaOps, GemmPackedBandwidthReport) {
  std::mt19937 g(24);
  const int rows = 8192, cols = 8192;
  const auto src = random_vec(g, size_t(rows) * cols);
  const auto x = random_vec(g, cols);
  float* dx = dev(x);
  float* dy = poisoned(rows);
  auto time_it = [&](const DenseWeight& w) {
    be_->upload(w);
    be_->gemm(w, dx, 1, dy);  // warm-up
    be_->synchronize();
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) be_->gemm(w, dx, 1, dy);
      be_->synchronize();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20);
    }
    return best;
  };
  HostWeight wf(src, rows, cols);
  const double tf = time_it(wf.w);
  const double gbf = double(rows) * cols * 4 / tf / 1e9;
  std::printf("[ cuda gemv ] [%d, %d] T=1 f32: %.1f us, %.0f GB/s\n", rows, cols, tf * 1e6, gbf);
  EXPECT_GT(tf, 0);
  for (const WFormat f : {WFormat::BF16, WFormat::Q8_ROW, WFormat::Q4_G64}) {
    PackedWeight w(src, rows, cols, f);
    const double t = time_it(w.w);
    const double bytes = double(wformat_data_bytes(f, rows, cols)) + 4.0 * wformat_scale_count(f, rows, cols);
    std::printf("[ cuda gemv ] [%d, %d] T=1 %s: %.1f us, %.0f GB/s (f32 kernel %.0f GB/s; time ratio f32/%s %.2fx)\n",
                rows, cols, wformat_name(f), t * 1e6, bytes / t / 1e9, gbf, wformat_name(f), tf / t);
    EXPECT_GT(t, 0);
  }
}

// Not a correctness test: GEMV (T = 1) of the small projections of K3 (hidden 7168) and Kimi
// Linear (hidden 2304) in every dense format, against the reference copy kernel moving the same
// bytes (half read, half written) and a 512 MB copy, all timed the same way in this run: CUDA graphs
// of one call per weight copy, the copies summing to >= 150 MB where at most 256 copies allow
// (beyond the 50 MB L2, as in a real decode step; smaller footprints are marked "in L2").
TEST_F(CudaOps, GemvSmallShapesSpeedVsCopy) {
  std::mt19937 g(25);
  const double copy_gbs = be_->copy_bandwidth() / 1e9;  // 512 MB each way
  std::printf("[ gemv small ] copy kernel 512 MB -> 512 MB: %.0f GB/s (read + written)\n", copy_gbs);
  std::vector<std::unique_ptr<PackedWeight>> packed;
  std::vector<std::unique_ptr<HostWeight>> dense;
  struct Shape { const char* name; int rows, cols; };
  const Shape shapes[] = {{"K3 b_proj", 96, 7168},      {"K3 f_a", 128, 7168},       {"K3 router", 896, 7168},
                          {"K3 q_a", 1536, 7168},       {"K3 f_b", 12288, 128},      {"KL b_proj", 32, 2304},
                          {"KL f_a", 128, 2304},        {"KL router", 256, 2304},    {"KL q_proj", 4096, 2304}};
  for (const Shape& sh : shapes) {
    const auto src = random_vec(g, size_t(sh.rows) * sh.cols);
    const auto x = random_vec(g, sh.cols);
    float* dx = dev(x);
    float* dy = be_->alloc(sh.rows);
    for (const WFormat f : {WFormat::F32, WFormat::BF16, WFormat::Q8_ROW, WFormat::Q4_G64}) {
      const double bytes = f == WFormat::F32 ? 4.0 * sh.rows * sh.cols
                                             : double(wformat_data_bytes(f, sh.rows, sh.cols)) +
                                                   4.0 * wformat_scale_count(f, sh.rows, sh.cols);
      const int R = int(std::min(256.0, std::ceil(150e6 / bytes)));
      // R weight copies with distinct host bytes (device copies are keyed by the host tensor), all
      // kept alive to the end of the test so no host address is reused by another weight.
      std::vector<DenseWeight> ws;
      if (f == WFormat::F32) {
        for (int i = 0; i < R; ++i) ws.push_back(dense.emplace_back(std::make_unique<HostWeight>(src, sh.rows, sh.cols))->w);
      } else {
        PackedWeight first(src, sh.rows, sh.cols, f);
        for (int i = 0; i < R; ++i) {
          auto& pw = packed.emplace_back(std::make_unique<PackedWeight>(first));
          pw->w.data = pw->data.data();
          pw->w.scale = first.w.scale ? pw->scale.data() : nullptr;
          ws.push_back(pw->w);
        }
      }
      for (const DenseWeight& w : ws) be_->upload(w);
      const double t = be_->time_recorded([&](int i) { be_->gemm(ws[i], dx, 1, dy); }, R, 10);
      const size_t n = size_t(bytes / 8);  // floats copied: bytes/2 read + bytes/2 written
      std::vector<float*> bufs;
      for (int i = 0; i < 2 * R; ++i) bufs.push_back(be_->alloc(n));
      const double tc = be_->time_recorded([&](int i) { be_->copy_kernel(bufs[2 * i], n, bufs[2 * i + 1]); }, R, 10);
      for (float* b : bufs) be_->release(b);
      const double gbs = bytes / t / 1e9, cgbs = 8.0 * n / tc / 1e9;
      std::printf("[ gemv small ] %-10s [%5d, %5d] %-6s %7.2f us %5.0f GB/s | copy kernel same bytes %6.2f us %5.0f "
                  "GB/s: %3.0f%% | of the 512 MB copy: %3.0f%%%s\n",
                  sh.name, sh.rows, sh.cols, wformat_name(f), t * 1e6, gbs, tc * 1e6, cgbs, 100 * gbs / cgbs,
                  100 * gbs / copy_gbs, R * bytes < 100e6 ? " (in L2)" : "");
      EXPECT_GT(t, 0);
    }
    be_->release(dy);
  }
}

// embed on a packed table: the GPU decodes exactly as dequant_row (the CPU's embed) -> exact.
TEST_F(CudaOps, EmbedPackedMatchesCpu) {
  std::mt19937 g(23);
  const int V = 77, D = 93;  // D: one full and one partial q4 group
  for (const WFormat f : {WFormat::BF16, WFormat::Q8_ROW, WFormat::Q4_G64}) {
    PackedWeight table(random_vec(g, size_t(V) * D), V, D, f);
    be_->upload(table.w);
    const std::vector<int> ids = {76, 0, 5, 5, 33};
    const int T = int(ids.size());
    float* dx = poisoned(size_t(T) * D);
    be_->embed(table.w, ids.data(), T, dx);
    std::vector<float> ref(size_t(T) * D);
    cpu_.embed(table.w, ids.data(), T, ref.data());
    expect_close(std::string("embed ") + wformat_name(f), shape({{"T", T}}), host(dx, ref.size()), ref, 0.0);
  }
}

// embed: a row copy -> exact.
TEST_F(CudaOps, EmbedMatchesCpu) {
  std::mt19937 g(3);
  const int V = 77, D = 45;
  HostWeight table(random_vec(g, size_t(V) * D), V, D);
  be_->upload(table.w);
  for (const std::vector<int>& ids : {std::vector<int>{0}, std::vector<int>{76, 0, 5, 5, 33},
                                      std::vector<int>(33, 12)}) {
    const int T = int(ids.size());
    float* dx = poisoned(size_t(T) * D);
    be_->embed(table.w, ids.data(), T, dx);
    std::vector<float> ref(size_t(T) * D);
    cpu_.embed(table.w, ids.data(), T, ref.data());
    expect_close("embed", shape({{"T", T}}), host(dx, ref.size()), ref, 0.0);
  }
  const int bad = V;
  float* dx = poisoned(D);
  EXPECT_THROW(be_->embed(table.w, &bad, 1, dx), Error);
}

// rms_norm: f64 sum of squares (tree vs sequential: ~1e-16) -> tolerance rel-L2 1e-6.
TEST_F(CudaOps, RmsNormMatchesCpu) {
  std::mt19937 g(4);
  for (int n : {1, 7, 31, 128, 257, 1000, 1536, 3000, 7168, 9000})  // every rms_norm_kernel<kPer> instance
    for (int T : {1, 3, 33}) {
      HostWeight w(random_vec(g, n, 0.5f, 1.5f), 1, n);
      be_->upload(w.w);
      auto x = random_vec(g, size_t(T) * n);
      for (int t = 0; t < T; ++t) x[size_t(t) * n] *= float(1 + 10 * t);  // rows of different scale
      float* dx = dev(x);
      float* dy = poisoned(x.size());
      be_->rms_norm(dx, T, n, w.w, 1e-5f, dy);
      std::vector<float> ref(x.size());
      cpu_.rms_norm(x.data(), T, n, w.w, 1e-5f, ref.data());
      expect_close("rms_norm", shape({{"n", n}, {"T", T}}), host(dy, ref.size()), ref, 1e-6);
    }
}

// add_rms_norm (the residual add fused into the norm after it): the updated residual equals the
// CPU's add bit for bit, the norm within rms_norm's tolerance, and both equal this backend's add
// then rms_norm bit for bit (the fused op promises exactly that); every rms_norm_kernel instance.
TEST_F(CudaOps, AddRmsNormMatchesCpuAndTheTwoOps) {
  std::mt19937 g(41);
  for (int n : {1, 7, 31, 128, 257, 1000, 1536, 2304, 3000, 7168, 9000})
    for (int T : {1, 3, 17}) {
      HostWeight w(random_vec(g, n, 0.5f, 1.5f), 1, n);
      be_->upload(w.w);
      auto y = random_vec(g, size_t(T) * n, -3.f, 3.f);
      const auto x = random_vec(g, size_t(T) * n);
      for (int t = 0; t < T; ++t) y[size_t(t) * n] *= float(1 + 10 * t);  // rows of different scale
      float* dy = dev(y);
      float* dx = dev(x);
      float* dout = poisoned(y.size());
      const uint64_t l0 = be_->stats().launches;  // each op is one kernel, counted once
      be_->add_rms_norm(dy, dx, T, n, w.w, 1e-5f, dout);
      EXPECT_EQ(be_->stats().launches - l0, 1u) << "add_rms_norm launches";
      std::vector<float> ry = y, rout(y.size());
      cpu_.add(ry.data(), x.data(), ry.size());
      cpu_.rms_norm(ry.data(), T, n, w.w, 1e-5f, rout.data());
      const std::string sh = shape({{"n", n}, {"T", T}});
      const auto gy = host(dy, y.size()), gout = host(dout, y.size());
      EXPECT_EQ(0, std::memcmp(gy.data(), ry.data(), ry.size() * 4)) << "add_rms_norm residual " << sh;
      expect_close("add_rms_norm", sh, gout, rout, 1e-6);
      float* dy2 = dev(y);
      float* dout2 = poisoned(y.size());
      const uint64_t l1 = be_->stats().launches;
      be_->add(dy2, dx, y.size());
      EXPECT_EQ(be_->stats().launches - l1, 1u) << "add launches";
      be_->rms_norm(dy2, T, n, w.w, 1e-5f, dout2);
      EXPECT_EQ(be_->stats().launches - l1, 2u) << "rms_norm launches";
      EXPECT_EQ(0, std::memcmp(gout.data(), host(dout2, y.size()).data(), y.size() * 4)) << "add_rms_norm vs add + rms_norm " << sh;
    }
}

// add2 and add2_rms_norm (an MoE's routed and shared outputs added to the residual at once): the
// residual equals the CPU's two adds (x += x2, then y += x) bit for bit, the norm within
// rms_norm's tolerance and bit-identical to this backend's add, add_rms_norm in turn; one launch
// each, x2 and x only read; every rms_norm_kernel instance.
TEST_F(CudaOps, Add2AndAdd2RmsNormMatchTheTwoAdds) {
  std::mt19937 g(43);
  for (int n : {1, 7, 31, 128, 257, 1000, 1536, 2304, 3000, 7168, 9000})
    for (int T : {1, 3, 17}) {
      const std::string sh = shape({{"n", n}, {"T", T}});
      HostWeight w(random_vec(g, n, 0.5f, 1.5f), 1, n);
      be_->upload(w.w);
      auto y = random_vec(g, size_t(T) * n, -3.f, 3.f);
      const auto x = random_vec(g, size_t(T) * n), x2 = random_vec(g, size_t(T) * n, -2.f, 2.f);
      for (int t = 0; t < T; ++t) y[size_t(t) * n] *= float(1 + 10 * t);  // rows of different scale
      std::vector<float> rx = x, ry = y, rout(y.size());
      cpu_.add(rx.data(), x2.data(), rx.size());
      cpu_.add(ry.data(), rx.data(), ry.size());
      cpu_.rms_norm(ry.data(), T, n, w.w, 1e-5f, rout.data());
      float *dy = dev(y), *dx = dev(x), *dx2 = dev(x2), *dout = poisoned(y.size());
      uint64_t l0 = be_->stats().launches;
      be_->add2_rms_norm(dy, dx, dx2, T, n, w.w, 1e-5f, dout);
      EXPECT_EQ(be_->stats().launches - l0, 1u) << "add2_rms_norm launches";
      const auto gy = host(dy, y.size()), gout = host(dout, y.size());
      EXPECT_EQ(0, std::memcmp(gy.data(), ry.data(), ry.size() * 4)) << "add2_rms_norm residual " << sh;
      expect_close("add2_rms_norm", sh, gout, rout, 1e-6);
      EXPECT_EQ(0, std::memcmp(host(dx, x.size()).data(), x.data(), x.size() * 4)) << "x only read " << sh;
      // The same as add(x, x2) then add_rms_norm on this backend.
      float *dy2 = dev(y), *dx_2 = dev(x), *dout2 = poisoned(y.size());
      be_->add(dx_2, dx2, x.size());
      be_->add_rms_norm(dy2, dx_2, T, n, w.w, 1e-5f, dout2);
      EXPECT_EQ(0, std::memcmp(gout.data(), host(dout2, y.size()).data(), y.size() * 4)) << "vs add + add_rms_norm " << sh;
      // add2: the residual alone.
      float* dy3 = dev(y);
      l0 = be_->stats().launches;
      be_->add2(dy3, dx, dx2, y.size());
      EXPECT_EQ(be_->stats().launches - l0, 1u) << "add2 launches";
      EXPECT_EQ(0, std::memcmp(host(dy3, y.size()).data(), ry.data(), ry.size() * 4)) << "add2 " << sh;
    }
}

// attnres_mix: f64 scores + f64 softmax, f32 mix in entry order -> tolerance rel-L2 1e-6 (planted:
// tests/cuda_planted_attnres.patch must fail it).
TEST_F(CudaOps, AttnResMixMatchesCpu) {
  std::mt19937 g(5);
  for (int E : {1, 2, 5, 9})
    // D: every kernel instance (elements a thread <= 4, 8, 16, 32; 8193 and 9000 the strided one).
    for (int D : {5, 128, 130, 1000, 2000, 4096, 7168, 8193, 9000})
      for (int T : {1, 3, 33}) {
        if (D >= 4096 && T == 33) continue;
        // w scaled by 2/sqrt(D): scores of order 1, so the softmax weighs every entry (with w in
        // [-1, 1] the scores reach ~sqrt(D/3) and a near one-hot softmax hides wrong scores).
        std::vector<float> wv = random_vec(g, D);
        for (float& x : wv) x *= 2.f / std::sqrt(float(D));
        HostWeight w(wv, 1, D);
        be_->upload(w.w);
        std::vector<std::vector<float>> host_e;
        std::vector<const float*> dptr, hptr;
        for (int e = 0; e < E; ++e) {
          host_e.push_back(random_vec(g, size_t(T) * D, -1.f - e, 1.f + e));
          dptr.push_back(dev(host_e.back()));
        }
        for (auto& h : host_e) hptr.push_back(h.data());
        float* dout = poisoned(size_t(T) * D);
        be_->attnres_mix(dptr.data(), E, T, D, w.w, 1e-5f, dout);
        std::vector<float> ref(size_t(T) * D);
        cpu_.attnres_mix(hptr.data(), E, T, D, w.w, 1e-5f, ref.data());
        expect_close("attnres_mix", shape({{"entries", E}, {"D", D}, {"T", T}}), host(dout, ref.size()), ref, 1e-6);
      }
}

// add: exact. situ_glu / sigmoid_gate: exp/tanh in f64 rounded to f32 vs glibc -> rel-L2 1e-6.
TEST_F(CudaOps, ElementwiseMatchCpu) {
  std::mt19937 g(6);
  for (size_t n : {size_t(1), size_t(33), size_t(1000), size_t(100003)}) {
    const auto a = random_vec(g, n, -30.f, 30.f), b = random_vec(g, n, -60.f, 60.f);
    {
      float* dy = dev(a);
      be_->add(dy, dev(b), n);
      std::vector<float> ref = a;
      cpu_.add(ref.data(), b.data(), n);
      expect_close("add", shape({{"n", long(n)}}), host(dy, n), ref, 0.0);
    }
    {
      const int T = n % 2 ? 1 : 2, w = int(n / T);
      float* dout = poisoned(n);
      be_->situ_glu(dev(a), dev(b), T, w, 4.f, 25.f, dout);
      std::vector<float> ref(n);
      cpu_.situ_glu(a.data(), b.data(), T, w, 4.f, 25.f, ref.data());
      expect_close("situ_glu", shape({{"n", long(n)}}), host(dout, n), ref, 1e-6);
    }
    {
      const int T = n % 2 ? 1 : 2, w = int(n / T);
      float* dout = poisoned(n);
      be_->silu_glu(dev(a), dev(b), T, w, dout);
      std::vector<float> ref(n);
      cpu_.silu_glu(a.data(), b.data(), T, w, ref.data());
      expect_close("silu_glu", shape({{"n", long(n)}}), host(dout, n), ref, 1e-6);
    }
    {
      float* dy = dev(b);
      be_->sigmoid_gate(dy, dev(a), n);
      std::vector<float> ref = b;
      cpu_.sigmoid_gate(ref.data(), a.data(), n);
      expect_close("sigmoid_gate", shape({{"n", long(n)}}), host(dy, n), ref, 1e-6);
    }
  }
}

// argmax_rows (argmax.cu): the greedy id of each row equals the CPU's (core/argmax.h: the first
// index of the largest value, -0 == +0; -1 for a row with a NaN or an infinity), exactly, on many
// shapes (one segment a row up to the 2 x SMs split, rows of the 163,840-id vocabulary) with
// planted ties: the maximum copied to a later index, to an earlier one, across segment bounds.
TEST_F(CudaOps, ArgmaxRowsMatchesCpu) {
  std::mt19937 g(41);
  const int cases[][2] = {{1, 1}, {1, 7}, {5, 17}, {3, 1000}, {2, 4097}, {1, 12345}, {8, 32768},
                          {1, 163840}, {16, 163840}, {33, 50000}, {4, 262144}};
  int rows_checked = 0, ties = 0;
  for (const auto& c : cases) {
    const int R = c[0], C = c[1];
    std::vector<float> x = random_vec(g, size_t(R) * C, -8.f, 8.f);
    for (int r = 0; r < R; ++r) {
      float* row = x.data() + size_t(r) * C;
      const int at = int(g() % unsigned(C));
      row[at] = 9.f + float(r % 3);  // the maximum
      switch (r % 6) {
        case 1: row[C - 1] = row[at], ++ties; break;                  // a tie after it
        case 2: row[g() % unsigned(at + 1)] = row[at], ++ties; break;  // a tie at or before it
        case 3: row[size_t(C) / 2] = row[at], row[(size_t(C) / 2 + 4096) % size_t(C)] = row[at], ++ties; break;
        case 4:  // all negative but two zeros: -0 first, then +0 (equal: the first wins)
          for (int i = 0; i < C; ++i) row[i] = -1.f - std::fabs(row[i]);
          row[C / 3] = -0.f, row[C - 1] = 0.f;
          break;
        case 5:
          if (r % 12 == 5) row[g() % unsigned(C)] = std::nanf("");
          else row[g() % unsigned(C)] = -INFINITY;
          break;
        default: break;
      }
    }
    float* dx = dev(x);
    float* d_ids = poisoned(size_t(R));
    be_->argmax_rows(dx, R, C, d_ids);
    const std::vector<float> got = host(d_ids, size_t(R));
    std::vector<float> ref(static_cast<size_t>(R));
    cpu_.argmax_rows(x.data(), R, C, ref.data());
    for (int r = 0; r < R; ++r) {
      EXPECT_EQ(got[size_t(r)], ref[size_t(r)]) << shape({{"rows", R}, {"cols", C}, {"row", r}});
      EXPECT_EQ(ref[size_t(r)], float(finite_argmax(x.data() + size_t(r) * C, C)));
      ++rows_checked;
    }
  }
  std::printf("argmax_rows: %d rows equal to the CPU's (%d with planted ties)\n", rows_checked, ties);
  EXPECT_THROW(be_->argmax_rows(dev(std::vector<float>(4, 1.f)), 1, (1 << 24) + 1, poisoned(1)), Error);
}

// ---- KDA ----

using test::ScopedOptions;
const CudaOptions kRecurrent{CudaKda::Recurrent, 32};

// kda_core, token-by-token kernel (--cuda-kda recurrent): conv/L2/gates/delta rule/RMSNorm/gate
// in the CPU's order per column; exp in f64 -> tolerance rel-L2 1e-5 on outputs and on the carried
// state (S, conv windows) after every call.
TEST_F(CudaOps, KdaCoreMatchesCpuAcrossCalls) {
  ScopedOptions mode(*be_, kRecurrent);
  std::mt19937 g(7);
  struct Case { int H, d, K; std::vector<int> Ts; };
  const std::vector<Case> cases = {{1, 16, 4, {1, 1, 1}},  {2, 32, 4, {5, 1, 33}}, {3, 16, 3, {33, 2}},
                                   {4, 32, 1, {3, 4}},     {2, 33, 2, {1, 7}},    {1, 128, 4, {33, 1, 1}},
                                   {3, 100, 4, {2, 1}},    {1, 256, 4, {3, 1}}};
  for (const KdaGate gate_kind : {KdaGate::LowerBound, KdaGate::Softplus})  // K3, Kimi Linear
  for (const Case& c : cases) {
    const int H = c.H, d = c.d, K = c.K, P = H * d;
    KdaParams p{H, d, K, -5.f, 1e-5f, gate_kind};
    std::vector<HostWeight> ws;
    ws.reserve(6);
    auto& qc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& kc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& vc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& alog = ws.emplace_back(random_vec(g, H, -1.f, 1.f), 1, H);
    auto& dtb = ws.emplace_back(random_vec(g, P), 1, P);
    auto& onorm = ws.emplace_back(random_vec(g, d, 0.5f, 1.5f), 1, d);
    KdaWeights w;
    w.q_conv = qc.w, w.k_conv = kc.w, w.v_conv = vc.w, w.a_log = alog.w, w.dt_bias = dtb.w, w.o_norm = onorm.w;
    for (auto& hw : ws) be_->upload(hw.w);
    // Start from a non-zero state (a sequence already under way).
    std::vector<float> S = random_vec(g, size_t(H) * d * d, -0.1f, 0.1f);
    std::vector<float> conv = random_vec(g, size_t(3) * P * std::max(K - 1, 1));
    KdaState hs{S.data(), conv.data()};
    KdaState ds{dev(S), dev(conv)};
    for (size_t call = 0; call < c.Ts.size(); ++call) {
      const int T = c.Ts[call];
      const auto q = random_vec(g, size_t(T) * P), k = random_vec(g, size_t(T) * P), v = random_vec(g, size_t(T) * P);
      const auto z = random_vec(g, size_t(T) * P, -3.f, 3.f), beta = random_vec(g, size_t(T) * H, -3.f, 3.f);
      const auto gate = random_vec(g, size_t(T) * P, -3.f, 3.f);
      float* dout = poisoned(size_t(T) * P);
      be_->kda_core(p, w, ds, dev(q), dev(k), dev(v), dev(z), dev(beta), dev(gate), T, dout);
      std::vector<float> ref(size_t(T) * P);
      cpu_.kda_core(p, w, hs, q.data(), k.data(), v.data(), z.data(), beta.data(), gate.data(), T, ref.data());
      const std::string sh = shape({{"H", H}, {"d", d}, {"K", K}, {"T", T}, {"call", long(call)},
                                    {"softplus", long(gate_kind == KdaGate::Softplus)}});
      expect_close("kda_core", sh, host(dout, ref.size()), ref, 1e-5);
      expect_close("kda_state", sh, host(ds.S, S.size()), S, 1e-5);
      if (K > 1) expect_close("kda_conv_win", sh, host(ds.conv, conv.size()), conv, 0.0);
    }
  }
}

// ---- KDA decode step (T = 1, kda_decode.cu: a block per head fed by bulk copies when d % 4 == 0,
// else a cluster per head; S read once and written once) ----

/// One KDA layer's random weights, uploaded to the backend, and a random non-zero state.
struct KdaSetup {
  std::vector<HostWeight> ws;
  KdaWeights w;
  std::vector<float> S, conv;
  KdaSetup(std::mt19937& g, CudaBackend& be, int H, int d, int K) {
    const int P = H * d;
    ws.reserve(6);
    auto& qc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& kc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& vc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& alog = ws.emplace_back(random_vec(g, H, -1.f, 1.f), 1, H);
    auto& dtb = ws.emplace_back(random_vec(g, P), 1, P);
    auto& onorm = ws.emplace_back(random_vec(g, d, 0.5f, 1.5f), 1, d);
    w.q_conv = qc.w, w.k_conv = kc.w, w.v_conv = vc.w, w.a_log = alog.w, w.dt_bias = dtb.w, w.o_norm = onorm.w;
    for (auto& hw : ws) be.upload(hw.w);
    S = random_vec(g, size_t(H) * d * d, -0.1f, 0.1f);
    conv = random_vec(g, size_t(3) * P * std::max(K - 1, 1));
  }
};

// The fused decode step against the CPU over many decode tokens at position > 0 (after a prefill
// chunk through the token kernel), from a random non-zero state: head_dim 1..128 (partial warps,
// 1-4 blocks per cluster, the fixed-stride d = 128 kernels; the bulk-copy kernel for d % 4 == 0 with
// 1-4 chunks of 32 rows, partial last chunks), K3's 96×128 and Kimi Linear's 32×128
// heads, conv kernels 1-4, both gates; d > 128 must take the token kernel. Every form
// (KdaDecodeForm: split, bulk, cluster) in exact mode, and the split and bulk forms in fast mode
// (f32 exps; the split form's tree sums). Outputs and S within rel-L2 1e-5 after every token, conv windows exact; the decode
// counters prove which kernel ran.
TEST_F(CudaOps, KdaDecodeStepMatchesCpu) {
  std::mt19937 g(11);
  struct Case { int H, d, K, prefill, steps; };
  const std::vector<Case> cases = {{1, 1, 4, 0, 3},    {2, 8, 4, 3, 5},   {3, 16, 3, 0, 4},  {2, 31, 4, 2, 4},
                                   {1, 32, 4, 0, 3},   {2, 33, 2, 5, 4},  {4, 64, 4, 0, 3},  {2, 65, 1, 3, 3},
                                   {3, 100, 4, 2, 4},  {2, 127, 4, 0, 3}, {5, 128, 4, 7, 6}, {2, 128, 1, 0, 3},
                                   {96, 128, 4, 3, 4}, {32, 128, 4, 2, 5}, {1, 160, 4, 0, 2},
                                   // bulk-copy kernel (d % 4 == 0): one partial chunk, 2-4 chunks
                                   // with a partial last one, K 1..4
                                   {2, 4, 2, 0, 3},    {3, 36, 4, 2, 3},  {2, 96, 3, 1, 3},  {1, 124, 4, 0, 3},
                                   {7, 12, 1, 0, 2},   {3, 17, 3, 1, 3},  {2, 48, 2, 0, 2},  {4, 80, 4, 2, 3}};
  struct Mode { KdaDecodeForm form; GpuPrecision prec; const char* name; };
  const Mode modes[] = {{KdaDecodeForm::Split, GpuPrecision::Exact, "split"},
                        {KdaDecodeForm::Bulk, GpuPrecision::Exact, "bulk"},
                        {KdaDecodeForm::Cluster, GpuPrecision::Exact, "cluster"},
                        {KdaDecodeForm::Split, GpuPrecision::Fast, "split-fast"},
                        {KdaDecodeForm::Bulk, GpuPrecision::Fast, "bulk-fast"}};
  for (const Mode& md : modes) {
  ScopedOptions mode(*be_, CudaOptions{CudaKda::Recurrent, 32, 0, md.prec});
  be_->set_kda_decode_form(md.form);
  for (const KdaGate gate_kind : {KdaGate::LowerBound, KdaGate::Softplus})  // K3, Kimi Linear
  for (const Case& c : cases) {
    if (md.form == KdaDecodeForm::Bulk && c.d % 4 != 0) continue;  // the cluster form: its own pass
    const int H = c.H, d = c.d, K = c.K, P = H * d;
    KdaParams p{H, d, K, -5.f, 1e-5f, gate_kind};
    KdaSetup su(g, *be_, H, d, K);
    KdaState hs{su.S.data(), su.conv.data()};
    KdaState ds{dev(su.S), dev(su.conv)};
    std::vector<int> Ts;
    if (c.prefill) Ts.push_back(c.prefill);
    for (int i = 0; i < c.steps; ++i) Ts.push_back(1);
    for (size_t call = 0; call < Ts.size(); ++call) {
      const int T = Ts[call];
      const auto q = random_vec(g, size_t(T) * P), k = random_vec(g, size_t(T) * P), v = random_vec(g, size_t(T) * P);
      const auto z = random_vec(g, size_t(T) * P, -3.f, 3.f), beta = random_vec(g, size_t(T) * H, -3.f, 3.f);
      const auto gate = random_vec(g, size_t(T) * P, -3.f, 3.f);
      float* dout = poisoned(size_t(T) * P);
      const CudaStats before = be_->stats();
      be_->kda_core(p, su.w, ds, dev(q), dev(k), dev(v), dev(z), dev(beta), dev(gate), T, dout);
      const CudaStats after = be_->stats();
      const bool fused = T == 1 && d <= 128;
      EXPECT_EQ(after.kda_decode_calls - before.kda_decode_calls, fused ? 1u : 0u) << md.name << " d " << d << " T " << T;
      EXPECT_EQ(after.kda_decode_split_calls - before.kda_decode_split_calls,
                fused && md.form == KdaDecodeForm::Split ? 1u : 0u) << md.name << " d " << d << " T " << T;
      EXPECT_EQ(after.kda_decode_bulk_calls - before.kda_decode_bulk_calls,
                fused && md.form == KdaDecodeForm::Bulk ? 1u : 0u) << md.name << " d " << d << " T " << T;
      std::vector<float> ref(size_t(T) * P);
      cpu_.kda_core(p, su.w, hs, q.data(), k.data(), v.data(), z.data(), beta.data(), gate.data(), T, ref.data());
      const std::string sh = shape({{"H", H}, {"d", d}, {"K", K}, {"T", T}, {"call", long(call)},
                                    {"softplus", long(gate_kind == KdaGate::Softplus)}}) + " " + md.name;
      const std::string op = fused ? "kda_decode" : "kda_core";
      expect_close(op, sh, host(dout, ref.size()), ref, 1e-5);
      expect_close(op + "_state", sh, host(ds.S, su.S.size()), su.S, 1e-5);
      if (K > 1) expect_close(op + "_conv_win", sh, host(ds.conv, su.conv.size()), su.conv, 0.0);
    }
  }
  }
  be_->set_kda_decode_form(KdaDecodeForm::Bulk);  // the default: bulk where it applies, else split
}

// The batched decode step (CudaBackend::kda_decode_batch: B sequences, one state each, one launch
// per 32) against the CPU stepping each sequence on its own state, and in exact mode bit-identical
// to B single kda_core calls: head_dim 1..128 (awkward ones too), 1..40 sequences (two launches
// past 32), conv kernels 1-4, both gates, both precisions, from random states; several steps, so
// each state is touched by consecutive launches (the launch rule must order those, the counter
// shows some launches overlapped their predecessor). Outputs and S within rel-L2 1e-5 of the CPU,
// windows exact.
TEST_F(CudaOps, KdaDecodeBatchMatchesCpu) {
  std::mt19937 g(19);
  struct Case { int H, d, K, B; };
  const std::vector<Case> cases = {{2, 16, 4, 1},  {3, 33, 2, 3},   {1, 1, 4, 5},   {2, 100, 3, 4},
                                   {4, 128, 4, 6}, {96, 128, 4, 3}, {2, 64, 1, 33}, {1, 20, 4, 40},
                                   {1, 160, 4, 2}};
  const uint64_t pdl0 = be_->stats().kda_decode_pdl;
  be_->set_kda_decode_form(KdaDecodeForm::Split);  // the single calls on the batch's kernel (fast mode: its sums)
  for (const GpuPrecision prec : {GpuPrecision::Exact, GpuPrecision::Fast})
  for (const KdaGate gate_kind : {KdaGate::LowerBound, KdaGate::Softplus})
  for (const Case& c : cases) {
    ScopedOptions mode(*be_, CudaOptions{CudaKda::Recurrent, 32, 0, prec});
    const int H = c.H, d = c.d, K = c.K, B = c.B, P = H * d;
    KdaParams p{H, d, K, -5.f, 1e-5f, gate_kind};
    KdaSetup su(g, *be_, H, d, K);
    std::vector<std::vector<float>> hS(B), hconv(B);
    std::vector<KdaState> hs(B), bs(B), ss(B);  // CPU, batched, single-call states
    std::vector<KdaState*> ptr(B);
    for (int b = 0; b < B; ++b) {
      hS[b] = random_vec(g, su.S.size(), -0.1f, 0.1f);
      hconv[b] = random_vec(g, su.conv.size());
      bs[b] = {dev(hS[b]), dev(hconv[b])};
      ss[b] = {dev(hS[b]), dev(hconv[b])};
      hs[b] = {hS[b].data(), hconv[b].data()};
      ptr[b] = &bs[b];
    }
    for (int step = 0; step < 3; ++step) {
      const auto q = random_vec(g, size_t(B) * P), k = random_vec(g, size_t(B) * P), v = random_vec(g, size_t(B) * P);
      const auto z = random_vec(g, size_t(B) * P, -3.f, 3.f), beta = random_vec(g, size_t(B) * H, -3.f, 3.f);
      const auto gate = random_vec(g, size_t(B) * P, -3.f, 3.f);
      float *dq = dev(q), *dk = dev(k), *dv = dev(v), *dz = dev(z), *db = dev(beta), *dg = dev(gate);
      float* dout = poisoned(size_t(B) * P);
      float* sout = poisoned(size_t(B) * P);
      be_->kda_decode_batch(p, su.w, ptr.data(), B, dq, dk, dv, dz, db, dg, dout);
      for (int b = 0; b < B; ++b) {
        const size_t o = size_t(b) * P;
        be_->kda_core(p, su.w, ss[b], dq + o, dk + o, dv + o, dz + o, db + size_t(b) * H, dg + o, 1, sout + o);
      }
      const auto got = host(dout, size_t(B) * P), solo = host(sout, size_t(B) * P);
      for (int b = 0; b < B; ++b) {
        const size_t o = size_t(b) * P;
        std::vector<float> ref(P);
        cpu_.kda_core(p, su.w, hs[b], q.data() + o, k.data() + o, v.data() + o, z.data() + o,
                      beta.data() + size_t(b) * H, gate.data() + o, 1, ref.data());
        const std::string sh = shape({{"H", H}, {"d", d}, {"K", K}, {"B", B}, {"b", b}, {"step", step},
                                      {"softplus", long(gate_kind == KdaGate::Softplus)},
                                      {"fast", long(prec == GpuPrecision::Fast)}});
        const std::vector<float> gb(got.begin() + o, got.begin() + o + P);
        expect_close("kda_decode_batch", sh, gb, ref, 1e-5);
        expect_close("kda_decode_batch_S", sh, host(bs[b].S, hS[b].size()), hS[b], 1e-5);
        if (K > 1) expect_close("kda_decode_batch_win", sh, host(bs[b].conv, hconv[b].size()), hconv[b], 0.0);
        // The same arithmetic as a single call, in both modes (the same kernel per sequence).
        const std::vector<float> sb(solo.begin() + o, solo.begin() + o + P);
        expect_close("kda_decode_batch_vs_single", sh, gb, sb, 0.0);
        expect_close("kda_decode_batch_vs_single_S", sh, host(bs[b].S, hS[b].size()), host(ss[b].S, hS[b].size()), 0.0);
      }
    }
  }
  be_->set_kda_decode_form(KdaDecodeForm::Bulk);
  EXPECT_GT(be_->stats().kda_decode_pdl, pdl0) << "no decode step was launched to overlap its predecessor";
  KdaSetup su(g, *be_, 1, 8, 4);
  KdaState one{dev(su.S), dev(su.conv)};
  std::vector<KdaState*> twice = {&one, &one};
  float* x = poisoned(size_t(2) * 8 * 6);
  KdaParams p{1, 8, 4, -5.f, 1e-5f, KdaGate::LowerBound};
  EXPECT_THROW(be_->kda_decode_batch(p, su.w, twice.data(), 2, x, x, x, x, x, x, x), Error);
  std::vector<KdaState*> null = {nullptr};
  EXPECT_THROW(be_->kda_decode_batch(p, su.w, null.data(), 1, x, x, x, x, x, x, x), Error);
}

// N fused decode steps against the token kernel run once over the same N tokens (T = N): the same
// arithmetic per quantity, only the f64 partial sums of the norms grouped differently, so the two
// GPU paths agree to ~1 ulp (bound rel-L2 1e-6 on outputs and state).
TEST_F(CudaOps, KdaDecodeAgreesWithTokenKernel) {
  ScopedOptions mode(*be_, kRecurrent);
  std::mt19937 g(12);
  for (const auto& [H, d] : std::vector<std::pair<int, int>>{{4, 128}, {3, 48}, {2, 100}, {96, 128}, {2, 33}, {3, 70}})
  for (const KdaGate gate_kind : {KdaGate::LowerBound, KdaGate::Softplus}) {
    const int K = 4, P = H * d, N = 9;
    KdaParams p{H, d, K, -5.f, 1e-5f, gate_kind};
    KdaSetup su(g, *be_, H, d, K);
    const auto q = random_vec(g, size_t(N) * P), k = random_vec(g, size_t(N) * P), v = random_vec(g, size_t(N) * P);
    const auto z = random_vec(g, size_t(N) * P, -3.f, 3.f), beta = random_vec(g, size_t(N) * H, -3.f, 3.f);
    const auto gate = random_vec(g, size_t(N) * P, -3.f, 3.f);
    KdaState tok{dev(su.S), dev(su.conv)}, dec{dev(su.S), dev(su.conv)};
    float* tout = poisoned(size_t(N) * P);
    be_->kda_core(p, su.w, tok, dev(q), dev(k), dev(v), dev(z), dev(beta), dev(gate), N, tout);
    float* dq = dev(q), *dk = dev(k), *dv = dev(v), *dz = dev(z), *db = dev(beta), *dg = dev(gate);
    float* dout = poisoned(size_t(N) * P);
    for (int t = 0; t < N; ++t) {
      const size_t o = size_t(t) * P;
      be_->kda_core(p, su.w, dec, dq + o, dk + o, dv + o, dz + o, db + size_t(t) * H, dg + o, 1, dout + o);
    }
    const std::string sh = shape({{"H", H}, {"d", d}, {"N", N}, {"softplus", long(gate_kind == KdaGate::Softplus)}});
    expect_close("kda_decode_vs_token", sh, host(dout, size_t(N) * P), host(tout, size_t(N) * P), 1e-6);
    expect_close("kda_decode_vs_token_S", sh, host(dec.S, su.S.size()), host(tok.S, su.S.size()), 1e-6);
    expect_close("kda_decode_vs_token_win", sh, host(dec.conv, su.conv.size()), host(tok.conv, su.conv.size()), 0.0);
  }
}

// Speed of the decode step at K3 sizes (96 heads × 128, 6.3 MB of state) and Kimi Linear's
// (32 × 128), against the reference copy kernel moving the same bytes (state read + written), all
// timed the same way in this run: a CUDA graph of one call per state over >= 150 MB of states (3x
// the 50 MB L2, so the state comes from DRAM as in a real model). Every form: split (default;
// exact, exact without programmatic dependent launch, fast), bulk, cluster; and the batched step
// (4 sequences per launch). Printed, not asserted.
TEST_F(CudaOps, KdaDecodeSpeedVsCopy) {
  std::mt19937 g(13);
  const double copy_gbs = be_->copy_bandwidth() / 1e9;  // 512 MB each way, the copy bandwidth the floor uses
  std::printf("[ kda decode ] copy kernel 512 MB -> 512 MB: %.0f GB/s (read + written)\n", copy_gbs);
  for (const int H : {96, 32}) {
    const int d = 128, K = 4, P = H * d, NB = 4;
    const size_t n = size_t(H) * d * d;
    const int R = (int((150e6 + n * 4 - 1) / (n * 4)) + NB - 1) / NB * NB;  // states per sweep: >= 150 MB
    KdaParams p{H, d, K, -5.f, 1e-5f, KdaGate::LowerBound};
    KdaSetup su(g, *be_, H, d, K);
    std::vector<KdaState> st;
    std::vector<KdaState*> ptr;
    std::vector<float*> src, dst;
    for (int i = 0; i < R; ++i) {
      st.push_back({dev(su.S), dev(su.conv)});
      src.push_back(be_->alloc(n));
      dst.push_back(be_->alloc(n));
    }
    for (int i = 0; i < R; ++i) ptr.push_back(&st[i]);
    const auto in = random_vec(g, size_t(6) * P * NB);
    float* x = dev(in);
    float* y = be_->alloc(size_t(P) * NB);
    auto step = [&](int i) {
      be_->kda_core(p, su.w, st[i % R], x, x + P, x + 2 * P, x + 3 * P, x + 4 * P, x + 5 * P, 1, y);
    };
    const double bytes = 2.0 * n * 4;
    auto report = [&](const char* what, double t) {
      std::printf("[ kda decode ] H=%d d=128 %-28s %6.2f us/state  %5.0f GB/s  %3.0f%% of floor\n", H, what, t * 1e6,
                  bytes / t / 1e9, 100 * bytes / (copy_gbs * 1e9) / t);
    };
    be_->set_kda_decode_form(KdaDecodeForm::Split);
    const CudaStats s0 = be_->stats();
    const double t_split = be_->time_recorded(step, R, 10);
    const CudaStats s1 = be_->stats();
    EXPECT_GT(s1.kda_decode_split_calls, s0.kda_decode_split_calls);  // the split form was timed
    std::printf("[ kda decode ] H=%d: %llu of %llu split launches programmatic\n", H,
                (unsigned long long)(s1.kda_decode_pdl - s0.kda_decode_pdl),
                (unsigned long long)(s1.kda_decode_split_calls - s0.kda_decode_split_calls));
    be_->set_kda_decode_pdl(false);
    const double t_nopdl = be_->time_recorded(step, R, 10);
    be_->set_kda_decode_pdl(true);
    double t_fast = 0;
    {
      ScopedOptions fast(*be_, CudaOptions{CudaKda::Recurrent, 32, 0, GpuPrecision::Fast});
      t_fast = be_->time_recorded(step, R, 10);
    }
    const double t_batch = be_->time_recorded(
        [&](int i) {
          const int b = (i * NB) % R;
          be_->kda_decode_batch(p, su.w, ptr.data() + b, NB, x, x + NB * P, x + 2 * NB * P, x + 3 * NB * P,
                                x + 4 * NB * P, x + 5 * NB * P, y);
        },
        R / NB, 10) / NB;
    be_->set_kda_decode_form(KdaDecodeForm::Bulk);
    const double t_bulk = be_->time_recorded(step, R, 10);
    be_->set_kda_decode_pdl(false);
    const double t_bulk_nopdl = be_->time_recorded(step, R, 10);
    be_->set_kda_decode_pdl(true);
    double t_bulk_fast = 0;
    {
      ScopedOptions fast(*be_, CudaOptions{CudaKda::Recurrent, 32, 0, GpuPrecision::Fast});
      t_bulk_fast = be_->time_recorded(step, R, 10);
    }
    be_->set_kda_decode_form(KdaDecodeForm::Cluster);
    const double t_cluster = be_->time_recorded(step, R, 10);
    be_->set_kda_decode_form(KdaDecodeForm::Bulk);
    const double t_copy = be_->time_recorded([&](int i) { be_->copy_kernel(src[i], n, dst[i]); }, R, 10);
    std::printf("[ kda decode ] H=%d d=128: %.1f MB of state r+w per step; floor at the 512 MB copy's rate %.2f us\n",
                H, bytes / 1e6, bytes / copy_gbs / 1e3);
    report("split (exact)", t_split);
    report("split, no PDL", t_nopdl);
    report("split, fast mode", t_fast);
    report("split, batched x4 (per seq)", t_batch);
    report("bulk (exact, default)", t_bulk);
    report("bulk, no PDL", t_bulk_nopdl);
    report("bulk, fast mode", t_bulk_fast);
    report("cluster (run 17)", t_cluster);
    report("copy kernel, same bytes", t_copy);
    std::printf("[ kda decode ] H=%d: split %.0f%%, bulk %.0f%%, cluster %.0f%% of the same-bytes copy\n", H,
                100 * t_copy / t_split, 100 * t_copy / t_bulk, 100 * t_copy / t_cluster);
    if (H == 96) {
      // In a model the step follows the output-gate GEMV (K3: g [P, 7168], f32 in exact mode,
      // 352 MB from DRAM), whose output it reads: time GEMV + step pairs against the GEMV alone, so
      // the step's own cost is the difference (with and without the programmatic launch).
      const int hidden = 7168;
      HostWeight wg(random_vec(g, size_t(P) * hidden), P, hidden);
      be_->upload(wg.w);
      float* xh = dev(random_vec(g, hidden));
      float* gate = x + 5 * P;
      const double t_gemv = be_->time_recorded([&](int) { be_->gemm(wg.w, xh, 1, gate); }, R, 10);
      auto pair = [&](int i) {
        be_->gemm(wg.w, xh, 1, gate);
        step(i);
      };
      for (const KdaDecodeForm f : {KdaDecodeForm::Bulk, KdaDecodeForm::Split}) {
        be_->set_kda_decode_form(f);
        const double t_pair = be_->time_recorded(pair, R, 10);
        be_->set_kda_decode_pdl(false);
        const double t_pair_nopdl = be_->time_recorded(pair, R, 10);
        be_->set_kda_decode_pdl(true);
        const double fl = bytes / (copy_gbs * 1e9);
        std::printf("[ kda decode ] H=96 %s step after the g GEMV [%d, %d] f32 (%.2f us alone): adds %.2f us "
                    "(%.0f%% of floor), %.2f us without PDL (%.0f%%)\n",
                    f == KdaDecodeForm::Bulk ? "bulk" : "split", P, hidden, t_gemv * 1e6, (t_pair - t_gemv) * 1e6,
                    100 * fl / (t_pair - t_gemv), (t_pair_nopdl - t_gemv) * 1e6, 100 * fl / (t_pair_nopdl - t_gemv));
      }
      be_->set_kda_decode_form(KdaDecodeForm::Bulk);
    }
    EXPECT_TRUE(std::isfinite(host(y, P)[0]));
    for (int i = 0; i < R; ++i) be_->release(src[i]), be_->release(dst[i]);
    be_->release(y);
  }
}

// kda_core, chunked form (--cuda-kda chunked, kda_chunked.cu) against the CPU's token-by-token
// recurrence: head_dim 16..128 (incl. non-multiples of 32), heads 1..8, T around the chunk lengths
// (1, 2, C-1, C, C+1, 4C-1, 4C, 4C+1, 200), chunk lengths 16/32/64, both gates, random non-zero
// inputs and initial state (S and conv windows), state carried over the calls.
// Tolerance rel-L2 1e-5 (outputs and S), windows exact. Why 1e-5: the chunked form computes the
// same quantities as sums reordered over at most d + C <= 192 f32 terms (pair sums over d, the UT
// solve and the intra-chunk output over <= C rows, the state products over d or C), each f32
// rounding u = 6e-8; a linear worst-case accumulation is (d + C)·u ~ 1.2e-5, a random-walk
// accumulation sqrt(d + C)·u ~ 1e-6. Decay factors are exp(G_t - G_i) <= 1 with G cumulated in f64,
// so they add no cancellation error (see kda_chunked.cu). The exact path is held to the same 1e-5.
TEST_F(CudaOps, KdaChunkedMatchesCpuRecurrence) {
  std::mt19937 g(17);
  struct Case { int H, d, C; std::vector<int> Ts; };
  const std::vector<Case> cases = {
      {1, 16, 16, {1, 2, 15, 16, 17, 63, 64, 65, 200}},
      {2, 32, 16, {17, 1, 33}},
      {8, 16, 32, {2, 31, 32, 33, 200}},
      {3, 33, 32, {15, 64, 1, 65}},
      {4, 64, 64, {63, 64, 65, 200}},
      {2, 100, 32, {17, 63, 2}},
      {5, 128, 32, {16, 1, 200, 65}},
      {1, 128, 64, {200, 64, 127}},
      {8, 128, 16, {15, 16, 17}}};
  for (const KdaGate gate_kind : {KdaGate::LowerBound, KdaGate::Softplus})  // K3, Kimi Linear
  for (const Case& c : cases) {
    const int H = c.H, d = c.d, K = 4, P = H * d;
    ScopedOptions chunk(*be_, CudaOptions{CudaKda::Chunked, c.C});
    KdaParams p{H, d, K, -5.f, 1e-5f, gate_kind};
    std::vector<HostWeight> ws;
    ws.reserve(6);
    auto& qc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& kc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& vc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
    auto& alog = ws.emplace_back(random_vec(g, H, -1.f, 1.f), 1, H);
    auto& dtb = ws.emplace_back(random_vec(g, P), 1, P);
    auto& onorm = ws.emplace_back(random_vec(g, d, 0.5f, 1.5f), 1, d);
    KdaWeights w;
    w.q_conv = qc.w, w.k_conv = kc.w, w.v_conv = vc.w, w.a_log = alog.w, w.dt_bias = dtb.w, w.o_norm = onorm.w;
    for (auto& hw : ws) be_->upload(hw.w);
    std::vector<float> S = random_vec(g, size_t(H) * d * d, -0.1f, 0.1f);
    std::vector<float> conv = random_vec(g, size_t(3) * P * (K - 1));
    KdaState hs{S.data(), conv.data()};
    KdaState ds{dev(S), dev(conv)};
    for (size_t call = 0; call < c.Ts.size(); ++call) {
      const int T = c.Ts[call];
      const auto q = random_vec(g, size_t(T) * P), k = random_vec(g, size_t(T) * P), v = random_vec(g, size_t(T) * P);
      const auto z = random_vec(g, size_t(T) * P, -3.f, 3.f), beta = random_vec(g, size_t(T) * H, -3.f, 3.f);
      const auto gate = random_vec(g, size_t(T) * P, -3.f, 3.f);
      float* dout = poisoned(size_t(T) * P);
      be_->kda_core(p, w, ds, dev(q), dev(k), dev(v), dev(z), dev(beta), dev(gate), T, dout);
      std::vector<float> ref(size_t(T) * P);
      cpu_.kda_core(p, w, hs, q.data(), k.data(), v.data(), z.data(), beta.data(), gate.data(), T, ref.data());
      const std::string sh = shape({{"H", H}, {"d", d}, {"C", c.C}, {"T", T}, {"call", long(call)},
                                    {"softplus", long(gate_kind == KdaGate::Softplus)}});
      expect_close("kda_chunked", sh, host(dout, ref.size()), ref, 1e-5);
      expect_close("kda_chunk_S", sh, host(ds.S, S.size()), S, 1e-5);
      expect_close("kda_chunk_win", sh, host(ds.conv, conv.size()), conv, 0.0);
    }
  }
}

TEST_F(CudaOps, KdaOptionsAreChecked) {
  try {
    parse_cuda_kda("fast", "--cuda-kda");
    FAIL() << "--cuda-kda fast must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-kda"), std::string::npos) << e.what();
  }
  const CudaOptions before = be_->options();
  EXPECT_THROW(be_->set_options(CudaOptions{CudaKda::Chunked, 48}), Error);
  EXPECT_EQ(be_->options().kda_chunk, before.kda_chunk) << "a refused option changes nothing";
  EXPECT_THROW(CudaBackend(0, CudaOptions{CudaKda::Chunked, 8}), Error);
  EXPECT_EQ(describe(CudaOptions{CudaKda::Chunked, 16}), "cuda precision exact; kda chunked (chunk 16)");
  EXPECT_EQ(describe(CudaOptions{}), "cuda precision exact; kda recurrent");
}

// Speed of the two paths at K3 KDA sizes (96 heads × 128, conv 4, bounded gate) on prefill-sized
// calls, same inputs and state; prints the times and their ratio (median of 5 calls after a warm-up,
// host clock around a synchronized call) and checks the paths agree (rel-L2 1e-5, outputs and S).
TEST_F(CudaOps, KdaChunkedVsRecurrentAtK3Sizes) {
  std::mt19937 g(23);
  const int H = 96, d = 128, K = 4, P = H * d;
  KdaParams p{H, d, K, -5.f, 1e-5f, KdaGate::LowerBound};
  std::vector<HostWeight> ws;
  ws.reserve(6);
  auto& qc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
  auto& kc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
  auto& vc = ws.emplace_back(random_vec(g, size_t(P) * K), P, K);
  auto& alog = ws.emplace_back(random_vec(g, H, -1.f, 1.f), 1, H);
  auto& dtb = ws.emplace_back(random_vec(g, P), 1, P);
  auto& onorm = ws.emplace_back(random_vec(g, d, 0.5f, 1.5f), 1, d);
  KdaWeights w;
  w.q_conv = qc.w, w.k_conv = kc.w, w.v_conv = vc.w, w.a_log = alog.w, w.dt_bias = dtb.w, w.o_norm = onorm.w;
  for (auto& hw : ws) be_->upload(hw.w);
  const auto S0 = random_vec(g, size_t(H) * d * d, -0.1f, 0.1f), conv0 = random_vec(g, size_t(3) * P * (K - 1));
  for (const int T : {32, 1024}) {
    const auto q = random_vec(g, size_t(T) * P), k = random_vec(g, size_t(T) * P), v = random_vec(g, size_t(T) * P);
    const auto z = random_vec(g, size_t(T) * P, -3.f, 3.f), beta = random_vec(g, size_t(T) * H, -3.f, 3.f);
    const auto gate = random_vec(g, size_t(T) * P, -3.f, 3.f);
    float *dq = dev(q), *dk = dev(k), *dv = dev(v), *dz = dev(z), *db = dev(beta), *dg = dev(gate);
    std::vector<float> outs[4], states[4];
    double ms[4] = {0, 0, 0, 0};
    const CudaOptions modes[4] = {kRecurrent, {CudaKda::Chunked, 16}, {CudaKda::Chunked, 32}, {CudaKda::Chunked, 64}};
    for (int m = 0; m < 4; ++m) {
      ScopedOptions mode(*be_, modes[m]);
      KdaState ds{dev(S0), dev(conv0)};
      float* dout = poisoned(size_t(T) * P);
      be_->kda_core(p, w, ds, dq, dk, dv, dz, db, dg, T, dout);  // the call checked below
      outs[m] = host(dout, size_t(T) * P);
      states[m] = host(ds.S, S0.size());
      std::vector<double> t;
      for (int rep = 0; rep < 5; ++rep) {
        be_->synchronize();
        const auto a = std::chrono::steady_clock::now();
        be_->kda_core(p, w, ds, dq, dk, dv, dz, db, dg, T, dout);
        be_->synchronize();
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
      }
      std::sort(t.begin(), t.end());
      ms[m] = t[2];
    }
    for (int m = 1; m < 4; ++m) {
      std::printf("[ kda path ] K3 sizes H=96 d=128 T=%d: recurrent %.3f ms, chunked (C=%d) %.3f ms, ratio %.2fx\n", T,
                  ms[0], modes[m].kda_chunk, ms[m], ms[0] / ms[m]);
      const std::string sh = shape({{"T", T}, {"C", modes[m].kda_chunk}});
      expect_close("kda_paths_out", sh, outs[m], outs[0], 1e-5);
      expect_close("kda_paths_S", sh, states[m], states[0], 1e-5);
    }
  }
}

// ---- MLA ----

// mla_attend: cache rows (f64 RMS) and the absorbed attention in the CPU's order; exp in f64 ->
// tolerance rel-L2 1e-5 on ctx and on the cache after every call (prefill, then decode steps).
TEST_F(CudaOps, MlaAttendMatchesCpuAcrossCalls) {
  std::mt19937 g(8);
  struct Case { int H, nope, extra, v, lora; std::vector<int> Ts; };
  const std::vector<Case> cases = {{1, 16, 8, 16, 32, {1, 1, 1}},   {4, 32, 16, 32, 32, {8, 1, 1, 33}},
                                   {3, 16, 8, 20, 24, {33, 1}},    {2, 33, 5, 7, 40, {1, 4, 1}},
                                   {2, 128, 64, 128, 512, {33, 1, 1}}};
  for (const Case& c : cases) {
    MlaParams p{c.H, c.nope, c.extra, c.v, c.lora, 1e-6f};
    const int W = c.lora + c.extra, qh = c.nope + c.extra, cap = 80;
    HostWeight kvb(random_vec(g, size_t(c.H) * (c.nope + c.v) * c.lora), c.H * (c.nope + c.v), c.lora);
    HostWeight norm(random_vec(g, c.lora, 0.5f, 1.5f), 1, c.lora);
    MlaWeights w;
    w.kv_b = kvb.w, w.kv_a_norm = norm.w;
    be_->upload(kvb.w);
    be_->upload(norm.w);
    std::vector<float> hcache(size_t(cap) * W, 0.f);
    MlaCache hc{hcache.data(), 0, cap};
    MlaCache dc{poisoned(size_t(cap) * W), 0, cap};
    for (size_t call = 0; call < c.Ts.size(); ++call) {
      const int T = c.Ts[call];
      const auto q = random_vec(g, size_t(T) * c.H * qh), ckv = random_vec(g, size_t(T) * W, -2.f, 2.f);
      float* dctx = poisoned(size_t(T) * c.H * c.v);
      be_->mla_attend(p, w, dc, dev(q), dev(ckv), T, dctx);
      std::vector<float> ref(size_t(T) * c.H * c.v);
      cpu_.mla_attend(p, w, hc, q.data(), ckv.data(), T, ref.data());
      ASSERT_EQ(dc.length, hc.length);
      const std::string sh = shape({{"H", c.H}, {"nope", c.nope}, {"extra", c.extra}, {"v", c.v},
                                    {"kv_lora", c.lora}, {"T", T}, {"pos", hc.length - T}});
      expect_close("mla_attend", sh, host(dctx, ref.size()), ref, 1e-5);
      const size_t filled = size_t(hc.length) * W;
      expect_close("mla_cache", sh, host(dc.kv, filled), std::vector<float>(hcache.begin(), hcache.begin() + filled), 1e-6);
    }
    float* dctx = poisoned(size_t(cap) * c.H * c.v);
    const std::vector<float> big(size_t(cap) * W, 1.f), bq(size_t(cap) * c.H * qh, 1.f);
    EXPECT_THROW(be_->mla_attend(p, w, dc, dev(bq), dev(big), cap, dctx), Error) << "cache overflow must throw";
  }
}

// ---- MoE ----

// router_topk: ids must be equal (ties to the lower id); weights rel-L2 1e-6.
TEST_F(CudaOps, RouterTopkMatchesCpu) {
  std::mt19937 g(9);
  for (int E : {16, 33, 896})
    for (int k : {1, 4, 16})
      for (int T : {1, 5, 33}) {
        if (k > E) continue;
        auto logits = random_vec(g, size_t(T) * E, -4.f, 4.f);
        // Quantize some rows so exact ties occur: the lower id must win on both sides.
        for (int t = 0; t < T; t += 2)
          for (int e = 0; e < E; ++e) logits[size_t(t) * E + e] = std::round(logits[size_t(t) * E + e] * 2.f) / 2.f;
        HostWeight bias(random_vec(g, E, -0.1f, 0.1f), 1, E);
        if (E == 33) std::fill(bias.data.begin(), bias.data.end(), 0.f);
        be_->upload(bias.w);
        std::vector<int> ids(size_t(T) * k, -1), rids(ids.size());
        std::vector<float> wts(ids.size(), std::nanf("")), rw(ids.size());
        be_->router_topk(dev(logits), bias.w, T, E, k, ids.data(), wts.data());
        cpu_.router_topk(logits.data(), bias.w, T, E, k, rids.data(), rw.data());
        const std::string sh = shape({{"E", E}, {"k", k}, {"T", T}});
        EXPECT_EQ(ids, rids) << "router ids " << sh;
        expect_close("router_topk", sh, wts, rw, 1e-6);
      }
}

/// A random expert (logical w1/w3 [inter, latent], w2 [latent, inter]) with its own storage.
struct HostExpert {
  std::vector<uint8_t> bytes[6];
  ExpertRef e;
  HostExpert(std::mt19937& g, int latent, int inter, const std::vector<uint8_t>& scales13,
             const std::vector<uint8_t>& scales2) {
    std::uniform_int_distribution<int> byte(0, 255);
    auto fill = [&](MxMatrix& m, int rows, int cols, std::vector<uint8_t>& pk, std::vector<uint8_t>& sc,
                    const std::vector<uint8_t>& scales) {
      m.rows = rows, m.cols = cols;
      pk.resize(size_t(rows) * cols / 2);
      for (auto& b : pk) b = uint8_t(byte(g));
      sc.resize(size_t(rows) * cols / 32);
      std::uniform_int_distribution<size_t> pick(0, scales.size() - 1);
      for (auto& s : sc) s = scales[pick(g)];
      m.packed = pk.data(), m.scale = sc.data();
    };
    fill(e.w1, inter, latent, bytes[0], bytes[1], scales13);
    fill(e.w2, latent, inter, bytes[2], bytes[3], scales2);
    fill(e.w3, inter, latent, bytes[4], bytes[5], scales13);
    e.name = "test expert";
  }
};

std::vector<uint8_t> range_bytes(int lo, int hi) {
  std::vector<uint8_t> v;
  for (int s = lo; s <= hi; ++s) v.push_back(uint8_t(s));
  return v;
}

// expert_ffn: per-group sums and group order as on the CPU; SiTU's exp/tanh in f64 -> rel-L2 1e-6.
TEST_F(CudaOps, ExpertFfnMatchesCpu) {
  std::mt19937 g(10);
  // MXFP4 needs whole 32-column groups, so latent and inter are multiples of 32 (K3: 3584, 3072).
  const int cases[][2] = {{32, 32}, {64, 64}, {96, 32}, {64, 96}, {3584, 64}, {512, 3072}, {3584, 3072}};
  for (const auto& c : cases) {
    const int latent = c[0], in2 = c[1];
    HostExpert he(g, latent, in2, range_bytes(118, 127), range_bytes(120, 130));
    be_->upload(he.e);
    const auto z = random_vec(g, latent, -2.f, 2.f);
    float* dy = poisoned(latent);
    be_->expert_ffn(he.e, dev(z), 4.f, 25.f, dy);
    std::vector<float> ref(latent);
    cpu_.expert_ffn(he.e, z.data(), 4.f, 25.f, ref.data());
    expect_close("expert_ffn", shape({{"latent", latent}, {"inter", in2}}), host(dy, latent), ref, 1e-6);
  }
}

// Decode edge cases through the kernel (docs/gpu-method.md#per-op): every e2m1 code (random bytes cover all 16 in both
// nibbles), scale bytes 0 (the subnormal 2^-127: fails if the GPU flushed to zero), 1, 127 and 254
// in gate/up (inputs small enough that 2^127 groups stay finite), tiny scales 0/1 in down;
// tolerance rel-L2 1e-6.
TEST_F(CudaOps, ExpertFfnDecodeEdgeCases) {
  std::mt19937 g(11);
  HostExpert he(g, 64, 64, {0, 1, 127, 254}, {0, 1});
  for (int code = 0; code < 16; ++code) he.bytes[0][code] = uint8_t(code | (15 - code) << 4);
  be_->upload(he.e);
  const auto z = random_vec(g, 64, -1e-3f, 1e-3f);
  float* dy = poisoned(64);
  be_->expert_ffn(he.e, dev(z), 4.f, 25.f, dy);
  std::vector<float> ref(64);
  cpu_.expert_ffn(he.e, z.data(), 4.f, 25.f, ref.data());
  const auto got = host(dy, 64);
  expect_close("expert_ffn", "decode edge cases", got, ref, 1e-6);
  bool any_tiny = false;
  for (float r : ref) any_tiny |= r != 0.f && std::fabs(r) < 1e-30f;
  EXPECT_TRUE(any_tiny) << "the down scales 0/1 should give outputs near 2^-126";
}

// weighted_sum: f32 sum in slot order -> exact.
TEST_F(CudaOps, WeightedSumMatchesCpu) {
  std::mt19937 g(12);
  for (int m : {1, 4, 16})
    for (int n : {1, 33, 3584}) {
      const auto ys = random_vec(g, size_t(m) * n), w = random_vec(g, m, 0.f, 1.f);
      float* dy = poisoned(n);
      be_->weighted_sum(dev(ys), w.data(), m, n, dy);
      std::vector<float> ref(n);
      cpu_.weighted_sum(ys.data(), w.data(), m, n, ref.data());
      expect_close("weighted_sum", shape({{"m", m}, {"n", n}}), host(dy, n), ref, 0.0);
    }
}

// routed_moe (device routing + all experts of all tokens in one launch per matrix + weighted sum)
// against the CPU's host-routed path (router_topk, weights × routed_scale, expert_ffn per (token,
// slot), weighted_sum): ids must agree (ties included), so rel-L2 1e-6 as expert_ffn; and against
// the CUDA backend's own host-routed path: bit-identical (same per-row kernels, same sum order).
TEST_F(CudaOps, RoutedMoeMatchesCpu) {
  std::mt19937 g(13);
  struct Case {
    int E, k, io, inter;
    float scale;
  };
  const Case cases[] = {{16, 4, 64, 32, 1.f},   {33, 1, 96, 64, 2.5f},  {64, 16, 512, 256, 2.827f},
                        {8, 8, 3584, 64, 1.f},  {4, 2, 256, 3072, 0.5f}, {40, 6, 32, 96, 1.f}};
  for (const Case& c : cases)
    for (int T : {1, 3, 33}) {
      if (c.io >= 3584 && T > 3) continue;  // keeps the CPU reference quick
      std::vector<std::unique_ptr<HostExpert>> experts;
      MoeWeights mw;
      for (int e = 0; e < c.E; ++e) {
        experts.push_back(std::make_unique<HostExpert>(g, c.io, c.inter, range_bytes(118, 127), range_bytes(120, 130)));
        mw.experts.push_back(experts.back()->e);
      }
      HostWeight bias(random_vec(g, c.E, -0.1f, 0.1f), 1, c.E);
      mw.bias = bias.w;
      const RoutedMoeParams p{7, c.E, c.k, c.io, c.scale, 4.f, 25.f};
      const std::string sh = shape({{"E", c.E}, {"k", c.k}, {"io", c.io}, {"inter", c.inter}, {"T", T}});
      {  // Not resident: declined. On a fresh backend, because the shared one's weight map may
         // still hold a freed expert of an earlier case at a reused host address (lesson 11;
         // the map is only as fresh as the last upload, see cuda_backend.h).
        CudaBackend fresh;
        EXPECT_FALSE(fresh.routed_moe_on_device(p, mw)) << sh;
        fresh.upload(bias.w);
        for (int e = 0; e + 1 < c.E; ++e) fresh.upload(mw.experts[e]);
        EXPECT_FALSE(fresh.routed_moe_on_device(p, mw)) << sh << ": one expert missing";
        fresh.upload(mw.experts[c.E - 1]);
        EXPECT_TRUE(fresh.routed_moe_on_device(p, mw)) << sh;
      }
      be_->upload(bias.w);
      for (const ExpertRef& e : mw.experts) be_->upload(e);
      ASSERT_TRUE(be_->routed_moe_on_device(p, mw)) << sh;

      auto logits = random_vec(g, size_t(T) * c.E, -4.f, 4.f);
      for (int t = 0; t < T; t += 2)  // exact ties on every other token: the lower id must win
        for (int e = 0; e < c.E; ++e) logits[size_t(t) * c.E + e] = std::round(logits[size_t(t) * c.E + e] * 2.f) / 2.f;
      const auto z = random_vec(g, size_t(T) * c.io, -2.f, 2.f);
      float* dlog = dev(logits);
      float* dz = dev(z);
      float* dys = poisoned(size_t(T) * c.k * c.io);
      float* dout = poisoned(size_t(T) * c.io);
      const uint64_t fallbacks = be_->fallbacks();
      be_->routed_moe(p, mw, dlog, dz, T, RoutedMoeWork{dys}, dout);
      EXPECT_EQ(be_->fallbacks(), fallbacks) << sh << ": resident experts must route on the device";
      const auto got = host(dout, size_t(T) * c.io);
      {  // An output 4 bytes past 16-byte alignment: the weighted sum runs a column a thread
         // (slot_sum_kernel<1>), with the same sums.
        float* dout1 = poisoned(size_t(T) * c.io + 1);
        be_->routed_moe(p, mw, dlog, dz, T, RoutedMoeWork{dys}, dout1 + 1);
        const auto got1 = host(dout1, size_t(T) * c.io + 1);
        EXPECT_EQ(0, std::memcmp(got1.data() + 1, got.data(), got.size() * 4)) << sh << ": output not 16-byte aligned";
      }

      // CPU reference: the forward pass's host-routed path.
      std::vector<int> ids(size_t(T) * c.k);
      std::vector<float> w(ids.size()), ys(ids.size() * c.io), ref(size_t(T) * c.io);
      cpu_.router_topk(logits.data(), bias.w, T, c.E, c.k, ids.data(), w.data());
      if (c.scale != 1.f)
        for (float& x : w) x *= c.scale;
      for (size_t j = 0; j < ids.size(); ++j)
        cpu_.expert_ffn(mw.experts[ids[j]], z.data() + (j / c.k) * c.io, 4.f, 25.f, ys.data() + j * c.io);
      for (int t = 0; t < T; ++t)
        cpu_.weighted_sum(ys.data() + size_t(t) * c.k * c.io, w.data() + size_t(t) * c.k, c.k, c.io,
                          ref.data() + size_t(t) * c.io);
      expect_close("routed_moe", sh, got, ref, 1e-6);

      // The CUDA backend's host-routed path: bit-identical.
      std::vector<int> gids(ids.size());
      std::vector<float> gw(ids.size());
      be_->router_topk(dlog, bias.w, T, c.E, c.k, gids.data(), gw.data());
      EXPECT_EQ(gids, ids) << sh;
      if (c.scale != 1.f)
        for (float& x : gw) x *= c.scale;
      float* dys2 = poisoned(ids.size() * c.io);
      for (size_t j = 0; j < ids.size(); ++j)
        be_->expert_ffn(mw.experts[gids[j]], dz + (j / c.k) * c.io, 4.f, 25.f, dys2 + j * c.io);
      float* dout2 = poisoned(size_t(T) * c.io);
      for (int t = 0; t < T; ++t)
        be_->weighted_sum(dys2 + size_t(t) * c.k * c.io, gw.data() + size_t(t) * c.k, c.k, c.io,
                          dout2 + size_t(t) * c.io);
      expect_close("routed_moe_vs_host_routed_cuda", sh, got, host(dout2, size_t(T) * c.io), 0.0);
      EXPECT_EQ(0, std::memcmp(got.data(), host(dout2, size_t(T) * c.io).data(), got.size() * 4))
          << sh << ": device routing must equal the CUDA host-routed path bit for bit";
    }
}

// A bad ue8m0 scale byte (255 = NaN) is reported when the layer's expert table is built.
TEST_F(CudaOps, RoutedMoeRejectsBadScale) {
  std::mt19937 g(14);
  HostExpert a(g, 64, 32, range_bytes(118, 127), range_bytes(120, 130));
  HostExpert b(g, 64, 32, range_bytes(118, 127), range_bytes(120, 130));
  b.bytes[3][5] = 255;
  MoeWeights mw;
  mw.experts = {a.e, b.e};
  HostWeight bias(random_vec(g, 2, -0.1f, 0.1f), 1, 2);
  mw.bias = bias.w;
  be_->upload(bias.w);
  be_->upload(a.e);
  be_->upload(b.e);
  EXPECT_THROW(be_->routed_moe_on_device(RoutedMoeParams{0, 2, 1, 64, 1.f, 4.f, 25.f}, mw), Error);
}

// Dense experts (Kimi Linear) are chosen on the host: routed_moe then runs the host-routed
// reference through the CUDA ops as a counted fallback (logged once), matches the CPU's routed_moe,
// and is an error under strict mode.
TEST_F(CudaOps, RoutedMoeDenseExpertsFallBackCountedAndStrict) {
  std::mt19937 g(15);
  const int E = 6, k = 2, io = 48, inter = 40, T = 3;
  std::vector<std::unique_ptr<HostWeight>> hw;
  MoeWeights mw;
  for (int e = 0; e < E; ++e) {
    ExpertRef r;
    hw.push_back(std::make_unique<HostWeight>(random_vec(g, size_t(inter) * io, -0.2f, 0.2f), inter, io));
    r.d1 = hw.back()->w;
    hw.push_back(std::make_unique<HostWeight>(random_vec(g, size_t(inter) * io, -0.2f, 0.2f), inter, io));
    r.d3 = hw.back()->w;
    hw.push_back(std::make_unique<HostWeight>(random_vec(g, size_t(io) * inter, -0.2f, 0.2f), io, inter));
    r.d2 = hw.back()->w;
    mw.experts.push_back(r);
  }
  HostWeight bias(random_vec(g, E, -0.1f, 0.1f), 1, E);
  mw.bias = bias.w;
  RoutedMoeParams p{3, E, k, io, 2.5f, 4.f, 25.f};
  p.format = ExpertFormat::Dense, p.act = Activation::SiLU, p.inter = inter;
  const auto logits = random_vec(g, size_t(T) * E, -4.f, 4.f);
  const auto z = random_vec(g, size_t(T) * io, -2.f, 2.f);
  // CPU reference: host buffers.
  std::vector<float> ys(size_t(T) * k * io), cg(inter), cu(inter), ca(inter), ref(size_t(T) * io);
  cpu_.routed_moe(p, mw, logits.data(), z.data(), T, RoutedMoeWork{ys.data(), cg.data(), cu.data(), ca.data()},
                  ref.data());
  EXPECT_EQ(cpu_.fallbacks(), 0u) << "the CPU's routed_moe is the reference, never a fallback";

  CudaBackend be;
  be.upload(bias.w);
  for (const ExpertRef& e : mw.experts) be.upload(e);
  float* dlog = dev(logits);
  float* dz = dev(z);
  const RoutedMoeWork ws{poisoned(size_t(T) * k * io), poisoned(inter), poisoned(inter), poisoned(inter)};
  float* dout = poisoned(size_t(T) * io);
  // Read back through the backend that computed (its own stream): the fixture's host() waits only
  // for the fixture's backend, which let this check read the poison before the result landed.
  auto read = [](CudaBackend& b, const float* d, size_t n) {
    std::vector<float> h(n);
    b.to_host(d, n, h.data());
    return h;
  };
  be.routed_moe(p, mw, dlog, dz, T, ws, dout);
  expect_close("routed_moe_dense_fallback", "E=6 k=2 io=48 inter=40 T=3", read(be, dout, size_t(T) * io), ref, 1e-5);
  EXPECT_EQ(be.fallbacks(), 1u);
  EXPECT_EQ(be.stats().host_routed_moe_calls, 1u);
  be.set_strict(true);
  EXPECT_THROW(be.routed_moe(p, mw, dlog, dz, T, ws, dout), Error);
  EXPECT_EQ(be.fallbacks(), 2u);

  // Fast precision mode routes dense experts on the device through the same op (the grouped path,
  // moe_grouped.cu, BF16 operands): no fallback noted, also under --strict.
  CudaOptions fo;
  fo.precision = GpuPrecision::Fast;
  CudaBackend fast(0, fo);
  fast.set_strict(true);
  fast.upload(bias.w);
  for (const ExpertRef& e : mw.experts) fast.upload(e);
  float* dout2 = poisoned(size_t(T) * io);
  const RoutedMoeWork ws2{poisoned(size_t(T) * k * io), poisoned(inter), poisoned(inter), poisoned(inter)};
  fast.routed_moe(p, mw, dev(logits), dev(z), T, ws2, dout2);
  expect_close("routed_moe_dense_fast", "E=6 k=2 io=48 inter=40 T=3", read(fast, dout2, size_t(T) * io), ref, 6e-3);
  EXPECT_EQ(fast.fallbacks(), 0u);
  EXPECT_EQ(fast.stats().host_routed_moe_calls, 0u);
  EXPECT_EQ(fast.stats().grouped_moe_calls, 1u);
}

// VRAM expert tier: a prefetch racing an eviction and a use (docs/streaming.md#cuda). Two slots;
// the test hook holds every prefetch batch back on the device with a 100 ms spin kernel, so its
// copies are surely in flight. Layer 0 routes to experts {0, 1} (both slots); then the guess
// {2, 3} for layer 1 takes both slots (evicting layer 0's, whose kernels may still run) and layer 1
// routes to {3, 5}: expert 3 is a hit on a slot whose copy has not landed (the kernels must wait
// for it), and expert 5 evicts the in-flight guess 2 (its copy must wait for the guess's copy, or
// that stale copy lands on top of it). The outputs must equal all-resident experts bit for bit.
TEST(CudaTier, PrefetchRacingAnEviction) {
  std::string why;
  if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  std::mt19937 g(21);
  const int E = 8, k = 2, io = 64, inter = 32;
  std::vector<std::unique_ptr<HostExpert>> hx;
  MoeWeights mw[2];
  HostWeight bias(std::vector<float>(E, 0.f), 1, E);
  WeightList wl;
  wl.dense.push_back(&bias.w);
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < E; ++e) {
      hx.push_back(std::make_unique<HostExpert>(g, io, inter, range_bytes(118, 127), range_bytes(120, 130)));
      hx.back()->e.name = "layer " + std::to_string(l) + " expert " + std::to_string(e);
      mw[l].experts.push_back(hx.back()->e);
    }
    mw[l].bias = bias.w;
    wl.experts.push_back(&mw[l].experts);
  }
  const size_t slot = 3 * (size_t(inter) * io / 2) + 3 * 256;  // packed parts + 256-aligned scales
  const auto z = random_vec(g, io, -2.f, 2.f);
  auto pick = [&](std::initializer_list<int> ids) {
    std::vector<float> v(E, -8.f);
    for (int e : ids) v[e] = 8.f;
    return v;
  };
  const std::vector<float> logits[2] = {pick({0, 1}), pick({3, 5})};
  // out[layer] on a backend with `budget` bytes of expert slots; `race` sets the hooks and the guess.
  auto run = [&](uint64_t budget, bool race, CudaStats* st) {
    CudaBackend be;
    be.set_vram_expert_budget(budget);
    be.upload(wl);
    if (race) be.tier_test_hooks(100000, true);
    std::vector<std::vector<float>> out;
    float* dz = be.alloc(io);
    be.from_host(z.data(), io, dz);
    float* dlog = be.alloc(E);
    float* dys = be.alloc(size_t(k) * io);
    float* dout = be.alloc(io);
    for (int l = 0; l < 2; ++l) {
      if (race && l == 1) {
        const int guess[2] = {2, 3};
        be.prefetch_experts(1, guess, 2);
      }
      be.from_host(logits[l].data(), E, dlog);
      be.routed_moe(RoutedMoeParams{l, E, k, io, 1.f, 4.f, 25.f}, mw[l], dlog, dz, 1, RoutedMoeWork{dys}, dout);
      out.emplace_back(io);
      be.to_host(dout, io, out.back().data());
    }
    for (float* p : {dz, dlog, dys, dout}) be.release(p);
    if (st) *st = be.stats();
    return out;
  };
  const auto ref = run(CudaBackend::kAllExperts, false, nullptr);
  CudaStats st;
  const auto got = run(2 * slot, true, &st);
  ASSERT_EQ(st.expert_slots, 2u) << "two slots expected (slot of " << slot << " bytes)";
  EXPECT_EQ(st.tier_prefetch_issued, 2u) << "both guesses copied";
  EXPECT_EQ(st.tier_prefetch_used, 1u) << "guess 3 used while its copy was in flight";
  EXPECT_EQ(st.tier_prefetch_wasted, 1u) << "guess 2 evicted while its copy was in flight";
  for (int l = 0; l < 2; ++l)
    EXPECT_EQ(0, std::memcmp(got[l].data(), ref[l].data(), size_t(io) * 4))
        << "layer " << l << ": the tier with a racing prefetch must equal resident experts bit for bit";
  std::printf("[ cuda tier race ] 2 slots, prefetch copied %llu, used in flight %llu, evicted in flight %llu, "
              "demand misses %llu; outputs bit-identical to resident experts\n",
              (unsigned long long)st.tier_prefetch_issued, (unsigned long long)st.tier_prefetch_used,
              (unsigned long long)st.tier_prefetch_wasted, (unsigned long long)st.tier_misses);
}

#endif  // WREN_HAVE_CUDA

}  // namespace
}  // namespace wren
