// The per-level kernel tables (see kernels.h).
#include "backends/cpu/kernels.h"
#include "backends/cpu/simd.h"

namespace wren::cpu {

const Kernels& kernels_for(Isa isa) {
  static const Kernels scalar{Isa::Scalar,
                              {rows_f32_scalar, rows_bf16_scalar, rows_q8_scalar, rows_q4_scalar},
                              mx_rows_f32_scalar, mx_rows_i8_scalar, dot_scalar, axpy_scalar,
                              delta_step_scalar, situ_scalar};
#if WREN_X86
  static const Kernels avx2{Isa::Avx2,
                            {rows_f32_avx2, rows_bf16_avx2, rows_q8_avx2, rows_q4_avx2},
                            mx_rows_f32_avx2, mx_rows_i8_avx2, dot_avx2, axpy_avx2, delta_step_avx2, situ_avx2};
  static const Kernels avx512{Isa::Avx512,
                              {rows_f32_avx512, rows_bf16_avx512, rows_q8_avx512, rows_q4_avx512},
                              mx_rows_f32_avx512, mx_rows_i8_avx512, dot_avx512, axpy_avx512,
                              delta_step_avx512, situ_avx512};
  if (isa == Isa::Avx512) return avx512;
  if (isa == Isa::Avx2) return avx2;
#endif
  return scalar;
}

}  // namespace wren::cpu
