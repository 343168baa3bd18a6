// Load-time formats of the dense weights: the per-class plan behind the --quant flags, the
// quantizers (f32 [rows, cols] -> BF16 / Q8_ROW / Q4_G64, layouts in ops/weights.h); the format
// names, sizes and the reference decode are in ops/weights.h. The MXFP4 routed experts are never
// re-encoded (docs/model.md#mxfp4).
#pragma once
#include <array>
#include <string>

#include "model/weights.h"

namespace wren {

/// Short names used by flags and run headers (wformat_name is in ops/weights.h).
const char* wclass_name(WClass c);    ///< "vector", "attn", "mla", "dense", ...
/// Parses "f32" | "bf16" | "q8" | "q4"; throws wren::Error naming `what` and the accepted values.
WFormat parse_wformat(const std::string& s, const std::string& what);

/// The format of each tensor class. Vector tensors are always F32.
struct QuantPlan {
  std::array<WFormat, kWClasses> format{};  ///< value-initialized: all F32 (exact)
  /// The checkpoint's own dtype (preset "stored", the CLI's default with a GPU in fast precision
  /// mode): a matrix stored as BF16 whose class is F32 here stays BF16 (lossless, no upcast);
  /// other classes and dtypes are as `format` says.
  bool keep_bf16 = false;

  WFormat of(WClass c) const { return c == WClass::Vector ? WFormat::F32 : format[size_t(c)]; }
  /// The format one matrix of class c stored as `stored` is loaded in: of(c), except BF16 for a
  /// BF16-stored matrix of an F32 class under keep_bf16.
  WFormat of(WClass c, DType stored) const {
    const WFormat f = of(c);
    return keep_bf16 && c != WClass::Vector && f == WFormat::F32 && stored == DType::BF16 ? WFormat::BF16 : f;
  }
  void set(WClass c, WFormat f) { format[size_t(c)] = f; }
  bool exact() const;  ///< every class F32 and no BF16 kept
  /// "attn=q4 mla=q8 ..." over the quantizable classes ("as stored (bf16 kept bf16, others f32)"
  /// for the stored preset).
  std::string describe() const;

  /// Presets (docs/cpu-performance.md justifies them):
  ///   exact    every class f32 (the oracle; what the golden tests use)
  ///   bf16     every matrix bf16 (lossless for the BF16 checkpoints), dense routed experts too
  ///   q8       every matrix q8, router and embedding bf16, dense routed experts f32
  ///   default  colibri-like: q4 for attn/latent/shared/dense, q8 for mla and head, router and
  ///            embedding bf16, dense routed experts f32
  ///   q4       every matrix q4, router and embedding bf16, dense routed experts f32
  ///   stored   the checkpoint's dtype: BF16 matrices (dense routed experts too) stay BF16, the
  ///            rest f32 (keep_bf16)
  /// Throws wren::Error on another name.
  static QuantPlan preset(const std::string& name);
};

/// Encodes f32 src [rows, cols] into format f. `data` gets wformat_data_bytes bytes, `scale`
/// wformat_scale_count floats (may be null when that is 0). Round-to-nearest-even, deterministic.
void quantize_matrix(const float* src, int64_t rows, int64_t cols, WFormat f, void* data, float* scale);

}  // namespace wren
