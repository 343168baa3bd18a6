// CUDA backend: dense weights in the packed compute formats BF16 / Q8_ROW / Q4_G64 (layouts in
// ops/weights.h), read directly from their device copies: the GEMV/GEMM (gemm_quant.cu) and a
// per-element decode for the ops that need f32 rows (embed, the MLA kv_b absorb).
#pragma once
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "core/q4_g64.h"
#include "ops/weights.h"

namespace wren::cuda {

/// Device view of one packed dense matrix [rows, cols]: `data` as stored (uint16 bf16 bits, int8,
/// or the Q4_G64 groups), `scale` f32 (Q8_ROW [rows], Q4_G64 [rows, ceil(cols/64)], BF16 null).
struct QuantView {
  WFormat format = WFormat::F32;
  const void* data = nullptr;
  const float* scale = nullptr;
  int rows = 0, cols = 0;
};

/// The device copies of w's data and scale (both mirrored by CudaBackend::upload); throws
/// wren::Error naming `op` when either was never uploaded.
QuantView quant_view(const CudaBackend::Impl& m, const DenseWeight& w, const char* op);

/// W[r, c] decoded to f32 exactly as dequant_row (ops/weights.cpp) does: bf16 bits << 16, q · scale.
__device__ __forceinline__ float quant_at(const QuantView& v, int r, int c) {
  switch (v.format) {
    case WFormat::BF16:
      return __uint_as_float(uint32_t(static_cast<const uint16_t*>(v.data)[size_t(r) * v.cols + c]) << 16);
    case WFormat::Q8_ROW:
      return float(static_cast<const int8_t*>(v.data)[size_t(r) * v.cols + c]) * v.scale[r];
    case WFormat::Q4_G64: {
      const int groups = int(q4::groups(v.cols)), g = c >> 6;
      const int q = q4::q_at(static_cast<const uint8_t*>(v.data) + (size_t(r) * groups + g) * q4::kGroupBytes, c & 63);
      return float(q) * v.scale[size_t(r) * groups + g];
    }
    default:
      return static_cast<const float*>(v.data)[size_t(r) * v.cols + c];
  }
}

/// y[T, rows] = x[T, cols] · Wᵀ for a packed W (f32 accumulation), on `stream`. x, y device f32.
void launch_gemm_quant(const QuantView& w, const float* x, int T, float* y, cudaStream_t stream);
/// out[n, cols] (f32) = rows ids[0..n) of W decoded; `ids` a device array, or null for rows 0..n.
void launch_decode_rows(const QuantView& w, const int* ids, int n, float* out, cudaStream_t stream);
/// out[cols] (f32) = row `row` of W decoded (a host-known row: no id copy, so graph-capturable).
void launch_decode_row(const QuantView& w, int row, float* out, cudaStream_t stream);
/// launch_decode_rows with the ids as floats in device memory (argmax_rows' output: embed_ids);
/// an id outside [0, rows) decodes row 0.
void launch_decode_rows_f(const QuantView& w, const float* ids, int n, float* out, cudaStream_t stream);

/// Row index of a float id (argmax_rows' output) in a table of `rows` rows: row 0 when it is
/// outside [0, rows) (-1 flags a non-finite row; Backend::embed_ids).
__device__ __forceinline__ int float_row(float id, int rows) {
  return id >= 0.f && id < float(rows) ? int(id) : 0;
}

}  // namespace wren::cuda
