// CUDA backend: the fused KDA step (docs/model.md#kda, steps 2-7), ONE launch per chunk of T
// tokens: block h owns head h for the whole chunk and loops the tokens in order, doing conv + SiLU,
// L2 norms, the decay/beta gates, the delta-rule state update and read, the per-head RMSNorm and
// the output gate with no host round trip (docs/gpu-method.md#kda-fused).
// Layout: q, k, v, z, gate, out [T, P] (P = H·d); beta [T, H]; S [H, d, d] as S[key][value];
// conv windows [3, P, K-1] oldest first; conv weights [P, K] with tap K-1 = the current token.
//
// Thread c of a block owns value column c of S_h: the decay + u = kᵀS pass and the update + o = qᵀS
// pass walk the keys r in increasing order, the CPU's summation order, so the recurrence is the
// CPU's arithmetic; S_h lives in shared memory for the chunk (d² f32, 64 KB at d = 128; opt-in
// above 48 KB) or, when it does not fit, is updated in place in global memory.
//
// Two paths (issue 6): this token-by-token kernel (exact mode: the CPU's summation order) and the
// chunked form of kda_chunked.cu (parallel within a chunk of C tokens; same results up to f32
// rounding, not bit-identical). Selection per call:
// - T = 1 (decode): the fused decode kernel of kda_decode.cu (head_dim <= 128: a block per head fed
//   by bulk copies when d % 4 == 0, else a cluster per head; S read once and written once); the
//   token kernel above that.
// - T > 1: the backend option CudaOptions::kda (--cuda-kda) = Recurrent (the token kernel for
//   every T, exact mode) or Chunked (docs/gpu-method.md#kda-chunked); the CLI picks Chunked in fast
//   precision mode and Recurrent in exact mode unless --cuda-kda says otherwise; kda_chunk
//   (--cuda-kda-chunk) = 16, 32 or 64 (default 32) asks for the chunk length (smaller when d is too
//   large for its shared memory; the token kernel when even 16 does not fit). Options are fixed at
//   construction (CudaBackend::set_options / set_precision change them between calls: tests, benchmarks).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kda_chunked.cuh"
#include "backends/cuda/kda_decode.cuh"
#include "core/kda_math.h"

namespace wren {

namespace {

struct KdaArgs {
  const float *q, *k, *v, *z, *beta, *gate;  // activations
  const float *q_conv, *k_conv, *v_conv, *a_log, *dt_bias, *o_norm;  // weights
  float *S, *conv, *out;
  int H, d, K, T;
  float lower, eps;
  bool softplus_gate;  // Kimi Linear: g = -exp(A) * softplus(z); K3: g = lower * sigmoid(exp(A) * z)
  bool smem_state;
};

/// Causal depthwise conv over the window + SiLU for one channel; shifts the window.
__device__ __forceinline__ float conv_silu(float x, const float* wc, float* wi, int K) {
  const float y = kda::conv_silu(wc, K, x, kda::WindowTaps{wi});
  kda::conv_push(wi, K, x);
  return y;
}

__global__ void kda_kernel(KdaArgs a) {
  extern __shared__ float smem[];
  __shared__ double red[32];
  const int h = blockIdx.x, d = a.d, P = a.H * d, K = a.K, c = threadIdx.x;
  float* qs = smem;            // [d] q, then normalized
  float* ks = qs + d;          // [d]
  float* vs = ks + d;          // [d]
  float* al = vs + d;          // [d] alpha
  float* os = al + d;          // [d] o
  float* S = a.smem_state ? os + d : a.S + size_t(h) * d * d;
  float* Sg = a.S + size_t(h) * d * d;
  if (a.smem_state)
    for (int i = threadIdx.x; i < d * d; i += blockDim.x) S[i] = Sg[i];
  const float qscale = 1.0f / sqrtf(float(d));
  const float A = cuda::exp_f(a.a_log[h]);
  const float* convw[3] = {a.q_conv, a.k_conv, a.v_conv};
  const float* ins[3] = {a.q, a.k, a.v};
  float* outs[3] = {qs, ks, vs};
  __syncthreads();
  for (int t = 0; t < a.T; ++t) {
    // Conv + SiLU of this head's 3·d channels (q, k, v).
    for (int i = threadIdx.x; i < 3 * d; i += blockDim.x) {
      const int m = i / d, r = i % d, ch = h * d + r;
      float* win = a.conv + (size_t(m) * P + ch) * (K - 1);
      outs[m][r] = conv_silu(ins[m][size_t(t) * P + ch], convw[m] + size_t(ch) * K, win, K);
    }
    __syncthreads();
    // L2 norms of q (× d^-½) and k: v / sqrt(Σv² + 1e-6), the sum in f64.
    double sq = 0, sk = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      sq += double(qs[i]) * qs[i];
      sk += double(ks[i]) * ks[i];
    }
    sq = cuda::block_sum(sq, red);
    sk = cuda::block_sum(sk, red);
    const float invq = kda::l2_factor(sq, qscale), invk = kda::l2_factor(sk, 1.0f);
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      qs[i] *= invq;
      ks[i] *= invk;
      const int ch = h * d + i;
      const float zc = a.z[size_t(t) * P + ch] + a.dt_bias[ch];
      al[i] = cuda::exp_f(kda::log_decay(a.softplus_gate, A, zc, a.lower));
    }
    const float b = kda::beta_gate(a.beta[size_t(t) * a.H + h]);
    __syncthreads();
    // Delta rule on column c: decay rows, u = kᵀS, write k ⊗ β(v − u), read o = qᵀS.
    if (c < d) {
      float u = 0;
      for (int r = 0; r < d; ++r) {
        const float s = S[r * d + c] * al[r];
        S[r * d + c] = s;
        u += ks[r] * s;
      }
      u = b * (vs[c] - u);
      float o = 0;
      for (int r = 0; r < d; ++r) {
        const float s = S[r * d + c] + ks[r] * u;
        S[r * d + c] = s;
        o += qs[r] * s;
      }
      os[c] = o;
    }
    __syncthreads();
    // Per-head RMSNorm (shared o_norm weight), then × σ(gate).
    double so = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) so += double(os[i]) * os[i];
    so = cuda::block_sum(so, red);
    const float inv = float(1.0 / sqrt(so / d + a.eps));
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      const size_t at = size_t(t) * P + size_t(h) * d + i;
      float y = os[i] * inv * a.o_norm[i];
      y *= cuda::sigmoid_f(a.gate[at]);
      a.out[at] = y;
    }
    __syncthreads();  // qs/ks/vs/os are rewritten by the next token
  }
  if (a.smem_state)
    for (int i = threadIdx.x; i < d * d; i += blockDim.x) Sg[i] = S[i];
}

/// Chunk length the chunked path should use for this call, or 0 for the token kernel (see the
/// header).
int chunk_for_call(int T, int d, int max_smem, const CudaOptions& o) {
  if (T <= 1 || o.kda == CudaKda::Recurrent) return 0;  // exact mode by default (docs/gpu-method.md#kda-chunked)
  return cuda::kda_chunk_fit(d, o.kda_chunk, max_smem, o.precision == GpuPrecision::Fast);
}

}  // namespace

namespace {

/// The fields the token kernel's KdaArgs and the chunked path's KdaChunkArgs share (same names).
template <class Args>
void fill_kda_args(Args& a, const CudaBackend::Impl& m, const KdaParams& p, const KdaWeights& w, KdaState& s,
                   const float* q, const float* k, const float* v, const float* z, const float* beta,
                   const float* gate, int T, float* out) {
  a.q = q, a.k = k, a.v = v, a.z = z, a.beta = beta, a.gate = gate;
  a.q_conv = m.dense(w.q_conv, "kda_core (q_conv)");
  a.k_conv = m.dense(w.k_conv, "kda_core (k_conv)");
  a.v_conv = m.dense(w.v_conv, "kda_core (v_conv)");
  a.a_log = m.dense(w.a_log, "kda_core (A_log)");
  a.dt_bias = m.dense(w.dt_bias, "kda_core (dt_bias)");
  a.o_norm = m.dense(w.o_norm, "kda_core (o_norm)");
  a.S = s.S, a.conv = s.conv, a.out = out;
  a.H = p.heads, a.d = p.head_dim, a.K = p.conv_kernel, a.T = T;
  a.lower = p.gate_lower_bound, a.eps = p.eps;
  a.softplus_gate = p.gate == KdaGate::Softplus;
}

}  // namespace

void CudaBackend::kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* q, const float* k,
                           const float* v, const float* z, const float* beta, const float* gate, int T,
                           float* out) {
  Impl& m = *impl_;
  if (T <= 0) return;
  if (p.head_dim < 1 || p.head_dim > 1024)
    throw Error("CUDA backend: kda_core: head_dim " + std::to_string(p.head_dim) + " (supported: 1..1024)");
  if (p.conv_kernel < 1) throw Error("CUDA backend: kda_core: conv kernel must be >= 1");
  const size_t state_bytes = size_t(p.heads) * p.head_dim * p.head_dim * sizeof(float);
  if (const int C = chunk_for_call(T, p.head_dim, m.max_smem_optin, m.opts); C > 0) {
    cuda::KdaChunkArgs c{};
    fill_kda_args(c, m, p, w, s, q, k, v, z, beta, gate, T, out);
    cuda::kda_chunked(m, c, C);
    cuda::kda_note_launch(m, s.S, state_bytes);
    return;
  }
  if (T == 1 && p.head_dim <= cuda::kKdaDecodeMaxDim) {
    cuda::KdaDecodeArgs dec{};
    fill_kda_args(dec, m, p, w, s, q, k, v, z, beta, gate, T, out);
    dec.fast = m.opts.precision == GpuPrecision::Fast;
    if (cuda::kda_decode(m, dec)) return;
  }
  KdaArgs a{};
  fill_kda_args(a, m, p, w, s, q, k, v, z, beta, gate, T, out);
  const size_t vec_bytes = 5 * size_t(p.head_dim) * sizeof(float);
  const size_t head_bytes = size_t(p.head_dim) * p.head_dim * sizeof(float);
  a.smem_state = vec_bytes + head_bytes + 1024 <= size_t(m.max_smem_optin);
  const size_t smem = vec_bytes + (a.smem_state ? head_bytes : 0);
  if (smem > 48 * 1024)
    cuda::check_cuda(cudaFuncSetAttribute(kda_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                     "cudaFuncSetAttribute (kda_core shared memory)");
  const int threads = (p.head_dim + 31) / 32 * 32;
  kda_kernel<<<p.heads, threads, smem, m.stream>>>(a);
  m.launched("kda_core kernel");
  cuda::kda_note_launch(m, s.S, state_bytes);
}

void CudaBackend::kda_decode_batch(const KdaParams& p, const KdaWeights& w, KdaState* const* states, int B,
                                   const float* q, const float* k, const float* v, const float* z,
                                   const float* beta, const float* gate, float* out) {
  Impl& m = *impl_;
  if (B < 0) throw Error("CUDA backend: kda_decode_batch: B = " + std::to_string(B) + " (must be >= 0)");
  for (int b = 0; b < B; ++b)
    if (states[b] == nullptr || states[b]->S == nullptr)
      throw Error("CUDA backend: kda_decode_batch: the state of sequence " + std::to_string(b) + " is null");
  const size_t P = size_t(p.heads) * p.head_dim, H = size_t(p.heads);
  for (int b0 = 0; b0 < B; b0 += cuda::kKdaDecodeMaxBatch) {
    const int n = std::min(cuda::kKdaDecodeMaxBatch, B - b0);
    cuda::KdaDecodeStates st{};
    for (int i = 0; i < n; ++i) {
      st.S[i] = states[b0 + i]->S, st.conv[i] = states[b0 + i]->conv;
      for (int t = 0; t < i; ++t)
        if (st.S[t] == st.S[i])
          throw Error("CUDA backend: kda_decode_batch: sequences " + std::to_string(b0 + t) + " and " +
                      std::to_string(b0 + i) + " share one state");
    }
    const size_t r = size_t(b0);
    if (p.head_dim >= 1 && p.head_dim <= cuda::kKdaDecodeMaxDim && p.conv_kernel >= 1) {
      cuda::KdaDecodeArgs dec{};
      fill_kda_args(dec, m, p, w, *states[b0], q + r * P, k + r * P, v + r * P, z + r * P, beta + r * H,
                    gate + r * P, 1, out + r * P);
      dec.fast = m.opts.precision == GpuPrecision::Fast;
      if (cuda::kda_decode_batch(m, dec, st, n)) continue;
    }
    // The split form does not apply: one kda_core step per sequence (the interface's default).
    Backend::kda_decode_batch(p, w, states + b0, n, q + r * P, k + r * P, v + r * P, z + r * P, beta + r * H,
                              gate + r * P, out + r * P);
  }
}

}  // namespace wren
