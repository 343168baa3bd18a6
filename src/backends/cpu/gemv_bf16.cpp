// Dense GEMV/GEMM on BF16 weights: y[t, r] = W[r] · x[t] (see kernels.h for the contract).
// Layout: W [rows, cols] uint16 row-major, each the top half of an f32 (widened exactly by a
// 16-bit shift); x [T, cols] f32; y[t·ldy + r]. Products and sums in f32.
#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/simd.h"
#include "core/dtype.h"

namespace wren::cpu {

namespace {
const uint16_t* bf16_data(const DenseWeight& W) { return static_cast<const uint16_t*>(W.data); }
}  // namespace

void rows_bf16_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const uint16_t* w = bf16_data(W);
  const int cols = int(W.cols);
  for (int t = 0; t < T; ++t)
    for (int r = r0; r < r1; ++r) {
      const uint16_t* wr = w + size_t(r) * cols;
      const float* xt = x + size_t(t) * cols;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int c = 0; c < cols; ++c) acc[c & 7] += bf16_to_f32(wr[c]) * xt[c];
      y[size_t(t) * ldy + r] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
}

#if WREN_X86
namespace {

struct Bf16Avx512 {
  const uint16_t* w;
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
      for (int i = 0; i < R; ++i) {
        if ((c & 31) == 0) prefetch_ahead(w + size_t(r + i) * cols + c, size_t(R) * cols * 2);
        const __m256i h = _mm256_maskz_loadu_epi16(m, w + size_t(r + i) * cols + c);
        wv[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
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

struct Bf16Avx2 {
  const uint16_t* w;
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
      for (int i = 0; i < R; ++i) {
        if ((c & 31) == 0) prefetch_ahead(w + size_t(r + i) * cols + c, size_t(R) * cols * 2);
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + size_t(r + i) * cols + c));
        wv[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      }
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        const __m256 xv = _mm256_loadu_ps(x + size_t(t + j) * cols + c);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
      }
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        float s = hsum(acc[i][j]);
        for (int cc = c; cc < cols; ++cc) s += bf16_to_f32(w[size_t(r + i) * cols + cc]) * x[size_t(t + j) * cols + cc];
        y[size_t(t + j) * ldy + r + i] = s;
      }
  }
};

}  // namespace

void rows_bf16_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 4>(Bf16Avx512{bf16_data(W), x, y, int(W.cols), ldy}, T, r0, r1);
}

void rows_bf16_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(Bf16Avx2{bf16_data(W), x, y, int(W.cols), ldy}, T, r0, r1);
}
#endif

}  // namespace wren::cpu
