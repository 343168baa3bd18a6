// A small fork-join thread pool for the CPU backend: run(n, f) calls f(task, thread) for every
// task in [0, n) across the pool's threads (the caller is thread 0) and returns when all are done.
// Tasks are handed out dynamically, so which thread runs a task varies; kernels therefore give each
// task a fixed set of outputs computed in a fixed order, which keeps results independent of the
// thread count and of scheduling.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace wren::cpu {

class ThreadPool {
 public:
  /// `threads` >= 1 threads in all, the caller included (threads - 1 workers are started).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return int(workers_.size()) + 1; }

  /// Calls f(task, thread) for task in [0, n), thread in [0, threads()). Runs inline when n <= 1,
  /// with one thread, or when called from inside a task. Rethrows the first exception a task threw.
  template <class F>
  void run(int n, F&& f) {
    using Fn = std::remove_reference_t<F>;
    run_impl(n, [](void* c, int task, int th) { (*static_cast<Fn*>(c))(task, th); }, &f);
  }

 private:
  using Call = void (*)(void*, int, int);
  void run_impl(int n, Call call, void* ctx);
  void work(Call call, void* ctx, int n, int thread);
  void worker_main(int thread);
  bool enter(uint64_t generation);
  void leave();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;  // guarded by mu_; bumped once per run
  std::atomic<uint64_t> published_{0};  // generation_ mirrored for the workers' spin phase
  bool stop_ = false;
  Call call_ = nullptr;
  void* ctx_ = nullptr;
  int n_ = 0;
  std::atomic<int> next_{0};
  // Who may still touch the current run: (generation << 32) | closed bit | workers inside. The
  // caller closes the run once every task is taken and waits only for workers already inside, so
  // a worker the OS has not scheduled yet never delays the caller (a shared, loaded machine).
  std::atomic<uint64_t> gate_{0};
  std::exception_ptr error_;
};

}  // namespace wren::cpu
