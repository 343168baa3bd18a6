// The multi-process pipeline (see rank_pipeline.h).
#include "runtime/rank_pipeline.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>

#include "core/error.h"

namespace wren {

std::vector<Backend*> stage_layer_backends(const Config& c, const StagePlan& plan, int s, Backend& be) {
  std::vector<Backend*> out(size_t(c.n_layers), nullptr);
  for (int i = plan.first(s); i < plan.end(s); ++i) out[size_t(i)] = &be;
  return out;
}

namespace {

/// Stage s's forward options: its layers and its neighbours (the chain 0 -> 1 -> ... -> S-1).
ForwardOptions stage_options(ForwardOptions o, const StagePlan& plan, int s, Transport& t) {
  const int S = plan.stages();
  o.first_layer = plan.first(s);
  o.layers = plan.end(s);
  o.link = StageLink{S > 1 ? &t : nullptr, s > 0 ? s - 1 : -1, s + 1 < S ? s + 1 : -1};
  return o;
}

}  // namespace

RankPipeline::RankPipeline(const Model& model, Backend& be, Transport& t, const StagePlan& plan, ForwardOptions opts)
    : model_(model), be_(be), t_(t), plan_(plan), chunk_(opts.max_chunk) {
  check(t.rank() == 0 && t.world() == plan.stages(),
        "pipeline: rank " + std::to_string(t.rank()) + " of " + std::to_string(t.world()) + " ranks drives a plan of " +
            std::to_string(plan.stages()) + " stages (rank 0 drives, one stage per rank)");
  fwd_ = std::make_unique<Forward>(model, be, stage_options(opts, plan, 0, t));
  logits_dev_ = be_.alloc(size_t(chunk_) * model.config.vocab);
}

RankPipeline::~RankPipeline() {
  stop();
  be_.release(logits_dev_);
}

void RankPipeline::header(RankOp op, int T, bool all_logits, bool want_logits) {
  const int h[4] = {int(op), T, all_logits ? 1 : 0, want_logits ? 1 : 0};
  for (int r = 1; r < t_.world(); ++r) t_.send_host(h, 4, r);
}

void RankPipeline::stop() noexcept {
  if (stopped_) return;
  stopped_ = true;
  try {
    header(RankOp::Stop, 0, false, false);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wren: pipeline: telling the other ranks to stop failed: %s\n", e.what());
  }
}

std::unique_ptr<SequenceState> RankPipeline::new_sequence(int capacity) const {
  return std::make_unique<SequenceState>(stage_layer_backends(model_.config, plan_, 0, be_), model_.config, capacity);
}

void RankPipeline::run(SequenceState& st, const int* ids, const float* x0, int T, float* logits, bool all_logits,
                       const ForwardHooks* hooks) {
  check(!stopped_, "pipeline: the other ranks were told to stop");
  check(hooks == nullptr || (!hooks->before_layer && !hooks->trace && !hooks->dump), "pipeline: validation hooks (--trace, --dump-layer, validate) need a single stage");
  // The other ranks hold one sequence: a state at position 0 starts a new one there (by position,
  // not by address: a new state may reuse a freed one's address); any other must be the last one.
  if (st.position() == 0) {
    header(RankOp::Reset, 0, false, false);
    last_ = &st;
  } else {
    check(&st == last_, "pipeline: the other ranks hold another sequence; a multi-process pipeline runs one "
                        "sequence at a time (start a new one from position 0)");
  }
  const size_t V = model_.config.vocab, D = model_.config.hidden;
  const int S = plan_.stages();
  for (int t0 = 0; t0 < T; t0 += chunk_) {
    const int n = std::min(chunk_, T - t0);
    float* out = chunk_logits(logits, all_logits, t0, n, T, V);
    if (S == 1) {
      fwd_->run(st, ids + t0, x0 ? x0 + t0 * D : nullptr, n, out, all_logits);
      continue;
    }
    header(RankOp::Run, n, all_logits, out != nullptr);
    fwd_->run(st, ids + t0, x0 ? x0 + t0 * D : nullptr, n, nullptr, all_logits);
    st.advance(n);  // stage 0 is not the last stage: its Forward leaves the position alone
    if (out) {
      const size_t rows = all_logits ? size_t(n) : 1;
      t_.recv(be_, logits_dev_, rows * V, S - 1);
      be_.to_host(logits_dev_, rows * V, out);
    }
  }
}

void RankPipeline::run_batch(SequenceState* const* states, const int* ids, int B, float* logits) {
  check(B == 1, "pipeline: a multi-process pipeline decodes one sequence at a time (batch of " + std::to_string(B) + ")");
  run(*states[0], ids, nullptr, 1, logits, false);
}

void rank_worker_loop(const Model& model, Backend& be, Transport& t, const StagePlan& plan, int capacity,
                      ForwardOptions opts) {
  const int r = t.rank(), S = plan.stages();
  check(r >= 1 && r < S && t.world() == S, "pipeline: worker rank " + std::to_string(r) + " of " +
                                                std::to_string(t.world()) + " ranks, " + std::to_string(S) + " stages");
  const Config& c = model.config;
  Forward fwd(model, be, stage_options(opts, plan, r, t));
  SequenceState st(stage_layer_backends(c, plan, r, be), c, capacity);
  const size_t V = c.vocab;
  std::vector<int> ids(size_t(opts.max_chunk), 0);  // later stages never embed: ids are unused
  std::vector<float> host;
  float* dev = r + 1 == S ? be.alloc(size_t(opts.max_chunk) * V) : nullptr;
  try {
    for (;;) {
      int h[4];
      t.recv_host(h, 4, 0);
      const RankOp op = RankOp(h[0]);
      if (op == RankOp::Stop) break;
      if (op == RankOp::Reset) {
        st.reset();
        continue;
      }
      check(op == RankOp::Run && h[1] >= 1 && h[1] <= opts.max_chunk,
            "pipeline: rank " + std::to_string(r) + " got a bad header (op " + std::to_string(h[0]) + ", T " +
                std::to_string(h[1]) + ")");
      const int T = h[1];
      const bool all = h[2] != 0, want = h[3] != 0 && r + 1 == S;
      const size_t rows = all ? size_t(T) : 1;
      host.resize(rows * V);
      fwd.run(st, ids.data(), nullptr, T, want ? host.data() : nullptr, all);
      if (r + 1 < S) st.advance(T);  // the last stage's Forward advanced it
      if (want) {
        be.from_host(host.data(), rows * V, dev);
        t.send(be, dev, rows * V, 0);
      }
    }
  } catch (...) {
    if (dev) be.release(dev);
    throw;
  }
  if (dev) be.release(dev);
}

ExpertRanks::ExpertRanks(const Model& model, Backend& lead, std::vector<std::unique_ptr<Backend>> workers,
                         ExpertShard shard)
    : model_(model), lead_(lead), shard_(std::move(shard)), world_(shard_.ranks(), 0), lead_t_(world_, 0),
      workers_(std::move(workers)) {
  check(int(workers_.size()) + 1 == shard_.ranks(), "expert parallelism: " + std::to_string(workers_.size()) +
                                                        " worker backends for " + std::to_string(shard_.ranks()) + " ranks");
  for (int r = 1; r < shard_.ranks(); ++r) ts_.push_back(std::make_unique<ThreadTransport>(world_, r));
  for (int r = 1; r < shard_.ranks(); ++r)
    threads_.emplace_back([this, r] {
      try {
        expert_worker_loop(model_, *workers_[size_t(r) - 1], *ts_[size_t(r) - 1], shard_);
      } catch (const std::exception& e) {
        world_.abort("expert rank " + std::to_string(r) + ": " + e.what());
      }
    });
}

ExpertRanks::~ExpertRanks() {
  // A graceful stop; when rank 0 failed midway through a layer round the workers wait for a message
  // of that round instead, so after 10 s the world is aborted (every wait then ends with an error).
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> l(m);
    if (!cv.wait_for(l, std::chrono::seconds(10), [&] { return done; }))
      world_.abort("rank 0 stopped, and the expert ranks did not answer within 10 s");
  });
  ExpertParallelMoe(model_.config, lead_, lead_t_, shard_).stop();
  {
    std::lock_guard<std::mutex> l(m);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  for (std::thread& t : threads_) t.join();
}

std::string ExpertRanks::describe() const {
  return "expert parallel " + shard_.describe() + " (threads transport, " +
         (workers_.empty() ? lead_.name() : workers_[0]->name()) + " ranks)";
}

}  // namespace wren
