// The scalar formulas of a KDA layer that the CPU backend (backends/cpu/kda.cpp) and the CUDA
// kernels (backends/cuda/kda.cu, kda_chunked.cu) share: the causal conv + SiLU of one channel, the
// L2-norm factor, the log decay gate and the β gate (docs/model.md, "KDA"). One text for both
// sides; each side keeps its own exp, as before: the host uses std::exp / std::log1p in f32, CUDA
// device code exp in f64 rounded once (cuda::exp_f) and log1pf. Both builds compile without FMA
// contraction (-ffp-contract=off, nvcc -fmad=false), so an expression here is the same arithmetic
// on each side as it was when written inline. The gate functions take an Exp template argument:
// the default (Exp::F64) is the above; Exp::F32 (CUDA fast precision mode only) makes device code
// use CUDA's accurate f32 expf (≤ 2 ulp, not __expf) instead of the f64 exp; the host ignores it.
#pragma once
#include <cmath>

#include "core/host_device.h"

namespace wren::kda {

/// Which exp device code uses: F64 = exp in f64 rounded once (cuda::exp_f; exact mode, the token
/// kernel's bits), F32 = CUDA expf (≤ 2 ulp; fast mode). The host always uses std::exp in f32.
enum class Exp { F64, F32 };

/// e^x: host std::exp (f32); CUDA device exp in f64 rounded once (as cuda::exp_f), or expf for Exp::F32.
template <Exp E = Exp::F64>
WREN_HD inline float exp_b(float x) {
#if defined(__CUDA_ARCH__)
  if constexpr (E == Exp::F32) return ::expf(x);
  else return float(::exp(double(x)));
#else
  return std::exp(x);
#endif
}

/// log(1 + x): host std::log1p (f32); CUDA device log1pf.
WREN_HD inline float log1p_b(float x) {
#if defined(__CUDA_ARCH__)
  return ::log1pf(x);
#else
  return std::log1p(x);
#endif
}

/// σ(x) = 1 / (1 + e^-x) in f32.
template <Exp E = Exp::F64>
WREN_HD inline float sigmoid_b(float x) { return 1.0f / (1.0f + exp_b<E>(-x)); }

/// Log decay of one key channel, g ≤ 0 (the step decays that key row of S by α = e^g).
/// A = exp(A_log[h]); z = the channel's f projection + dt_bias.
///   softplus false (K3, lower-bound gate):  g = lower · σ(A · z)
///   softplus true (Kimi Linear):            g = −A · softplus(z), softplus(z) = z for z > 20
template <Exp E = Exp::F64>
WREN_HD inline float log_decay(bool softplus, float A, float z, float lower) {
  return softplus ? -A * (z > 20.f ? z : log1p_b(exp_b<E>(z))) : lower * sigmoid_b<E>(A * z);
}

/// β of one head from its projection b: σ(b).
template <Exp E = Exp::F64>
WREN_HD inline float beta_gate(float b) { return sigmoid_b<E>(b); }

/// The factor that L2-normalizes a vector whose Σ v² (in f64) is ss, times `scale`:
/// scale / sqrt(Σ v² + 1e-6) (the 1e-6 inside the root of the sum), rounded to f32 before the scale.
WREN_HD inline float l2_factor(double ss, float scale) { return float(1.0 / ::sqrt(ss + 1e-6)) * scale; }

/// The taps of a channel's conv window, oldest first: tap j of a K-wide conv is the input j − (K−1)
/// tokens back.
struct WindowTaps {
  const float* win;
  WREN_HD float operator()(int j) const { return win[j]; }
};

/// Causal depthwise conv of one channel at one token, then SiLU: acc = wc[K−1]·x + Σ_{j<K−1}
/// wc[j]·tap(j) in that order, y = acc · σ(acc). wc [K], tap K−1 = the current token x.
template <Exp E = Exp::F64, class Tap>
WREN_HD inline float conv_silu(const float* wc, int K, float x, const Tap& tap) {
  float acc = wc[K - 1] * x;
  for (int j = 0; j < K - 1; ++j) acc += wc[j] * tap(j);
  return acc * sigmoid_b<E>(acc);
}

/// Advances a channel's window [K−1] (oldest first) by one token: drops the oldest, appends x.
WREN_HD inline void conv_push(float* win, int K, float x) {
  for (int j = 0; j + 1 < K - 1; ++j) win[j] = win[j + 1];
  if (K > 1) win[K - 2] = x;
}

}  // namespace wren::kda
