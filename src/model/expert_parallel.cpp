// Expert parallelism: partition and dispatch (see expert_parallel.h).
#include "model/expert_parallel.h"

#include <string>

#include "core/error.h"

namespace wren {

int ExpertShard::owner(int e) const {
  const int base = n_experts / ranks, extra = n_experts % ranks;
  const int split = extra * (base + 1);  // experts below this belong to the larger blocks
  return e < split ? e / (base + 1) : extra + (e - split) / base;
}

ExpertShard shard_experts(int n_experts, int ranks) {
  check(ranks >= 1 && ranks <= n_experts, "expert parallelism: " + std::to_string(ranks) + " ranks for " +
                                              std::to_string(n_experts) + " experts (1 to n_experts ranks)");
  return ExpertShard{n_experts, ranks};
}

ExpertDispatch plan_dispatch(const ExpertShard& s, const int* ids, int T, int k) {
  ExpertDispatch d;
  d.rows.assign(size_t(s.ranks), {});
  for (int j = 0; j < T * k; ++j) {
    check(ids[j] >= 0 && ids[j] < s.n_experts, "expert parallelism: expert id " + std::to_string(ids[j]) +
                                                   " outside [0, " + std::to_string(s.n_experts) + ")");
    d.rows[size_t(s.owner(ids[j]))].push_back(j);
  }
  return d;
}

}  // namespace wren
