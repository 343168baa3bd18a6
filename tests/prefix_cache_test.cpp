// The prefix cache (runtime/prefix_cache.h) on the golden model, CPU: every answer resumed from a
// cached prefix must equal the fresh run bit for bit (ids and the FNV-1a hash of every logits row
// sampled from), across the patterns that break hybrid (recurrent + attention) caches: A->B->A, a
// shared prefix ending mid-interval, a conversation edited at turn 2, concurrent users of one prefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "runtime/generate.h"
#include "runtime/prefix_cache.h"
#include "runtime/runner.h"
#include "test_util.h"

namespace wren {
namespace {

using test::some_ids;

std::vector<int> cat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Answer {
  std::vector<int> ids;
  uint64_t hash = 0;
  int cached = 0;
};

class PrefixCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::golden_dir()).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
  const Config& cfg() const { return model_->config; }

  /// Greedy generation of `n` tokens after `prompt` from an empty state; with `cache` it resumes
  /// from (and fills) the cache. Sampling with a seed checks that the logits feed the same draws.
  Answer gen(const std::vector<int>& prompt, PrefixCache* cache, int n = 6, bool commit_last = false) {
    CpuBackend be;
    Runner fwd(*model_, be, {16, -1});  // chunk 16: the cache's pieces cut chunks elsewhere; the runner logs the ids
    SequenceState st(be, cfg(), 512);
    GenerateOptions o;
    o.max_new_tokens = n;
    o.hash_logits = true;
    o.prefix_cache = cache;
    o.commit_last = commit_last;
    o.sampling.temperature = 0.8f;
    o.sampling.seed = 11;
    GenerateStats s;
    Answer a;
    a.ids = generate(fwd, st, prompt, o, &s);
    a.hash = s.logits_fnv1a64;
    a.cached = s.cached_tokens;
    return a;
  }
  void expect_same(const Answer& cached, const Answer& fresh, const char* what) {
    EXPECT_EQ(cached.ids, fresh.ids) << what;
    EXPECT_EQ(cached.hash, fresh.hash) << what << ": the logits are not bit-identical";
  }
};
Model* PrefixCacheTest::model_ = nullptr;

TEST_F(PrefixCacheTest, ResumedPrefixEqualsFreshRun) {
  PrefixCache cache(64 << 20, 32);
  const std::vector<int> p = some_ids(150, cfg().vocab, 1);
  const std::vector<int> longer = cat(p, some_ids(40, cfg().vocab, 2));
  const Answer a1 = gen(p, &cache);
  EXPECT_EQ(a1.cached, 0);
  expect_same(a1, gen(p, nullptr), "first run through the cache");
  const Answer a2 = gen(longer, &cache);
  EXPECT_EQ(a2.cached, 150);
  // The extension does not start with a1's answer, so the end-of-exchange snapshot does not fit:
  // it resumes from the end of p's prompt.
  expect_same(a2, gen(longer, nullptr), "extension of a cached prompt");
}

TEST_F(PrefixCacheTest, ABA_SamePromptAgainIsFullyCached) {
  PrefixCache cache(64 << 20, 32);
  const std::vector<int> a = some_ids(70, cfg().vocab, 3), b = some_ids(90, cfg().vocab, 4);
  const Answer fa = gen(a, nullptr), fb = gen(b, nullptr);
  expect_same(gen(a, &cache), fa, "A");
  const Answer gb = gen(b, &cache);
  EXPECT_EQ(gb.cached, 0) << "B shares no prefix with A";
  expect_same(gb, fb, "B");
  const Answer ga = gen(a, &cache);
  EXPECT_EQ(ga.cached, 70) << "the whole prompt, with its logits";
  expect_same(ga, fa, "A again");
  const PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.lookups, 3u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.cached_tokens, 70u);
}

TEST_F(PrefixCacheTest, SharedPrefixEndingMidInterval) {
  PrefixCache cache(64 << 20, 32);
  const std::vector<int> shared = some_ids(77, cfg().vocab, 5);  // 2 intervals + 13
  const std::vector<int> a = cat(shared, some_ids(20, cfg().vocab, 6)), b = cat(shared, some_ids(25, cfg().vocab, 7));
  gen(a, &cache);
  const Answer gb = gen(b, &cache);
  EXPECT_EQ(gb.cached, 64) << "the last interval snapshot inside the shared 77 tokens";
  expect_same(gb, gen(b, nullptr), "B after A");
  // Now a prompt ending inside that interval, then one extending it (resumes mid-interval at 77 + 3).
  const std::vector<int> c = cat(shared, some_ids(3, cfg().vocab, 8));
  EXPECT_EQ(gen(c, &cache).cached, 64);
  const Answer gd = gen(cat(c, some_ids(9, cfg().vocab, 9)), &cache);
  EXPECT_EQ(gd.cached, 80);
  expect_same(gd, gen(cat(c, some_ids(9, cfg().vocab, 9)), nullptr), "D extends C");
}

TEST_F(PrefixCacheTest, ConversationEditedAtTurnTwoAndResent) {
  PrefixCache cache(64 << 20, 32);
  const std::vector<int> turn1 = some_ids(40, cfg().vocab, 10);
  const Answer r1 = gen(turn1, &cache, 6, true);  // the state holds the whole exchange
  const std::vector<int> hist = cat(turn1, r1.ids);
  const std::vector<int> turn2 = cat(hist, some_ids(30, cfg().vocab, 11));
  const Answer r2 = gen(turn2, &cache);
  EXPECT_EQ(r2.cached, 46) << "resumes after turn 1's answer";
  expect_same(r2, gen(turn2, nullptr), "turn 2");
  // The user edits turn 2 and sends the conversation again: shares turn 1 and its answer only.
  std::vector<int> edited = turn2;
  edited[50] = (edited[50] + 1) % cfg().vocab;
  const Answer re = gen(edited, &cache);
  EXPECT_EQ(re.cached, 46);
  expect_same(re, gen(edited, nullptr), "edited turn 2");
  // The original turn 2 again: the whole prompt is cached.
  const Answer again = gen(turn2, &cache);
  EXPECT_EQ(again.cached, int(turn2.size()));
  expect_same(again, r2, "turn 2 resent");
}

TEST_F(PrefixCacheTest, ConcurrentUsersOfOnePrefix) {
  PrefixCache cache(64 << 20, 32);
  const std::vector<int> shared = some_ids(100, cfg().vocab, 12);
  std::vector<std::vector<int>> prompts;
  std::vector<Answer> fresh, got(4);
  for (int i = 0; i < 4; ++i) prompts.push_back(cat(shared, some_ids(10 + i, cfg().vocab, 20 + i)));
  for (const auto& p : prompts) fresh.push_back(gen(p, nullptr));
  // Cold: all four prefill the shared prefix at once and store the same snapshots.
  std::vector<std::thread> th;
  for (int i = 0; i < 4; ++i) th.emplace_back([&, i] { got[size_t(i)] = gen(prompts[size_t(i)], &cache); });
  for (auto& t : th) t.join();
  for (int i = 0; i < 4; ++i) expect_same(got[size_t(i)], fresh[size_t(i)], "cold concurrent");
  th.clear();
  for (int i = 0; i < 4; ++i) th.emplace_back([&, i] { got[size_t(i)] = gen(prompts[size_t(i)], &cache); });
  for (auto& t : th) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[size_t(i)].cached, int(prompts[size_t(i)].size()));
    expect_same(got[size_t(i)], fresh[size_t(i)], "warm concurrent");
  }
}

TEST_F(PrefixCacheTest, LruStaysUnderBudgetAndAHashCollisionIsAMiss) {
  const size_t one = [&] {
    PrefixCache probe(64 << 20, 1000);
    gen(some_ids(60, cfg().vocab, 30), &probe, 1);
    return probe.stats().bytes;  // one entry: the end of the prompt (1 token: no end-of-exchange store)
  }();
  PrefixCache cache(one * 5 / 2, 1000);  // room for two such entries
  for (int i = 0; i < 4; ++i) gen(some_ids(60, cfg().vocab, 31 + i), &cache, 1);
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 2u);
  EXPECT_LE(s.bytes, s.budget);
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(gen(some_ids(60, cfg().vocab, 31), &cache, 1).cached, 0) << "evicted";
  EXPECT_EQ(gen(some_ids(60, cfg().vocab, 34), &cache, 1).cached, 60) << "kept";
  // A prompt of the same length and different ids is never restored (ids compared, not only hashes).
  CpuBackend be;
  SequenceState st(be, cfg(), 512);
  std::vector<float> lg;
  EXPECT_EQ(cache.restore(st, some_ids(60, cfg().vocab, 99), &lg), 0);
  EXPECT_EQ(st.position(), 0);
  // Without room for logits the full prompt is not restored: at most n - 1 tokens.
  EXPECT_EQ(cache.restore(st, some_ids(60, cfg().vocab, 34), nullptr), 0);
}

TEST_F(PrefixCacheTest, SnapshotRoundTripsTheWholeState) {
  CpuBackend be;
  Forward fwd(*model_, be);
  SequenceState a(be, cfg(), 256), b(be, cfg(), 256);
  const std::vector<int> ids = some_ids(33, cfg().vocab, 40);
  fwd.run(a, ids.data(), nullptr, int(ids.size()), nullptr, false);
  std::vector<float> data, again;
  std::vector<int> lens, lens2;
  a.save(data, lens);
  b.load(data, lens, ids);
  b.save(again, lens2);
  EXPECT_EQ(data, again);
  EXPECT_EQ(lens, lens2);
  EXPECT_EQ(b.position(), 33);
  data.push_back(1.0f);
  EXPECT_THROW(b.load(data, lens, ids), Error);
}

// TTFT of a prompt whose first 90% is cached vs the same prompt fresh (best of 3 each; the goal of
// issue #15 is <= 0.2x). Timing on a shared machine: the bound checked is loose (0.5x).
TEST_F(PrefixCacheTest, TtftOfANinetyPercentCachedPrompt) {
  const std::vector<int> head = some_ids(360, cfg().vocab, 50);
  PrefixCache cache(256 << 20, 256);
  CpuBackend be;
  Runner fwd(*model_, be);
  auto ttft = [&](PrefixCache* c, const std::vector<int>& p, int* cached) {
    SequenceState st(be, cfg(), 512);
    GenerateOptions o;
    o.max_new_tokens = 1;
    o.prefix_cache = c;
    GenerateStats s;
    generate(fwd, st, p, o, &s);
    if (cached) *cached = s.cached_tokens;
    return s.ttft_s;
  };
  ttft(&cache, head, nullptr);  // the cache now holds the 360-token prompt (with its logits)
  double fresh = 1e9, warm = 1e9;
  for (int r = 0; r < 3; ++r) {  // a new 40-token tail each time (a resent prompt would be 100% cached)
    const std::vector<int> full = cat(head, some_ids(40, cfg().vocab, 51 + r));
    fresh = std::min(fresh, ttft(nullptr, full, nullptr));
    int cached = 0;
    warm = std::min(warm, ttft(&cache, full, &cached));
    EXPECT_EQ(cached, 360);
  }
  std::printf("[ prefix cache ] k3-tiny-a, 400-token prompt, 360 cached: TTFT %.2f ms vs %.2f ms fresh = %.3fx\n",
              warm * 1e3, fresh * 1e3, warm / fresh);
  EXPECT_LT(warm / fresh, 0.5);
}

}  // namespace
}  // namespace wren
