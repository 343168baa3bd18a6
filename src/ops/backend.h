// The op interface the model is written against (docs/architecture.md). The CPU backend is the reference;
// every other backend implements the same ops and may fuse inside an op, never across the model.
//
// Activations are f32 row-major: x [T, n] means T tokens of n values. Buffers come from alloc()
// and may live on a device; the model never dereferences them, it copies with to_host()/from_host().
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ops/expert_source.h"
#include "ops/weights.h"

namespace wren {

/// Per-layer KDA recurrent state (docs/model.md#kda): S [H, d, d] indexed S[key][value] and the conv
/// windows (last K-1 pre-conv inputs of q, k, v per channel, oldest first) [3, P, K-1]; f32.
struct KdaState {
  float* S = nullptr;
  float* conv = nullptr;
};

/// Per-layer MLA latent cache (docs/model.md#mla): per token the normed latent c [kv_lora] then the raw
/// extra key k_x [extra]; [capacity, kv_lora + extra] f32, `length` tokens filled.
struct MlaCache {
  float* kv = nullptr;
  int length = 0;
  int capacity = 0;
};

/// KDA constants of one layer for the core op. Decay gate per channel, z = f_b(f_a(x)) + dt_bias:
/// LowerBound (K3, docs/model.md#kda): g = lb · σ(exp(A_log[h]) · z); Softplus (Kimi Linear):
/// g = −exp(A_log[h]) · softplus(z), softplus(z) = z for z > 20.
struct KdaParams {
  int heads, head_dim, conv_kernel;
  float gate_lower_bound, eps;
  KdaGate gate = KdaGate::LowerBound;
};

/// MLA constants of one layer for the attention op.
struct MlaParams {
  int heads, nope, extra, v_head, kv_lora;
  float latent_eps;
};

/// One MoE layer's routed-expert constants for Backend::routed_moe (docs/model.md#moe, steps 1-5).
struct RoutedMoeParams {
  int layer = 0;            ///< layer index (names the layer in errors, keys device expert slots)
  int n_experts = 0;        ///< E
  int top_k = 0;            ///< k
  int io = 0;               ///< expert input/output width (latent for LatentMoE, hidden for plain)
  float routed_scale = 1;   ///< routed_scaling_factor applied to the renormalized weights
  float b1 = 0, b2 = 0;     ///< SiTU bounds
  ExpertFormat format = ExpertFormat::MXFP4;  ///< MXFP4: expert_ffn on the packed layout; Dense: gemm + GLU
  Activation act = Activation::SiTU;          ///< GLU of dense experts (MXFP4 experts are SiTU)
  int inter = 0;            ///< moe_intermediate_size (the width of dense experts' g/u/act)
};

/// Caller-owned backend buffers (from alloc()) that Backend::routed_moe works in.
struct RoutedMoeWork {
  float* ys = nullptr;   ///< [T·k, io] per (token, slot) expert outputs
  float* g = nullptr;    ///< [inter] dense experts only
  float* u = nullptr;    ///< [inter] dense experts only
  float* act = nullptr;  ///< [inter] dense experts only
};

/// One MoE layer of a step, as Backend::step_begin sees it.
struct StepMoeLayer {
  RoutedMoeParams params;
  const MoeWeights* weights = nullptr;
};

/// What one forward step (one chunk of one Forward::run call) asks of the host, for
/// Backend::step_begin.
struct StepInfo {
  int tokens = 0;            ///< T of the chunk
  bool may_record = true;    ///< the caller allows recording (ForwardOptions::graph)
  /// The host takes part midway: embeddings given (x0), validation hooks reading or writing
  /// activations, or routed experts chosen on the host (dense experts).
  bool host_midway = false;
  const StepMoeLayer* moe = nullptr;  ///< the step's MoE layers with routed MXFP4 experts
  int n_moe = 0;
  bool greedy_ids = false;  ///< the step ends with argmax_rows (its recording differs from one that does not)
  /// Recorded ahead (Forward::decode_greedy): the step is recorded while the step before it may
  /// still run, held back with step_hold, then submitted (step_submit) or dropped (step_discard).
  /// A backend that cannot record it returns false from step_begin and nothing has run.
  bool ahead = false;
};

/// One dense tensor for Backend::place_dense, as the loader hands it over (model/load.h).
struct PlaceRequest {
  /// Format F32: the tensor's elements as stored in the checkpoint (BF16, F16 or F32: `src_dtype`),
  /// which the backend upcasts to f32 (exact). Format BF16 with `src_dtype` BF16: the stored bytes
  /// as they are. Other cases: the weight's bytes already in its format (wformat_data_bytes,
  /// `src_dtype` I8 or U8), converted (and checked) by the loader. Host memory, read only during
  /// the call. Float data (src_dtype F32, BF16, F16) the backend checks for NaN and infinity.
  const void* src = nullptr;
  DType src_dtype = DType::F32;
  size_t count = 0;              ///< elements at src (format F32), or bytes (other formats)
  const float* scale = nullptr;  ///< Q8_ROW / Q4_G64: wformat_scale_count floats (host, during the call)
  std::string where;             ///< "SHARD: tensor 'NAME'", for errors
  /// When set, the backend calls it as it finishes reading each part [offset, offset + bytes) of
  /// src, so the loader can drop those mapped pages at once (a large tensor never sits in RSS whole).
  std::function<void(size_t offset, size_t bytes)> consumed;
};

/// One product of Backend::gemm_batch: y[T, W->rows] = x[T, W->cols] · Wᵀ.
struct GemmJob {
  const DenseWeight* W;
  const float* x;
  float* y;
};

/// The element-wise map Backend::gemm_mapped applies to its input a [T, cols] before the product,
/// with the f32 values of the element-wise op it stands for: SiLU-GLU of gate a and up b
/// (silu_glu), SiTU-GLU with bounds b1, b2 (situ_glu), or the sigmoid output gate a · σ(b)
/// (sigmoid_gate). b [T, cols].
struct InputMap {
  enum class Kind { SiluGlu, SituGlu, SigmoidGate };
  Kind kind = Kind::SiluGlu;
  const float* b = nullptr;
  float b1 = 0, b2 = 0;  ///< SiTU bounds (SituGlu only)
};

/// The ops. All are synchronous from the caller's view; T >= 1 tokens in original order.
class Backend {
 public:
  Backend();
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual const char* name() const = 0;

  // ---- memory ----
  virtual float* alloc(size_t n) = 0;  ///< n floats, zero-filled
  virtual void release(float* p) = 0;
  virtual void to_host(const float* src, size_t n, float* dst) = 0;
  virtual void from_host(const float* src, size_t n, float* dst) = 0;
  virtual void copy(const float* src, size_t n, float* dst) = 0;
  virtual void fill_zero(float* p, size_t n) = 0;

  // ---- weight placement (the loader asks, model/load.h) ----
  /// True when this backend keeps dense matrices (rows > 1) in its own memory, placed at load
  /// straight from the checkpoint through place_dense (CUDA: device memory, no host copy). The
  /// default (the CPU) reads host weights, which the loader converts as before.
  virtual bool places_dense() const { return false; }
  /// Places one dense matrix: `w` has rows, cols and format set; the backend converts `r` into
  /// its own memory and sets w.data (and w.scale), w.dtype and w.placed_on = this. The check of
  /// float data (every value finite) may complete later: place_finish reports it. Throws
  /// wren::Error naming r.where (the default: this backend places nothing).
  virtual void place_dense(DenseWeight& w, const PlaceRequest& r);
  /// Waits until every placement is complete; throws wren::Error naming the tensor when placed
  /// float data held a NaN or an infinity.
  virtual void place_finish() {}

  // ---- dense math ----
  /// x[T, D] = rows ids[t] of the table [V, D].
  virtual void embed(const DenseWeight& table, const int* ids, int T, float* x) = 0;
  /// embed with the ids in a buffer of this backend: ids [T] floats as argmax_rows writes them
  /// (the greedy ids of the step before, so a recorded step need not wait for the host). The
  /// default copies them to the host and calls embed (CPU: plain memory); CUDA reads them on the
  /// device (recordable), where an id outside the vocabulary (-1: a non-finite row) reads row 0:
  /// the caller checks the id on the host before such a step is submitted.
  virtual void embed_ids(const DenseWeight& table, const float* ids, int T, float* x);
  /// y[T, W.rows] = x[T, W.cols] · Wᵀ.
  virtual void gemm(const DenseWeight& W, const float* x, int T, float* y) = 0;
  /// Independent products of one step, jobs[i].y = jobs[i].x · jobs[i].Wᵀ with T rows each: no
  /// job's x may be another job's y. Each y equals what gemm gives for it alone (a backend may run
  /// them in one launch: the CUDA fast mode's one-token BF16 GEMVs). The default calls gemm for
  /// each job in order.
  virtual void gemm_batch(const GemmJob* jobs, int n, int T);
  /// y[T, W.rows] = map(a, map.b) · Wᵀ: an element-wise op and the product that reads it, one pass
  /// where a backend fuses them (CUDA fast mode's one-token BF16 GEMV maps the input as it loads
  /// it: one launch instead of two). x [T, W.cols] is the map's output buffer: written by the
  /// default (the element-wise op into x, then gemm on x), left as it was where the map is fused;
  /// x may be a itself (the map in place). Bit-identical to the two ops in turn.
  virtual void gemm_mapped(const DenseWeight& W, const float* a, const InputMap& map, int T, float* x, float* y);
  /// y[T, n] = x / sqrt(mean(x²) + eps) ⊙ w (mean accumulated in f64).
  virtual void rms_norm(const float* x, int T, int n, const DenseWeight& w, float eps, float* y) = 0;
  /// y[i] += x[i].
  virtual void add(float* y, const float* x, size_t n) = 0;
  /// add(y, x, T · n), then out = rms_norm(y) over rows of n: the residual update and the norm
  /// that reads it, one pass where a backend fuses them (CUDA: one kernel). Bit-identical to the
  /// two ops in turn; the default calls them.
  virtual void add_rms_norm(float* y, const float* x, int T, int n, const DenseWeight& w, float eps, float* out);
  /// y[i] += x[i] + x2[i]: two sub-block outputs (an MoE's routed and shared experts) added to
  /// the residual at once, one pass where a backend fuses it (CUDA: one kernel). x may be left
  /// holding x + x2 (the default: add(x, x2), then add(y, x)). Bit-identical to those two adds.
  virtual void add2(float* y, float* x, const float* x2, size_t n);
  /// add2(y, x, x2, T · n), then out = rms_norm(y): add_rms_norm of the two outputs' sum (CUDA:
  /// one kernel). x may be left holding x + x2, as add2. Bit-identical to add2 then rms_norm.
  virtual void add2_rms_norm(float* y, float* x, const float* x2, int T, int n, const DenseWeight& w, float eps,
                             float* out);
  /// SiTU-GLU (docs/model.md#situ): out[T, n] = [b1 tanh(g/b1) σ(g)] · [b2 tanh(u/b2)], g/u [T, n].
  virtual void situ_glu(const float* g, const float* u, int T, int n, float b1, float b2,
                        float* out) = 0;
  /// SiLU-GLU (Kimi Linear, docs/model.md#kimi-linear): out[T, n] = silu(g) · u.
  virtual void silu_glu(const float* g, const float* u, int T, int n, float* out) = 0;
  /// y[i] *= σ(gate[i]).
  virtual void sigmoid_gate(float* y, const float* gate, size_t n) = 0;

  // ---- model-level ops ----
  /// AttnRes Mix (docs/model.md#attnres) for T tokens: entries[e] points to [T, D] rows; w = norm ⊙ proj [D].
  /// out[t] = Σ_e softmax_e((v_e·w)/sqrt(mean(v_e²)+eps)) v_e, scores in f64.
  virtual void attnres_mix(const float* const* entries, int n_entries, int T, int D,
                           const DenseWeight& w, float eps, float* out) = 0;
  /// KDA core for T tokens (docs/model.md#kda, steps 2-7 minus the projections): q, k, v [T, P] pre-conv
  /// projections, z [T, P] gate pre-activation (f_b output, dt_bias not yet added), beta [T, H]
  /// logits, gate [T, P] output-gate logits. Advances `s`. out [T, P] = gated per-head-normed output.
  virtual void kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* q,
                        const float* k, const float* v, const float* z, const float* beta,
                        const float* gate, int T, float* out) = 0;
  /// One KDA decode step (T = 1) for each of B sequences, sequence b on its own state *states[b]:
  /// q, k, v, z, gate, out [B, P], beta [B, H], rows in sequence order. The same result as B
  /// kda_core calls with T = 1 (the default makes them; CUDA runs them in one launch per 32
  /// sequences, bit-identical in exact mode). Distinct states; B >= 0.
  virtual void kda_decode_batch(const KdaParams& p, const KdaWeights& w, KdaState* const* states, int B,
                                const float* q, const float* k, const float* v, const float* z,
                                const float* beta, const float* gate, float* out);
  /// MLA absorbed attention for T tokens (docs/model.md#mla, steps 2-4): q [T, H, nope+extra],
  /// ckv [T, kv_lora+extra] (pre-norm). Appends each token's (normed latent, raw k_x) to `cache`
  /// before its scores (causal). ctx [T, H * v_head].
  virtual void mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& cache, const float* q,
                          const float* ckv, int T, float* ctx) = 0;
  /// One MLA decode step (T = 1) for each of B sequences, sequence b on its own cache *caches[b]:
  /// q [B, H, nope+extra], ckv [B, kv_lora+extra], ctx [B, H * v_head], rows in sequence order.
  /// The same result as B mla_attend calls with T = 1 (the default makes them; CUDA's fast mode
  /// runs them in one launch per 32 sequences, each bit-identical to its own call). Advances each
  /// cache by one row; a full cache throws before anything runs. Distinct caches; B >= 0.
  virtual void mla_decode_batch(const MlaParams& p, const MlaWeights& w, MlaCache* const* caches, int B,
                                const float* q, const float* ckv, float* ctx);
  /// Router (docs/model.md#moe, steps 1-3): logits [T, E] -> per token the top-k ids of σ(logits) + bias
  /// (ties to the lower id) and their renormalized raw σ weights. ids/weights are HOST [T, k].
  virtual void router_topk(const float* logits, const DenseWeight& bias, int T, int E, int k,
                           int* ids, float* weights) = 0;
  /// One routed MXFP4 expert on one token (docs/model.md#moe, step 5): y [io] = SiTU(z·W1ᵀ, z·W3ᵀ)·W2ᵀ,
  /// computed on the packed layout. z [io]. (Dense experts go through gemm + silu_glu.)
  virtual void expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) = 0;
  /// Routed experts over a chunk (docs/model.md#moe, step 5): for each j < n, row out_rows[j] of ys
  /// [*, latent] = expert_ffn(*experts[j], row in_rows[j] of z [*, latent]); in_rows/out_rows HOST.
  /// The forward passes entries of one expert adjacently, so a backend may stream each expert
  /// once for all its tokens and run experts concurrently; each output must equal expert_ffn's.
  /// The default calls expert_ffn for each j in order.
  virtual void expert_ffn_batch(const ExpertRef* const* experts, const int* in_rows,
                                const int* out_rows, int n, const float* z, float b1, float b2,
                                float* ys) {
    for (int j = 0; j < n; ++j) {
      const size_t lat = size_t(experts[j]->w1.cols);
      expert_ffn(*experts[j], z + in_rows[j] * lat, b1, b2, ys + out_rows[j] * lat);
    }
  }
  /// y [n] = Σ_j w[j] · ys[j] over j < m, in j order (ys [m, n], weights HOST [m]).
  virtual void weighted_sum(const float* ys, const float* weights, int m, int n, float* y) = 0;

  /// Greedy ids of logits rows (the draw of a greedy sequence, without copying its logits to the
  /// host): out[r] = finite_argmax of row r of x [rows, cols] (core/argmax.h: the first index of
  /// the largest value, or -1 when the row holds a NaN or an infinity), stored as a float (exact:
  /// cols <= 2^24, checked). out is a buffer of this backend [rows]. The default copies the rows
  /// to the host and back (CPU: plain memory); CUDA runs a kernel (recordable in a decode graph).
  virtual void argmax_rows(const float* x, int rows, int cols, float* out);

  // ---- the routed MoE: one coarse op, always handled ----
  /// Routed experts of one MoE layer (docs/model.md#moe, steps 2-5): router σ + bias top-k on logits
  /// [T, E] (router_topk's rule), weights × routed_scale, every selected expert of every token on
  /// z [T, io], out [T, io] = Σ_slot w · expert(z) in slot order. Experts come from the backend's
  /// expert source (set_expert_source; none = the model's shard mappings in `m.experts`).
  /// The default is the host-routed reference, host_routed_moe; a backend may do the same work
  /// its own way (CUDA: routing and experts on the device) and must give what it gives. A backend
  /// that has to fall back to a slower path says so through note_fallback. Throws wren::Error on a
  /// bad expert (e.g. a ue8m0 scale byte 255) and, under set_strict(true), on any fallback.
  virtual void routed_moe(const RoutedMoeParams& p, const MoeWeights& m, const float* logits,
                          const float* z, int T, const RoutedMoeWork& ws, float* out) {
    host_routed_moe(p, m, logits, z, T, ws, out);
  }
  /// True when routed_moe(p, m, ...) runs without waiting for the host (every expert of the layer
  /// resident on the device), so it may be recorded into a decode graph.
  virtual bool routed_moe_on_device(const RoutedMoeParams& p, const MoeWeights& m) {
    (void)p, (void)m;
    return false;
  }
  /// True when routed_moe reads experts through the expert source while it runs (the host path;
  /// CUDA only when its VRAM budget does not hold every expert), so a bounded host expert store is
  /// worth opening and handing over with set_expert_source.
  virtual bool streams_experts() const { return true; }

  /// Where routed_moe gets MXFP4 experts from (the expert store, or null = the shard mappings of
  /// the MoeWeights handed to routed_moe). Must outlive the backend's use of it.
  void set_expert_source(ExpertSource* source) { experts_ = source; }
  ExpertSource* expert_source() const { return experts_; }
  /// A guess that routed_moe of `layer` will soon ask for `experts` (n ids, duplicates allowed):
  /// passed to the expert source (ExpertSource::prefetch) so its reads start early. Timing only:
  /// routed_moe's results never depend on it. Nothing happens without an expert source.
  /// A backend with its own tier (CUDA's VRAM slots) may override it, passing the guess on.
  virtual void prefetch_experts(int layer, const int* experts, int n) {
    if (experts_) experts_->prefetch(layer, experts, n);
  }
  /// True when the forward pass should compute guesses (ForwardOptions::predict): an expert source
  /// is set. A backend with a tier of its own says so itself.
  virtual bool uses_prediction() const { return experts_ != nullptr; }
  /// Strict mode (--strict): any decline or slow fallback of a coarse op throws wren::Error
  /// instead of running the slower path.
  void set_strict(bool on) { strict_ = on; }
  bool strict() const { return strict_; }
  /// Slow fallbacks taken so far (each routed_moe call that ran a slower path counts once).
  uint64_t fallbacks() const { return fallbacks_; }
  /// Routed-expert traffic of the host-routed path (host_routed_moe; the CPU backend's routed_moe)
  /// since construction: `visits` = experts run (each unique expert of a chunk once, whatever
  /// number of rows chose it), `bytes` = the bytes of their weights (MXFP4: packed nibbles +
  /// ue8m0 scales of w1, w2, w3; dense: the three matrices at their stored type). A device
  /// routed_moe that keeps the ids on the device does not count here.
  struct ExpertTraffic {
    uint64_t visits = 0, bytes = 0;
  };
  ExpertTraffic expert_traffic() const { return traffic_; }

 protected:
  /// The host-routed reference of routed_moe, through this backend's own ops: router_topk to
  /// host ids and weights, × routed_scale, each unique expert of the chunk once (MXFP4: one
  /// expert_ffn_batch per batch the expert source hands over, each expert's tokens adjacent;
  /// dense: gemm + GLU + gemm per token) into ws.ys row token·k + slot, then weighted_sum per
  /// token in slot order. Host bookkeeping is kept across calls (no allocation once warm).
  void host_routed_moe(const RoutedMoeParams& p, const MoeWeights& m, const float* logits,
                       const float* z, int T, const RoutedMoeWork& ws, float* out);
  /// Records a decline or slow fallback: counts it, says the first one on stderr (backend name
  /// and `what`), and throws wren::Error naming `what` under strict mode.
  void note_fallback(const std::string& what);

 public:
  // ---- step bracket (a backend may record a whole step, e.g. as one CUDA graph) ----
  /// Called by the forward pass before the ops of each chunk. A backend that can record the ops
  /// that follow instead of running them (and submit them at once in step_end) returns true;
  /// the default runs every op as it comes and returns false. `s` says what the step needs from
  /// the host, so the backend decides without knowing the model. While recording no op may wait
  /// for the host: no to_host, from_host, router_topk or host-routed experts (the backend throws
  /// if one does).
  virtual bool step_begin(const StepInfo& s) {
    (void)s;
    return false;
  }
  /// Ends a step that step_begin recorded and submits its ops once (queued like any op; a later
  /// to_host waits for them). Throws wren::Error when the recording cannot be built or launched.
  virtual void step_end() {}
  /// Ends a recorded step that failed midway and discards it. Never throws.
  virtual void step_abort() noexcept {}
  /// Ends a step recorded with StepInfo::ahead and holds it back: nothing of it runs until
  /// step_submit, and step_discard drops it (the caller rewinds the host counters the recording
  /// advanced, SequenceState::rewind). At most one step is held. Throws as step_end does.
  virtual void step_hold() {}
  /// Submits the held step (queued like any op). Throws wren::Error when the launch fails.
  virtual void step_submit() {}
  /// Drops the held step unrun. Never throws.
  virtual void step_discard() noexcept {}

 private:
  struct HostMoe;                     ///< host_routed_moe's bookkeeping (ops/backend.cpp)
  std::unique_ptr<HostMoe> host_moe_;
  ExpertSource* experts_ = nullptr;
  bool strict_ = false;
  bool fallback_logged_ = false;
  uint64_t fallbacks_ = 0;
  ExpertTraffic traffic_;
};

/// The checks of Backend::mla_decode_batch, before anything runs: B >= 0, no null cache, room for
/// one more row in each ("context limit reached", as mla_attend), no cache given twice. Throws Error.
void check_mla_batch(MlaCache* const* caches, int B);

}  // namespace wren
