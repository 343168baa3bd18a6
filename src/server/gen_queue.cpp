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

void Job::emit(Piece p) {
  if (p.kind != Piece::Kind::Tool && p.text.empty() && p.logprobs.empty()) return;
  std::lock_guard<std::mutex> lk(mu_);
  Piece* last = pieces_.empty() ? nullptr : &pieces_.back();
  if (last && last->kind == p.kind && p.kind != Piece::Kind::Tool) {  // the reader is behind: coalesce
    last->text += p.text;
    last->logprobs.insert(last->logprobs.end(), p.logprobs.begin(), p.logprobs.end());
  } else if (last && p.kind == Piece::Kind::Tool && last->kind == p.kind && last->tool.index == p.tool.index &&
             p.tool.name.empty()) {
    last->tool.arguments += p.tool.arguments;
  } else {
    pieces_.push_back(std::move(p));
  }
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

GenQueue::GenQueue(Engine& engine, int max_queue, PrefixCache* cache, int max_seqs, int max_batch_tokens)
    : engine_(engine), max_queue_(max_queue), cache_(cache), max_seqs_(max_seqs), max_batch_tokens_(max_batch_tokens) {
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
  if (draining_) throw RequestError(503, "the server is shutting down", "", "shutting_down");
  if (int(jobs_.size()) >= max_queue_)
    throw RequestError(503, "the server is busy: " + std::to_string(jobs_.size()) +
                                " requests are already waiting (--max-queue); retry later", "", "queue_full");
  jobs_.push_back(job);
  ++stats_.queued;
  cv_.notify_all();
}

void GenQueue::drain() {
  std::deque<std::shared_ptr<Job>> waiting;
  {
    std::lock_guard<std::mutex> lk(mu_);
    draining_ = true;
    waiting.swap(jobs_);
    stats_.queued -= int(waiting.size());
    for (const auto& w : admitted_)
      if (const auto j = w.lock()) j->stop();
  }
  for (const auto& j : waiting) j->finish({}, "the server is shutting down");
  cv_.notify_all();
}

QueueStats GenQueue::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  QueueStats s = stats_;
  if (cache_ && cache_->enabled()) s.has_prefix_cache = true, s.prefix = cache_->stats();
  return s;
}

void GenQueue::loop() {
  Scheduler sched(engine_.forward(), [this] { return engine_.new_sequence(); }, std::max(1, max_seqs_),
                  max_batch_tokens_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.max_seqs = sched.max_seqs(), stats_.max_batch_tokens = sched.max_batch_tokens();
  }
  for (;;) {
    std::vector<std::shared_ptr<Job>> admit_now;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return quit_ || !jobs_.empty() || !sched.idle(); });
      if (quit_) return;
      // New requests join between decode steps, oldest first, while slots are free.
      while (!jobs_.empty() && sched.running() + sched.waiting() + int(admit_now.size()) < sched.max_seqs()) {
        std::erase_if(admitted_, [](const std::weak_ptr<Job>& w) { return w.expired(); });
        admitted_.push_back(jobs_.front());
        if (draining_) jobs_.front()->stop();
        admit_now.push_back(jobs_.front());
        jobs_.pop_front();
        --stats_.queued;
      }
      stats_.busy = true;
    }
    for (const auto& job : admit_now) {
      if (!replay_.empty()) {  // test hook: one job at a time, no model
        bool failed = false;
        try {
          run(*job);
        } catch (const std::exception& e) {
          job->finish({}, e.what());
          failed = true;
        }
        std::lock_guard<std::mutex> lk(mu_);
        ++(failed ? stats_.failed : job->was_cancelled() ? stats_.cancelled : stats_.completed);
        continue;
      }
      admit(sched, job);
    }
    if (!sched.idle()) sched.step();
    std::lock_guard<std::mutex> lk(mu_);
    if (const ExpertStore* store = engine_.store()) {  // read here, on the thread that uses the store
      stats_.has_store = true;
      stats_.expert_hits = store->stats().hits;
      stats_.expert_misses = store->stats().misses;
      stats_.expert_bytes_read = store->stats().bytes_read;
    }
    stats_.running = sched.running();
    stats_.prefilling = sched.prefilling();
    stats_.busy = !sched.idle();
    stats_.last_decode_rows = sched.last_decode_rows(), stats_.last_prefill_rows = sched.last_prefill_rows();
    stats_.decode_rows += uint64_t(sched.last_decode_rows()), stats_.prefill_rows += uint64_t(sched.last_prefill_rows());
    if (sched.last_decode_rows() + sched.last_prefill_rows() > 0) ++stats_.steps;
    const Backend::ExpertTraffic tr = engine_.forward().backend().expert_traffic();
    if (sched.last_prefill_rows() == 0 && sched.last_decode_rows() > 0 && tr.bytes >= stats_.expert_bytes) {
      stats_.decode_step_expert_bytes += tr.bytes - stats_.expert_bytes;
      stats_.decode_step_tokens += uint64_t(sched.last_decode_rows());
    }
    stats_.expert_visits = tr.visits, stats_.expert_bytes = tr.bytes;
  }
}

void GenQueue::admit(Scheduler& sched, const std::shared_ptr<Job>& job) {
  auto out = std::make_shared<ReplyStream>(engine_.tokenizer(), *job, engine_.config().eos_ids, metrics_);
  SeqRequest r;
  r.prompt = job->prompt;
  GenerateOptions& o = r.opts;
  o.max_new_tokens = job->max_tokens;
  o.stop_ids = out->stop_ids();
  o.sampling = job->req.sampling;
  o.cancel = &job->halt_flag();
  o.prefix_cache = cache_;
  if (out->constrained()) o.constrain = [out](float* logits, int n) { out->mask(logits, n); };
  if (job->req.logprobs) {
    o.top_logprobs = job->req.top_logprobs;
    o.on_logprobs = [out](const TokenLogprobs& lp) { out->logprobs(lp); };
  }
  r.on_token = [out](int id) { out->token(id); };
  r.on_done = [this, job, out](const GenerateStats& st) {
    out->cached(st.cached_tokens);
    {
      std::lock_guard<std::mutex> lk(mu_);  // before the client sees its reply
      stats_.generated_tokens += uint64_t(st.generated_tokens);
    }
    out->finish(st.generated_tokens, st.stopped);
    std::lock_guard<std::mutex> lk(mu_);
    ++(job->was_cancelled() ? stats_.cancelled : stats_.completed);
  };
  r.on_error = [this, job](const std::string& msg) {
    job->finish({}, msg);
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.failed;
  };
  sched.add(std::move(r));
}

ReplyStream::ReplyStream(const Tokenizer& tok, Job& job, std::vector<int> stop_ids, Metrics* metrics)
    : tok_(tok), job_(job), stop_ids_(std::move(stop_ids)), metrics_(metrics), text_(tok), thought_(tok), stop_(job.req.stop) {
  if (job.req.chat) {
    fmt_ = std::make_unique<ChatFormat>(tok);
    parser_ = std::make_unique<ReplyParser>(*fmt_, job.req.thinking);
    if (std::find(stop_ids_.begin(), stop_ids_.end(), fmt_->end_of_msg()) == stop_ids_.end())
      stop_ids_.push_back(fmt_->end_of_msg());
    const GenRequest& q = job.req;
    if (q.tool_choice == ToolChoice::Named) {
      rule_.kind = ReplyRule::Kind::ToolCall;
      rule_.tools = {q.tool_choice_name};
    } else if (q.tool_choice == ToolChoice::Required) {
      rule_.kind = ReplyRule::Kind::ToolCall;
      for (const auto& t : q.tools) rule_.tools.push_back(t["function"]["name"].get<std::string>());
    } else if (q.response_format != "text") {
      rule_.kind = ReplyRule::Kind::JsonObject;
      if (q.json_schema.contains("required"))
        for (const auto& k : q.json_schema["required"]) rule_.required.push_back(k.get<std::string>());
    }
    if (rule_.kind != ReplyRule::Kind::Free)
      constraint_ = std::make_unique<ReplyConstraint>(*fmt_, rule_, q.thinking, stop_ids_);
  }
}

LogprobEntry ReplyStream::entry(const TokenLogprobs& lp) const {
  LogprobEntry e{std::string(tok_.token_bytes(lp.id)), lp.logprob, {}};
  for (const auto& [id, v] : lp.top) e.top.push_back({std::string(tok_.token_bytes(id)), v});
  return e;
}

void ReplyStream::content(const std::string& s, std::vector<LogprobEntry> lps) {
  Piece p;
  p.text = stop_.push(s);
  r_.content += p.text;
  r_.logprobs.insert(r_.logprobs.end(), lps.begin(), lps.end());
  p.logprobs = std::move(lps);
  job_.emit(std::move(p));
  if (stop_.matched()) job_.stop();
}

void ReplyStream::reasoning(const std::string& s) {
  r_.reasoning += s;
  Piece p;
  p.kind = Piece::Kind::Reasoning;
  p.text = s;
  job_.emit(std::move(p));
}

void ReplyStream::tool_deltas() {
  for (ToolCallDelta& d : parser_->take_deltas()) {
    Piece p;
    p.kind = Piece::Kind::Tool;
    if (!d.name.empty()) p.tool_id = !d.id.empty() ? d.id : "call_" + job_.id + "_" + std::to_string(d.index);
    p.tool = std::move(d);
    job_.emit(std::move(p));
  }
}

void ReplyStream::token(int id) {
  const auto now = std::chrono::steady_clock::now();
  if (tokens_++ == 0) r_.ttft_s = std::chrono::duration<double>(now - job_.submitted).count();
  else r_.gaps_s.push_back(std::chrono::duration<double>(now - last_).count());
  last_ = now;
  if (constraint_) constraint_->accept(id);
  std::vector<LogprobEntry> lps;
  const bool want = has_lp_ && job_.req.logprobs;
  has_lp_ = false;
  if (parser_) {
    const ReplyParser::Channel ch = parser_->push(id);
    if (ch == ReplyParser::Channel::Think) reasoning(thought_.push(id));
    if (ch == ReplyParser::Channel::Response) {
      if (want) lps.push_back(entry(lp_));
      content(text_.push(id), std::move(lps));
    }
    if (ch == ReplyParser::Channel::Tag || ch == ReplyParser::Channel::Tools) tool_deltas();
  } else if (std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) {
    if (want) lps.push_back(entry(lp_));
    content(text_.push(id), std::move(lps));
  }
}

void ReplyStream::finish(int generated_tokens, bool stopped) {
  reasoning(thought_.finish());
  content(text_.finish(), {});
  Piece tail;
  tail.text = stop_.flush();
  r_.content += tail.text;
  job_.emit(std::move(tail));
  if (parser_) {
    const std::vector<ParsedToolCall>& calls = parser_->calls();
    for (size_t k = 0; k < calls.size(); ++k)
      if (calls[k].complete)
        r_.tool_calls.push_back({!calls[k].id.empty() ? calls[k].id : "call_" + job_.id + "_" + std::to_string(k),
                                 calls[k].name, calls[k].arguments});
  }
  r_.prompt_tokens = int(job_.prompt.size());
  r_.completion_tokens = generated_tokens;
  r_.finish_reason = stop_.matched() ? "stop" : !stopped ? "length" : !r_.tool_calls.empty() ? "tool_calls" : "stop";
  if (rule_.kind != ReplyRule::Kind::Free && r_.finish_reason != "length" && !job_.client_gone()) {
    r_.invalid = rule_.check(parser_->calls(), r_.content);
    if (!r_.invalid.empty()) r_.invalid = "the model's reply breaks the request's " +
        std::string(rule_.kind == ReplyRule::Kind::ToolCall ? "tool_choice" : "response_format") + ": " + r_.invalid;
  }
  if (metrics_) metrics_->generation(r_.prompt_tokens, r_.completion_tokens, r_.ttft_s, r_.gaps_s);
  job_.finish(std::move(r_));
}

void GenQueue::run(Job& job) {
  ReplyStream out(engine_.tokenizer(), job, engine_.config().eos_ids, metrics_);
  if (!replay_.empty()) {  // test hook: replay ids instead of the model
    const std::vector<int>& ids = replay_[replayed_++ % replay_.size()];
    int n = 0;
    bool stopped = false;
    std::vector<float> fake;  // constrained: the replayed id if the constraint allows it, else the lowest allowed
    for (; n < int(ids.size()) && n < job.max_tokens && !job.halt_flag();) {
      int id = ids[size_t(n++)];
      if (out.constrained()) {
        fake.assign(size_t(engine_.config().vocab), 0.f);
        if (id >= 0 && id < int(fake.size())) fake[size_t(id)] = 1.f;
        out.mask(fake.data(), int(fake.size()));
        id = argmax(fake.data(), int(fake.size()));
      }
      out.token(id);
      stopped = std::find(out.stop_ids().begin(), out.stop_ids().end(), id) != out.stop_ids().end();
      if (stopped) break;
    }
    out.finish(n, stopped);
    return;
  }
  GenerateOptions o;
  o.max_new_tokens = job.max_tokens;
  o.stop_ids = out.stop_ids();
  o.sampling = job.req.sampling;
  o.cancel = &job.halt_flag();
  if (out.constrained()) o.constrain = [&](float* logits, int n) { out.mask(logits, n); };
  if (job.req.logprobs) {
    o.top_logprobs = job.req.top_logprobs;
    o.on_logprobs = [&](const TokenLogprobs& lp) { out.logprobs(lp); };
  }
  o.prefix_cache = cache_;
  auto st = engine_.new_sequence();
  GenerateStats stats;
  generate(engine_.forward(), *st, job.prompt, o, &stats, [&](int id) { out.token(id); });
  out.cached(stats.cached_tokens);
  out.finish(stats.generated_tokens, stats.stopped);
}

}  // namespace wren::server
