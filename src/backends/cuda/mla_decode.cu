// CUDA backend, fast precision mode: the gated NoPE MLA attention of one decode token (T = 1) in
// the absorbed form (docs/model.md#mla-absorbed), the BF16 kv_b read as stored.
//
// The exact kernel (mla.cu) runs a block per head and forms q_abs and the output with one thread
// per latent or value dimension, reading kv_b (f32) with little in flight: 96 µs a Kimi-Linear-size
// layer on an H100 (run 31). Here, per head h (a block of 512 threads, or S blocks of a position
// split when the context is long):
//   row      = [RMSNorm(ckv[:kv_lora]) · norm_w | ckv[kv_lora:]]   (this token's cache row, in
//              shared memory; the split holding it also writes it to the cache, block of head 0)
//   q_abs[j] = Σ_d q[h, d] · kv_b[h·(nope+v) + d, j]      (16-byte BF16 loads, 8 columns a thread,
//              the nope rows dealt over thread groups, the group sums added in group order)
//   s_p      = scale · [q_abs | q[h, nope:]] · cache[p]    (a warp a position, lanes over the row)
//   c̄        = Σ_p exp(s_p − m) · cache[p, :kv_lora]       (m, l = Σ_p exp(s_p − m): the split's own)
// A single split ends the job in the same block: ctx[h, i] = (c̄ / l) · kv_b[h·(nope+v) + nope + i]
// (a warp a row). Several splits write (c̄, m, l) and a second kernel merges them in split order
// (each rescaled by exp(m_i − max m), the standard split-softmax merge), then forms ctx the same way.
// Splits: enough for about two blocks an SM when the context is long, at least 256 positions each.
// Every sum has a fixed order, so a token's ctx depends only on its inputs and the split count
// (a function of the position and the head count). Each head reads the cache rows it attends to:
// H × the cache's bytes a token, from L2 while the cache fits there (a kernel that reads each row
// once for all heads, FlashMLA's decode layout, is the known next step for long contexts).
#include "backends/cuda/mla_decode.cuh"

#include <algorithm>
#include <array>
#include <cmath>

#include "backends/cuda/gemm_quant.cuh"
#include "backends/cuda/lt_state.cuh"

namespace wren::cuda {

namespace {

constexpr int kThreads = 512, kWarps = kThreads / kWarp;
constexpr int kMinPositionsPerSplit = 256;
constexpr int kMaxLatent = 8 * kThreads;  ///< the group-sum scratch holds 8 floats a thread

struct MlaDecodeArgs {
  const float* q;         ///< [H, nope + extra]
  const float* ckv;       ///< [kv_lora + extra], this token's pre-norm latent
  const float* norm_w;    ///< [kv_lora]
  const uint16_t* kvb;    ///< BF16 [H · (nope + v_head), kv_lora]
  float* cache;           ///< [capacity, kv_lora + extra]; row pos written here
  float* scores;          ///< [H, pos + 1] scratch
  float* part;            ///< [H, splits, kv_lora + 2] scratch: c̄, m, l of each split
  float* ctx;             ///< [H, v_head]
  int nope, extra, v_head, kv_lora, pos, per_split;
  float eps, scale;
};

/// The sequences of one launch (kernel parameters, __grid_constant__): sequence b is blockIdx.z of
/// the attention kernel (blockIdx.y of the merge), with its own cache, position and split count
/// (the same count a launch of it alone would use, so its sums are the same).
constexpr int kMaxBatch = 32;
struct MlaDecodeBatch {
  MlaDecodeArgs seq[kMaxBatch];
  int splits[kMaxBatch];
};
static_assert(sizeof(MlaDecodeBatch) <= 4096, "kernel parameters");
/// The score floats one batched launch may hold at once (64 MB; mla_decode_batch splits a batch
/// of long contexts over more launches).
constexpr size_t kBatchScratch = size_t(16) << 20;

/// 8 BF16 values (16 bytes) as f32.
__device__ __forceinline__ void bf16x8(const uint16_t* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

/// ctx[h, i] = Σ_j kv_b[h·(nope+v) + nope + i, j] · cb[j], a warp a row, 4 rows a step (their
/// loads issued together); cb in shared memory.
__device__ void value_rows(const MlaDecodeArgs& a, int h, const float* cb) {
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const uint16_t* vb = a.kvb + (size_t(h) * (a.nope + a.v_head) + a.nope) * a.kv_lora;
  for (int i0 = warp; i0 < a.v_head; i0 += 4 * kWarps) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int c = lane * 8; c < a.kv_lora; c += kWarp * 8) {
      float f[4][8];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + r * kWarps;
        if (i < a.v_head) bf16x8(vb + size_t(i) * a.kv_lora + c, f[r]);
        else
#pragma unroll
          for (int e = 0; e < 8; ++e) f[r][e] = 0.f;
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r] += f[r][e] * cb[c + e];
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = i0 + r * kWarps;
      const float v = warp_sum(acc[r]);
      if (lane == 0 && i < a.v_head) a.ctx[size_t(h) * a.v_head + i] = v;
    }
  }
}

/// Block (h, split): see the file comment. Shared memory: q_cat [W], own row [W], group sums
/// [8 · kThreads] (W = kv_lora + extra).
__global__ void __launch_bounds__(kThreads) mla_decode_kernel(const __grid_constant__ MlaDecodeBatch batch) {
  extern __shared__ float sm[];
  __shared__ double red[32];
  __shared__ float redf[32];
  const MlaDecodeArgs& a = batch.seq[blockIdx.z];
  const int W = a.kv_lora + a.extra, qh = a.nope + a.extra, kvh = a.nope + a.v_head;
  const int h = int(blockIdx.x), split = int(blockIdx.y), splits = batch.splits[blockIdx.z];
  if (split >= splits) return;  // a sequence with fewer splits than the launch's most
  // A programmatic dependent launch: split 0 of each head of the first sequence asks L2 for the
  // head's kv_b rows (a weight, never written by a step) while the kernel before it drains;
  // nothing else is touched before the wait.
  if (split == 0 && blockIdx.z == 0) {
    const uint8_t* kb0 = reinterpret_cast<const uint8_t*>(a.kvb + size_t(h) * kvh * a.kv_lora);
    const size_t bytes = size_t(kvh) * a.kv_lora * sizeof(uint16_t);
    for (size_t off = size_t(threadIdx.x) * 128; off < bytes; off += size_t(kThreads) * 128) prefetch_l2(kb0 + off);
  }
  pdl_wait();
  pdl_trigger();
  const int tid = int(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const int n = a.pos + 1, s0 = split * a.per_split, s1 = min(n, s0 + a.per_split);
  float* qc = sm;
  float* own = qc + W;
  float* part = own + W;
  const float* qn = a.q + size_t(h) * qh;
  // This token's row: the last split attends to it (RMSNorm in f64 as the cache-write kernel).
  if (split == splits - 1) {
    double ss = 0;
    for (int i = tid; i < a.kv_lora; i += kThreads) ss += double(a.ckv[i]) * a.ckv[i];
    ss = block_sum(ss, red);
    const float inv = float(1.0 / sqrt(ss / a.kv_lora + a.eps));
    float* crow = a.cache + size_t(a.pos) * W;
    for (int i = tid; i < W; i += kThreads) {
      const float v = i < a.kv_lora ? a.ckv[i] * inv * a.norm_w[i] : a.ckv[i];
      own[i] = v;
      if (h == 0) crow[i] = v;
    }
  }
  // q_abs: thread (cg, dg) sums rows d ≡ dg (mod ndg) for columns 8·cg .. 8·cg + 7.
  const int G = a.kv_lora / 8, ndg = max(1, min(kThreads / G, a.nope));
  const uint16_t* kb = a.kvb + size_t(h) * kvh * a.kv_lora;
  for (int i = tid; i < G * ndg; i += kThreads) {
    const int cg = i % G, dg = i / G;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int d = dg; d < a.nope; d += ndg) {
      float f[8];
      bf16x8(kb + size_t(d) * a.kv_lora + cg * 8, f);
      const float qd = qn[d];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += qd * f[e];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) part[dg * a.kv_lora + cg * 8 + e] = acc[e];
  }
  __syncthreads();
  for (int j = tid; j < W; j += kThreads) {
    float s = 0.f;
    if (j < a.kv_lora)
      for (int g = 0; g < ndg; ++g) s += part[g * a.kv_lora + j];
    else
      s = qn[a.nope + j - a.kv_lora];
    qc[j] = s;
  }
  __syncthreads();
  // Scores: a warp a position.
  float* sc = a.scores + size_t(h) * n;
  float mx = -INFINITY;
  for (int s = s0 + warp; s < s1; s += 2 * kWarps) {  // two positions a step, loads issued together
    const int t = s + kWarps;
    const float* ra = s == a.pos ? own : a.cache + size_t(s) * W;
    const float* rb = t == a.pos ? own : a.cache + size_t(t < s1 ? t : s) * W;
    float acc = 0.f, acc2 = 0.f;
    for (int c = lane * 4; c < W; c += kWarp * 4) {
      const float4 r = *reinterpret_cast<const float4*>(ra + c);
      const float4 r2 = *reinterpret_cast<const float4*>(rb + c);
      const float4 v = *reinterpret_cast<const float4*>(qc + c);
      acc += r.x * v.x + r.y * v.y + r.z * v.z + r.w * v.w;
      acc2 += r2.x * v.x + r2.y * v.y + r2.z * v.z + r2.w * v.w;
    }
    const float v = warp_sum(acc) * a.scale, v2 = warp_sum(acc2) * a.scale;
    if (lane == 0) sc[s] = v;
    mx = fmaxf(mx, v);
    if (t < s1) {
      if (lane == 0) sc[t] = v2;
      mx = fmaxf(mx, v2);
    }
  }
  mx = block_max(mx, redf);  // its barriers make the sc[] writes visible to the block
  double l = 0;
  for (int s = s0 + tid; s < s1; s += kThreads) {
    const float e = exp_f(sc[s] - mx);
    sc[s] = e;
    l += e;
  }
  l = block_sum(l, red);
  // c̄: thread (c4, sg) sums positions p ≡ sg (mod nsg) for columns 4·c4 .. 4·c4 + 3.
  const int G4 = a.kv_lora / 4, nsg = max(1, kThreads / G4);
  for (int i = tid; i < G4 * nsg; i += kThreads) {
    const int c4 = i % G4, sg = i / G4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int s = s0 + sg; s < s1; s += nsg) {
      const float p = sc[s];
      const float4 r = *reinterpret_cast<const float4*>((s == a.pos ? own : a.cache + size_t(s) * W) + c4 * 4);
      acc.x += p * r.x, acc.y += p * r.y, acc.z += p * r.z, acc.w += p * r.w;
    }
    *reinterpret_cast<float4*>(part + sg * a.kv_lora + c4 * 4) = acc;
  }
  __syncthreads();
  float* cb = qc;  // q_cat is no longer needed
  const float inv_l = float(1.0 / l);
  if (splits == 1) {
    for (int j = tid; j < a.kv_lora; j += kThreads) {
      float s = 0.f;
      for (int g = 0; g < nsg; ++g) s += part[g * a.kv_lora + j];
      cb[j] = s * inv_l;
    }
    __syncthreads();
    value_rows(a, h, cb);
    return;
  }
  float* out = a.part + (size_t(h) * splits + split) * (a.kv_lora + 2);
  for (int j = tid; j < a.kv_lora; j += kThreads) {
    float s = 0.f;
    for (int g = 0; g < nsg; ++g) s += part[g * a.kv_lora + j];
    out[j] = s;
  }
  if (tid == 0) out[a.kv_lora] = mx, out[a.kv_lora + 1] = float(l);
}

/// Block h: merges the splits' (c̄, m, l) in split order, then ctx as a single split does.
/// Shared memory: c̄ [kv_lora], the splits' factors [splits].
__global__ void __launch_bounds__(kThreads) mla_decode_merge_kernel(const __grid_constant__ MlaDecodeBatch batch) {
  pdl_wait();  // a programmatic dependent launch: nothing is touched before
  pdl_trigger();
  const MlaDecodeArgs& a = batch.seq[blockIdx.y];
  const int splits = batch.splits[blockIdx.y];
  if (splits == 1) return;  // that sequence's attention kernel formed its ctx
  extern __shared__ float sm[];
  float* cb = sm;
  float* f = cb + a.kv_lora;
  const int h = int(blockIdx.x), tid = int(threadIdx.x), stride = a.kv_lora + 2;
  const float* in = a.part + size_t(h) * splits * stride;
  if (tid == 0) {
    float M = -INFINITY;
    for (int i = 0; i < splits; ++i) M = fmaxf(M, in[size_t(i) * stride + a.kv_lora]);
    float L = 0.f;
    for (int i = 0; i < splits; ++i) {
      f[i] = exp_f(in[size_t(i) * stride + a.kv_lora] - M);
      L += f[i] * in[size_t(i) * stride + a.kv_lora + 1];
    }
    const float inv = 1.f / L;
    for (int i = 0; i < splits; ++i) f[i] *= inv;
  }
  __syncthreads();
  for (int j = tid; j < a.kv_lora; j += kThreads) {
    float s = 0.f;
    for (int i = 0; i < splits; ++i) s += f[i] * in[size_t(i) * stride + j];
    cb[j] = s;
  }
  __syncthreads();
  value_rows(a, h, cb);
}

/// Whether the fast decode kernels take this layer (see mla_decode in mla_decode.cuh); `kvb`
/// receives kv_b's BF16 device copy.
bool decode_takes(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const uint16_t** kvb) {
  if (m.opts.precision != GpuPrecision::Fast) return false;
  if (w.kv_b.format != WFormat::F32 && w.kv_b.format != WFormat::BF16) return false;
  if (p.heads < 1 || p.nope < 1 || p.v_head < 1 || p.kv_lora % 8 != 0 || p.kv_lora > kMaxLatent || p.extra % 4 != 0)
    return false;
  // An f32 kv_b is read through its BF16 copy, which cannot be made while a graph is recorded.
  if (w.kv_b.format == WFormat::F32 && m.capturing &&
      lt_state(m).bf16.count(m.dense(w.kv_b, "mla_attend (fast decode, kv_b)")) == 0)
    return false;
  *kvb = bf16_weight(m, w.kv_b, "mla_attend (fast decode, kv_b)");
  if (!*kvb || reinterpret_cast<uintptr_t>(*kvb) % 16 != 0) return false;
  const int W = p.kv_lora + p.extra;
  const size_t smem = (2 * size_t(W) + 8 * kThreads) * sizeof(float);
  return smem <= size_t(m.max_smem_optin);
}

/// Launches the attention kernel (and the merge where a sequence has several splits) for
/// caches[0 .. B) (B <= kMaxBatch, each qualifying: decode_takes, a 16-byte aligned cache with
/// room for one row), sequence b reading q + b · H · (nope + extra), ckv + b · W and writing ctx +
/// b · H · v_head. Does not advance the lengths.
void launch_decode(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const uint16_t* kvb,
                   MlaCache* const* caches, int B, const float* q, const float* ckv, float* ctx) {
  const int H = p.heads, W = p.kv_lora + p.extra;
  const size_t Q = size_t(H) * (p.nope + p.extra), C = size_t(H) * p.v_head;
  const size_t smem = (2 * size_t(W) + 8 * kThreads) * sizeof(float);
  // What every sequence shares; splits: about two blocks an SM over the heads, at least
  // kMinPositionsPerSplit positions each.
  MlaDecodeArgs common{};
  common.norm_w = m.dense(w.kv_a_norm, "mla_attend (kv_a_norm)"), common.kvb = kvb;
  common.nope = p.nope, common.extra = p.extra, common.v_head = p.v_head, common.kv_lora = p.kv_lora;
  common.eps = p.latent_eps, common.scale = 1.0f / std::sqrt(float(p.nope + p.extra));
  const int cap = std::max(1, 2 * std::max(m.sm_count, 1) / H);
  MlaDecodeBatch batch{};
  std::array<size_t, kMaxBatch> score_off{}, part_off{};  // each sequence's scratch, in floats
  size_t scratch = 0;
  int max_used = 1;
  for (int b = 0; b < B; ++b) {
    // The split count is a function of n and H only, so a sequence's sums do not depend on its
    // batch mates.
    const int n = caches[b]->length + 1;
    const int splits = std::clamp((n + kMinPositionsPerSplit - 1) / kMinPositionsPerSplit, 1, cap);
    const int per = (n + splits - 1) / splits;
    const int used = (n + per - 1) / per;  // every split non-empty
    MlaDecodeArgs& a = batch.seq[b];
    a = common;
    a.q = q + size_t(b) * Q, a.ckv = ckv + size_t(b) * W, a.cache = caches[b]->kv, a.ctx = ctx + size_t(b) * C;
    a.pos = caches[b]->length, a.per_split = per;
    batch.splits[b] = used;
    max_used = std::max(max_used, used);
    const size_t part_floats = used > 1 ? size_t(H) * used * (p.kv_lora + 2) : 0;
    score_off[size_t(b)] = scratch;
    part_off[size_t(b)] = scratch += (size_t(H) * n + 3) / 4 * 4;
    scratch += (part_floats + 3) / 4 * 4;
  }
  float* base = static_cast<float*>(m.scratch(m.scores, scratch * sizeof(float)));
  for (int b = 0; b < B; ++b)
    batch.seq[b].scores = base + score_off[size_t(b)], batch.seq[b].part = base + part_off[size_t(b)];
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(mla_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "cudaFuncSetAttribute (mla decode shared memory)");
  launch_ex(m, mla_decode_kernel, dim3(unsigned(H), unsigned(max_used), unsigned(B)), dim3(kThreads), smem, 0,
            m.stream_pdl, "mla (fast) decode kernel", batch);
  m.launched("mla (fast) decode kernel");
  if (max_used > 1) {
    const size_t msmem = (size_t(p.kv_lora) + max_used) * sizeof(float);
    if (msmem > size_t(m.max_smem_optin)) throw Error("CUDA backend: mla decode: too many position splits");
    if (msmem > 48 * 1024)
      check_cuda(cudaFuncSetAttribute(mla_decode_merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(msmem)),
                 "cudaFuncSetAttribute (mla decode merge shared memory)");
    launch_ex(m, mla_decode_merge_kernel, dim3(unsigned(H), unsigned(B)), dim3(kThreads), msmem, 0, m.stream_pdl,
              "mla (fast) decode merge kernel", batch);
    m.launched("mla (fast) decode merge kernel");
  }
}

}  // namespace

bool mla_decode(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const float* q, const float* ckv,
                MlaCache& cache, int T, float* ctx) {
  const uint16_t* kvb = nullptr;
  if (T != 1 || !decode_takes(m, p, w, &kvb) || reinterpret_cast<uintptr_t>(cache.kv) % 16 != 0) return false;
  MlaCache* one = &cache;
  launch_decode(m, p, w, kvb, &one, 1, q, ckv, ctx);
  return true;
}

bool mla_decode_batch(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, MlaCache* const* caches, int B,
                      const float* q, const float* ckv, float* ctx) {
  const uint16_t* kvb = nullptr;
  if (B < 1 || !decode_takes(m, p, w, &kvb)) return false;
  for (int b = 0; b < B; ++b)
    if (reinterpret_cast<uintptr_t>(caches[b]->kv) % 16 != 0) return false;
  const int W = p.kv_lora + p.extra;
  const size_t Q = size_t(p.heads) * (p.nope + p.extra), C = size_t(p.heads) * p.v_head;
  // Launches of up to kMaxBatch sequences whose scores take at most kBatchScratch floats together
  // (the scratch holds every sequence's H · (pos + 1) scores at once; a sequence alone may pass it).
  for (int b0 = 0; b0 < B;) {
    int n = 0;
    size_t floats = 0;
    while (b0 + n < B && n < kMaxBatch) {
      const size_t f = size_t(p.heads) * size_t(caches[b0 + n]->length + 1);
      if (n > 0 && floats + f > kBatchScratch) break;
      floats += f, ++n;
    }
    launch_decode(m, p, w, kvb, caches + b0, n, q + size_t(b0) * Q, ckv + size_t(b0) * W, ctx + size_t(b0) * C);
    b0 += n;
  }
  return true;
}

}  // namespace wren::cuda
