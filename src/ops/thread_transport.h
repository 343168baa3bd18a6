// Threads as ranks (docs/parallel.md, "Expert parallelism"): the ranks of one world are threads of
// one process, each with its own backend, meeting in a shared mailbox. The same Transport
// interface as NCCL's, so the multi-rank protocols (expert-parallel dispatch and combine, the
// multi-process pipeline) run on the CPU in CI; `wren run --expert-parallel N` uses it too.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ops/transport.h"

namespace wren {

/// The shared mailbox of `world` thread ranks: one FIFO per (sender, receiver) pair.
class ThreadWorld {
 public:
  /// A recv waits at most `timeout_s` seconds for its message, then throws (a protocol bug fails
  /// instead of hanging); 0 = no limit (ranks that wait for a user; abort ends the wait). Throws
  /// wren::Error unless world >= 1 and timeout_s >= 0.
  explicit ThreadWorld(int world, double timeout_s = 60);
  int world() const { return world_; }
  /// Fails every waiting and later recv with wren::Error naming `why` (a rank failed, so its
  /// peers stop waiting for it). The first reason is kept. Never throws.
  void abort(const std::string& why) noexcept;
  /// Floats (send) and int32 values (send_host) put in the mailbox so far, all ranks together.
  uint64_t floats_sent() const;
  uint64_t ints_sent() const;

 private:
  friend class ThreadTransport;
  struct Msg {
    std::vector<float> f;
    std::vector<int> i;
    bool host = false;
  };
  void put(int from, int to, Msg m);
  Msg take(int from, int to, size_t n, bool host);
  const int world_;
  const double timeout_s_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, std::deque<Msg>> q_;
  std::string aborted_;
  uint64_t floats_ = 0, ints_ = 0;
};

/// Rank `rank`'s endpoint of a ThreadWorld. send copies the buffer out (to_host) before it
/// returns, so it never waits for the receiver; recv blocks (up to the world's timeout). A message
/// to oneself is refused like a route outside the world. Each thread uses its own endpoint.
class ThreadTransport final : public Transport {
 public:
  /// Throws wren::Error unless 0 <= rank < w.world().
  ThreadTransport(ThreadWorld& w, int rank);
  void send(Backend& be, const float* buf, size_t n, int to) override;
  void recv(Backend& be, float* buf, size_t n, int from) override;
  void send_host(const int* v, size_t n, int to) override;
  void recv_host(int* v, size_t n, int from) override;
  int rank() const override { return rank_; }
  int world() const override { return w_.world(); }
  const char* name() const override { return "threads"; }

 private:
  void route(int from, int to) const;
  ThreadWorld& w_;
  int rank_;
};

}  // namespace wren
