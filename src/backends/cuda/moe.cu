// CUDA backend: sigmoid router with biased top-k, one routed expert on the packed MXFP4 layout, and
// the weighted expert sum (docs/model.md#moe, #mxfp4).
// Layout: logits [T, E] device; ids/weights [T, k] HOST; an expert's matrices are packed
// [rows, cols/2] u8 (column 2j in the low nibble of byte j) + ue8m0 scale [rows, cols/32] u8,
// decoded with the one codec (core/mxfp4.h); z, y [latent] device; ys [m, n] device.
//
// Router: one block per token; k rounds of a block arg-max over σ(logit) + bias with ties to the
// lower id (the CPU's strict '>' scan), the raw σ weights renormalized by the sum in selection
// order. The device ids/weights come back through pinned host buffers (one sync per call).
// Expert: two launches. One warp per output row; lane l takes the 32-column groups l, l+32, ...:
// Σ e2m1·x over the group in column order, × the group's exact power-of-two scale, as on the CPU;
// lane 0 then adds the group terms in group order (the CPU's order). The input vector sits in
// shared memory at a stride of 33 floats per group, so the 32 lanes (32 different groups) hit 32
// different banks. Launch 1 computes W1·z and W3·z and applies SiTU; launch 2 computes W2·act.
// routed_moe: the same two passes for every (token, slot) pair of a chunk in one launch each
// (grid y = pair; the expert through a device table: ExpertPtrs[E] of the resident experts, or
// the VRAM tier's per-pair table), the router writing ids and scaled weights to device memory,
// and a weighted sum over each token's slots in slot order.
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/moe_decode.cuh"
#include "core/mxfp4.h"
#include "ops/weights.h"

namespace wren {

namespace {

constexpr int kRouterThreads = 256;
constexpr int kMxWarps = 8;
constexpr int kMaxWeighted = 64;  ///< experts per weighted sum (K3: top-16)

struct Best {
  float v;
  int i;  // -1 = none
};

/// a better than b: larger value, ties to the lower id; "none" loses.
__device__ __forceinline__ bool better(const Best& a, const Best& b) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

/// scale: routed_scale applied after the renormalization (1 = none), as the forward pass does.
__global__ void router_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int E, int k,
                              float scale, int* __restrict__ ids, float* __restrict__ weights) {
  cuda::pdl_wait();  // launched as a programmatic dependent (launch_router): nothing is touched before
  cuda::pdl_trigger();
  extern __shared__ float rs[];
  float* s = rs;                                         // [E] σ(logit)
  float* biased = s + E;                                 // [E]
  unsigned char* taken = reinterpret_cast<unsigned char*>(biased + E);  // [E]
  __shared__ float bv[32];
  __shared__ int bi[32];
  __shared__ int chosen[kMaxWeighted * 4];
  const int t = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    s[e] = cuda::sigmoid_f(logits[size_t(t) * E + e]);
    biased[e] = s[e] + bias[e];
    taken[e] = 0;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  for (int j = 0; j < k; ++j) {
    Best b{0.f, -1};
    for (int e = threadIdx.x; e < E; e += blockDim.x)  // ascending: strict '>' keeps the lower id
      if (!taken[e] && (b.i < 0 || biased[e] > b.v)) b = {biased[e], e};
    for (int o = 16; o > 0; o >>= 1) {
      const Best other{__shfl_xor_sync(cuda::kFull, b.v, o), __shfl_xor_sync(cuda::kFull, b.i, o)};
      if (better(other, b)) b = other;
    }
    if (lane == 0) bv[warp] = b.v, bi[warp] = b.i;
    __syncthreads();
    if (threadIdx.x == 0) {
      Best best{bv[0], bi[0]};
      for (int w = 1; w < nw; ++w)
        if (better(Best{bv[w], bi[w]}, best)) best = {bv[w], bi[w]};
      taken[best.i] = 1;
      chosen[j] = best.i;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float total = 0;
    for (int j = 0; j < k; ++j) total += s[chosen[j]];
    for (int j = 0; j < k; ++j) {
      ids[size_t(t) * k + j] = chosen[j];
      const float w = s[chosen[j]] / (total + 1e-20f);
      weights[size_t(t) * k + j] = scale != 1.f ? w * scale : w;
    }
  }
}

/// router_kernel for E <= 32 · kPer: the block's 256 threads form the scores σ(logit) and the
/// biased scores into shared memory, then one warp picks the top k, lane l holding experts l,
/// l + 32, … in registers: each of the k rounds is a lane-local scan and a 5-step shuffle
/// reduction, no block barrier (router_kernel: 2 barriers and a serial step a round, ~11 µs for
/// Kimi Linear's top-8 of 256 on an H100, run 31). The same choices (larger biased score, ties to
/// the lower id) and the same sums in the same order as router_kernel: bit-identical ids and weights.
template <int kPer>
__global__ void __launch_bounds__(kRouterThreads) router_warp_kernel(const float* __restrict__ logits,
                                                                     const float* __restrict__ bias, int E, int k,
                                                                     float scale, int* __restrict__ ids,
                                                                     float* __restrict__ weights) {
  cuda::pdl_wait();  // launched as a programmatic dependent (launch_router): nothing is touched before
  cuda::pdl_trigger();
  __shared__ float ss[32 * kPer], sb[32 * kPer];
  __shared__ int chosen[kMaxWeighted * 4];
  __shared__ float chosen_s[kMaxWeighted * 4];
  const int t = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    ss[e] = cuda::sigmoid_f(logits[size_t(t) * E + e]);
    sb[e] = ss[e] + bias[e];
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  float s[kPer], biased[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    s[i] = e < E ? ss[e] : 0.f;
    biased[i] = e < E ? sb[e] : 0.f;
  }
  unsigned taken = 0;  // bit i: expert lane + 32 i is chosen
  for (int j = 0; j < k; ++j) {
    Best b{0.f, -1};
#pragma unroll
    for (int i = 0; i < kPer; ++i)  // ascending ids: strict '>' keeps the lower id
      if (lane + 32 * i < E && !((taken >> i) & 1u) && (b.i < 0 || biased[i] > b.v)) b = {biased[i], lane + 32 * i};
    for (int o = 16; o > 0; o >>= 1) {
      const Best other{__shfl_xor_sync(cuda::kFull, b.v, o), __shfl_xor_sync(cuda::kFull, b.i, o)};
      if (better(other, b)) b = other;
    }
    const int owner = b.i % 32, slot = b.i / 32;
    if (lane == owner) taken |= 1u << slot;
    if (lane == 0) chosen[j] = b.i, chosen_s[j] = ss[b.i];
  }
  __syncwarp();
  if (lane == 0) {
    float total = 0;
    for (int j = 0; j < k; ++j) total += chosen_s[j];
    for (int j = 0; j < k; ++j) {
      ids[size_t(t) * k + j] = chosen[j];
      const float w = chosen_s[j] / (total + 1e-20f);
      weights[size_t(t) * k + j] = scale != 1.f ? w * scale : w;
    }
  }
}

/// Group term of one 32-column group: (Σ_j e2m1[code_j] · x_j) · 2^(scale - 127), CPU order.
__device__ __forceinline__ float mx_group(const uint8_t* packed_row, const uint8_t* scale_row, int g,
                                          const float* xs, const float* lut) {
  const uint4 raw = *reinterpret_cast<const uint4*>(packed_row + size_t(g) * 16);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  const float* xg = xs + g * 33;
  float part = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (words[w] >> (8 * b)) & 0xFFu;  // little-endian: byte 4w+b of the group
      const int col = (w * 4 + b) * 2;
      part += lut[byte & 0xF] * xg[col];       // low nibble = even column
      part += lut[byte >> 4] * xg[col + 1];    // high nibble = odd column
    }
  return part * mxfp4::scale_value(scale_row[g]);
}

/// One warp: y = (M · x)[row] for matrix M (rows × cols) with the per-group terms summed in order.
__device__ __forceinline__ float mx_row(const uint8_t* packed, const uint8_t* scale, int row, int cols,
                                        const float* xs, const float* lut, float* terms) {
  const int lane = threadIdx.x % 32, groups = cols / mxfp4::kGroup;
  const uint8_t* pr = packed + size_t(row) * (cols / 2);
  const uint8_t* sr = scale + size_t(row) * groups;
  for (int g = lane; g < groups; g += 32) terms[g] = mx_group(pr, sr, g, xs, lut);
  __syncwarp();
  float acc = 0;
  if (lane == 0)
    for (int g = 0; g < groups; ++g) acc += terms[g];
  __syncwarp();  // terms is reused by the caller's next row
  return acc;
}

struct MxArgs {
  const uint8_t *p1, *s1, *p3, *s3;  // gate/up (launch 1) or p1/s1 = down (launch 2)
  const float* x;
  float* y;
  int rows, cols;
  float b1, b2;
};

/// The body of one expert matrix pass (see the file comment); xsm is the block's dynamic shared
/// memory, lut 16 floats of shared memory.
template <bool kGateUp>
__device__ __forceinline__ void mx_pass(const MxArgs& a, float* xsm, float* lut) {
  const int groups = a.cols / mxfp4::kGroup;
  if (threadIdx.x < 16) lut[threadIdx.x] = mxfp4::e2m1_value(uint8_t(threadIdx.x));
  for (int c = threadIdx.x; c < a.cols; c += blockDim.x) xsm[(c / 32) * 33 + c % 32] = a.x[c];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* terms = xsm + groups * 33 + warp * groups;
  for (int row = blockIdx.x * kMxWarps + warp; row < a.rows; row += gridDim.x * kMxWarps) {
    const float g = mx_row(a.p1, a.s1, row, a.cols, xsm, lut, terms);
    if (kGateUp) {
      const float u = mx_row(a.p3, a.s3, row, a.cols, xsm, lut, terms);
      if (lane == 0) a.y[row] = cuda::situ_f(g, u, a.b1, a.b2);
    } else if (lane == 0) {
      a.y[row] = g;
    }
  }
}

template <bool kGateUp>
__global__ void mx_kernel(MxArgs a) {
  extern __shared__ float xsm[];  // [groups * 33] input, then [kMxWarps * groups] terms
  __shared__ float lut[16];
  mx_pass<kGateUp>(a, xsm, lut);
}

/// Every (token, slot) pair of a routed MoE chunk in one launch: blockIdx.y = pair j, its expert
/// table[ids[j]] (or table[j] when ids is null: the VRAM tier's per-pair table), input row
/// x + (j / x_div)·cols, output row y + j·rows. Each pair's result is
/// the single-expert kernel's, bit for bit.
struct MxBatchArgs {
  const cuda::ExpertPtrs* table;
  const int* ids;
  const float* x;
  float* y;
  int x_div, rows, cols;
  float b1, b2;
};

template <bool kGateUp>
__global__ void mx_batch_kernel(MxBatchArgs b) {
  extern __shared__ float xsm[];
  __shared__ float lut[16];
  const int j = blockIdx.y;
  const cuda::ExpertPtrs e = b.ids ? b.table[b.ids[j]] : b.table[j];  // ids null: a per-pair table
  MxArgs a;
  a.p1 = kGateUp ? e.p1 : e.p2, a.s1 = kGateUp ? e.s1 : e.s2, a.p3 = e.p3, a.s3 = e.s3;
  a.x = b.x + size_t(j / b.x_div) * b.cols;
  a.y = b.y + size_t(j) * b.rows;
  a.rows = b.rows, a.cols = b.cols, a.b1 = b.b1, a.b2 = b.b2;
  mx_pass<kGateUp>(a, xsm, lut);
}

struct Weights {
  float w[kMaxWeighted];
};

__global__ void weighted_sum_kernel(const float* __restrict__ ys, Weights w, int m, int n, float* __restrict__ y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0;
    for (int j = 0; j < m; ++j) acc += w.w[j] * ys[size_t(j) * n + i];
    y[i] = acc;
  }
}

/// Dynamic shared memory of an MXFP4 pass over `cols` inputs (opting `kernel` in when > 48 KiB).
template <typename K>
size_t mx_smem(CudaBackend::Impl& m, K kernel, int cols) {
  const int groups = cols / mxfp4::kGroup;
  const size_t smem = (size_t(groups) * 33 + size_t(kMxWarps) * groups) * sizeof(float);
  if (smem + 1024 > size_t(m.max_smem_optin))
    throw Error("CUDA backend: expert_ffn: " + std::to_string(cols) + " columns need too much shared memory");
  if (smem > 48 * 1024)
    cuda::check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                     "cudaFuncSetAttribute (expert_ffn shared memory)");
  return smem;
}

/// Launch of one MXFP4 matrix pass over `rows` outputs.
template <bool kGateUp>
void launch_mx(CudaBackend::Impl& m, const MxArgs& a, const char* what) {
  const size_t smem = mx_smem(m, mx_kernel<kGateUp>, a.cols);
  const unsigned blocks = unsigned((a.rows + kMxWarps - 1) / kMxWarps);
  mx_kernel<kGateUp><<<blocks, kMxWarps * 32, smem, m.stream>>>(a);
  m.launched(what);
}

/// Launch of one MXFP4 matrix pass for `pairs` (token, slot) pairs.
template <bool kGateUp>
void launch_mx_batch(CudaBackend::Impl& m, const MxBatchArgs& a, int pairs, const char* what) {
  const size_t smem = mx_smem(m, mx_batch_kernel<kGateUp>, a.cols);
  const unsigned blocks = unsigned((a.rows + kMxWarps - 1) / kMxWarps);
  mx_batch_kernel<kGateUp><<<dim3(blocks, unsigned(pairs)), kMxWarps * 32, smem, m.stream>>>(a);
  m.launched(what);
}

/// Checks the router's limits for top-k of E and returns its dynamic shared memory bytes.
size_t router_smem(const CudaBackend::Impl& m, int E, int k) {
  if (k < 1 || k > E || k > kMaxWeighted * 4)
    throw Error("CUDA backend: router_topk: top-" + std::to_string(k) + " of " + std::to_string(E) + " is not supported");
  const size_t smem = size_t(E) * (2 * sizeof(float) + 1);
  if (smem + 2048 > size_t(m.max_smem_optin))
    throw Error("CUDA backend: router_topk: " + std::to_string(E) + " experts need too much shared memory");
  if (smem > 48 * 1024)
    cuda::check_cuda(cudaFuncSetAttribute(router_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                     "cudaFuncSetAttribute (router shared memory)");
  return smem;
}

/// The router of T tokens (top-k of E, weights × scale) into ids / weights [T · k] on the device:
/// router_warp_kernel where E <= 1024, else router_kernel (a block a token either way). Checks the limits first.
void launch_router(CudaBackend::Impl& m, const float* logits, const float* bias, int T, int E, int k, float scale,
                   int* ids, float* weights, const char* what) {
  const size_t smem = router_smem(m, E, k);
  // A programmatic dependent launch (Impl::stream_pdl): its blocks are resident when the logits'
  // GEMV ends instead of launching after it.
  const dim3 grid{unsigned(T)}, block{unsigned(kRouterThreads)};
  if (E <= 32 * 8)
    cuda::launch_ex(m, router_warp_kernel<8>, grid, block, 0, 0, m.stream_pdl, what, logits, bias, E, k, scale, ids, weights);
  else if (E <= 32 * 32)
    cuda::launch_ex(m, router_warp_kernel<32>, grid, block, 0, 0, m.stream_pdl, what, logits, bias, E, k, scale, ids, weights);
  else
    cuda::launch_ex(m, router_kernel, grid, block, smem, 0, m.stream_pdl, what, logits, bias, E, k, scale, ids, weights);
  m.launched(what);
}


}  // namespace

void CudaBackend::router_topk(const float* logits, const DenseWeight& bias, int T, int E, int k, int* ids,
                              float* weights) {
  Impl& m = *impl_;
  if (T <= 0) return;
  const size_t n = size_t(T) * k;
  int* dids = static_cast<int*>(m.scratch(m.router_ids, n * sizeof(int)));
  float* dw = static_cast<float*>(m.scratch(m.router_w, n * sizeof(float)));
  launch_router(m, logits, m.dense(bias, "router_topk (bias)"), T, E, k, 1.f, dids, dw, "router kernel");
  if (m.pinned_len < n) {
    if (m.pinned_ids) cuda::check_cuda(cudaFreeHost(m.pinned_ids), "cudaFreeHost");
    if (m.pinned_w) cuda::check_cuda(cudaFreeHost(m.pinned_w), "cudaFreeHost");
    m.pinned_ids = nullptr, m.pinned_w = nullptr, m.pinned_len = 0;
    cuda::check_cuda(cudaHostAlloc(&m.pinned_ids, n * sizeof(int), cudaHostAllocDefault), "cudaHostAlloc (router ids)");
    cuda::check_cuda(cudaHostAlloc(&m.pinned_w, n * sizeof(float), cudaHostAllocDefault), "cudaHostAlloc (router weights)");
    m.pinned_len = n;
  }
  cuda::check_cuda(cudaMemcpyAsync(m.pinned_ids, dids, n * sizeof(int), cudaMemcpyDeviceToHost, m.stream),
                   "cudaMemcpyAsync (router ids)");
  cuda::check_cuda(cudaMemcpyAsync(m.pinned_w, dw, n * sizeof(float), cudaMemcpyDeviceToHost, m.stream),
                   "cudaMemcpyAsync (router weights)");
  m.sync("router_topk");
  std::copy(m.pinned_ids, m.pinned_ids + n, ids);
  std::copy(m.pinned_w, m.pinned_w + n, weights);
}

void CudaBackend::expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) {
  Impl& m = *impl_;
  if (e.w1.rows != e.w3.rows || e.w1.cols != e.w3.cols || e.w2.cols != e.w1.rows)
    throw Error("CUDA backend: expert_ffn: inconsistent expert shapes (" + e.name + ")");
  ++m.stats.expert_calls;
  float* act = static_cast<float*>(m.scratch(m.act, size_t(e.w1.rows) * sizeof(float)));
  MxArgs a{};
  a.p1 = m.bytes(e.w1.packed, "expert_ffn (w1)"), a.s1 = m.bytes(e.w1.scale, "expert_ffn (w1 scale)");
  a.p3 = m.bytes(e.w3.packed, "expert_ffn (w3)"), a.s3 = m.bytes(e.w3.scale, "expert_ffn (w3 scale)");
  a.x = z, a.y = act, a.rows = e.w1.rows, a.cols = e.w1.cols, a.b1 = b1, a.b2 = b2;
  launch_mx<true>(m, a, "expert_ffn gate/up kernel");
  MxArgs d{};
  d.p1 = m.bytes(e.w2.packed, "expert_ffn (w2)"), d.s1 = m.bytes(e.w2.scale, "expert_ffn (w2 scale)");
  d.x = act, d.y = y, d.rows = e.w2.rows, d.cols = e.w2.cols;
  launch_mx<false>(m, d, "expert_ffn down kernel");
}

void CudaBackend::weighted_sum(const float* ys, const float* weights, int m, int n, float* y) {
  if (m < 0 || m > kMaxWeighted)
    throw Error("CUDA backend: weighted_sum: " + std::to_string(m) + " terms (supported: 0.." +
                std::to_string(kMaxWeighted) + ")");
  if (n <= 0) return;
  Weights w{};
  for (int j = 0; j < m; ++j) w.w[j] = weights[j];
  weighted_sum_kernel<<<cuda::grid_for(size_t(n), 256), 256, 0, impl_->stream>>>(ys, w, m, n, y);
  impl_->launched("weighted_sum kernel");
}

}  // namespace wren

// ---- routed experts on the device ----

namespace wren {

cuda::LayerTable& CudaBackend::Impl::table(const MoeWeights& mw, int layer) {
  cuda::LayerTable& t = tables[&mw];
  const int E = int(mw.experts.size());
  const void* first = E ? static_cast<const void*>(mw.experts[0].w1.packed) : nullptr;
  if (t.generation == generation && t.first == first && t.E == E) return t;
  if (capturing)
    throw Error("CUDA backend: routed_moe: layer " + std::to_string(layer) +
                ": expert table rebuilt while a decode graph is being recorded");
  t.generation = generation, t.first = first, t.resident = false;
  if (E == 0 || !first) {  // dense experts (Kimi Linear) are not handled here
    t.E = E;
    return t;
  }
  const ExpertRef& e0 = mw.experts[0];
  const int inter = int(e0.w1.rows), io = int(e0.w1.cols);
  std::vector<cuda::ExpertPtrs> host(E);
  for (int i = 0; i < E; ++i) {
    const ExpertRef& e = mw.experts[i];
    if (e.w1.rows != inter || e.w1.cols != io || e.w3.rows != inter || e.w3.cols != io || e.w2.rows != io ||
        e.w2.cols != inter)
      throw Error("CUDA backend: routed_moe: layer " + std::to_string(layer) + ": expert " + e.name +
                  " has a shape unlike expert 0's");
    const uint8_t* p[6];
    const MxMatrix* mats[3] = {&e.w1, &e.w3, &e.w2};
    for (int k = 0; k < 3; ++k) {
      const size_t packed = size_t(mats[k]->rows) * (mats[k]->cols / 2), scale = size_t(mats[k]->rows) * (mats[k]->cols / 32);
      const auto a = weights.find(mats[k]->packed), b = weights.find(mats[k]->scale);
      if (a == weights.end() || b == weights.end() || a->second.bytes < packed || b->second.bytes < scale) {
        t.E = E;  // not resident: routed_moe declines, the host-routed path runs
        return t;
      }
      p[2 * k] = static_cast<const uint8_t*>(a->second.ptr);
      p[2 * k + 1] = static_cast<const uint8_t*>(b->second.ptr);
    }
    host[i] = {p[0], p[1], p[2], p[3], p[4], p[5]};
  }
  // The host-routed path validates an expert's scales on first use (ExpertSource); here every
  // expert of the layer may be selected on the device, so all are checked once, now.
  for (const ExpertRef& e : mw.experts) validate_expert_scales(e);
  if (t.dev && t.cap < E) {
    cuda::check_cuda(cudaFree(t.dev), "cudaFree (expert table)");
    t.dev = nullptr, t.cap = 0;
  }
  if (!t.dev) {
    cuda::check_cuda(cudaMalloc(&t.dev, size_t(E) * sizeof(cuda::ExpertPtrs)), "cudaMalloc (expert table)");
    t.cap = E;
  }
  cuda::check_cuda(cudaMemcpyAsync(t.dev, host.data(), size_t(E) * sizeof(cuda::ExpertPtrs), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (expert table)");
  sync("expert table");  // `host` is pageable and about to go away
  t.E = E, t.inter = inter, t.io = io, t.resident = true;
  return t;
}

bool CudaBackend::routed_moe_on_device(const RoutedMoeParams& p, const MoeWeights& m) {
  if (impl_->tier.active) return false;  // experts stream: the ids must come to the host
  // Dense experts: on the device only through the grouped fast path (no host sync); this builds
  // their BF16 table now, before any recording.
  if (!m.experts.empty() && !m.experts[0].w1.packed) return cuda::grouped_moe_ok(*impl_, p, m, 1, false);
  const cuda::LayerTable& t = impl_->table(m, p.layer);
  return t.resident && t.io == p.io && t.E == p.n_experts;
}

/// routed_moe through the VRAM tier: route on the device, ids to the host (one sync), then token
/// groups whose distinct experts fit the slots: make them resident (copies on the tier's streams,
/// ordered by events), run all their pairs. A pending guess (prefetch_experts) is copied into
/// slots once the kernels are queued, so those copies overlap this layer's compute; a guess for
/// this very layer goes first. `src`: where misses and guesses are read (ExpertTier::source()).
static void tier_routed_moe(CudaBackend::Impl& m, const RoutedMoeParams& p, const MoeWeights& mw, const float* logits,
                     const float* z, int T, float* ys, float* out, ExpertSource* src) {
  cuda::ExpertTier& tier = m.tier;
  const int k = p.top_k, pairs = T * k;
  if (tier.io != p.io)
    throw Error("CUDA backend: routed_moe: layer " + std::to_string(p.layer) + ": expert width " +
                std::to_string(tier.io) + ", expected " + std::to_string(p.io));
  ++m.stats.routed_moe_calls;
  int* dids = static_cast<int*>(m.scratch(m.router_ids, size_t(pairs) * sizeof(int)));
  float* dw = static_cast<float*>(m.scratch(m.router_w, size_t(pairs) * sizeof(float)));
  launch_router(m, logits, m.dense(mw.bias, "routed_moe (router bias)"), T, p.n_experts, k, p.routed_scale, dids, dw,
                "routed_moe router kernel");
  std::vector<int> ids(pairs);
  cuda::check_cuda(cudaMemcpyAsync(ids.data(), dids, size_t(pairs) * sizeof(int), cudaMemcpyDeviceToHost, m.stream),
                   "cudaMemcpyAsync (routed ids)");
  m.sync("routed_moe (ids for the VRAM tier)");
  m.tier_begin_call(pairs);
  if (tier.pending_layer == p.layer) m.tier_prefetch(src);  // a guess for this layer: before its demand
  // Recall of the guess for this layer: over the call's distinct experts.
  std::vector<char> in(size_t(p.n_experts), 0);
  int distinct = 0;
  for (int e : ids) distinct += in[e] ? 0 : (in[e] = 1);
  if (tier.guess_layer == p.layer) {
    tier.guess_layer = -1;
    m.stats.tier_guess_needed += uint64_t(distinct);
    for (int e : tier.guess_ids)
      if (e >= 0 && e < p.n_experts && in[e]) ++m.stats.tier_guess_hit;
  }
  tier.last_distinct = std::min(distinct, tier.n_slots);
  float* act = static_cast<float*>(m.scratch(m.act, size_t(pairs) * tier.inter * sizeof(float)));
  for (int t0 = 0; t0 < T;) {
    // The longest run of tokens whose distinct experts fit the slots (one token always must).
    std::fill(in.begin(), in.end(), 0);
    int gdistinct = 0, t1 = t0;
    while (t1 < T) {
      int add = 0;
      for (int j = 0; j < k; ++j) {
        const int e = ids[size_t(t1) * k + j];
        bool dup = in[e] != 0;
        for (int i = 0; i < j && !dup; ++i) dup = ids[size_t(t1) * k + i] == e;
        add += !dup;
      }
      if (t1 > t0 && gdistinct + add > tier.n_slots) break;
      for (int j = 0; j < k; ++j) in[ids[size_t(t1) * k + j]] = 1;
      gdistinct += add;
      ++t1;
    }
    const int gp = (t1 - t0) * k;
    const cuda::ExpertPtrs* table = m.tier_prepare(p.layer, ids.data() + size_t(t0) * k, gp, t0 * k, src);
    launch_mx_batch<true>(m, MxBatchArgs{table, nullptr, z + size_t(t0) * tier.io, act, k, tier.inter, tier.io, p.b1, p.b2},
                          gp, "routed_moe gate/up kernel");
    launch_mx_batch<false>(m, MxBatchArgs{table, nullptr, act, ys + size_t(t0) * k * tier.io, 1, tier.io, tier.inter, 0.f, 0.f},
                           gp, "routed_moe down kernel");
    m.tier_mark_read();
    t0 = t1;
  }
  cuda::launch_slot_sum(m, ys, dw, k, tier.io, T, out);
  if (tier.pending_layer >= 0) m.tier_prefetch(src);  // the next layer's guess, while these kernels run
}

void CudaBackend::routed_moe(const RoutedMoeParams& p, const MoeWeights& mw, const float* logits, const float* z,
                             int T, const RoutedMoeWork& ws, float* out) {
  Impl& m = *impl_;
  if (T <= 0) return;
  const int k = p.top_k, pairs = T * k;
  const std::string layer = "routed_moe layer " + std::to_string(p.layer);
  // The host-routed reference (Backend::host_routed_moe through this backend's ops) where the
  // device path cannot run: counted, logged once, an error under --strict.
  auto host_routed = [&](const char* why) {
    note_fallback(layer + " routed on the host: " + why);
    ++m.stats.host_routed_moe_calls;
    host_routed_moe(p, mw, logits, z, T, ws, out);
  };
  // Dense experts: on the device only in fast mode (moe_grouped.cu, one grouped product per matrix);
  // in exact mode, or where the grouped path cannot take the layer, the host-routed f32 path runs.
  const bool dense = p.format != ExpertFormat::MXFP4;
  if (dense && !cuda::grouped_moe_ok(m, p, mw, T, false))
    return host_routed("dense experts are chosen on the host (exact mode, or the grouped fast path cannot take them)");
  const char* too_many = "more than 65535 (token, slot) pairs in one chunk (grid limit)";
  if (!dense && m.tier.active) {
    if (pairs > 65535) return host_routed(too_many);
    tier_routed_moe(m, p, mw, logits, z, T, ws.ys, out, m.tier.source(expert_source()));
    return;
  }
  const cuda::LayerTable* tp = dense ? nullptr : &m.table(mw, p.layer);
  if (!dense && (!tp->resident || tp->io != p.io || tp->E != p.n_experts))
    return host_routed("not every expert of the layer has a device copy");
  // Fast mode: one grouped tensor-core GEMM per expert matrix (moe_grouped.cu).
  const bool grouped = dense || cuda::grouped_moe_ok(m, p, mw, T, true);
  if (pairs > 65535 && !grouped) return host_routed(too_many);
  ++m.stats.routed_moe_calls;
  float* ys = ws.ys;
  int* dids = static_cast<int*>(m.scratch(m.router_ids, size_t(pairs) * sizeof(int)));
  float* dw = static_cast<float*>(m.scratch(m.router_w, size_t(pairs) * sizeof(float)));
  launch_router(m, logits, m.dense(mw.bias, "routed_moe (router bias)"), T, p.n_experts, k, p.routed_scale, dids, dw,
                "routed_moe router kernel");
  if (grouped && cuda::grouped_moe(m, p, mw, dense ? nullptr : tp->dev, dids, dw, z, T, ys, out)) return;
  if (dense) throw Error("CUDA backend: " + layer + ": the grouped dense-expert path declined after routing");
  const cuda::LayerTable& t = *tp;
  if (cuda::moe_decode_ok(m, T, t.io, t.inter, z, true)) {  // fast mode, one token: tensor-core GEMVs (moe_decode.cu)
    cuda::moe_decode(m, t.dev, dids, dw, z, k, t.io, t.inter, p.b1, p.b2, ys, out);
    return;
  }
  float* act = static_cast<float*>(m.scratch(m.act, size_t(pairs) * t.inter * sizeof(float)));
  launch_mx_batch<true>(m, MxBatchArgs{t.dev, dids, z, act, k, t.inter, t.io, p.b1, p.b2}, pairs,
                        "routed_moe gate/up kernel");
  launch_mx_batch<false>(m, MxBatchArgs{t.dev, dids, act, ys, 1, t.io, t.inter, 0.f, 0.f}, pairs,
                         "routed_moe down kernel");
  cuda::launch_slot_sum(m, ys, dw, k, t.io, T, out);
}

}  // namespace wren
