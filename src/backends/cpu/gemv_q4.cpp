// Dense GEMV/GEMM on Q4_G64 weights: y[t, r] = Σ_g scale[r, g] · Σ_{c in g} q[r, c] · x[t, c]
// (see kernels.h). Layout (ops/weights.h): per row ceil(cols/64) groups of 32 bytes; byte j of
// a group holds column j (low nibble) and column j + 32 (high nibble) as q + 8; scale
// [rows, groups] f32; a last partial group is zero-padded. x [T, cols] f32; y[t·ldy + r].
// The nibble halves of a group are 32 consecutive columns each, so a kernel splits a group with
// one mask and one shift and never interleaves.
#include "backends/cpu/kernels.h"
#include "backends/cpu/simd.h"

namespace wren::cpu {

namespace {
const uint8_t* q4_data(const DenseWeight& W) { return static_cast<const uint8_t*>(W.data); }

/// q of column j (0..63) of one packed group.
inline int q4_at(const uint8_t* grp, int j) { return (j < 32 ? (grp[j] & 0xF) : (grp[j - 32] >> 4)) - 8; }
}  // namespace

void rows_q4_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const uint8_t* d = q4_data(W);
  const int cols = int(W.cols), groups = int(W.q4_groups());
  for (int t = 0; t < T; ++t)
    for (int r = r0; r < r1; ++r) {
      const float* xt = x + size_t(t) * cols;
      float acc = 0;
      for (int g = 0; g < groups; ++g) {
        const uint8_t* grp = d + (size_t(r) * groups + g) * 32;
        const int n = cols - g * 64 < 64 ? cols - g * 64 : 64;
        float part = 0;
        for (int j = 0; j < n; ++j) part += float(q4_at(grp, j)) * xt[g * 64 + j];
        acc += part * W.scale[size_t(r) * groups + g];
      }
      y[size_t(t) * ldy + r] = acc;
    }
}

#if WREN_X86
namespace {

struct Q4Avx512 {
  const uint8_t* d;
  const float* scale;
  const float* x;
  float* y;
  int cols, groups, ldy;

  /// 16 columns of token j at c, zeros past the last column.
  WREN_AVX512 __m512 xload(int j, int c) const {
    const int left = cols - c;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
    return _mm512_maskz_loadu_ps(m, x + size_t(j) * cols + c);
  }

  /// The 64 weights (q as f32) of one group, unscaled: bytes widen to 32-bit lanes and vpermps
  /// looks the nibble up in a 16-float table (it reads only the low 4 index bits, so the low
  /// nibble needs no mask and the high one one shift). Lanes: cols 0-15, 16-31, 32-47, 48-63.
  WREN_AVX512 static void decode(const uint8_t* grp, __m512 lut, __m512 (&w)[4]) {
    const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp)));
    const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 16)));
    w[0] = _mm512_permutexvar_ps(b0, lut);
    w[1] = _mm512_permutexvar_ps(b1, lut);
    w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), lut);
    w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), lut);
  }

  /// The same 64 values without table lookups: a nibble OR-ed into the mantissa of 2^23, then
  /// 2^23 + 8 subtracted (exact). More ALU work but no shuffles beyond the widening, which suits
  /// the chunk GEMM (shuffle-bound with the table); both decodes give the same exact values.
  WREN_AVX512 static void decode_alu(const uint8_t* grp, __m512 (&w)[4]) {
    const __m512i magic = _mm512_set1_epi32(0x4B000000), m0f = _mm512_set1_epi32(0x0F);
    const __m512 bias = _mm512_set1_ps(8388616.0f);  // 2^23 + 8
    const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp)));
    const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 16)));
    w[0] = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(b0, m0f, magic, 0xEA)), bias);
    w[1] = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(b1, m0f, magic, 0xEA)), bias);
    w[2] = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_srli_epi32(b0, 4), magic)), bias);
    w[3] = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_srli_epi32(b1, 4), magic)), bias);
  }

  /// Per (row, token) and group: part = Σ q·x over the group's 64 columns (lane-wise, in the
  /// fixed order cols 0-15, 16-31, 32-47, 48-63), then acc += part · scale: the group's scale is
  /// applied once, not per weight. Weights are decoded once per row and shared by the tokens.
  template <int R, int N>
  WREN_AVX512 void block(int r, int t) const {
    const __m512 lut = _mm512_setr_ps(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
    __m512 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      __m512 w[R][4];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        if ((g & 1) == 0) prefetch_ahead(d + (size_t(r + i) * groups + g) * 32, size_t(R) * groups * 32);
        if ((g & 15) == 0) prefetch_ahead(scale + size_t(r + i) * groups + g, size_t(R) * groups * 4);
        if (N == 1) decode(d + (size_t(r + i) * groups + g) * 32, lut, w[i]);
        else decode_alu(d + (size_t(r + i) * groups + g) * 32, w[i]);
      }
      const int c = g * 64;
      const bool whole = c + 64 <= cols;
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        const float* xc = x + size_t(t + j) * cols + c;
        __m512 xv[4];
        WREN_UNROLL
        for (int k = 0; k < 4; ++k) xv[k] = whole ? _mm512_loadu_ps(xc + 16 * k) : xload(t + j, c + 16 * k);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) {
          __m512 part = _mm512_mul_ps(w[i][0], xv[0]);
          part = _mm512_fmadd_ps(w[i][1], xv[1], part);
          part = _mm512_fmadd_ps(w[i][2], xv[2], part);
          part = _mm512_fmadd_ps(w[i][3], xv[3], part);
          acc[i][j] = _mm512_fmadd_ps(part, _mm512_set1_ps(scale[size_t(r + i) * groups + g]), acc[i][j]);
        }
      }
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]);
  }
};

struct Q4Avx2 {
  const uint8_t* d;
  const float* scale;
  const float* x;
  float* y;
  int cols, groups, ldy;

  /// Columns 8k..8k+7 of a group whose signed nibble halves are lo (cols 0-31) and hi (32-63).
  WREN_AVX2 static __m256 chunk(__m256i lo, __m256i hi, int k) {
    const __m256i h = k < 4 ? lo : hi;
    const __m128i half = (k & 2) ? _mm256_extracti128_si256(h, 1) : _mm256_castsi256_si128(h);
    const __m128i part = (k & 1) ? _mm_srli_si128(half, 8) : half;
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
  }

  template <int R, int N>
  WREN_AVX2 void block(int r, int t) const {
    const __m256i m0f = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    const int full = cols / 64;
    __m256 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int g = 0; g < full; ++g) {
      __m256i lo[R], hi[R];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        if ((g & 1) == 0) prefetch_ahead(d + (size_t(r + i) * groups + g) * 32, size_t(R) * groups * 32);
        if ((g & 15) == 0) prefetch_ahead(scale + size_t(r + i) * groups + g, size_t(R) * groups * 4);
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + (size_t(r + i) * groups + g) * 32));
        lo[i] = _mm256_sub_epi8(_mm256_and_si256(b, m0f), eight);
        hi[i] = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(b, 4), m0f), eight);
      }
      __m256 part[R][N];
      WREN_UNROLL
      for (int k = 0; k < 8; ++k)
        WREN_UNROLL
        for (int i = 0; i < R; ++i) {
          const __m256 wv = chunk(lo[i], hi[i], k);
          WREN_UNROLL
          for (int j = 0; j < N; ++j) {
            const __m256 xv = _mm256_loadu_ps(x + size_t(t + j) * cols + g * 64 + 8 * k);
            part[i][j] = k == 0 ? _mm256_mul_ps(wv, xv) : _mm256_fmadd_ps(wv, xv, part[i][j]);
          }
        }
      WREN_UNROLL
      for (int i = 0; i < R; ++i)
        WREN_UNROLL
        for (int j = 0; j < N; ++j)
          acc[i][j] = _mm256_fmadd_ps(part[i][j], _mm256_set1_ps(scale[size_t(r + i) * groups + g]), acc[i][j]);
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        float s = hsum(acc[i][j]);
        if (full < groups) {  // partial last group, scalar
          const uint8_t* grp = d + (size_t(r + i) * groups + full) * 32;
          float part = 0;
          for (int c = full * 64; c < cols; ++c) part += float(q4_at(grp, c - full * 64)) * x[size_t(t + j) * cols + c];
          s += part * scale[size_t(r + i) * groups + full];
        }
        y[size_t(t + j) * ldy + r + i] = s;
      }
  }
};

}  // namespace

void rows_q4_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(Q4Avx512{q4_data(W), W.scale, x, y, int(W.cols), int(W.q4_groups()), ldy}, T, r0, r1);
}

void rows_q4_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<2, 1>(Q4Avx2{q4_data(W), W.scale, x, y, int(W.cols), int(W.q4_groups()), ldy}, T, r0, r1);
}
#endif

}  // namespace wren::cpu
