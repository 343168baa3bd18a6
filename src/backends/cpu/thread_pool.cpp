// The CPU backend's fork-join pool (see thread_pool.h). Workers spin briefly on a new generation
// (decode issues many small back-to-back runs), then block on a condition variable so an idle pool
// costs nothing on a shared machine.
#include "backends/cpu/thread_pool.h"

#include <algorithm>

#include "backends/cpu/simd.h"

namespace wren::cpu {

namespace {
thread_local bool t_in_task = false;
constexpr int kSpin = 2000;  // pause iterations before blocking (tens of microseconds)
constexpr uint64_t kClosed = 1ull << 31, kCount = kClosed - 1;

inline void cpu_relax() {
#if WREN_X86
  _mm_pause();
#endif
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work(Call call, void* ctx, int n, int thread) {
  t_in_task = true;
  for (int i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n;) {
    try {
      call(ctx, i, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
  t_in_task = false;
}

bool ThreadPool::enter(uint64_t generation) {
  uint64_t cur = gate_.load(std::memory_order_acquire);
  for (;;) {
    if ((cur >> 32) != (generation & 0xFFFFFFFFu) || (cur & kClosed)) return false;
    if (gate_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) return true;
  }
}

void ThreadPool::leave() {
  const uint64_t now = gate_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  if ((now & kClosed) && (now & kCount) == 0) {
    std::lock_guard<std::mutex> lk(mu_);
    done_cv_.notify_one();
  }
}

void ThreadPool::worker_main(int thread) {
  uint64_t seen = 0;
  for (;;) {
    for (int s = 0; s < kSpin && published_.load(std::memory_order_acquire) == seen; ++s) cpu_relax();
    Call call;
    void* ctx;
    int n;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      call = call_, ctx = ctx_, n = n_;
    }
    if (!enter(seen)) continue;  // the caller already took every task
    work(call, ctx, n, thread);
    leave();
  }
}

void ThreadPool::run_impl(int n, Call call, void* ctx) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty() || t_in_task) {
    const bool outer = t_in_task;
    t_in_task = true;
    for (int i = 0; i < n; ++i) call(ctx, i, 0);
    t_in_task = outer;
    return;
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(mu_);
    call_ = call, ctx_ = ctx, n_ = n, error_ = nullptr;
    next_.store(0, std::memory_order_relaxed);
    gen = ++generation_;
    gate_.store((gen & 0xFFFFFFFFu) << 32, std::memory_order_release);
    published_.store(gen, std::memory_order_release);
  }
  start_cv_.notify_all();
  work(call, ctx, n, 0);
  gate_.fetch_or(kClosed, std::memory_order_acq_rel);
  for (int s = 0; s < kSpin && (gate_.load(std::memory_order_acquire) & kCount) != 0; ++s) cpu_relax();
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return (gate_.load(std::memory_order_acquire) & kCount) == 0; });
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace wren::cpu
