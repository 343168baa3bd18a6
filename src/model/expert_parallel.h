// Expert parallelism, the partition and dispatch logic (docs/parallel.md, "Expert parallelism"):
// which rank owns each routed expert, and which (token, slot) rows of a chunk go to which rank.
// Not yet wired to a transport; tested on the CPU by running each "rank"'s share of a routed MoE
// layer and combining, against Backend::routed_moe (tests/expert_parallel_test.cpp).
#pragma once
#include <vector>

namespace wren {

/// The routed experts of a layer split over `ranks` ranks in contiguous blocks: rank r owns
/// experts [first(r), end(r)); block sizes differ by at most one (earlier ranks take the extra).
struct ExpertShard {
  int n_experts = 0;
  int ranks = 1;
  int first(int r) const { return r * (n_experts / ranks) + (r < n_experts % ranks ? r : n_experts % ranks); }
  int end(int r) const { return first(r + 1); }
  /// The rank owning expert e (0 <= e < n_experts).
  int owner(int e) const;
};

/// Throws wren::Error unless 1 <= ranks <= n_experts.
ExpertShard shard_experts(int n_experts, int ranks);

/// Where one chunk's routed rows go: rows[r] lists, in increasing order, the (token, slot) pairs
/// j = token * k + slot whose chosen expert ids[j] rank r owns. Every pair appears exactly once.
/// The owner computes expert(z[token]) for each of its rows and sends the [io] result back to the
/// token's rank, which sums the k results in slot order (Backend::weighted_sum), so the combined
/// output equals the single-rank one whatever the shard.
struct ExpertDispatch {
  std::vector<std::vector<int>> rows;  ///< [ranks][...]: pair indices
};

/// ids HOST [T, k] (Backend::router_topk's output).
ExpertDispatch plan_dispatch(const ExpertShard& s, const int* ids, int T, int k);

}  // namespace wren
