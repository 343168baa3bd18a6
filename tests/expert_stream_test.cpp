// Streaming experts (issue 17): the byte-level store under random visits and prefetches (the
// bytes handed over are always the file's, at every budget and thread count), a prefetch racing
// an eviction, faults during prefetch (EIO, short read: a clear error naming the file and the
// expert, or a re-read when the fault was transient), and expert prediction (ForwardOptions::
// predict) giving bit-identical logits with prediction on and off at every budget; the CPU prefill
// chunk when experts stream.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "io/expert_store.h"
#include "model/forward.h"
#include "runtime/engine.h"
#include "runtime/expert_store.h"
#include "synth/synth.h"
#include "test_util.h"

namespace wren {
namespace {

constexpr int kLayers = 3, kExperts = 16;
constexpr uint64_t kBytes = 10'007, kBase = 123;  // odd sizes and offsets: reads are widened to 4 KiB

/// A shard of random bytes holding kLayers x kExperts experts back to back from offset kBase.
class ByteStore : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir("stream");
    file_ = dir_ + "/experts.bin";
    data_.resize(kBase + kLayers * kExperts * kBytes + 999);
    std::mt19937 rng(17);
    for (auto& b : data_) b = uint8_t(rng());
    std::ofstream(file_, std::ios::binary).write(reinterpret_cast<const char*>(data_.data()), std::streamsize(data_.size()));
    extents_.resize(kLayers);
    for (int l = 0; l < kLayers; ++l)
      for (int e = 0; e < kExperts; ++e)
        extents_[l].push_back({file_, offset(l, e), kBytes, "layers." + std::to_string(l) + ".experts." + std::to_string(e)});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static uint64_t offset(int l, int e) { return kBase + (uint64_t(l) * kExperts + e) * kBytes; }
  ExpertStoreOptions opts(int slots, int threads = 2) const {
    ExpertStoreOptions o;
    o.cache_bytes = uint64_t(slots) * kBytes;
    o.loader_threads = threads;
    return o;
  }
  /// Visits `ids` of layer `l`, checking that each comes exactly once with the file's bytes.
  void visit_checked(ExpertByteStore& s, int l, const std::vector<int>& ids) {
    std::multiset<int> seen;
    s.visit_batches(l, ids, [&](const int* got, const uint8_t* const* bytes, int n) {
      for (int i = 0; i < n; ++i) {
        seen.insert(got[i]);
        ASSERT_EQ(0, std::memcmp(bytes[i], data_.data() + offset(l, got[i]), kBytes))
            << "layer " << l << " expert " << got[i];
      }
    });
    EXPECT_EQ(seen, std::multiset<int>(ids.begin(), ids.end()));
  }
  std::string dir_, file_;
  std::vector<uint8_t> data_;
  std::vector<std::vector<ExpertExtent>> extents_;
};

std::vector<int> random_ids(std::mt19937& rng, int n) {
  std::vector<int> all(kExperts);
  for (int i = 0; i < kExperts; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

// Each setting also with 4 KiB pieces (an expert is then 3 or 4 reads that the loaders share).
TEST_F(ByteStore, RandomVisitsAndPrefetchesHandOverTheFilesBytes) {
  for (uint64_t piece : {uint64_t(0), uint64_t(4096)})
  for (int threads : {1, 3})
    for (int slots : {1, 2, 5, kExperts, kLayers * kExperts}) {
      ExpertStoreOptions o = opts(slots, threads);
      o.piece_bytes = piece;
      ExpertByteStore s(extents_, kBytes, o);
      std::mt19937 rng(uint32_t(slots * 10 + threads));
      for (int op = 0; op < 120; ++op) {
        const int l = int(rng() % kLayers);
        const auto ids = random_ids(rng, 1 + int(rng() % 8));
        if (rng() % 2) s.prefetch(l, ids.data(), int(ids.size()));
        else visit_checked(s, l, ids);
      }
      const ExpertStoreStats& x = s.stats();
      EXPECT_LE(x.prefetch_used + x.prefetch_wasted, x.prefetch_issued);
      EXPECT_EQ(x.prefetch_failed, 0u);
      if (slots >= 5) {
        EXPECT_GT(x.prefetch_issued, 0u) << slots;
      }
      if (slots == 1) {
        EXPECT_EQ(x.prefetch_issued, 0u);  // never more than half of the slots
      }
    }
}

TEST_F(ByteStore, PrefetchAndVisitFromTwoThreads) {
  ExpertByteStore s(extents_, kBytes, opts(9, 3));
  std::atomic<bool> stop{false};
  std::thread guesser([&] {
    std::mt19937 rng(3);
    while (!stop) {
      const auto ids = random_ids(rng, 4);
      s.prefetch(int(rng() % kLayers), ids.data(), 4);
    }
  });
  std::mt19937 rng(4);
  for (int op = 0; op < 150; ++op) visit_checked(s, int(rng() % kLayers), random_ids(rng, 1 + int(rng() % 6)));
  stop = true;
  guesser.join();
}

/// A pread hook that holds reads at `block_off` until released.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> held{0};
  /// Called by a hook at the held offset: counts the read and waits until release().
  void pass() {
    ++held;
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu);
      open = true;
    }
    cv.notify_all();
  }
};

TEST_F(ByteStore, PrefetchRacingAnEviction) {
  Gate gate;
  ExpertStoreOptions o = opts(6, 2);
  const uint64_t held_off = offset(0, 0);  // with a hook the store reads buffered, unwidened
  o.pread_hook = [&](int fd, void* buf, size_t n, uint64_t off) -> long {
    if (off == held_off) gate.pass();
    return long(::pread(fd, buf, n, off_t(off)));
  };
  ExpertByteStore s(extents_, kBytes, o);
  const int guess[] = {0};
  s.prefetch(0, guess, 1);  // held in flight
  while (gate.held == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Visits that need every other slot, and evictions, while the prefetch read is in flight: the
  // in-flight slot is never handed out or evicted.
  visit_checked(s, 1, {0, 1, 2, 3, 4});
  visit_checked(s, 2, {5, 6, 7, 8, 9});
  visit_checked(s, 1, {10, 11, 12});
  EXPECT_GT(s.stats().evictions, 0u);
  // The guessed expert asked for while its read is still held: the visit waits for it.
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    gate.release();
  });
  visit_checked(s, 0, {0, 1});
  opener.join();
  EXPECT_EQ(s.stats().prefetch_issued, 1u);
  EXPECT_EQ(s.stats().prefetch_used, 1u);
  EXPECT_EQ(s.stats().prefetch_late, 1u);
  EXPECT_EQ(s.stats().guessed_needed, 2u);  // recall: 1 of the 2 experts asked for was guessed
  EXPECT_EQ(s.stats().guessed_hit, 1u);
  visit_checked(s, 0, {0});  // now resident
}

// holds(): true only for an expert read and checked in the cache; an expert not read, one whose
// read is in flight and one whose read failed are not held; evicted ones are no longer held; an
// id out of range is a clear error. (The CUDA VRAM tier copies only held guesses.)
TEST_F(ByteStore, HoldsOnlyExpertsReadIntoTheCache) {
  Gate gate;
  ExpertStoreOptions o = opts(6, 2);
  const uint64_t held_off = offset(0, 0), bad_off = offset(0, 2);
  o.pread_hook = [&](int fd, void* buf, size_t n, uint64_t off) -> long {
    if (off == bad_off) {
      errno = EIO;
      return -1;
    }
    if (off == held_off) gate.pass();
    return long(::pread(fd, buf, n, off_t(off)));
  };
  ExpertByteStore s(extents_, kBytes, o);
  EXPECT_FALSE(s.holds(0, 0));
  const int guess[] = {0, 2};
  s.prefetch(0, guess, 2);
  while (gate.held == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(s.holds(0, 0)) << "a read in flight is not held";
  visit_checked(s, 1, {3, 4});
  EXPECT_TRUE(s.holds(1, 3));
  EXPECT_TRUE(s.holds(1, 4));
  EXPECT_FALSE(s.holds(1, 5));
  gate.release();
  for (int i = 0; i < 2000 && !s.holds(0, 0); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(s.holds(0, 0)) << "the guess's read landed";
  for (int i = 0; i < 2000 && s.stats().prefetch_failed == 0; ++i) {
    EXPECT_FALSE(s.holds(0, 2)) << "a failed read is not held";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(s.stats().prefetch_failed, 1u);
  EXPECT_FALSE(s.holds(0, 2)) << "a failed read is not held";
  // Six slots: visiting six other experts evicts every earlier one.
  visit_checked(s, 2, {0, 1, 2, 3, 4, 5});
  EXPECT_FALSE(s.holds(1, 3)) << "evicted";
  EXPECT_FALSE(s.holds(0, 0)) << "evicted";
  EXPECT_TRUE(s.holds(2, 5));
  EXPECT_THROW(s.holds(0, kExperts), Error);
  EXPECT_THROW(s.holds(kLayers, 0), Error);
  EXPECT_THROW(s.holds(-1, 0), Error);
}

TEST_F(ByteStore, WrongGuessesAreEvictedUnused) {
  ExpertByteStore s(extents_, kBytes, opts(8, 2));
  const int guess[] = {0, 1, 2, 3, 4, 5};
  s.prefetch(0, guess, 6);
  EXPECT_EQ(s.stats().prefetch_issued, 4u);  // half of the 8 slots at most
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the four reads land (10 KB each)
  for (int l : {1, 2}) visit_checked(s, l, {8, 9, 10, 11, 12, 13, 14, 15});
  EXPECT_EQ(s.stats().prefetch_wasted, 4u);
  EXPECT_EQ(s.stats().prefetch_used, 0u);
  visit_checked(s, 0, {0, 1});
}

/// A pread hook failing the reads that start at `at` (the first read of one expert; with a hook
/// the store reads buffered, so reads start at the expert's offset): `times` failures (-1 =
/// always), as EIO or as a short read (1000 bytes, then end of file).
struct Fault {
  uint64_t at;
  int times;
  bool short_read;
  bool pending_eof = false;
  std::mutex mu;
};
std::function<long(int, void*, size_t, uint64_t)> failing(uint64_t at, int times, bool short_read) {
  auto f = std::make_shared<Fault>();
  f->at = at, f->times = times, f->short_read = short_read;
  return [f](int fd, void* buf, size_t n, uint64_t off) -> long {
    std::lock_guard<std::mutex> lk(f->mu);
    if (off == f->at && f->times != 0) {
      if (f->times > 0) --f->times;
      if (!f->short_read) {
        errno = EIO;
        return -1;
      }
      f->pending_eof = true;
      return long(::pread(fd, buf, 1000, off_t(off)));
    }
    if (f->pending_eof && off == f->at + 1000) {
      f->pending_eof = false;
      return 0;
    }
    return long(::pread(fd, buf, n, off_t(off)));
  };
}

TEST_F(ByteStore, TransientFaultDuringPrefetchIsReadAgain) {
  for (bool short_read : {false, true}) {
    int times = 1;
    ExpertStoreOptions o = opts(8, 1);
    o.pread_hook = failing(offset(0, 3), times, short_read);
    ExpertByteStore s(extents_, kBytes, o);
    const int guess[] = {3};
    s.prefetch(0, guess, 1);
    visit_checked(s, 0, {3, 4});  // the prefetch failed: read again on demand, right bytes
    EXPECT_EQ(s.stats().prefetch_failed, 1u) << short_read;
    const std::string& err = s.stats().last_prefetch_error;
    EXPECT_NE(err.find("experts.bin: expert 'layers.0.experts.3'"), std::string::npos) << err;
    EXPECT_NE(err.find(short_read ? "short read, got 1000 of" : "read failed: Input/output error"), std::string::npos)
        << err;
  }
}

// An expert read in 4 KiB pieces (with a hook the store reads buffered: pieces start at the
// expert's offset + 4096 k): a fault in its second piece fails the whole expert. On demand it is a
// clear error naming the file and the expert, with the bytes counted from the expert's start; a
// transient fault in a prefetch is read again on demand, with the file's bytes.
TEST_F(ByteStore, FaultInAMiddlePieceFailsTheExpert) {
  for (bool short_read : {false, true}) {
    int times = -1;
    ExpertStoreOptions o = opts(8, 3);
    o.piece_bytes = 4096;
    o.pread_hook = failing(offset(0, 3) + 4096, times, short_read);
    ExpertByteStore s(extents_, kBytes, o);
    std::string err;
    try {
      visit_checked(s, 0, {2, 3, 4});
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("experts.bin: expert 'layers.0.experts.3' (bytes "), std::string::npos) << err;
    EXPECT_NE(err.find(short_read ? "short read, got 5096 of 10007 bytes" : "read failed: Input/output error"),
              std::string::npos)
        << err;
    visit_checked(s, 1, {3, 4, 5, 6, 7});  // the store goes on serving after the failed visit
  }
  for (bool short_read : {false, true}) {
    int times = 1;
    ExpertStoreOptions o = opts(8, 3);
    o.piece_bytes = 4096;
    o.pread_hook = failing(offset(0, 3) + 4096, times, short_read);
    ExpertByteStore s(extents_, kBytes, o);
    const int guess[] = {3};
    s.prefetch(0, guess, 1);
    visit_checked(s, 0, {3, 4});
    EXPECT_EQ(s.stats().prefetch_failed, 1u) << short_read;
  }
}

// A shard truncated inside an expert read in pieces: the later pieces fail at once (end of file)
// while the first, held back by the hook, still reads; the error must report the first short
// piece, so the byte count is what was really read.
TEST_F(ByteStore, TruncatedInsideAnExpertReportsTheBytesReallyRead) {
  std::filesystem::resize_file(file_, offset(0, 5) + 1000);
  for (int run = 0; run < 3; ++run) {
    ExpertStoreOptions o = opts(4, 3);
    o.piece_bytes = 4096;
    o.pread_hook = [](int fd, void* buf, size_t n, uint64_t off) -> long {
      if (off == offset(0, 5)) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // lands last
      return long(::pread(fd, buf, n, off_t(off)));
    };
    ExpertByteStore s(extents_, kBytes, o);
    std::string err;
    try {
      s.visit_batches(0, {5}, [](const int*, const uint8_t* const*, int) {});
    } catch (const Error& e) {
      err = e.what();
    }
    ASSERT_NE(err.find("expert 'layers.0.experts.5' (bytes "), std::string::npos) << err;
    ASSERT_NE(err.find("short read, got 1000 of 10007 bytes (file truncated?)"), std::string::npos) << "run " << run << ": " << err;
  }
}

TEST_F(ByteStore, PersistentFaultDuringPrefetchIsAClearError) {
  for (bool short_read : {false, true}) {
    int times = -1;
    ExpertStoreOptions o = opts(8, 2);
    o.pread_hook = failing(offset(0, 3), times, short_read);
    ExpertByteStore s(extents_, kBytes, o);
    const int guess[] = {3, 5};
    s.prefetch(0, guess, 2);
    std::string err;
    try {
      s.visit_batches(0, {5, 3, 6}, [&](const int*, const uint8_t* const*, int) {});
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("experts.bin: expert 'layers.0.experts.3' (bytes "), std::string::npos) << err;
    EXPECT_NE(err.find(short_read ? "short read, got 1000 of" : "read failed: Input/output error"), std::string::npos)
        << err;
    // The store stays usable, and a guess that fails and is never asked for costs nothing else.
    visit_checked(s, 0, {5, 6, 7});
    visit_checked(s, 1, {3});
    s.prefetch(0, guess, 1);
    visit_checked(s, 2, {1, 2});
    EXPECT_THROW(s.visit_batches(0, {3}, [](const int*, const uint8_t* const*, int) {}), Error);
  }
}

// ---- prediction in the forward pass ----

std::vector<int> prompt_ids(int n, int vocab) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back((89 * i + 29) % vocab);
  return ids;
}

/// Teacher-forced logits (chunk 4, then three decode steps) with `src` and prediction on or off.
std::vector<float> run_logits(const Model& m, ExpertSource* src, bool predict) {
  CpuBackend be({}, src);
  ForwardOptions fo;
  fo.max_chunk = 4;
  fo.predict = predict;
  Forward fwd(m, be, fo);
  SequenceState st(be, m.config, 64);
  const auto ids = prompt_ids(10, m.config.vocab);
  const size_t V = m.config.vocab;
  std::vector<float> out((ids.size() + 3) * V);
  fwd.run(st, ids.data(), nullptr, int(ids.size()), out.data(), true);
  for (int k = 0; k < 3; ++k) fwd.run(st, &ids[k], nullptr, 1, out.data() + (ids.size() + k) * V, false);
  return out;
}

TEST(Prediction, SameLogitsOnAndOffAtEveryBudget) {
  const std::string dir = test::temp_dir("predict");
  SynthOptions so;
  so.seed = 9;
  so.shard_bytes = 300'000;
  write_synthetic_checkpoint(test::golden_config({{"num_hidden_layers", 4}, {"num_experts", 32},
                                                  {"num_experts_per_token", 4},
                                                  {"linear_attn_config", {{"kda_layers", {1, 2, 3}}, {"full_attn_layers", {4}}}}}),
                             dir, so);
  for (const std::string& path : {test::golden_dir(), dir}) {
    auto m = load_model(path);
    const Config& c = m->config;
    const auto want = run_logits(*m, nullptr, false);  // the shard mappings
    const int all = c.n_experts * (c.n_layers - c.first_dense);
    for (int n : {1, c.top_k + 3, all / 2, all}) {
      for (bool predict : {false, true}) {
        ExpertStoreOptions o;
        o.cache_bytes = uint64_t(n) * c.expert_bytes();
        o.loader_threads = 3;
        ExpertStore store(m->weights, c.expert_bytes(), o);
        const auto got = run_logits(*m, &store, predict);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4))
            << path << " budget " << n << " predict " << predict;
        const ExpertStoreStats& x = store.stats();
        if (!predict) {
          EXPECT_EQ(x.guessed_needed + x.prefetch_issued, 0u);
        }
        if (predict && c.n_layers - c.first_dense > 1) {
          EXPECT_GT(x.guessed_needed, 0u) << path;
        }
        if (predict && n >= 2 * c.top_k && c.n_layers - c.first_dense > 1) {
          EXPECT_GT(x.prefetch_issued, 0u) << path << n;
        }
      }
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wren

namespace wren {
namespace {

TEST(StreamingChunk, CpuPrefillIsOneChunkWhenExpertsStream) {
  EngineOptions o;
  o.model_dir = test::golden_dir();
  o.backend = "cpu";
  o.announce = false;
  o.expert_cache = "100K";  // fewer than all 144 experts of k3-tiny-a
  Engine streaming(o);
  EXPECT_GT(streaming.chunk(), 32);
  o.expert_cache = "";      // default: every expert fits
  Engine resident(o);
  EXPECT_EQ(resident.chunk(), 32);
  o.expert_cache = "100K";
  o.chunk = 8;              // an explicit --chunk wins
  Engine explicit_chunk(o);
  EXPECT_EQ(explicit_chunk.chunk(), 8);
}

}  // namespace
}  // namespace wren
