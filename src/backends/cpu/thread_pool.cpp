// The CPU backend's fork-join pool (see thread_pool.h). Workers spin briefly on a new generation
// (decode issues many small back-to-back runs), then block on a condition variable so an idle pool
// costs nothing on a shared machine.
#include "backends/cpu/thread_pool.h"

#include <algorithm>

#include "backends/cpu/simd.h"

namespace wren::cpu {

namespace {
thread_local bool t_in_task = false;
constexpr int kSpin = 4000;  // pause iterations before blocking (tens of microseconds)

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

void ThreadPool::work(int thread) {
  t_in_task = true;
  for (int i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) {
    try {
      call_(ctx_, i, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
  t_in_task = false;
}

void ThreadPool::worker_main(int thread) {
  uint64_t seen = 0;
  for (;;) {
    for (int s = 0; s < kSpin && published_.load(std::memory_order_acquire) == seen; ++s) cpu_relax();
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
    }
    work(thread);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_one();
    }
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    call_ = call, ctx_ = ctx, n_ = n, error_ = nullptr;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  start_cv_.notify_all();
  work(0);
  for (int s = 0; s < kSpin && pending_.load(std::memory_order_acquire) != 0; ++s) cpu_relax();
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace wren::cpu
