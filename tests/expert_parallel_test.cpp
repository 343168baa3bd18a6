// Expert parallelism (model/expert_parallel.h, ops/thread_transport.h) on the CPU, threads as
// ranks: the shard and its parser; one routed MoE layer with the tokens spread over 1-4 ranks
// (uneven expert blocks, ranks with no tokens, ranks that own no chosen expert, a pure serving
// rank) equal to Backend::routed_moe on all tokens bit for bit; the whole forward (prefill, T = 1
// decode, batched decode) with its experts on 2-4 ranks equal to the single-rank forward bit for
// bit, on k3-tiny-a (MXFP4 experts) and kimi-linear-tiny (dense experts), with one or two ranks
// driving sequences; the errors (bad shard, ranks out of step, a silent peer).
#include <gtest/gtest.h>

#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/expert_parallel.h"
#include "model/forward.h"
#include "model/load.h"
#include "ops/thread_transport.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace wren {
namespace {

/// Runs fn(rank) on `world` threads; a rank that throws aborts the world (so its peers stop
/// waiting) and the first error is rethrown here after every thread has joined.
void on_ranks(ThreadWorld& w, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(size_t(w.world()));
  std::vector<std::thread> th;
  for (int r = 0; r < w.world(); ++r)
    th.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = std::current_exception();
        w.abort("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(ExpertParallel, ShardCoversEveryExpertOnceInBalancedBlocks) {
  for (int E : {1, 7, 16, 896})
    for (int R : {1, 2, 3, 5, 8}) {
      if (R > E) continue;
      const ExpertShard s = shard_experts(E, R);
      EXPECT_EQ(s.first(0), 0);
      EXPECT_EQ(s.end(R - 1), E);
      for (int r = 0; r < R; ++r) {
        EXPECT_GE(s.end(r) - s.first(r), E / R);
        EXPECT_LE(s.end(r) - s.first(r), E / R + 1);
        for (int e = s.first(r); e < s.end(r); ++e) EXPECT_EQ(s.owner(e), r) << "E " << E << " R " << R << " e " << e;
      }
    }
  EXPECT_EQ(shard_experts(16, 3).describe(), "3 ranks: experts 0-5 | 6-10 | 11-15");
  EXPECT_THROW(shard_experts(4, 5), UsageError);
  EXPECT_THROW(shard_experts(4, 0), UsageError);
  const int bad[2] = {0, 9};
  EXPECT_THROW(plan_dispatch(shard_experts(8, 2), bad, 1, 2), Error);
}

TEST(ExpertParallel, ParsesRankCountsAndUnevenBlocks) {
  EXPECT_EQ(parse_expert_shard("2", 16).bounds, (std::vector<int>{0, 8, 16}));
  const ExpertShard u = parse_expert_shard("1+3+12", 16);
  EXPECT_EQ(u.bounds, (std::vector<int>{0, 1, 4, 16}));
  EXPECT_EQ(u.owner(0), 0);
  EXPECT_EQ(u.owner(1), 1);
  EXPECT_EQ(u.owner(3), 1);
  EXPECT_EQ(u.owner(4), 2);
  EXPECT_EQ(u.owner(15), 2);
  for (const char* bad : {"", "0", "17", "abc", "2x", "1+2", "0+16", "8++8", "+16", "16+", "-2", "9999999"})
    EXPECT_THROW(parse_expert_shard(bad, 16), UsageError) << bad;
  EXPECT_THROW(parse_expert_shard("1", 0), UsageError);
}

/// The first MoE layer of `c`.
int first_moe(const Config& c) {
  for (int i = 0; i < c.n_layers; ++i)
    if (c.layers[size_t(i)].ffn == Ffn::MoE) return i;
  return -1;
}

RoutedMoeParams params_of(const Config& c, int layer) {
  return RoutedMoeParams{layer, c.n_experts, c.top_k, c.expert_io(), c.routed_scale, c.situ_b1, c.situ_b2,
                         c.expert_format, c.act, c.moe_inter};
}

// One MoE layer of each model with its T tokens split over the ranks (counts per rank below, 0 =
// a rank that runs the layer with no tokens; -1 = a rank that only serves), each rank running
// ExpertParallelMoe::run on its rows in its own thread and CPU backend: every rank's output rows
// equal Backend::routed_moe over all T tokens bit for bit. Two layers in a row per round, so the
// scratch is reused with other counts.
TEST(ExpertParallel, ThreadRanksMoeLayerEqualsTheRoutedMoeOp) {
  struct Case {
    std::string shard;
    std::vector<int> tokens;  // per rank
  };
  for (const char* which : {"k3", "kimi-linear"}) {
    SCOPED_TRACE(which);
    const auto m = load_model(std::string(which) == "k3" ? test::golden_dir() : test::kimi_linear_dir());
    const Config& c = m->config;
    const int E = c.n_experts, K = c.top_k, io = c.expert_io(), D = c.hidden;
    const std::string half = std::to_string(E / 2);
    const std::vector<Case> cases = {
        {"1", {5}},
        {"2", {1, 0}},             // T = 1 on rank 0, rank 1 has no tokens
        {"2", {0, 1}},
        {"2", {3, 4}},
        {"3", {7, -1, 2}},         // a serving rank in the middle
        {"1+1+" + std::to_string(E - 2), {2, 6, 1}},  // uneven blocks: one expert each on ranks 0 and 1
        {half + "+" + half, {0, 3}},
        {"4", {1, 0, 0, 0}},       // T = 1: at most k of the experts chosen, some ranks get nothing
        {"4", {9, 0, 17, 2}},
    };
    int zero_seen = 0;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& cs = cases[ci];
      const std::string& spec = cs.shard;
      SCOPED_TRACE("shard " + spec + " case " + std::to_string(ci));
      const ExpertShard shard = parse_expert_shard(spec, E);
      const int R = shard.ranks();
      ASSERT_EQ(int(cs.tokens.size()), R);
      int T = 0;
      for (int t : cs.tokens) T += std::max(t, 0);
      std::mt19937 g(unsigned(100 + ci));
      // The reference: every token on one backend, layer by layer (two MoE layers).
      std::vector<int> layers;
      for (int i = 0; i < c.n_layers && layers.size() < 2; ++i)
        if (c.layers[size_t(i)].ffn == Ffn::MoE) layers.push_back(i);
      std::vector<std::vector<float>> x(layers.size()), want(layers.size());
      std::vector<std::vector<float>> logits(layers.size()), z(layers.size());
      CpuBackend ref;
      for (size_t li = 0; li < layers.size(); ++li) {
        const MoeWeights& mw = m->weights.layers[size_t(layers[li])].moe;
        x[li] = test::random_vec(g, size_t(T) * D);
        logits[li].resize(size_t(T) * E), z[li].resize(size_t(T) * io), want[li].resize(size_t(T) * io);
        ref.gemm(mw.router, x[li].data(), T, logits[li].data());
        if (c.moe_kind == MoeKind::Latent) ref.gemm(mw.down, x[li].data(), T, z[li].data());
        else z[li] = x[li];
        std::vector<float> ys(size_t(T) * K * io), gu(size_t(c.moe_inter) * 3);
        ref.routed_moe(params_of(c, layers[li]), mw, logits[li].data(), z[li].data(), T,
                       RoutedMoeWork{ys.data(), gu.data(), gu.data() + c.moe_inter, gu.data() + 2 * c.moe_inter},
                       want[li].data());
      }
      ThreadWorld world(R, 30);
      std::vector<uint64_t> got_rows(size_t(R), 0);
      on_ranks(world, [&](int r) {
        CpuBackend be;
        ThreadTransport t(world, r);
        ExpertParallelMoe ep(c, be, t, shard);
        int t0 = 0;
        for (int q = 0; q < r; ++q) t0 += std::max(cs.tokens[size_t(q)], 0);
        const int n = cs.tokens[size_t(r)];
        for (size_t li = 0; li < layers.size(); ++li) {
          if (n < 0) {
            ASSERT_TRUE(ep.serve(*m));
            continue;
          }
          const MoeWeights& mw = m->weights.layers[size_t(layers[li])].moe;
          std::vector<float> ys(size_t(std::max(n, 1)) * K * io), gu(size_t(c.moe_inter) * 3), out(size_t(n) * io);
          ep.run(params_of(c, layers[li]), mw, logits[li].data() + size_t(t0) * E, z[li].data() + size_t(t0) * io, n,
                 RoutedMoeWork{ys.data(), gu.data(), gu.data() + c.moe_inter, gu.data() + 2 * c.moe_inter}, out.data());
          // A rank with no tokens has an empty `out` (data() may be null: memcmp's arguments must not be).
          EXPECT_TRUE(out.empty() || std::memcmp(out.data(), want[li].data() + size_t(t0) * io, out.size() * sizeof(float)) == 0)
              << "rank " << r << " layer " << layers[li];
        }
        got_rows[size_t(r)] = ep.rows_received();
        if (r == 0) ep.stop();
        else if (n < 0) EXPECT_FALSE(ep.serve(*m));  // rank 0's stop
        else {
          ExpertParallelMoe tail(c, be, t, shard);
          EXPECT_FALSE(tail.serve(*m));
        }
      });
      for (int r = 0; r < R; ++r) zero_seen += got_rows[size_t(r)] == 0 && R > 1;
    }
    EXPECT_GT(zero_seen, 0) << "no case had a rank that received no rows";
  }
}

/// Greedy rows: prefill `prompt` with every row's logits, then `steps` T = 1 decode steps.
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

/// Batched decode of `B` sequences (each prefilled with its own prompt first), `steps` rounds.
std::vector<float> batched_rows(TokenStep& step, const Config& c, int B, int steps, int seed) {
  const size_t V = c.vocab;
  std::vector<std::unique_ptr<SequenceState>> sts;
  std::vector<SequenceState*> ptr;
  std::vector<int> ids(static_cast<size_t>(B));
  std::vector<float> out(size_t(B) * V), all;
  for (int b = 0; b < B; ++b) {
    sts.push_back(std::make_unique<SequenceState>(step.backend(), c, 64));
    ptr.push_back(sts.back().get());
    const std::vector<int> p = test::some_ids(3 + b, c.vocab, seed + b);
    step.run(*sts.back(), p.data(), nullptr, int(p.size()), out.data(), false);
    ids[size_t(b)] = argmax(out.data(), int(V));
  }
  for (int s = 0; s < steps; ++s) {
    step.run_batch(ptr.data(), ids.data(), B, out.data());
    all.insert(all.end(), out.begin(), out.end());
    for (int b = 0; b < B; ++b) ids[size_t(b)] = argmax(out.data() + size_t(b) * V, int(V));
  }
  return all;
}

// The whole forward with its routed experts on R ranks: rank 0 runs the model (its Forward's
// MoE layers through ExpertParallelMoe), ranks 1.. run expert_worker_loop. Prefill in chunks of 4
// (9 tokens: 4 + 4 + 1), T = 1 greedy decode and batched decode of 3 sequences: every logit
// bit-identical to the single-rank forward.
TEST(ExpertParallel, ForwardWithExpertsOnRanksEqualsTheSingleRank) {
  for (const char* which : {"k3", "kimi-linear"}) {
    SCOPED_TRACE(which);
    const auto m = load_model(std::string(which) == "k3" ? test::golden_dir() : test::kimi_linear_dir());
    const Config& c = m->config;
    CpuBackend one;
    Forward whole(*m, one, {4, -1});
    const std::vector<int> prompt = test::some_ids(9, c.vocab, 5);
    SequenceState st(one, c, 64);
    const std::vector<float> want = greedy_rows(whole, st, prompt, 5);
    const std::vector<float> want_b = batched_rows(whole, c, 3, 3, 70);
    for (const std::string& spec : {std::string("2"), std::string("3"), "1+2+" + std::to_string(c.n_experts - 4) + "+1"}) {
      SCOPED_TRACE(spec);
      const ExpertShard shard = parse_expert_shard(spec, c.n_experts);
      ThreadWorld world(shard.ranks(), 30);
      on_ranks(world, [&](int r) {
        CpuBackend be;
        ThreadTransport t(world, r);
        if (r > 0) return expert_worker_loop(*m, be, t, shard);
        ForwardOptions o{4, -1};
        o.experts = ExpertLink{&t, shard};
        {
          Forward fwd(*m, be, o);
          SequenceState s(be, c, 64);
          const std::vector<float> got = greedy_rows(fwd, s, prompt, 5);
          ASSERT_EQ(got.size(), want.size());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
          const std::vector<float> got_b = batched_rows(fwd, c, 3, 3, 70);
          ASSERT_EQ(got_b.size(), want_b.size());
          EXPECT_EQ(std::memcmp(got_b.data(), want_b.data(), got_b.size() * sizeof(float)), 0);
        }
        ExpertParallelMoe(c, be, t, shard).stop();
      });
      EXPECT_GT(world.floats_sent(), 0u);  // rows did cross ranks
    }
  }
}

// Batched serving across ranks: ranks 0 and 1 each drive their own sequences through their own
// Forward (data-parallel trunk, the same number of steps), rank 2 only serves experts; each
// driver's logits equal the single-rank forward's on its sequences.
TEST(ExpertParallel, TwoDrivingRanksEachEqualTheSingleRank) {
  const auto m = load_model(test::golden_dir());
  const Config& c = m->config;
  CpuBackend one;
  Forward whole(*m, one, {4, -1});
  std::vector<std::vector<int>> prompts = {test::some_ids(6, c.vocab, 11), test::some_ids(6, c.vocab, 12)};
  std::vector<std::vector<float>> want;
  for (const auto& p : prompts) {
    SequenceState st(one, c, 64);
    want.push_back(greedy_rows(whole, st, p, 4));
  }
  const ExpertShard shard = parse_expert_shard("5+1+10", c.n_experts);
  ThreadWorld world(3, 30);
  on_ranks(world, [&](int r) {
    CpuBackend be;
    ThreadTransport t(world, r);
    if (r == 2) return expert_worker_loop(*m, be, t, shard);
    ForwardOptions o{4, -1};
    o.experts = ExpertLink{&t, shard};
    {
      Forward fwd(*m, be, o);
      SequenceState s(be, c, 64);
      const std::vector<float> got = greedy_rows(fwd, s, prompts[size_t(r)], 4);
      ASSERT_EQ(got.size(), want[size_t(r)].size());
      EXPECT_EQ(std::memcmp(got.data(), want[size_t(r)].data(), got.size() * sizeof(float)), 0) << "rank " << r;
    }
    if (r == 0) ExpertParallelMoe(c, be, t, shard).stop();
    else expert_worker_loop(*m, be, t, shard);  // done: serve until rank 0 stops
  });
}

TEST(ExpertParallel, ErrorsNameTheProblem) {
  const auto m = load_model(test::golden_dir());
  const Config& c = m->config;
  CpuBackend be;
  {  // a shard over another rank count than the transport's
    ThreadWorld w(2);
    ThreadTransport t(w, 0);
    EXPECT_THROW(ExpertParallelMoe(c, be, t, shard_experts(c.n_experts, 3)), Error);
    EXPECT_THROW(ExpertParallelMoe(c, be, t, shard_experts(c.n_experts - 1, 2)), Error);
  }
  {  // two ranks at different layers: both fail, naming the layers
    ThreadWorld w(2, 10);
    const int l0 = first_moe(c);
    std::vector<std::string> msgs(2);
    std::vector<std::thread> th;
    for (int r = 0; r < 2; ++r)
      th.emplace_back([&, r] {
        CpuBackend b;
        ThreadTransport t(w, r);
        ExpertParallelMoe ep(c, b, t, shard_experts(c.n_experts, 2));
        RoutedMoeParams p = params_of(c, l0 + r);
        std::vector<float> dummy(16);
        try {
          ep.run(p, m->weights.layers[size_t(l0 + r)].moe, dummy.data(), dummy.data(), 0, RoutedMoeWork{dummy.data()},
                 dummy.data());
        } catch (const Error& e) {
          msgs[size_t(r)] = e.what();
        }
      });
    for (auto& x : th) x.join();
    for (const std::string& s : msgs) EXPECT_NE(s.find("out of step"), std::string::npos) << s;
  }
  {  // a peer that never comes: the wait ends with an error instead of a hang
    ThreadWorld w(2, 0.2);
    ThreadTransport t(w, 0);
    ExpertParallelMoe ep(c, be, t, shard_experts(c.n_experts, 2));
    try {
      ep.serve(*m);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("waiting for rank 1"), std::string::npos) << e.what();
    }
  }
  {  // the transport refuses self-messages and ranks outside the world
    ThreadWorld w(2);
    ThreadTransport t(w, 1);
    float f = 1;
    EXPECT_THROW(t.send(be, &f, 1, 1), Error);
    EXPECT_THROW(t.send(be, &f, 1, 2), Error);
    EXPECT_THROW(t.exchange(be, {TransportPart{1, &f, 1}}, {}), Error);
    EXPECT_THROW(ThreadTransport(w, 2), Error);
  }
}

// End to end: `wren run --expert-parallel N` writes the same teacher-forced logits file (the CPU
// logits-hash command) and the same greedy ids as the one-rank run; bad values are usage errors.
TEST(ExpertParallelCli, RunWithExpertRanksWritesTheOneRankLogits) {
  const std::string dir = test::temp_dir("ep-cli");
  const std::string base = "run --backend cpu --model " + test::golden_dir() +
                           " --ids 4096,976,2328,2258,328,2312,766,382 -n 8 --json --logits ";
  std::string out;
  const std::string limit = "timeout 120";
  ASSERT_EQ(test::run_wren(base + dir + "/one.f32 2>/dev/null", &out, limit), 0) << out;
  const size_t at = out.find("\"output_ids\"");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string want_ids = out.substr(at, out.find(']', at) - at);
  const std::vector<float> want = test::read_all_f32(dir + "/one.f32");
  ASSERT_FALSE(want.empty());
  int k = 0;
  for (const char* p : {"--expert-parallel 2", "--expert-parallel 4", "--expert-parallel 1+1+14"}) {
    SCOPED_TRACE(p);
    const std::string f = dir + "/e" + std::to_string(k++) + ".f32";
    std::string o;
    ASSERT_EQ(test::run_wren(base + f + " " + p + " 2>&1", &o, limit), 0) << o;
    const std::vector<float> got = test::read_all_f32(f);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    EXPECT_NE(o.find(want_ids), std::string::npos) << o;
    EXPECT_NE(o.find("wren: expert parallel "), std::string::npos) << o;
  }
  for (const char* p : {"--expert-parallel 17", "--expert-parallel 0", "--expert-parallel 1+2", "--expert-parallel x",
                        "--expert-parallel 2 --pipeline 2"}) {
    SCOPED_TRACE(p);
    EXPECT_EQ(test::run_wren(base + dir + "/bad.f32 " + p + " 2>&1", &out, limit), 2) << out;
    EXPECT_NE(out.find("--expert-parallel"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace wren
