// Dense GEMV/GEMM on F32 weights: y[t, r] = W[r] · x[t] (see kernels.h for the contract).
// Layout: W [rows, cols] f32 row-major; x [T, cols]; y[t·ldy + r]. SIMD kernels are the shared
// skeleton (gemv.h) with one vector accumulator per (row, token), the column tail by masked
// loads; scalar is cpu::dot (reference).
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels.h"

namespace wren::cpu {

void rows_f32_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const float* w = W.f32();
  const int cols = int(W.cols);
  for (int t = 0; t < T; ++t)
    for (int r = r0; r < r1; ++r) y[size_t(t) * ldy + r] = dot(w + size_t(r) * cols, x + size_t(t) * cols, cols);
}

#if WREN_X86
namespace {

/// F32 elements for ElemAvx512 / ElemAvx2: loaded as they are, no prefetch, masked vector tail.
struct F32Elem {
  using E = float;
  static constexpr bool kScaled = false, kVectorTail = true;
  static float value(float v) { return v; }
  static void prefetch(const float*, int, size_t) {}
  WREN_AVX512 static __m512 widen16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  WREN_AVX2 static __m256 widen8(const float* p) { return _mm256_loadu_ps(p); }
  WREN_AVX2 static __m256 widen8_masked(const float* p, __m256i m) { return _mm256_maskload_ps(p, m); }
};

}  // namespace

void rows_f32_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_avx512<F32Elem>(W, x, T, y, ldy, r0, r1);
}

void rows_f32_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_avx2<F32Elem>(W, x, T, y, ldy, r0, r1);
}
#endif

}  // namespace wren::cpu
