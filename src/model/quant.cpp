// Load-time dense-weight formats (see quant.h; layouts in weights.h).
#include "model/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/q4_g64.h"

namespace wren {

namespace {

constexpr const char* kClassNames[kWClasses] = {"vector", "attn",   "mla",  "dense", "shared",
                                                "latent", "router", "head", "embed", "expert"};

/// One row to Q8_ROW: scale = max|w| / 127, q = w / scale rounded to nearest (ties to even).
void q8_row(const float* w, int64_t cols, int8_t* q, float* scale) {
  float amax = 0;
  for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[c]));
  const float s = amax / 127.0f;
  *scale = s;
  const float inv = s > 0 ? 1.0f / s : 0.0f;
  for (int64_t c = 0; c < cols; ++c)
    q[c] = int8_t(std::clamp(std::nearbyint(w[c] * inv), -127.0f, 127.0f));
}

/// One group of n <= 64 values to Q4_G64: the value of largest magnitude m maps to q = -8
/// (scale = m / -8, as llama.cpp's Q4_0), the rest round to nearest (ties to even) in [-8, 7].
void q4_group(const float* w, int n, uint8_t* out32, float* scale) {
  float m = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(w[i]) > std::fabs(m)) m = w[i];
  const float s = m / -8.0f;
  *scale = s;
  const float inv = s != 0 ? 1.0f / s : 0.0f;
  int q[q4::kGroupCols];  // padded columns: q = 0
  for (int i = 0; i < q4::kGroupCols; ++i) q[i] = i < n ? int(std::clamp(std::nearbyint(w[i] * inv), -8.0f, 7.0f)) : 0;
  for (int j = 0; j < q4::kGroupBytes; ++j) out32[j] = q4::pack(q[j], q[j + 32]);
}

}  // namespace

const char* wclass_name(WClass c) { return kClassNames[size_t(c)]; }

WFormat parse_wformat(const std::string& s, const std::string& what) {
  for (int i = 0; i < kWFormats; ++i)
    if (s == wformat_name(WFormat(i))) return WFormat(i);
  throw UsageError(what + ": '" + s + "' is not a weight format (expected f32, bf16, q8 or q4)");
}

bool QuantPlan::exact() const {
  return !keep_bf16 && std::all_of(format.begin(), format.end(), [](WFormat f) { return f == WFormat::F32; });
}

std::string QuantPlan::describe() const {
  if (keep_bf16 && std::all_of(format.begin(), format.end(), [](WFormat f) { return f == WFormat::F32; }))
    return "as stored (bf16 matrices kept bf16, others f32)";
  std::string s;
  for (int c = 1; c < kWClasses; ++c)
    s += std::string(c > 1 ? " " : "") + kClassNames[c] + "=" + wformat_name(of(WClass(c)));
  return s;
}

QuantPlan QuantPlan::preset(const std::string& name) {
  QuantPlan p;
  auto all = [&](WFormat f) {
    for (int c = 1; c < kWClasses; ++c) p.set(WClass(c), f);
  };
  if (name == "exact") return p;
  if (name == "stored") {
    p.keep_bf16 = true;
    return p;
  }
  if (name == "bf16") {
    all(WFormat::BF16);
    return p;
  }
  if (name == "q8" || name == "q4" || name == "default") {
    all(name == "q8" ? WFormat::Q8_ROW : WFormat::Q4_G64);
    if (name == "default") {
      p.set(WClass::Mla, WFormat::Q8_ROW);
      p.set(WClass::Head, WFormat::Q8_ROW);
    }
    p.set(WClass::Router, WFormat::BF16);
    p.set(WClass::Embed, WFormat::BF16);
    // Dense routed experts stay f32 here: the GPU's device-routed expert kernels read f32 or BF16
    // experts only (q8/q4 experts would be routed on the host), and these presets' measured quality
    // (docs/cpu-performance.md) was taken with f32 experts. --quant-expert q8|q4 chooses otherwise.
    p.set(WClass::Expert, WFormat::F32);
    return p;
  }
  throw UsageError("--quant: '" + name + "' is not a preset (expected exact, stored, bf16, q8, default or q4)");
}

void quantize_matrix(const float* src, int64_t rows, int64_t cols, WFormat f, void* data, float* scale) {
  uint8_t* out = static_cast<uint8_t*>(data);
  const int64_t groups = q4::groups(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = src + r * cols;
    switch (f) {
      case WFormat::F32: std::memcpy(out + r * cols * 4, w, size_t(cols) * 4); break;
      case WFormat::BF16:
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t h = f32_to_bf16(w[c]);
          std::memcpy(out + (r * cols + c) * 2, &h, 2);
        }
        break;
      case WFormat::Q8_ROW: q8_row(w, cols, reinterpret_cast<int8_t*>(out) + r * cols, scale + r); break;
      case WFormat::Q4_G64:
        for (int64_t g = 0; g < groups; ++g)
          q4_group(w + g * 64, int(std::min<int64_t>(64, cols - g * 64)), out + (r * groups + g) * 32,
                   scale + r * groups + g);
        break;
    }
  }
}

}  // namespace wren
