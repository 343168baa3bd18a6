// One model, many clients: generation jobs run one at a time on the one Engine, in arrival order
// (FIFO), each with its own SequenceState. A job streams its text pieces to the HTTP thread that
// waits on it; the client side can cancel it at any time (queued or running).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/engine.h"
#include "server/openai_json.h"

namespace wren::server {

/// A piece of streamed output: reasoning (think channel) or content (answer).
struct Piece {
  bool reasoning = false;
  std::string text;
};

/// One generation: the prepared prompt and options in, pieces and a GenResult out.
class Job {
 public:
  Job(GenRequest req, std::vector<int> prompt, int max_tokens)
      : req(std::move(req)), prompt(std::move(prompt)), max_tokens(max_tokens) {}
  const GenRequest req;
  const std::vector<int> prompt;
  const int max_tokens;

  /// Client side: waits up to `timeout` for pieces; moves them into `out`. Returns true once the
  /// job is finished and every piece has been taken.
  bool take(std::vector<Piece>& out, std::chrono::milliseconds timeout);
  /// Client side: blocks until the job is finished.
  void wait();
  /// Client side: the client is gone; the job stops after its current token (or never starts).
  void cancel() { halt_ = true, client_gone_ = true; }
  /// The result; valid after take() returned true or wait() returned.
  const GenResult& result() const { return result_; }
  /// Non-empty when generation failed (the message of the exception).
  const std::string& error() const { return error_; }

  // Worker side.
  void emit(bool reasoning, const std::string& text);
  void finish(GenResult r, std::string error = "");
  void stop() { halt_ = true; }
  const std::atomic<bool>& halt_flag() const { return halt_; }
  bool client_gone() const { return client_gone_; }
  /// Whether the client had gone when the job finished.
  bool was_cancelled() const { return was_cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> pieces_;
  bool done_ = false, was_cancelled_ = false;
  GenResult result_;
  std::string error_;
  std::atomic<bool> halt_{false}, client_gone_{false};
};

/// Counters shown by GET /health.
struct QueueStats {
  long long queued = 0, completed = 0, cancelled = 0, failed = 0;
  bool busy = false;
};

/// The FIFO of jobs and the one worker thread that runs them on the Engine.
class GenQueue {
 public:
  /// `max_queue`: jobs waiting (not counting the running one) beyond which submit() refuses.
  GenQueue(Engine& engine, int max_queue);
  ~GenQueue();
  GenQueue(const GenQueue&) = delete;
  GenQueue& operator=(const GenQueue&) = delete;
  /// Appends a job; throws RequestError 503 when the queue is full.
  void submit(const std::shared_ptr<Job>& job);
  QueueStats stats();

 private:
  void loop();
  void run(Job& job);
  Engine& engine_;
  const int max_queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  QueueStats stats_;
  bool quit_ = false;
  std::thread worker_;
};

}  // namespace wren::server
