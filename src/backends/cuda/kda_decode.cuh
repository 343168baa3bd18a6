// CUDA backend: the fused KDA decode step (T = 1) of kda_decode.cu; kda.cu routes single-token
// kda_core calls here. Not part of the public interface.
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace wren::cuda {

/// Arguments of one KDA decode step; the same fields (and names) as kda.cu's token-kernel
/// arguments, so one filler serves both. Layout: q, k, v, z, gate, out [P] (P = H·d), beta [H],
/// S [H, d, d] as S[key][value], conv windows [3, P, K-1] oldest first, conv weights [P, K].
struct KdaDecodeArgs {
  const float *q, *k, *v, *z, *beta, *gate;
  const float *q_conv, *k_conv, *v_conv, *a_log, *dt_bias, *o_norm;
  float *S, *conv, *out;
  int H, d, K, T;
  float lower, eps;
  bool softplus_gate;
};

/// Largest head_dim the fused decode kernel takes (a thread keeps one column of S_h in registers).
constexpr int kKdaDecodeMaxDim = 128;
/// Largest conv kernel it takes (the taps and window of a channel are held in registers).
constexpr int kKdaDecodeMaxConv = 8;

/// Runs one decode step of every head as one launch when T == 1, 1 <= d <= kKdaDecodeMaxDim and
/// 1 <= K <= kKdaDecodeMaxConv
/// (returns true); returns false, having launched nothing, otherwise (the caller then uses the
/// token kernel). Throws DeviceError when the launch fails.
bool kda_decode(CudaBackend::Impl& m, const KdaDecodeArgs& a);

}  // namespace wren::cuda
