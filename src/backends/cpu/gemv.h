// The one GEMV/GEMM skeleton per SIMD level, shared by every weight format (gemv_f32.cpp,
// gemv_bf16.cpp, gemv_q8.cpp, gemv_q4.cpp, gemv_mxfp4.cpp). A kernel is RowsAvx512<F> or
// RowsAvx2<F>: the skeleton owns the register blocking (R rows x N tokens of vector
// accumulators, driven by drive_rows in simd.h), the walk along a row in steps, and the final
// horizontal sums; the format hooks F own only what differs: how one step of a row is decoded,
// how one token's activations for that step are loaded, and the multiply-add that folds them into
// an accumulator. Each instantiation is an ordinary monomorphic kernel (the op picks it once, at
// its entry, from the kernel table in kernels.h).
//
// Per output (row, token) the instruction sequence is the format's own: acc starts at zero, each
// step does madd(decode(row, step), xload(token, step), acc), then tail, then
// finish(hsum(acc)). Nothing depends on which block a row or token falls in.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cpu/simd.h"
#include "ops/weights.h"

namespace wren::cpu {

/// No state carried across a row's steps (the usual case).
struct NoCarry {};

/// Defaults for the format hooks: the step index as the step's context, no carry, no vector
/// tail, the sum stored as it is. A format hook struct F derives from this and provides:
///   using W, X                 one row's decoded weights / one token's activations for one step
///   using Carry                per-row state kept across the steps (NoCarry unless needed)
///   int steps() const          steps along a row
///   S step(int s) const        what every row and token of step s shares (default: s itself;
///                              e.g. the column and the tail mask), computed once per step
///   template <int R, int N> void decode(int r, S, Carry&, W&) const   (prefetch + decode)
///   void xload(int t, S, X&) const
///   void madd(const W&, const X&, int r, S, V& acc) const
///   template <int R, int N> void tail(int r, int t, V (&acc)[R][N]) const  (after the steps)
///   float finish(float sum, int r, int t) const                            (scalar tail, scale)
/// and the members y (output) and ldy (its token stride).
struct RowHooks {
  using Carry = NoCarry;
  int step(int s) const { return s; }
  template <int R, int N, class V>
  void tail(int, int, V (&)[R][N]) const {}
  float finish(float s, int, int) const { return s; }
};

#if WREN_X86
/// The AVX-512 skeleton: __m512 accumulators.
template <class F>
struct RowsAvx512 : F {
  template <int R, int N>
  WREN_AVX512 void block(int r, int t) const {
    __m512 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
    typename F::Carry carry[R]{};
    const int steps = this->steps();
    for (int s = 0; s < steps; ++s) {
      const auto st = this->step(s);
      typename F::W w[R];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) this->template decode<R, N>(r + i, st, carry[i], w[i]);
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        typename F::X x;
        this->xload(t + j, st, x);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) this->madd(w[i], x, r + i, st, acc[i][j]);
      }
    }
    this->template tail<R, N>(r, t, acc);
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) this->y[size_t(t + j) * this->ldy + r + i] = this->finish(hsum(acc[i][j]), r + i, t + j);
  }
};

/// The AVX2 skeleton: __m256 accumulators, otherwise RowsAvx512's walk.
template <class F>
struct RowsAvx2 : F {
  template <int R, int N>
  WREN_AVX2 void block(int r, int t) const {
    __m256 acc[R][N];
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) acc[i][j] = _mm256_setzero_ps();
    typename F::Carry carry[R]{};
    const int steps = this->steps();
    for (int s = 0; s < steps; ++s) {
      const auto st = this->step(s);
      typename F::W w[R];
      WREN_UNROLL
      for (int i = 0; i < R; ++i) this->template decode<R, N>(r + i, st, carry[i], w[i]);
      WREN_UNROLL
      for (int j = 0; j < N; ++j) {
        typename F::X x;
        this->xload(t + j, st, x);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) this->madd(w[i], x, r + i, st, acc[i][j]);
      }
    }
    this->template tail<R, N>(r, t, acc);
    WREN_UNROLL
    for (int i = 0; i < R; ++i)
      WREN_UNROLL
      for (int j = 0; j < N; ++j) this->y[size_t(t + j) * this->ldy + r + i] = this->finish(hsum(acc[i][j]), r + i, t + j);
  }
};

/// Hooks for a dense format whose weights widen one by one to f32 (F32, BF16, Q8_ROW), given by
/// an element policy D: `using E` (stored element), `static float value(E)`, `kScaled` (× a
/// per-row scale at the end), `prefetch(p, c, block_bytes)`, `widen16(p, mask)` (AVX-512),
/// `widen8(p)` (AVX2), and for AVX2 `kVectorTail` (masked vector tail, F32 only) or else a scalar
/// tail in finish. Layout: W [rows, cols] of E; x [T, cols] f32; y[t·ldy + r].
template <class D>
struct ElemArgs : RowHooks {
  const typename D::E* w;
  const float* scale;  ///< [rows] when D::kScaled
  const float* x;
  float* y;
  int cols, ldy;
  const typename D::E* at(int r, int c) const { return w + size_t(r) * cols + c; }
};

/// AVX-512: steps of 16 columns, the last one masked.
template <class D>
struct ElemAvx512 : ElemArgs<D> {
  using W = __m512;
  using X = __m512;
  struct Step {
    int c;         ///< first column
    __mmask16 m;   ///< its columns (all 16 but in the last step)
  };
  int steps() const { return (this->cols + 15) / 16; }
  WREN_AVX512 Step step(int s) const { return {16 * s, lanes16(this->cols - 16 * s)}; }
  template <int R, int N>
  WREN_AVX512 void decode(int r, Step st, NoCarry&, W& wv) const {
    D::prefetch(this->at(r, st.c), st.c, size_t(R) * this->cols);
    wv = D::widen16(this->at(r, st.c), st.m);
  }
  WREN_AVX512 void xload(int t, Step st, X& xv) const {
    xv = _mm512_maskz_loadu_ps(st.m, this->x + size_t(t) * this->cols + st.c);
  }
  WREN_AVX512 void madd(const W& wv, const X& xv, int, Step, __m512& acc) const { acc = _mm512_fmadd_ps(wv, xv, acc); }
  float finish(float s, int r, int) const {
    if constexpr (D::kScaled) return s * this->scale[r];
    else return s;
  }
};

/// AVX2: steps of 8 whole columns; the rest by a masked vector step (D::kVectorTail) or in scalar.
template <class D>
struct ElemAvx2 : ElemArgs<D> {
  using W = __m256;
  using X = __m256;
  int steps() const { return this->cols / 8; }
  template <int R, int N>
  WREN_AVX2 void decode(int r, int s, NoCarry&, W& wv) const {
    const int c = 8 * s;
    D::prefetch(this->at(r, c), c, size_t(R) * this->cols);
    wv = D::widen8(this->at(r, c));
  }
  WREN_AVX2 void xload(int t, int s, X& xv) const { xv = _mm256_loadu_ps(this->x + size_t(t) * this->cols + 8 * s); }
  WREN_AVX2 void madd(const W& wv, const X& xv, int, int, __m256& acc) const { acc = _mm256_fmadd_ps(wv, xv, acc); }
  template <int R, int N>
  WREN_AVX2 void tail(int r, int t, __m256 (&acc)[R][N]) const {
    if constexpr (D::kVectorTail) {
      const int c = this->cols / 8 * 8;
      if (c < this->cols) {
        const __m256i m = lanes8(this->cols - c);
        WREN_UNROLL
        for (int i = 0; i < R; ++i) {
          const __m256 wv = D::widen8_masked(this->at(r + i, c), m);
          WREN_UNROLL
          for (int j = 0; j < N; ++j)
            acc[i][j] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(this->x + size_t(t + j) * this->cols + c, m), acc[i][j]);
        }
      }
    }
  }
  float finish(float s, int r, int t) const {
    if constexpr (!D::kVectorTail)
      for (int c = this->cols / 8 * 8; c < this->cols; ++c) s += D::value(*this->at(r, c)) * this->x[size_t(t) * this->cols + c];
    if constexpr (D::kScaled) return s * this->scale[r];
    else return s;
  }
};

/// The element-format kernels at each level: register blocks of 4 rows x 4 tokens (AVX-512) or
/// 4 x 2 (AVX2), 4 rows at T = 1. W.data holds D::E; W.scale is read only when D::kScaled.
template <class D>
void elem_rows_avx512(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const ElemArgs<D> a{{}, static_cast<const typename D::E*>(W.data), W.scale, x, y, int(W.cols), ldy};
  drive_rows<4, 4>(RowsAvx512<ElemAvx512<D>>{{{a}}}, T, r0, r1);
}
template <class D>
void elem_rows_avx2(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const ElemArgs<D> a{{}, static_cast<const typename D::E*>(W.data), W.scale, x, y, int(W.cols), ldy};
  drive_rows<4, 2>(RowsAvx2<ElemAvx2<D>>{{{a}}}, T, r0, r1);
}
#endif

/// The scalar reference of an element format: per (row, token) eight partial sums over
/// c ≡ j (mod 8), then ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)), times the row scale when D::kScaled.
template <class D>
void elem_rows_scalar(const DenseWeight& W, const float* x, int T, float* y, int ldy, int r0, int r1) {
  const typename D::E* w = static_cast<const typename D::E*>(W.data);
  const float* scale = W.scale;
  const int cols = int(W.cols);
  for (int t = 0; t < T; ++t)
    for (int r = r0; r < r1; ++r) {
      const typename D::E* wr = w + size_t(r) * cols;
      const float* xt = x + size_t(t) * cols;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int c = 0; c < cols; ++c) acc[c & 7] += D::value(wr[c]) * xt[c];
      const float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      if constexpr (D::kScaled) y[size_t(t) * ldy + r] = s * scale[r];
      else y[size_t(t) * ldy + r] = s;
    }
}

}  // namespace wren::cpu
