// Dense GEMV/GEMM on BF16 weights: y[t, r] = W[r] · x[t] (see kernels.h for the contract).
// Layout: W [rows, cols] uint16 row-major, each the top half of an f32 (widened exactly by a
// 16-bit shift); x [T, cols] f32; y[t·ldy + r]. Products and sums in f32. SIMD kernels are the
// shared skeleton (gemv.h); this file gives only the element decode.
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels.h"
#include "core/dtype.h"

namespace wren::cpu {

namespace {

/// BF16 elements: bits << 16 is the f32; one prefetch per 32 columns (64 bytes) of a row.
struct Bf16Elem {
  using E = uint16_t;
  static constexpr bool kScaled = false, kVectorTail = false;
  static float value(uint16_t h) { return bf16_to_f32(h); }
#if WREN_X86
  WREN_INLINE static void prefetch(const uint16_t* p, int c, size_t block) {
    if ((c & 31) == 0) prefetch_ahead(p, block * 2);
  }
  WREN_AVX512 static __m512 widen16(const uint16_t* p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  WREN_AVX2 static __m256 widen8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
#endif
};

}  // namespace

void rows_bf16_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_scalar<Bf16Elem>(W, x, T, y, ldy, r0, r1);
}

#if WREN_X86
void rows_bf16_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_avx512<Bf16Elem>(W, x, T, y, ldy, r0, r1);
}

void rows_bf16_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  elem_rows_avx2<Bf16Elem>(W, x, T, y, ldy, r0, r1);
}
#endif

}  // namespace wren::cpu
