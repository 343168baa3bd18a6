// The generation queue: one worker thread runs jobs in arrival order on the one Engine.
#include "server/gen_queue.h"

#include <algorithm>

#include "runtime/generate.h"
#include "server/stop_matcher.h"
#include "tokenizer/stream_decoder.h"

namespace wren::server {

bool Job::take(std::vector<Piece>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return done_ || !pieces_.empty(); });
  while (!pieces_.empty()) out.push_back(std::move(pieces_.front())), pieces_.pop_front();
  return done_;
}

void Job::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
}

void Job::emit(bool reasoning, const std::string& text) {
  if (text.empty()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (!pieces_.empty() && pieces_.back().reasoning == reasoning)
    pieces_.back().text += text;  // the reader is behind: coalesce
  else
    pieces_.push_back({reasoning, text});
  cv_.notify_all();
}

void Job::finish(GenResult r, std::string error) {
  std::lock_guard<std::mutex> lk(mu_);
  result_ = std::move(r);
  error_ = std::move(error);
  was_cancelled_ = client_gone_;
  done_ = true;
  cv_.notify_all();
}

GenQueue::GenQueue(Engine& engine, int max_queue) : engine_(engine), max_queue_(max_queue) {
  worker_ = std::thread([this] { loop(); });
}

GenQueue::~GenQueue() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  worker_.join();
  for (auto& j : jobs_) j->finish({}, "the server is shutting down");
}

void GenQueue::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (int(jobs_.size()) >= max_queue_)
    throw RequestError(503, "the server is busy: " + std::to_string(jobs_.size()) +
                                " requests are already waiting (--max-queue); retry later", "", "queue_full");
  jobs_.push_back(job);
  ++stats_.queued;
  cv_.notify_all();
}

QueueStats GenQueue::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void GenQueue::loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return quit_ || !jobs_.empty(); });
      if (quit_) return;
      job = jobs_.front();
      jobs_.pop_front();
      --stats_.queued;
      stats_.busy = true;
    }
    bool failed = false;
    if (job->client_gone()) {
      job->finish({});
    } else {
      try {
        run(*job);
      } catch (const std::exception& e) {
        job->finish({}, e.what());
        failed = true;
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    stats_.busy = false;
    ++(failed ? stats_.failed : job->was_cancelled() ? stats_.cancelled : stats_.completed);
  }
}

void GenQueue::run(Job& job) {
  const Tokenizer& tok = engine_.tokenizer();
  GenerateOptions o;
  o.max_new_tokens = job.max_tokens;
  o.stop_ids = engine_.config().eos_ids;
  o.sampling = job.req.sampling;
  o.cancel = &job.halt_flag();
  std::unique_ptr<ChatFormat> fmt;
  std::unique_ptr<ReplyParser> parser;
  if (job.req.chat) {
    fmt = std::make_unique<ChatFormat>(tok);
    parser = std::make_unique<ReplyParser>(*fmt, job.req.thinking);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), fmt->end_of_msg()) == o.stop_ids.end())
      o.stop_ids.push_back(fmt->end_of_msg());
  }
  StreamDecoder text(tok), thought(tok);
  StopMatcher stop(job.req.stop);
  GenResult r;
  auto content = [&](const std::string& s) {
    const std::string out = stop.push(s);
    r.content += out;
    job.emit(false, out);
    if (stop.matched()) job.stop();
  };
  auto reasoning = [&](const std::string& s) {
    r.reasoning += s;
    job.emit(true, s);
  };
  auto on_token = [&](int id) {
    if (parser) {
      const ReplyParser::Channel ch = parser->push(id);
      if (ch == ReplyParser::Channel::Think) reasoning(thought.push(id));
      if (ch == ReplyParser::Channel::Response) content(text.push(id));
    } else if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) == o.stop_ids.end()) {
      content(text.push(id));
    }
  };
  auto st = engine_.new_sequence();
  GenerateStats stats;
  generate(engine_.forward(), *st, job.prompt, o, &stats, on_token);
  reasoning(thought.finish());
  content(text.finish());
  const std::string tail = stop.flush();
  r.content += tail;
  job.emit(false, tail);
  r.prompt_tokens = int(job.prompt.size());
  r.completion_tokens = stats.generated_tokens;
  r.finish_reason = stats.stopped || stop.matched() ? "stop" : "length";
  job.finish(std::move(r));
}

}  // namespace wren::server
