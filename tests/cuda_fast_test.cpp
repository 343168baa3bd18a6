// The CUDA backend's fast precision mode (--gpu-precision fast, ops/gpu_precision.h) against
// the CPU reference: cuBLASLt GEMMs (gemm_lt.cu), the grouped routed-expert GEMM for MXFP4 and
// dense experts (moe_grouped.cu), and whole models (k3-tiny-a, kimi-linear-tiny). Random non-zero
// inputs, awkward sizes, one token, chunk edges; outputs poisoned with NaN before each GPU call.
// Tolerances: BF16 operands with f32 accumulation give rel-L2 ≈ 3e-3 on random data (each operand
// rounds with a relative rms of ~2.3e-3), so single ops are held to 6e-3 and models to the fast
// mode's stated bound (docs/backends.md "Precision modes": logits rel-L2 <= 1e-2). Chunk
// invariance within the mode is checked bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/forward.h"
#include "model/load.h"
#include "model/quant.h"
#include "model/weights.h"
#include "ops/state.h"
#include "test_util.h"
#ifdef WREN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_backend.h"
#endif

namespace wren {
namespace {

#ifndef WREN_HAVE_CUDA
TEST(CudaFast, NotBuilt) { GTEST_SKIP() << "CUDA backend not built (configure with -DWREN_CUDA=ON; nvcc needed)"; }
#else

using test::HostWeight;

std::vector<float> rnd(std::mt19937& g, size_t n, float lo = -1.f, float hi = 1.f) { return test::random_vec(g, n, lo, hi); }

size_t nan_count(const std::vector<float>& v) {
  size_t n = 0;
  for (float x : v) n += std::isnan(x);
  return n;
}

/// A BF16 DenseWeight of rows × cols whose bytes (`bytes`, resized and filled here) round the f32
/// values src; upload it to use it on the device.
DenseWeight bf16_weight(const float* src, int rows, int cols, std::vector<uint8_t>& bytes) {
  bytes.resize(wformat_data_bytes(WFormat::BF16, rows, cols));
  quantize_matrix(src, rows, cols, WFormat::BF16, bytes.data(), nullptr);
  DenseWeight w;
  w.rows = size_t(rows), w.cols = size_t(cols), w.format = WFormat::BF16, w.dtype = DType::BF16, w.data = bytes.data();
  return w;
}

struct Worst {
  double rel = 0;
  int cases = 0;
  void add(double r) { rel = std::max(rel, r), ++cases; }
};

class CudaFast : public ::testing::Test, protected test::BackendBuffers {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
    be_ = std::make_unique<CudaBackend>();
    be_->set_precision(GpuPrecision::Fast);
  }
  void TearDown() override {
    if (be_) release_owned();
  }
  Backend& buffers_backend() override { return *be_; }
  /// Backend::routed_moe's workspace: ys, and the dense host path's g/u/act rows of `inter`.
  RoutedMoeWork work(float* ys, int inter) { return RoutedMoeWork{ys, poisoned(inter), poisoned(inter), poisoned(inter)}; }
  std::unique_ptr<CudaBackend> be_;
  CpuBackend cpu_;
};

// cuBLASLt GEMM (rows % 4 == 0 and cols % 8 == 0 take it; the others the f32 kernel), f32 and
// BF16 weights, T = 1 (GEMV: the tensor-core kernel for BF16 with cols % 32 == 0, deterministic;
// else the exact path) through 1000; then the chunk rule: the first rows of a
// large-T call equal a small-T call on those rows bit for bit.
TEST_F(CudaFast, GemmMatchesCpu) {
  std::mt19937 g(31);
  const int cases[][3] = {{8, 8, 2},     {64, 128, 3},   {100, 256, 17}, {4352, 128, 33}, {12, 12288, 2},
                          {300, 3584, 64}, {1024, 2304, 300}, {2304, 1024, 1000}, {33, 31, 5}, {7, 96, 9},
                          {96, 7168, 1}, {128, 7168, 257},
                          // T = 1, BF16: the tensor-core GEMV (gemv_tc.cu), one tile a block or
                          // column-split; rows past a 16-row tile, columns past a 128-column span
                          {4100, 2304, 1}, {17, 3584, 1}, {2048, 512, 1}, {1, 7168, 1}, {300, 160, 1}, {40, 12288, 1}};
  Worst lt, tc, f32;
  for (const auto& c : cases) {
    const int rows = c[0], cols = c[1], T = c[2];
    for (WFormat f : {WFormat::F32, WFormat::BF16}) {
      HostWeight w(rnd(g, size_t(rows) * cols), rows, cols);
      std::vector<uint8_t> packed;
      DenseWeight W = f == WFormat::BF16 ? bf16_weight(w.data.data(), rows, cols, packed) : w.w;
      be_->upload(W);
      const auto x = rnd(g, size_t(T) * cols);
      float* dy = poisoned(size_t(T) * rows);
      const uint64_t before = be_->stats().lt_gemms, tc_before = be_->stats().tc_gemvs;
      be_->gemm(W, dev(x), T, dy);
      const bool took_lt = be_->stats().lt_gemms > before, took_tc = be_->stats().tc_gemvs > tc_before;
      std::vector<float> ref(size_t(T) * rows);
      cpu_.gemm(w.w, x.data(), T, ref.data());  // the f32 weight: the bf16 rounding is part of the error
      const auto got = host(dy, ref.size());
      const std::string sh = "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " T=" +
                             std::to_string(T) + " " + wformat_name(f);
      EXPECT_EQ(nan_count(got), 0u) << sh;
      const double r = test::rel_l2(got.data(), ref.data(), ref.size());
      // A matrix of a few rows is a few dot products: its rel-L2 is one sum's, cancellation included
      // (one row of 7168 columns: 6.02e-3 on the tensor-core GEMV, run 28a).
      EXPECT_LE(r, rows < 16 ? 2e-2 : 6e-3) << sh;
      if (took_tc) std::printf("[ cuda fast ] tensor-core gemv %s: rel-L2 %.3g\n", sh.c_str(), r);
      EXPECT_EQ(took_lt, T >= 2 && rows % 4 == 0 && cols % 8 == 0) << sh;
      EXPECT_EQ(took_tc, T == 1 && f == WFormat::BF16 && cols % 32 == 0) << sh;
      (took_lt ? lt : took_tc ? tc : f32).add(r);
      if (took_tc) {  // the same call twice: the same bits (every sum in a fixed order; any L2 prefetch)
        float* d2 = poisoned(size_t(rows));
        be_->set_decode_streams(rows % 2 == 0, rows % 2 ? 0 : 12);
        be_->gemm(W, dev(x), 1, d2);
        const auto again = host(d2, size_t(rows));
        EXPECT_EQ(0, std::memcmp(again.data(), got.data(), again.size() * 4)) << sh << ": not deterministic";
      }
      if (took_lt && T >= 4) {  // chunk rule: rows of a T-token call = a (T/2)-token call on them
        const int h = T / 2;
        float* dh = poisoned(size_t(h) * rows);
        be_->gemm(W, dev(std::vector<float>(x.begin(), x.begin() + size_t(h) * cols)), h, dh);
        const auto half = host(dh, size_t(h) * rows);
        EXPECT_EQ(0, std::memcmp(half.data(), got.data(), half.size() * 4)) << sh << ": depends on T";
      }
    }
  }
  std::printf("[ cuda fast ] gemm cuBLASLt: %d cases, worst rel-L2 %.3g; tensor-core gemv: %d cases, worst %.3g; "
              "f32 path: %d cases, worst %.3g\n",
              lt.cases, lt.rel, tc.cases, tc.rel, f32.cases, f32.rel);
}

// The tensor-core GEMV (T = 1, BF16) with 1, 2, 4 and 8 warps to a 16-row tile and in each of its
// forms (the test hooks of set_decode_streams; 0 = the default) on shapes from 1 to 140000 rows,
// against the CPU; then
// Backend::gemm_batch: 12 jobs (10 the tensor-core GEMV takes, an f32 one and a BF16 one of 48
// columns it declines) in launches of at most 8 products, each y equal bit for bit to gemm on its
// job alone, and one launch for a batch of 8 it takes; then a T = 5 gemm_batch (cuBLASLt) whose
// jobs share inputs: one activation conversion a change of input, each y equal to gemm alone.
TEST_F(CudaFast, GemvBatchesAndWarpsPerTileMatchCpu) {
  std::mt19937 g(57);
  struct Case {
    int rows, cols;
  };
  const Case cases[] = {{140000, 160}, {4100, 2304}, {17, 3584}, {300, 160}, {2048, 512}, {40, 12288}, {1, 7168},
                        {3000, 64},    {513, 1024},  {2304, 48}, {100, 96}};
  std::vector<HostWeight> hw;
  std::vector<std::vector<uint8_t>> packed;
  std::vector<DenseWeight> W;
  std::vector<std::vector<float>> xs;
  std::vector<float*> dxs;
  hw.reserve(std::size(cases) + 1), packed.reserve(std::size(cases) + 1);
  for (const Case& c : cases) {
    hw.emplace_back(rnd(g, size_t(c.rows) * c.cols), c.rows, c.cols);
    const DenseWeight w = bf16_weight(hw.back().data.data(), c.rows, c.cols, packed.emplace_back());
    be_->upload(w);
    W.push_back(w);
    xs.push_back(rnd(g, size_t(c.cols)));
    dxs.push_back(dev(xs.back()));
  }
  hw.emplace_back(rnd(g, size_t(64) * 256), 64, 256);  // an f32 weight: gemm's f32 path
  be_->upload(hw.back().w);
  W.push_back(hw.back().w);
  xs.push_back(rnd(g, 256));
  dxs.push_back(dev(xs.back()));
  const size_t n = W.size();
  std::vector<std::vector<float>> ref(n);
  for (size_t i = 0; i < n; ++i) {
    ref[i].resize(W[i].rows);
    cpu_.gemm(hw[i].w, xs[i].data(), 1, ref[i].data());  // the f32 weight: the bf16 rounding is part of the error
  }
  Worst worst;
  // Every warp count with the default form, then every form (gemv_tc.cu kForms) with the default warps.
  std::vector<std::pair<int, int>> settings = {{0, 0}, {1, 0}, {2, 0}, {4, 0}, {8, 0}};
  for (int form = 1; form < CudaBackend::gemv_forms(); ++form) settings.emplace_back(0, form);
  for (const auto& [wt, form] : settings) {
    be_->set_decode_streams(true, 0, wt, form);
    for (size_t i = 0; i + 1 < n; ++i) {
      const std::string sh = "rows=" + std::to_string(W[i].rows) + " cols=" + std::to_string(W[i].cols) +
                             " warps a tile=" + std::to_string(wt) + " form=" + std::to_string(form);
      float* dy = poisoned(W[i].rows);
      const uint64_t tc0 = be_->stats().tc_gemvs;
      be_->gemm(W[i], dxs[i], 1, dy);
      EXPECT_EQ(be_->stats().tc_gemvs - tc0, W[i].cols % 32 == 0 ? 1u : 0u) << sh;
      const auto got = host(dy, W[i].rows);
      EXPECT_EQ(nan_count(got), 0u) << sh;
      const double r = test::rel_l2(got.data(), ref[i].data(), got.size());
      EXPECT_LE(r, W[i].rows < 16 ? 2e-2 : 6e-3) << sh;
      worst.add(r);
    }
  }
  be_->set_decode_streams(true, 0);
  // gemm_batch: every job's y bit-identical to gemm on it alone.
  std::vector<std::vector<float>> alone(n);
  for (size_t i = 0; i < n; ++i) {
    float* dy = poisoned(W[i].rows);
    be_->gemm(W[i], dxs[i], 1, dy);
    alone[i] = host(dy, W[i].rows);
  }
  std::vector<GemmJob> jobs;
  for (size_t i = 0; i < n; ++i) jobs.push_back({&W[i], dxs[i], poisoned(W[i].rows)});
  std::reverse(jobs.begin(), jobs.end());  // the declined jobs first, the many-row one last
  const uint64_t tc0 = be_->stats().tc_gemvs;
  be_->gemm_batch(jobs.data(), int(jobs.size()), 1);
  EXPECT_EQ(be_->stats().tc_gemvs - tc0, 10u);
  for (size_t j = 0; j < n; ++j) {
    const size_t i = n - 1 - j;
    const auto got = host(jobs[j].y, W[i].rows);
    EXPECT_EQ(0, std::memcmp(got.data(), alone[i].data(), got.size() * 4))
        << "gemm_batch job " << j << " (rows=" << W[i].rows << " cols=" << W[i].cols << ") differs from gemm alone";
  }
  std::vector<GemmJob> eight;
  for (size_t i = 0; i < n && eight.size() < 8; ++i)
    if (W[i].format == WFormat::BF16 && W[i].cols % 32 == 0) eight.push_back({&W[i], dxs[i], poisoned(W[i].rows)});
  be_->gemm_batch(eight.data(), 8, 1);  // scratch made
  const uint64_t l0 = be_->stats().launches;
  be_->gemm_batch(eight.data(), 8, 1);
  EXPECT_EQ(be_->stats().launches - l0, 1u) << "8 tensor-core GEMVs in one launch";
  for (const GemmJob& j : eight) {
    const size_t i = size_t(j.W - W.data());
    const auto got = host(j.y, W[i].rows);
    EXPECT_EQ(0, std::memcmp(got.data(), alone[i].data(), got.size() * 4)) << "batch of 8, rows=" << W[i].rows;
  }
  // T = 5 (cuBLASLt): a job whose input is the previous cuBLASLt job's reuses its BF16 copy. Inputs
  // a a b b a: three conversions, every y bit-identical to gemm on its job alone.
  {
    const int T = 5, cols = 256;
    const int rows[] = {64, 128, 96, 64, 32};
    std::vector<HostWeight> lw;
    std::vector<std::vector<uint8_t>> lp;
    lw.reserve(5), lp.reserve(5);
    std::vector<DenseWeight> LW;
    for (const int r : rows) {
      lw.emplace_back(rnd(g, size_t(r) * cols), r, cols);
      LW.push_back(bf16_weight(lw.back().data.data(), r, cols, lp.emplace_back()));
      be_->upload(LW.back());
    }
    float* xa = dev(rnd(g, size_t(T) * cols));
    float* xb = dev(rnd(g, size_t(T) * cols));
    const float* in[] = {xa, xa, xb, xb, xa};
    std::vector<GemmJob> lj;
    std::vector<std::vector<float>> solo;
    for (int i = 0; i < 5; ++i) {
      float* dy = poisoned(size_t(T) * rows[i]);
      be_->gemm(LW[size_t(i)], in[i], T, dy);
      solo.push_back(host(dy, size_t(T) * rows[i]));
      lj.push_back({&LW[size_t(i)], in[i], poisoned(size_t(T) * rows[i])});
    }
    be_->profile_begin();
    be_->gemm_batch(lj.data(), 5, T);
    double total = 0;
    uint64_t conversions = 0;
    for (const CudaOpTime& t : be_->profile_end(&total))
      if (t.name == "gemm (fast) activation conversion") conversions = t.launches;
    EXPECT_EQ(conversions, 3u) << "inputs a a b b a: one conversion a change of input";
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(0, std::memcmp(host(lj[size_t(i)].y, solo[size_t(i)].size()).data(), solo[size_t(i)].data(),
                               solo[size_t(i)].size() * 4))
          << "T=5 gemm_batch job " << i << " differs from gemm alone";
  }
  std::printf("[ cuda fast ] tensor-core gemv, 1/2/4/8 warps a tile: %d products, worst rel-L2 %.3g\n",
              worst.cases, worst.rel);
}

// gemm_mapped (an element-wise op and the product that reads it): in fast mode a one-token BF16
// GEMV maps its input as it loads it, one launch, y bit-identical to the element-wise op then gemm
// on the GPU, and the map's buffer x left untouched; within BF16 rounding of the CPU's two ops.
// Every map (SiLU-GLU, SiTU-GLU with b1 != b2, sigmoid gate), shapes with a partial last span
// (cols % 128 != 0), a column split (few rows) and one the GEMV declines (cols % 32 != 0: the
// two ops); T = 2 (no fused form): the two ops, x written. The fused form is opt-in
// (set_gemv_map) until it has been timed: without it gemm_mapped runs the two ops.
TEST_F(CudaFast, GemmMappedEqualsTheTwoOps) {
  std::mt19937 g(91);
  be_->set_gemv_map(true);
  struct Case {
    int rows, cols;
  };
  const Case cases[] = {{2304, 1024}, {7168, 3072}, {17, 96}, {513, 160}, {300, 8192}, {40, 12288}, {64, 48}};
  const InputMap::Kind kinds[] = {InputMap::Kind::SiluGlu, InputMap::Kind::SituGlu, InputMap::Kind::SigmoidGate};
  const char* names[] = {"SiLU-GLU", "SiTU-GLU", "sigmoid gate"};
  Worst worst;
  for (const Case& c : cases) {
    HostWeight hw(rnd(g, size_t(c.rows) * c.cols), c.rows, c.cols);
    std::vector<uint8_t> packed;
    const DenseWeight W = bf16_weight(hw.data.data(), c.rows, c.cols, packed);
    be_->upload(W);
    const bool fused = c.cols % 32 == 0;
    for (int k = 0; k < 3; ++k) {
      const std::string sh = std::string(names[k]) + " rows=" + std::to_string(c.rows) + " cols=" + std::to_string(c.cols);
      for (int T : {1, 2}) {
        const size_t n = size_t(T) * c.cols;
        const auto a = rnd(g, n, -6.f, 6.f), b = rnd(g, n, -6.f, 6.f);
        const InputMap hmap{kinds[k], b.data(), 2.5f, 1.5f};
        // CPU: the two ops (Backend's default).
        std::vector<float> cx(n), cy(size_t(T) * c.rows);
        cpu_.gemm_mapped(hw.w, a.data(), hmap, T, cx.data(), cy.data());
        // GPU: the two ops in turn, then the one op.
        float *da = dev(a), *db = dev(b), *dx2 = poisoned(n), *dy2 = poisoned(size_t(T) * c.rows);
        const InputMap dmap{kinds[k], db, 2.5f, 1.5f};
        if (kinds[k] == InputMap::Kind::SiluGlu) be_->silu_glu(da, db, T, c.cols, dx2);
        else if (kinds[k] == InputMap::Kind::SituGlu) be_->situ_glu(da, db, T, c.cols, 2.5f, 1.5f, dx2);
        else be_->copy(da, n, dx2), be_->sigmoid_gate(dx2, db, n);
        be_->gemm(W, dx2, T, dy2);
        float *dx = poisoned(n), *dy = poisoned(size_t(T) * c.rows);
        const uint64_t l0 = be_->stats().launches, m0 = be_->stats().mapped_gemvs;
        be_->gemm_mapped(W, da, dmap, T, dx, dy);
        const bool took = T == 1 && fused;
        EXPECT_EQ(be_->stats().mapped_gemvs - m0, took ? 1u : 0u) << sh << " T=" << T;
        if (took) {
          EXPECT_EQ(be_->stats().launches - l0, 1u) << sh << ": one launch";
        }
        const auto y = host(dy, size_t(T) * c.rows), y2 = host(dy2, size_t(T) * c.rows), x = host(dx, n);
        EXPECT_EQ(nan_count(y), 0u) << sh << " T=" << T;
        EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << sh << " T=" << T << ": differs from the two ops";
        if (took) {
          EXPECT_EQ(nan_count(x), n) << sh << ": x written by the fused form";
        } else {
          EXPECT_EQ(0, std::memcmp(x.data(), host(dx2, n).data(), n * 4)) << sh << " T=" << T << ": x";
        }
        const double r = test::rel_l2(y.data(), cy.data(), y.size());
        EXPECT_LE(r, c.rows < 16 ? 2e-2 : 6e-3) << sh << " T=" << T;
        worst.add(r);
      }
    }
  }
  // In place (x = a, as the MLA output gate runs): the declined T = 2 path gates a itself.
  {
    const int rows = 64, cols = 256, T = 2;
    HostWeight hw(rnd(g, size_t(rows) * cols), rows, cols);
    std::vector<uint8_t> packed;
    const DenseWeight W = bf16_weight(hw.data.data(), rows, cols, packed);
    be_->upload(W);
    auto a = rnd(g, size_t(T) * cols, -6.f, 6.f);
    const auto b = rnd(g, size_t(T) * cols, -6.f, 6.f);
    float *da = dev(a), *db = dev(b), *dy = poisoned(size_t(T) * rows);
    be_->gemm_mapped(W, da, InputMap{InputMap::Kind::SigmoidGate, db}, T, da, dy);
    std::vector<float> cy(size_t(T) * rows);
    cpu_.gemm_mapped(hw.w, a.data(), InputMap{InputMap::Kind::SigmoidGate, b.data()}, T, a.data(), cy.data());
    EXPECT_LE(test::rel_l2(host(da, a.size()).data(), a.data(), a.size()), 1e-6) << "gated in place";
    EXPECT_LE(test::rel_l2(host(dy, cy.size()).data(), cy.data(), cy.size()), 6e-3);
  }
  // Off (the default): the two ops.
  {
    be_->set_gemv_map(false);
    HostWeight hw(rnd(g, size_t(64) * 256), 64, 256);
    std::vector<uint8_t> packed;
    const DenseWeight W = bf16_weight(hw.data.data(), 64, 256, packed);
    be_->upload(W);
    float *da = dev(rnd(g, 256)), *db = dev(rnd(g, 256)), *dx = poisoned(256), *dy = poisoned(64);
    const uint64_t m0 = be_->stats().mapped_gemvs;
    be_->gemm_mapped(W, da, InputMap{InputMap::Kind::SiluGlu, db}, 1, dx, dy);
    EXPECT_EQ(be_->stats().mapped_gemvs, m0) << "off: no mapped GEMV";
    EXPECT_EQ(nan_count(host(dx, 256)), 0u) << "off: x written by the element-wise op";
  }
  std::printf("[ gemm_mapped ] worst rel L2 vs CPU %.2e over %d cases\n", worst.rel, worst.cases);
}

/// A random MXFP4 expert (scales near 2^0 so the products stay in range).
struct MxExpert {
  std::vector<uint8_t> b[6];
  ExpertRef e;
  MxExpert(std::mt19937& g, int io, int inter) {
    std::uniform_int_distribution<int> byte(0, 255), sc(118, 128);
    auto fill = [&](MxMatrix& m, int rows, int cols, std::vector<uint8_t>& pk, std::vector<uint8_t>& s) {
      m.rows = rows, m.cols = cols;
      pk.resize(size_t(rows) * cols / 2);
      for (auto& x : pk) x = uint8_t(byte(g));
      s.resize(size_t(rows) * cols / 32);
      for (auto& x : s) x = uint8_t(sc(g));
      m.packed = pk.data(), m.scale = s.data();
    };
    fill(e.w1, inter, io, b[0], b[1]);
    fill(e.w2, io, inter, b[2], b[3]);
    fill(e.w3, inter, io, b[4], b[5]);
    e.name = "test expert";
  }
};

/// A random dense expert (Kimi Linear layout: d1/d3 [inter, io], d2 [io, inter], f32).
struct DenseExpert {
  HostWeight w1, w2, w3;
  ExpertRef e;
  DenseExpert(std::mt19937& g, int io, int inter)
      : w1(rnd(g, size_t(inter) * io, -0.2f, 0.2f), inter, io), w2(rnd(g, size_t(io) * inter, -0.2f, 0.2f), io, inter),
        w3(rnd(g, size_t(inter) * io, -0.2f, 0.2f), inter, io) {
    e.d1 = w1.w, e.d2 = w2.w, e.d3 = w3.w;
    e.name = "dense test expert";
  }
};

/// The CPU's host-routed reference (forward.cpp's path): router_topk, × routed_scale, each
/// (token, slot) expert, weighted sum in slot order.
std::vector<float> cpu_routed(CpuBackend& cpu, const MoeWeights& mw, const RoutedMoeParams& p, bool dense,
                              const std::vector<float>& logits, const std::vector<float>& z, int T) {
  const int k = p.top_k, io = p.io;
  std::vector<int> ids(size_t(T) * k);
  std::vector<float> w(ids.size()), ys(ids.size() * io), out(size_t(T) * io);
  cpu.router_topk(logits.data(), mw.bias, T, p.n_experts, k, ids.data(), w.data());
  for (float& x : w) x *= p.routed_scale;
  for (size_t j = 0; j < ids.size(); ++j) {
    const ExpertRef& e = mw.experts[ids[j]];
    const float* zj = z.data() + (j / k) * io;
    if (!dense) {
      cpu.expert_ffn(e, zj, p.b1, p.b2, ys.data() + j * io);
      continue;
    }
    const int inter = int(e.d1.rows);
    std::vector<float> gg(inter), uu(inter), act(inter);
    cpu.gemm(e.d1, zj, 1, gg.data());
    cpu.gemm(e.d3, zj, 1, uu.data());
    if (p.act == Activation::SiLU) cpu.silu_glu(gg.data(), uu.data(), 1, inter, act.data());
    else cpu.situ_glu(gg.data(), uu.data(), 1, inter, p.b1, p.b2, act.data());
    cpu.gemm(e.d2, act.data(), 1, ys.data() + j * io);
  }
  for (int t = 0; t < T; ++t)
    cpu.weighted_sum(ys.data() + size_t(t) * k * io, w.data() + size_t(t) * k, k, io, out.data() + size_t(t) * io);
  return out;
}

// Grouped routed experts: MXFP4 (T >= 2) and dense (any T), many expert counts (up to 1500: past
// the sort kernel's thread count), top-k, widths
// (64-row tile edges: 63, 64, 65 pairs per expert), SiTU and SiLU; then the chunk rule (the first
// tokens of a large call equal a call on those tokens alone, bit for bit).
TEST_F(CudaFast, RoutedMoeGroupedMatchesCpu) {
  std::mt19937 g(32);
  struct Case {
    bool dense;
    int E, k, io, inter;
    float scale;
    bool silu;
  };
  const Case cases[] = {{false, 16, 4, 64, 32, 1.f, false},    {false, 33, 1, 96, 64, 2.5f, false},
                        {false, 64, 8, 256, 128, 2.827f, false}, {false, 8, 8, 512, 96, 1.f, false},
                        {false, 4, 2, 256, 1024, 0.5f, false},  {true, 16, 4, 64, 40, 1.f, true},
                        {true, 33, 8, 72, 96, 2.446f, true},     {true, 8, 2, 256, 64, 1.f, false},
                        {true, 64, 8, 128, 256, 1.f, true},
                        // the grouped MMA kernel: k-loops past its 4-stage ring (K 576 = 18 steps,
                        // 200 = 6.25: a partial step), partial 64/128-column tiles, 2 row tiles an expert
                        {true, 64, 8, 576, 200, 2.446f, true},   {true, 4, 2, 320, 136, 1.f, false},
                        // more experts than the sort kernel's 1024 threads: a thread places two
                        {true, 1500, 4, 64, 32, 1.f, true}};
  Worst mx, dn;
  for (const Case& c : cases)
    for (int T : {1, 2, 7, 33, 64, 130}) {
      if (!c.dense && T == 1) continue;  // MXFP4 T = 1 stays on the decode GEMV kernels
      std::vector<std::unique_ptr<MxExpert>> mxe;
      std::vector<std::unique_ptr<DenseExpert>> dne;
      MoeWeights mw;
      for (int e = 0; e < c.E; ++e) {
        if (c.dense) {
          dne.push_back(std::make_unique<DenseExpert>(g, c.io, c.inter));
          mw.experts.push_back(dne.back()->e);
        } else {
          mxe.push_back(std::make_unique<MxExpert>(g, c.io, c.inter));
          mw.experts.push_back(mxe.back()->e);
        }
      }
      HostWeight bias(rnd(g, c.E, -0.1f, 0.1f), 1, c.E);
      mw.bias = bias.w;
      be_->upload(bias.w);
      for (const ExpertRef& e : mw.experts) be_->upload(e);
      RoutedMoeParams p{3, c.E, c.k, c.io, c.scale, 4.f, 25.f};
      p.format = c.dense ? ExpertFormat::Dense : ExpertFormat::MXFP4;
      p.act = c.silu ? Activation::SiLU : Activation::SiTU;
      p.inter = c.inter;
      const std::string sh = std::string(c.dense ? "dense" : "mxfp4") + " E=" + std::to_string(c.E) + " k=" +
                             std::to_string(c.k) + " io=" + std::to_string(c.io) + " inter=" + std::to_string(c.inter) +
                             " T=" + std::to_string(T);
      const auto logits = rnd(g, size_t(T) * c.E, -4.f, 4.f);
      const auto z = rnd(g, size_t(T) * c.io, -2.f, 2.f);
      float* dys = poisoned(size_t(T) * c.k * c.io);
      float* dout = poisoned(size_t(T) * c.io);
      const uint64_t before = be_->stats().grouped_moe_calls;
      be_->routed_moe(p, mw, dev(logits), dev(z), T, work(dys, c.inter), dout);
      ASSERT_EQ(be_->fallbacks(), 0u) << sh << ": routed on the device, no fallback";
      EXPECT_EQ(be_->stats().grouped_moe_calls, before + 1) << sh << ": the grouped path ran";
      const auto got = host(dout, size_t(T) * c.io);
      const auto ref = cpu_routed(cpu_, mw, p, c.dense, logits, z, T);
      EXPECT_EQ(nan_count(got), 0u) << sh;
      const double r = test::rel_l2(got.data(), ref.data(), ref.size());
      EXPECT_LE(r, c.dense ? 6e-3 : 8e-3) << sh;  // MXFP4: wider dynamic range of the terms (seen 6.3e-3)
      (c.dense ? dn : mx).add(r);
      if (T >= 7) {
        const int h = c.dense ? T / 3 : std::max(2, T / 3);
        float* dys2 = poisoned(size_t(h) * c.k * c.io);
        float* dout2 = poisoned(size_t(h) * c.io);
        be_->routed_moe(p, mw, dev(std::vector<float>(logits.begin(), logits.begin() + size_t(h) * c.E)),
                        dev(std::vector<float>(z.begin(), z.begin() + size_t(h) * c.io)), h, work(dys2, c.inter), dout2);
        ASSERT_EQ(be_->fallbacks(), 0u) << sh;
        const auto part = host(dout2, size_t(h) * c.io);
        EXPECT_EQ(0, std::memcmp(part.data(), got.data(), part.size() * 4)) << sh << ": depends on the chunk";
      }
    }
  std::printf("[ cuda fast ] grouped routed experts: mxfp4 %d cases worst rel-L2 %.3g; dense %d cases worst %.3g\n",
              mx.cases, mx.rel, dn.cases, dn.rel);
}

// The routed MXFP4 experts of one decode token (T = 1) in fast mode (moe_decode.cu: e4m3 tensor-core
// GEMVs, weights moved into e4m3 in registers) against the CPU: widths past and inside the 128-column
// spans (io 64 … 8448, inter 32 … 1056; not all multiples of 128), top-1 … top-16, routed scales, many
// random routings; the profile shows the decode kernels ran (no grouped or exact-order launch), two
// runs of a call give the same bits, every form (the default's one persistent launch with its folded
// weighted sum, the two launches and their weighted-sum kernel, the rings) gives the same output
// bits, and exact mode keeps the CPU-order kernels (bit-for-bit path).
TEST_F(CudaFast, RoutedMoeMxfp4DecodeMatchesCpu) {
  std::mt19937 g(37);
  struct Case {
    int E, k, io, inter;
    float scale;
  };
  const Case cases[] = {{16, 4, 64, 32, 1.f},   {33, 1, 96, 64, 2.5f},     {64, 8, 256, 128, 2.827f},
                        {8, 8, 512, 96, 1.f},   {24, 16, 544, 288, 1.f},   {20, 6, 160, 1056, 0.5f},
                        {6, 2, 1024, 512, 1.f},  {4, 2, 8448, 64, 1.f},  // io past 8192: more than 48 KiB of staged token
                        {6, 4, 3584, 384, 2.827f},  // K3's latent width
                        {5, 3, 512, 3072, 1.f}};    // K3's expert width: 16-byte scale loads in both kernels
  Worst worst;
  be_->profile_begin();
  int calls = 0, form_calls = 0;
  for (const Case& c : cases) {
    std::vector<std::unique_ptr<MxExpert>> mxe;
    MoeWeights mw;
    for (int e = 0; e < c.E; ++e) {
      mxe.push_back(std::make_unique<MxExpert>(g, c.io, c.inter));
      if (c.io == 512)  // scales 2^-127 and 2^-126: the decoder's f32 branch (subnormal BF16 values)
        for (int m : {1, 3, 5})
          for (size_t i = 0; i < mxe.back()->b[m].size(); i += 7) mxe.back()->b[m][i] = uint8_t(i % 2);
      mw.experts.push_back(mxe.back()->e);
    }
    HostWeight bias(rnd(g, c.E, -0.1f, 0.1f), 1, c.E);
    mw.bias = bias.w;
    be_->upload(bias.w);
    for (const ExpertRef& e : mw.experts) be_->upload(e);
    RoutedMoeParams p{5, c.E, c.k, c.io, c.scale, 4.f, 25.f};
    p.format = ExpertFormat::MXFP4;
    p.inter = c.inter;
    for (int rep = 0; rep < 3; ++rep) {
      const std::string sh = "E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " io=" + std::to_string(c.io) +
                             " inter=" + std::to_string(c.inter) + " routing " + std::to_string(rep);
      const auto logits = rnd(g, size_t(c.E), -4.f, 4.f);
      const auto z = rnd(g, size_t(c.io), -2.f, 2.f);
      float* dys = poisoned(size_t(c.k) * c.io);
      float* dout = poisoned(size_t(c.io));
      float* dl = dev(logits);
      float* dz = dev(z);
      be_->routed_moe(p, mw, dl, dz, 1, work(dys, c.inter), dout);
      ASSERT_EQ(be_->fallbacks(), 0u) << sh;
      ++calls;
      const auto got = host(dout, size_t(c.io));
      const auto ref = cpu_routed(cpu_, mw, p, false, logits, z, 1);
      EXPECT_EQ(nan_count(got), 0u) << sh;
      const double r = test::rel_l2(got.data(), ref.data(), ref.size());
      // BF16 z and act, as the grouped MXFP4 path; the 8448-column sums of BF16-rounded z into
      // SiTU's saturating range measured 1.4e-2 once (run 27j), the other shapes <= 7.1e-3.
      EXPECT_LE(r, c.io > 4096 ? 2e-2 : 8e-3) << sh;
      worst.add(r);
      float* dout2 = poisoned(size_t(c.io));
      be_->set_decode_streams(rep % 2 == 0, rep % 2 ? 0 : 12);  // the same bits however launched
      be_->routed_moe(p, mw, dl, dz, 1, work(poisoned(size_t(c.k) * c.io), c.inter), dout2);
      const auto again = host(dout2, size_t(c.io));
      EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4)) << sh << ": not deterministic";
      be_->set_decode_streams(true, 0);
      for (int f = 1; f < CudaBackend::mx_decode_forms(); ++f) {  // every form: the same bits
        be_->set_mx_decode_form(f);
        float* dout4 = poisoned(size_t(c.io));
        be_->routed_moe(p, mw, dl, dz, 1, work(poisoned(size_t(c.k) * c.io), c.inter), dout4);
        ++form_calls;
        const auto form = host(dout4, size_t(c.io));
        EXPECT_EQ(0, std::memcmp(got.data(), form.data(), got.size() * 4)) << sh << ": form " << f << " differs";
      }
      be_->set_mx_decode_form(0);
      if (rep == 0) {  // exact mode: the CPU-order kernels, bit for bit with the CPU reference
        be_->set_precision(GpuPrecision::Exact);
        float* dout3 = poisoned(size_t(c.io));
        be_->routed_moe(p, mw, dl, dz, 1, work(poisoned(size_t(c.k) * c.io), c.inter), dout3);
        be_->set_precision(GpuPrecision::Fast);
        const auto exact = host(dout3, size_t(c.io));
        EXPECT_LE(test::rel_l2(exact.data(), ref.data(), ref.size()), 1e-6) << sh << ": exact mode";
      }
    }
  }
  double total = 0;
  uint64_t gate_up = 0, down = 0, experts = 0, exact_kernels = 0, grouped = 0;
  for (const CudaOpTime& t : be_->profile_end(&total)) {
    if (t.name == "routed_moe (fast) mxfp4 decode gate/up kernel") gate_up = t.launches;
    if (t.name == "routed_moe (fast) mxfp4 decode down kernel") down = t.launches;
    if (t.name == "routed_moe (fast) mxfp4 decode experts kernel") experts = t.launches;
    if (t.name == "routed_moe gate/up kernel") exact_kernels = t.launches;
    if (t.name.find("grouped") != std::string::npos) grouped += t.launches;
  }
  // Each fast T = 1 call: a gate/up and a down launch (forms m1-m12), or the one experts launch
  // (forms m0, m13-m18).
  EXPECT_EQ(gate_up + experts, uint64_t(2 * calls + form_calls)) << "every fast T = 1 call took the decode kernels";
  EXPECT_EQ(down, gate_up);
  EXPECT_GT(experts, 0u) << "the forms in one launch ran";
  EXPECT_EQ(exact_kernels, sizeof(cases) / sizeof(cases[0])) << "exact mode kept the CPU-order kernels";
  EXPECT_EQ(grouped, 0u);
  std::printf("[ cuda fast ] mxfp4 decode experts: %d calls, worst rel-L2 %.3g\n", worst.cases, worst.rel);
}

// The routed dense (BF16) experts of one decode token in fast mode (moe_decode.cu's kernels without
// the MXFP4 decode: Kimi Linear) against the CPU: widths inside and past the 128-column blocks up to
// the Kimi-Linear-48B sizes (io 2304, inter 1024), top-1 … top-8, SiLU and SiTU, several routings;
// the profile shows the decode kernels ran (no grouped launch), two runs give the same bits, the
// persistent form (set_dense_decode_form(1)) gives the two launches' bits, every
// warps-a-tile pair of set_dense_expert_warps matches the CPU too (in both forms, the same bits),
// and shapes the kernels cannot take (io or inter not a multiple of 32) still go to the grouped
// kernels.
TEST_F(CudaFast, RoutedMoeDenseDecodeMatchesCpu) {
  std::mt19937 g(41);
  struct Case {
    int E, k, io, inter;
    float scale;
    bool silu;
  };
  const Case cases[] = {{16, 4, 64, 32, 1.f, true},   {33, 1, 96, 64, 2.5f, false},  {12, 8, 256, 160, 2.446f, true},
                        {8, 3, 544, 288, 1.f, false}, {9, 8, 2304, 1024, 2.446f, true}, {4, 2, 72, 40, 1.f, true}};
  Worst worst;
  be_->profile_begin();
  int calls = 0, declined = 0, hooked = 0;  // hooked: calls under set_dense_expert_warps
  for (const Case& c : cases) {
    std::vector<std::unique_ptr<DenseExpert>> dne;
    MoeWeights mw;
    for (int e = 0; e < c.E; ++e) {
      dne.push_back(std::make_unique<DenseExpert>(g, c.io, c.inter));
      mw.experts.push_back(dne.back()->e);
    }
    HostWeight bias(rnd(g, c.E, -0.1f, 0.1f), 1, c.E);
    mw.bias = bias.w;
    be_->upload(bias.w);
    for (const ExpertRef& e : mw.experts) be_->upload(e);
    RoutedMoeParams p{5, c.E, c.k, c.io, c.scale, 4.f, 25.f};
    p.format = ExpertFormat::Dense;
    p.act = c.silu ? Activation::SiLU : Activation::SiTU;
    p.inter = c.inter;
    const bool takes = c.io % 32 == 0 && c.inter % 32 == 0;
    for (int rep = 0; rep < 3; ++rep) {
      const std::string sh = "E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " io=" + std::to_string(c.io) +
                             " inter=" + std::to_string(c.inter) + " routing " + std::to_string(rep);
      const auto logits = rnd(g, size_t(c.E), -4.f, 4.f);
      const auto z = rnd(g, size_t(c.io), -2.f, 2.f);
      float* dl = dev(logits);
      float* dz = dev(z);
      float* dout = poisoned(size_t(c.io));
      const CudaStats s0 = be_->stats();
      be_->routed_moe(p, mw, dl, dz, 1, work(poisoned(size_t(c.k) * c.io), c.inter), dout);
      ASSERT_EQ(be_->fallbacks(), 0u) << sh;
      const CudaStats s1 = be_->stats();
      (takes ? calls : declined) += 1;
      if (takes) {  // the decode kernels count the token's k expert visits and their bytes
        EXPECT_EQ(s1.device_expert_visits - s0.device_expert_visits, uint64_t(c.k)) << sh;
        EXPECT_EQ(s1.device_expert_bytes - s0.device_expert_bytes, uint64_t(c.k) * 3 * c.io * c.inter * 2) << sh;
      }
      const auto got = host(dout, size_t(c.io));
      const auto ref = cpu_routed(cpu_, mw, p, true, logits, z, 1);
      EXPECT_EQ(nan_count(got), 0u) << sh;
      const double r = test::rel_l2(got.data(), ref.data(), ref.size());
      EXPECT_LE(r, 6e-3) << sh;  // BF16 weights, z and act; f32 sums (the grouped dense bound)
      worst.add(r);
      float* dout2 = poisoned(size_t(c.io));
      be_->set_decode_streams(rep % 2 == 0, rep % 2 ? 0 : 12);  // the same bits however launched
      be_->routed_moe(p, mw, dl, dz, 1, work(poisoned(size_t(c.k) * c.io), c.inter), dout2);
      const auto again = host(dout2, size_t(c.io));
      EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4)) << sh << ": not deterministic";
      be_->set_decode_streams(true, 0);
      // Form 1 (gate/up, down and the weighted sum in one persistent launch): form 0's bits.
      auto other_form = [&](const std::vector<float>& want, const std::string& what) {
        be_->set_dense_decode_form(1);
        float* d = poisoned(size_t(c.io));
        be_->routed_moe(p, mw, dl, dz, 1, work(poisoned(size_t(c.k) * c.io), c.inter), d);
        be_->set_dense_decode_form(0);
        const auto one = host(d, size_t(c.io));
        EXPECT_EQ(0, std::memcmp(want.data(), one.data(), want.size() * 4)) << what << ": form 1 differs";
      };
      if (takes) other_form(got, sh);
      if (rep == 0 && takes) {  // the warps a tile of each kernel (set_dense_expert_warps), against the CPU
        std::vector<float> one;  // the 1/1 result: with 2+ column steps in both kernels, 2/2 sums in another order
        for (const auto& [gu, dn] : {std::pair{1, 1}, {2, 2}, {4, 4}, {8, 8}, {8, 1}, {1, 8}, {4, 2}}) {
          be_->set_dense_expert_warps(gu, dn);
          float* dout3 = poisoned(size_t(c.io));
          be_->routed_moe(p, mw, dl, dz, 1, work(poisoned(size_t(c.k) * c.io), c.inter), dout3);
          const auto w = host(dout3, size_t(c.io));
          const std::string wsh = sh + " warps a tile " + std::to_string(gu) + "/" + std::to_string(dn);
          EXPECT_EQ(nan_count(w), 0u) << wsh;
          const double rw = test::rel_l2(w.data(), ref.data(), ref.size());
          EXPECT_LE(rw, 6e-3) << wsh;
          worst.add(rw);
          other_form(w, wsh);
          hooked += 1;
          if (gu == 1 && dn == 1) one = w;
          if (gu == 2 && dn == 2 && c.io >= 512 && c.inter >= 512) {  // the hook took effect
            EXPECT_NE(0, std::memcmp(one.data(), w.data(), w.size() * 4)) << wsh << ": same bits as 1/1";
          }
        }
        be_->set_dense_expert_warps(0, 0);
      }
    }
  }
  double total = 0;
  uint64_t experts = 0, gate_up = 0, down = 0, grouped = 0;
  for (const CudaOpTime& t : be_->profile_end(&total)) {
    if (t.name == "routed_moe (fast) dense decode experts kernel") experts = t.launches;
    if (t.name == "routed_moe (fast) dense decode gate/up kernel") gate_up = t.launches;
    if (t.name == "routed_moe (fast) dense decode down kernel") down = t.launches;
    if (t.name.find("dense gate/up grouped") != std::string::npos) grouped += t.launches;
  }
  // Form 0 (two launches): each routing twice and each warps-a-tile pair once; form 1 (one
  // persistent launch): once each.
  EXPECT_EQ(gate_up, uint64_t(2 * calls + hooked)) << "every fast T = 1 call on a 32-multiple shape took the decode kernels";
  EXPECT_EQ(down, gate_up);
  EXPECT_EQ(experts, uint64_t(calls + hooked)) << "the persistent form ran";
  EXPECT_EQ(grouped, uint64_t(2 * declined)) << "the other shapes kept the grouped kernels";
  std::printf("[ cuda fast ] dense decode experts: %d calls (every warps-a-tile pair), worst rel-L2 %.3g (%d calls on the grouped kernels)\n",
              worst.cases, worst.rel, 2 * declined);
}

// Not a correctness test (its name keeps it out of the suite; run on the GPU machine): the decode
// weight streams of fast mode at K3 and Kimi-Linear sizes, graph-timed (one CUDA graph of R calls)
// over weights that do not fit the 50 MB L2, beside a 512 MB copy timed the same way in this run,
// launched ordinarily and as programmatic dependent launches with 0 and 2 lines a row asked of L2
// before the wait, the GEMV also with one warp to a tile (set_decode_streams): the BF16 tensor-core
// GEMV, a KDA layer's input projections as one gemm_batch and as one gemm each, the MXFP4
// experts of one token (K3: 16 of io 3584 × inter 3072, consecutive calls on disjoint experts) and
// the dense BF16 experts of one token (Kimi Linear: 8 of 2304 × 1024); then one profiled call of
// each MoE at the default distance (where its time goes, launch by launch).
TEST_F(CudaFast, DecodeWeightStreamsSpeedVsCopy) {
  std::mt19937 g(53);
  const double copy = be_->copy_bandwidth();  // bytes/s, read + written, 512 MB each way
  std::printf("[ decode streams ] copy kernel 512 MB -> 512 MB: %.0f GB/s (read + written)\n", copy / 1e9);
  struct Variant {
    bool pdl;
    int lines, wt;
    const char* name;
    int form = 0;
    int dense_gu = 0, dense_dn = 0;  ///< set_dense_expert_warps
    int mx = 0;                      ///< set_mx_decode_form
    int dense_form = 0;              ///< set_dense_decode_form
  };
  // GEMV: also with a warp to a 16-row tile (the default is 8, a tile a block) and in its other
  // forms (gemv_tc.cu kForms: f1 the default kernel split for 2 blocks an SM, f2 3 blocks an SM
  // and a span a step split for 3, f3 4 and 1 split for 4, f4 and f5 the kernels of f2 and f3
  // split for 1 block an SM, f6 the default kernel never split, f7 and f8 the kernels of f1 and f3
  // split into as many blocks a tile as fit in one wave of 2 or 4 blocks an SM, f9 the default
  // kernel split for a block an SM for every matrix of fewer tiles than SMs (the default of runs
  // 35-36; f0 splits only below 32 tiles), f10 the same below 64 tiles).
  std::vector<Variant> gemv_variants = {{false, 0, 0, "plain"}, {true, 0, 0, "pdl"}, {true, 0, 1, "pdl 1w"}, {true, 2, 0, "pdl+2"}};
  static const char* kFormNames[] = {"f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "f10", "f11"};
  ASSERT_LE(CudaBackend::gemv_forms(), int(std::size(kFormNames)));
  for (int form = 1; form < CudaBackend::gemv_forms(); ++form) gemv_variants.push_back({true, 0, 0, kFormNames[form], form});
  // With 4 lines of each row asked of L2 before the wait: the default and the 64-register form f5,
  // whose blocks leave room for the next launch's to start early.
  gemv_variants.push_back({true, 4, 0, "f0+4", 0}), gemv_variants.push_back({true, 4, 0, "f5+4", 5});
  // MXFP4 experts: also every other form (moe_decode.cu kMxForms: m0, the default, gate/up, down
  // and the weighted sum in one persistent launch, the last slot's down tiles as half-size units
  // (run 46); m1-m12 a launch each: m1 16-byte scale loads for 2 blocks an SM, m2 / m3 with L2
  // asks 1 / 2 steps ahead, m4 / m5 4 blocks an SM (0 / 1 ahead), m6-m8 3 blocks an SM (0, 1, 2
  // ahead), m9 byte scale loads for 3 blocks an SM, m10 / m11 the code and scale bytes through a
  // cp.async ring of 3 / 2 stages a warp, m12 the default of runs 28-43; m13 / m14 m0 with rings
  // of 2 / 3 stages, m15 m0 for 3 blocks an SM; m17 m0 with whole down tiles only (runs 44-45's
  // default), m16 / m18 with half-size units for the last 2 / 4 slots).
  std::vector<Variant> moe_variants = {{false, 0, 0, "plain"}, {true, 0, 0, "pdl"}, {true, 2, 0, "pdl+2"}};
  static const char* kMxNames[] = {"m0",  "m1",  "m2",  "m3",  "m4",  "m5",  "m6",  "m7",  "m8",  "m9",
                                   "m10", "m11", "m12", "m13", "m14", "m15", "m16", "m17", "m18"};
  ASSERT_LE(CudaBackend::mx_decode_forms(), int(std::size(kMxNames)));
  for (int f = 1; f < CudaBackend::mx_decode_forms(); ++f) moe_variants.push_back({true, 0, 0, kMxNames[f], 0, 0, 0, f});
  auto report = [&](const std::string& what, double bytes, const std::function<double()>& timed,
                    const std::vector<Variant>& variants) {
    std::string line = "[ decode streams ] " + what + ":";
    for (const auto& v : variants) {
      be_->set_decode_streams(v.pdl, v.lines, v.wt, v.form);
      be_->set_dense_expert_warps(v.dense_gu, v.dense_dn);
      be_->set_mx_decode_form(v.mx);
      be_->set_dense_decode_form(v.dense_form);
      const double t = timed();
      char buf[96];
      std::snprintf(buf, sizeof buf, "  %s %7.2f us %5.0f GB/s %3.0f%%", v.name, t * 1e6, bytes / t / 1e9, 100 * bytes / t / copy);
      line += buf;
    }
    std::printf("%s\n", line.c_str());
    be_->set_decode_streams(true, 0);
    be_->set_dense_expert_warps(0, 0);
    be_->set_mx_decode_form(0);
    be_->set_dense_decode_form(0);
  };
  struct Shape {
    const char* name;
    int rows, cols;
  };
  const Shape shapes[] = {{"K3", 3584, 7168}, {"K3", 6144, 7168},  {"K3", 12288, 7168}, {"K3", 7168, 12288},
                          {"K3", 896, 7168},  {"K3", 128, 7168},   {"KL", 4096, 2304},  {"KL", 2304, 4096},
                          {"KL", 256, 2304},  {"KL", 32, 2304},    {"KL lm_head", 163840, 2304}};
  for (const Shape& sh : shapes) {
    const double bytes = 2.0 * sh.rows * sh.cols;
    const int R = std::max(2, int(std::ceil(150e6 / bytes)));
    const auto src = rnd(g, size_t(sh.rows) * sh.cols);
    std::vector<uint8_t> first(static_cast<size_t>(bytes));
    quantize_matrix(src.data(), sh.rows, sh.cols, WFormat::BF16, first.data(), nullptr);
    std::vector<std::vector<uint8_t>> copies(R, first);  // distinct host bytes: distinct device copies
    std::vector<DenseWeight> ws(R);
    for (int i = 0; i < R; ++i) {
      ws[i].rows = size_t(sh.rows), ws[i].cols = size_t(sh.cols);
      ws[i].format = WFormat::BF16, ws[i].dtype = DType::BF16, ws[i].data = copies[i].data();
      be_->upload(ws[i]);
    }
    float* dx = dev(rnd(g, size_t(sh.cols)));
    float* dy = be_->alloc(size_t(sh.rows));
    const uint64_t tc0 = be_->stats().tc_gemvs;
    char name[64];
    std::snprintf(name, sizeof name, "%s bf16 gemv %5d x %5d (%d copies)", sh.name, sh.rows, sh.cols, R);
    report(name, bytes, [&] { return be_->time_recorded([&](int i) { be_->gemm(ws[i], dx, 1, dy); }, R, 10); },
           gemv_variants);
    EXPECT_GT(be_->stats().tc_gemvs, tc0) << name << ": the tensor-core GEMV ran";
    be_->release(dy);
  }
  // The projections of a KDA layer's normed input (model/forward.cpp kda_layer): one gemm_batch
  // (one launch) against one gemm each, graph-timed over distinct copies.
  auto projections = [&](const char* what, const std::vector<std::pair<int, int>>& mats) {
    double bytes = 0;
    int cols = mats[0].second;
    for (const auto& [r, c] : mats) bytes += 2.0 * r * c;
    const int R = std::max(2, int(std::ceil(300e6 / bytes)));
    std::vector<std::vector<uint8_t>> store;
    std::vector<DenseWeight> ws;
    store.reserve(size_t(R) * mats.size()), ws.reserve(size_t(R) * mats.size());
    for (int i = 0; i < R; ++i)
      for (const auto& [r, c] : mats) {
        const auto src = rnd(g, size_t(r) * c);
        ws.push_back(bf16_weight(src.data(), r, c, store.emplace_back()));
        be_->upload(ws.back());
      }
    float* dx = dev(rnd(g, size_t(cols)));
    std::vector<float*> ys;
    for (const auto& rc : mats) ys.push_back(be_->alloc(size_t(rc.first)));
    const size_t M = mats.size();
    std::vector<GemmJob> jobs(M);
    report(std::string(what) + " one gemm each", bytes, [&] {
      return be_->time_recorded([&](int i) { for (size_t j = 0; j < M; ++j) be_->gemm(ws[size_t(i) * M + j], dx, 1, ys[j]); }, R, 10);
    }, gemv_variants);
    report(std::string(what) + " one gemm_batch", bytes, [&] {
      return be_->time_recorded([&](int i) {
        for (size_t j = 0; j < M; ++j) jobs[j] = {&ws[size_t(i) * M + j], dx, ys[j]};
        be_->gemm_batch(jobs.data(), int(M), 1);
      }, R, 10);
    }, gemv_variants);
    for (float* y : ys) be_->release(y);
  };
  projections("KL KDA q,k,v,f_a,b,g_a (3 x 4096 x 2304, 128, 32, 128)",
              {{4096, 2304}, {4096, 2304}, {4096, 2304}, {128, 2304}, {32, 2304}, {128, 2304}});
  projections("K3 KDA q,k,v,f_a,b,g (4 x 12288 x 7168, 128, 96)",
              {{12288, 7168}, {12288, 7168}, {12288, 7168}, {128, 7168}, {96, 7168}, {12288, 7168}});
  projections("KL MoE router, shared gate, up (256, 2 x 1024 x 2304)", {{256, 2304}, {1024, 2304}, {1024, 2304}});
  // Dense experts: also every warps-a-tile pair of interest for the gate/up and down kernels.
  const std::vector<Variant> dense_variants = {
      {false, 0, 0, "plain"},     {true, 0, 0, "pdl"},        {true, 2, 0, "pdl+2"},      {true, 0, 0, "1/1", 0, 1, 1},
      {true, 0, 0, "2/1", 0, 2, 1}, {true, 0, 0, "4/1", 0, 4, 1}, {true, 0, 0, "8/1", 0, 8, 1}, {true, 0, 0, "4/2", 0, 4, 2},
      {true, 0, 0, "4/4", 0, 4, 4}, {true, 0, 0, "2/2", 0, 2, 2}, {true, 0, 0, "one", 0, 0, 0, 0, 1},
      {true, 0, 0, "one 4/1", 0, 4, 1, 0, 1}};
  auto moe = [&](const std::string& what, bool mx, int E, int k, int io, int inter, std::vector<ExpertRef> experts) {
    MoeWeights mw;
    mw.experts = std::move(experts);
    HostWeight bias(std::vector<float>(size_t(E), 0.f), 1, E);
    mw.bias = bias.w;
    be_->upload(bias.w);
    for (const ExpertRef& e : mw.experts) be_->upload(e);
    RoutedMoeParams p{5, E, k, io, 2.827f, 4.f, 25.f};
    p.format = mx ? ExpertFormat::MXFP4 : ExpertFormat::Dense;
    p.act = mx ? Activation::SiTU : Activation::SiLU;
    p.inter = inter;
    const int sets = E / k;  // call i routes to experts (i % sets)·k … + k − 1: no weight read twice in a row
    std::vector<float*> logits;
    for (int s = 0; s < sets; ++s) {
      std::vector<float> l(size_t(E), -4.f);
      for (int j = 0; j < k; ++j) l[size_t(s * k + j)] = 12.f + 0.01f * j;
      logits.push_back(dev(l));
    }
    float* dz = dev(rnd(g, size_t(io), -2.f, 2.f));
    float* dys = be_->alloc(size_t(k) * io);
    float* dout = be_->alloc(size_t(io));
    const RoutedMoeWork ws = work(dys, inter);
    const double bytes = double(k) * (mx ? 3.0 * (double(io) * inter / 2 + double(io) * inter / 32) : 6.0 * io * inter);
    const int R = 2 * sets;
    for (float* l : logits) be_->routed_moe(p, mw, l, dz, 1, ws, dout);  // tables built before any recording
    report(what, bytes, [&] {
      return be_->time_recorded([&](int i) { be_->routed_moe(p, mw, logits[size_t(i % sets)], dz, 1, ws, dout); }, R, 10);
    }, mx ? moe_variants : dense_variants);
    ASSERT_EQ(be_->fallbacks(), 0u) << what;
    for (int f = 0; f < (mx ? CudaBackend::mx_decode_forms() : CudaBackend::dense_decode_forms()); ++f) {  // each form's kernels
      if (mx) be_->set_mx_decode_form(f);
      else be_->set_dense_decode_form(f);
      be_->profile_begin();
      be_->routed_moe(p, mw, logits[0], dz, 1, ws, dout);
      double total = 0;
      for (const CudaOpTime& t : be_->profile_end(&total))
        std::printf("[ decode streams ]   %s profiled %s%d: %-52s %8.1f us\n", what.c_str(), mx ? "m" : "d", f,
                    t.name.c_str(), t.ms * 1e3);
    }
    be_->set_mx_decode_form(0);
    be_->set_dense_decode_form(0);
    be_->release(dys);
    be_->release(dout);
  };
  {
    std::vector<std::unique_ptr<MxExpert>> mxe;
    std::vector<ExpertRef> refs;
    for (int e = 0; e < 32; ++e) refs.push_back(mxe.emplace_back(std::make_unique<MxExpert>(g, 3584, 3072))->e);
    moe("K3 mxfp4 experts, 16 of 3584 x 3072", true, 32, 16, 3584, 3072, refs);
  }
  {
    std::vector<std::unique_ptr<DenseExpert>> dne;
    std::vector<ExpertRef> refs;
    for (int e = 0; e < 24; ++e) refs.push_back(dne.emplace_back(std::make_unique<DenseExpert>(g, 2304, 1024))->e);
    moe("KL dense experts, 8 of 2304 x 1024", false, 24, 8, 2304, 1024, refs);
  }
}

// The grouped products on Hopper warpgroup MMA (moe_wgmma.cu; on a compute capability 9.0 device
// they must be the ones that run): dense and MXFP4 experts against the CPU with routings chosen
// to give experts 0, 1, 63-65, 127-129 and 300 rows (one token's slot can pin an expert: logits of
// +12 beat the random ones in [-4, 4]), K not a multiple of the 64-column k-step (a partial last
// step; MXFP4: half a step), N past the 128/256-column blocks, SiTU and SiLU, T = 1 (dense) and
// awkward token counts; each call against the first tokens alone, bit for bit (chunk rule).
TEST_F(CudaFast, RoutedMoeWgmmaTilesMatchCpu) {
  std::mt19937 g(36);
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  const bool hopper = major == 9 && minor == 0;
  struct Case {
    bool dense;
    int E, k, io, inter;
    bool silu;
    int pin;  ///< 0: random routing; 1: slot 0 -> expert 0 for every token, slot 1 skewed (see below)
    std::vector<int> Ts;
  };
  const Case cases[] = {
      {true, 16, 2, 256, 192, true, 1, {300, 129, 65}},
      {true, 8, 2, 520, 264, false, 0, {1, 3, 64, 65, 257}},
      {true, 16, 4, 768, 384, true, 0, {160}},
      {true, 4, 1, 64, 8, true, 1, {127, 128, 2}},
      {false, 16, 2, 256, 192, false, 1, {300, 129}},
      {false, 8, 2, 544, 288, false, 0, {2, 65, 257}},
      {false, 16, 4, 768, 384, false, 0, {160}},
  };
  Worst mx, dn;
  uint64_t wg_launches = 0, calls = 0;
  for (const Case& c : cases) {
    std::vector<std::unique_ptr<MxExpert>> mxe;
    std::vector<std::unique_ptr<DenseExpert>> dne;
    MoeWeights mw;
    for (int e = 0; e < c.E; ++e) {
      if (c.dense) {
        dne.push_back(std::make_unique<DenseExpert>(g, c.io, c.inter));
        mw.experts.push_back(dne.back()->e);
      } else {
        mxe.push_back(std::make_unique<MxExpert>(g, c.io, c.inter));
        mw.experts.push_back(mxe.back()->e);
      }
    }
    HostWeight bias(rnd(g, c.E, -0.1f, 0.1f), 1, c.E);
    mw.bias = bias.w;
    be_->upload(bias.w);
    for (const ExpertRef& e : mw.experts) be_->upload(e);
    RoutedMoeParams p{5, c.E, c.k, c.io, 2.446f, 4.f, 25.f};
    p.format = c.dense ? ExpertFormat::Dense : ExpertFormat::MXFP4;
    p.act = c.silu ? Activation::SiLU : Activation::SiTU;
    p.inter = c.inter;
    for (int T : c.Ts) {
      const std::string sh = std::string(c.dense ? "dense" : "mxfp4") + " E=" + std::to_string(c.E) + " k=" +
                             std::to_string(c.k) + " io=" + std::to_string(c.io) + " inter=" + std::to_string(c.inter) +
                             " pin=" + std::to_string(c.pin) + " T=" + std::to_string(T);
      auto logits = rnd(g, size_t(T) * c.E, -4.f, 4.f);
      if (c.pin)
        for (int t = 0; t < T; ++t) {
          logits[size_t(t) * c.E] = 12.f;  // every token: expert 0 (T rows)
          if (c.k < 2) continue;
          // slot 1: expert 2 for token 5 only (1 row), expert 1 for odd tokens, 3 + t % 5 else;
          // experts past 7 get none from this slot.
          const int e1 = t == 5 ? 2 : (t % 2 ? 1 : 3 + t % 5);
          logits[size_t(t) * c.E + (e1 % c.E)] = 11.f;
        }
      const auto z = rnd(g, size_t(T) * c.io, -2.f, 2.f);
      float* dout = poisoned(size_t(T) * c.io);
      const uint64_t before = be_->stats().grouped_moe_calls;
      be_->profile_begin();
      be_->routed_moe(p, mw, dev(logits), dev(z), T, work(poisoned(size_t(T) * c.k * c.io), c.inter), dout);
      double total = 0;
      for (const CudaOpTime& t : be_->profile_end(&total))
        if (t.name.find("grouped wgmma") != std::string::npos) wg_launches += t.launches;
      ASSERT_EQ(be_->fallbacks(), 0u) << sh;
      if (!c.dense && T == 1) continue;
      EXPECT_EQ(be_->stats().grouped_moe_calls, before + 1) << sh << ": the grouped path ran";
      ++calls;
      const auto got = host(dout, size_t(T) * c.io);
      const auto ref = cpu_routed(cpu_, mw, p, c.dense, logits, z, T);
      EXPECT_EQ(nan_count(got), 0u) << sh;
      const double r = test::rel_l2(got.data(), ref.data(), ref.size());
      EXPECT_LE(r, c.dense ? 6e-3 : 8e-3) << sh;
      (c.dense ? dn : mx).add(r);
      if (T >= 3) {  // chunk rule
        const int h = std::max(2, T / 3);
        float* dout2 = poisoned(size_t(h) * c.io);
        be_->routed_moe(p, mw, dev(std::vector<float>(logits.begin(), logits.begin() + size_t(h) * c.E)),
                        dev(std::vector<float>(z.begin(), z.begin() + size_t(h) * c.io)), h,
                        work(poisoned(size_t(h) * c.k * c.io), c.inter), dout2);
        const auto part = host(dout2, size_t(h) * c.io);
        EXPECT_EQ(0, std::memcmp(part.data(), got.data(), part.size() * 4)) << sh << ": depends on the chunk";
      }
    }
  }
  std::printf("[ cuda fast ] grouped experts (%s): %llu calls, %llu wgmma launches; mxfp4 %d cases worst rel-L2 %.3g; "
              "dense %d cases worst %.3g\n",
              hopper ? "compute capability 9.0" : "not sm_90", (unsigned long long)calls,
              (unsigned long long)wg_launches, mx.cases, mx.rel, dn.cases, dn.rel);
  if (hopper) {
    EXPECT_EQ(wg_launches, 2 * calls) << "the sm_90a kernels ran for every grouped call";
  }
}

// Per-launch profiling (bench prefill --profile): the span's labels name the launches made in it,
// with counts, and the outputs are those of an unprofiled call (events only, same kernels).
TEST_F(CudaFast, ProfileNamesTheLaunchesAndChangesNothing) {
  std::mt19937 g(35);
  HostWeight w(rnd(g, size_t(256) * 512), 256, 512);
  be_->upload(w.w);
  const auto x = rnd(g, size_t(40) * 512);
  float* dx = dev(x);
  float* dy = poisoned(size_t(40) * 256);
  be_->gemm(w.w, dx, 40, dy);
  const auto plain = host(dy, size_t(40) * 256);
  be_->profile_begin();
  for (int i = 0; i < 3; ++i) be_->gemm(w.w, dx, 40, dy);
  double total = 0;
  const std::vector<CudaOpTime> prof = be_->profile_end(&total);
  EXPECT_GT(total, 0.0);
  uint64_t gemms = 0, conversions = 0;
  double sum = 0;
  for (const CudaOpTime& t : prof) {
    if (t.name == "gemm (fast, cuBLASLt) 256x512") gemms = t.launches;
    if (t.name == "gemm (fast) activation conversion") conversions = t.launches;
    sum += t.ms;
  }
  EXPECT_EQ(gemms, 3u);
  EXPECT_EQ(conversions, 3u);
  EXPECT_NEAR(sum, total, 1e-6 * std::max(1.0, total));
  const auto again = host(dy, size_t(40) * 256);
  EXPECT_EQ(0, std::memcmp(plain.data(), again.data(), plain.size() * 4));
  double none = -1;
  EXPECT_TRUE(be_->profile_end(&none).empty()) << "a second end without a begin reports nothing";
}

// Exact mode keeps routing dense experts on the host (a counted fallback) and keeps the MXFP4
// per-pair kernels: the new paths are fast-mode only.
TEST_F(CudaFast, ExactModeDoesNotUseTheFastPaths) {
  std::mt19937 g(33);
  be_->set_precision(GpuPrecision::Exact);
  DenseExpert d(g, 64, 32);
  MoeWeights mw;
  mw.experts = {d.e, d.e};
  HostWeight bias(rnd(g, 2, -0.1f, 0.1f), 1, 2);
  mw.bias = bias.w;
  be_->upload(bias.w);
  be_->upload(d.e);
  RoutedMoeParams p{0, 2, 1, 64, 1.f, 4.f, 25.f};
  p.format = ExpertFormat::Dense, p.act = Activation::SiLU, p.inter = 32;
  be_->routed_moe(p, mw, dev(rnd(g, 4)), dev(rnd(g, 128)), 2, work(poisoned(128), 32), poisoned(128));
  EXPECT_EQ(be_->fallbacks(), 1u) << "exact mode: dense experts routed on the host";
  EXPECT_EQ(be_->stats().host_routed_moe_calls, 1u);
  HostWeight w(rnd(g, 64 * 64), 64, 64);
  be_->upload(w.w);
  be_->gemm(w.w, dev(rnd(g, 64 * 8)), 8, poisoned(64 * 8));
  EXPECT_EQ(be_->stats().lt_gemms, 0u);
  EXPECT_EQ(be_->stats().grouped_moe_calls, 0u);
}

// MLA prefill attention on tensor cores (mla_fast.cu) against the CPU across calls (prefill, then
// more prefill chunks and decode steps on the grown cache; the cache is poisoned beyond its
// length): the flash kernel's two instances (heads up to 64 / 64 and up to 192 / 128, with padded
// columns: nope + extra = 24, 48, 56, 72, 96, 192; v = 16 … 128; on Hopper the larger heads take
// the warpgroup-MMA kernel, mla_wgmma.cu, and the test checks that it ran), several heads (up to 8), T = 2 … 700
// with T and the cache length off the 128-query / 64-key tiles, the materialized path (nope + extra
// 208 > 192) and an unaligned shape that falls back to the exact kernel (T = 1 is the exact kernel
// too). ctx rel-L2 <= 1e-2 (BF16 operands and probabilities); the f32 cache stays exact (1e-6).
// The profile shows which path ran. The chunk rule, bit for bit: one 200-token call equals 77 + 123
// tokens, and rows 1.. of 1 + 199 (the first token then takes the decode kernel).
TEST_F(CudaFast, MlaPrefillMatchesCpu) {
  std::mt19937 g(35);
  struct Case {
    int H, nope, extra, v, lora;
    std::vector<int> Ts;
  };
  const std::vector<Case> cases = {{1, 16, 8, 16, 32, {2, 1, 7}},         {4, 32, 16, 32, 32, {33, 1, 64, 2}},
                                   {3, 16, 8, 24, 24, {130, 5}},          {2, 33, 5, 7, 40, {9, 4}},
                                   {4, 128, 64, 128, 512, {300, 1, 17}},  {2, 16, 8, 16, 32, {257}},
                                   {2, 40, 16, 48, 40, {70, 129}},        {3, 64, 32, 96, 64, {150, 3, 66}},
                                   {8, 128, 64, 128, 512, {700, 129}},   {2, 128, 80, 136, 64, {90, 40}},
                                   {2, 40, 32, 72, 48, {260, 131}}};
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  const bool hopper = major == 9 && minor == 0;
  Worst worst;
  be_->profile_begin();
  for (const Case& c : cases) {
    MlaParams p{c.H, c.nope, c.extra, c.v, c.lora, 1e-6f};
    const int W = c.lora + c.extra, qh = c.nope + c.extra;
    int cap = 0;
    for (int T : c.Ts) cap += T;
    HostWeight kvb(rnd(g, size_t(c.H) * (c.nope + c.v) * c.lora, -0.3f, 0.3f), c.H * (c.nope + c.v), c.lora);
    HostWeight norm(rnd(g, c.lora, 0.5f, 1.5f), 1, c.lora);
    MlaWeights w;
    w.kv_b = kvb.w, w.kv_a_norm = norm.w;
    be_->upload(kvb.w);
    be_->upload(norm.w);
    std::vector<float> hcache(size_t(cap) * W, 0.f);
    MlaCache hc{hcache.data(), 0, cap};
    MlaCache dc{poisoned(size_t(cap) * W), 0, cap};
    for (const int T : c.Ts) {
      const auto q = rnd(g, size_t(T) * c.H * qh), ckv = rnd(g, size_t(T) * W, -2.f, 2.f);
      float* dctx = poisoned(size_t(T) * c.H * c.v);
      be_->mla_attend(p, w, dc, dev(q), dev(ckv), T, dctx);
      std::vector<float> ref(size_t(T) * c.H * c.v);
      cpu_.mla_attend(p, w, hc, q.data(), ckv.data(), T, ref.data());
      const auto got = host(dctx, ref.size());
      const std::string sh = "H=" + std::to_string(c.H) + " nope=" + std::to_string(c.nope) + " extra=" +
                             std::to_string(c.extra) + " v=" + std::to_string(c.v) + " kv_lora=" + std::to_string(c.lora) +
                             " T=" + std::to_string(T) + " pos=" + std::to_string(hc.length - T);
      EXPECT_EQ(nan_count(got), 0u) << sh;
      const double r = test::rel_l2(got.data(), ref.data(), ref.size());
      EXPECT_LE(r, 1e-2) << sh;
      worst.add(r);
      const auto cache = host(dc.kv, size_t(hc.length) * W);
      EXPECT_LE(test::rel_l2(cache.data(), hcache.data(), cache.size()), 1e-6) << sh;
    }
  }
  double total = 0;
  uint64_t flash = 0, wg = 0, softmax = 0;
  for (const CudaOpTime& t : be_->profile_end(&total)) {
    if (t.name.rfind("mla (fast) flash attention kernel", 0) == 0) flash += t.launches;
    if (t.name == "mla (fast) flash attention kernel (wgmma)") wg = t.launches;
    if (t.name == "mla (fast) causal softmax kernel") softmax = t.launches;
  }
  EXPECT_GE(flash, 17u) << "the flash kernel ran for every aligned T >= 2 call with heads <= 192 / 128";
  if (hopper) {
    EXPECT_GE(wg, 9u) << "on sm_90 the heads past 64 / 64 take the warpgroup-MMA kernel (mla_wgmma.cu)";
  }
  EXPECT_GE(softmax, 2u) << "nope + extra = 208 takes the materialized path";
  // Chunk rule.
  for (const Case& c : {Case{4, 128, 64, 128, 512, {}}, Case{3, 16, 8, 24, 24, {}}}) {
    MlaParams p{c.H, c.nope, c.extra, c.v, c.lora, 1e-6f};
    const int W = c.lora + c.extra, qh = c.nope + c.extra, T = 200, row = c.H * c.v;
    HostWeight kvb(rnd(g, size_t(c.H) * (c.nope + c.v) * c.lora, -0.3f, 0.3f), c.H * (c.nope + c.v), c.lora);
    HostWeight norm(rnd(g, c.lora, 0.5f, 1.5f), 1, c.lora);
    MlaWeights w;
    w.kv_b = kvb.w, w.kv_a_norm = norm.w;
    be_->upload(kvb.w);
    be_->upload(norm.w);
    const auto q = rnd(g, size_t(T) * c.H * qh), ckv = rnd(g, size_t(T) * W, -2.f, 2.f);
    float* dq = dev(q);
    float* dkv = dev(ckv);
    auto run = [&](int first) {
      MlaCache dc{poisoned(size_t(T) * W), 0, T};
      float* dctx = poisoned(size_t(T) * row);
      be_->mla_attend(p, w, dc, dq, dkv, first, dctx);
      be_->mla_attend(p, w, dc, dq + size_t(first) * c.H * qh, dkv + size_t(first) * W, T - first,
                      dctx + size_t(first) * row);
      return host(dctx, size_t(T) * row);
    };
    const auto whole = run(0);  // a 0-token call, then all 200
    const auto split = run(77);
    const auto one = run(1);
    EXPECT_EQ(0, std::memcmp(whole.data(), split.data(), whole.size() * 4)) << "H=" << c.H << ": 77 + 123 != 200";
    EXPECT_EQ(0, std::memcmp(whole.data() + row, one.data() + row, (whole.size() - row) * 4))
        << "H=" << c.H << ": rows 1.. of 1 + 199 != 200";
  }
  std::printf("[ cuda fast ] mla prefill: %d calls (%llu flash launches, %llu on wgmma), worst ctx rel-L2 %.3g\n",
              worst.cases, (unsigned long long)flash, (unsigned long long)wg, worst.rel);
}

// MLA decode (mla_decode.cu: T = 1 in fast mode, the absorbed form with the BF16 kv_b, a block a
// head or a position split and a merge kernel when the context is long) against the CPU, token by
// token after a prefill: 9 shapes (1 to 64 heads, kv_lora 24 to 512, extra 4 to 64, nope and v not
// multiples of 8), contexts from 1 to 2000 positions (1 to 8 splits), kv_b BF16 (the CPU reads the
// same values: bound 1e-4) and f32 (the GPU rounds it to BF16: bound 1e-2), random non-zero inputs,
// poisoned outputs and cache. The cache row the kernel writes equals the CPU's (1e-6). One shape
// the kernel declines (extra % 4 != 0) takes the exact kernel and must match too. Profile labels
// show the decode and merge kernels ran.
TEST_F(CudaFast, MlaDecodeMatchesCpu) {
  std::mt19937 g(36);
  struct Case {
    int H, nope, extra, v, lora, prompt, steps;
  };
  const std::vector<Case> cases = {{1, 16, 8, 16, 32, 0, 5},       {4, 32, 16, 32, 32, 300, 3},
                                   {3, 16, 8, 24, 24, 7, 4},       {2, 33, 4, 7, 40, 260, 3},
                                   {4, 128, 64, 128, 512, 600, 3}, {8, 128, 64, 128, 512, 2000, 2},
                                   {64, 128, 64, 128, 512, 700, 2}, {32, 128, 64, 128, 512, 70, 3},
                                   {2, 40, 16, 48, 40, 255, 4},    {2, 16, 6, 16, 32, 20, 2}};
  Worst worst_bf16, worst_f32;
  be_->profile_begin();
  for (const Case& c : cases) {
    for (const bool bf16 : {true, false}) {
      MlaParams p{c.H, c.nope, c.extra, c.v, c.lora, 1e-6f};
      const int W = c.lora + c.extra, qh = c.nope + c.extra, cap = c.prompt + c.steps;
      HostWeight kvb(rnd(g, size_t(c.H) * (c.nope + c.v) * c.lora, -0.3f, 0.3f), c.H * (c.nope + c.v), c.lora);
      std::vector<uint8_t> packed;
      HostWeight norm(rnd(g, c.lora, 0.5f, 1.5f), 1, c.lora);
      MlaWeights w;
      w.kv_b = bf16 ? bf16_weight(kvb.data.data(), c.H * (c.nope + c.v), c.lora, packed) : kvb.w;
      w.kv_a_norm = norm.w;
      be_->upload(w.kv_b);
      be_->upload(norm.w);
      std::vector<float> hcache(size_t(cap) * W, 0.f);
      MlaCache hc{hcache.data(), 0, cap};
      MlaCache dc{poisoned(size_t(cap) * W), 0, cap};
      std::vector<int> Ts;
      if (c.prompt > 0) Ts.push_back(c.prompt);
      for (int i = 0; i < c.steps; ++i) Ts.push_back(1);
      for (const int T : Ts) {
        const auto q = rnd(g, size_t(T) * c.H * qh), ckv = rnd(g, size_t(T) * W, -2.f, 2.f);
        float* dctx = poisoned(size_t(T) * c.H * c.v);
        be_->mla_attend(p, w, dc, dev(q), dev(ckv), T, dctx);
        std::vector<float> ref(size_t(T) * c.H * c.v);
        cpu_.mla_attend(p, w, hc, q.data(), ckv.data(), T, ref.data());
        if (T != 1) continue;  // the prefill is MlaPrefillMatchesCpu's
        const auto got = host(dctx, ref.size());
        const std::string sh = "H=" + std::to_string(c.H) + " nope=" + std::to_string(c.nope) + " extra=" +
                               std::to_string(c.extra) + " v=" + std::to_string(c.v) + " kv_lora=" +
                               std::to_string(c.lora) + " pos=" + std::to_string(hc.length - 1) +
                               (bf16 ? " kv_b bf16" : " kv_b f32");
        EXPECT_EQ(nan_count(got), 0u) << sh;
        const double r = test::rel_l2(got.data(), ref.data(), ref.size());
        EXPECT_LE(r, bf16 ? 1e-4 : 1e-2) << sh;
        (bf16 ? worst_bf16 : worst_f32).add(r);
        const auto cache = host(dc.kv, size_t(hc.length) * W);
        EXPECT_LE(test::rel_l2(cache.data(), hcache.data(), cache.size()), 1e-6) << sh;
      }
    }
  }
  double total = 0;
  uint64_t decode = 0, merge = 0;
  for (const CudaOpTime& t : be_->profile_end(&total)) {
    if (t.name == "mla (fast) decode kernel") decode = t.launches;
    if (t.name == "mla (fast) decode merge kernel") merge = t.launches;
  }
  EXPECT_GE(decode, 50u) << "every decode token of a qualifying shape takes mla_decode.cu";
  EXPECT_GE(merge, 12u) << "contexts past 256 positions split and merge";
  std::printf("[ cuda fast ] mla decode: %d tokens (%llu decode, %llu merge launches), worst ctx rel-L2 %.3g (kv_b bf16), "
              "%.3g (kv_b f32)\n",
              worst_bf16.cases + worst_f32.cases, (unsigned long long)decode, (unsigned long long)merge, worst_bf16.rel,
              worst_f32.rel);
}

// The decode rows of a batched step (CudaBackend::mla_decode_batch: B sequences, each on its own
// cache, one launch of mla_decode.cu's kernels per 32 sequences): every sequence's ctx and cache
// row bit-identical to its own mla_attend call (the same kernels, the same split count: a function
// of its position only) and close to the CPU (kv_b BF16: 1e-4), over two steps. Four shapes, B 2 to
// 33 (past one launch), caches of different lengths in one launch (0 to 700 positions: one to
// several splits beside each other, merges for some sequences only), random non-zero inputs,
// poisoned outputs. A shape the kernel declines (extra % 4 != 0) takes the per-sequence default.
// A full cache or a cache given twice throws before anything runs.
TEST_F(CudaFast, MlaDecodeBatchEqualsSingleCallsAndCpu) {
  std::mt19937 g(44);
  struct Case {
    int H, nope, extra, v, lora, B;
  };
  const std::vector<Case> cases = {{4, 32, 16, 32, 32, 33}, {32, 128, 64, 128, 512, 5}, {2, 40, 16, 48, 40, 7},
                                   {2, 16, 6, 16, 32, 3}};
  const int prompts[] = {0, 1, 7, 255, 256, 300, 700, 40};
  Worst worst;
  int batch_calls = 0;
  for (const Case& c : cases) {
    MlaParams p{c.H, c.nope, c.extra, c.v, c.lora, 1e-6f};
    const int W = c.lora + c.extra, qh = c.nope + c.extra, row = c.H * c.v, steps = 2;
    const bool takes = c.extra % 4 == 0;  // the shapes the decode kernel takes (see mla_decode.cuh)
    HostWeight kvb(rnd(g, size_t(c.H) * (c.nope + c.v) * c.lora, -0.3f, 0.3f), c.H * (c.nope + c.v), c.lora);
    std::vector<uint8_t> packed;
    HostWeight norm(rnd(g, c.lora, 0.5f, 1.5f), 1, c.lora);
    MlaWeights w;
    w.kv_b = bf16_weight(kvb.data.data(), c.H * (c.nope + c.v), c.lora, packed);
    w.kv_a_norm = norm.w;
    be_->upload(w.kv_b);
    be_->upload(norm.w);
    std::vector<std::vector<float>> hcache(size_t(c.B));
    std::vector<MlaCache> hc(size_t(c.B)), batch(size_t(c.B)), single(size_t(c.B));
    for (int b = 0; b < c.B; ++b) {  // each sequence's prompt, in both device caches and on the CPU
      const int P = prompts[b % 8], cap = P + steps;
      hcache[size_t(b)].assign(size_t(cap) * W, 0.f);
      hc[size_t(b)] = {hcache[size_t(b)].data(), 0, cap};
      batch[size_t(b)] = {poisoned(size_t(cap) * W), 0, cap};
      single[size_t(b)] = {poisoned(size_t(cap) * W), 0, cap};
      if (P == 0) continue;
      const auto q = rnd(g, size_t(P) * c.H * qh), ckv = rnd(g, size_t(P) * W, -2.f, 2.f);
      float* dq = dev(q);
      float* dkv = dev(ckv);
      float* dctx = poisoned(size_t(P) * row);
      be_->mla_attend(p, w, batch[size_t(b)], dq, dkv, P, dctx);
      be_->mla_attend(p, w, single[size_t(b)], dq, dkv, P, dctx);
      std::vector<float> ref(size_t(P) * row);
      cpu_.mla_attend(p, w, hc[size_t(b)], q.data(), ckv.data(), P, ref.data());
    }
    std::vector<MlaCache*> ptr;
    for (MlaCache& m : batch) ptr.push_back(&m);
    for (int s = 0; s < steps; ++s) {
      const auto q = rnd(g, size_t(c.B) * c.H * qh), ckv = rnd(g, size_t(c.B) * W, -2.f, 2.f);
      float* dq = dev(q);
      float* dkv = dev(ckv);
      float* dctx = poisoned(size_t(c.B) * row);
      float* sctx = poisoned(size_t(c.B) * row);
      const uint64_t l0 = be_->stats().launches;
      be_->mla_decode_batch(p, w, ptr.data(), c.B, dq, dkv, dctx);
      ++batch_calls;
      // One attention launch (and at most one merge) per 32 sequences; the default makes one or
      // more per sequence. No profiling here, so the launches overlap as programmatic dependents.
      const uint64_t launches = be_->stats().launches - l0, chunks = uint64_t((c.B + 31) / 32);
      if (takes) {
        EXPECT_GE(launches, chunks) << "H=" << c.H << " B=" << c.B;
        EXPECT_LE(launches, 2 * chunks) << "H=" << c.H << " B=" << c.B << ": the batch took the per-sequence default";
      } else {
        EXPECT_GE(launches, uint64_t(c.B)) << "a declined shape takes the per-sequence default";
      }
      for (int b = 0; b < c.B; ++b)
        be_->mla_attend(p, w, single[size_t(b)], dq + size_t(b) * c.H * qh, dkv + size_t(b) * W, 1,
                        sctx + size_t(b) * row);
      const auto got = host(dctx, size_t(c.B) * row), solo = host(sctx, size_t(c.B) * row);
      for (int b = 0; b < c.B; ++b) {
        std::vector<float> ref(static_cast<size_t>(row));
        cpu_.mla_attend(p, w, hc[size_t(b)], q.data() + size_t(b) * c.H * qh, ckv.data() + size_t(b) * W, 1,
                        ref.data());
        const std::string sh = "H=" + std::to_string(c.H) + " kv_lora=" + std::to_string(c.lora) + " extra=" +
                               std::to_string(c.extra) + " B=" + std::to_string(c.B) + " sequence " +
                               std::to_string(b) + " pos=" + std::to_string(hc[size_t(b)].length - 1);
        ASSERT_EQ(batch[size_t(b)].length, hc[size_t(b)].length) << sh;
        const float* gb = got.data() + size_t(b) * row;
        EXPECT_EQ(0, std::memcmp(gb, solo.data() + size_t(b) * row, size_t(row) * 4)) << sh << ": batch != own call";
        const auto bc = host(batch[size_t(b)].kv, size_t(hc[size_t(b)].length) * W);
        const auto sc = host(single[size_t(b)].kv, bc.size());
        EXPECT_EQ(0, std::memcmp(bc.data(), sc.data(), bc.size() * 4)) << sh << ": cache != own call's";
        const double r = test::rel_l2(gb, ref.data(), ref.size());
        EXPECT_LE(r, 1e-4) << sh;
        worst.add(r);
      }
    }
    // Errors before anything runs: every cache is now full; a cache given twice.
    EXPECT_THROW(be_->mla_decode_batch(p, w, ptr.data(), c.B, dev(rnd(g, size_t(c.B) * c.H * qh)),
                                       dev(rnd(g, size_t(c.B) * W)), poisoned(size_t(c.B) * row)),
                 Error);
    batch[0].capacity += 1;
    const std::vector<MlaCache*> twice = {&batch[0], &batch[0]};
    EXPECT_THROW(be_->mla_decode_batch(p, w, twice.data(), 2, dev(rnd(g, size_t(2) * c.H * qh)),
                                       dev(rnd(g, size_t(2) * W)), poisoned(size_t(2) * row)),
                 Error);
    EXPECT_EQ(batch[0].length, hc[0].length) << "a refused call advances nothing";
  }
  std::printf("[ cuda fast ] mla decode batch: %d calls, worst ctx rel-L2 %.3g (kv_b bf16)\n", batch_calls, worst.rel);
}

// Chunked KDA on tensor cores (kda_chunked_mma.cu: the fast mode's intra-chunk and state passes,
// TF32 operands, f32 accumulation and state) against the CPU's token-by-token recurrence (f32):
// head_dim 16…128 incl. 33 and 100 (not multiples of 4 / 32: the 4-byte copy path and partial
// 16-row tiles), 6 and 8 heads, T around the chunk lengths (2, C-1, C, C+1, 4C±1, 200; T = 1 runs the
// decode step), chunk 16/32/64, both gates, random non-zero inputs and initial state, state carried
// over the calls, outputs poisoned. Bound rel-L2 5e-3 on outputs and S (TF32 rounds each operand by
// ≤ 2^-11 ≈ 4.9e-4; measured worst is printed), conv windows exact. The chunk rule: a 2C-token call
// equals a C-token call followed by another, bit for bit (outputs and S). Profile labels show the
// tensor-core kernels ran. For d ≤ 128 the prep and output-norm kernels are the fast mode's warp
// kernels, whose SiLU and gate exps are f32 expf (≤ 2 ulp; kda_math.h Exp::F32): a relative error
// of a few 1e-7 in q, k, v, g, β and the output gate, ~1e-6 on the outputs, far under the TF32
// error. The last cases draw z, β and the output gate from ±25 (range zr), so the softplus gate
// takes both branches (z > 20 and log1p(e^z) near e^20) and the sigmoids saturate.
TEST_F(CudaFast, KdaChunkedTensorCoresMatchCpu) {
  std::mt19937 g(41);
  struct Case { int H, d, C; std::vector<int> Ts; float zr = 3.f; };
  const std::vector<Case> cases = {
      {1, 16, 16, {2, 15, 16, 17, 63, 65, 1, 200}},
      {2, 32, 16, {17, 33}},
      {6, 16, 32, {2, 31, 32, 33, 200}},
      {3, 33, 32, {15, 64, 1, 65}},
      {4, 64, 64, {63, 64, 65, 200}},
      {2, 100, 32, {17, 63, 2}},
      {5, 128, 32, {16, 200, 65, 127, 129}},
      {1, 128, 64, {200, 64, 127, 255, 257}},
      {8, 128, 16, {15, 16, 17}},
      {3, 48, 64, {1, 100, 64}},
      {4, 128, 32, {65, 200}, 25.f},
      {3, 33, 16, {17, 40}, 25.f}};
  Worst out_w, s_w;
  uint64_t tc_launches = 0;
  for (const KdaGate gate_kind : {KdaGate::LowerBound, KdaGate::Softplus})  // K3, Kimi Linear
  for (const Case& c : cases) {
    const int H = c.H, d = c.d, K = 4, P = H * d;
    CudaOptions o = be_->options();
    o.kda = CudaKda::Chunked, o.kda_chunk = c.C;
    test::ScopedOptions chunk(*be_, o);
    KdaParams p{H, d, K, -5.f, 1e-5f, gate_kind};
    std::vector<HostWeight> ws;
    ws.reserve(6);
    auto& qc = ws.emplace_back(rnd(g, size_t(P) * K), P, K);
    auto& kc = ws.emplace_back(rnd(g, size_t(P) * K), P, K);
    auto& vc = ws.emplace_back(rnd(g, size_t(P) * K), P, K);
    auto& alog = ws.emplace_back(rnd(g, H, -1.f, 1.f), 1, H);
    auto& dtb = ws.emplace_back(rnd(g, P), 1, P);
    auto& onorm = ws.emplace_back(rnd(g, d, 0.5f, 1.5f), 1, d);
    KdaWeights w;
    w.q_conv = qc.w, w.k_conv = kc.w, w.v_conv = vc.w, w.a_log = alog.w, w.dt_bias = dtb.w, w.o_norm = onorm.w;
    for (auto& hw : ws) be_->upload(hw.w);
    std::vector<float> S = rnd(g, size_t(H) * d * d, -0.1f, 0.1f);
    std::vector<float> conv = rnd(g, size_t(3) * P * (K - 1));
    KdaState hs{S.data(), conv.data()};
    KdaState ds{dev(S), dev(conv)};
    for (size_t call = 0; call < c.Ts.size(); ++call) {
      const int T = c.Ts[call];
      const auto q = rnd(g, size_t(T) * P), k = rnd(g, size_t(T) * P), v = rnd(g, size_t(T) * P);
      const auto z = rnd(g, size_t(T) * P, -c.zr, c.zr), beta = rnd(g, size_t(T) * H, -c.zr, c.zr);
      const auto gate = rnd(g, size_t(T) * P, -c.zr, c.zr);
      float* dout = poisoned(size_t(T) * P);
      be_->profile_begin();
      be_->kda_core(p, w, ds, dev(q), dev(k), dev(v), dev(z), dev(beta), dev(gate), T, dout);
      double total = 0;
      for (const CudaOpTime& t : be_->profile_end(&total))
        if (t.name == "kda_core chunked: state kernel (tensor cores)") tc_launches += t.launches;
      std::vector<float> ref(size_t(T) * P);
      cpu_.kda_core(p, w, hs, q.data(), k.data(), v.data(), z.data(), beta.data(), gate.data(), T, ref.data());
      const std::string sh = "H=" + std::to_string(H) + " d=" + std::to_string(d) + " C=" + std::to_string(c.C) +
                             " T=" + std::to_string(T) + " call=" + std::to_string(call) +
                             " softplus=" + std::to_string(gate_kind == KdaGate::Softplus);
      const auto got = host(dout, ref.size());
      ASSERT_EQ(nan_count(got), 0u) << sh;
      const double ro = test::rel_l2(got.data(), ref.data(), ref.size());
      const auto gs = host(ds.S, S.size());
      const double rs = test::rel_l2(gs.data(), S.data(), S.size());
      out_w.add(ro), s_w.add(rs);
      EXPECT_LE(ro, 5e-3) << "kda out " << sh;
      EXPECT_LE(rs, 5e-3) << "kda S " << sh;
      EXPECT_EQ(0, std::memcmp(host(ds.conv, conv.size()).data(), conv.data(), conv.size() * 4)) << "conv " << sh;
    }
    // Chunk rule: one 2C-token call vs two C-token calls from the same state.
    const int T2 = 2 * c.C;
    const auto q = rnd(g, size_t(T2) * P), k = rnd(g, size_t(T2) * P), v = rnd(g, size_t(T2) * P);
    const auto z = rnd(g, size_t(T2) * P, -3.f, 3.f), beta = rnd(g, size_t(T2) * H, -3.f, 3.f);
    const auto gate = rnd(g, size_t(T2) * P, -3.f, 3.f);
    const auto S0 = host(ds.S, S.size()), conv0 = host(ds.conv, conv.size());
    float *dq = dev(q), *dk = dev(k), *dv = dev(v), *dz = dev(z), *db = dev(beta), *dg = dev(gate);
    KdaState one{dev(S0), dev(conv0)}, two{dev(S0), dev(conv0)};
    float* o1 = poisoned(size_t(T2) * P);
    float* o2 = poisoned(size_t(T2) * P);
    be_->kda_core(p, w, one, dq, dk, dv, dz, db, dg, T2, o1);
    const size_t h = size_t(c.C) * P;
    be_->kda_core(p, w, two, dq, dk, dv, dz, db, dg, c.C, o2);
    be_->kda_core(p, w, two, dq + h, dk + h, dv + h, dz + h, db + size_t(c.C) * H, dg + h, c.C, o2 + h);
    EXPECT_EQ(0, std::memcmp(host(o1, size_t(T2) * P).data(), host(o2, size_t(T2) * P).data(), size_t(T2) * P * 4))
        << "chunk rule (out) H=" << H << " d=" << d << " C=" << c.C;
    EXPECT_EQ(0, std::memcmp(host(one.S, S.size()).data(), host(two.S, S.size()).data(), S.size() * 4))
        << "chunk rule (S) H=" << H << " d=" << d << " C=" << c.C;
  }
  EXPECT_GT(tc_launches, 0u) << "the tensor-core state kernel never ran";
  std::printf("[ cuda fast ] kda chunked (tensor cores): %d calls, worst out rel-L2 %.3g, worst S rel-L2 %.3g, %llu "
              "tensor-core state launches\n",
              out_w.cases, out_w.rel, s_w.rel, (unsigned long long)tc_launches);
}

/// All-position logits of `ids` through a Forward with `chunk`.
std::vector<float> model_logits(const Model& m, Backend& be, const std::vector<int>& ids, int chunk) {
  Forward fwd(m, be, {chunk, -1});
  SequenceState st(be, m.config, int(ids.size()) + 8);
  std::vector<float> out(ids.size() * size_t(m.config.vocab));
  fwd.run(st, ids.data(), nullptr, int(ids.size()), out.data(), true);
  return out;
}

/// Whole models in fast mode against the CPU (exact f32) on a 300-token random prompt. These random
/// tiny models amplify small differences (top-k routing flips, AttnRes; in exact mode ~1e-7 per
/// layer becomes ~1e-5 on the logits): per-layer BF16 errors of ~3e-3 (the bound the fast mode is
/// held to is checked per layer, with injected inputs, by `wren validate`: CudaModel.CliFallbackAndValidate)
/// compound over 300 tokens to logits rel-L2 ~0.1-0.35 (run 14). Checked here: no NaN, logits
/// rel-L2 <= 0.5 and argmax equal on >= 60% of positions (a planted bug gives ~1.1 and < 10%),
/// and the chunk rule: chunks 32, 64 and 256 bit-identical (multiples of chunked KDA's 32-token
/// block); chunk 7 vs 32 is printed (KDA blocks then start elsewhere, amplified as above).
void check_model(const std::string& dir, const char* name) {
  std::string why;
  if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto m = load_model(dir);
  CudaBackend be;
  be.set_precision(GpuPrecision::Fast);
  be.upload(weight_list(m->weights));
  CpuBackend cpu;
  std::mt19937 g(34);
  std::vector<int> ids(300);
  for (int& id : ids) id = int(g() % unsigned(m->config.vocab));
  const auto ref = model_logits(*m, cpu, ids, 32);
  const auto c32 = model_logits(*m, be, ids, 32);
  const double r = test::rel_l2(c32.data(), ref.data(), ref.size());
  EXPECT_EQ(nan_count(c32), 0u);
  EXPECT_LE(r, 0.5) << name;
  int argmax_equal = 0;
  const int V = m->config.vocab;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* a = c32.data() + t * V;
    const float* b = ref.data() + t * V;
    argmax_equal += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  EXPECT_GE(argmax_equal, 180) << name;
  for (int chunk : {64, 256}) {
    const auto c = model_logits(*m, be, ids, chunk);
    EXPECT_EQ(0, std::memcmp(c.data(), c32.data(), c.size() * 4)) << name << ": chunk " << chunk << " differs from 32";
  }
  const auto c7 = model_logits(*m, be, ids, 7);
  const double r7 = test::rel_l2(c7.data(), c32.data(), c32.size());
  const CudaStats s = be.stats();
  EXPECT_GT(s.lt_gemms, 0u);
  EXPECT_GT(s.grouped_moe_calls, 0u);
  std::printf("[ cuda fast ] %s, 300 tokens: logits rel-L2 vs CPU exact %.3g, argmax equal %d/300; chunk 7 vs 32 "
              "%.3g; %llu cuBLASLt GEMMs, %llu grouped MoE calls\n",
              name, r, argmax_equal, r7, (unsigned long long)s.lt_gemms, (unsigned long long)s.grouped_moe_calls);
}

TEST(CudaFastModel, K3TinyMatchesCpuAndIsChunkInvariant) { check_model(test::golden_dir(), "k3-tiny-a"); }
TEST(CudaFastModel, KimiLinearTinyMatchesCpuAndIsChunkInvariant) {
  check_model(test::golden_dir() + "/../kimi-linear-tiny", "kimi-linear-tiny");
}

#endif  // WREN_HAVE_CUDA

}  // namespace
}  // namespace wren
