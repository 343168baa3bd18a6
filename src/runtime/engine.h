// One loaded model ready to generate: weights, backend, expert source, forward pass and (when the
// snapshot has one) the tokenizer. Front ends (run, chat, serve) hold one Engine and create a
// SequenceState per conversation.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_options.h"
#include "model/forward.h"
#include "model/load.h"
#include "model/pipeline.h"
#include "model/quant.h"
#include "ops/backend.h"
#include "ops/transport.h"
#include "runtime/expert_store.h"
#include "runtime/rank_pipeline.h"
#include "runtime/runner.h"
#include "tokenizer/tokenizer.h"

namespace wren {

/// What to load and how.
struct EngineOptions {
  std::string model_dir;           ///< "" = the built-in default model
  std::string expert_cache;        ///< --expert-cache ("" = default budget)
  std::string direct = "auto";     ///< --direct
  /// --predict on|off: prefetch the next MoE layer's guessed experts (ForwardOptions::predict).
  std::string predict = "on";
  std::string backend = "auto";    ///< --backend: cpu, cuda or auto (runtime/backend_factory.h)
  std::string vram_experts;        ///< --vram-experts (CUDA): "" = all that fit, "all", or a size
  int chunk = 0;                   ///< --chunk: tokens per layer-major pass; 0 = the backend's default
  int layers = -1, ctx = 4096;
  QuantPlan plan;                  ///< dense-weight formats (--quant; default exact f32)
  CpuOptions cpu;                  ///< CPU backend: threads, kernel level, MXFP4 activations
  CudaOptions cuda;                ///< CUDA backend: precision mode, KDA path, the fault-injection test hook
  bool announce = true;            ///< print the expert-cache line on stderr
  /// A load-progress line on stderr while the weights are read (percent, GB, GB/s), redrawn in
  /// place; front ends set it when stderr is a terminal and --quiet is not given.
  bool progress = false;
  bool cpu_fallback = true;        ///< on a GPU failure, continue on the CPU (Runner::set_fallback)
  /// --strict: a backend's slow fallback (e.g. CUDA routing the MoE on the host) is an error
  /// instead of a counted, logged-once slower path (Backend::set_strict).
  bool strict = false;
  bool check_finite = false;       ///< --check-finite: per-layer NaN/Inf checks (ForwardOptions)
  /// --pipeline: "" or "1" = one backend; "N" or "A+B+..." = in-process pipeline stages, each on
  /// its own backend of the --backend kind (docs/parallel.md). Split by `pipeline_split`.
  std::string pipeline;
  std::string pipeline_split = "even";  ///< --pipeline-split even|bytes
  /// --stage-gpus for the in-process pipeline: stage s runs on CUDA device gpus[s % size] (empty = 0).
  std::vector<int> gpus;
  /// A rank of a multi-process pipeline (--gpus, or RANK / WORLD_SIZE from a launcher;
  /// runtime/rank_pipeline.h): world > 1 makes this process stage `rank` of `world` stages
  /// (split as --pipeline says, default `world` stages) on CUDA device `device`, linked by NCCL.
  int rank = 0;
  int world = 1;
  int device = 0;
  std::string nccl_id_file;  ///< --nccl-id-file: where the ranks meet (NcclWorldOptions::id_file)
  /// --expert-parallel: "" or "1" = every expert on this backend; "N" or "A+B+..." = the routed
  /// experts of each MoE layer sharded over N ranks (parse_expert_shard), ranks 1.. CPU threads of
  /// this process linked by the threads transport (ExpertRanks; docs/parallel.md). CPU only.
  std::string expert_parallel;
};

/// Throws wren::Error when the options cannot work with config `c`: --ctx beyond the model's
/// max_position_embeddings, --layers beyond num_hidden_layers, or (CPU backend) --ctx/--chunk
/// needing more host memory than /proc/meminfo says is available (both amounts in the message).
void check_sizes(const EngineOptions& o, const Config& c, const std::string& backend);

/// The load-progress callback EngineOptions::progress installs: `\rwren: loading weights 42% (1.20
/// / 2.85 GB, 1.61 GB/s)` on stderr, redrawn at most every 100 ms, ended with a newline at 100%.
LoadProgress load_progress_line();

/// The default prefill chunk: 32 on the CPU and in exact GPU mode; in fast GPU mode the largest
/// power of two up to 4096 whose activation workspace (Forward::workspace_bytes, plus the fast
/// path's BF16 scratch) fits in a quarter of the device's free memory (at least 32).
int default_chunk(const std::string& backend, GpuPrecision precision, const Config& c, uint64_t free_device_bytes);

/// The default prefill chunk on the CPU when routed experts stream (the expert store holds fewer
/// than all of them): each chunk reads each expert it touches once per MoE layer, so a prompt that
/// fits one chunk reads its experts once. The largest power of two up to 4096 whose activation
/// workspace fits in an eighth of `free_host_bytes` (at least 32).
int streaming_chunk(const Config& c, uint64_t free_host_bytes);

class Engine {
 public:
  /// Loads the model (and its tokenizer if DIR has tiktoken.model). Throws wren::Error.
  explicit Engine(const EngineOptions& o);

  /// The model the current backend reads (a host copy of it once a GPU failure made the run fall
  /// back to the CPU, when the weights had been placed on the device).
  const Model& model() const { return fwd_->model(); }
  const Config& config() const { return model_->config; }
  /// The step front ends run tokens through: the forward pass with the CPU fallback policy.
  Runner& forward() { return *fwd_; }
  Backend& backend() { return fwd_->backend(); }  ///< the CPU once a GPU failure made it fall back
  ExpertStore* store() { return store_.get(); }
  /// The tokenizer, or throws wren::Error saying the snapshot has none.
  const Tokenizer& tokenizer() const;
  bool has_tokenizer() const { return tok_.has_value(); }
  /// A fresh, empty sequence with room for the context given at construction.
  std::unique_ptr<SequenceState> new_sequence() { return fwd_->new_sequence(ctx_); }
  const std::string& dir() const { return dir_; }
  /// Tokens per layer-major prefill pass in use (--chunk, or the backend's default).
  int chunk() const { return chunk_; }
  /// The pipeline stages (--pipeline), or null for one backend.
  const StagePlan* stages() const { return plan_ ? &*plan_ : nullptr; }
  /// StagePlan::describe with per-stage weight bytes, or "" without a pipeline.
  std::string stages_line() const;
  /// True in ranks 1.. of a multi-process pipeline: call run_worker instead of generating.
  bool is_worker() const { return rank_ > 0; }
  /// Ranks 1..: serves rank 0's steps until it says stop (rank_worker_loop). Throws wren::Error.
  void run_worker();

 private:
  /// --pipeline: the plan, the stage backends and each stage's weights.
  void make_stages(const EngineOptions& o, const std::string& backend);
  /// A multi-process rank: the plan, this rank's weights and the NCCL transport.
  void make_rank(const EngineOptions& o);
  std::string dir_;
  int ctx_;
  int chunk_ = 32;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> host_model_;  ///< the CPU fallback's copy when model_'s weights are on the device
  std::unique_ptr<Backend> be_;
  std::vector<std::unique_ptr<Backend>> stage_be_;  ///< --pipeline: stages 1.. (stage 0 is be_)
  std::optional<StagePlan> plan_;
  int rank_ = 0, world_ = 1;
  ForwardOptions fo_;
  std::unique_ptr<Transport> transport_;  ///< multi-process ranks (before fwd_: outlives it)
  std::unique_ptr<ExpertRanks> expert_ranks_;  ///< --expert-parallel (before fwd_: outlives it)
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<Runner> fwd_;
  std::optional<Tokenizer> tok_;
};

}  // namespace wren
