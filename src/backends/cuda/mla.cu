// CUDA backend: gated NoPE MLA, absorbed form over the device latent cache (docs/model.md#mla).
// Layout: q [T, H, nope+extra]; ckv [T, kv_lora+extra] (pre-norm); cache rows [kv_lora normed
// latent | extra raw key], [capacity, kv_lora+extra] f32; kv_b [H·(nope+v), kv_lora] with per head
// rows [k_nope (nope) | v (v_head)]; ctx [T, H·v_head].
//
// Two launches per chunk: (1) one block per token writes its cache row at position length + t
// (RMSNorm in f64 as on the CPU, key part copied raw: NoPE); (2) one block per (head, token)
// attends over positions [0, length + t] (causal), so every row it reads was written by (1).
// Inside (2) each quantity is formed in the CPU's order: q_abs[j] summed over the nope dims in
// order, each score by cpu::dot's 8-partial order (one thread per position), the latent context
// summed over positions in order (one thread per latent dim), the output by cpu::dot per v dim.
// Scores and probabilities of a block live in a global scratch [T, H, length + T].
// Fast mode takes other kernels: T >= 2 mla_fast.cu (tensor cores), T == 1 mla_decode.cu.
#include <cmath>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/gemm_quant.cuh"
#include "backends/cuda/mla_decode.cuh"

namespace wren {

namespace {

constexpr int kMlaThreads = 256;

__global__ void mla_cache_write_kernel(const float* __restrict__ ckv, int kv_lora, int extra,
                                       const float* __restrict__ norm_w, float eps, float* cache, int pos0) {
  __shared__ double red[32];
  const int t = blockIdx.x, W = kv_lora + extra;
  const float* in = ckv + size_t(t) * W;
  float* row = cache + size_t(pos0 + t) * W;
  double ss = 0;
  for (int i = threadIdx.x; i < kv_lora; i += blockDim.x) ss += double(in[i]) * in[i];
  ss = cuda::block_sum(ss, red);
  const float inv = float(1.0 / sqrt(ss / kv_lora + eps));
  for (int i = threadIdx.x; i < kv_lora; i += blockDim.x) row[i] = in[i] * inv * norm_w[i];
  for (int j = threadIdx.x; j < extra; j += blockDim.x) row[kv_lora + j] = in[kv_lora + j];
}

struct MlaArgs {
  const float *q, *kvb, *cache;
  float *scores, *ctx;
  int H, nope, extra, v_head, kv_lora, pos0, span;  // span = scores per (t, h)
  float scale;
};

__global__ void mla_attend_kernel(MlaArgs a) {
  extern __shared__ float sm[];
  __shared__ double red[32];
  __shared__ float redf[32];
  const int h = blockIdx.x, t = blockIdx.y, H = a.H;
  const int qh = a.nope + a.extra, kvh = a.nope + a.v_head, W = a.kv_lora + a.extra;
  const int n = a.pos0 + t + 1;  // causal: this token's own row is the last
  float* q_abs = sm;               // [kv_lora]
  float* qx = q_abs + a.kv_lora;   // [extra]
  float* cbar = qx + a.extra;      // [kv_lora]
  float* sc = a.scores + (size_t(t) * H + h) * a.span;
  const float* qn = a.q + (size_t(t) * H + h) * qh;
  for (int j = threadIdx.x; j < a.kv_lora; j += blockDim.x) {
    float acc = 0;
    for (int dd = 0; dd < a.nope; ++dd) acc += qn[dd] * a.kvb[(size_t(h) * kvh + dd) * a.kv_lora + j];
    q_abs[j] = acc;
  }
  for (int j = threadIdx.x; j < a.extra; j += blockDim.x) qx[j] = qn[a.nope + j];
  __syncthreads();
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const float* c = a.cache + size_t(s) * W;
    const float v = (cuda::dot8(q_abs, c, a.kv_lora) + cuda::dot8(qx, c + a.kv_lora, a.extra)) * a.scale;
    sc[s] = v;
    mx = fmaxf(mx, v);
  }
  mx = cuda::block_max(mx, redf);
  double sum = 0;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const float e = cuda::exp_f(sc[s] - mx);
    sc[s] = e;
    sum += e;
  }
  sum = cuda::block_sum(sum, red);  // block_sum's barrier also orders the sc[] writes
  for (int s = threadIdx.x; s < n; s += blockDim.x) sc[s] = float(sc[s] / sum);
  __syncthreads();
  for (int j = threadIdx.x; j < a.kv_lora; j += blockDim.x) {
    float acc = 0;
    for (int s = 0; s < n; ++s) acc += sc[s] * a.cache[size_t(s) * W + j];
    cbar[j] = acc;
  }
  __syncthreads();
  float* out = a.ctx + (size_t(t) * H + h) * a.v_head;
  for (int dd = threadIdx.x; dd < a.v_head; dd += blockDim.x)
    out[dd] = cuda::dot8(a.kvb + (size_t(h) * kvh + a.nope + dd) * a.kv_lora, cbar, a.kv_lora);
}

}  // namespace

void CudaBackend::mla_decode_batch(const MlaParams& p, const MlaWeights& w, MlaCache* const* caches, int B,
                                   const float* q, const float* ckv, float* ctx) {
  check_mla_batch(caches, B);
  if (B == 0) return;
  if (!cuda::mla_decode_batch(*impl_, p, w, caches, B, q, ckv, ctx)) {
    Backend::mla_decode_batch(p, w, caches, B, q, ckv, ctx);  // exact mode, or a layer the decode kernel does not take
    return;
  }
  for (int b = 0; b < B; ++b) ++caches[b]->length;
}

void CudaBackend::mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& cache, const float* q,
                             const float* ckv, int T, float* ctx) {
  Impl& m = *impl_;
  if (T <= 0) return;
  if (cache.length + T > cache.capacity)
    throw Error("context limit reached: the MLA cache holds " + std::to_string(cache.capacity) + " tokens (raise --ctx)");
  const int pos0 = cache.length;
  if (cuda::mla_decode(m, p, w, q, ckv, cache, T, ctx)) {  // fast mode, T == 1 (mla_decode.cu; writes the row)
    cache.length += T;
    return;
  }
  mla_cache_write_kernel<<<T, kMlaThreads, 0, m.stream>>>(ckv, p.kv_lora, p.extra,
                                                          m.dense(w.kv_a_norm, "mla_attend (kv_a_norm)"),
                                                          p.latent_eps, cache.kv, pos0);
  m.launched("mla cache-write kernel");
  if (cuda::mla_fast(m, p, w, q, cache.kv, pos0, T, ctx)) {  // fast mode, T >= 2: tensor cores (mla_fast.cu)
    cache.length += T;
    return;
  }
  MlaArgs a{};
  a.q = q;
  // A packed kv_b (BF16 / Q8_ROW / Q4_G64 under --quant) is decoded to f32 (dequant_row's values,
  // as the CPU's absorb reads them; the CPU's value GEMV multiplies by the scale after summing, so
  // the two agree to rounding, not bit for bit) once, into a device copy kept until the next upload
  // (Impl::kvb_f32), so neither a batched step (once per sequence) nor a recorded decode step (once
  // per token) decodes it again. While a step is being recorded the copy is decoded on a side
  // stream and waited for (it is complete before any graph names it; until run 29 a recorded
  // first use decoded into a temporary inside the graph, so every later token did it again). Where
  // no device memory is left for the copy a stream-ordered temporary of this call holds the values.
  float* kvb_tmp = nullptr;
  if (w.kv_b.format != WFormat::F32) {
    const cuda::QuantView qv = cuda::quant_view(m, w.kv_b, "mla_attend (kv_b)");
    const size_t bytes = size_t(qv.rows) * qv.cols * sizeof(float);
    const auto it = m.kvb_f32.find(&w.kv_b);
    if (it != m.kvb_f32.end()) {
      a.kvb = it->second;
    } else {
      float* kept = nullptr;
      if (cudaMalloc(reinterpret_cast<void**>(&kept), bytes) != cudaSuccess) {
        cudaGetLastError();  // out of memory is not sticky: the temporary below is tried
        kept = nullptr;
      }
      ++m.stats.mla_kvb_decodes;
      if (kept && m.capturing) {
        cudaStream_t side = nullptr;
        cuda::check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate (mla kv_b decode)");
        cuda::launch_decode_rows(qv, nullptr, qv.rows, kept, side);
        const cudaError_t err = cudaGetLastError();
        const cudaError_t done = err == cudaSuccess ? cudaStreamSynchronize(side) : err;
        cudaStreamDestroy(side);
        if (done != cudaSuccess) m.deferred_free.push_back(kept);  // cudaFree would sync while recording
        cuda::check_cuda(done, "mla kv_b decode kernel (side stream, while recording)");
        ++m.stats.launches, ++m.stats.host_syncs;
        m.kvb_f32[&w.kv_b] = kept;
        a.kvb = kept;
      } else {
        if (kept) m.kvb_f32[&w.kv_b] = kept;
        else
          cuda::check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&kvb_tmp), bytes, m.stream),
                           "cudaMallocAsync (mla kv_b decode)");
        float* dst = kept ? kept : kvb_tmp;
        cuda::launch_decode_rows(qv, nullptr, qv.rows, dst, m.stream);
        m.launched("mla kv_b decode kernel");
        a.kvb = dst;
      }
    }
  } else {
    a.kvb = m.dense(w.kv_b, "mla_attend (kv_b)");
  }
  a.cache = cache.kv;
  a.ctx = ctx;
  a.H = p.heads, a.nope = p.nope, a.extra = p.extra, a.v_head = p.v_head, a.kv_lora = p.kv_lora;
  a.pos0 = pos0;
  a.span = pos0 + T;
  a.scores = static_cast<float*>(m.scratch(m.scores, size_t(T) * p.heads * a.span * sizeof(float)));
  a.scale = 1.0f / std::sqrt(float(p.nope + p.extra));
  const size_t smem = (2 * size_t(p.kv_lora) + p.extra) * sizeof(float);
  if (smem + 1024 > size_t(m.max_smem_optin))
    throw Error("CUDA backend: mla_attend: kv_lora " + std::to_string(p.kv_lora) + " needs too much shared memory");
  if (smem > 48 * 1024)
    cuda::check_cuda(cudaFuncSetAttribute(mla_attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                     "cudaFuncSetAttribute (mla_attend shared memory)");
  mla_attend_kernel<<<dim3(p.heads, T), kMlaThreads, smem, m.stream>>>(a);
  if (kvb_tmp) cuda::check_cuda(cudaFreeAsync(kvb_tmp, m.stream), "cudaFreeAsync (mla kv_b decode)");
  m.launched("mla_attend kernel");
  cache.length += T;
}

}  // namespace wren
