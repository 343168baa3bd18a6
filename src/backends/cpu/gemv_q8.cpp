// Dense GEMV/GEMM on Q8_ROW weights: y[t, r] = scale[r] · Σ_c q[r, c] · x[t, c] (see kernels.h).
// Layout: q [rows, cols] int8 row-major, scale [rows] f32 (ops/weights.h); x [T, cols] f32;
// y[t·ldy + r]. The int8 weights widen exactly to f32; the row scale is applied once at the end.
// SIMD kernels are the shared skeleton (gemv.h); this file gives only the element decode.
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels.h"

namespace wren::cpu {

namespace {

/// Q8_ROW elements: int8 widened to f32, × the row scale at the end; one prefetch per 64 columns.
struct Q8Elem {
  using E = int8_t;
  static constexpr bool kScaled = true, kVectorTail = false;
  static float value(int8_t q) { return float(q); }
#if WREN_X86
  WREN_INLINE static void prefetch(const int8_t* p, int c, size_t block) {
    if ((c & 63) == 0) prefetch_ahead(p, block);
  }
  WREN_AVX512 static __m512 widen16(const int8_t* p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
  }
  WREN_AVX2 static __m256 widen8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
#endif
};

}  // namespace

void rows_q8_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_scalar<Q8Elem>(W, x, T, y, ldy, r0, r1);
}

#if WREN_X86
void rows_q8_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_avx512<Q8Elem>(W, x, T, y, ldy, r0, r1);
}

void rows_q8_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_avx2<Q8Elem>(W, x, T, y, ldy, r0, r1);
}
#endif

}  // namespace wren::cpu
