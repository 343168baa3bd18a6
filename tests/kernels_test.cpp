// CPU kernels against f64 references, at every level this CPU has (scalar, AVX2, AVX-512), on
// random non-zero inputs and awkward sizes (dense cols 1..200 incl. 33, 96, 160; MXFP4 cols 32 to
// 1056 = 33 groups; 33-row matrices; T = 1, 5, 33). Tolerances are stated per test as a bound on |y − ref| relative to Σ|w·x| (the
// scale of f32 summation error), so they do not depend on cancellation in the reference.
// Also: the quantizers' error bounds, blocking invariance (row splits and token counts give
// bit-identical outputs) and the thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "core/error.h"
#include "core/mxfp4.h"
#include "model/quant.h"
#include "test_util.h"

namespace wren {
namespace {

using cpu::Isa;

std::vector<Isa> levels() { return test::cpu_levels(); }

std::vector<float> random_vec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = u(rng) * scale;
    if (x == 0) x = scale * 0.5f;  // non-zero inputs
  }
  return v;
}

/// A dense weight in format f built from f32 values, owning its storage.
struct OwnedDense {
  std::vector<float> src;
  std::vector<uint8_t> data;
  std::vector<float> scale;
  DenseWeight w;
  OwnedDense(WFormat f, int rows, int cols, std::mt19937& rng) : src(random_vec(size_t(rows) * cols, rng, 0.1f)) {
    data.resize(std::max<size_t>(1, wformat_data_bytes(f, rows, cols)));
    scale.resize(std::max<size_t>(1, wformat_scale_count(f, rows, cols)));
    quantize_matrix(src.data(), rows, cols, f, data.data(), scale.data());
    w.rows = rows, w.cols = cols, w.data = data.data(), w.format = f, w.scale = scale.data();
  }
  std::vector<float> row(int r) const {
    std::vector<float> out(w.cols);
    dequant_row(w, r, out.data());
    return out;
  }
};

/// Checks y [T, rows] (ldy = rows) against Σ deq(W)·x in f64, |err| <= tol · Σ|w·x|.
void expect_close(const std::vector<std::vector<float>>& wrows, const float* x, int T, int cols,
                  const float* y, double tol, const std::string& what) {
  const int rows = int(wrows.size());
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      for (int c = 0; c < cols; ++c) {
        ref += double(wrows[r][c]) * x[size_t(t) * cols + c];
        mag += std::fabs(double(wrows[r][c]) * x[size_t(t) * cols + c]);
      }
      ASSERT_LE(std::fabs(y[size_t(t) * rows + r] - ref), tol * mag + 1e-30)
          << what << " row " << r << " token " << t << " ref " << ref;
    }
}

TEST(Kernels, DenseEveryFormatAndLevelMatchesF64) {
  std::mt19937 rng(1);
  for (Isa isa : levels())
    for (int f = 0; f < kWFormats; ++f)
      for (int rows : {1, 33})
        for (int cols : {1, 7, 33, 64, 96, 160, 200})
          for (int T : {1, 5, 33}) {
            const OwnedDense d(WFormat(f), rows, cols, rng);
            std::vector<std::vector<float>> wr;
            for (int r = 0; r < rows; ++r) wr.push_back(d.row(r));
            const auto x = random_vec(size_t(T) * cols, rng);
            std::vector<float> y(size_t(T) * rows, NAN);
            cpu::kernels_for(isa).dense[f](d.w, x.data(), T, y.data(), rows, 0, rows);
            // f32 accumulation over <= 200 terms: 2e-6·Σ|w·x| is ~30 ulps of the magnitude.
            expect_close(wr, x.data(), T, cols, y.data(), 2e-6,
                         std::string(cpu::isa_name(isa)) + " " + wformat_name(WFormat(f)) + " cols " + std::to_string(cols));
          }
}

TEST(Kernels, DenseOutputsDoNotDependOnRowSplitOrTokenCount) {
  std::mt19937 rng(2);
  for (Isa isa : levels())
    for (int f = 0; f < kWFormats; ++f) {
      const int rows = 37, cols = 160, T = 7;
      const OwnedDense d(WFormat(f), rows, cols, rng);
      const auto x = random_vec(size_t(T) * cols, rng);
      std::vector<float> all(size_t(T) * rows), split(all.size());
      const auto fn = cpu::kernels_for(isa).dense[f];
      fn(d.w, x.data(), T, all.data(), rows, 0, rows);
      for (int t = 0; t < T; ++t)  // one token at a time, rows in uneven pieces
        for (int r0 = 0; r0 < rows; r0 += 5)
          fn(d.w, x.data() + size_t(t) * cols, 1, split.data() + size_t(t) * rows, rows, r0, std::min(rows, r0 + 5));
      EXPECT_EQ(0, std::memcmp(all.data(), split.data(), all.size() * 4)) << cpu::isa_name(isa) << " " << f;
    }
}

TEST(Quant, ErrorWithinHalfAStepAndLayoutAsDocumented) {
  std::mt19937 rng(3);
  for (int cols : {1, 33, 64, 100, 160}) {
    const OwnedDense q8(WFormat::Q8_ROW, 5, cols, rng), q4(WFormat::Q4_G64, 5, cols, rng),
        b16(WFormat::BF16, 5, cols, rng);
    for (int r = 0; r < 5; ++r) {
      const auto a = q8.row(r), b = q4.row(r), c = b16.row(r);
      for (int k = 0; k < cols; ++k) {
        EXPECT_LE(std::fabs(a[k] - q8.src[r * cols + k]), 0.5001f * q8.scale[r]);
        // Q4: the extreme maps to -8 exactly; the opposite extreme may clamp at 7 (one step).
        EXPECT_LE(std::fabs(b[k] - q4.src[r * cols + k]), 1.0001f * std::fabs(q4.scale[r * q4.w.q4_groups() + k / 64]));
        EXPECT_LE(std::fabs(c[k] - b16.src[r * cols + k]), std::fabs(b16.src[r * cols + k]) * 0x1p-8f);
      }
    }
  }
  // Q4_G64 layout: byte j of a group = column j (low nibble), column j + 32 (high nibble), as q + 8.
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = float(i % 16 - 8);
  uint8_t data[32];
  float s;
  quantize_matrix(w.data(), 1, 64, WFormat::Q4_G64, data, &s);
  EXPECT_EQ(s, 1.0f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(data[j], uint8_t((j % 16) | ((j % 16) << 4))) << j;
}

/// A random MXFP4 matrix with scales around 2^-6 and one scale byte 0.
struct OwnedMx {
  std::vector<uint8_t> packed, scale;
  MxMatrix m;
  OwnedMx(int rows, int cols, std::mt19937& rng) : packed(size_t(rows) * cols / 2), scale(size_t(rows) * cols / 32) {
    for (auto& b : packed) b = uint8_t(rng());
    for (auto& s : scale) s = uint8_t(119 + rng() % 5);
    scale[scale.size() / 2] = 0;  // the subnormal 2^-127 (docs/model.md#open-points, 4)
    scale.back() = 125;
    m = {rows, cols, packed.data(), scale.data()};
  }
  std::vector<float> row(int r) const {
    std::vector<float> out(m.cols);
    mxfp4::dequant_row(m.packed + size_t(r) * m.cols / 2, m.scale + size_t(r) * m.cols / 32, m.cols, out.data());
    return out;
  }
};

TEST(Kernels, Mxfp4F32EveryLevelMatchesF64) {
  std::mt19937 rng(4);
  for (Isa isa : levels())
    for (int rows : {1, 33})
      for (int cols : {32, 96, 128, 160, 416, 1056})
        for (int T : {1, 5, 33}) {
          const OwnedMx mx(rows, cols, rng);
          std::vector<std::vector<float>> wr;
          for (int r = 0; r < rows; ++r) wr.push_back(mx.row(r));
          const auto x = random_vec(size_t(T) * cols, rng);
          std::vector<float> fb(x.size()), sb(x.size() / 32), y(size_t(T) * rows, NAN);
          std::vector<int8_t> qb(x.size());
          const cpu::MxAct a = cpu::mx_prep(isa, x.data(), T, cols, false, fb.data(), qb.data(), sb.data());
          cpu::kernels_for(isa).mx_f32(mx.m, a, y.data(), rows, 0, rows);
          expect_close(wr, x.data(), T, cols, y.data(), 2e-6, std::string("mxfp4 f32 ") + cpu::isa_name(isa));
        }
}

TEST(Kernels, Mxfp4Int8ActivationsEveryLevel) {
  // Against (a) f64 on the int8-rounded activations: only f32 rounding remains (2e-6·Σ|w·x|);
  // (b) f64 on the true activations: the rounding is at most xs/2 per element, so
  //     |y − ref| <= Σ_c |w_c| · xs_g(c) / 2 (plus the f32 part).
  std::mt19937 rng(5);
  for (Isa isa : levels())
    for (int cols : {32, 96, 128, 160, 416, 1056})
      for (int T : {1, 5, 33}) {
        const int rows = 33;
        const OwnedMx mx(rows, cols, rng);
        const auto x = random_vec(size_t(T) * cols, rng);
        std::vector<float> fb(x.size()), sb(x.size() / 32), y(size_t(T) * rows, NAN);
        std::vector<int8_t> qb(x.size());
        const cpu::MxAct a = cpu::mx_prep(isa, x.data(), T, cols, true, fb.data(), qb.data(), sb.data());
        cpu::kernels_for(isa).mx_i8(mx.m, a, y.data(), rows, 0, rows);
        std::vector<float> xd(x.size());  // dequantized activations in natural column order
        for (int t = 0; t < T; ++t)
          for (int c = 0; c < cols; ++c) {
            const int pos = cpu::mx_act_pos(isa, true, cols, c);
            xd[size_t(t) * cols + c] = float(a.xq[size_t(t) * cols + pos]) * a.xs[size_t(t) * (cols / 32) + c / 32];
          }
        std::vector<std::vector<float>> wr;
        for (int r = 0; r < rows; ++r) wr.push_back(mx.row(r));
        expect_close(wr, xd.data(), T, cols, y.data(), 2e-6, std::string("mxfp4 int8 ") + cpu::isa_name(isa));
        for (int t = 0; t < T; ++t)
          for (int r = 0; r < rows; ++r) {
            double ref = 0, bound = 0;
            for (int c = 0; c < cols; ++c) {
              ref += double(wr[r][c]) * x[size_t(t) * cols + c];
              bound += std::fabs(wr[r][c]) * (0.5 * a.xs[size_t(t) * (cols / 32) + c / 32] + 2e-6 * std::fabs(x[size_t(t) * cols + c]));
            }
            EXPECT_LE(std::fabs(y[size_t(t) * rows + r] - ref), bound) << cpu::isa_name(isa);
          }
      }
}

TEST(Kernels, Mxfp4ActivationPrepIsTheSameAtEveryLevel) {
  // int8 activations have the same values and scales whatever the level, only their order
  // differs (mx_act_pos), so int8 results differ between levels only by the f32 sums of the
  // integer dots; the f32 orders are permutations. cols 416 = 3 whole 4-group blocks + 1 group;
  // AVX-512's per-block lane scales xs4 and bias corrections xc are checked too.
  std::mt19937 rng(10);
  for (int cols : {96, 416}) {
    const int T = 3, G = cols / 32;
    auto x = random_vec(size_t(T) * cols, rng);
    for (int c = 32; c < 64; ++c) x[c] = 0;  // an all-zero group: scale 0, q 0
    std::vector<float> fb0(x.size()), sb0(x.size() / 32), fb(x.size()), sb(x.size() / 32);
    std::vector<int8_t> qb0(x.size()), qb(x.size());
    cpu::mx_prep(Isa::Scalar, x.data(), T, cols, true, fb0.data(), qb0.data(), sb0.data());
    for (Isa isa : levels()) {
      const cpu::MxAct q = cpu::mx_prep(isa, x.data(), T, cols, true, fb.data(), qb.data(), sb.data());
      EXPECT_EQ(0, std::memcmp(sb.data(), sb0.data(), sb.size() * 4)) << cpu::isa_name(isa);
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < cols; ++c)
          ASSERT_EQ(qb[size_t(t) * cols + cpu::mx_act_pos(isa, true, cols, c)],
                    qb0[size_t(t) * cols + cpu::mx_act_pos(Isa::Scalar, true, cols, c)]) << cpu::isa_name(isa) << " " << c;
      if (isa == Isa::Avx512)
        for (int t = 0; t < T; ++t)
          for (int b = 0; b < G / 4; ++b)
            for (int d = 0; d < 16; ++d) {
              const int g = 4 * b + d / 4, c0 = 128 * b + 8 * d;  // lane d meets columns c0 .. c0 + 7
              int sum = 0;
              for (int c = c0; c < c0 + 8; ++c) sum += qb[size_t(t) * cols + cpu::mx_act_pos(isa, true, cols, c)];
              EXPECT_EQ(q.xc[size_t(t) * (cols / 8) + 16 * b + d], -12 * sum);
              EXPECT_EQ(q.xs4[size_t(t) * (cols / 8) + 16 * b + d], sb[size_t(t) * G + g]);
            }
      const cpu::MxAct a = cpu::mx_prep(isa, x.data(), T, cols, false, fb.data(), qb.data(), sb.data());
      std::vector<char> hit(cols);
      for (int c = 0; c < cols; ++c) {
        const int pos = cpu::mx_act_pos(isa, false, cols, c);
        ASSERT_TRUE(pos >= 0 && pos < cols && !hit[pos]) << cpu::isa_name(isa) << " " << c;
        hit[pos] = 1;
        for (int t = 0; t < T; ++t) ASSERT_EQ(a.xf[size_t(t) * cols + pos], x[size_t(t) * cols + c]) << cpu::isa_name(isa);
      }
    }
    EXPECT_EQ(sb0[1], 0.0f);
  }
}

TEST(Kernels, Mxfp4OutputsDoNotDependOnRowSplitOrTokenCount) {
  std::mt19937 rng(6);
  for (Isa isa : levels())
    for (bool i8 : {false, true}) {
      const int rows = 35, cols = 672, T = 6;  // 5 whole 4-group blocks + 1 group
      const OwnedMx mx(rows, cols, rng);
      const auto x = random_vec(size_t(T) * cols, rng);
      std::vector<float> fb(x.size()), sb(x.size() / 32), all(size_t(T) * rows), split(all.size());
      std::vector<int8_t> qb(x.size());
      const auto& k = cpu::kernels_for(isa);
      const auto fn = i8 ? k.mx_i8 : k.mx_f32;
      fn(mx.m, cpu::mx_prep(isa, x.data(), T, cols, i8, fb.data(), qb.data(), sb.data()), all.data(), rows, 0, rows);
      for (int t = 0; t < T; ++t) {
        const cpu::MxAct a = cpu::mx_prep(isa, x.data() + size_t(t) * cols, 1, cols, i8, fb.data(), qb.data(), sb.data());
        for (int r0 = 0; r0 < rows; r0 += 3) fn(mx.m, a, split.data() + size_t(t) * rows, rows, r0, std::min(rows, r0 + 3));
      }
      EXPECT_EQ(0, std::memcmp(all.data(), split.data(), all.size() * 4)) << cpu::isa_name(isa) << " int8 " << i8;
    }
}

TEST(Kernels, ScalarMxfp4IsTheReferenceGemv) {
  std::mt19937 rng(7);
  const OwnedMx mx(9, 64, rng);
  const auto x = random_vec(64, rng);
  std::vector<float> a(9), b(9);
  cpu::mx_gemv(mx.m, x.data(), a.data());
  const cpu::MxAct act = cpu::mx_prep(Isa::Scalar, x.data(), 1, 64, false, nullptr, nullptr, nullptr);
  cpu::kernels_for(Isa::Scalar).mx_f32(mx.m, act, b.data(), 9, 0, 9);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 9 * 4));
}

TEST(Kernels, DotAxpyEveryLevel) {
  std::mt19937 rng(8);
  for (Isa isa : levels())
    for (int n : {1, 7, 16, 33, 64, 100, 512}) {
      const auto a = random_vec(n, rng), b = random_vec(n, rng);
      double ref = 0, mag = 0;
      for (int i = 0; i < n; ++i) ref += double(a[i]) * b[i], mag += std::fabs(double(a[i]) * b[i]);
      EXPECT_LE(std::fabs(cpu::kernels_for(isa).dot(a.data(), b.data(), n) - ref), 2e-6 * mag) << n;
      std::vector<float> y = b;
      cpu::kernels_for(isa).axpy(0.37f, a.data(), y.data(), n);
      for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], b[i] + 0.37 * a[i], 1e-6) << n;
    }
}

TEST(Kernels, DeltaStepEveryLevelMatchesF64) {
  // Three steps on a state that starts random: S, u, o against an f64 replay of docs/model.md#kda, step 6.
  std::mt19937 rng(9);
  for (Isa isa : levels())
    for (int d : {5, 16, 33}) {
      std::vector<float> S = random_vec(size_t(d) * d, rng), u(d), o(d);
      std::vector<double> Sd(S.begin(), S.end());
      for (int step = 0; step < 3; ++step) {
        const auto q = random_vec(d, rng), k = random_vec(d, rng), v = random_vec(d, rng);
        auto alpha = random_vec(d, rng);
        for (float& a : alpha) a = 0.5f + 0.5f * std::fabs(a);
        const float beta = 0.7f;
        cpu::kernels_for(isa).delta_step(S.data(), q.data(), k.data(), v.data(), alpha.data(), beta, d, u.data(), o.data());
        std::vector<double> ud(d, 0.0), od(d, 0.0);
        for (int r = 0; r < d; ++r)
          for (int c = 0; c < d; ++c) Sd[r * d + c] *= alpha[r], ud[c] += k[r] * Sd[r * d + c];
        for (int c = 0; c < d; ++c) ud[c] = beta * (v[c] - ud[c]);
        for (int r = 0; r < d; ++r)
          for (int c = 0; c < d; ++c) Sd[r * d + c] += k[r] * ud[c], od[c] += q[r] * Sd[r * d + c];
        for (int c = 0; c < d; ++c) EXPECT_NEAR(o[c], od[c], 1e-5 * d) << cpu::isa_name(isa) << " d " << d;
      }
      for (int i = 0; i < d * d; ++i) ASSERT_NEAR(S[i], Sd[i], 1e-5 * d) << cpu::isa_name(isa);
    }
}

TEST(Kernels, SituEveryLevelMatchesLibm) {
  // Against the scalar libm path over the range activations reach (|g|, |u| up to 60, both signs,
  // the tanh branch point 0.625·b and tiny values): |err| <= 1e-6 · (|ref| + 1e-3) (measured 2.4e-7).
  std::mt19937 rng(11);
  std::vector<float> g = random_vec(997, rng, 60.0f), u = random_vec(997, rng, 60.0f);
  for (int i = 0; i < 40; ++i) g[i] *= 1e-4f, u[i + 40] *= 1e-4f;
  g[100] = 2.5f, u[101] = 15.625f, g[102] = -2.5f, u[103] = -15.625f;
  std::vector<float> ref(g.size()), out(g.size());
  cpu::kernels_for(Isa::Scalar).situ(g.data(), u.data(), g.size(), 4.0f, 25.0f, ref.data());
  for (Isa isa : levels()) {
    cpu::kernels_for(isa).situ(g.data(), u.data(), g.size(), 4.0f, 25.0f, out.data());
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_LE(std::fabs(out[i] - ref[i]), 1e-6 * (std::fabs(ref[i]) + 1e-3)) << cpu::isa_name(isa) << " g " << g[i] << " u " << u[i];
      worst = std::max(worst, std::fabs(out[i] - ref[i]) / (std::fabs(ref[i]) + 1e-3));
    }
    std::printf("[ %s ] SiTU worst |err| / (|ref| + 1e-3): %.3g\n", cpu::isa_name(isa), worst);
  }
}

// Backend::gemm_mapped's default (every backend that does not fuse it; the CPU reference): the
// element-wise op into x, then gemm on x, bit for bit; x = a gates in place.
TEST(Kernels, GemmMappedDefaultIsTheTwoOps) {
  CpuBackend cpu;
  std::mt19937 rng(17);
  const int rows = 33, cols = 96, T = 3;
  const size_t n = size_t(T) * cols;
  std::vector<float> wv = random_vec(size_t(rows) * cols, rng), a = random_vec(n, rng, 6.f), b = random_vec(n, rng, 6.f);
  DenseWeight w;
  w.rows = rows, w.cols = cols, w.data = wv.data();
  for (auto kind : {InputMap::Kind::SiluGlu, InputMap::Kind::SituGlu, InputMap::Kind::SigmoidGate}) {
    std::vector<float> x(n), y(size_t(T) * rows), x2(n), y2(size_t(T) * rows);
    cpu.gemm_mapped(w, a.data(), InputMap{kind, b.data(), 2.5f, 1.5f}, T, x.data(), y.data());
    if (kind == InputMap::Kind::SiluGlu) cpu.silu_glu(a.data(), b.data(), T, cols, x2.data());
    else if (kind == InputMap::Kind::SituGlu) cpu.situ_glu(a.data(), b.data(), T, cols, 2.5f, 1.5f, x2.data());
    else x2 = a, cpu.sigmoid_gate(x2.data(), b.data(), n);
    cpu.gemm(w, x2.data(), T, y2.data());
    EXPECT_EQ(0, std::memcmp(x.data(), x2.data(), n * 4)) << int(kind);
    EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << int(kind);
    if (kind == InputMap::Kind::SigmoidGate) {
      std::vector<float> in_place = a, y3(y.size());
      cpu.gemm_mapped(w, in_place.data(), InputMap{kind, b.data()}, T, in_place.data(), y3.data());
      EXPECT_EQ(0, std::memcmp(in_place.data(), x2.data(), n * 4)) << "in place";
      EXPECT_EQ(0, std::memcmp(y3.data(), y2.data(), y.size() * 4)) << "in place";
    }
  }
}

TEST(ThreadPool, EveryTaskOnceAcrossThreadsAndErrorsPropagate) {
  for (int threads : {1, 2, 3}) {
    cpu::ThreadPool pool(threads);
    for (int round = 0; round < 50; ++round) {
      std::vector<std::atomic<int>> hits(97);
      std::atomic<int> bad_thread{0};
      pool.run(97, [&](int i, int th) {
        hits[i].fetch_add(1);
        if (th < 0 || th >= threads) bad_thread.fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
      ASSERT_EQ(bad_thread.load(), 0);
    }
    EXPECT_THROW(pool.run(10, [](int i, int) { if (i == 7) throw std::runtime_error("x"); }), std::runtime_error);
    int nested = 0;
    pool.run(1, [&](int, int) { pool.run(4, [&](int, int) { ++nested; }); });  // nested: inline
    EXPECT_EQ(nested, 4);
  }
}

TEST(Isa, NamesAndDetection) {
  EXPECT_TRUE(cpu::isa_supported(Isa::Scalar));
  EXPECT_TRUE(cpu::isa_supported(cpu::best_isa()));
  EXPECT_EQ(cpu::parse_isa("scalar"), Isa::Scalar);
  EXPECT_EQ(cpu::parse_isa("auto"), cpu::best_isa());
  EXPECT_THROW(cpu::parse_isa("sse9"), Error);
  EXPECT_THROW(QuantPlan::preset("q3"), Error);
  EXPECT_THROW(parse_wformat("int4", "--quant-attn"), Error);
  EXPECT_TRUE(QuantPlan::preset("exact").exact());
  const QuantPlan d = QuantPlan::preset("default");
  EXPECT_EQ(d.of(WClass::Attn), WFormat::Q4_G64);
  EXPECT_EQ(d.of(WClass::Mla), WFormat::Q8_ROW);
  EXPECT_EQ(d.of(WClass::Head), WFormat::Q8_ROW);
  EXPECT_EQ(d.of(WClass::Vector), WFormat::F32);
}

}  // namespace
}  // namespace wren
