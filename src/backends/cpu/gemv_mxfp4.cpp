// MXFP4 GEMV/GEMM for the routed experts, on the packed checkpoint layout (never re-encoded):
// y[t, r] = Σ_g 2^(s[r,g] − 127) · Σ_{c in g} e2m1(code[r, c]) · x[t, c]   (spec kimi-k3.md §5).
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
#include "backends/cpu/simd.h"
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

#if WREN_X86
namespace {
/// permute_even_odd and quantize_act on AVX-512, with the same arithmetic (the int8 results are
/// bit-identical to the scalar ones: same products, round-to-nearest-even, clamp).
WREN_AVX512 void prep_avx512(const float* x, int cols, bool int8, float* f, int8_t* q, float* s) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int g = 0; g < cols / 32; ++g) {
    const __m512 a = _mm512_loadu_ps(x + g * 32), b = _mm512_loadu_ps(x + g * 32 + 16);
    const __m512 e = _mm512_permutex2var_ps(a, even, b), o = _mm512_permutex2var_ps(a, odd, b);
    if (!int8) {
      _mm512_storeu_ps(f + g * 32, e);
      _mm512_storeu_ps(f + g * 32 + 16, o);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    s[g] = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    const __m512i qe = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(e, inv))));
    const __m512i qo = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(o, inv))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * 32), _mm512_cvtepi32_epi8(qe));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * 32 + 16), _mm512_cvtepi32_epi8(qo));
  }
}
}  // namespace
#endif

MxAct mx_prep(Isa isa, const float* x, int T, int cols, bool int8, float* fbuf, int8_t* qbuf, float* sbuf) {
  MxAct a;
  a.T = T, a.cols = cols, a.int8 = int8;
  if (int8) a.xq = qbuf, a.xs = sbuf;
  else a.xf = isa == Isa::Scalar ? x : fbuf;
  if (!int8 && isa == Isa::Scalar) return a;
  for (int t = 0; t < T; ++t) {
    const float* xt = x + size_t(t) * cols;
    float* f = int8 ? nullptr : fbuf + size_t(t) * cols;
    int8_t* q = int8 ? qbuf + size_t(t) * cols : nullptr;
    float* s = int8 ? sbuf + size_t(t) * (cols / 32) : nullptr;
#if WREN_X86
    if (isa == Isa::Avx512) {
      prep_avx512(xt, cols, int8, f, q, s);
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

/// Common fields of the MXFP4 SIMD kernels.
struct MxArgs {
  const uint8_t* pk;
  const uint8_t* sc;
  MxAct a;
  float* y;
  int cols, groups, ldy;
  const uint8_t* row(int r) const { return pk + size_t(r) * (cols / 2); }
  const uint8_t* scales(int r) const { return sc + size_t(r) * groups; }
};

struct MxF32Avx512 : MxArgs {
  template <int R, int N>
  WREN_AVX512 void block(int r, int t) const {
    const __m512 lut = _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f);
    const float* p2 = pow2().full;
    __m512 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      __m512 we[R], wo[R];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        if ((g & 3) == 0) prefetch_ahead(row(r + i) + g * 16, size_t(R) * (cols / 2));
        // vpermps reads only the low 4 bits of each index: the widened byte indexes its low
        // nibble as it is, and its high nibble after one shift.
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r + i) + g * 16)));
        we[i] = _mm512_permutexvar_ps(b, lut);
        wo[i] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut);
      }
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        const float* xg = a.xf + size_t(t + j) * cols + g * 32;
        const __m512 xe = _mm512_loadu_ps(xg), xo = _mm512_loadu_ps(xg + 16);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) {
          const __m512 gs = _mm512_fmadd_ps(wo[i], xo, _mm512_mul_ps(we[i], xe));
          acc[i][j] = _mm512_fmadd_ps(gs, _mm512_set1_ps(p2[scales(r + i)[g]]), acc[i][j]);
        }
      }
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]);
  }
};

struct MxI8Avx512 : MxArgs {
  /// 2^(s − 128) for 16 ue8m0 bytes (masked lanes 0): s << 23 is 2^(s − 127) as f32 bits for s >= 1,
  /// s = 0 is the subnormal 2^-127; then halved (exact), matching the 2·e2m1 integer weights.
  WREN_AVX512 static __m512 half_scales(const uint8_t* s, __mmask16 m) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s));
    const __m512 p = _mm512_castsi512_ps(_mm512_slli_epi32(b, 23));
    const __m512 v = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()), p, _mm512_set1_ps(0x1p-127f));
    return _mm512_mul_ps(v, _mm512_set1_ps(0.5f));
  }

  template <int R, int N>
  WREN_AVX512 void block(int r, int t) const {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1x2)));
    const __m512i dup = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);  // [A, A, B, B] 128-bit lanes
    const long long S = 0x0004000400040004ll;
    const __m512i shift = _mm512_setr_epi64(0, 0, S, S, 0, 0, S, S);  // high nibbles in lanes 1, 3
    const __m512i m0f = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    __m512 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
    const int pairs_end = groups & ~1;
    for (int g0 = 0; g0 < pairs_end; g0 += 16) {
      // The combined scales (weight · activation) of up to 16 groups, one lane each; a pair of
      // groups then takes lanes [k x8, k+1 x8] with one permute.
      const int ng = std::min(16, pairs_end - g0);
      const __mmask16 gm = ng == 16 ? __mmask16(0xFFFF) : __mmask16((1u << ng) - 1);
      __m512 cs[R][N];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        const __m512 ws = half_scales(scales(r + i) + g0, gm);
        WREN_UNROLL
        for (int j = 0; j < N; ++j) cs[i][j] = _mm512_mul_ps(ws, _mm512_maskz_loadu_ps(gm, a.xs + size_t(t + j) * groups + g0));
      }
      __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
      for (int g = g0; g < g0 + ng; g += 2, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2))) {
        __m512i aw[R];
        __mmask64 neg[R];
        WREN_UNROLL
        for (int i = 0; i < R; ++i) {
          if ((g & 3) == 0) prefetch_ahead(row(r + i) + g * 16, size_t(R) * (cols / 2));
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row(r + i) + g * 16));
          const __m512i z = _mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(v));
          const __m512i w = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi16(z, shift), m0f));
          aw[i] = _mm512_abs_epi8(w);
          neg[i] = _mm512_movepi8_mask(w);
        }
        WREN_UNROLL
        for (int j = 0; j < N; ++j) {
          const __m512i xv = _mm512_loadu_si512(a.xq + size_t(t + j) * cols + g * 32);
          WREN_UNROLL
          for (int i = 0; i < R; ++i) {
            const __m512i sx = _mm512_mask_sub_epi8(xv, neg[i], zero, xv);
            const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, aw[i], sx));
            acc[i][j] = _mm512_fmadd_ps(f, _mm512_permutexvar_ps(idx, cs[i][j]), acc[i][j]);
          }
        }
      }
    }
    if (pairs_end < groups) tail_group<R, N>(r, t, pairs_end, acc);
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]);
  }

  /// The last group when the count is odd, on 256-bit vectors.
  template <int R, int N>
  WREN_AVX512 void tail_group(int r, int t, int g, __m512 (&acc)[R][N]) const {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1x2)));
    const __m128i m0f = _mm_set1_epi8(0x0F);
    const float* half = pow2().half;
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
};

struct MxF32Avx2 : MxArgs {
  template <int R, int N>
  WREN_AVX2 void block(int r, int t) const {
    const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1x2));
    const __m128i m0f = _mm_set1_epi8(0x0F);
    const float* half = pow2().half;
    __m256 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      __m256 w[R][4];  // 2·e2m1 of even 0-7, even 8-15, odd 0-7, odd 8-15
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        if ((g & 3) == 0) prefetch_ahead(row(r + i) + g * 16, size_t(R) * (cols / 2));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r + i) + g * 16));
        const __m128i e = _mm_shuffle_epi8(lut, _mm_and_si128(b, m0f));
        const __m128i o = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m0f));
        w[i][0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e));
        w[i][1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e, 8)));
        w[i][2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(o));
        w[i][3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(o, 8)));
      }
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        const float* xg = a.xf + size_t(t + j) * cols + g * 32;
        WREN_UNROLL
        for (int i = 0; i < R; ++i) {
          __m256 gs = _mm256_mul_ps(w[i][0], _mm256_loadu_ps(xg));
          gs = _mm256_fmadd_ps(w[i][1], _mm256_loadu_ps(xg + 8), gs);
          gs = _mm256_fmadd_ps(w[i][2], _mm256_loadu_ps(xg + 16), gs);
          gs = _mm256_fmadd_ps(w[i][3], _mm256_loadu_ps(xg + 24), gs);
          acc[i][j] = _mm256_fmadd_ps(gs, _mm256_set1_ps(half[scales(r + i)[g]]), acc[i][j]);
        }
      }
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]);
  }
};

struct MxI8Avx2 : MxArgs {
  template <int R, int N>
  WREN_AVX2 void block(int r, int t) const {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1x2)));
    const __m128i m0f = _mm_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    const float* half = pow2().half;
    __m256 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      __m256i w[R], aw[R];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) {
        if ((g & 3) == 0) prefetch_ahead(row(r + i) + g * 16, size_t(R) * (cols / 2));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r + i) + g * 16));
        const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m0f), _mm_and_si128(b, m0f));
        w[i] = _mm256_shuffle_epi8(lut, idx);
        aw[i] = _mm256_abs_epi8(w[i]);
      }
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + size_t(t + j) * cols + g * 32));
        const float xs = a.xs[size_t(t + j) * groups + g];
        WREN_UNROLL
        for (int i = 0; i < R; ++i) {
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[i], _mm256_sign_epi8(xv, w[i])), ones);
          const __m256 s = _mm256_set1_ps(half[scales(r + i)[g]] * xs);
          acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[i][j]);
        }
      }
    }
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) y[size_t(t + j) * ldy + r + i] = hsum(acc[i][j]);
  }
};

template <class K>
K mx_args(const MxMatrix& m, const MxAct& a, float* y, int ldy) {
  K k;
  static_cast<MxArgs&>(k) = MxArgs{m.packed, m.scale, a, y, m.cols, m.cols / 32, ldy};
  return k;
}

}  // namespace

void mx_rows_f32_avx512(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(mx_args<MxF32Avx512>(m, a, y, ldy), a.T, r0, r1);
}
void mx_rows_i8_avx512(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<4, 2>(mx_args<MxI8Avx512>(m, a, y, ldy), a.T, r0, r1);
}
void mx_rows_f32_avx2(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<2, 1>(mx_args<MxF32Avx2>(m, a, y, ldy), a.T, r0, r1);
}
void mx_rows_i8_avx2(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1) {
  drive_rows<2, 1>(mx_args<MxI8Avx2>(m, a, y, ldy), a.T, r0, r1);
}
#endif

}  // namespace wren::cpu
