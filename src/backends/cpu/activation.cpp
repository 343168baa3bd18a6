// SiTU-GLU on f32 arrays (docs/model.md#situ): out[i] = [b1 tanh(g/b1) σ(g)] · [b2 tanh(u/b2)],
// g, u, out [n] contiguous. Scalar = cpu::situ with libm (the reference). AVX-512 evaluates exp
// and tanh with Cephes' single-precision polynomials (expf: |rel err| ~1e-7; tanhf: odd polynomial
// below 0.625, 1 − 2/(e^{2|x|} + 1) above), so results differ from libm by a few ulps; tested
// against the scalar path in tests/kernels_test.cpp. The AVX2 level uses the scalar loop.
#include <algorithm>
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/simd.h"

namespace wren::cpu {

void situ_scalar(const float* g, const float* u, size_t n, float b1, float b2, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = situ(g[i], u[i], b1, b2);
}

void situ_avx2(const float* g, const float* u, size_t n, float b1, float b2, float* out) {
  situ_scalar(g, u, n, b1, b2, out);
}

#if WREN_X86
namespace {

/// e^x (Cephes expf): x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, scaled by 2^n.
WREN_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.3762626647949f)), _mm512_set1_ps(88.3762626647949f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

/// tanh(x) (Cephes tanhf).
WREN_AVX512 inline __m512 tanh16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745E-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036E-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422E-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 e = exp16(_mm512_add_ps(ax, ax));
  const __m512 big_abs = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  const __m512 big = _mm512_or_ps(big_abs, _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));  // copy the sign
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), big, small);
}

}  // namespace

WREN_AVX512 void situ_avx512(const float* g, const float* u, size_t n, float b1, float b2, float* out) {
  const __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2), one = _mm512_set1_ps(1.0f);
  const __m512 ib1 = _mm512_set1_ps(1.0f / b1), ib2 = _mm512_set1_ps(1.0f / b2);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(int(std::min<size_t>(n - i, 16)));
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
    const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    const __m512 a = _mm512_mul_ps(_mm512_mul_ps(vb1, tanh16(_mm512_mul_ps(gv, ib1))), sig);
    const __m512 b = _mm512_mul_ps(vb2, tanh16(_mm512_mul_ps(uv, ib2)));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(a, b));
  }
}
#else
void situ_avx512(const float* g, const float* u, size_t n, float b1, float b2, float* out) {
  situ_scalar(g, u, n, b1, b2, out);
}
#endif

}  // namespace wren::cpu
