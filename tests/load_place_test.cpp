// Loading straight to a backend (load_model with LoadOptions::place_on, Backend::place_dense; the
// CUDA backend's device path is tested in cuda_model_test.cpp): on the golden k3-tiny-a, with a
// stand-in placing backend (test::WrappedBackend with `place`, host storage): every dense matrix
// is handed to the backend (none is kept by the model's host arena), every vector stays host f32,
// the placed bytes equal the host loader's for every --quant preset, the logits are bit-identical,
// the progress callback counts the stored bytes, a non-finite weight is refused naming the tensor,
// and a Runner falls back to the CPU on a host copy of the model (the placed weights live on the
// failed "device").
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/forward.h"
#include "model/load.h"
#include "model/quant.h"
#include "model/tensor_table.h"
#include "runtime/runner.h"
#include "test_util.h"
#include "wrapped_backend.h"

namespace wren {
namespace {

const std::vector<int> kIds = {4096, 976, 2328, 2258, 328, 2312, 766, 382};

std::vector<float> logits_of(const Model& m, Backend& be, TokenStep* step = nullptr) {
  Forward fwd(m, be);
  TokenStep& s = step ? *step : static_cast<TokenStep&>(fwd);
  SequenceState st(be, m.config, 64);
  std::vector<float> out(kIds.size() * size_t(m.config.vocab));
  s.run(st, kIds.data(), nullptr, int(kIds.size()), out.data(), true);
  return out;
}

/// Elements of the weights in `dense` kept in host memory (not placed on a backend).
size_t host_elements(const std::vector<const DenseWeight*>& dense) {
  size_t n = 0;
  for (const DenseWeight* d : dense)
    if (d->data && !d->placed_on) n += size_t(d->rows * d->cols);
  return n;
}

TEST(LoadPlace, EveryMatrixPlacedBytesAndLogitsIdentical) {
  for (const char* preset : {"exact", "bf16", "q8", "default", "q4"}) {
    SCOPED_TRACE(preset);
    const QuantPlan plan = QuantPlan::preset(preset);
    const auto host = load_model(test::golden_dir(), plan);
    CpuBackend inner;
    test::WrappedBackend dev(inner);
    dev.place = true;
    LoadOptions lo;
    lo.place_on = &dev;
    const auto placed = load_model(test::golden_dir(), plan, lo);
    const WeightList a = weight_list(host->weights), b = weight_list(placed->weights);
    ASSERT_EQ(a.dense.size(), b.dense.size());
    int matrices = 0;
    for (size_t i = 0; i < a.dense.size(); ++i) {
      const DenseWeight &x = *a.dense[i], &y = *b.dense[i];
      if (!x.data) continue;
      ASSERT_TRUE(y.data != nullptr) << i;
      EXPECT_EQ(x.rows, y.rows);
      EXPECT_EQ(x.cols, y.cols);
      EXPECT_EQ(x.format, y.format);
      EXPECT_EQ(x.dtype, y.dtype);
      const bool matrix = x.rows > 1;
      matrices += matrix;
      EXPECT_EQ(y.placed_on, matrix ? static_cast<const Backend*>(&dev) : nullptr) << "weight " << i;
      EXPECT_EQ(x.placed_on, nullptr);
      const size_t bytes = wformat_data_bytes(x.format, x.rows, x.cols);
      EXPECT_EQ(std::memcmp(x.data, y.data, bytes), 0) << "weight " << i << " [" << x.rows << ", " << x.cols << "]";
      if (const size_t ns = wformat_scale_count(x.format, x.rows, x.cols)) {
        EXPECT_EQ(std::memcmp(x.scale, y.scale, ns * 4), 0) << "scale of weight " << i;
      }
    }
    EXPECT_EQ(dev.placed, matrices);
    EXPECT_GT(matrices, 20);
    // The host arena holds only vectors (and the derived AttnRes mixes): far below the matrices.
    EXPECT_LT(placed->weights.arena.size(), host->weights.arena.size());
    EXPECT_LT(host_elements(b.dense) * 5, host_elements(a.dense)) << "a host copy of the matrices is left";
    // Logits bit-identical: the placed bytes are the host loader's, the same CPU kernels read them.
    CpuBackend cpu;
    const auto want = logits_of(*host, cpu);
    const auto got = logits_of(*placed, dev);
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "logits differ";
  }
}

TEST(LoadPlace, ProgressCountsTheStoredDenseBytes) {
  uint64_t last = 0, total = 0;
  int calls = 0;
  bool monotone = true;
  LoadOptions lo;
  lo.progress = [&](uint64_t done, uint64_t t) {
    monotone = monotone && done > last && done <= t && (total == 0 || t == total);
    last = done, total = t, ++calls;
  };
  const auto m = load_model(test::golden_dir(), {}, lo);
  EXPECT_TRUE(monotone);
  EXPECT_EQ(last, total);
  // The total is the stored bytes of every dense tensor of the table (the golden stores most as
  // BF16, a few as F32), found here through the checkpoint headers.
  Checkpoint ck(test::golden_dir());
  ModelWeights w;
  uint64_t stored = 0;
  for_each_tensor(ck.config(), w, [&](const TensorSpec& s) {
    if (!s.is_expert()) stored += ck.require(s.name, s.alt_name).info->nbytes;
  });
  EXPECT_EQ(total, stored);
  // ... and equals the elements the model holds at their stored width.
  std::set<const DenseWeight*> derived = {&m->weights.out_mix};  // AttnRes mixes: computed, not stored
  for (const LayerWeights& l : m->weights.layers) derived.insert({&l.attn_mix, &l.mlp_mix});
  uint64_t elems = 0;
  for (const DenseWeight* d : weight_list(m->weights).dense)
    if (d->data && !derived.count(d)) elems += uint64_t(d->rows * d->cols);
  EXPECT_GE(total, 2 * elems);
  EXPECT_LE(total, 4 * elems);
  EXPECT_GT(calls, 20);
}

TEST(LoadPlace, BackendThatDoesNotPlaceIsRefused) {
  CpuBackend cpu;
  LoadOptions lo;
  lo.place_on = &cpu;
  try {
    load_model(test::golden_dir(), {}, lo);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not place weights"), std::string::npos) << e.what();
  }
}

std::string load_error(const std::string& dir, const char* preset, Backend* place_on) {
  LoadOptions lo;
  lo.place_on = place_on;
  try {
    load_model(dir, QuantPlan::preset(preset), lo);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A NaN in a placed matrix is refused naming the tensor: checked by the loader for the formats it
// converts (q8, q4: the same message as the host loader's, element included), by the backend at
// place_finish for float data it takes as stored (exact: upcast to f32; bf16: kept as it is).
TEST(LoadPlace, NonFiniteMatrixIsRefusedNamingTheTensor) {
  const std::string name = "language_model.model.layers.0.self_attn.q_proj.weight";  // [128, 128], Attn class
  const std::string dir = test::patched_golden_copy("load_place_nan", name, 2 * (3 * 128 + 5), std::string("\xc0\x7f", 2));
  CpuBackend inner;
  for (const char* preset : {"bf16", "q8", "q4", "exact"}) {
    SCOPED_TRACE(preset);
    test::WrappedBackend dev(inner);
    dev.place = true;
    const std::string host = load_error(dir, preset, nullptr), placed = load_error(dir, preset, &dev);
    EXPECT_NE(host.find("tensor '" + name + "'"), std::string::npos) << host;
    EXPECT_NE(host.find("element 389 (row 3, column 5) is nan"), std::string::npos) << host;
    EXPECT_NE(placed.find("tensor '" + name + "'"), std::string::npos) << placed;
    EXPECT_NE(placed.find("finite"), std::string::npos) << placed;
    const std::string p = preset;
    if (p == "q8" || p == "q4") {
      EXPECT_EQ(placed, host) << "the loader's own check, same message";
    }
  }
}

// The weights were placed on the "device" that fails: the runner's fallback runs on the CPU with
// a host copy of the model (Runner::set_fallback_with_model), and the logits are the CPU's.
TEST(LoadPlace, FallbackRunsOnAHostCopyOfThePlacedModel) {
  CpuBackend inner;
  test::WrappedBackend dev(inner);
  dev.place = true;
  LoadOptions lo;
  lo.place_on = &dev;
  const auto placed = load_model(test::golden_dir(), {}, lo);
  std::unique_ptr<Model> host;
  int calls = 0;
  dev.before = [&](const char*) {
    if (++calls == 40) throw DeviceError("injected device fault");
  };
  Runner r(*placed, dev);
  r.set_fallback_with_model([&] {
    host = load_model(test::golden_dir());
    return Runner::Fallback{std::make_unique<CpuBackend>(), host.get()};
  });
  testing::internal::CaptureStderr();
  const auto got = logits_of(*placed, dev, &r);
  testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.on_fallback());
  ASSERT_TRUE(host != nullptr);
  EXPECT_EQ(&r.model(), host.get()) << "the runner reports the model its backend reads";
  CpuBackend cpu;
  const auto want = logits_of(*host, cpu);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0);
}

}  // namespace
}  // namespace wren
