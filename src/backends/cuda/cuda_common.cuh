// Shared pieces of the CUDA backend's .cu files: the backend's private state (CudaBackend::Impl),
// error checking, launch bookkeeping, block reductions and the device transcendentals.
// Not part of the public interface: only src/backends/cuda/*.cu include it.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "core/error.h"
#include "ops/expert_source.h"

namespace wren {
namespace cuda {

/// Throws wren::Error("<what>: <CUDA error name>: <string>") when `err` is not cudaSuccess.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw DeviceError(std::string("CUDA backend: ") + what + ": " + cudaGetErrorName(err) + ": " +
                cudaGetErrorString(err));
}

/// A device copy of one host tensor.
struct DeviceTensor {
  void* ptr = nullptr;
  size_t bytes = 0;
};

/// Device pointers of one MXFP4 expert's six tensors (w1 gate, w3 up, w2 down; packed, scale).
struct ExpertPtrs {
  const uint8_t *p1, *s1, *p3, *s3, *p2, *s2;
};

/// One MoE layer's device expert table for routed_moe: ExpertPtrs [E] in device memory, built from
/// the weight map when every expert of the layer is resident. Rebuilt after any upload (the map
/// may have changed), never keyed by a host address alone (docs/gpu-method.md#residency).
struct LayerTable {
  uint64_t generation = 0;   ///< Impl::generation it was built at (0 = never)
  bool resident = false;     ///< every expert of the layer has a device copy
  const void* first = nullptr;  ///< host w1.packed of expert 0 when built (identity check)
  int E = 0, inter = 0, io = 0;
  ExpertPtrs* dev = nullptr;  ///< [cap] device (owned)
  int cap = 0;                ///< entries allocated at dev
};

/// One VRAM expert slot of the tier: which expert it holds, its place in the LRU list, and the
/// events that order the copies into it against the kernels that read it.
struct TierSlot {
  int64_t key = -1;        ///< layer << 32 | expert; -1 = empty (on the free list)
  int prev = -1, next = -1;  ///< intrusive LRU links (valid while in_lru)
  bool in_lru = false;     ///< evictable: loaded and not taken by the tier_prepare running now
  bool prefetched = false; ///< copied by a prefetch and not used by a routed_moe call yet
  bool copied = false;     ///< `ready` has been recorded (a copy into the slot was queued)
  uint64_t use = 0;        ///< clock of its last use (routed_moe group or prefetch); LRU order
  uint64_t read_seq = 0;   ///< sequence number of the last kernel group that read it (0 = none)
  cudaEvent_t ready = nullptr;  ///< recorded after the latest copy into the slot
};

/// The VRAM expert tier (expert_tier.cu): when the routed MXFP4 experts exceed the budget they
/// stay on the host (the ExpertSource: shard mappings or the ExpertStore) and an LRU of device
/// slots holds the recently used ones. Slots are keyed by (layer, expert id), never by a host
/// address (the store reuses its buffers for other experts: docs/gpu-method.md#residency). A slot is
/// one expert's six tensors, each 256-byte aligned: w1 packed, w1 scale, w3 packed, w3 scale,
/// w2 packed, w2 scale. Bookkeeping is O(1) per expert (hash map, free list, intrusive LRU).
/// Copies run on two copy streams of their own (demand, prefetch) from a ring of pinned staging
/// buffers allocated at set-up; events order them: a copy into a slot waits for the kernels that
/// last read it and for the slot's previous copy; kernels wait for the copies of their slots.
struct ExpertTier {
  uint64_t budget = 0;       ///< bytes for routed experts; 0 = free memory less a margin
  bool active = false;       ///< some experts live on the host (slots in use)
  std::unique_ptr<ExpertSource> mapped;  ///< the shard mappings of the uploaded model
  /// Where the tier reads experts: the backend's expert source (Backend::expert_source(), passed in
  /// by each caller so the tier keeps no copy of it), or the shard mappings when it has none.
  ExpertSource* source(ExpertSource* backend_source) const { return backend_source ? backend_source : mapped.get(); }
  size_t slot_bytes = 0;
  size_t off[6] = {}, len[6] = {};
  int inter = 0, io = 0, n_slots = 0;
  char* arena = nullptr;                    ///< [n_slots, slot_bytes] device (owned)
  std::unordered_map<int64_t, int> where;   ///< layer << 32 | expert -> slot
  std::vector<TierSlot> slots;
  std::vector<int> free_slots;              ///< empty slots
  int lru_head = -1, lru_tail = -1;         ///< evictable slots, least recently used first
  uint64_t clock = 0;                       ///< bumped by every tier_prepare (group stamp)
  uint64_t call_first = 1;                  ///< first stamp of the routed_moe call running now
  int last_distinct = 0;                    ///< distinct experts of the latest routed_moe call
  int prefetched_unused = 0;                ///< slots with `prefetched` set
  cudaStream_t demand_copy = nullptr, prefetch_copy = nullptr;  ///< host -> device copy streams
  uint8_t* staging = nullptr;               ///< pinned [n_staging, slot_bytes] (set-up)
  int n_staging = 0, next_staging = 0;
  std::vector<cudaEvent_t> staging_done;    ///< [n_staging] recorded after the copy out of it
  std::vector<char> staging_busy;           ///< [n_staging] staging_done was recorded
  std::vector<cudaEvent_t> reads;           ///< ring of events after kernel groups (compute stream)
  uint64_t read_seq = 0;                    ///< last sequence number recorded into `reads`
  ExpertPtrs* pinned_pairs = nullptr;       ///< pinned host per-pair table
  size_t pinned_pairs_len = 0;
  std::vector<int> group_slots;             ///< slots of the latest tier_prepare
  // Prediction (CudaBackend::prefetch_experts): the guess waiting to be copied, and the one the
  // next routed_moe of guess_layer measures recall against.
  int pending_layer = -1;
  std::vector<int> pending_ids;
  int guess_layer = -1;
  std::vector<int> guess_ids;               ///< sorted, unique
  // Test hooks (CudaBackend::tier_test_hooks).
  int stall_prefetch_us = 0;                ///< a spin kernel of this length before each prefetch batch
  bool ignore_prefetch_limits = false;      ///< prefetch may fill every slot not used by this call
};

/// A grow-only device scratch buffer (stream-ordered reuse: every user is on the one stream).
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};

struct LtState;  ///< cuBLASLt handle, BF16 weight copies, grouped-MoE tables (gemm_lt.cu)
struct Placer;   ///< weight placement at load: pinned staging, device arena block (place.cu)

}  // namespace cuda

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  int max_smem_optin = 0;  ///< bytes of dynamic shared memory a block may opt into
  int sm_count = 0;        ///< streaming multiprocessors of the device
  int kda_decode_optin = 0;  ///< dynamic shared memory opted into for the KDA decode kernel so far
  KdaDecodeForm kda_decode_form = KdaDecodeForm::Split;  ///< set_kda_decode_form
  bool kda_decode_pdl = true;   ///< set_kda_decode_pdl: decode steps as programmatic dependent launches
  bool stream_pdl = true;       ///< set_decode_streams: decode weight streams as programmatic dependent launches
  int stream_prefetch = 0;      ///< set_decode_streams: lines a row asked of L2 before their pdl_wait
  int gemv_wt = 0;              ///< set_decode_streams: tensor-core GEMV warps a tile (0 = the default, 8)
  int dense_gu_wt = 0, dense_dn_wt = 0;  ///< set_dense_expert_warps (0 = the default rule)
  int mx_form = 0;                       ///< set_mx_decode_form (moe_decode.cu kMxForms; 0 = the default)
  int dense_form = 0;                    ///< set_dense_decode_form (0: two launches + weighted sum; 1: one persistent)
  bool gemv_map = false;                 ///< set_gemv_map: gemm_mapped's map inside the GEMV (gemv_tc_mapped)
  /// Blocks an SM of a persistent decode-experts kernel (form `form`) at `smem` bytes of dynamic
  /// shared memory (form -1: not asked yet): asked once per form and size, not at every layer.
  struct Occupancy {
    int form = -1;
    size_t smem = 0;
    int blocks = 0;
  };
  Occupancy mx_occupancy, dense_occupancy;
  /// Dynamic shared memory opted into so far by the decode-experts kernels (moe_decode.cu): per
  /// MXFP4 form {persistent or gate/up, down}; dense {persistent, gate/up}.
  static constexpr int kMaxMxForms = 24;
  size_t mx_opted[kMaxMxForms][2] = {};
  struct {
    size_t experts = 0, gate_up = 0;
  } dense_opted;
  int gemv_form = 0;            ///< set_decode_streams: tensor-core GEMV form (gemv_tc.cu kForms; 0 = the default)
  /// KDA kernels launched back to back (kda_decode.cu): the launch count right after the last
  /// one, and the states (S) of the run of decode steps since the last ordinary launch, which may
  /// still be running when the next step reads its state early (docs/gpu-method.md#kda-decode).
  uint64_t kda_chain_at = 0;
  std::vector<const float*> kda_chain;
  std::unordered_map<const void*, cuda::DeviceTensor> weights;  ///< host tensor -> device copy
  std::vector<void*> arenas;                                    ///< weight arenas (owned)
  cuda::Scratch ids, act, scores, router_ids, router_w;         ///< per-op scratch
  int* pinned_ids = nullptr;    ///< pinned host staging for router ids
  float* pinned_w = nullptr;    ///< pinned host staging for router weights
  size_t pinned_len = 0;        ///< entries in each pinned buffer
  CudaStats stats;
  CudaOptions opts;             ///< options (opts.fault_at: the launch count that fails, 0 = never)
  bool free_failed = false;     ///< a cudaFree failure was reported (report once)
  uint64_t generation = 1;      ///< bumped by every upload (invalidates LayerTables)
  std::unordered_map<const MoeWeights*, cuda::LayerTable> tables;  ///< routed_moe expert tables
  cuda::ExpertTier tier;        ///< VRAM expert tier (expert_tier.cu)
  cuda::Scratch pair_table;     ///< device per-pair expert table (tier)
  cuda::Scratch gemv_part;      ///< column-split partial row sums of the tensor-core GEMV (gemv_tc.cu)
  cuda::Scratch gemv_count;     ///< per-tile arrival counters of the column-split GEMV (zero between launches)
  cuda::Scratch argmax_part;    ///< argmax_rows: each segment's best (argmax.cu)
  cuda::Scratch argmax_count;   ///< argmax_rows: per-row arrival counters (zero between launches)
  cuda::Scratch mx_queue;       ///< MXFP4 decode experts in one launch: work counters (zero between launches)
  cuda::Scratch dense_queue;    ///< dense decode experts in one launch: work counters (zero between launches)
  cuda::LtState* lt = nullptr;  ///< fast mode state, created on first use (owned; cuda::lt_destroy)
  cuda::Placer* placer = nullptr;  ///< load-time placement state (owned; cuda::placer_destroy)
  // Decode graphs (graph.cu).
  bool capturing = false;        ///< the stream is being recorded
  std::chrono::steady_clock::time_point record_t0;  ///< graph_begin's time (CudaStats::record_host_s)
  cudaGraphExec_t graph_exec = nullptr;  ///< decode graph of the step being recorded (graph_execs[graph_key])
  std::map<int, cudaGraphExec_t> graph_execs;  ///< graph_key -> its executable graph (owned; updated in place)
  std::set<int> eager_rows;      ///< 2·rows + fast of steps run op by op since the last upload (graph.cu)
  /// Of the step being recorded: (rows · 2 + (it ends with argmax_rows)) · 2 + slot; 0 = none. Slot
  /// 1 - last_slot for a step recorded ahead (StepInfo::ahead), so it never updates the executable
  /// graph of the step that may still run; 0 otherwise.
  int graph_key = 0;
  int last_slot = 0;             ///< slot of the last graph launched
  bool recording_ahead = false;  ///< the step being recorded is StepInfo::ahead (held at its end)
  cudaGraphExec_t held_exec = nullptr;  ///< the held step (step_hold), owned by graph_execs; null = none
  int held_slot = 0;
  std::vector<cuda::Scratch*> held_zero;  ///< zero_pending of the held step (zeroed again if dropped)
  unsigned long long* expert_traffic = nullptr;  ///< device [2]: expert visits, bytes (grouped routed MoE)
  std::unordered_map<const void*, float*> kvb_f32;  ///< MLA: packed kv_b weight -> its f32 decode (owned)
  std::vector<void*> deferred_free;      ///< scratch replaced while recording (freed after launch)
  /// Counter scratches zeroed by a memset recorded into the step being captured: zeroed again
  /// on the stream if that step is never launched (graph_abort, a failed instantiation or launch).
  std::vector<cuda::Scratch*> zero_pending;
  // Per-launch profiling (profile_begin/_end in backend.cu).
  bool profiling = false;
  std::vector<cudaEvent_t> prof_events;   ///< pool (created on demand, reused)
  std::vector<std::string> prof_labels;   ///< label of event i of the current span
  /// Profiling: records the next event of the span labelled `what` (no-op otherwise).
  void prof_mark(const char* what);

  /// Device copy of a dense f32 weight; throws naming `op` when it was never uploaded.
  const float* dense(const DenseWeight& w, const char* op) const;
  /// Device copy of MXFP4 bytes (packed or scale) of an uploaded expert.
  const uint8_t* bytes(const uint8_t* host, const char* op) const;
  /// Scratch `s` with at least `bytes` bytes.
  void* scratch(cuda::Scratch& s, size_t bytes);
  /// Scratch of arrival counters (argmax_rows, the column-split GEMV): at least `bytes` bytes,
  /// all zero when (re)made; the kernels leave them at zero. Growth is told by the size, not the
  /// address (a freed buffer's address may come back); a zeroing recorded into a step is redone
  /// if the step is not launched (zero_pending).
  void* counter_scratch(cuda::Scratch& s, size_t bytes, const char* what);
  /// Zeroes the counters of zero_pending on the stream (not recording) and clears the list.
  void rezero_pending() noexcept;
  /// expert_traffic, allocated and zeroed on first use outside a recording (null while recording
  /// before any use: the kernels then count nothing).
  unsigned long long* traffic_counters();
  /// Counts one launch and checks it (cudaGetLastError), naming `what` on failure.
  void launched(const char* what);
  /// Waits for the stream; counts the sync. Throws while recording a graph (a bug in the caller).
  void sync(const char* what);
  /// Expert table of `m` (built or rebuilt as needed); throws on inconsistent expert shapes.
  cuda::LayerTable& table(const MoeWeights& m, int layer);
  /// Tier: sets up slots for the routed experts of `w` when their `bytes` exceed the budget
  /// (returns true; the experts are then not uploaded), else returns false.
  bool tier_setup(const WeightList& w, uint64_t bytes);
  /// Tier: makes the experts of `pairs` (host ids [pairs]) of `layer` resident in slots (copying
  /// the misses from `src`, ExpertTier::source(), on the demand copy stream; at most n_slots
  /// distinct ids), makes the compute stream wait for the copies of those slots, and returns the
  /// device per-pair table [pairs], written at entry `at` of the call's table (pinned host and
  /// device, sized by tier_begin_call). The group's slots are left in `group_slots` for
  /// tier_mark_read.
  const cuda::ExpertPtrs* tier_prepare(int layer, const int* ids, int pairs, int at, ExpertSource* src);
  /// Tier: starts one routed_moe call of `pairs` pairs (after its ids came to the host, so every
  /// earlier use of the pair tables is done): sizes the pair tables, starts the call's stamps.
  void tier_begin_call(int pairs);
  /// Tier: records an event on the compute stream after the kernels of the latest group and marks
  /// its slots as read by it (a later copy into them waits for it).
  void tier_mark_read();
  /// Tier: copies the pending guess (CudaBackend::prefetch_experts) from `src`
  /// (ExpertTier::source()) into free or least recently used slots on the prefetch copy stream,
  /// never evicting a slot used by the call running now.
  /// Never throws for a failed read (counted; the expert is read again on demand).
  void tier_prefetch(ExpertSource* src);
  /// Tier: frees the slots (a new upload starts over).
  void tier_reset();
};

namespace cuda {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;

/// f32 exp / tanh through f64: correctly rounded except within ~2^-29 of a rounding boundary,
/// so they agree with glibc's (0.502-ulp) expf almost always (CUDA's expf is 2-ulp).
__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float tanh_f(float x) { return float(tanh(double(x))); }
/// v + d[i], or v + (d[i] + d2[i]) with a second delta: the residual updates of add / add2 and
/// add_rms_norm / add2_rms_norm, one expression for both kernels (so the fused norm's residual is
/// the add's bit for bit).
__device__ __forceinline__ float plus_delta(float v, const float* __restrict__ d, const float* __restrict__ d2, size_t i) {
  return v + (d2 ? d[i] + d2[i] : d[i]);
}
/// σ(x) in the CPU reference's form: 1 / (1 + e^-x) in f32.
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }
/// SiTU-GLU of one pair in the CPU reference's operation order (docs/model.md#situ).
__device__ __forceinline__ float situ_f(float g, float u, float b1, float b2) {
  return (b1 * tanh_f(g / b1) * sigmoid_f(g)) * (b2 * tanh_f(u / b2));
}

/// c += a · b, mma.sync m16n8k16, BF16 operands, f32 accumulators (PTX fragment layouts, g = lane / 4,
/// t4 = lane % 4: a0 (row g, k 2t4..+1), a1 (g+8, 2t4..), a2 (g, 2t4+8..), a3 (g+8, 2t4+8..);
/// b0 (k 2t4..+1, n g), b1 (k 2t4+8.., n g); c0/c1 (row g, n 2t4 + 0/1), c2/c3 (row g+8, …)).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// The 32 BF16 values (four 16-byte loads) of a row at columns col .. col + 31, zeros past the
/// matrix (the BF16 decode GEMVs: gemv_tc.cu, moe_decode.cu); pair i = columns 2i, 2i + 1.
__device__ __forceinline__ void load_bf16(const uint16_t* __restrict__ w, int row, int rows, int col, int cols,
                                          uint32_t (&v)[16]) {
  const bool in = row < rows && col < cols;
  const uint4* src = reinterpret_cast<const uint4*>(w + size_t(in ? row : 0) * cols + (in ? col : 0));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 q = in ? __ldg(src + i) : make_uint4(0, 0, 0, 0);
    v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
  }
}

/// Programmatic dependent launch (docs/gpu-method.md#programmatic-dependent-launch): lets the
/// kernel launched behind this one as a programmatic dependent launch (launch_ex) start its blocks
/// now. Ordinary kernels call it first thing; kernels launched that way only after pdl_wait (so
/// that when a dependent starts, every kernel before this one has completed). No effect without
/// such a dependent.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }
/// Programmatic dependent launch: returns once the kernel before this one has completed and its
/// writes are visible (at once for a kernel launched ordinarily). A programmatic dependent
/// launch reads nothing but weights (and what was written before the kernel before it began)
/// until it has called this.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/// cp.async of 16 bytes from global `src` to shared `dst` (both 16-byte aligned), through L2 only
/// (.cg); with `valid` false nothing is read and `dst` gets 16 zero bytes (`src` must still be a
/// mapped address). Completes at cp_async_wait; other lanes see it after that and a barrier.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
/// Closes this thread's group of cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most N of this thread's committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Asks L2 for the 128-byte line holding `p` (global memory) without waiting for it.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/// Prefetches (prefetch_l2) `per_row` 128-byte lines from byte b0 of rows r0 .. r0 + 15 (< rows)
/// of a row-major matrix of `row_bytes` bytes a row (nothing past a row's end): lane l takes row
/// l % 16, lines l / 16, l / 16 + 2, … One warp, all lanes. Used before pdl_wait, when the
/// weights a kernel will stream are known but its input is not yet.
__device__ __forceinline__ void prefetch_rows(const uint8_t* base, size_t row_bytes, int rows, int r0, size_t b0,
                                              int per_row) {
  const int lane = int(threadIdx.x) % 32, r = r0 + lane % 16;
  if (r >= rows) return;
  const uint8_t* row = base + size_t(r) * row_bytes;
  for (int q = lane / 16; q < per_row && b0 + size_t(q) * 128 < row_bytes; q += 2) prefetch_l2(row + b0 + size_t(q) * 128);
}

/// Single-thread f32 dot in cpu::dot's order: 8 partial sums over i ≡ j (mod 8), then the tree
/// ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)). Bit-identical to the CPU without FMA contraction.
__device__ __forceinline__ float dot8(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// Sum of `v` over the block (all threads must call; blockDim.x a multiple of 32, <= 1024).
/// `red` is >= 32 doubles of shared memory. Returns the total to every thread.
__device__ __forceinline__ double block_sum(double v, double* red) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, nw = blockDim.x / kWarp;
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < nw; ++w) t += red[w];  // every thread sums in the same order
  return t;
}

/// Max of `v` over the block (exact in any order); same contract as block_sum.
__device__ __forceinline__ float block_max(float v, float* red) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, nw = blockDim.x / kWarp;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = red[0];
  for (int w = 1; w < nw; ++w) t = fmaxf(t, red[w]);
  return t;
}

/// Fast mode (gemm_lt.cu): y[T, rows] = x[T, cols] · Wᵀ through cuBLASLt with BF16 operands and f32
/// accumulation/output, when this call qualifies (fast mode, T >= 2, W f32 or BF16); returns
/// false, having done nothing, otherwise. `x_ready`: the BF16 activation scratch already holds this
/// x (the lt_gemm just before it, in the same gemm_batch, had the same x, T and cols), so the
/// conversion is skipped (the same BF16 values: the same result).
bool lt_gemm(CudaBackend::Impl& m, const DenseWeight& W, const float* x, int T, float* y, bool x_ready = false);
/// A BF16 device copy of dense weight W (its own bytes when W is BF16; else converted once from
/// the f32 device copy and cached); null when W is in another packed format.
const uint16_t* bf16_weight(CudaBackend::Impl& m, const DenseWeight& W, const char* op);
/// Frees the fast-mode state (called by ~CudaBackend).
void lt_destroy(CudaBackend::Impl& m);
/// Frees the placement state (pinned staging, events); the placed weights stay (in m.arenas).
void placer_destroy(CudaBackend::Impl& m) noexcept;
/// Fast mode (moe_grouped.cu): the routed experts of a chunk as one grouped GEMM per matrix, after
/// the router has written device ids/weights [T·k]; see the file comment. `table` is the layer's
/// resident MXFP4 table (null for dense experts). Returns false when the layer does not qualify.
bool grouped_moe_ok(CudaBackend::Impl& m, const RoutedMoeParams& p, const MoeWeights& mw, int T, bool mx);
bool grouped_moe(CudaBackend::Impl& m, const RoutedMoeParams& p, const MoeWeights& mw, const ExpertPtrs* table,
                 const int* dids, const float* dw, const float* z, int T, float* ys, float* out);

/// Fast mode (mla_fast.cu): MLA prefill attention over cache rows [0, pos0 + T) on tensor cores,
/// after mla.cu has written this chunk's cache rows; false (nothing done) when it does not apply.
bool mla_fast(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const float* q, const float* cache,
              int pos0, int T, float* ctx);

/// Blocks of `threads` covering n items, capped for grid-stride loops.
inline unsigned grid_for(size_t n, int threads, unsigned cap = 65535u * 4) {
  const size_t b = (n + threads - 1) / threads;
  return unsigned(b == 0 ? 1 : (b > cap ? cap : b));
}

/// Launches `kern` on the compute stream through cudaLaunchKernelEx: with a thread-block cluster
/// of `cluster_x` blocks along x when cluster_x > 0, and when `pdl` as a programmatic dependent
/// launch (cudaLaunchAttributeProgrammaticStreamSerialization: its blocks may start once the
/// kernel before it has called pdl_trigger, and must pdl_wait before reading that kernel's
/// outputs). Throws DeviceError naming `what` when the launch fails; the caller then calls
/// launched().
template <class... Exp, class... Act>
void launch_ex(CudaBackend::Impl& m, void (*kern)(Exp...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x,
               bool pdl, const char* what, Act&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = m.stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  check_cuda(cudaLaunchKernelEx(&cfg, kern, std::forward<Act>(args)...), what);
}

/// Whether `w` is a warps-a-tile setting of the decode weight streams' test hooks
/// (set_decode_streams, set_dense_expert_warps): 0 (the default) or 1, 2, 4, 8 warps of a block.
inline bool warps_a_tile_ok(int w) { return w == 0 || w == 1 || w == 2 || w == 4 || w == 8; }

/// The small kernels of a step (norms, element-wise ops, the AttnRes mix): `kern` over `grid`
/// blocks of `threads`, a programmatic dependent launch when Impl::stream_pdl (set_decode_streams;
/// default on), so that its blocks are resident when the kernel before it ends, then launched().
/// The kernel must call pdl_wait() before touching memory a step writes (it may read weights
/// before: rms_norm_kernel does) and pdl_trigger() after it.
template <class... Exp, class... Act>
void pdl_launch(CudaBackend::Impl& m, void (*kern)(Exp...), unsigned grid, int threads, const char* what, Act&&... args) {
  launch_ex(m, kern, dim3(grid), dim3(unsigned(threads)), 0, 0, m.stream_pdl, what, std::forward<Act>(args)...);
  m.launched(what);
}

}  // namespace cuda
}  // namespace wren
