// Loading a checkpoint into ModelWeights through the tensor table (see load.h).
#include "model/load.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/mxfp4.h"
#include "ops/backend.h"
#include "model/quant.h"
#include "model/tensor_table.h"

namespace wren {

float* ModelWeights::alloc(size_t n) {
  arena.emplace_back(new float[n ? n : 1]);
  return arena.back().get();
}

namespace {

void upcast(const TensorRef& r, float* dst) {
  const uint8_t* src = r.data();
  const size_t n = r.info->nbytes / dtype_size(r.info->dtype);
  switch (r.info->dtype) {
    case DType::F32: std::memcpy(dst, src, n * 4); break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      break;
    default: break;  // rejected before
  }
}

/// Throws naming the tensor and the element when `v[0, n)` (the upcast copy of a [rows, cols]
/// tensor) holds a NaN or an infinity: a non-finite weight can only yield NaN logits (issue #19).
/// One pass over floats just written, with a vectorizable test; the message is built on failure only.
/// `first` = the element number of v[0] within the tensor (a block of rows).
void check_finite(const float* v, size_t n, int64_t cols, const std::string& where, size_t first = 0) {
  uint32_t bad = 0;  // an integer OR-reduction: the compiler vectorizes it
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, 4);
    bad |= uint32_t((u & 0x7f800000u) == 0x7f800000u);  // exponent all ones: NaN or ±Inf
  }
  if (!bad) return;
  for (size_t j = 0; j < n; ++j)
    if (!std::isfinite(v[j])) {
      const size_t i = first + j;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", double(v[j]));
      const size_t c = cols > 0 ? size_t(cols) : 1;
      throw Error(where + ": element " + std::to_string(i) + " (row " + std::to_string(i / c) + ", column " +
                  std::to_string(i % c) + ") is " + buf + "; every weight must be a finite number");
    }
}

/// Stores a float tensor in the format its class gets from `plan` (matrices only; vectors stay f32).
void store_dense(ModelWeights& w, const TensorRef& r, const TensorSpec& s, const QuantPlan& plan,
                 const std::string& where) {
  DenseWeight& d = *s.dense;
  const size_t n = r.info->nbytes / dtype_size(r.info->dtype);
  const WFormat f = d.rows > 1 ? plan.of(s.cls, r.info->dtype) : WFormat::F32;
  if (f == WFormat::F32) {
    float* dst = w.alloc(n);
    upcast(r, dst);
    check_finite(dst, n, d.cols, where);
    d.dtype = DType::F32;
    d.data = dst;
    return;
  }
  std::vector<float> tmp(n);
  upcast(r, tmp.data());
  check_finite(tmp.data(), n, d.cols, where);
  void* data = w.alloc((wformat_data_bytes(f, d.rows, d.cols) + 3) / 4);
  const size_t ns = wformat_scale_count(f, d.rows, d.cols);
  float* scale = ns ? w.alloc(ns) : nullptr;
  quantize_matrix(tmp.data(), d.rows, d.cols, f, data, scale);
  d.dtype = f == WFormat::BF16 ? DType::BF16 : f == WFormat::Q8_ROW ? DType::I8 : DType::U8;
  d.data = data;
  d.format = f;
  d.scale = scale;
}

/// Hands a dense matrix to the backend that places it (LoadOptions::place_on). F32: the stored
/// elements as they are (the backend upcasts and checks them). BF16 stored as BF16: the stored
/// bytes (f32_to_bf16 of an upcast finite bf16 value is the value itself, so this is what
/// store_dense would make; the backend checks them). Other formats: converted and checked here as
/// store_dense does, in row blocks of at most kBlockFloats f32 temporaries, into one host buffer
/// of the final size. Stored bytes handed over as they are leave RSS part by part (consumed).
void place_dense(Backend& be, const TensorRef& r, const TensorSpec& s, const QuantPlan& plan,
                 const std::string& where) {
  DenseWeight& d = *s.dense;
  const DType t = r.info->dtype;
  const size_t n = r.info->nbytes / dtype_size(t);
  const WFormat f = plan.of(s.cls, t);
  d.format = f;
  PlaceRequest q;
  q.where = where;
  if (f == WFormat::F32 || (f == WFormat::BF16 && t == DType::BF16)) {
    q.src = r.data(), q.src_dtype = t, q.count = f == WFormat::F32 ? n : n * 2;
    q.consumed = [&r](size_t off, size_t len) { r.file->release_range(r.info->offset + off, len); };
    be.place_dense(d, q);
    return;
  }
  constexpr int64_t kBlockFloats = int64_t(1) << 24;  // 64 MB of f32 per block
  const int64_t block_rows = std::max<int64_t>(1, kBlockFloats / std::max<int64_t>(d.cols, 1));
  std::vector<uint8_t> data(wformat_data_bytes(f, d.rows, d.cols));
  std::vector<float> scale(wformat_scale_count(f, d.rows, d.cols));
  const size_t row_bytes = wformat_data_bytes(f, 1, d.cols), row_scales = wformat_scale_count(f, 1, d.cols);
  std::vector<float> tmp(size_t(std::min(block_rows, d.rows) * d.cols));
  const size_t esz = dtype_size(t);
  for (int64_t r0 = 0; r0 < d.rows; r0 += block_rows) {
    const int64_t nr = std::min(block_rows, d.rows - r0);
    const size_t m = size_t(nr * d.cols);
    TensorInfo part = *r.info;  // the block's rows, as a tensor of its own for upcast
    part.offset += size_t(r0 * d.cols) * esz;
    part.nbytes = m * esz;
    upcast(TensorRef{&part, r.file}, tmp.data());
    r.file->release_range(part.offset, part.nbytes);  // read: its mapped pages can go
    check_finite(tmp.data(), m, d.cols, where, size_t(r0 * d.cols));
    quantize_matrix(tmp.data(), nr, d.cols, f, data.data() + size_t(r0) * row_bytes,
                    row_scales ? scale.data() + size_t(r0) * row_scales : nullptr);
  }
  q.src = data.data(), q.src_dtype = f == WFormat::Q8_ROW ? DType::I8 : DType::U8, q.count = data.size();
  q.scale = scale.empty() ? nullptr : scale.data();
  be.place_dense(d, q);
}

void load_tensor(const TensorRef& r, ModelWeights& w, const TensorSpec& s, const QuantPlan& plan, Backend* place_on) {
  if (!s.is_expert()) {
    const std::string where = r.file->path() + ": tensor '" + r.info->name + "'";
    if (place_on && s.dense->rows > 1) {
      place_dense(*place_on, r, s, plan, where);
      r.file->release_range(r.info->offset, r.info->nbytes);  // streamed out: drop its pages
    } else {
      store_dense(w, r, s, plan, where);
    }
    return;
  }
  *s.bytes = r.data();
  ExpertRef& e = *s.expert;
  if (s.part == 0) {
    e.file = r.file->path();
    e.offset = r.info->offset;
    e.nbytes = r.info->nbytes;
    e.contiguous = true;
  } else {
    e.contiguous = e.contiguous && e.file == r.file->path() && r.info->offset == e.offset + e.nbytes;
    e.nbytes += r.info->nbytes;
  }
}

/// out = norm ⊙ proj (the AttnRes score vector, docs/model.md#attnres).
void mix_vector(ModelWeights& w, const DenseWeight& norm, const DenseWeight& proj, DenseWeight& out) {
  float* v = w.alloc(norm.cols);
  for (int64_t i = 0; i < norm.cols; ++i) v[i] = norm.f32()[i] * proj.f32()[i];
  out = {DType::F32, 1, norm.cols, v};
}

}  // namespace

void derive_attnres_mix(ModelWeights& w) {
  for (LayerWeights& l : w.layers) {
    mix_vector(w, l.attn_res_norm, l.attn_res_proj, l.attn_mix);
    mix_vector(w, l.mlp_res_norm, l.mlp_res_proj, l.mlp_mix);
  }
  mix_vector(w, w.out_res_norm, w.out_res_proj, w.out_mix);
}

void check_tensor(const TensorRef& r, const TensorSpec& s) {
  const std::string where = r.file->path() + ": tensor '" + r.info->name + "'";
  check(r.info->shape == s.shape,
        where + ": shape " + shape_str(r.info->shape) + ", expected " + shape_str(s.shape));
  const DType t = r.info->dtype;
  if (!s.is_expert()) {
    check(t == DType::BF16 || t == DType::F32 || t == DType::F16,
          where + ": dtype " + dtype_name(t) + ", expected BF16, F16 or F32");
    return;
  }
  check(t == DType::U8, where + ": dtype " + std::string(dtype_name(t)) + ", expected U8 (MXFP4 " +
                            (s.kind == TensorKind::ExpertPacked ? "e2m1 pairs" : "ue8m0 scales") + ")");
}

void check_layer_count(const Checkpoint& ck, const Config& c) {
  const std::string stem = "model.layers.";
  for (const auto& [name, _] : ck.weight_map()) {
    const size_t at = name.find(stem);
    if (at == std::string::npos || (at != 0 && at != ck.prefix().size()) || name.compare(0, at, ck.prefix()) != 0)
      continue;  // not a text-model layer tensor (vision tower, projector, ...)
    size_t i = at + stem.size(), n = 0;
    int64_t layer = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && n < 10) layer = layer * 10 + (name[i++] - '0'), ++n;
    if (n == 0 || i >= name.size() || name[i] != '.') continue;
    check(layer < c.n_layers, ck.index_path() + ": tensor '" + name + "' belongs to layer " + std::to_string(layer) +
                                  ", but config.json has num_hidden_layers " + std::to_string(c.n_layers) +
                                  " (layers 0.." + std::to_string(c.n_layers - 1) + "); the checkpoint and config disagree");
  }
}

std::unique_ptr<Model> load_model(const std::string& dir, const QuantPlan& plan) {
  return load_model(dir, plan, LoadOptions{});
}

std::unique_ptr<Model> load_model(const std::string& dir, const QuantPlan& plan, const LoadOptions& o) {
  check(!o.place_on || o.place_on->places_dense(),
        std::string("load: the ") + (o.place_on ? o.place_on->name() : "") + " backend does not place weights");
  auto m = std::make_unique<Model>();
  m->ckpt = std::make_unique<Checkpoint>(dir);
  m->config = m->ckpt->config();
  check_layer_count(*m->ckpt, m->config);
  ModelWeights& w = m->weights;
  // Every tensor located and checked (headers only) before any weight is read; expert tensors are
  // only recorded (their bytes stay in the mapping), the dense ones kept for the second pass (the
  // table's destinations are stable once it has sized the layers and expert lists).
  std::vector<std::pair<TensorSpec, TensorRef>> dense;
  uint64_t total = 0, done = 0;
  for_each_tensor(m->config, w, [&](const TensorSpec& s) {
    const TensorRef r = m->ckpt->require(s.name, s.alt_name);
    check_tensor(r, s);
    if (s.is_expert()) return load_tensor(r, w, s, plan, o.place_on);
    total += r.info->nbytes;
    dense.emplace_back(s, r);
  });
  for (const auto& [s, r] : dense) {
    load_tensor(r, w, s, plan, o.place_on);
    done += r.info->nbytes;
    if (o.progress) o.progress(done, total);
  }
  if (o.place_on) o.place_on->place_finish();
  m->plan = plan;
  m->ckpt->release_pages();  // dense weights are copied; experts are read on demand
  // Expert names as stored (weights.h: "prefix as in the checkpoint"), for error messages.
  for (LayerWeights& l : w.layers)
    for (ExpertRef& e : l.moe.experts) e.name = m->ckpt->prefix() + e.name;
  if (m->config.residual == Residual::AttnRes) derive_attnres_mix(w);
  return m;
}

}  // namespace wren
