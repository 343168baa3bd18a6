// The expert store: bit-identical outputs at every cache budget (one expert up to all resident),
// statistics, O_DIRECT/buffered equality, and faults (read error, short read, shard truncated
// after start-up, scale byte 255) turned into errors naming the file and the expert.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/sizes.h"
#include "model/forward.h"
#include "runtime/expert_store.h"
#include "synth/synth.h"
#include "test_util.h"

namespace wren {
namespace {

std::vector<int> prompt_ids(int n, int vocab) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back((97 * i + 13) % vocab);
  return ids;
}

/// Teacher-forced logits with `src` as the expert source (null = the mappings), chunk 4, then two
/// decode steps, on the CPU backend with options `o` (default: the reference, one thread).
std::vector<float> run_logits(const Model& m, ExpertSource* src, const std::vector<int>& ids,
                              const CpuOptions& o = {}) {
  CpuBackend be(o, src);
  Forward fwd(m, be, {4, -1});
  SequenceState st(be, m.config, 64);
  const size_t V = m.config.vocab;
  std::vector<float> out((ids.size() + 2) * V);
  fwd.run(st, ids.data(), nullptr, int(ids.size()), out.data(), true);
  for (int k = 0; k < 2; ++k) fwd.run(st, &ids[k], nullptr, 1, out.data() + (ids.size() + k) * V, false);
  return out;
}

ExpertStoreOptions budget(const Config& c, int n_experts) {
  ExpertStoreOptions o;
  o.cache_bytes = uint64_t(n_experts) * c.expert_bytes();
  o.loader_threads = 3;
  return o;
}

/// Many experts: 64 per layer, top-8, three MoE layers.
nlohmann::json many_experts() {
  return test::golden_config({{"num_hidden_layers", 4}, {"num_experts", 64}, {"num_experts_per_token", 8},
                              {"linear_attn_config", {{"kda_layers", {1, 2, 3}}, {"full_attn_layers", {4}}}}});
}

class StoreModels : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("store"));
    SynthOptions o;
    o.seed = 5;
    o.shard_bytes = 400'000;
    write_synthetic_checkpoint(many_experts(), *dir_, o);
    models_[0] = load_model(test::golden_dir()).release();
    models_[1] = load_model(*dir_).release();
  }
  static void TearDownTestSuite() {
    delete models_[0];
    delete models_[1];
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
  static Model* models_[2];
};
std::string* StoreModels::dir_ = nullptr;
Model* StoreModels::models_[2] = {nullptr, nullptr};

TEST_P(StoreModels, BitIdenticalAtEveryBudget) {
  const Model& m = *models_[GetParam()];
  const Config& c = m.config;
  const auto ids = prompt_ids(11, c.vocab);
  const auto want = run_logits(m, nullptr, ids);
  const int all = c.n_experts * (c.n_layers - c.first_dense);
  for (int n : {1, 2, c.top_k, c.top_k + 3, all / 2, all}) {
    ExpertStore store(m.weights, c.expert_bytes(), budget(c, n));
    const auto got = run_logits(m, &store, ids);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << "budget " << n << " experts";
    EXPECT_EQ(store.slots(), std::min(n, all));
    EXPECT_GT(store.stats().misses, 0u);
  }
}

TEST_P(StoreModels, BitIdenticalAtEveryBudgetWithThreads) {
  // The fast kernels with 3 threads and every op through the pool: the experts a source hands
  // over together run concurrently (all of them from the mappings, the resident ones from the
  // store), so this checks that results depend neither on the batching nor on the thread count.
  const Model& m = *models_[GetParam()];
  const Config& c = m.config;
  const auto ids = prompt_ids(11, c.vocab);
  CpuOptions one;
  one.isa = cpu::best_isa();
  CpuOptions three = one;
  three.threads = 3;
  three.min_parallel_work = 0;
  const auto want = run_logits(m, nullptr, ids, one);
  EXPECT_EQ(0, std::memcmp(run_logits(m, nullptr, ids, three).data(), want.data(), want.size() * 4));
  const int all = c.n_experts * (c.n_layers - c.first_dense);
  for (int n : {1, c.top_k + 3, all}) {
    ExpertStore store(m.weights, c.expert_bytes(), budget(c, n));
    run_logits(m, &store, ids, three);  // the second pass finds residents (all of them at n = all)
    const auto got = run_logits(m, &store, ids, three);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << "budget " << n << " experts";
  }
}

TEST_P(StoreModels, EverythingResidentHitsOnRepeat) {
  const Model& m = *models_[GetParam()];
  const Config& c = m.config;
  const auto ids = prompt_ids(9, c.vocab);
  ExpertStore store(m.weights, c.expert_bytes(), budget(c, c.n_experts * c.n_layers));
  run_logits(m, &store, ids);
  const ExpertStoreStats first = store.stats();
  // Every read is a miss or a prefetch of the next layer's guessed experts (ForwardOptions::predict).
  EXPECT_EQ(first.bytes_read, (first.misses + first.prefetch_issued) * uint64_t(c.expert_bytes()));
  EXPECT_GT(first.prefetch_issued, 0u);
  EXPECT_EQ(first.evictions, 0u);
  store.reset_stats();
  run_logits(m, &store, ids);
  EXPECT_EQ(store.stats().misses, 0u);
  EXPECT_EQ(store.stats().hit_rate(), 1.0);
}

TEST_P(StoreModels, DirectAndBufferedReadsAgree) {
  const Model& m = *models_[GetParam()];
  const Config& c = m.config;
  const auto ids = prompt_ids(7, c.vocab);
  ExpertStoreOptions a = budget(c, 5), b = budget(c, 5);
  a.direct = DirectIo::Auto;  // O_DIRECT where the filesystem allows it
  b.direct = DirectIo::Off;
  ExpertStore sa(m.weights, c.expert_bytes(), a), sb(m.weights, c.expert_bytes(), b);
  const auto x = run_logits(m, &sa, ids), y = run_logits(m, &sb, ids);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Models, StoreModels, ::testing::Values(0, 1),
                         [](const auto& i) { return i.param == 0 ? std::string("golden") : std::string("many_experts"); });

/// Runs one forward on a store with `o` and returns the error text ("" if none).
std::string error_of(const Model& m, const ExpertStoreOptions& o) {
  try {
    ExpertStore store(m.weights, m.config.expert_bytes(), o);
    run_logits(m, &store, prompt_ids(5, m.config.vocab));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StoreFaults, ReadErrorNamesFileAndExpert) {
  auto m = load_model(test::golden_dir());
  ExpertStoreOptions o = budget(m->config, 4);
  std::atomic<int> calls{0};  // every read from the third on fails with EIO (the third alone may be
                              // a prefetch, which is read again on demand)
  o.pread_hook = [&](int fd, void* buf, size_t n, uint64_t off) -> long {
    if (++calls >= 3) {
      errno = EIO;
      return -1;
    }
    return long(::pread(fd, buf, n, off_t(off)));
  };
  const std::string err = error_of(*m, o);
  EXPECT_NE(err.find("read failed: Input/output error"), std::string::npos) << err;
  EXPECT_NE(err.find(".safetensors: expert 'language_model.model.layers."), std::string::npos) << err;
}

TEST(StoreFaults, ShortReadIsAnError) {
  auto m = load_model(test::golden_dir());
  ExpertStoreOptions o = budget(m->config, 4);
  o.loader_threads = 1;
  bool first = true;  // each expert read: 100 bytes, then end of file
  o.pread_hook = [&](int fd, void* buf, size_t, uint64_t off) -> long {
    first = !first;
    return first ? 0 : long(::pread(fd, buf, 100, off_t(off)));
  };
  const std::string err = error_of(*m, o);
  EXPECT_NE(err.find("short read, got 100 of"), std::string::npos) << err;
  EXPECT_NE(err.find("block_sparse_moe.experts."), std::string::npos) << err;
}

TEST(StoreFaults, ShardTruncatedAfterStartUp) {
  const std::string dir = test::temp_dir("trunc");
  for (const auto& f : std::filesystem::directory_iterator(test::golden_dir()))
    if (f.is_regular_file()) std::filesystem::copy_file(f.path(), dir + "/" + f.path().filename().string());
  auto m = load_model(dir);  // dense weights are copied at load; experts are not read yet
  const std::string shard = dir + "/model-00002-of-000004.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 3);
  ExpertStoreOptions o = budget(m->config, 200);
  o.direct = DirectIo::Off;
  const std::string err = error_of(*m, o);
  EXPECT_NE(err.find("model-00002-of-000004.safetensors: expert '"), std::string::npos) << err;
  EXPECT_NE(err.find("file truncated?"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

TEST(StoreFaults, ScaleByte255IsRejectedOnLoad) {
  auto m = load_model(test::golden_dir());
  ExpertStoreOptions o = budget(m->config, 3);
  o.pread_hook = [](int fd, void* buf, size_t n, uint64_t off) -> long {
    const long r = long(::pread(fd, buf, n, off_t(off)));
    if (r > 2100) static_cast<uint8_t*>(buf)[2048 + 5] = 255;  // w1.weight_scale, row 2, group 1
    return r;
  };
  const std::string err = error_of(*m, o);
  EXPECT_NE(err.find("w1.weight_scale': row 2, group 1: ue8m0 scale byte 255"), std::string::npos) << err;
}

TEST(StoreOptions, ParseSizeAndBudgetErrors) {
  EXPECT_EQ(parse_size("8G", "x"), 8'000'000'000u);
  EXPECT_EQ(parse_size("512M", "x"), 512'000'000u);
  EXPECT_EQ(parse_size("1.5K", "x"), 1500u);
  EXPECT_EQ(parse_size("2GiB", "x"), 2147483648u);
  EXPECT_EQ(parse_size("1234", "x"), 1234u);
  EXPECT_THROW(parse_size("lots", "--expert-cache"), Error);
  EXPECT_THROW(parse_size("5Q", "--expert-cache"), Error);
  auto m = load_model(test::golden_dir());
  ExpertStoreOptions o;
  o.cache_bytes = 100;
  EXPECT_THROW(ExpertStore(m->weights, m->config.expert_bytes(), o), Error);
}

}  // namespace
}  // namespace wren
