// The multi-process pipeline (docs/parallel.md): one process (rank) per stage, each holding only
// its stage's layers, linked by a Transport (NCCL between GPUs). Rank 0 drives: it embeds, runs
// stage 0 and returns the logits the last rank sends back, so generation, sampling and the
// tokenizer stay in rank 0; every other rank runs rank_worker_loop until rank 0 says stop.
//
// Per step rank 0 sends each other rank a control header (4 int32: op, T, all_logits,
// want_logits), then the boundary activations flow rank r -> r+1 (P and the AttnRes snapshots,
// Forward::send_boundary), and the last rank sends the logits rows to rank 0.
#pragma once
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/forward.h"
#include "model/load.h"
#include "model/expert_parallel.h"
#include "model/pipeline.h"
#include "ops/thread_transport.h"
#include "ops/transport.h"

namespace wren {

/// The control words of one step (RankPipeline -> every other rank).
enum class RankOp : int { Run = 1, Reset = 2, Stop = 3 };

/// Rank 0's step: a TokenStep over the whole model whose layers beyond stage 0 run in the other
/// ranks. One sequence at a time (the other ranks hold one state each): a state at position 0
/// makes the other ranks reset theirs; a state at another position must be the last one run.
/// run_batch over more than one sequence throws. The destructor tells the other ranks to stop.
class RankPipeline final : public TokenStep {
 public:
  /// `be` holds stage 0's weights (weight_list(w, 0, plan.end(0), true, world == 1)); `t` links
  /// the ranks (t.rank() == 0, t.world() == plan.stages()).
  RankPipeline(const Model& model, Backend& be, Transport& t, const StagePlan& plan, ForwardOptions opts = {});
  ~RankPipeline() override;
  void run(SequenceState& state, const int* ids, const float* x0, int T, float* logits, bool all_logits,
           const ForwardHooks* hooks = nullptr) override;
  void run_batch(SequenceState* const* states, const int* ids, int B, float* logits) override;
  Backend& backend() override { return be_; }
  const Config& config() const override { return model_.config; }
  int layers_run() const override { return plan_.end(plan_.stages() - 1); }
  /// A fresh state holding stage 0's layers only.
  std::unique_ptr<SequenceState> new_sequence(int capacity) const;
  /// Sends Stop to every other rank (once; the destructor calls it too). Never throws.
  void stop() noexcept;

 private:
  void header(RankOp op, int T, bool all_logits, bool want_logits);
  const Model& model_;
  Backend& be_;
  Transport& t_;
  StagePlan plan_;
  int chunk_;
  std::unique_ptr<Forward> fwd_;
  float* logits_dev_ = nullptr;  ///< [chunk, V] on be_: the last rank's logits arrive here
  const SequenceState* last_ = nullptr;
  bool stopped_ = false;
};

/// The loop of rank r >= 1: holds stage r (`be` has its weights), one sequence state of `capacity`
/// tokens, and runs each step rank 0 announces until Stop. Returns normally on Stop; throws
/// wren::Error on a transport failure or a bad header.
void rank_worker_loop(const Model& model, Backend& be, Transport& t, const StagePlan& plan, int capacity,
                      ForwardOptions opts = {});

/// `--expert-parallel` in one process (docs/parallel.md): ranks 1.. of the expert shard are
/// threads, each with its own backend, serving their experts (expert_worker_loop) over a
/// ThreadTransport; rank 0 is the caller's forward, built with ForwardOptions::experts = link().
class ExpertRanks {
 public:
  /// Starts ranks 1..: `workers` [shard.ranks() - 1] are their backends (owned; each must hold
  /// its rank's experts: on the CPU, the model's mapped experts). `lead` is rank 0's backend.
  /// A worker that fails aborts the world, so rank 0's next layer throws with its message.
  ExpertRanks(const Model& model, Backend& lead, std::vector<std::unique_ptr<Backend>> workers, ExpertShard shard);
  /// Tells the workers to stop and joins them. Every forward using link() must be gone by then.
  ~ExpertRanks();
  ExpertRanks(const ExpertRanks&) = delete;
  ExpertRanks& operator=(const ExpertRanks&) = delete;
  /// Rank 0's link (its ThreadTransport and the shard).
  ExpertLink link() { return ExpertLink{&lead_t_, shard_}; }
  const ExpertShard& shard() const { return shard_; }
  /// "expert parallel 3 ranks: experts 0-5 | 6-10 | 11-15 (threads transport, cpu ranks)".
  std::string describe() const;

 private:
  const Model& model_;
  Backend& lead_;
  ExpertShard shard_;
  ThreadWorld world_;
  ThreadTransport lead_t_;
  std::vector<std::unique_ptr<Backend>> workers_;
  std::vector<std::unique_ptr<ThreadTransport>> ts_;
  std::vector<std::thread> threads_;
};

/// [n_layers]: `be` for the layers of stage s, null elsewhere (a rank's slice of a sequence state).
std::vector<Backend*> stage_layer_backends(const Config& c, const StagePlan& plan, int s, Backend& be);

}  // namespace wren
