// Dense GEMV/GEMM on Q4_G64 weights: y[t, r] = Σ_g scale[r, g] · Σ_{c in g} q[r, c] · x[t, c]
// (see kernels.h). Layout (core/q4_g64.h, ops/weights.h): per row ceil(cols/64) groups of 32
// bytes; byte j of a group holds column j (low nibble) and column j + 32 (high nibble) as q + 8;
// scale [rows, groups] f32; a last partial group is zero-padded. x [T, cols] f32; y[t·ldy + r].
// The nibble halves of a group are 32 consecutive columns each, so a kernel splits a group with
// one mask and one shift and never interleaves. SIMD kernels are the shared skeleton (gemv.h)
// with one group per step; this file gives the group decode and the per-group multiply-add.
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels.h"
#include "core/q4_g64.h"

namespace wren::cpu {

namespace {
const uint8_t* q4_data(const DenseWeight& W) { return static_cast<const uint8_t*>(W.data); }

/// Fields of the Q4_G64 kernels.
struct Q4Args : RowHooks {
  const uint8_t* d;
  const float* scale;
  const float* x;
  float* y;
  int cols, groups, ldy;
  const uint8_t* group(int r, int g) const { return d + (size_t(r) * groups + g) * q4::kGroupBytes; }
  float group_scale(int r, int g) const { return scale[size_t(r) * groups + g]; }
  /// The group's two prefetches: packed bytes every other group, scales every 16 groups.
  template <int R>
  WREN_INLINE void prefetch_group(int r, int g) const {
    if ((g & 1) == 0) prefetch_ahead(group(r, g), size_t(R) * groups * 32);
    if ((g & 15) == 0) prefetch_ahead(scale + size_t(r) * groups + g, size_t(R) * groups * 4);
  }
};
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
        for (int j = 0; j < n; ++j) part += float(q4::q_at(grp, j)) * xt[g * 64 + j];
        acc += part * W.scale[size_t(r) * groups + g];
      }
      y[size_t(t) * ldy + r] = acc;
    }
}

#if WREN_X86
namespace {

/// AVX-512, one group per step. Per (row, token) and group: part = Σ q·x over the group's 64
/// columns (lane-wise, in the fixed order cols 0-15, 16-31, 32-47, 48-63), then
/// acc += part · scale: the group's scale is applied once, not per weight. Weights are decoded
/// once per row and shared by the tokens.
struct Q4Avx512 : Q4Args {
  struct W { __m512 v[4]; };  ///< cols 0-15, 16-31, 32-47, 48-63 as f32 q
  struct X { __m512 v[4]; };
  int steps() const { return groups; }

  /// The 64 weights (q as f32) of one group, unscaled: bytes widen to 32-bit lanes and vpermps
  /// looks the nibble up in a 16-float table (it reads only the low 4 index bits, so the low
  /// nibble needs no mask and the high one one shift).
  WREN_AVX512 static void decode_lut(const uint8_t* grp, __m512 (&w)[4]) {
    const __m512 lut = _mm512_setr_ps(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
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

  template <int R, int N>
  WREN_AVX512 void decode(int r, int g, NoCarry&, W& w) const {
    prefetch_group<R>(r, g);
    if (N == 1) decode_lut(group(r, g), w.v);
    else decode_alu(group(r, g), w.v);
  }
  /// 64 columns of token t from the group's first column, zeros past the last column.
  WREN_AVX512 void xload(int t, int g, X& xv) const {
    const int c = g * 64;
    const float* xc = x + size_t(t) * cols + c;
    const bool whole = c + 64 <= cols;
    WREN_UNROLL
    for (int k = 0; k < 4; ++k) xv.v[k] = whole ? _mm512_loadu_ps(xc + 16 * k) : xpart(xc + 16 * k, cols - c - 16 * k);
  }
  /// 16 columns from p of which `left` exist (zeros for the rest; none when left <= 0).
  WREN_AVX512 static __m512 xpart(const float* p, int left) {
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
    return _mm512_maskz_loadu_ps(m, p);
  }
  WREN_AVX512 void madd(const W& w, const X& xv, int r, int g, __m512& acc) const {
    __m512 part = _mm512_mul_ps(w.v[0], xv.v[0]);
    part = _mm512_fmadd_ps(w.v[1], xv.v[1], part);
    part = _mm512_fmadd_ps(w.v[2], xv.v[2], part);
    part = _mm512_fmadd_ps(w.v[3], xv.v[3], part);
    acc = _mm512_fmadd_ps(part, _mm512_set1_ps(group_scale(r, g)), acc);
  }
};

/// AVX2, one whole group per step (the signed nibble halves as bytes), a last partial group in
/// scalar after the steps. Per group: part = Σ over the 8 column chunks of 8 (chunk 0 a
/// multiply, then FMAs), acc += part · scale.
struct Q4Avx2 : Q4Args {
  struct W { __m256i lo, hi; };  ///< q of cols 0-31, 32-63 as int8
  using X = const float*;        ///< the token's group columns (read in madd, as needed)
  int steps() const { return cols / 64; }

  /// Columns 8k..8k+7 of a group whose signed nibble halves are lo (cols 0-31) and hi (32-63).
  WREN_AVX2 static __m256 chunk(__m256i lo, __m256i hi, int k) {
    const __m256i h = k < 4 ? lo : hi;
    const __m128i half = (k & 2) ? _mm256_extracti128_si256(h, 1) : _mm256_castsi256_si128(h);
    const __m128i part = (k & 1) ? _mm_srli_si128(half, 8) : half;
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
  }

  template <int R, int N>
  WREN_AVX2 void decode(int r, int g, NoCarry&, W& w) const {
    const __m256i m0f = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    prefetch_group<R>(r, g);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group(r, g)));
    w.lo = _mm256_sub_epi8(_mm256_and_si256(b, m0f), eight);
    w.hi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(b, 4), m0f), eight);
  }
  void xload(int t, int g, X& xg) const { xg = x + size_t(t) * cols + g * 64; }
  WREN_AVX2 void madd(const W& w, const X& xg, int r, int g, __m256& acc) const {
    __m256 part = _mm256_mul_ps(chunk(w.lo, w.hi, 0), _mm256_loadu_ps(xg));
    WREN_UNROLL
    for (int k = 1; k < 8; ++k) part = _mm256_fmadd_ps(chunk(w.lo, w.hi, k), _mm256_loadu_ps(xg + 8 * k), part);
    acc = _mm256_fmadd_ps(part, _mm256_set1_ps(group_scale(r, g)), acc);
  }
  /// The partial last group, scalar.
  float finish(float s, int r, int t) const {
    const int full = cols / 64;
    if (full < groups) {
      const uint8_t* grp = group(r, full);
      float part = 0;
      for (int c = full * 64; c < cols; ++c) part += float(q4::q_at(grp, c - full * 64)) * x[size_t(t) * cols + c];
      s += part * group_scale(r, full);
    }
    return s;
  }
};

Q4Args q4_args(const DenseWeight& W, const float* x, float* y, int ldy) {
  return {{}, q4_data(W), W.scale, x, y, int(W.cols), int(W.q4_groups()), ldy};
}

}  // namespace

void rows_q4_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(RowsAvx512<Q4Avx512>{{{q4_args(W, x, y, ldy)}}}, T, r0, r1);
}

void rows_q4_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  drive_rows<2, 1>(RowsAvx2<Q4Avx2>{{{q4_args(W, x, y, ldy)}}}, T, r0, r1);
}
#endif

}  // namespace wren::cpu
