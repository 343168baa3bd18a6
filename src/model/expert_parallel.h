// Expert parallelism (docs/parallel.md, "Expert parallelism"): the routed experts of every MoE
// layer split over the ranks of a Transport; each rank routes its own tokens, sends each (token,
// slot) row to the rank owning the chosen expert, the owner runs its experts on the rows it got and
// sends each result back, and the token's rank sums the k results in slot order. Summing in slot
// order (never in arrival order) keeps the output bit-identical to the single-rank
// Backend::routed_moe whatever the shard (tests/expert_parallel_test.cpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/load.h"
#include "ops/backend.h"
#include "ops/transport.h"

namespace wren {

/// The routed experts of a layer split over ranks in contiguous blocks: rank r owns experts
/// [first(r), end(r)), every rank at least one.
struct ExpertShard {
  std::vector<int> bounds = {0, 1};  ///< [ranks + 1]: 0 = b0 < b1 < ... < b_ranks = n_experts
  int ranks() const { return int(bounds.size()) - 1; }
  int n_experts() const { return bounds.back(); }
  int first(int r) const { return bounds[size_t(r)]; }
  int end(int r) const { return bounds[size_t(r) + 1]; }
  /// The rank owning expert e (0 <= e < n_experts).
  int owner(int e) const;
  /// "3 ranks: experts 0-5 | 6-10 | 11-15".
  std::string describe() const;
};

/// Balanced blocks: sizes differ by at most one, earlier ranks take the extra experts. Throws
/// UsageError (exit 2) unless 1 <= ranks <= n_experts.
ExpertShard shard_experts(int n_experts, int ranks);

/// Parses `--expert-parallel`: "N" (N ranks, balanced blocks) or "A+B+..." (experts per rank, each
/// at least 1, summing to n_experts: an uneven spread). Throws UsageError naming the option.
ExpertShard parse_expert_shard(const std::string& spec, int n_experts);

/// Where one chunk's routed rows go: rows[r] lists, in increasing order, the (token, slot) pairs
/// j = token * k + slot whose chosen expert ids[j] rank r owns. Every pair appears exactly once.
struct ExpertDispatch {
  std::vector<std::vector<int>> rows;  ///< [ranks][...]: pair indices
};

/// ids HOST [T, k] (Backend::router_topk's output). Throws wren::Error on an id outside the shard.
ExpertDispatch plan_dispatch(const ExpertShard& s, const int* ids, int T, int k);

/// How a Forward's routed experts run under expert parallelism (ForwardOptions::experts).
struct ExpertLink {
  Transport* transport = nullptr;  ///< null: every expert on the forward's own backend
  ExpertShard shard;               ///< shard.ranks() == transport->world()
};

/// One rank's side of the expert-parallel routed MoE, with its scratch (backend buffers grown on
/// demand and kept). Every rank of the world must make the same sequence of layer calls (run
/// with its own tokens, T >= 0, or serve with none), in lockstep: each call is one round of four
/// grouped exchanges (control words, expert ids, input rows, result rows). The rank's backend
/// must hold the experts it owns (on the CPU: the model's mapped experts).
class ExpertParallelMoe {
 public:
  /// Throws wren::Error when the shard's rank count differs from t.world() or `c` has no routed
  /// experts.
  ExpertParallelMoe(const Config& c, Backend& be, Transport& t, ExpertShard shard);
  ~ExpertParallelMoe();
  ExpertParallelMoe(const ExpertParallelMoe&) = delete;
  ExpertParallelMoe& operator=(const ExpertParallelMoe&) = delete;

  /// Backend::routed_moe of this rank's T >= 0 tokens (logits [T, E], z [T, io], out [T, io]
  /// buffers of the backend; ws.ys [T·k, io] and, for dense experts, ws.g/u/act): the same router
  /// rule and weights, each (token, slot) row computed by the owner of its expert, summed in slot
  /// order. Serves the rows the other ranks send for this layer meanwhile. Throws wren::Error
  /// when a peer runs another layer or has stopped, or the transport fails.
  void run(const RoutedMoeParams& p, const MoeWeights& m, const float* logits, const float* z, int T,
           const RoutedMoeWork& ws, float* out);
  /// One layer round with no tokens of this rank: serves the rows the other ranks send (the
  /// layer is the one they name; `model` gives its weights). Returns false, having done nothing
  /// else, when a peer said stop. Throws wren::Error when the running peers disagree on the layer
  /// or none runs one.
  bool serve(const Model& model);
  /// Tells every other rank to stop (their serve returns false; a run throws). Once; never throws.
  void stop() noexcept;
  /// (token, slot) rows this rank sent to other ranks / received from them, over every call.
  uint64_t rows_sent() const { return rows_sent_; }
  uint64_t rows_received() const { return rows_recv_; }

 private:
  struct Scratch;
  /// The round of one layer: `ids` HOST [T·k] (empty when serving), rows of z [T, io] to send.
  /// Returns false on a stop.
  bool round(int op, int layer, const int* ids, int T, const float* z, const Model* model,
             const RoutedMoeParams* p, const MoeWeights* m, float* ys);
  float* grow(float*& buf, size_t& cap, size_t n);
  const Config& c_;
  Backend& be_;
  Transport& t_;
  ExpertShard shard_;
  std::unique_ptr<Scratch> s_;
  bool stopped_ = false;
  uint64_t rows_sent_ = 0, rows_recv_ = 0;
};

/// A rank with no tokens of its own (`wren run --expert-parallel N`'s ranks 1..): serves every
/// layer round until a peer says stop. `be` must hold this rank's experts. Throws wren::Error.
void expert_worker_loop(const Model& model, Backend& be, Transport& t, const ExpertShard& shard);

}  // namespace wren
