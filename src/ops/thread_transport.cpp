// Threads as ranks (see thread_transport.h).
#include "ops/thread_transport.h"

#include <chrono>

#include "core/error.h"
#include "ops/backend.h"

namespace wren {

ThreadWorld::ThreadWorld(int world, double timeout_s) : world_(world), timeout_s_(timeout_s) {
  check(world >= 1 && timeout_s >= 0, "thread transport: a world of " + std::to_string(world) + " ranks (at least 1)");
}

void ThreadWorld::abort(const std::string& why) noexcept {
  try {
    std::lock_guard<std::mutex> l(m_);
    if (aborted_.empty()) aborted_ = why.empty() ? "a rank failed" : why;
  } catch (...) {
  }
  cv_.notify_all();
}

uint64_t ThreadWorld::floats_sent() const {
  std::lock_guard<std::mutex> l(m_);
  return floats_;
}

uint64_t ThreadWorld::ints_sent() const {
  std::lock_guard<std::mutex> l(m_);
  return ints_;
}

void ThreadWorld::put(int from, int to, Msg m) {
  {
    std::lock_guard<std::mutex> l(m_);
    (m.host ? ints_ : floats_) += m.host ? m.i.size() : m.f.size();
    q_[{from, to}].push_back(std::move(m));
  }
  cv_.notify_all();
}

ThreadWorld::Msg ThreadWorld::take(int from, int to, size_t n, bool host) {
  std::unique_lock<std::mutex> l(m_);
  auto& q = q_[{from, to}];
  const auto ready = [&] { return !q.empty() || !aborted_.empty(); };
  bool got = true;
  if (timeout_s_ > 0) got = cv_.wait_for(l, std::chrono::duration<double>(timeout_s_), ready);
  else cv_.wait(l, ready);
  const std::string who = "thread transport: rank " + std::to_string(to) + " waiting for rank " + std::to_string(from);
  check(aborted_.empty(), who + ": the world was aborted (" + aborted_ + ")");
  check(got, who + ": nothing came in " + std::to_string(timeout_s_) + " s");
  Msg m = std::move(q.front());
  q.pop_front();
  const size_t have = m.host ? m.i.size() : m.f.size();
  check(m.host == host && have == n, who + ": it sent " + std::to_string(have) + (m.host ? " ints" : " floats") +
                                         ", the receiver expected " + std::to_string(n) + (host ? " ints" : " floats"));
  return m;
}

ThreadTransport::ThreadTransport(ThreadWorld& w, int rank) : w_(w), rank_(rank) {
  check(rank >= 0 && rank < w.world(), "thread transport: rank " + std::to_string(rank) + " outside a world of " +
                                           std::to_string(w.world()));
}

void ThreadTransport::route(int from, int to) const {
  check(from >= 0 && from < w_.world() && to >= 0 && to < w_.world() && from != to,
        "thread transport: no route from rank " + std::to_string(from) + " to rank " + std::to_string(to) + " (world " +
            std::to_string(w_.world()) + ")");
}

void ThreadTransport::send(Backend& be, const float* buf, size_t n, int to) {
  route(rank_, to);
  ThreadWorld::Msg m;
  m.f.resize(n);
  be.to_host(buf, n, m.f.data());
  w_.put(rank_, to, std::move(m));
}

void ThreadTransport::recv(Backend& be, float* buf, size_t n, int from) {
  route(from, rank_);
  const ThreadWorld::Msg m = w_.take(from, rank_, n, false);
  be.from_host(m.f.data(), n, buf);
}

void ThreadTransport::send_host(const int* v, size_t n, int to) {
  route(rank_, to);
  ThreadWorld::Msg m;
  m.host = true;
  m.i.assign(v, v + n);
  w_.put(rank_, to, std::move(m));
}

void ThreadTransport::recv_host(int* v, size_t n, int from) {
  route(from, rank_);
  const ThreadWorld::Msg m = w_.take(from, rank_, n, true);
  for (size_t i = 0; i < n; ++i) v[i] = m.i[i];
}

}  // namespace wren
