// The weight types of the op contract: dense matrices in a compute format (with their format
// codec: sizes and the reference decode) and routed experts kept packed as MXFP4 exactly as stored. Shapes follow docs/model.md#tensors (PyTorch Linear
// layout [out, in], row-major).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/q4_g64.h"
#include "loader/config.h"

namespace wren {

class Backend;

/// Compute format of a dense matrix, chosen per tensor class at load (model/quant.h). Layouts,
/// row-major [rows, cols] unless stated:
///   F32     float [rows, cols]
///   BF16    uint16 [rows, cols] (the top half of the f32 bits, round-to-nearest-even)
///   Q8_ROW  int8 [rows, cols], scale float [rows]: W[r, c] = q · scale[r], q in [-127, 127]
///   Q4_G64  per row ceil(cols/64) groups of 32 bytes, scale float [rows, groups]. Byte j of a group
///           holds column j in the low nibble and column j + 32 in the high nibble, each as q + 8
///           with q in [-8, 7]; W = q · scale. (The j / j+32 pairing lets a SIMD kernel take 32
///           consecutive columns from one nibble half.) A last partial group is zero-padded (q = 0).
enum class WFormat : uint8_t { F32, BF16, Q8_ROW, Q4_G64 };
constexpr int kWFormats = 4;

/// Role of a dense tensor, the unit the --quant flags choose a format for. Vector = norms, biases,
/// conv taps, A_log, AttnRes projections: always F32. Expert = the routed experts of a model whose
/// experts are dense matrices (Kimi Linear; MXFP4 experts are never re-encoded).
enum class WClass : uint8_t { Vector, Attn, Mla, Dense, Shared, Latent, Router, Head, Embed, Expert };
constexpr int kWClasses = 10;

/// A dense matrix [rows, cols] (or a vector: rows = 1) in a compute format. In the exact mode every
/// dense weight is F32 (BF16/F16 upcast at load, which is exact). `data` and `scale` are host
/// memory, unless `placed_on` names the backend that placed the weight in its own memory at load
/// (Backend::place_dense, e.g. CUDA device memory): then only that backend may read them.
struct DenseWeight {
  DType dtype = DType::F32;  ///< element type of `data` (F32, BF16, I8, U8), always set with `format`
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  WFormat format = WFormat::F32;
  const float* scale = nullptr;  ///< Q8_ROW [rows]; Q4_G64 [rows, q4_groups()]; else null
  const Backend* placed_on = nullptr;  ///< the backend whose memory data/scale are in; null = host
  const float* f32() const { return static_cast<const float*>(data); }  ///< only when format == F32
  int64_t q4_groups() const { return q4::groups(cols); }
};

/// One MXFP4 matrix: logical [rows, cols]; packed [rows, cols/2] u8, scale [rows, cols/32] ue8m0.
struct MxMatrix {
  int rows = 0, cols = 0;
  const uint8_t* packed = nullptr;
  const uint8_t* scale = nullptr;
};

/// One routed expert: w1 (gate) and w3 (up) [moe_inter, io], w2 (down) [io, moe_inter], io = the
/// latent (K3) or hidden size (Kimi Linear). MXFP4 experts use w1/w2/w3 (six tensors stored back
/// to back in `file` at [offset, offset + nbytes) when `contiguous`, docs/model.md#tensors-moe, which the expert
/// store uses for single reads); dense experts (Kimi Linear) use d1/d2/d3.
struct ExpertRef {
  MxMatrix w1, w2, w3;
  DenseWeight d1, d2, d3;
  std::string name;  ///< "model.layers.N.block_sparse_moe.experts.E" (prefix as in the checkpoint)
  std::string file;  ///< shard path
  uint64_t offset = 0, nbytes = 0;
  bool contiguous = false;
};

struct KdaWeights {
  DenseWeight q, k, v;         ///< [P, D]
  DenseWeight q_conv, k_conv, v_conv;  ///< [P, K] (stored [P, 1, K])
  DenseWeight f_a;             ///< [head_dim, D]
  DenseWeight f_b;             ///< [P, head_dim]
  DenseWeight a_log;           ///< [a_log_len], first H entries used
  DenseWeight dt_bias;         ///< [P]
  DenseWeight b;               ///< [H, D]
  DenseWeight g;               ///< [P, D] full-rank output gate (K3)
  DenseWeight g_a, g_b;        ///< [rank, D], [P, rank] low-rank output gate (Kimi Linear)
  DenseWeight o_norm;          ///< [head_dim], shared by all heads
  DenseWeight o;               ///< [D, P]
};

struct MlaWeights {
  DenseWeight q;          ///< [H * (nope + extra), D] when there is no q LoRA (Kimi Linear)
  DenseWeight q_a;        ///< [q_lora, D]
  DenseWeight q_a_norm;   ///< [q_lora]
  DenseWeight q_b;        ///< [H * (nope + extra), q_lora]
  DenseWeight kv_a;       ///< [kv_lora + extra, D]
  DenseWeight kv_a_norm;  ///< [kv_lora]
  DenseWeight kv_b;       ///< [H * (nope + v), kv_lora]
  DenseWeight g;          ///< [H * v, D] output gate (absent without mla_out_gate)
  DenseWeight o;          ///< [D, H * v]
};

struct DenseMlpWeights {
  DenseWeight gate, up;  ///< [inter, D]
  DenseWeight down;      ///< [D, inter]
};

struct MoeWeights {
  DenseWeight router;       ///< [E, D]
  DenseWeight bias;         ///< [E] e_score_correction_bias (selection only)
  DenseWeight down;         ///< [latent, D] routed_expert_down_proj
  DenseWeight norm;         ///< [latent] routed_expert_norm
  DenseWeight up;           ///< [D, latent] routed_expert_up_proj
  DenseWeight shared_gate, shared_up;  ///< [moe_inter * n_shared, D]
  DenseWeight shared_down;  ///< [D, moe_inter * n_shared]
  std::vector<ExpertRef> experts;  ///< [E]
};

/// Every weight a backend may be handed (what a backend places on its device at construction):
/// the dense tensors in one list, and each layer's routed experts. Built by the model (weight_list
/// in model/weights.h); the pointers stay valid while the model lives.
struct WeightList {
  std::vector<const DenseWeight*> dense;               ///< model order; absent ones have data null
  std::vector<const std::vector<ExpertRef>*> experts;  ///< [layer]: that layer's experts (or empty)
};

/// Short names used by flags and run headers: "f32", "bf16", "q8", "q4".
const char* wformat_name(WFormat f);
/// Bytes of `data` for a [rows, cols] matrix in format f (scales excluded).
size_t wformat_data_bytes(WFormat f, int64_t rows, int64_t cols);
/// Floats of `scale` for a [rows, cols] matrix in format f.
size_t wformat_scale_count(WFormat f, int64_t rows, int64_t cols);
/// Decodes row r of W into out[W.cols] (exact decode of the stored values; any format).
void dequant_row(const DenseWeight& W, int64_t r, float* out);

/// Throws wren::Error naming the tensor, row and group if any ue8m0 scale byte of the expert's
/// three matrices is 255 (NaN in OCP MX, never a valid scale) or 253/254 (2^126, 2^127: times the
/// e2m1 maximum 6 the value overflows f32).
void validate_expert_scales(const ExpertRef& e);

}  // namespace wren
