// CUDA backend, fast precision mode: dense GEMMs for T >= 2 on tensor cores through cuBLASLt.
// y[T, rows] = x[T, cols] · Wᵀ with W BF16 on the device, x converted to BF16 per call, f32
// accumulation and f32 output (cuBLASLt: A = W, op T; B = x, op N; C = D = y, column-major views of
// the row-major buffers, i.e. m = rows, n = T, k = cols, the "TN" layout).
//
// BF16 weights: a BF16 dense weight is used as stored; an f32 one is converted once (round to
// nearest even) from its device copy into a cached BF16 buffer, keyed by the device pointer and
// dropped when an upload bumps the backend's generation (a refreshed weight is re-converted).
//
// Chunk invariance: cuBLASLt's heuristic may pick a different kernel (tile, split-K) for another
// n = T, which would change the summation order. The algorithm is therefore chosen once per
// weight shape (rows, cols) at a reference n (kRefN), preferring one without split-K, and reused
// for every T it supports (cublasLtMatmulAlgoCheck); a tile's k-loop order does not depend on n,
// so a token's outputs do not depend on how many tokens share the chunk. Only when that
// algorithm rejects a T is the heuristic asked again for that T (counted in lt_fallback_algos).
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <vector>
#include <string>
#include <tuple>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/gemm_quant.cuh"
#include "backends/cuda/lt_state.cuh"

namespace wren::cuda {

constexpr int kRefN = 1024;
constexpr size_t kWorkspace = size_t(32) << 20;

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(std::string("CUDA backend: cuBLASLt: ") + what + ": status " + std::to_string(int(s)));
}

namespace {
__global__ void f32_to_bf16_kernel(const float* __restrict__ x, size_t n, __nv_bfloat16* __restrict__ y) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}
/// The same conversion 4 elements at a time (16-byte loads, 8-byte stores; x 16-, y 8-byte
/// aligned): element for element the scalar kernel's rounding, so the same bits.
__global__ void f32_to_bf16_x4_kernel(const float4* __restrict__ x, size_t n4, uint2* __restrict__ y) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    y[i] = make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
}
}  // namespace

/// One cuBLASLt matmul's operation descriptor and A/B/C layouts (RAII, created per call: a few µs
/// of host work), for the dense GEMM and for lt_product alike. cuBLASLt is column-major: for the
/// row-major LtProduct g it computes Cᵀ[N, M] = op(B)[N, K] · Aᵀ[K, M], i.e. m = N, n = M, k = K,
/// cuBLASLt's "A" being our B and its "B" our A.
struct LtDesc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  /// g at M rows of A (g.M is not read: the algorithm is picked at a reference M).
  LtDesc(const LtProduct& g, int M) {
    check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = g.b_nk ? CUBLAS_OP_T : CUBLAS_OP_N, nn = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)), "set TRANSB");
    // "A" of cuBLASLt = our B: stored [N, K] row-major = col-major [K, N] (op T), or [K, N] = col-major [N, K].
    if (g.b_nk) check_lt(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, g.K, g.N, g.ldb), "layout A");
    else check_lt(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, g.N, g.K, g.ldb), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, g.K, M, g.lda), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&c, g.c_bf16 ? CUDA_R_16BF : CUDA_R_32F, g.N, M, g.ldc), "layout C");
    if (g.batch > 1) {
      const int32_t n = g.batch;
      const int64_t sa = g.sB, sb = g.sA, sc = g.sC;
      for (auto [l, s] : {std::pair{a, sa}, std::pair{b, sb}, std::pair{c, sc}}) {
        check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)), "batch count");
        check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof(s)),
                 "batch stride");
      }
    }
  }
  /// The dense GEMM y[n, rows] = x[n, cols] · Wᵀ (W [rows, cols] BF16 row-major, x BF16, y f32): the
  /// product M = n, N = rows, K = cols with B = W stored [N, K] (cuBLASLt's "TN" layout).
  LtDesc(int rows, int cols, int n) : LtDesc(dense_product(rows, cols), n) {}
  ~LtDesc() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
  LtDesc(const LtDesc&) = delete;
  LtDesc& operator=(const LtDesc&) = delete;

 private:
  static LtProduct dense_product(int rows, int cols) {
    LtProduct g;
    g.N = rows, g.K = cols, g.lda = cols, g.ldb = cols, g.ldc = rows;  // b_nk, f32 C, batch 1: the defaults
    return g;
  }
};

/// The heuristic's choice for the shape of d, preferring an algorithm without split-K (false: none).
bool pick_algo(LtState& s, const LtDesc& d, cublasLtMatmulAlgo_t* out) {
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = kWorkspace;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t res[8] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.handle, d.op, d.a, d.b, d.c, d.c, pref, 8, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    int splitk = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written);
    if (splitk <= 1) {
      *out = res[i].algo;
      return true;
    }
  }
  *out = res[0].algo;  // every candidate splits k: take the best one (still fixed per shape)
  return true;
}

LtState& lt_state(CudaBackend::Impl& m) {
  if (!m.lt) {
    auto* s = new LtState();
    try {
      check_lt(cublasLtCreate(&s->handle), "cublasLtCreate");
      check_cuda(cudaMalloc(&s->workspace, kWorkspace), "cudaMalloc (cuBLASLt workspace)");
    } catch (...) {
      if (s->handle) cublasLtDestroy(s->handle);
      delete s;
      throw;
    }
    m.lt = s;
  }
  LtState& s = *m.lt;
  if (s.generation != m.generation) {  // an upload may have refreshed weights: drop derived copies
    if (s.generation != 0) {
      m.sync("fast-mode weight cache reset");
      for (auto& [k, v] : s.bf16) cudaFree(v);
      s.bf16.clear();
      s.clear_tables();
    }
    s.generation = m.generation;
  }
  return s;
}

void LtState::clear_tables() {
  for (auto& [k, t] : dense_tables)
    if (t.dev) cudaFree(t.dev);
  dense_tables.clear();
}

void lt_destroy(CudaBackend::Impl& m) {
  if (!m.lt) return;
  LtState* s = m.lt;
  for (auto& [k, v] : s->bf16) cudaFree(v);
  s->clear_tables();
  for (Scratch* b : {&s->xb, &s->sort, &s->act})
    if (b->ptr) cudaFree(b->ptr);
  for (Scratch& b : s->mla)
    if (b.ptr) cudaFree(b.ptr);
  if (s->workspace) cudaFree(s->workspace);
  if (s->handle) cublasLtDestroy(s->handle);
  delete s;
  m.lt = nullptr;
}

void launch_f32_to_bf16(const float* x, size_t n, uint16_t* y, cudaStream_t stream) {
  if (n >= 4 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0) {
    const size_t n4 = n / 4;
    f32_to_bf16_x4_kernel<<<grid_for(n4, 256), 256, 0, stream>>>(reinterpret_cast<const float4*>(x), n4,
                                                                 reinterpret_cast<uint2*>(y));
    if (n4 * 4 == n) return;
    x += n4 * 4, y += n4 * 4, n -= n4 * 4;
  }
  f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, reinterpret_cast<__nv_bfloat16*>(y));
}

const uint16_t* bf16_weight(CudaBackend::Impl& m, const DenseWeight& W, const char* op) {
  if (W.format == WFormat::BF16) return static_cast<const uint16_t*>(quant_view(m, W, op).data);
  if (W.format != WFormat::F32) return nullptr;
  const float* dw = m.dense(W, op);
  LtState& s = lt_state(m);
  if (const auto it = s.bf16.find(dw); it != s.bf16.end()) return it->second;
  if (m.capturing) throw Error(std::string("CUDA backend: ") + op + ": BF16 weight copy made while a graph is recorded");
  const size_t n = size_t(W.rows) * size_t(W.cols);
  uint16_t* b = nullptr;
  check_cuda(cudaMalloc(&b, n * sizeof(uint16_t)), ("cudaMalloc of a " + std::to_string(n * 2) + "-byte BF16 weight copy").c_str());
  launch_f32_to_bf16(dw, n, b, m.stream);
  m.launched("f32 -> bf16 weight conversion");
  s.bf16[dw] = b;
  m.stats.bf16_weight_bytes += n * sizeof(uint16_t);
  return b;
}

bool lt_gemm(CudaBackend::Impl& m, const DenseWeight& W, const float* x, int T, float* y, bool x_ready) {
  if (m.opts.precision != GpuPrecision::Fast || T < 2) return false;
  if (W.format != WFormat::F32 && W.format != WFormat::BF16) return false;
  const int rows = int(W.rows), cols = int(W.cols);
  if (cols % 8 != 0 || rows % 4 != 0) return false;  // cuBLASLt's 16-byte alignment of BF16 rows
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % 16 != 0) return false;  // ditto, buffers
  const uint16_t* wb = bf16_weight(m, W, "gemm (fast)");
  LtState& s = lt_state(m);
  uint16_t* xb = static_cast<uint16_t*>(m.scratch(s.xb, size_t(T) * cols * sizeof(uint16_t)));
  if (!x_ready) {
    launch_f32_to_bf16(x, size_t(T) * cols, xb, m.stream);
    m.launched("gemm (fast) activation conversion");
  }
  LtDesc d(rows, cols, T);
  const auto key = std::make_pair(rows, cols);
  auto it = s.algos.find(key);
  if (it == s.algos.end()) {
    LtDesc ref(rows, cols, kRefN);
    cublasLtMatmulAlgo_t algo{};
    if (!pick_algo(s, ref, &algo)) throw DeviceError("CUDA backend: cuBLASLt: no BF16 GEMM algorithm for [" +
                                                     std::to_string(rows) + ", " + std::to_string(cols) + "]");
    it = s.algos.emplace(key, algo).first;
  }
  cublasLtMatmulAlgo_t algo = it->second;
  cublasLtMatmulHeuristicResult_t chk{};
  if (cublasLtMatmulAlgoCheck(s.handle, d.op, d.a, d.b, d.c, d.c, &algo, &chk) != CUBLAS_STATUS_SUCCESS ||
      chk.workspaceSize > kWorkspace) {
    if (!pick_algo(s, d, &algo)) throw DeviceError("CUDA backend: cuBLASLt: no BF16 GEMM algorithm for T = " + std::to_string(T));
    ++s.fallback_algos;
  }
  const float alpha = 1.f, beta = 0.f;
  check_lt(cublasLtMatmul(s.handle, d.op, &alpha, wb, d.a, xb, d.b, &beta, y, d.c, y, d.c, &algo, s.workspace,
                          kWorkspace, m.stream),
           "cublasLtMatmul");
  ++m.stats.lt_gemms;
  if (m.profiling) m.launched(("gemm (fast, cuBLASLt) " + std::to_string(rows) + "x" + std::to_string(cols)).c_str());
  else m.launched("gemm (fast, cuBLASLt)");
  return true;
}

uint16_t* bf16_scratch(CudaBackend::Impl& m, Scratch& s, size_t n) {
  return static_cast<uint16_t*>(m.scratch(s, n * sizeof(uint16_t)));
}

const char* lt_tag_name(int tag) {
  switch (tag) {
    case 1: return "mla q_abs";
    case 2: return "mla scores";
    case 3: return "mla P.cache";
    case 4: return "mla context out";
    case 5: return "mla kv expand";
    case 10: return "moe MXFP4 gate+up";
    case 11: return "moe down";
    case 12: return "moe dense gate/up";
    default: return "other";
  }
}

void lt_product(CudaBackend::Impl& m, const LtProduct& g, int tag) {
  if (g.M <= 0 || g.N <= 0 || g.K <= 0) return;
  LtState& s = lt_state(m);
  LtDesc d(g, g.M);
  // Shape class: the dimension that grows with the context (scores' N, the P·V product's K) and the
  // batch are left out, so one algorithm serves every chunk of a prompt.
  const auto key = std::make_tuple(tag, tag == 2 ? 0 : g.N, tag == 3 ? 0 : g.K, 0);
  auto it = s.product_algos.find(key);
  if (it == s.product_algos.end()) {
    LtDesc ref(g, kRefN);
    cublasLtMatmulAlgo_t algo{};
    if (!pick_algo(s, ref, &algo))
      throw DeviceError("CUDA backend: cuBLASLt: no algorithm for a batched BF16 product (tag " + std::to_string(tag) + ")");
    it = s.product_algos.emplace(key, algo).first;
  }
  cublasLtMatmulAlgo_t algo = it->second;
  const float beta = 0.f;
  // The first call of a shape class checks the algorithm (cublasLtMatmulAlgoCheck); later calls
  // (the per-expert products: thousands a layer) just run it and re-pick only if it is refused.
  if (!s.product_checked.count(key)) {
    cublasLtMatmulHeuristicResult_t chk{};
    if (cublasLtMatmulAlgoCheck(s.handle, d.op, d.a, d.b, d.c, d.c, &algo, &chk) != CUBLAS_STATUS_SUCCESS ||
        chk.workspaceSize > kWorkspace) {
      if (!pick_algo(s, d, &algo))
        throw DeviceError("CUDA backend: cuBLASLt: no algorithm for a batched BF16 product (tag " + std::to_string(tag) + ")");
      ++s.fallback_algos;
    } else {
      s.product_checked.insert(key);
    }
  }
  cublasStatus_t st = cublasLtMatmul(s.handle, d.op, &g.alpha, g.B, d.a, g.A, d.b, &beta, g.C, d.c, g.C, d.c, &algo,
                                     s.workspace, kWorkspace, m.stream);
  if (st != CUBLAS_STATUS_SUCCESS && pick_algo(s, d, &algo)) {
    ++s.fallback_algos;
    st = cublasLtMatmul(s.handle, d.op, &g.alpha, g.B, d.a, g.A, d.b, &beta, g.C, d.c, g.C, d.c, &algo, s.workspace,
                        kWorkspace, m.stream);
  }
  check_lt(st, "cublasLtMatmul (batched product)");
  ++m.stats.lt_gemms;
  if (m.profiling) m.launched(("cuBLASLt product, tag " + std::to_string(tag) + " (" + lt_tag_name(tag) + ")").c_str());
  else m.launched("cuBLASLt product");
}

}  // namespace wren::cuda

namespace wren {

namespace {
__global__ void random_bf16_kernel(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16_rn(float(h & 0xFFFF) / 65536.f - 0.5f);
  }
}
}  // namespace

double CudaBackend::bf16_peak_tflops(int n) {
  Impl& m = *impl_;
  cuda::LtState& s = cuda::lt_state(m);
  const size_t nn = size_t(n) * n;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cuda::check_cuda(cudaMalloc(&a, nn * 2), "cudaMalloc (peak A)");
  cuda::check_cuda(cudaMalloc(&b, nn * 2), "cudaMalloc (peak B)");
  cuda::check_cuda(cudaMalloc(&c, nn * 4), "cudaMalloc (peak C)");
  random_bf16_kernel<<<1024, 256, 0, m.stream>>>(static_cast<__nv_bfloat16*>(a), nn, 1u);
  random_bf16_kernel<<<1024, 256, 0, m.stream>>>(static_cast<__nv_bfloat16*>(b), nn, 2u);
  cuda::check_cuda(cudaGetLastError(), "random_bf16_kernel");
  cuda::LtDesc d(n, n, n);
  cublasLtMatmulAlgo_t algo{};
  if (!cuda::pick_algo(s, d, &algo)) throw DeviceError("CUDA backend: cuBLASLt: no algorithm for the peak GEMM");
  cudaEvent_t e0, e1;
  cuda::check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
  cuda::check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
  const float alpha = 1.f, beta = 0.f;
  std::vector<float> ms;
  for (int r = 0; r < 13; ++r) {
    cudaEventRecord(e0, m.stream);
    cuda::check_lt(cublasLtMatmul(s.handle, d.op, &alpha, a, d.a, b, d.b, &beta, c, d.c, c, d.c, &algo, s.workspace,
                                  cuda::kWorkspace, m.stream), "cublasLtMatmul (peak)");
    cudaEventRecord(e1, m.stream);
    cuda::check_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (r >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaFree(a), cudaFree(b), cudaFree(c);
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(n) * n * n / (double(ms[ms.size() / 2]) * 1e-3) / 1e12;
}

}  // namespace wren
