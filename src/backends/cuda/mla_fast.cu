// CUDA backend, fast precision mode: MLA prefill attention (T >= 2) on tensor cores, absorbed form
// (docs/model.md#mla-absorbed), as batched BF16 products through cuBLASLt with f32 accumulation:
//   q_abs[t, h, :]  = q_nope[t, h, :] · kv_b_k[h]            (batched over heads; kv_b BF16)
//   q_cat[t, h, :]  = [q_abs | q_extra]                        (BF16, W = kv_lora + extra)
//   S[h, t, s]      = scale · q_cat[t, h, :] · cache[s, :]     (cache rows 0..n-1 as BF16)
//   P[h, t, s]      = softmax over s <= pos0 + t (causal), 0 beyond (BF16)
//   c̄[t, h, :]      = Σ_s P[h, t, s] · cache[s, :kv_lora]
//   ctx[t, h, :]    = c̄[t, h, :] · kv_b_v[h]ᵀ
// The scores are materialized per group of heads (bounded scratch), not tiled flash-style: the
// products run on tensor cores, the softmax is one pass of a bandwidth-bound kernel. The f32 cache
// (written by mla.cu's cache kernel, read by decode) stays the state; only a BF16 copy of its rows
// feeds the products. Positions past a token's own are exact zeros in P and the algorithms are
// fixed per shape class (lt_product), so a token's context does not depend on the chunk size.
// Needs nope, extra, v_head, kv_lora multiples of 8 (16-byte rows for cuBLASLt); else declines.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/lt_state.cuh"

namespace wren::cuda {

namespace {

constexpr int kSoftmaxThreads = 256;
constexpr size_t kScoreBudget = size_t(2) << 30;  ///< bytes of S + P per head group

/// q_cat16[t, h, c] = bf16(c < kv_lora ? q_abs[t, h, c] : q[t, h, nope + c - kv_lora]).
__global__ void qcat_kernel(const float* __restrict__ qabs, const float* __restrict__ q, int T, int H, int nope,
                            int extra, int kv_lora, __nv_bfloat16* __restrict__ out) {
  const int W = kv_lora + extra, qh = nope + extra;
  const size_t n = size_t(T) * H * W;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t th = i / W;
    const int c = int(i % W);
    const float v = c < kv_lora ? qabs[i] : q[th * qh + nope + (c - kv_lora)];
    out[i] = __float2bfloat16_rn(v);
  }
}

/// cache16[s, :] = bf16(cache[s, :]) for s < n, 0 for n <= s < n_pad.
__global__ void cache_bf16_kernel(const float* __restrict__ cache, int n, int n_pad, int W,
                                  __nv_bfloat16* __restrict__ out) {
  const size_t total = size_t(n_pad) * W, valid = size_t(n) * W;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(i < valid ? cache[i] : 0.f);
}

/// One block per (t, head g of the group): P = softmax(S) over s < pos0 + t + 1, zeros after.
/// Fixed thread striding and reduction order: the row's result depends only on its own values.
__global__ void causal_softmax_kernel(const float* __restrict__ S, int T, int n_pad, int pos0,
                                      __nv_bfloat16* __restrict__ P) {
  __shared__ float red[32];
  const int t = blockIdx.x, g = blockIdx.y, L = pos0 + t + 1;
  const float* row = S + (size_t(g) * T + t) * n_pad;
  __nv_bfloat16* out = P + (size_t(g) * T + t) * n_pad;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < L; s += blockDim.x) mx = fmaxf(mx, row[s]);
  mx = block_max(mx, red);
  float sum = 0.f;
  for (int s = threadIdx.x; s < L; s += blockDim.x) sum += __expf(row[s] - mx);
  for (int o = kWarp / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  __syncthreads();
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = sum;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < int(blockDim.x) / kWarp; ++w) total += red[w];
  const float inv = 1.f / total;
  for (int s = threadIdx.x; s < n_pad; s += blockDim.x)
    out[s] = __float2bfloat16_rn(s < L ? __expf(row[s] - mx) * inv : 0.f);
}

}  // namespace

bool mla_fast(CudaBackend::Impl& m, const MlaParams& p, const MlaWeights& w, const float* q, const float* cache,
              int pos0, int T, float* ctx) {
  if (m.opts.precision != GpuPrecision::Fast || T < 2) return false;
  const int H = p.heads, nope = p.nope, extra = p.extra, vh = p.v_head, L = p.kv_lora;
  if (nope % 8 || extra % 8 || vh % 8 || L % 8 || H < 1) return false;
  if (w.kv_b.format != WFormat::F32 && w.kv_b.format != WFormat::BF16) return false;
  const int W = L + extra, qh = nope + extra, kvh = nope + vh;
  const int n = pos0 + T, n_pad = (n + 7) / 8 * 8;
  const uint16_t* kvb = bf16_weight(m, w.kv_b, "mla_attend (fast, kv_b)");
  LtState& s = lt_state(m);
  uint16_t* q16 = bf16_scratch(m, s.mla[0], size_t(T) * H * qh);
  launch_f32_to_bf16(q, size_t(T) * H * qh, q16, m.stream);
  m.launched("mla (fast) q conversion");
  // q_abs (f32) into the context scratch, then q_cat (BF16).
  float* qabs = static_cast<float*>(m.scratch(s.mla[5], size_t(T) * H * std::max(W, L) * sizeof(float)));
  LtProduct a;
  a.M = T, a.N = L, a.K = nope, a.batch = H;
  a.A = q16, a.lda = int64_t(H) * qh, a.sA = qh;
  a.B = kvb, a.b_nk = false, a.ldb = L, a.sB = int64_t(kvh) * L;
  a.C = qabs, a.ldc = int64_t(H) * W, a.sC = W;
  lt_product(m, a, 1);
  auto* qcat = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[1], size_t(T) * H * W));
  qcat_kernel<<<grid_for(size_t(T) * H * W, 256), 256, 0, m.stream>>>(qabs, q, T, H, nope, extra, L, qcat);
  m.launched("mla (fast) q_cat kernel");
  auto* c16 = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[2], size_t(n_pad) * W));
  cache_bf16_kernel<<<grid_for(size_t(n_pad) * W, 256), 256, 0, m.stream>>>(cache, n, n_pad, W, c16);
  m.launched("mla (fast) cache conversion");
  const size_t per_head = size_t(T) * n_pad * (sizeof(float) + sizeof(uint16_t));
  const int G = int(std::max<size_t>(1, std::min<size_t>(size_t(H), kScoreBudget / per_head)));
  float* S = static_cast<float*>(m.scratch(s.mla[3], size_t(G) * T * n_pad * sizeof(float)));
  auto* P = reinterpret_cast<__nv_bfloat16*>(bf16_scratch(m, s.mla[4], size_t(G) * T * n_pad));
  float* cbar = qabs;  // q_abs is consumed by q_cat: reuse as c̄ [T, H, L] f32
  const float scale = 1.0f / std::sqrt(float(nope + extra));
  for (int h0 = 0; h0 < H; h0 += G) {
    const int g = std::min(G, H - h0);
    LtProduct sc;
    sc.M = T, sc.N = n_pad, sc.K = W, sc.batch = g, sc.alpha = scale;
    sc.A = qcat + size_t(h0) * W, sc.lda = int64_t(H) * W, sc.sA = W;
    sc.B = c16, sc.b_nk = true, sc.ldb = W, sc.sB = 0;
    sc.C = S, sc.ldc = n_pad, sc.sC = int64_t(T) * n_pad;
    lt_product(m, sc, 2);
    causal_softmax_kernel<<<dim3(unsigned(T), unsigned(g)), kSoftmaxThreads, 0, m.stream>>>(S, T, n_pad, pos0, P);
    m.launched("mla (fast) causal softmax kernel");
    LtProduct pv;
    pv.M = T, pv.N = L, pv.K = n_pad, pv.batch = g;
    pv.A = P, pv.lda = n_pad, pv.sA = int64_t(T) * n_pad;
    pv.B = c16, pv.b_nk = false, pv.ldb = W, pv.sB = 0;
    pv.C = cbar + size_t(h0) * L, pv.ldc = int64_t(H) * L, pv.sC = L;
    lt_product(m, pv, 3);
  }
  uint16_t* cbar16 = bf16_scratch(m, s.mla[0], size_t(T) * H * std::max(L, qh));  // q16 is no longer read
  launch_f32_to_bf16(cbar, size_t(T) * H * L, cbar16, m.stream);
  m.launched("mla (fast) context conversion");
  LtProduct o;
  o.M = T, o.N = vh, o.K = L, o.batch = H;
  o.A = cbar16, o.lda = int64_t(H) * L, o.sA = L;
  o.B = kvb + size_t(nope) * L, o.b_nk = true, o.ldb = L, o.sB = int64_t(kvh) * L;
  o.C = ctx, o.ldc = int64_t(H) * vh, o.sC = vh;
  lt_product(m, o, 4);
  return true;
}

}  // namespace wren::cuda
