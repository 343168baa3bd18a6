// The Kimi K3 forward pass, written once against the Backend op interface (docs/model.md#forward).
// Layer-major over a chunk of tokens; the sequential state (KDA recurrence, conv windows, MLA
// cache) advances token by token inside each layer's op, so any chunk size gives the same result.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/expert_parallel.h"
#include "model/load.h"
#include "ops/backend.h"
#include "ops/state.h"
#include "ops/transport.h"

namespace wren {

/// The inputs of one layer inside a chunk, as backend buffers: the running block sum P [T, D] and
/// the n_blocks AttnRes snapshots [T, D] (docs/model.md#attnres). A hook may read them (to_host) or overwrite
/// them (from_host) before the layer runs: `wren validate` injects one backend's inputs into the
/// other so per-layer errors do not compound.
struct LayerIo {
  Backend& backend;
  float* P;
  float* const* blocks;
  int n_blocks;
  size_t D;
};

/// Validation hooks (docs/model.md#validation-hooks). All buffers are host memory owned by the caller.
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
  /// Let the backend record each step (Backend::step_begin; CUDA: a single-token step with
  /// every MoE layer routed on the device becomes one graph). False = every op runs as it comes.
  bool graph = true;
  /// With `graph`: record a decode step of at most this many sequences (one token each); a larger
  /// batched step runs op by op. Run 37 (H100, the Kimi-Linear-48B-size checkpoint) measured batched
  /// steps op by op faster than recorded at 4 and 16 sequences (2.86-2.91 against 3.13-3.40 ms,
  /// 5.42-5.54 against 5.77-6.45 ms): recording a batched step took 0.6-1.3 ms of host time while
  /// the device waited, where op-by-op launches overlap the device's work. 1: a single-token step
  /// only (one graph launch per token, the GPU decode issue's rule; runs 37-38 measured that step op
  /// by op 2-5% faster too, run 33 equal: a step replayed without re-recording is the fix, not yet
  /// built; `graph` = false runs everything op by op). Tests of the recorded batched path and `bench
  /// batch --record-batched` raise it. No effect on results: a recorded step runs the same kernels.
  int graph_rows = 1;
  /// Strict mode (`--check-finite`): after each layer's mixer and FFN, copy the activations to the
  /// host and throw naming the first layer and sub-block that produced a NaN or an infinity. Costs a
  /// device-to-host copy per sub-block (and turns graphs off); the logits are checked in any mode.
  bool check_finite = false;
  /// Expert prediction (`--predict on|off`): before each MoE layer's routed experts, run the next
  /// MoE layer's router (σ + bias top-k, docs/model.md#moe) on this layer's router input and hand
  /// the guessed ids to Backend::prefetch_experts, so a streaming expert source reads them while
  /// this layer computes. Only when the backend streams experts through a source and the step is
  /// not recorded. A guess: it changes timing only, never results.
  bool predict = true;
  /// Pipeline stage (docs/parallel.md): this forward runs layers [first_layer, layers) only. With
  /// link.prev >= 0 it receives the boundary activations (P and the AttnRes snapshots taken before
  /// first_layer) from that rank instead of embedding; with link.next >= 0 it sends its boundary
  /// activations there after its last layer and computes no logits. Only the stage without a
  /// next rank advances the sequence position. Defaults: the whole model, no transport.
  int first_layer = 0;
  StageLink link = {};
  /// Expert parallelism (docs/parallel.md): with experts.transport set, each MoE layer's routed
  /// experts run through ExpertParallelMoe (this rank's tokens dispatched to the experts' owners
  /// and combined in slot order) instead of Backend::routed_moe. Every rank of the transport
  /// must make the same layer calls (other ranks: their own Forward, or expert_worker_loop).
  ExpertLink experts = {};
};

/// Where chunk [t0, t0 + n) of a T-token run writes its logits: `logits` + t0 rows of V when every
/// row is asked for (`all_logits`: logits is [T, V]), `logits` itself for the last chunk otherwise
/// (logits is [V], the last token's), else nowhere (null; also when `logits` is null).
inline float* chunk_logits(float* logits, bool all_logits, int t0, int n, int T, size_t V) {
  if (logits == nullptr) return nullptr;
  if (all_logits) return logits + size_t(t0) * V;
  return t0 + n == T ? logits : nullptr;
}

/// One sequence's part of a mixed step (TokenStep::run_mixed): `n` >= 1 tokens `ids` consumed at
/// the state's position (a decode step is n = 1, a prefill chunk n > 1); `logits` host [V] of its
/// last token, or null when not needed; `greedy` host: the greedy draw from those logits
/// (core/argmax.h's argmax; Backend::argmax_rows on the device), or null. With `greedy` alone the
/// logits stay on the device (a greedy sequence needs only its next id). Non-finite logits throw
/// wren::Error either way.
struct BatchEntry {
  SequenceState* st;
  const int* ids;
  int n;
  float* logits;
  int* greedy = nullptr;
};

class TokenStep;
/// Runs one entry through `step.run` (logits to the host; the greedy id drawn there): what a
/// TokenStep without a batched path does for each entry of run_mixed.
void run_entry(TokenStep& step, const BatchEntry& e);

/// Something that consumes tokens into a sequence state: the forward pass itself (Forward), or the
/// engine's runner that adds the CPU fallback after a device failure (runtime/runner.h).
class TokenStep {
 public:
  virtual ~TokenStep() = default;
  /// Consumes T tokens at the state's position. `ids` [T] (always needed); `x0` host [T, D]
  /// replaces the embedding rows when non-null. `logits` host: [T, V] when `all_logits`, else
  /// [V] for the last token; may be null. Throws wren::Error on bad ids or a full context.
  virtual void run(SequenceState& state, const int* ids, const float* x0, int T, float* logits,
                   bool all_logits, const ForwardHooks* hooks = nullptr) = 0;
  /// One decode step over B different sequences: states[b] consumes ids[b]; logits host [B, V]
  /// (may be null). This default runs them one by one; Forward batches them.
  virtual void run_batch(SequenceState* const* states, const int* ids, int B, float* logits) {
    for (int b = 0; b < B; ++b)
      run(*states[b], ids + b, nullptr, 1, logits ? logits + size_t(b) * config().vocab : nullptr, false);
  }
  /// One step over several different sequences, each consuming its own n tokens (continuous
  /// batching: the running decodes and new requests' prefill chunks together). This default runs
  /// them one by one; Forward batches them.
  virtual void run_mixed(const BatchEntry* entries, int n) {
    for (int i = 0; i < n; ++i) run_entry(*this, entries[i]);
  }
  /// Greedy decode of one sequence: step s consumes one id (s = 0: `first`; then the id step s-1
  /// drew) and draws the first index of its logits' maximum (BatchEntry::greedy). After each step
  /// `on_id(id)` gets the id and returns whether a step consuming it follows; at most `max_steps`
  /// steps. Returns the steps run; the state then holds exactly their ids. This default runs
  /// run_mixed step by step; Forward records each step while the one before runs on the device.
  /// Throws as run_mixed does, and whatever on_id throws.
  virtual int decode_greedy(SequenceState& state, int first, int max_steps, const std::function<bool(int)>& on_id);
  /// The backend new sequence states belong on (the one the next run uses).
  virtual Backend& backend() = 0;
  virtual const Config& config() const = 0;
  /// Layers each run goes through (ForwardOptions::layers).
  virtual int layers_run() const = 0;
};

/// Runs tokens through the model on one backend: a pure step (no retry, no fallback: errors
/// propagate). Owns the activation workspace (allocated once, sized from the config and max_chunk).
class Forward final : public TokenStep {
 public:
  /// Routed experts come from the backend (Backend::routed_moe and its expert source).
  Forward(const Model& model, Backend& backend, ForwardOptions opts = {});
  ~Forward() override;
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  /// TokenStep::run on this forward's backend. A DeviceError from the backend propagates (the
  /// engine's runner decides what follows); the state is then partly advanced and must be rebuilt.
  /// Also throws wren::Error on a non-finite x0 value or logits holding a NaN or an infinity
  /// (never returns garbage; --check-finite names the layer).
  void run(SequenceState& state, const int* ids, const float* x0, int T, float* logits,
           bool all_logits, const ForwardHooks* hooks = nullptr) override;

  /// One decode step over B different sequences (batched decode): token ids[b] is consumed by
  /// states[b]; logits host [B, V] (may be null). The dense projections, the router and the routed
  /// MoE run once over all B rows (each routed expert read once per step for every row that chose
  /// it); the KDA and MLA cores run per sequence on its own state. Row b's result is the one
  /// run(states[b], &ids[b], 1) gives (the ops are row-independent; tested bit-identical on the
  /// CPU, Batched.*). B above max_chunk runs in groups. Throws wren::Error on a state repeated in
  /// the batch or belonging to another backend.
  void run_batch(SequenceState* const* states, const int* ids, int B, float* logits) override;

  /// One step over several sequences (TokenStep::run_mixed): the rows of every entry (a decode
  /// token, or a prefill chunk) go through the dense projections, router and routed MoE together,
  /// the KDA and MLA cores per sequence; the head runs only on the rows whose logits are asked for.
  /// Entry i's result is the one run(*st, ids, n) gives (row-independent ops; on the CPU the result
  /// does not depend on where a prompt is cut: tested bit-identical, Batched.*). More rows than
  /// max_chunk run in consecutive groups (an entry may be split between two). Throws wren::Error
  /// on a state repeated in the step, n < 1, or a state of another backend.
  void run_mixed(const BatchEntry* entries, int n) override;

  /// TokenStep::decode_greedy. Where the backend records a decode step (Backend::step_begin;
  /// CUDA: one graph), step s + 1 is recorded while step s runs on the device, with its id read
  /// on the device from step s's arg-max (Backend::embed_ids), and held (Backend::step_hold); once
  /// step s's id is on the host and on_id says go on, the held step is submitted, else dropped
  /// and the state's counters rewound (SequenceState::rewind). The device then idles only between
  /// a step's end and the next submit, not through a whole recording. Elsewhere (the CPU, a step
  /// the backend runs op by op, pipeline stages) the steps run one after another. The ids are
  /// the ones run_mixed gives (tests DecodeGreedy*). An error while recording ahead drops that
  /// recording and the step runs again unrecorded once its id is known (raising the error at the
  /// step it belongs to); a DeviceError propagates at once (the runner's fallback reruns the step
  /// whose id was not yet taken). on_id must not run steps on this Forward or its backend (a step is held).
  int decode_greedy(SequenceState& state, int first, int max_steps, const std::function<bool(int)>& on_id) override;

  int layers_run() const override { return n_layers_ - opts_.first_layer; }
  /// AttnRes snapshots taken before layer `layer` (what crosses a stage boundary there besides P).
  static int snapshots_before(const Config& c, int layer);
  /// Bytes of activation workspace a Forward with this config and chunk allocates.
  static size_t workspace_bytes(const Config& c, int max_chunk);
  const Config& config() const override { return cfg_; }
  Backend& backend() override { return be_; }
  const Model& model() const { return model_; }
  const ForwardOptions& options() const { return opts_; }

 private:
  struct Buffers;
  /// Rows [r0, r0 + n) of a chunk's activations belong to `st` (one segment per sequence).
  struct Segment {
    SequenceState* st;
    int r0, n;
  };
  void chunk(SequenceState& st, const int* ids, const float* x0, int T, int t0, float* logits,
             bool all_logits, const ForwardHooks* hooks);
  /// The body of chunk(); `recorded` = the backend records the step (step_end before the logits).
  /// The segments (segs_) cover the T rows in order.
  void chunk_ops(const int* ids, const float* x0, int T, int t0, float* logits, bool all_logits,
                 const ForwardHooks* hooks, bool recorded);
  void kda_layer(const LayerWeights& l, int layer, int T);
  void mla_layer(const LayerWeights& l, int layer, int T);
  /// The end of the run of consecutive one-token segments from segs_[i] (the decode rows of a
  /// batched step, run by kda_decode_batch and mla_decode_batch): the first j > i whose segment is
  /// longer than one token or not adjacent in rows; i + 1 when segs_[i] itself is longer.
  size_t decode_run(size_t i) const;
  void dense_mlp(const LayerWeights& l, int T);
  /// The MoE sub-block into b.ffn. With shared experts and defer_shared, their output is left in
  /// b.tmp and returned, for the caller to add with b.ffn in one op (Backend::add2); else added
  /// into b.ffn and null returned.
  const float* moe(int layer, const MoeWeights& m, int T, bool defer_shared);
  /// Final mix, norm and lm_head into the device logits; returns the number of rows computed.
  int head(int n_entries, int T, bool all_logits);
  StepInfo step_info(int T, const float* x0, const ForwardHooks* hooks) const;
  RoutedMoeParams routed_params(int layer) const;
  void dump(const ForwardHooks* h, int layer, int t0, int T);
  /// Pipeline boundary: P then blocks[0, n) [T, D] each, through opts_.link.
  void recv_boundary(int T);
  void send_boundary(int T, int n_blocks);
  /// Throws naming `what`, the token position (pos0 + row) and element of the first non-finite value
  /// of host rows [T, width].
  void check_rows(const float* host, int T, size_t width, int pos0, const std::string& what) const;
  /// --check-finite: copies device rows [T, D] of one layer's sub-block output and checks them.
  void check_sub(const float* dev, int T, int pos0, int layer, const char* block);
  const float* pre_mix(const DenseWeight& w, const std::vector<float*>& blocks, int n_blocks, int T);
  /// y = down · GLU(g, u) (the model's activation) in one Backend::gemm_mapped; act [T, down.cols]
  /// is the GLU's buffer where the backend does not fuse it.
  void glu_down(const DenseWeight& down, const float* g, const float* u, int T, float* act, float* y);
  void routed_experts(int layer, const MoeWeights& m, const float* z, int T, float* out);
  /// ForwardOptions::predict for the MoE layer after `layer` (if any), from b.nrm [T, D].
  void predict_next(int layer, int T);

  const Model& model_;
  const Config& cfg_;
  Backend& be_;
  ForwardOptions opts_;
  int n_layers_;
  int blocks0_ = 0;  ///< snapshots_before(first_layer): the snapshots a later stage receives
  std::unique_ptr<Buffers> buf_;
  std::vector<StepMoeLayer> step_moe_;  ///< the MoE layers with MXFP4 experts (for step_begin)
  std::vector<float> check_buf_;        ///< host copy for --check-finite
  std::vector<Segment> segs_;           ///< the sequences of the chunk being run
  /// Non-empty: the head runs only on these rows of the chunk (run_mixed), in this order.
  std::vector<int> head_rows_;
  std::vector<int*> greedy_outs_;       ///< [head row]: where its greedy id goes (run_mixed), or null
  std::vector<float> greedy_host_;      ///< host copy of the step's argmax_rows
  /// True when some head row of the chunk asks for its greedy id.
  bool wants_greedy() const;
  /// After the step: the greedy ids of rows [0, rows) to greedy_outs_ (throws naming the element
  /// of a non-finite row, as check_rows).
  void deliver_greedy(int rows);
  /// The greedy id of head row r from greedy_host_ (checked: a -1 row's logits are copied and
  /// checked, naming `pos`; an id outside the vocabulary throws).
  int checked_greedy(int r, int pos);
  /// One greedy step of segs_' single sequence: its id from the host (`id`) or, when `ahead`,
  /// from the device's last arg-max (b.greedy), recorded and held. Returns false (nothing run)
  /// when an ahead step cannot be recorded. The id is left on the device (checked_greedy).
  bool greedy_step(SequenceState& st, const int* id, bool ahead);
  const float* embed_from_ = nullptr;   ///< device ids of the step being run (embed_ids), or null
  bool hold_ = false;                   ///< the step being recorded is held (step_hold), not launched
  bool keep_ids_ = false;               ///< the greedy ids stay on the device (decode_greedy fetches them)
  SequenceState::Mark mark_;            ///< the counters before a held step (decode_greedy)
  int greedy_sink_ = 0;                 ///< greedy_outs_' target in decode_greedy (the id is fetched there)
  std::vector<int> mixed_ids_;          ///< host ids of a run_mixed group
  std::vector<KdaState*> kda_states_;   ///< the states of a kda_decode_batch (kda_layer)
  std::vector<MlaCache*> mla_caches_;   ///< the caches of a mla_decode_batch (mla_layer)
  std::vector<float> mixed_logits_;     ///< host logits of a run_mixed group's head rows
  /// Non-empty: [head row] 1 where the row's logits go to the host (run_mixed through
  /// mixed_logits_: greedy-only rows are not copied); empty: every row's.
  std::vector<char> host_rows_;
  std::vector<int> next_moe_;           ///< [layer]: the next MXFP4 MoE layer run, or -1
  bool predict_now_ = false;            ///< predict in the chunk being run
  std::vector<int> guess_ids_;          ///< host [T, k] guessed ids (predict_next)
  std::vector<float> guess_w_;          ///< host [T, k] their weights (unused)
  std::unique_ptr<ExpertParallelMoe> ep_;  ///< ForwardOptions::experts, or null
};

}  // namespace wren
