// The CUDA backend: every op of ops/backend.h on one NVIDIA GPU (built for sm_90), with
// device-resident weights, activations and sequence state. Plain C++ header (no CUDA types), so
// the factory, the CLI and the tests include it from ordinary .cpp files.
//
// Memory: every buffer from alloc() is device memory (cudaMalloc, never managed memory). Weights
// are mirrored once by upload(): each DenseWeight's bytes as stored in its WFormat (f32, bf16,
// int8 or Q4_G64 groups; ops/weights.h) plus, for Q8_ROW / Q4_G64, its f32 scale array as a
// second tensor keyed by the scale's host pointer, and each expert's MXFP4
// packed [rows, cols/2] and ue8m0 scale [rows, cols/32] bytes exactly as stored; ops find the
// device copy through a host-pointer -> device-pointer map. The map is only as fresh as the last
// upload: model weights are immutable while their Model lives, and every upload() re-copies a
// tensor it already knows, so a host address reused by new data is refreshed, never served stale
// (docs/gpu-method.md#residency). An op handed a weight that was never uploaded throws rather than
// reading host memory. Host-side inputs of the interface (token ids, router_topk's outputs, expert
// weights) stay host memory as backend.h says; routed_moe keeps ids and weights on the device.
// Decode graphs: graph.cu; VRAM expert tier (experts beyond --vram-experts): expert_tier.cu.
//
// Numerics ("exact mode", docs/gpu-method.md#modes): f32 activations, f32 accumulation in the CPU
// reference's order wherever that order is cheap to reproduce (the 8-accumulator dot of gemm and
// MLA, the per-group MXFP4 sums, the KDA column recurrences, the mix sums), f64 for the RMS means
// and AttnRes scores; built without fast math, flush-to-zero or FMA contraction; exp/tanh evaluated
// in f64 and rounded to f32 (glibc's expf is within 0.502 ulp, so this agrees with the CPU far more
// often than CUDA's 2-ulp expf). Kernels live by family: gemm.cu (embed, gemm), gemm_quant.cu (gemm
// and row decode on BF16 / Q8_ROW / Q4_G64 weights, f32 accumulation, not CPU order), norm.cu (rms_norm,
// attnres_mix), elementwise.cu, kda.cu, mla.cu, moe.cu (router, expert_ffn, weighted_sum).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_options.h"
#include "ops/backend.h"
#include "ops/expert_source.h"

namespace wren {

/// Counters of one CudaBackend, for tests and reports ("prove the GPU did the work", docs/gpu-method.md#proof).
struct CudaStats {
  uint64_t launches = 0;         ///< kernel launches outside graphs
  uint64_t host_syncs = 0;       ///< stream synchronizations the host waited for
  uint64_t graph_launches = 0;   ///< decode graphs launched (cudaGraphLaunch)
  uint64_t graph_kernels = 0;    ///< kernels recorded into those graphs (run once per launch)
  uint64_t graph_instantiations = 0;  ///< cudaGraphInstantiate calls (first step, failed updates)
  uint64_t graph_updates = 0;    ///< successful cudaGraphExecUpdate calls (later steps)
  uint64_t routed_moe_calls = 0; ///< routed_moe calls handled on the device
  uint64_t host_routed_moe_calls = 0;  ///< routed_moe calls that fell back to host routing
  uint64_t expert_slots = 0;     ///< VRAM tier: device expert slots (0 = every expert resident)
  uint64_t tier_hits = 0;        ///< VRAM tier: selected experts found in a slot
  uint64_t tier_misses = 0;      ///< VRAM tier: experts copied host -> device into a slot
  uint64_t tier_bytes = 0;       ///< VRAM tier: bytes copied for those misses
  uint64_t tier_prefetch_issued = 0;  ///< VRAM tier: guessed experts copied into a slot ahead of need
  uint64_t tier_prefetch_bytes = 0;   ///< VRAM tier: bytes of those copies
  uint64_t tier_prefetch_used = 0;    ///< VRAM tier: of those, found by a later routed_moe (a hit)
  uint64_t tier_prefetch_wasted = 0;  ///< VRAM tier: of those, evicted before any use
  uint64_t tier_prefetch_failed = 0;  ///< VRAM tier: guesses whose host read failed (read again on demand)
  uint64_t tier_guess_not_held = 0;   ///< VRAM tier: guesses with room in VRAM left out as the host did not hold them
  uint64_t tier_guess_needed = 0;     ///< VRAM tier recall: distinct experts of calls that had a guess
  uint64_t tier_guess_hit = 0;        ///< VRAM tier recall: of those, how many the guess contained
  uint64_t uploaded_bytes = 0;   ///< weight bytes copied to the device by upload()
  uint64_t resident_tensors = 0; ///< distinct host tensors with a device copy
  uint64_t expert_calls = 0;     ///< expert_ffn calls
  uint64_t lt_gemms = 0;         ///< fast mode: dense GEMMs run through cuBLASLt (gemm_lt.cu)
  uint64_t tc_gemvs = 0;         ///< fast mode: one-token BF16 GEMVs on tensor cores (gemv_tc.cu)
  uint64_t mapped_gemvs = 0;     ///< of those, with the input map of gemm_mapped fused (gemv_tc_mapped)
  uint64_t mla_kvb_decodes = 0;  ///< MLA: packed kv_b matrices decoded to f32 (once per layer and upload)
  uint64_t grouped_moe_calls = 0;  ///< fast mode: routed_moe calls run as one grouped GEMM (moe_grouped.cu)
  uint64_t bf16_weight_bytes = 0;  ///< fast mode: device bytes of BF16 weight copies made from f32
  uint64_t kda_decode_calls = 0;   ///< kda_core calls run by the fused decode kernel (kda_decode.cu)
  uint64_t kda_decode_bulk_calls = 0;  ///< of those, run by its bulk-copy form (KdaDecodeForm::Bulk)
  uint64_t kda_decode_split_calls = 0; ///< of those, run by its split form (KdaDecodeForm::Split, the default)
  uint64_t kda_decode_pdl = 0;  ///< decode-step launches made as programmatic dependent launches
  /// Routed experts run by the device-routed grouped path (fast mode; each distinct expert of a
  /// call once, whatever number of rows chose it) and their weight bytes as read (BF16 copies of
  /// dense experts, MXFP4 packed + scale bytes). Counted on the device, read back by stats().
  uint64_t device_expert_visits = 0;
  uint64_t device_expert_bytes = 0;
  uint64_t graph_rows_max = 0;  ///< most rows of one recorded step (1 = only single-token steps)
  /// Host seconds spent recording decode steps: from graph_begin to cudaGraphLaunch's return
  /// (every op's host work and capture, cudaGraphExecUpdate or instantiation, the launch). The
  /// device waits for this each step (docs/gpu-method.md#recorded-step-host-time).
  double record_host_s = 0;
  /// Steps recorded while the step before ran (Forward::decode_greedy: StepInfo::ahead) and then
  /// submitted, or dropped (the sequence stopped); their recording time is in record_host_s too.
  uint64_t graph_ahead = 0;
  uint64_t graph_dropped = 0;
};

/// Which form of the fused KDA decode step (kda_decode.cu, docs/gpu-method.md#kda-decode) runs
/// where it applies; every form gives the token kernel's bits in exact mode. Bulk (what a new
/// backend does): one block per head fed by bulk copies (d % 4 == 0, conv kernel <= 4), else the
/// split form; Split: a cluster of ceil(d/32) blocks per head, 32 value columns each (d <= 128,
/// conv kernel <= 4; also the batched step), even where Bulk applies; Cluster: the cluster form
/// of run 17 (any d <= 128). A form that does not apply falls back to Cluster.
enum class KdaDecodeForm { Split, Bulk, Cluster };

/// Device time of one kind of launch over a profiled span (CudaBackend::profile_begin/_end): the
/// time from the previous launch's completion to this one's, so host-bound gaps (a stream the host
/// does not keep fed) are charged to the launch that waited for the host.
struct CudaOpTime {
  std::string name;    ///< the launch's label (kernel, cuBLASLt product class, "host sync: ...")
  double ms = 0;       ///< summed device-timeline milliseconds
  uint64_t launches = 0;
};

/// The CUDA implementation of Backend. Construction selects the device, creates the compute
/// stream and fixes the options (cuda_options.h); throws wren::Error("no CUDA device: ...") when
/// there is none, or naming the option when one is invalid.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0, const CudaOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }

  /// Mirrors every dense weight of `w` to device memory, and every routed expert when they fit in
  /// the VRAM expert budget; otherwise the experts stay on the host and the VRAM tier's slots are
  /// set up (see set_vram_expert_budget). Throws wren::Error when a packed dense weight lacks its
  /// scale, device memory runs out, or the budget is below one expert. (The model builds `w`:
  /// weight_list in model/weights.h.)
  void upload(const WeightList& w);
  /// Device bytes routed experts may use, applied by the next upload(WeightList): 0 = default
  /// (free device memory after the dense weights, less max(1 GiB, 5% of the card)), kAllExperts =
  /// every expert resident whatever it costs. Beyond the budget, routed_moe streams the selected
  /// experts from the host tier into an LRU of device slots keyed by (layer, expert id).
  void set_vram_expert_budget(uint64_t bytes);
  static constexpr uint64_t kAllExperts = ~uint64_t(0);
  /// True when routed experts stream from the host tier (the budget did not hold them all): the
  /// VRAM tier then reads missing experts from the expert source (Backend::set_expert_source,
  /// e.g. the ExpertStore: disk -> host -> VRAM; null = the shard mappings of the uploaded model).
  bool streams_experts() const override;
  /// Prediction is worth its router GEMV when experts stream (the VRAM tier is active).
  bool uses_prediction() const override;
  /// A guess for `layer` (Backend::prefetch_experts): of the guessed experts not in a VRAM slot,
  /// those the expert source holds in memory (ExpertSource::holds; never one it would read from
  /// disk), up to the tier's room, are copied into VRAM slots on its prefetch copy stream right after the routed_moe call
  /// that runs now has queued its kernels (or at the start of `layer`'s own call, when that comes
  /// first). Timing only: routed_moe's results never depend on it.
  void prefetch_experts(int layer, const int* experts, int n) override;
  /// Test hooks of the VRAM tier: `stall_prefetch_us` > 0 queues a spin kernel of about that many
  /// microseconds on the prefetch copy stream before each batch of prefetch copies (so they are
  /// surely in flight when later work evicts or reads their slots); `ignore_prefetch_limits` lets
  /// a prefetch take every slot the running call does not use.
  void tier_test_hooks(int stall_prefetch_us, bool ignore_prefetch_limits);
  /// Test query of the VRAM tier: true when a slot is keyed (layer, expert), i.e. a later routed_moe
  /// would use that slot's bytes without reading the expert again. False when the tier is off.
  bool tier_holds(int layer, int expert) const;
  /// Benchmark helper: host-to-device copy bandwidth, GB/s, of `bytes` from pinned host memory
  /// (cudaMemcpyAsync on the compute stream; median of `reps` after one warm-up).
  double h2d_gbps(size_t bytes, int reps = 5);
  /// Mirrors one dense weight's current contents, any WFormat (data, and scale when it has one; a
  /// repeated call refreshes the device copy).
  void upload(const DenseWeight& w);
  /// Mirrors one expert's packed/scale bytes (a repeated call refreshes the device copy).
  void upload(const ExpertRef& e);
  /// Precision mode (CudaOptions::precision, normally given at construction). Exact (the default
  /// of a new backend) = the f32 path; Fast = prefill GEMMs and routed experts on tensor cores
  /// (BF16 operands, f32 accumulation). Switching also sets the KDA path (fast: chunked, exact:
  /// recurrent); for tests and benchmarks that time both modes on one backend.
  void set_precision(GpuPrecision p);
  GpuPrecision precision() const;
  /// Tensor-core ceiling measured now: TFLOP/s of an n×n×n BF16 GEMM through cuBLASLt (f32
  /// accumulation, random inputs, median of 10 after 3 warm-ups).
  double bf16_peak_tflops(int n = 8192);
  /// Free device memory now (cudaMemGetInfo), bytes.
  uint64_t free_device_bytes() const;
  /// Counters so far.
  CudaStats stats() const;
  /// Per-launch timing (bench prefill --profile): from now on every launch is followed by a CUDA
  /// event on the compute stream. Numerics are unchanged; each launch costs one event record more.
  void profile_begin();
  /// Ends the span begun by profile_begin: waits for the stream and returns the time per label,
  /// largest first (see CudaOpTime); *total_ms = first to last event.
  std::vector<CudaOpTime> profile_end(double* total_ms);
  /// Waits for all queued device work (timing, tests).
  void synchronize();
  /// Benchmark helper (bench_timing.cu): device seconds per call of `op`. Records op(0) … op(n−1)
  /// into one CUDA graph (stream capture: `op` may only enqueue device work, no host syncs),
  /// launches it `reps` times between CUDA events and returns the median launch time / n. The
  /// recorded work really runs reps + 1 times (state it updates advances). Throws DeviceError when
  /// a CUDA call fails, wren::Error when n or reps < 1.
  double time_recorded(const std::function<void(int)>& op, int n, int reps);
  /// Benchmark helper: the reference copy kernel, dst[i] = src[i] for n floats (16-byte loads and
  /// stores, one wave of grid-stride blocks), one launch on the compute stream; buffers 16-byte
  /// aligned (alloc()'s are). Ratios in docs/gpu-results.md are taken against it.
  void copy_kernel(const float* src, size_t n, float* dst);
  /// Benchmark helper: bytes per second read + written by copy_kernel between two device buffers
  /// of `floats` floats (default 512 MB each, beyond the L2), graph-timed as time_recorded (4
  /// copies a graph, median of 5 launches): the copy bandwidth the CUDA speed tests' ratios use.
  double copy_bandwidth(size_t floats = size_t(1) << 27);
  /// Benchmark/test hook: the form of the fused KDA decode step (default: KdaDecodeForm::Bulk's
  /// rule), so one run can time the forms side by side.
  void set_kda_decode_form(KdaDecodeForm f);
  /// Benchmark/test hook: launch the decode step as a programmatic dependent launch (default on):
  /// it may start while the kernel before it drains and reads its state S and conv windows
  /// before waiting for that kernel (never when the previous launches touched the same state).
  void set_kda_decode_pdl(bool on);
  /// Benchmark/test hook: whether the decode weight streams of fast mode (the tensor-core GEMV,
  /// the routed experts of a decode token) and the small kernels of a step in either mode (norms,
  /// element-wise ops, the AttnRes mix) are programmatic dependent launches (default on: their
  /// blocks start while the kernel before them drains), how many 128-byte lines of each row a
  /// warp asks of L2 before waiting for that kernel (default 0), and how many warps of the
  /// tensor-core GEMV share a 16-row tile (1, 2, 4 or 8; 0 = the default, 8), and the GEMV's form
  /// (gemv_form, 0 = the default; 1 .. gemv_forms() - 1: other occupancies and column splits,
  /// gemv_tc.cu kForms).
  /// Pdl and lines change timing only, never a result; the warps a tile and the form's column
  /// split change the order of a row's sum. Throws wren::Error for prefetch_lines outside 0..64,
  /// other warp counts or forms.
  void set_decode_streams(bool pdl, int prefetch_lines, int gemv_warps_per_tile = 0, int gemv_form = 0);
  /// The number of GEMV forms set_decode_streams takes (0 .. gemv_forms() - 1).
  static int gemv_forms();
  /// Benchmark/test hook: warps that share a 16-row tile in the fast mode's dense (BF16) decode
  /// experts (moe_decode.cu), for the gate/up kernel and for the down kernel: 1, 2, 4 or 8 (8 / wt
  /// tiles a block, the tile's columns split over its wt warps), 0 = the default rule. Changes the
  /// order of a row's sum (fast mode), never the math. Throws wren::Error for other counts.
  void set_dense_expert_warps(int gate_up, int down);
  /// Benchmark/test hook: the form of the fast mode's MXFP4 decode experts (moe_decode.cu kMxForms:
  /// occupancy, scale loads, L2 asks ahead; 0 = the default, 1 .. mx_decode_forms() - 1 the
  /// others). Changes timing only: every form gives the same bits. Throws wren::Error for other forms.
  void set_mx_decode_form(int form);
  /// The number of forms set_mx_decode_form takes.
  static int mx_decode_forms();
  /// Benchmark/test hook: the form of the fast mode's dense (BF16) decode experts (moe_decode.cu):
  /// 0 (the default) a gate/up, a down and a weighted-sum launch; 1 all three in one persistent
  /// launch. Changes timing only: both give the same bits. Throws wren::Error for other forms.
  void set_dense_decode_form(int form);
  /// The number of forms set_dense_decode_form takes.
  static int dense_decode_forms();
  /// Benchmark/test hook: whether gemm_mapped maps its input inside the one-token BF16 GEMV
  /// (gemv_tc_mapped: one launch) or runs the element-wise op and then the GEMV (two launches,
  /// the default until the mapped instance has been timed: docs/gpu-results.md "Not yet run").
  /// Changes timing only: both give the same bits.
  void set_gemv_map(bool on);
  /// One KDA decode step (T = 1) for each of B sequences, sequence b on its own state
  /// *states[b] (shapes as kda_core: q, k, v, z, gate, out [B, P], beta [B, H], P = heads ·
  /// head_dim; device pointers). The same arithmetic, per sequence, as B kda_core calls with T = 1
  /// (bit-identical in exact mode), in ceil(B / 32) launches of the split form when it applies
  /// (head_dim <= 128, conv kernel <= 4), else B kda_core calls. Throws wren::Error for B < 0 or a
  /// null state, DeviceError when a launch fails.
  void kda_decode_batch(const KdaParams& p, const KdaWeights& w, KdaState* const* states, int B, const float* q,
                        const float* k, const float* v, const float* z, const float* beta, const float* gate,
                        float* out) override;
  /// Fast mode: mla_decode.cu's decode kernel (and its merge where a sequence's context is split)
  /// over up to 32 sequences a launch (fewer when their score scratch would pass 64 MB), each
  /// sequence bit-identical to its own mla_attend; otherwise (exact mode, a layer the decode
  /// kernel does not take) the interface's per-sequence default. check_mla_batch's errors;
  /// DeviceError when a launch fails (the caches are then not advanced).
  void mla_decode_batch(const MlaParams& p, const MlaWeights& w, MlaCache* const* caches, int B, const float* q,
                        const float* ckv, float* ctx) override;
  /// Fault injection (tests of the CPU fallback): the kernel launch numbered `at_launch` (counting
  /// from 1 over the backend's life, as CudaStats::launches) throws DeviceError; 0 turns it off.
  /// CudaOptions::fault_at (--cuda-fault-at) sets it at construction.
  void inject_fault(uint64_t at_launch);
  /// The options in force (fault_at as last set).
  const CudaOptions& options() const;
  /// Replaces the options from the next op on (tests and benchmarks switch KDA paths in one
  /// process); throws wren::Error naming the option when one is invalid.
  void set_options(const CudaOptions& o);

  /// Weights straight from the checkpoint to device memory (place.cu): each dense matrix is
  /// streamed through pinned staging and, in format F32, upcast on the device; no host copy.
  /// upload() then skips the weights placed here (and refuses ones placed on another backend).
  bool places_dense() const override { return true; }
  void place_dense(DenseWeight& w, const PlaceRequest& r) override;
  void place_finish() override;

  float* alloc(size_t n) override;
  void release(float* p) override;
  void to_host(const float* src, size_t n, float* dst) override;
  void from_host(const float* src, size_t n, float* dst) override;
  void copy(const float* src, size_t n, float* dst) override;
  void fill_zero(float* p, size_t n) override;

  void embed(const DenseWeight& table, const int* ids, int T, float* x) override;
  /// Backend::embed_ids on the device (the float ids read by the kernel: recordable).
  void embed_ids(const DenseWeight& table, const float* ids, int T, float* x) override;
  void gemm(const DenseWeight& W, const float* x, int T, float* y) override;
  /// Fast mode, T = 1: the jobs the tensor-core GEMV takes in one launch (gemv_tc.cu), the others
  /// through gemm in order.
  void gemm_batch(const GemmJob* jobs, int n, int T) override;
  void gemm_mapped(const DenseWeight& W, const float* a, const InputMap& map, int T, float* x, float* y) override;
  /// Backend::argmax_rows on the device (argmax.cu): one launch, recordable.
  void argmax_rows(const float* x, int rows, int cols, float* out) override;
  void rms_norm(const float* x, int T, int n, const DenseWeight& w, float eps, float* y) override;
  void add_rms_norm(float* y, const float* x, int T, int n, const DenseWeight& w, float eps, float* out) override;
  void add(float* y, const float* x, size_t n) override;
  void add2(float* y, float* x, const float* x2, size_t n) override;
  void add2_rms_norm(float* y, float* x, const float* x2, int T, int n, const DenseWeight& w, float eps,
                     float* out) override;
  void situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* out) override;
  void silu_glu(const float* g, const float* u, int T, int n, float* out) override;
  void sigmoid_gate(float* y, const float* gate, size_t n) override;

  void attnres_mix(const float* const* entries, int n_entries, int T, int D, const DenseWeight& w,
                   float eps, float* out) override;
  void kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* q, const float* k,
                const float* v, const float* z, const float* beta, const float* gate, int T,
                float* out) override;
  void mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& cache, const float* q,
                  const float* ckv, int T, float* ctx) override;
  void router_topk(const float* logits, const DenseWeight& bias, int T, int E, int k, int* ids,
                   float* weights) override;
  void expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) override;
  void weighted_sum(const float* ys, const float* weights, int m, int n, float* y) override;
  /// On the device when every expert of the layer is resident (4 launches: router, all gate/up,
  /// all down, weighted sum; no host sync), or through the VRAM tier (ids to the host once, the
  /// misses copied into slots). Otherwise (dense experts, experts without a device copy, a chunk
  /// beyond the grid limit) the host-routed reference through this backend's ops, as a counted
  /// fallback (Backend::note_fallback: logged once, an error under --strict).
  void routed_moe(const RoutedMoeParams& p, const MoeWeights& m, const float* logits, const float* z, int T,
                  const RoutedMoeWork& ws, float* out) override;
  bool routed_moe_on_device(const RoutedMoeParams& p, const MoeWeights& m) override;
  /// Records a step as one decode graph when nothing in it needs the host: no host work midway,
  /// recording allowed (the forward pass allows it for single-token steps and for batched decode
  /// steps whose sequences each consume one token), every MoE layer routed on the device
  /// (routed_moe_on_device), not profiling, and, for T > 1 rows, a step of T rows has run op by
  /// op once before (lazily built tables and algorithms exist). One executable graph is kept per
  /// row count, updated in place. Otherwise false and the ops run one by one.
  /// A step recorded ahead (StepInfo::ahead) goes to the other executable graph of its shape than
  /// the one launched last (which may still run), and step_hold keeps it unlaunched until
  /// step_submit (cudaGraphLaunch) or step_discard.
  bool step_begin(const StepInfo& s) override;
  void step_end() override { graph_launch(false); }
  void step_abort() noexcept override { graph_abort(); }
  void step_hold() override { graph_launch(true); }
  void step_submit() override;
  void step_discard() noexcept override;
  /// Stream capture (relaxed mode) of the compute stream; the first launch instantiates the
  /// graph, later launches update it in place (cudaGraphExecUpdate) or re-instantiate when the
  /// update is refused, so arguments baked into kernels (cache length, token id) are always fresh.
  bool graph_begin();
  /// Ends the capture and updates (or instantiates) the executable graph; launches it, or with
  /// `hold` keeps it for step_submit.
  void graph_launch(bool hold);
  void graph_abort() noexcept;

  struct Impl;  ///< device, stream, weight map, scratch, counters (cuda_common.cuh)

 private:
  std::unique_ptr<Impl> impl_;
};

/// True when a CUDA device can be used; otherwise false with the reason in *why (e.g. the
/// cudaGetDeviceCount error string, or "0 devices").
bool cuda_device_available(std::string* why);

}  // namespace wren
