// The op contract's weight formats: names, sizes, the reference decode and the MXFP4 scale check
// (see weights.h).
#include "ops/weights.h"

#include <cstring>

#include "core/error.h"
#include "core/mxfp4.h"

namespace wren {

namespace {
constexpr const char* kFormatNames[kWFormats] = {"f32", "bf16", "q8", "q4"};
}  // namespace

const char* wformat_name(WFormat f) { return kFormatNames[size_t(f)]; }

size_t wformat_data_bytes(WFormat f, int64_t rows, int64_t cols) {
  switch (f) {
    case WFormat::F32: return size_t(rows * cols) * 4;
    case WFormat::BF16: return size_t(rows * cols) * 2;
    case WFormat::Q8_ROW: return size_t(rows * cols);
    case WFormat::Q4_G64: return size_t(rows * ((cols + 63) / 64)) * 32;
  }
  return 0;
}

size_t wformat_scale_count(WFormat f, int64_t rows, int64_t cols) {
  if (f == WFormat::Q8_ROW) return size_t(rows);
  if (f == WFormat::Q4_G64) return size_t(rows * ((cols + 63) / 64));
  return 0;
}

void dequant_row(const DenseWeight& W, int64_t r, float* out) {
  const int64_t n = W.cols;
  const uint8_t* d = static_cast<const uint8_t*>(W.data);
  switch (W.format) {
    case WFormat::F32: std::memcpy(out, W.f32() + r * n, size_t(n) * 4); break;
    case WFormat::BF16:
      for (int64_t c = 0; c < n; ++c) {
        uint16_t h;
        std::memcpy(&h, d + (r * n + c) * 2, 2);
        out[c] = bf16_to_f32(h);
      }
      break;
    case WFormat::Q8_ROW:
      for (int64_t c = 0; c < n; ++c) out[c] = float(int8_t(d[r * n + c])) * W.scale[r];
      break;
    case WFormat::Q4_G64: {
      const int64_t groups = W.q4_groups();
      for (int64_t c = 0; c < n; ++c) {
        const int64_t g = c / 64, j = c % 64;
        const uint8_t b = d[(r * groups + g) * 32 + (j & 31)];
        const int q = (j < 32 ? (b & 0xF) : (b >> 4)) - 8;
        out[c] = float(q) * W.scale[r * groups + g];
      }
      break;
    }
  }
}

void validate_expert_scales(const ExpertRef& e) {
  const struct { const MxMatrix* m; const char* stem; } parts[] = {{&e.w1, "w1"}, {&e.w2, "w2"}, {&e.w3, "w3"}};
  // e.file is the shard of w1.weight_packed: name it only when all six tensors are stored there.
  const std::string file = e.contiguous ? e.file + ": " : "";
  for (const auto& p : parts) {
    const int groups = p.m->cols / mxfp4::kGroup;
    // Fast path (this runs on an expert's first use, inside decode): no 255 byte anywhere.
    if (!std::memchr(p.m->scale, mxfp4::kBadScale, size_t(p.m->rows) * groups)) continue;
    for (int r = 0; r < p.m->rows; ++r)
      for (int g = 0; g < groups; ++g)
        if (p.m->scale[size_t(r) * groups + g] == mxfp4::kBadScale)  // message built only on failure
          throw Error(file + "tensor '" + e.name + "." + p.stem + ".weight_scale': row " + std::to_string(r) +
                      ", group " + std::to_string(g) + ": ue8m0 scale byte 255 (NaN in OCP MX) is not a valid scale");
  }
}

}  // namespace wren
