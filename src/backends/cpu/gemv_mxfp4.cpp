// MXFP4 GEMV/GEMM for the routed experts, on the packed checkpoint layout (never re-encoded):
// y[t, r] = Σ_g 2^(s[r,g] − 127) · Σ_{c in g} e2m1(code[r, c]) · x[t, c]   (docs/model.md#mxfp4).
// Layout (core/mxfp4.h): packed [rows, cols/2] u8, byte j of a row = column 2j (low nibble) and
// 2j + 1 (high nibble); scale [rows, cols/32] ue8m0. Activations come prepared by mx_prep():
//   f32   SIMD kernels read x per 32-group as [16 even | 16 odd] columns, matching a packed group's
//         [low nibbles | high nibbles], so a group is decoded with one mask, one shift and a
//         16-entry table and never interleaved. Scalar reads natural order (cpu::mx_gemv).
//   int8  per-32-group int8 activations (same even/odd order) times 2·e2m1, which is an exact
//         int8 in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}: integer dot products per group (VNNI on
//         AVX-512, maddubs on AVX2), then one f32 scale 2^(s − 128) · xs per group. Approximate
//         (the activations are rounded); opt-in (--mx-act int8).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/gemv.h"
#include "core/mxfp4.h"

namespace wren::cpu {

namespace {

struct Pow2Tables {
  float full[256], half[256];  // 2^(s-127), 2^(s-128)
  Pow2Tables() {
    for (int s = 0; s < 256; ++s) full[s] = std::ldexp(1.0f, s - 127), half[s] = std::ldexp(1.0f, s - 128);
  }
};
const Pow2Tables& pow2() {
  static const Pow2Tables t;
  return t;
}

/// 2·e2m1 by code: exact small integers.
constexpr int8_t kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/// One row in the reference order: per group Σ e2m1 · x sequentially, then × the group's scale.
float mx_row_ref(const uint8_t* pk, const uint8_t* sc, int groups, const float* x) {
  float acc = 0;
  for (int g = 0; g < groups; ++g) {
    float part = 0;
    for (int j = 0; j < mxfp4::kGroup; ++j) {
      const int c = g * mxfp4::kGroup + j;
      part += mxfp4::kE2M1[mxfp4::code_at(pk, c)] * x[c];
    }
    acc += part * mxfp4::scale_value(sc[g]);
  }
  return acc;
}

/// x [cols] -> per 32-group [even | odd] order.
void permute_even_odd(const float* x, int cols, float* out) {
  for (int g = 0; g < cols; g += 32)
    for (int j = 0; j < 16; ++j) out[g + j] = x[g + 2 * j], out[g + 16 + j] = x[g + 2 * j + 1];
}

/// x [cols] -> int8 per 32-group (even/odd order) and one scale per group.
void quantize_act(const float* x, int cols, int8_t* q, float* s) {
  for (int g = 0; g < cols / 32; ++g) {
    const float* xg = x + g * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xg[j]));
    s[g] = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 16; ++j) {
      q[g * 32 + j] = int8_t(std::clamp(std::nearbyint(xg[2 * j] * inv), -127.0f, 127.0f));
      q[g * 32 + 16 + j] = int8_t(std::clamp(std::nearbyint(xg[2 * j + 1] * inv), -127.0f, 127.0f));
    }
  }
}

}  // namespace

void mx_gemv(const MxMatrix& m, const float* x, float* y) {
  const int groups = m.cols / mxfp4::kGroup, row_bytes = m.cols / 2;
  for (int r = 0; r < m.rows; ++r)
    y[r] = mx_row_ref(m.packed + size_t(r) * row_bytes, m.scale + size_t(r) * groups, groups, x);
}

int mx_act_pos(Isa isa, bool int8, int cols, int c) {
  if (isa == Isa::Scalar && !int8) return c;
  const int g = c / 32, j = c % 32, eo = g * 32 + (j % 2 ? 16 + j / 2 : j / 2);
  if (isa != Isa::Avx512 || !int8 || g >= (cols / 128) * 4) return eo;
  return (c / 128) * 128 + (j % 2) * 64 + (c % 128 / 32) * 16 + j / 2;  // [even halves | odd halves]
}

#if WREN_X86
namespace {
/// permute_even_odd and quantize_act on AVX-512, with the same arithmetic (the int8 values are
/// bit-identical to the scalar ones: same products, round-to-nearest-even, clamp), in the AVX-512
/// orders of kernels.h. int8 also fills xs4 and xc of each whole 4-group block.
WREN_AVX512 void prep_avx512(const float* x, int cols, bool int8, float* f, int8_t* q, float* s, float* xs4,
                             int32_t* xc) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const int whole = (cols / 128) * 4;  // groups in whole blocks
  for (int g = 0; g < cols / 32; ++g) {
    const __m512 a = _mm512_loadu_ps(x + g * 32), b = _mm512_loadu_ps(x + g * 32 + 16);
    if (!int8) {
      _mm512_storeu_ps(f + g * 32, _mm512_permutex2var_ps(a, even, b));
      _mm512_storeu_ps(f + g * 32 + 16, _mm512_permutex2var_ps(a, odd, b));
      continue;
    }
    const __m512 e = _mm512_permutex2var_ps(a, even, b), o = _mm512_permutex2var_ps(a, odd, b);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    s[g] = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    const __m512i qe = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(e, inv))));
    const __m512i qo = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(o, inv))));
    // Whole blocks: the even half of group 4b + i at 128b + 16i, its odd half 64 bytes later.
    const int pe = g < whole ? (g / 4) * 128 + (g % 4) * 16 : g * 32, po = g < whole ? pe + 64 : pe + 16;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + pe), _mm512_cvtepi32_epi8(qe));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + po), _mm512_cvtepi32_epi8(qo));
  }
  for (int b = 0; int8 && b < whole / 4; ++b) {
    const __m512i twelve = _mm512_set1_epi8(12);
    const __m512i xl = _mm512_loadu_si512(q + b * 128), xh = _mm512_loadu_si512(q + b * 128 + 64);
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, xl), twelve, xh);
    _mm512_storeu_si512(xc + b * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    const __m512i rep = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    _mm512_storeu_ps(xs4 + b * 16, _mm512_permutexvar_ps(rep, _mm512_castps128_ps512(_mm_loadu_ps(s + 4 * b))));
  }
}
}  // namespace
#endif

MxAct mx_prep(Isa isa, const float* x, int T, int cols, bool int8, float* fbuf, int8_t* qbuf, float* sbuf) {
  MxAct a;
  a.T = T, a.cols = cols, a.int8 = int8;
  if (int8) a.xq = qbuf, a.xs = sbuf;
  else a.xf = isa == Isa::Scalar ? x : fbuf;
  if (int8 && isa == Isa::Avx512) {
    a.xs4 = fbuf;
    a.xc = reinterpret_cast<int32_t*>(fbuf + size_t(T) * (cols / 8));  // written by vector stores only
  }
  if (!int8 && isa == Isa::Scalar) return a;
  for (int t = 0; t < T; ++t) {
    const float* xt = x + size_t(t) * cols;
    float* f = int8 ? nullptr : fbuf + size_t(t) * cols;
    int8_t* q = int8 ? qbuf + size_t(t) * cols : nullptr;
    float* s = int8 ? sbuf + size_t(t) * (cols / 32) : nullptr;
#if WREN_X86
    if (isa == Isa::Avx512) {
      prep_avx512(xt, cols, int8, f, q, s, int8 ? fbuf + size_t(t) * (cols / 8) : nullptr,
                  int8 ? const_cast<int32_t*>(a.xc) + size_t(t) * (cols / 8) : nullptr);
      continue;
    }
#endif
    if (int8) quantize_act(xt, cols, q, s);
    else permute_even_odd(xt, cols, f);
  }
  return a;
}

void mx_rows_f32_scalar(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  const int groups = m.cols / 32, row_bytes = m.cols / 2;
  for (int t = 0; t < a.T; ++t)
    for (int r = r0; r < r1; ++r)
      y[size_t(t) * ldy + r] = mx_row_ref(m.packed + size_t(r) * row_bytes, m.scale + size_t(r) * groups,
                                          groups, a.xf + size_t(t) * m.cols);
}

void mx_rows_i8_scalar(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  const int groups = m.cols / 32, row_bytes = m.cols / 2;
  const float* half = pow2().half;
  for (int t = 0; t < a.T; ++t)
    for (int r = r0; r < r1; ++r) {
      const uint8_t* pk = m.packed + size_t(r) * row_bytes;
      const uint8_t* sc = m.scale + size_t(r) * groups;
      const int8_t* xq = a.xq + size_t(t) * m.cols;
      float acc = 0;
      for (int g = 0; g < groups; ++g) {
        int isum = 0;
        for (int j = 0; j < 16; ++j) {
          const uint8_t b = pk[g * 16 + j];
          isum += kE2M1x2[b & 0xF] * xq[g * 32 + j] + kE2M1x2[b >> 4] * xq[g * 32 + 16 + j];
        }
        acc += float(isum) * (half[sc[g]] * a.xs[size_t(t) * groups + g]);
      }
      y[size_t(t) * ldy + r] = acc;
    }
}

#if WREN_X86
namespace {

/// Fields of the MXFP4 SIMD kernels (the format hooks of the gemv.h skeleton, one 32-column
/// group per step unless stated).
struct MxArgs : RowHooks {
  const uint8_t* pk;
  const uint8_t* sc;
  MxAct a;
  float* y;
  int cols, groups, ldy;
  const Pow2Tables* p2;
  const uint8_t* row(int r) const { return pk + size_t(r) * (cols / 2); }
  const uint8_t* scales(int r) const { return sc + size_t(r) * groups; }
  /// The packed bytes every 4 groups (64 bytes), the scales every 64 groups.
  template <int R>
  WREN_INLINE void prefetch_group(int r, int g) const {
    if ((g & 3) == 0) prefetch_ahead(row(r) + g * 16, size_t(R) * (cols / 2));
    if ((g & 63) == 0) prefetch_ahead(scales(r) + g, size_t(R) * groups);
  }
};

/// 2^(s − 127) · mul for up to 16 ue8m0 bytes (masked lanes 0): s << 23 is 2^(s − 127) as f32
/// bits for s >= 1; s = 0 is the subnormal 2^-127. mul is 1 or 0.5 (both exact).
WREN_AVX512 inline __m512 pow2_16(const uint8_t* s, __mmask16 m, float mul) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s));
  const __m512 p = _mm512_castsi512_ps(_mm512_slli_epi32(b, 23));
  const __m512 v = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()), p, _mm512_set1_ps(0x1p-127f));
  return _mm512_mul_ps(v, _mm512_set1_ps(mul));
}

/// Lane d of block q (0..3) of 16 groups takes group 4q + d / 4.
WREN_AVX512 inline __m512i block_lanes(int q) {
  return _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_set1_epi32(4 * q));
}

/// f32 activations: a group's 16 bytes give its even columns (low nibbles) and odd columns (high
/// nibbles) as e2m1 via a 16-float table; gs = Σ odd + Σ even products, acc += gs · 2^(s − 127).
struct MxF32Avx512 : MxArgs {
  struct W { __m512 e, o; };
  struct X { __m512 e, o; };
  int steps() const { return groups; }
  template <int R, int N>
  WREN_AVX512 void decode(int r, int g, NoCarry&, W& w) const {
    const __m512 lut = _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f);
    prefetch_group<R>(r, g);
    // vpermps reads only the low 4 bits of each index: the widened byte indexes its low
    // nibble as it is, and its high nibble after one shift.
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r) + g * 16)));
    w.e = _mm512_permutexvar_ps(b, lut);
    w.o = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut);
  }
  WREN_AVX512 void xload(int t, int g, X& x) const {
    const float* xg = a.xf + size_t(t) * cols + g * 32;
    x.e = _mm512_loadu_ps(xg), x.o = _mm512_loadu_ps(xg + 16);
  }
  WREN_AVX512 void madd(const W& w, const X& x, int r, int g, __m512& acc) const {
    const __m512 gs = _mm512_fmadd_ps(w.o, x.o, _mm512_mul_ps(w.e, x.e));
    acc = _mm512_fmadd_ps(gs, _mm512_set1_ps(p2->full[scales(r)[g]]), acc);
  }
};

/// 2·e2m1 + 12 by code (unsigned, 0..24), the MxI8Avx512 weight table.
alignas(16) constexpr uint8_t kBiased[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/// int8 activations, one whole block of 4 groups per step, as exact integer dot products: the
/// block's 64 packed bytes give its low nibbles (even columns) and high nibbles (odd columns) as
/// bytes, looked up as 2·e2m1 + 12 so vpdpbusd multiplies them with the signed activations
/// directly; lane d sums 8 columns of group 4b + d / 4 and starts from xc = −12·Σ of those
/// activations, which removes the bias exactly. Then one convert and one multiply by the lanes'
/// scales 2^(s − 128) · xs per block. Groups after the last whole block go one at a time (tail).
struct MxI8Avx512 : MxArgs {
  struct Carry { __m512 p16; };  ///< 2^(s − 128) of the 16 groups from the last 4-block boundary
  struct W { __m512i l, h; __m512 s; };
  struct X { __m512i l, h, c; __m512 s; };
  int steps() const { return groups / 4; }
  template <int R, int N>
  WREN_AVX512 void decode(int r, int b, Carry& carry, W& w) const {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kBiased)));
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const int q = b & 3;
    if (q == 0) {
      const int ng = std::min(16, groups - 4 * b);
      const __mmask16 gm = ng == 16 ? __mmask16(0xFFFF) : __mmask16((1u << ng) - 1);
      carry.p16 = pow2_16(scales(r) + 4 * b, gm, 0.5f);
    }
    prefetch_ahead(row(r) + b * 64, size_t(R) * (cols / 2));
    if ((b & 15) == 0) prefetch_ahead(scales(r) + 4 * b, size_t(R) * groups);
    const __m512i v = _mm512_loadu_si512(row(r) + b * 64);
    w.l = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m0f));
    w.h = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f));
    w.s = _mm512_permutexvar_ps(block_lanes(q), carry.p16);
  }
  WREN_AVX512 void xload(int t, int b, X& x) const {
    const int c8 = cols / 8;
    const int8_t* xb = a.xq + size_t(t) * cols + b * 128;
    x.l = _mm512_loadu_si512(xb), x.h = _mm512_loadu_si512(xb + 64);
    x.c = _mm512_loadu_si512(a.xc + size_t(t) * c8 + b * 16);
    x.s = _mm512_loadu_ps(a.xs4 + size_t(t) * c8 + b * 16);
  }
  WREN_AVX512 void madd(const W& w, const X& x, int, int, __m512& acc) const {
    const __m512i dp = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x.c, w.l, x.l), w.h, x.h);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(w.s, x.s), acc);
  }

  /// The groups after the last whole block, one at a time on 256-bit vectors.
  template <int R, int N>
  WREN_AVX512 void tail(int r, int t, __m512 (&acc)[R][N]) const {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1x2)));
    const __m128i m0f = _mm_set1_epi8(0x0F);
    const float* half = p2->half;
    for (int g = groups / 4 * 4; g < groups; ++g) {
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r + i) + g * 16));
        const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m0f), _mm_and_si128(b, m0f));
        const __m256i w = _mm256_shuffle_epi8(lut, idx), aw = _mm256_abs_epi8(w);
        WREN_UNROLL
        for (int j = 0; j < N; ++j) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + size_t(t + j) * cols + g * 32));
          const __m256i dp = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(xv, w));
          const float s = half[scales(r + i)[g]] * a.xs[size_t(t + j) * groups + g];
          const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(dp), _mm256_set1_ps(s));
          acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_zextps256_ps512(f));
        }
      }
    }
  }
};

/// f32 activations on AVX2: a group's nibbles looked up as 2·e2m1 bytes, widened to four f32
/// vectors (even 0-7, even 8-15, odd 0-7, odd 8-15); acc += gs · 2^(s − 128).
struct MxF32Avx2 : MxArgs {
  struct W { __m256 v[4]; };
  using X = const float*;  ///< the token's group (read in madd)
  int steps() const { return groups; }
  template <int R, int N>
  WREN_AVX2 void decode(int r, int g, NoCarry&, W& w) const {
    const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1x2));
    const __m128i m0f = _mm_set1_epi8(0x0F);
    prefetch_group<R>(r, g);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r) + g * 16));
    const __m128i e = _mm_shuffle_epi8(lut, _mm_and_si128(b, m0f));
    const __m128i o = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m0f));
    w.v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e));
    w.v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e, 8)));
    w.v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(o));
    w.v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(o, 8)));
  }
  void xload(int t, int g, X& xg) const { xg = a.xf + size_t(t) * cols + g * 32; }
  WREN_AVX2 void madd(const W& w, const X& xg, int r, int g, __m256& acc) const {
    __m256 gs = _mm256_mul_ps(w.v[0], _mm256_loadu_ps(xg));
    gs = _mm256_fmadd_ps(w.v[1], _mm256_loadu_ps(xg + 8), gs);
    gs = _mm256_fmadd_ps(w.v[2], _mm256_loadu_ps(xg + 16), gs);
    gs = _mm256_fmadd_ps(w.v[3], _mm256_loadu_ps(xg + 24), gs);
    acc = _mm256_fmadd_ps(gs, _mm256_set1_ps(p2->half[scales(r)[g]]), acc);
  }
};

/// int8 activations on AVX2: 2·e2m1 bytes against the group's int8 activations with maddubs
/// (|w| unsigned, the sign moved onto x), pairs summed by madd; acc += Σ · 2^(s − 128) · xs.
struct MxI8Avx2 : MxArgs {
  struct W { __m256i w, aw; };
  struct X { __m256i v; float s; };
  int steps() const { return groups; }
  template <int R, int N>
  WREN_AVX2 void decode(int r, int g, NoCarry&, W& w) const {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1x2)));
    const __m128i m0f = _mm_set1_epi8(0x0F);
    prefetch_group<R>(r, g);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r) + g * 16));
    const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m0f), _mm_and_si128(b, m0f));
    w.w = _mm256_shuffle_epi8(lut, idx);
    w.aw = _mm256_abs_epi8(w.w);
  }
  WREN_AVX2 void xload(int t, int g, X& x) const {
    x.v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + size_t(t) * cols + g * 32));
    x.s = a.xs[size_t(t) * groups + g];
  }
  WREN_AVX2 void madd(const W& w, const X& x, int r, int g, __m256& acc) const {
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w.aw, _mm256_sign_epi8(x.v, w.w)), _mm256_set1_epi16(1));
    const __m256 s = _mm256_set1_ps(p2->half[scales(r)[g]] * x.s);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
  }
};

template <class K>
RowsAvx512<K> mx_args512(const MxMatrix& m, const MxAct& a, float* y, int ldy) {
  return {{{{}, m.packed, m.scale, a, y, m.cols, m.cols / 32, ldy, &pow2()}}};
}
template <class K>
RowsAvx2<K> mx_args2(const MxMatrix& m, const MxAct& a, float* y, int ldy) {
  return {{{{}, m.packed, m.scale, a, y, m.cols, m.cols / 32, ldy, &pow2()}}};
}

}  // namespace

void mx_rows_f32_avx512(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(mx_args512<MxF32Avx512>(m, a, y, ldy), a.T, r0, r1);
}
void mx_rows_i8_avx512(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(mx_args512<MxI8Avx512>(m, a, y, ldy), a.T, r0, r1);
}
void mx_rows_f32_avx2(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<2, 1>(mx_args2<MxF32Avx2>(m, a, y, ldy), a.T, r0, r1);
}
void mx_rows_i8_avx2(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<2, 1>(mx_args2<MxI8Avx2>(m, a, y, ldy), a.T, r0, r1);
}
#endif

}  // namespace wren::cpu
