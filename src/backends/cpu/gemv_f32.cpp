// Dense GEMV/GEMM on F32 weights: y[t, r] = W[r] · x[t] (see kernels.h for the contract).
// Layout: W [rows, cols] f32 row-major; x [T, cols]; y[t·ldy + r]. SIMD kernels keep one vector
// accumulator per (row, token), the column tail by masked loads; scalar is cpu::dot (reference).
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/simd.h"

namespace wren::cpu {

void rows_f32_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const float* w = W.f32();
  const int cols = int(W.cols);
  for (int t = 0; t < T; ++t)
    for (int r = r0; r < r1; ++r) y[size_t(t) * ldy + r] = dot(w + size_t(r) * cols, x + size_t(t) * cols, cols);
}

#if WREN_X86
namespace {

struct F32Avx512 {
  const float* w;
  const float* x;
  float* y;
  int cols, ldy;

  template <int R, int N>
  WREN_AVX512 void block(int r, int t) const {
    __m512 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int c = 0; c < cols; c += 16) {
      const __mmask16 m = cols - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (cols - c)) - 1);
      __m512 wv[R];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) wv[i] = _mm512_maskz_loadu_ps(m, w + size_t(r + i) * cols + c);
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + size_t(t + j) * cols + c);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
      }
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]);
  }
};

/// Lane mask for the first n (< 8) lanes of an AVX2 masked load.
WREN_AVX2 inline __m256i tail_mask8(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

struct F32Avx2 {
  const float* w;
  const float* x;
  float* y;
  int cols, ldy;

  template <int R, int N>
  WREN_AVX2 void block(int r, int t) const {
    __m256 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= cols; c += 8) {
      __m256 wv[R];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) wv[i] = _mm256_loadu_ps(w + size_t(r + i) * cols + c);
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        const __m256 xv = _mm256_loadu_ps(x + size_t(t + j) * cols + c);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
      }
    }
    if (c < cols) {
      const __m256i m = tail_mask8(cols - c);
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        const __m256 wv = _mm256_maskload_ps(w + size_t(r + i) * cols + c, m);
        WREN_UNROLL
        for (int j = 0; j < N; ++j)
          acc[i][j] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(x + size_t(t + j) * cols + c, m), acc[i][j]);
      }
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]);
  }
};

}  // namespace

void rows_f32_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 4>(F32Avx512{W.f32(), x, y, int(W.cols), ldy}, T, r0, r1);
}

void rows_f32_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(F32Avx2{W.f32(), x, y, int(W.cols), ldy}, T, r0, r1);
}
#endif

}  // namespace wren::cpu
