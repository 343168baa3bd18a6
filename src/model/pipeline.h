// Pipeline parallelism by layers (docs/parallel.md): the layers split into contiguous stages, each
// stage a Forward over its layers on its own backend, the boundary activations (P and the AttnRes
// snapshots) handed from stage to stage through a Transport. This file: the split itself, the
// in-process transport, and the in-process pipeline (every stage in this process).
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/forward.h"
#include "model/load.h"
#include "ops/transport.h"

namespace wren {

/// How `--pipeline N` splits the layers: Even = layer counts differ by at most one (earlier
/// stages take the extra ones); Bytes = each stage's resident weight bytes (layer_bytes) as close
/// to an equal share as contiguous stages allow.
enum class StageSplit { Even, Bytes };

/// A partition of layers [0, n) into contiguous stages: stage s runs [bounds[s], bounds[s+1]).
struct StagePlan {
  std::vector<int> bounds;  ///< [stages + 1], bounds[0] = 0, strictly increasing
  int stages() const { return int(bounds.size()) - 1; }
  int first(int s) const { return bounds[size_t(s)]; }
  int end(int s) const { return bounds[size_t(s) + 1]; }
  /// The stage running `layer`.
  int stage_of(int layer) const;
  /// "2 stages: layers 0-2 | 3-5" (with per-stage bytes when `bytes` [n] is given).
  std::string describe(const std::vector<uint64_t>* bytes = nullptr) const;
};

/// Resident bytes of each layer's weights [n_layers]: dense tensors as f32 (the exact mode's
/// resident format) plus its routed experts as stored (MXFP4 packed + scales, or dense as f32).
/// From the config alone (tensor table shapes), so `inspect` plans without loading.
std::vector<uint64_t> layer_bytes(const Config& c);

/// Splits `n_layers` layers into `stages` contiguous stages. Bytes balancing uses `bytes`
/// [n_layers] (required then): stage s ends at the first layer boundary whose prefix sum reaches
/// (s+1)/stages of the total, keeping at least one layer per stage. Throws wren::Error when
/// stages < 1 or stages > n_layers.
StagePlan plan_stages(int n_layers, int stages, StageSplit split, const std::vector<uint64_t>& bytes = {});

/// Parses `--pipeline`: "N" (N stages, split by `split`) or "A+B+..." (layers per stage, each >= 1,
/// summing to n_layers). Throws wren::Error naming the option and what is wrong.
StagePlan parse_pipeline(const std::string& spec, int n_layers, StageSplit split, const std::vector<uint64_t>& bytes);

/// Parses `--pipeline-split`: "even" or "bytes".
StageSplit parse_stage_split(const std::string& s);

/// The in-process transport: stages are separate backends of this process (CPU or CUDA, one or
/// several devices); a message goes through host memory (sender to_host, receiver from_host), so
/// it works between any two backends. Single-threaded: a recv finds its message already queued
/// (the stages run one after another), else throws.
class InProcessTransport final : public Transport {
 public:
  explicit InProcessTransport(int world) : world_(world) {}
  void send(Backend& be, const float* buf, size_t n, int to) override;
  void recv(Backend& be, float* buf, size_t n, int from) override;
  void send_host(const int* v, size_t n, int to) override;
  void recv_host(int* v, size_t n, int from) override;
  int rank() const override { return 0; }
  int world() const override { return world_; }
  const char* name() const override { return "in-process"; }
  /// Floats moved so far (every send), for tests and the bytes model.
  uint64_t floats_sent() const { return floats_sent_; }

 private:
  std::vector<float>& push(int from, int to);
  std::vector<float> pop(int from, int to, size_t n);
  int world_;
  uint64_t floats_sent_ = 0;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> queues_;
};

/// All stages in this process: stage s is a Forward over layers [plan.first(s), plan.end(s)) on
/// backends[s] (which must already hold those layers' weights: give it weight_list(w, first, end,
/// s == 0, s == last)), linked s -> s+1 through an InProcessTransport. Runs each chunk through
/// every stage in turn; results equal the single-stage Forward's (bit-identical on the CPU: every
/// op is the same op on the same inputs). Sequence states must be split the same way
/// (new_sequence / layer_backends). Validation hooks are not supported (throws).
class PipelineForward final : public TokenStep {
 public:
  PipelineForward(const Model& model, const std::vector<Backend*>& backends, const StagePlan& plan,
                  ForwardOptions opts = {});
  void run(SequenceState& state, const int* ids, const float* x0, int T, float* logits, bool all_logits,
           const ForwardHooks* hooks = nullptr) override;
  void run_batch(SequenceState* const* states, const int* ids, int B, float* logits) override;
  /// Stage 0's backend (where a split state reports itself: SequenceState::backend()).
  Backend& backend() override { return *backends_[0]; }
  const Config& config() const override { return model_.config; }
  int layers_run() const override { return plan_.end(plan_.stages() - 1); }
  /// [n_layers]: each layer's backend (for SequenceState's split constructor); layers beyond
  /// --layers go to the last stage.
  std::vector<Backend*> layer_backends() const;
  /// A fresh state split like the stages.
  std::unique_ptr<SequenceState> new_sequence(int capacity) const;
  const StagePlan& plan() const { return plan_; }
  const InProcessTransport& transport() const { return transport_; }

 private:
  const Model& model_;
  std::vector<Backend*> backends_;
  StagePlan plan_;
  int chunk_;
  InProcessTransport transport_;
  std::vector<std::unique_ptr<Forward>> stages_;
};

}  // namespace wren
