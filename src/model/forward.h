// The Kimi K3 forward pass, written once against the Backend op interface (spec kimi-k3.md §4).
// Layer-major over a chunk of tokens; the sequential state (KDA recurrence, conv windows, MLA
// cache) advances token by token inside each layer's op, so any chunk size gives the same result.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/load.h"
#include "ops/backend.h"
#include "ops/expert_source.h"
#include "ops/state.h"

namespace wren {

/// The inputs of one layer inside a chunk, as backend buffers: the running block sum P [T, D] and
/// the n_blocks AttnRes snapshots [T, D] (spec §4.1). A hook may read them (to_host) or overwrite
/// them (from_host) before the layer runs: `wren validate` injects one backend's inputs into the
/// other so per-layer errors do not compound.
struct LayerIo {
  Backend& backend;
  float* P;
  float* const* blocks;
  int n_blocks;
  size_t D;
};

/// Validation hooks (spec §8). All buffers are host memory owned by the caller.
struct ForwardHooks {
  /// Called before each layer of each chunk (t0 = the chunk's first token within this run call).
  std::function<void(int layer, int t0, int T, const LayerIo& io)> before_layer;
  float* trace = nullptr;  ///< [T, n_layers_run, D]: P after each layer, token-major
  int dump_layer = -1;     ///< layer whose five vectors are dumped, -1 = none
  int dump_token = -1;     ///< token index (within this run() call) to dump
  float* dump = nullptr;   ///< [5, D]: nrm_attn, att, nrm_mlp, mlp, hidden
};

/// Forward-pass options fixed at construction.
struct ForwardOptions {
  int max_chunk = 32;  ///< tokens per layer-major chunk
  int layers = -1;     ///< run only the first N layers (-1 = all)
  /// Record each single-token step (no x0, no hooks) into one backend graph when the backend has
  /// graphs and every MoE layer's experts run on the device (Backend::routed_moe_on_device).
  bool graph = true;
};

/// Runs tokens through the model; owns the activation workspace (allocated once, sized from the
/// config and max_chunk).
class Forward {
 public:
  /// `experts` supplies the routed MXFP4 experts; null = read them through the shard mappings.
  Forward(const Model& model, Backend& backend, ForwardOptions opts = {},
          ExpertSource* experts = nullptr);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  /// Consumes T tokens at the state's position. `ids` [T] (always needed); `x0` host [T, D]
  /// replaces the embedding rows when non-null. `logits` host: [T, V] when `all_logits`, else
  /// [V] for the last token; may be null. Throws wren::Error on bad ids or a full context.
  void run(SequenceState& state, const int* ids, const float* x0, int T, float* logits,
           bool all_logits, const ForwardHooks* hooks = nullptr);

  /// Makes device failures survivable: when the backend throws DeviceError, the forward says so
  /// once on stderr, creates the backend `make` returns (the CPU), rebuilds the failed call's state
  /// there by running its token history again, repeats the call, and runs every later call there
  /// (other states move on their next call). A state fed through x0 cannot move: the DeviceError
  /// propagates. Without a fallback, errors propagate.
  void set_fallback(std::function<std::unique_ptr<Backend>()> make) { make_fallback_ = std::move(make); }
  /// True once the forward runs on its fallback backend.
  bool on_fallback() const { return fallback_ != nullptr; }

  int layers_run() const { return n_layers_; }
  /// Bytes of activation workspace a Forward with this config and chunk allocates.
  static size_t workspace_bytes(const Config& c, int max_chunk);
  const Config& config() const { return cfg_; }
  /// The backend calls run on now: the fallback once a device failed, else the one given.
  Backend& backend() { return fallback_ ? *fallback_be_ : be_; }

 private:
  struct Buffers;
  void run_here(SequenceState& state, const int* ids, const float* x0, int T, float* logits,
                bool all_logits, const ForwardHooks* hooks);
  void run_fallback(SequenceState& state, const int* ids, const float* x0, int T, float* logits,
                    bool all_logits, const ForwardHooks* hooks);
  void chunk(SequenceState& st, const int* ids, const float* x0, int T, int t0, float* logits,
             bool all_logits, const ForwardHooks* hooks);
  /// The body of chunk(); `graph` = the ops are being recorded (launch before reading logits).
  void chunk_ops(SequenceState& st, const int* ids, const float* x0, int T, int t0, float* logits,
                 bool all_logits, const ForwardHooks* hooks, bool graph);
  void kda_layer(const LayerWeights& l, KdaState& s, int T);
  void mla_layer(const LayerWeights& l, MlaCache& c, int T);
  void dense_mlp(const LayerWeights& l, int T);
  void moe(int layer, const MoeWeights& m, int T);
  /// Final mix, norm and lm_head into the device logits; returns the number of rows computed.
  int head(int n_entries, int T, bool all_logits);
  bool graph_step(int T, const float* x0, const ForwardHooks* hooks);
  RoutedMoeParams routed_params(int layer) const;
  void dump(const ForwardHooks* h, int layer, int t0, int T);
  void pre_mix(const DenseWeight& w, const std::vector<float*>& blocks, int n_blocks, int T);
  void glu(const float* g, const float* u, int T, int n, float* out);
  void routed_experts(int layer, const MoeWeights& m, const float* z, int T, float* out);

  const Model& model_;
  const Config& cfg_;
  Backend& be_;
  ForwardOptions opts_;
  int n_layers_;
  std::unique_ptr<Buffers> buf_;
  std::unique_ptr<ExpertSource> own_experts_;  ///< the mapped source when none was given
  ExpertSource* experts_;
  std::function<std::unique_ptr<Backend>()> make_fallback_;
  std::unique_ptr<Backend> fallback_be_;
  std::unique_ptr<Forward> fallback_;  ///< the same forward on fallback_be_, once a step failed
};

}  // namespace wren
