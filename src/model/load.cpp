// Loading a checkpoint into ModelWeights through the tensor table (see load.h).
#include "model/load.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/mxfp4.h"
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

/// Stores a float tensor in the format its class gets from `plan` (matrices only; vectors stay f32).
void store_dense(ModelWeights& w, const TensorRef& r, const TensorSpec& s, const QuantPlan& plan) {
  DenseWeight& d = *s.dense;
  const size_t n = r.info->nbytes / dtype_size(r.info->dtype);
  const WFormat f = d.rows > 1 ? plan.of(s.cls) : WFormat::F32;
  if (f == WFormat::F32) {
    float* dst = w.alloc(n);
    upcast(r, dst);
    d.dtype = DType::F32;
    d.data = dst;
    return;
  }
  std::vector<float> tmp(n);
  upcast(r, tmp.data());
  void* data = w.alloc((wformat_data_bytes(f, d.rows, d.cols) + 3) / 4);
  const size_t ns = wformat_scale_count(f, d.rows, d.cols);
  float* scale = ns ? w.alloc(ns) : nullptr;
  quantize_matrix(tmp.data(), d.rows, d.cols, f, data, scale);
  d.dtype = f == WFormat::BF16 ? DType::BF16 : f == WFormat::Q8_ROW ? DType::I8 : DType::U8;
  d.data = data;
  d.format = f;
  d.scale = scale;
}

void load_tensor(Checkpoint& ck, ModelWeights& w, const TensorSpec& s, const QuantPlan& plan) {
  const TensorRef r = ck.require(s.name, s.alt_name);
  const std::string where = r.file->path() + ": tensor '" + r.info->name + "'";
  check(r.info->shape == s.shape,
        where + ": shape " + shape_str(r.info->shape) + ", expected " + shape_str(s.shape));
  if (!s.is_expert()) {
    const DType t = r.info->dtype;
    check(t == DType::BF16 || t == DType::F32 || t == DType::F16,
          where + ": dtype " + dtype_name(t) + ", expected BF16, F16 or F32");
    store_dense(w, r, s, plan);
    return;
  }
  check(r.info->dtype == DType::U8, where + ": dtype " + std::string(dtype_name(r.info->dtype)) +
                                        ", expected U8 (MXFP4 " +
                                        (s.kind == TensorKind::ExpertPacked ? "e2m1 pairs" : "ue8m0 scales") + ")");
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

/// out = norm ⊙ proj (the AttnRes score vector, spec §4.1).
void mix_vector(ModelWeights& w, const DenseWeight& norm, const DenseWeight& proj, DenseWeight& out) {
  float* v = w.alloc(norm.cols);
  for (int64_t i = 0; i < norm.cols; ++i) v[i] = norm.f32()[i] * proj.f32()[i];
  out = {DType::F32, 1, norm.cols, v};
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir, const QuantPlan& plan) {
  auto m = std::make_unique<Model>();
  m->ckpt = std::make_unique<Checkpoint>(dir);
  m->config = m->ckpt->config();
  ModelWeights& w = m->weights;
  for_each_tensor(m->config, w, [&](const TensorSpec& s) { load_tensor(*m->ckpt, w, s, plan); });
  m->plan = plan;
  m->ckpt->release_pages();  // dense weights are copied; experts are read on demand
  // Expert names as stored (weights.h: "prefix as in the checkpoint"), for error messages.
  for (LayerWeights& l : w.layers)
    for (ExpertRef& e : l.moe.experts) e.name = m->ckpt->prefix() + e.name;
  if (m->config.residual == Residual::AttnRes) {
    for (LayerWeights& l : w.layers) {
      mix_vector(w, l.attn_res_norm, l.attn_res_proj, l.attn_mix);
      mix_vector(w, l.mlp_res_norm, l.mlp_res_proj, l.mlp_mix);
    }
    mix_vector(w, w.out_res_norm, w.out_res_proj, w.out_mix);
  }
  return m;
}

}  // namespace wren
