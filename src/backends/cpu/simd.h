// CPU SIMD support for the kernel files: the target attributes that compile one function for one
// level (isa.h), and helpers shared by the kernel families (gemv_*.cpp, vec.cpp, kda.cpp). Only
// functions carrying WREN_AVX2 / WREN_AVX512 use those instructions, so code shared with the rest
// of the program stays baseline x86-64 and a machine without AVX2 runs the scalar kernels.
#pragma once
#include <cstddef>

#include "backends/cpu/isa.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WREN_X86 1
// GCC 12's AVX-512 headers build "undefined" vectors by self-initialisation (GCC bug 105593), which
// -Wuninitialized then reports inside inlined intrinsics; silenced in the kernel files only (this
// header is included by them, never by public headers).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define WREN_AVX2 __attribute__((target("avx2,fma,f16c")))
#define WREN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#else
#define WREN_X86 0
#endif

/// Fully unrolls the next loop over a block's rows or tokens (compile-time trip counts), so its
/// accumulator arrays live in registers; plain -O2 keeps them in memory.
#define WREN_UNROLL _Pragma("GCC unroll 16")

/// Forces inlining of a small helper. Needed for the prefetch helpers: GCC's IPA judges a function
/// whose only effect is a prefetch to be side-effect free and deletes calls to it that were not
/// inlined early, silently dropping the prefetch.
#define WREN_INLINE inline __attribute__((always_inline))

namespace wren::cpu {
/// Prefetches into L1 the line `ahead` bytes after p (a hint: never faults). The quantized GEMV
/// loops call it with ahead = the bytes of one row block, i.e. the same position in the row the
/// next block will read: rows are contiguous, so the block streams as one region, and the dense
/// decode work per byte otherwise keeps too few misses in flight, worst for short rows.
WREN_INLINE void prefetch_ahead(const void* p, size_t ahead) {
#if WREN_X86
  _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T0);
#endif
}
}  // namespace wren::cpu

namespace wren::cpu {

#if WREN_X86
/// Σ of the 8 lanes, in a fixed order.
WREN_AVX2 inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
/// Σ of the 16 lanes, in a fixed order.
WREN_AVX512 inline float hsum(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
/// AVX-512 mask of the first min(left, 16) lanes (left >= 1).
WREN_AVX512 inline __mmask16 lanes16(int left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}
/// AVX2 load/store mask of the first min(left, 8) lanes.
WREN_AVX2 inline __m256i lanes8(int left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/// Calls k.template block<R, N>(r, t) over rows [r0, r1) and tokens [0, T): blocks of RB rows
/// (RB1 when T == 1, the GEMV case) with the last rows one at a time, and tokens in blocks of
/// up to 4. Kernels compute each (row, token) output with the same operation sequence whatever
/// block it falls in, so results depend neither on the thread split nor on the chunk size.
template <int RB1, int RB, class K>
void drive_rows(const K& k, int T, int r0, int r1);

template <int R, class K>
void drive_tokens(const K& k, int T, int r) {
  int t = 0;
  for (; t + 4 <= T; t += 4) k.template block<R, 4>(r, t);
  switch (T - t) {
    case 3: k.template block<R, 3>(r, t); break;
    case 2: k.template block<R, 2>(r, t); break;
    case 1: k.template block<R, 1>(r, t); break;
    default: break;
  }
}

template <int RB1, int RB, class K>
void drive_rows(const K& k, int T, int r0, int r1) {
  int r = r0;
  if (T == 1) {
    for (; r + RB1 <= r1; r += RB1) k.template block<RB1, 1>(r, 0);
  } else {
    for (; r + RB <= r1; r += RB) drive_tokens<RB>(k, T, r);
  }
  for (; r < r1; ++r) drive_tokens<1>(k, T, r);
}

}  // namespace wren::cpu
