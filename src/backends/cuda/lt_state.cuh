// Fast precision mode state of the CUDA backend (gemm_lt.cu, moe_grouped.cu): the cuBLASLt handle
// and workspace, the BF16 copies of f32 weights, the per-shape GEMM algorithms, the grouped-MoE
// expert tables of dense experts, and their scratch. Private to src/backends/cuda/*.cu.
#pragma once
#include <cublasLt.h>

#include <map>
#include <set>
#include <vector>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "backends/cuda/cuda_common.cuh"

namespace wren::cuda {

/// One dense expert's BF16 matrices on the device: w1 (gate) and w3 (up) [inter, io], w2 (down)
/// [io, inter], row-major.
struct DenseExpertPtrs {
  const uint16_t *w1, *w3, *w2;
};

/// The device table of one layer's dense experts (built at first use, dropped with the BF16
/// copies when an upload bumps the generation).
struct DenseTable {
  DenseExpertPtrs* dev = nullptr;
  const void* first = nullptr;  ///< expert 0's host w1 when built (identity check: lesson 11)
  std::vector<DenseExpertPtrs> host;  ///< the same table in host memory (per-expert products)
  int E = 0, inter = 0, io = 0;
  bool aligned16 = false;  ///< every matrix starts 16-byte aligned (moe_decode_dense's loads)
};

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  uint64_t generation = 0;  ///< Impl::generation the derived copies belong to
  std::unordered_map<const void*, uint16_t*> bf16;  ///< device f32 weight -> its BF16 copy (owned)
  std::map<std::pair<int, int>, cublasLtMatmulAlgo_t> algos;  ///< (rows, cols) -> fixed algorithm
  std::map<std::tuple<int, int, int, int>, cublasLtMatmulAlgo_t> product_algos;  ///< lt_product's
  std::set<std::tuple<int, int, int, int>> product_checked;  ///< keys whose algorithm ran once
  uint64_t fallback_algos = 0;  ///< calls whose T the fixed algorithm rejected
  std::unordered_map<const MoeWeights*, DenseTable> dense_tables;
  Scratch xb;    ///< BF16 activations of one GEMM
  Scratch sort;  ///< grouped MoE: pair order, expert bases, tile list
  Scratch act;   ///< grouped MoE: BF16 GLU activations [pairs, inter] in expert order
  Scratch mla[6];  ///< fast MLA prefill: q BF16, q_cat f32/BF16, cache BF16, scores (flash: expanded kv), probabilities (flash: Vᵀ), context
  void clear_tables();
};

/// One row-major (batched) product on tensor cores: C[M, N] = A[M, K] · B', B' = Bᵀ when B is
/// stored [N, K] (b_nk) else B stored [K, N]; A, B BF16; C f32 or BF16 (c_bf16); f32 accumulation.
/// ld* are row strides in elements, s* batch strides (0 = shared by every batch).
struct LtProduct {
  int M = 0, N = 0, K = 0, batch = 1;
  const void* A = nullptr;
  const void* B = nullptr;
  void* C = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0, sA = 0, sB = 0, sC = 0;
  bool b_nk = true, c_bf16 = false;
  float alpha = 1.f;
};
/// Runs `g` on the compute stream with an algorithm fixed per (tag, N, K, batch) shape class at a
/// reference M (no split-K preferred), so results do not depend on M (see gemm_lt.cu).
void lt_product(CudaBackend::Impl& m, const LtProduct& g, int tag);
/// Scratch of `s` as a BF16 array of n elements.
uint16_t* bf16_scratch(CudaBackend::Impl& m, Scratch& s, size_t n);

/// The fast-mode state (created on first use; derived copies reset after an upload).
LtState& lt_state(CudaBackend::Impl& m);
/// y[i] = bf16(x[i]) (round to nearest even) for i < n, on `stream`.
void launch_f32_to_bf16(const float* x, size_t n, uint16_t* y, cudaStream_t stream);

}  // namespace wren::cuda
