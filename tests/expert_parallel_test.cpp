// Expert parallelism partition and dispatch (model/expert_parallel.h) on the CPU: the shard covers
// every expert once with balanced blocks, and a routed MoE layer of the golden model computed as R
// "ranks" (each running only its experts' rows, then combined in slot order) equals
// Backend::routed_moe bit for bit, for R = 1, 2, 3 and one expert per rank.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/expert_parallel.h"
#include "model/load.h"
#include "test_util.h"

namespace wren {
namespace {

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
  EXPECT_THROW(shard_experts(4, 5), Error);
  EXPECT_THROW(shard_experts(4, 0), Error);
  const int bad[2] = {0, 9};
  EXPECT_THROW(plan_dispatch(shard_experts(8, 2), bad, 1, 2), Error);
}

TEST(ExpertParallel, ShardedMoeLayerEqualsTheRoutedMoeOp) {
  const auto m = load_model(test::golden_dir());
  const Config& c = m->config;
  int layer = -1;
  for (int i = 0; i < c.n_layers && layer < 0; ++i)
    if (c.layers[size_t(i)].ffn == Ffn::MoE) layer = i;
  ASSERT_GE(layer, 0);
  ASSERT_EQ(c.expert_format, ExpertFormat::MXFP4);
  const MoeWeights& mw = m->weights.layers[size_t(layer)].moe;
  CpuBackend be;
  const int T = 7, K = c.top_k, io = c.expert_io(), D = c.hidden;
  std::mt19937 g(11);
  const std::vector<float> x = test::random_vec(g, size_t(T) * D);
  std::vector<float> logits(size_t(T) * c.n_experts), z(size_t(T) * io);
  be.gemm(mw.router, x.data(), T, logits.data());
  be.gemm(mw.down, x.data(), T, z.data());  // the latent input of the routed experts
  const RoutedMoeParams p{layer, c.n_experts, K, io, c.routed_scale, c.situ_b1, c.situ_b2,
                          c.expert_format, c.act, c.moe_inter};
  std::vector<float> ys(size_t(T) * K * io), want(size_t(T) * io);
  be.routed_moe(p, mw, logits.data(), z.data(), T, RoutedMoeWork{ys.data(), nullptr, nullptr, nullptr}, want.data());
  std::vector<int> ids(size_t(T) * K);
  std::vector<float> w(size_t(T) * K);
  be.router_topk(logits.data(), mw.bias, T, c.n_experts, K, ids.data(), w.data());
  if (c.routed_scale != 1.f)
    for (float& v : w) v *= c.routed_scale;
  for (int R : {1, 2, 3, c.n_experts}) {
    SCOPED_TRACE("ranks " + std::to_string(R));
    const ExpertShard s = shard_experts(c.n_experts, R);
    const ExpertDispatch d = plan_dispatch(s, ids.data(), T, K);
    size_t total = 0;
    std::vector<float> got_ys(size_t(T) * K * io, 0.f), got(size_t(T) * io);
    for (int r = 0; r < R; ++r) {  // rank r: only its own experts' rows
      total += d.rows[size_t(r)].size();
      for (int j : d.rows[size_t(r)]) {
        EXPECT_EQ(s.owner(ids[size_t(j)]), r);
        be.expert_ffn(mw.experts[size_t(ids[size_t(j)])], z.data() + size_t(j / K) * io, c.situ_b1, c.situ_b2,
                      got_ys.data() + size_t(j) * io);
      }
    }
    EXPECT_EQ(total, size_t(T) * K);
    for (int t = 0; t < T; ++t)  // combine on the token's rank, in slot order
      be.weighted_sum(got_ys.data() + size_t(t) * K * io, w.data() + size_t(t) * K, K, io, got.data() + size_t(t) * io);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace wren
