// CUDA backend: the fused KDA decode step (T = 1) of kda_decode.cu; kda.cu routes single-token
// kda_core calls (and CudaBackend::kda_decode_batch) here. Not part of the public interface.
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace wren::cuda {

/// Arguments of one KDA decode step; the same fields (and names) as kda.cu's token-kernel
/// arguments, so one filler serves both. Layout: q, k, v, z, gate, out [P] (P = H·d), beta [H],
/// S [H, d, d] as S[key][value], conv windows [3, P, K-1] oldest first, conv weights [P, K].
/// Batched (kda_decode_batch): q, k, v, z, gate, out [B, P], beta [B, H]; S and conv unused.
struct KdaDecodeArgs {
  const float *q, *k, *v, *z, *beta, *gate;
  const float *q_conv, *k_conv, *v_conv, *a_log, *dt_bias, *o_norm;
  float *S, *conv, *out;
  int H, d, K, T;
  float lower, eps;
  bool softplus_gate;
  bool fast;  ///< fast precision mode: f32 exps and tree sums in the split form (else the token kernel's bits)
};

/// Largest head_dim the fused decode kernel takes (a thread keeps one column of S_h in registers).
constexpr int kKdaDecodeMaxDim = 128;
/// Largest conv kernel it takes (the taps and window of a channel are held in registers).
constexpr int kKdaDecodeMaxConv = 8;
/// Sequences per launch of the batched step (their state pointers travel as a kernel parameter).
constexpr int kKdaDecodeMaxBatch = 32;

/// The states of one batched launch: sequence b updates S[b] [H, d, d] and conv[b] [3, P, K-1].
struct KdaDecodeStates {
  float* S[kKdaDecodeMaxBatch];
  float* conv[kKdaDecodeMaxBatch];
};

/// Runs one decode step of every head as one launch when T == 1, 1 <= d <= kKdaDecodeMaxDim and
/// 1 <= K <= kKdaDecodeMaxConv (returns true); returns false, having launched nothing, otherwise
/// (the caller then uses the token kernel). Throws DeviceError when the launch fails.
bool kda_decode(CudaBackend::Impl& m, const KdaDecodeArgs& a);

/// One decode step of each of B (1..kKdaDecodeMaxBatch) sequences with distinct states `st`, as
/// one launch of the split form, when it applies (d <= kKdaDecodeMaxDim, K <= 4; returns true);
/// returns false, having launched nothing, otherwise. Throws DeviceError when the launch fails.
bool kda_decode_batch(CudaBackend::Impl& m, const KdaDecodeArgs& a, const KdaDecodeStates& st, int B);

/// Tells the decode step's launch rule that a KDA kernel other than the decode step (token or
/// chunked form) was just launched on the state at S (bytes long): the next decode step on that
/// state must not read it before that kernel completes (docs/gpu-method.md#kda-decode).
void kda_note_launch(CudaBackend::Impl& m, const float* S, size_t bytes);

}  // namespace wren::cuda
