// Dense GEMV/GEMM on Q8_ROW weights: y[t, r] = scale[r] · Σ_c q[r, c] · x[t, c] (see kernels.h).
// Layout: q [rows, cols] int8 row-major, scale [rows] f32 (ops/weights.h); x [T, cols] f32;
// y[t·ldy + r]. The int8 weights widen exactly to f32; the row scale is applied once at the end.
#include "backends/cpu/kernels.h"
#include "backends/cpu/simd.h"

namespace wren::cpu {

namespace {
const int8_t* q8_data(const DenseWeight& W) { return static_cast<const int8_t*>(W.data); }
}  // namespace

void rows_q8_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const int8_t* q = q8_data(W);
  const int cols = int(W.cols);
  for (int t = 0; t < T; ++t)
    for (int r = r0; r < r1; ++r) {
      const int8_t* qr = q + size_t(r) * cols;
      const float* xt = x + size_t(t) * cols;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int c = 0; c < cols; ++c) acc[c & 7] += float(qr[c]) * xt[c];
      const float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      y[size_t(t) * ldy + r] = s * W.scale[r];
    }
}

#if WREN_X86
namespace {

struct Q8Avx512 {
  const int8_t* q;
  const float* scale;
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
        if ((c & 63) == 0) prefetch_ahead(q + size_t(r + i) * cols + c, size_t(R) * cols);
        wv[i] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + size_t(r + i) * cols + c)));
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
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]) * scale[r + i];
  }
};

struct Q8Avx2 {
  const int8_t* q;
  const float* scale;
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
        if ((c & 63) == 0) prefetch_ahead(q + size_t(r + i) * cols + c, size_t(R) * cols);
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + size_t(r + i) * cols + c));
        wv[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
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
        for (int cc = c; cc < cols; ++cc) s += float(q[size_t(r + i) * cols + cc]) * x[size_t(t + j) * cols + cc];
        y[size_t(t + j) * ldy + r + i] = s * scale[r + i];
      }
  }
};

}  // namespace

void rows_q8_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 4>(Q8Avx512{q8_data(W), W.scale, x, y, int(W.cols), ldy}, T, r0, r1);
}

void rows_q8_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(Q8Avx2{q8_data(W), W.scale, x, y, int(W.cols), ldy}, T, r0, r1);
}
#endif

}  // namespace wren::cpu
