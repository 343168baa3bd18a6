// The CPU kernel table: one entry per (kernel family, weight format), filled once for one
// instruction-set level (isa.h) when the backend is built, so ops dispatch on the format once at
// their entry and every kernel is monomorphic. Families live one per file: gemv_f32.cpp,
// gemv_bf16.cpp, gemv_q8.cpp, gemv_q4.cpp, gemv_mxfp4.cpp, vec.cpp (dot/axpy), kda.cpp (state step),
// activation.cpp (SiTU).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cpu/isa.h"
#include "ops/weights.h"

namespace wren::cpu {

/// Dense rows kernel: y[t·ldy + r] = Σ_c W[r, c] · x[t·W.cols + c] for r in [r0, r1), t < T.
/// Each output is computed by the same operation sequence whatever r0, r1 and T (so results do
/// not depend on the thread split or on the chunk size). GEMV is T = 1; a chunk streams W once.
using DenseRowsFn = void (*)(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0,
                             int r1);

/// Activations of one MXFP4 product [T, cols], prepared once per token by mx_prep():
///   f32:  xf [T, cols] in the level's column order (mx_act_pos): natural for Scalar; for AVX2
///         and AVX-512 each 32-column group as [16 even columns | 16 odd columns], the order of
///         a packed group's [low nibbles | high nibbles], so kernels never interleave nibbles.
///   int8: xq [T, cols] in the level's order (mx_act_pos), round(x / xs) with xs [T, cols/32] =
///         max|x| / 127 per 32-column group (zero groups get xs = 0, q = 0); the values are the
///         same at every level. Scalar and AVX2: even/odd per group; AVX-512: each whole block of
///         4 groups as [even halves of its 4 groups | odd halves], the rest even/odd. AVX-512
///         also gets, per token and whole block, xs4 [16] (lane d: xs of group 4b + d/4) and
///         xc [16] int32 (lane d: −12 · Σ of the 8 activations lane d meets), see gemv_mxfp4.cpp.
struct MxAct {
  int T = 0, cols = 0;
  bool int8 = false;
  const float* xf = nullptr;
  const int8_t* xq = nullptr;
  const float* xs = nullptr;
  const float* xs4 = nullptr;    ///< AVX-512 int8: [T, cols/8]
  const int32_t* xc = nullptr;   ///< AVX-512 int8: [T, cols/8]
};

/// Where column c (< cols, cols a multiple of 32) of a token sits in mx_prep's xf (int8 false)
/// or xq (int8 true) at `isa`.
int mx_act_pos(Isa isa, bool int8, int cols, int c);

/// MXFP4 rows kernel: y[t·ldy + r] = Σ_c M[r, c] · x[t, c] for r in [r0, r1), t < a.T, with the
/// same invariance as DenseRowsFn. Scalar f32 is cpu::mx_gemv's order (the reference).
using MxRowsFn = void (*)(const MxMatrix& m, const MxAct& a, float* y, int ldy, int r0, int r1);

/// One KDA head's delta-rule step on S [d, d] (S[key][value]): decay key rows by alpha, read
/// u = kᵀS, write k ⊗ β(v − u), read o = qᵀS (spec kimi-k3.md §4.2 step 6). u, o [d].
using DeltaStepFn = void (*)(float* S, const float* q, const float* k, const float* v,
                             const float* alpha, float beta, int d, float* u, float* o);

/// The kernels of one level.
struct Kernels {
  Isa isa;
  DenseRowsFn dense[kWFormats];  ///< indexed by WFormat
  MxRowsFn mx_f32, mx_i8;
  float (*dot)(const float* a, const float* b, int n);       ///< Σ a·b
  void (*axpy)(float a, const float* x, float* y, int n);   ///< y += a·x
  DeltaStepFn delta_step;
  /// SiTU-GLU: out[i] = situ(g[i], u[i]) over n elements (activation.cpp).
  void (*situ)(const float* g, const float* u, size_t n, float b1, float b2, float* out);
};

/// The table for `isa` (which this CPU must support).
const Kernels& kernels_for(Isa isa);

/// Prepares x [T, cols] (cols a multiple of 32) for the MXFP4 kernels of `isa`, f32 or int8.
/// Buffers are the caller's: fbuf [T·cols] (f32; Scalar uses x itself; int8 on AVX-512 keeps
/// xs4 and xc there), qbuf [T·cols] and sbuf [T·cols/32] (int8).
MxAct mx_prep(Isa isa, const float* x, int T, int cols, bool int8, float* fbuf, int8_t* qbuf,
              float* sbuf);

// ---- per-level entry points (defined in the family files) ----
#define WREN_LEVELS(ret, name, args) \
  ret name##_scalar args;            \
  ret name##_avx2 args;              \
  ret name##_avx512 args;
WREN_LEVELS(void, rows_f32, (const DenseWeight&, const float*, int, float*, int, int, int))
WREN_LEVELS(void, rows_bf16, (const DenseWeight&, const float*, int, float*, int, int, int))
WREN_LEVELS(void, rows_q8, (const DenseWeight&, const float*, int, float*, int, int, int))
WREN_LEVELS(void, rows_q4, (const DenseWeight&, const float*, int, float*, int, int, int))
WREN_LEVELS(void, mx_rows_f32, (const MxMatrix&, const MxAct&, float*, int, int, int))
WREN_LEVELS(void, mx_rows_i8, (const MxMatrix&, const MxAct&, float*, int, int, int))
WREN_LEVELS(float, dot, (const float*, const float*, int))
WREN_LEVELS(void, axpy, (float, const float*, float*, int))
WREN_LEVELS(void, delta_step, (float*, const float*, const float*, const float*, const float*,
                               float, int, float*, float*))
WREN_LEVELS(void, situ, (const float*, const float*, size_t, float, float, float*))
#undef WREN_LEVELS

}  // namespace wren::cpu
