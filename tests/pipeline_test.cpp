// Pipeline parallelism by layers (model/pipeline.h, docs/parallel.md): the stage split itself, and
// the in-process pipeline against the single-stage forward. On the CPU every stage runs the same ops
// on the same inputs, so greedy ids and logits must be bit-identical for any split (2 and 3 stages,
// uneven splits, one layer per stage), on K3 (AttnRes: snapshots cross the boundaries) and on Kimi
// Linear (plain residual). CudaPipeline (GPU only, skipped without one): two CUDA stages on one
// device, each holding only its layers' weights, against the unsplit CUDA run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/pipeline.h"
#include "model/weights.h"
#include "runtime/backend_factory.h"
#include "runtime/rank_pipeline.h"
#include "backends/cuda/nccl_transport.h"
#include "test_util.h"
#ifdef WREN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace wren {
namespace {

int argmax(const float* v, int n) { return int(std::max_element(v, v + n) - v); }

/// Prefill `prompt` (all logits), then `steps` greedy decode steps: every logits row, in order.
std::vector<float> greedy_rows(TokenStep& step, SequenceState& st, const std::vector<int>& prompt, int steps) {
  const size_t V = step.config().vocab;
  std::vector<float> rows(prompt.size() * V);
  step.run(st, prompt.data(), nullptr, int(prompt.size()), rows.data(), true);
  for (int s = 0; s < steps; ++s) {
    const int id = argmax(&rows[rows.size() - V], int(V));
    rows.resize(rows.size() + V);
    step.run(st, &id, nullptr, 1, &rows[rows.size() - V], false);
  }
  return rows;
}

TEST(PipelinePlan, EvenSplitsDifferByAtMostOneLayer) {
  const StagePlan p = plan_stages(10, 3, StageSplit::Even);
  EXPECT_EQ(p.bounds, (std::vector<int>{0, 4, 7, 10}));
  EXPECT_EQ(p.describe(), "3 stages: layers 0-3 | 4-6 | 7-9");
  EXPECT_EQ(p.stage_of(0), 0);
  EXPECT_EQ(p.stage_of(6), 1);
  EXPECT_EQ(p.stage_of(9), 2);
  EXPECT_EQ(plan_stages(4, 4, StageSplit::Even).bounds, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(plan_stages(5, 1, StageSplit::Even).bounds, (std::vector<int>{0, 5}));
}

TEST(PipelinePlan, ByteSplitBalancesHeavyLayers) {
  // One light dense layer then heavy MoE layers: the first stage takes more layers.
  const std::vector<uint64_t> b{1, 10, 10, 10, 10, 1, 1};
  const StagePlan p = plan_stages(7, 2, StageSplit::Bytes, b);
  EXPECT_EQ(p.bounds, (std::vector<int>{0, 3, 7}));  // 21 | 22
  // Every stage keeps at least one layer even when one layer is most of the bytes.
  const StagePlan q = plan_stages(3, 3, StageSplit::Bytes, {100, 1, 1});
  EXPECT_EQ(q.bounds, (std::vector<int>{0, 1, 2, 3}));
  const StagePlan r = plan_stages(4, 2, StageSplit::Bytes, {1, 1, 1, 100});
  EXPECT_EQ(r.bounds, (std::vector<int>{0, 3, 4}));
}

TEST(PipelinePlan, ParsesCountsAndExplicitStagesAndRejectsBadOnes) {
  EXPECT_EQ(parse_pipeline("2", 10, StageSplit::Even, {}).bounds, (std::vector<int>{0, 5, 10}));
  EXPECT_EQ(parse_pipeline("3+2+5", 10, StageSplit::Even, {}).bounds, (std::vector<int>{0, 3, 5, 10}));
  for (const char* bad : {"", "0", "11", "3+3", "3+0+7", "a", "2,3", "+10", "10+", "-1"})
    EXPECT_THROW(parse_pipeline(bad, 10, StageSplit::Even, {}), Error) << "'" << bad << "'";
  EXPECT_EQ(parse_stage_split("bytes"), StageSplit::Bytes);
  EXPECT_THROW(parse_stage_split("layers"), Error);
}

TEST(PipelinePlan, LayerBytesCoverEveryLayer) {
  const auto m = load_model(test::golden_dir());
  const Config& c = m->config;
  const std::vector<uint64_t> b = layer_bytes(c);
  ASSERT_EQ(int(b.size()), c.n_layers);
  uint64_t total = 0;
  for (uint64_t x : b) {
    EXPECT_GT(x, 0u);
    total += x;
  }
  // The byte split of the golden model gives each of 2 stages a share within one layer of half.
  const StagePlan p = plan_stages(c.n_layers, 2, StageSplit::Bytes, b);
  uint64_t first = 0, biggest = *std::max_element(b.begin(), b.end());
  for (int i = 0; i < p.end(0); ++i) first += b[size_t(i)];
  EXPECT_LE(first > total / 2 ? first - total / 2 : total / 2 - first, biggest);
}

class Pipeline : public ::testing::TestWithParam<const char*> {};

/// Every split of interest of an n-layer model: 2 and 3 even stages, uneven ones, one layer per stage.
std::vector<std::string> splits(int n) {
  std::vector<std::string> out{"2", "3", "1+" + std::to_string(n - 1), std::to_string(n - 2) + "+1+1"};
  std::string each = "1";
  for (int i = 1; i < n; ++i) each += "+1";
  out.push_back(each);
  return out;
}

TEST_P(Pipeline, CpuStagesEqualTheSingleStageForwardBitForBit) {
  const auto m = load_model(std::string(GetParam()) == "k3" ? test::golden_dir() : test::kimi_linear_dir());
  const Config& c = m->config;
  const std::vector<int> prompt = test::some_ids(11, c.vocab, 7);
  const int steps = 6;
  CpuBackend one;
  Forward whole(*m, one, {4, -1});  // chunk 4: the 11-token prompt crosses chunk boundaries
  SequenceState st(one, c, 64);
  const std::vector<float> want = greedy_rows(whole, st, prompt, steps);
  for (const std::string& spec : splits(c.n_layers)) {
    SCOPED_TRACE("--pipeline " + spec);
    const StagePlan plan = parse_pipeline(spec, c.n_layers, StageSplit::Even, {});
    std::vector<std::unique_ptr<CpuBackend>> owned;
    std::vector<Backend*> bs;
    for (int s = 0; s < plan.stages(); ++s) owned.push_back(std::make_unique<CpuBackend>()), bs.push_back(owned.back().get());
    PipelineForward pipe(*m, bs, plan, {4, -1});
    auto pst = pipe.new_sequence(64);
    for (int i = 0; i < c.n_layers; ++i) EXPECT_EQ(pst->layer_backend(i), bs[size_t(plan.stage_of(i))]);
    const std::vector<float> got = greedy_rows(pipe, *pst, prompt, steps);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    EXPECT_EQ(pst->position(), int(prompt.size()) + steps);
    // What crossed: per token and boundary, P plus the snapshots taken before it.
    uint64_t per_token = 0;
    for (int s = 1; s < plan.stages(); ++s) per_token += uint64_t(1 + Forward::snapshots_before(c, plan.first(s))) * c.hidden;
    EXPECT_EQ(pipe.transport().floats_sent(), per_token * (prompt.size() + steps));
  }
}

TEST_P(Pipeline, CpuBatchedDecodeEqualsTheSingleStage) {
  const auto m = load_model(std::string(GetParam()) == "k3" ? test::golden_dir() : test::kimi_linear_dir());
  const Config& c = m->config;
  const size_t V = c.vocab;
  CpuBackend one, a, b, d;
  Forward whole(*m, one, {8, -1});
  PipelineForward pipe(*m, {&a, &b, &d}, parse_pipeline("3", c.n_layers, StageSplit::Even, {}), {8, -1});
  const int B = 3;
  std::vector<std::unique_ptr<SequenceState>> ws, ps;
  std::vector<SequenceState*> wp, pp;
  std::vector<int> ids;
  for (int i = 0; i < B; ++i) {
    const std::vector<int> p = test::some_ids(2 + 3 * i, c.vocab, 20 + i);
    ws.push_back(std::make_unique<SequenceState>(one, c, 64));
    ps.push_back(pipe.new_sequence(64));
    std::vector<float> r1(V), r2(V);
    whole.run(*ws.back(), p.data(), nullptr, int(p.size()), r1.data(), false);
    pipe.run(*ps.back(), p.data(), nullptr, int(p.size()), r2.data(), false);
    ASSERT_EQ(std::memcmp(r1.data(), r2.data(), V * sizeof(float)), 0);
    ids.push_back(argmax(r1.data(), int(V)));
    wp.push_back(ws.back().get()), pp.push_back(ps.back().get());
  }
  for (int step = 0; step < 4; ++step) {
    std::vector<float> l1(B * V), l2(B * V);
    whole.run_batch(wp.data(), ids.data(), B, l1.data());
    pipe.run_batch(pp.data(), ids.data(), B, l2.data());
    ASSERT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << "step " << step;
    for (int i = 0; i < B; ++i) ids[size_t(i)] = argmax(&l1[size_t(i) * V], int(V));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Pipeline, ::testing::Values("k3", "kimi-linear"));

TEST(PipelineErrors, MismatchedStatesAndBadPlansAreRefused) {
  const auto m = load_model(test::golden_dir());
  const Config& c = m->config;
  CpuBackend a, b;
  PipelineForward pipe(*m, {&a, &b}, plan_stages(c.n_layers, 2, StageSplit::Even), {});
  SequenceState unsplit(a, c, 16);  // all layers on stage 0's backend: stage 1 refuses it
  const int id = 5;
  EXPECT_THROW(pipe.run(unsplit, &id, nullptr, 1, nullptr, false), Error);
  const StagePlan two = plan_stages(c.n_layers, 2, StageSplit::Even), short_two = plan_stages(c.n_layers - 1, 2, StageSplit::Even);
  EXPECT_THROW({ PipelineForward p(*m, {&a}, two, {}); }, Error);
  EXPECT_THROW({ PipelineForward p(*m, {&a, &b}, short_two, {}); }, Error);
  ForwardOptions later;
  later.first_layer = 3;  // a later stage without a transport
  EXPECT_THROW({ Forward f(*m, a, later); }, Error);
  InProcessTransport t(2);
  std::vector<float> buf(4);
  EXPECT_THROW(t.recv(a, buf.data(), 4, 0), Error);  // nothing sent
  t.send(a, buf.data(), 4, 1);
  EXPECT_THROW(t.recv(b, buf.data(), 3, 0), Error);  // size mismatch
}

TEST(PipelineState, SplitStateSavesAndLoadsLikeTheUnsplitOne) {
  const auto m = load_model(test::golden_dir());
  const Config& c = m->config;
  CpuBackend one, a, b;
  Forward whole(*m, one, {});
  PipelineForward pipe(*m, {&a, &b}, plan_stages(c.n_layers, 2, StageSplit::Even), {});
  SequenceState st(one, c, 32);
  auto pst = pipe.new_sequence(32);
  const std::vector<int> p = test::some_ids(9, c.vocab, 3);
  whole.run(st, p.data(), nullptr, int(p.size()), nullptr, false);
  pipe.run(*pst, p.data(), nullptr, int(p.size()), nullptr, false);
  std::vector<float> d1, d2;
  std::vector<int> l1, l2;
  st.save(d1, l1);
  pst->save(d2, l2);
  EXPECT_EQ(l1, l2);
  ASSERT_EQ(d1.size(), d2.size());
  EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)), 0);
  auto copy = pipe.new_sequence(32);
  copy->load(d2, l2, p);
  copy->copy_from(*pst);
  const int id = 17;
  std::vector<float> r1(c.vocab), r2(c.vocab);
  pipe.run(*pst, &id, nullptr, 1, r1.data(), false);
  pipe.run(*copy, &id, nullptr, 1, r2.data(), false);
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)), 0);
}

/// The multi-process protocol with threads for processes: rank r's endpoint of a shared mailbox
/// (blocking recv with a timeout, so a protocol bug fails instead of hanging).
struct ThreadWorld {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> q;
};

class ThreadEndpoint final : public Transport {
 public:
  ThreadEndpoint(ThreadWorld& w, int rank, int world) : w_(w), rank_(rank), world_(world) {}
  void send(Backend& be, const float* buf, size_t n, int to) override {
    std::vector<float> v(n);
    be.to_host(buf, n, v.data());
    put(std::move(v), to);
  }
  void recv(Backend& be, float* buf, size_t n, int from) override {
    const std::vector<float> v = take(n, from);
    be.from_host(v.data(), n, buf);
  }
  void send_host(const int* v, size_t n, int to) override { put(std::vector<float>(v, v + n), to); }
  void recv_host(int* v, size_t n, int from) override {
    const std::vector<float> m = take(n, from);
    for (size_t i = 0; i < n; ++i) v[i] = int(m[i]);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  const char* name() const override { return "threads"; }

 private:
  void put(std::vector<float> v, int to) {
    std::lock_guard<std::mutex> l(w_.m);
    w_.q[{rank_, to}].push_back(std::move(v));
    w_.cv.notify_all();
  }
  std::vector<float> take(size_t n, int from) {
    std::unique_lock<std::mutex> l(w_.m);
    auto& q = w_.q[{from, rank_}];
    if (!w_.cv.wait_for(l, std::chrono::seconds(60), [&] { return !q.empty(); }))
      throw Error("thread transport: rank " + std::to_string(rank_) + " waited 60 s for rank " + std::to_string(from));
    std::vector<float> v = std::move(q.front());
    q.pop_front();
    check(v.size() == n, "thread transport: size mismatch");
    return v;
  }
  ThreadWorld& w_;
  int rank_, world_;
};

// Ranks 1.. run rank_worker_loop in threads (each its own CPU backend and state slice), rank 0
// drives through RankPipeline: two sequences one after the other (the workers reset between
// them), each prefill + greedy decode bit-identical to the single-stage forward.
TEST_P(Pipeline, MultiRankProtocolOnCpuThreadsEqualsTheSingleStage) {
  const auto m = load_model(std::string(GetParam()) == "k3" ? test::golden_dir() : test::kimi_linear_dir());
  const Config& c = m->config;
  CpuBackend one;
  Forward whole(*m, one, {4, -1});
  for (const std::string& spec : {std::string("2"), std::string("3"), "1+" + std::to_string(c.n_layers - 2) + "+1"}) {
    SCOPED_TRACE(spec);
    const StagePlan plan = parse_pipeline(spec, c.n_layers, StageSplit::Even, {});
    const int S = plan.stages();
    ThreadWorld world;
    std::vector<std::unique_ptr<ThreadEndpoint>> ends;
    for (int r = 0; r < S; ++r) ends.push_back(std::make_unique<ThreadEndpoint>(world, r, S));
    std::vector<std::unique_ptr<CpuBackend>> bes;
    for (int r = 0; r < S; ++r) bes.push_back(std::make_unique<CpuBackend>());
    std::vector<std::exception_ptr> errors(static_cast<size_t>(S));
    std::vector<std::thread> workers;
    for (int r = 1; r < S; ++r)
      workers.emplace_back([&, r] {
        try {
          rank_worker_loop(*m, *bes[size_t(r)], *ends[size_t(r)], plan, 64, {4, -1});
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    {
      RankPipeline lead(*m, *bes[0], *ends[0], plan, {4, -1});
      for (int seq = 0; seq < 2; ++seq) {
        const std::vector<int> prompt = test::some_ids(9 + seq, c.vocab, 40 + seq);
        SequenceState st(one, c, 64);
        const std::vector<float> want = greedy_rows(whole, st, prompt, 5);
        auto pst = lead.new_sequence(64);
        const std::vector<float> got = greedy_rows(lead, *pst, prompt, 5);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "sequence " << seq;
        EXPECT_EQ(pst->position(), int(prompt.size()) + 5);
      }
    }  // ~RankPipeline: Stop
    for (auto& w : workers) w.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
}

/// The file's bytes (empty when it cannot be read).
std::string file_bytes(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

// End to end through the CLI: `wren run --pipeline` (even, bytes, explicit) writes the same
// teacher-forced logits file and the same greedy ids as the unsplit run (the baseline command of
// the CPU logits hash), and the run header names the stages; inspect prints the per-stage plan.
TEST(PipelineCli, RunWithStagesWritesTheUnsplitLogits) {
  const std::string dir = test::temp_dir("pipeline-cli");
  const std::string base = "run --backend cpu --model " + test::golden_dir() +
                           " --ids 4096,976,2328,2258,328,2312,766,382 -n 8 --json --logits ";
  std::string out;
  const std::string limit = "timeout 120";  // a hang fails the test instead of stalling the suite
  ASSERT_EQ(test::run_wren(base + dir + "/one.f32 2>/dev/null", &out, limit), 0) << out;
  const std::string want_ids = out.substr(out.find("\"output_ids\""), out.find(']', out.find("\"output_ids\"")) -
                                                                            out.find("\"output_ids\""));
  const std::string want = file_bytes(dir + "/one.f32");
  ASSERT_FALSE(want.empty());
  int k = 0;
  for (const char* p : {"--pipeline 2", "--pipeline 3 --pipeline-split bytes", "--pipeline 1+8+1"}) {
    SCOPED_TRACE(p);
    const std::string f = dir + "/p" + std::to_string(k++) + ".f32";
    std::string o;
    ASSERT_EQ(test::run_wren(base + f + " " + p + " 2>" + f + ".err", &o, limit), 0) << o << file_bytes(f + ".err");
    EXPECT_EQ(file_bytes(f), want);
    EXPECT_NE(o.find(want_ids), std::string::npos) << o;
    const std::string all = o + file_bytes(f + ".err");  // run_wren may fold stderr into the output
    EXPECT_NE(all.find("wren: pipeline "), std::string::npos) << all;
  }
  ASSERT_NE(test::run_wren(base + dir + "/bad.f32 --pipeline 0 2>&1", &out, limit), 0);
  EXPECT_NE(out.find("--pipeline"), std::string::npos) << out;
  ASSERT_EQ(test::run_wren("inspect --model " + test::golden_dir() + " --pipeline 2 --pipeline-split bytes", &out, limit), 0)
      << out;
  EXPECT_NE(out.find("pipeline plan (bytes split): 2 stages"), std::string::npos) << out;
  EXPECT_NE(out.find("stage 1: layers"), std::string::npos) << out;
}

TEST(PipelineRanks, LauncherEnvironmentIsRead) {
  NcclWorldOptions w;
  unsetenv("RANK"), unsetenv("WORLD_SIZE"), unsetenv("LOCAL_RANK");
  unsetenv("OMPI_COMM_WORLD_RANK"), unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  EXPECT_FALSE(nccl_world_from_env("/tmp/x", &w));
  setenv("RANK", "1", 1), setenv("WORLD_SIZE", "2", 1), setenv("LOCAL_RANK", "1", 1);
  ASSERT_TRUE(nccl_world_from_env("/tmp/x", &w));
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.world, 2);
  EXPECT_EQ(w.device, 1);
  EXPECT_EQ(w.id_file, "/tmp/x");
  setenv("RANK", "2", 1);  // not below the world size
  EXPECT_THROW(nccl_world_from_env("", &w), Error);
  setenv("RANK", "one", 1);
  EXPECT_THROW(nccl_world_from_env("", &w), Error);
  unsetenv("RANK"), unsetenv("WORLD_SIZE"), unsetenv("LOCAL_RANK");
  setenv("OMPI_COMM_WORLD_RANK", "0", 1), setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  ASSERT_TRUE(nccl_world_from_env("", &w));
  EXPECT_EQ(w.world, 4);
  EXPECT_EQ(w.device, 0);
  unsetenv("OMPI_COMM_WORLD_RANK"), unsetenv("OMPI_COMM_WORLD_SIZE");
  if (!nccl_built()) {
    EXPECT_THROW({ NcclTransport t(NcclWorldOptions{}); }, Error);
  }
}

#ifdef WREN_HAVE_CUDA
// Two CUDA stages on one device (the in-process transport through host memory), each backend
// holding only its stage's weights (an op on another stage's weight would throw), against the
// unsplit CUDA run: the same kernels on the same inputs, so greedy ids must agree and the logits
// too (tolerance 1e-5 absolute: expected 0, reported).
TEST(CudaPipeline, TwoStagesOnOneGpuEqualTheUnsplitRun) {
  std::string why;
  if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const char* which : {"k3", "kimi-linear"}) {
    SCOPED_TRACE(which);
    const auto m = load_model(std::string(which) == "k3" ? test::golden_dir() : test::kimi_linear_dir());
    const Config& c = m->config;
    CudaBackend whole_be;
    whole_be.upload(weight_list(m->weights));
    const StagePlan plan = plan_stages(c.n_layers, 2, StageSplit::Even);
    CudaBackend s0, s1;
    s0.upload(weight_list(m->weights, plan.first(0), plan.end(0), true, false));
    s1.upload(weight_list(m->weights, plan.first(1), plan.end(1), false, true));
    Forward whole(*m, whole_be, {8, -1});
    PipelineForward pipe(*m, {&s0, &s1}, plan, {8, -1});
    const std::vector<int> prompt = test::some_ids(13, c.vocab, 5);
    SequenceState st(whole_be, c, 64);
    auto pst = pipe.new_sequence(64);
    const int steps = 8;
    const std::vector<float> want = greedy_rows(whole, st, prompt, steps);
    const std::vector<float> got = greedy_rows(pipe, *pst, prompt, steps);
    ASSERT_EQ(got.size(), want.size());
    const int V = c.vocab;
    double max_diff = 0;
    int same = 0;
    const int rows = int(want.size() / size_t(V));
    for (int r = 0; r < rows; ++r) same += argmax(&want[size_t(r) * V], V) == argmax(&got[size_t(r) * V], V);
    for (size_t i = 0; i < want.size(); ++i) max_diff = std::max(max_diff, double(std::abs(want[i] - got[i])));
    std::printf("[ cuda pipeline %s ] 2 stages (%s) vs unsplit: argmax equal %d/%d, logits max |diff| %.3g\n", which,
                plan.describe().c_str(), same, rows, max_diff);
    EXPECT_EQ(same, rows);
    EXPECT_LE(max_diff, 1e-5);
  }
}

// NCCL on one GPU (the only machine lent so far): a one-rank communicator sends random floats to
// itself (ncclSend + ncclRecv in one group) and they arrive unchanged; NCCL_NVLS_ENABLE is 0
// afterwards unless the environment had set it. Skips without a GPU, NCCL headers or libnccl.
TEST(CudaNccl, OneRankWorldSendsToItself) {
  std::string why;
  if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL transport (nccl.h not found at configure time)";
  const bool nvls_given = std::getenv("NCCL_NVLS_ENABLE") != nullptr;
  std::unique_ptr<NcclTransport> t;
  try {
    t = std::make_unique<NcclTransport>(NcclWorldOptions{});
  } catch (const Error& e) {
    if (std::string(e.what()).find("libnccl") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  if (!nvls_given) {
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  }
  CudaBackend be;
  const size_t n = 1000 * 1000 + 3;
  std::vector<float> h(n), back(n);
  for (size_t i = 0; i < n; ++i) h[i] = float(int((i * 2654435761u) % 20011) - 10005) / 97.0f;
  float* a = be.alloc(n);
  float* b = be.alloc(n);
  be.from_host(h.data(), n, a);
  t->self_exchange(a, b, n);
  be.to_host(b, n, back.data());
  EXPECT_EQ(std::memcmp(h.data(), back.data(), n * sizeof(float)), 0);
  be.release(a), be.release(b);
  std::printf("[ cuda nccl ] 1-rank world: %zu floats through ncclSend/ncclRecv to self, equal\n", n);
}
#endif

}  // namespace
}  // namespace wren
