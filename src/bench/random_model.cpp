// Random-weight models in memory (see random_model.h). Filling is split over threads: a K3-sized
// layer pair is several GB of f32.
#include "bench/random_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/error.h"
#include "loader/config.h"
#include "model/load.h"
#include "model/tensor_table.h"

namespace wren {

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Fills dst[n] with uniform values in [lo, hi) from `seed`, in parallel; deterministic.
void fill_uniform(float* dst, size_t n, float lo, float hi, uint64_t seed) {
  const unsigned threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  const size_t per = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      uint64_t s = mix64(seed + 0x9e3779b97f4a7c15ull * (t + 1));
      const size_t end = std::min(n, (t + 1) * per);
      for (size_t i = t * per; i < end; ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
        dst[i] = lo + (hi - lo) * float((s >> 40) * (1.0 / (1ull << 24)));
      }
    });
  for (auto& th : pool) th.join();
}

void fill_bytes(uint8_t* dst, size_t n, uint8_t lo, uint8_t hi, uint64_t seed) {
  uint64_t s = mix64(seed) | 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    dst[i] = uint8_t(lo + (s >> 32) % (unsigned(hi) - lo + 1));
  }
}

}  // namespace

std::unique_ptr<Model> make_random_model(const nlohmann::json& config, uint64_t seed, int distinct_experts,
                                         const QuantPlan& plan) {
  check(distinct_experts >= 1, "random model: distinct_experts must be at least 1");
  auto m = std::make_unique<Model>();
  m->config = parse_config(config, "random model config");
  ModelWeights& w = m->weights;
  std::map<std::pair<int, int>, uint8_t*> pool;  // (pool entry, part) -> bytes
  std::map<std::pair<int, int>, const DenseWeight*> dense_pool;  // (pool entry, matrix) -> dense expert matrix
  uint64_t index = 0;
  for_each_tensor(m->config, w, [&](const TensorSpec& s) {
    ++index;
    size_t n = 1;
    for (int64_t d : s.shape) n *= size_t(d);
    if (!s.is_expert()) {
      DenseWeight& d = *s.dense;
      std::pair<int, int> key{-1, 0};
      if (s.expert) {  // a dense routed expert's matrix: pooled like the MXFP4 experts
        const auto& experts = w.layers[s.layer].moe.experts;
        key = {int(s.expert - experts.data()) % distinct_experts, s.dense == &s.expert->d1 ? 0 : s.dense == &s.expert->d2 ? 1 : 2};
        if (const auto it = dense_pool.find(key); it != dense_pool.end()) {
          d.dtype = it->second->dtype, d.data = it->second->data, d.format = it->second->format, d.scale = it->second->scale;
          return;
        }
      }
      const WFormat f = d.rows > 1 ? plan.of(s.cls) : WFormat::F32;
      std::vector<float> tmp;
      float* dst = f == WFormat::F32 ? w.alloc(n) : (tmp.resize(n), tmp.data());
      const bool norm = s.name.find("norm") != std::string::npos;
      if (norm) fill_uniform(dst, n, 0.9f, 1.1f, seed * 1000003 + index);
      else if (s.shape.size() == 1) fill_uniform(dst, n, -0.1f, 0.1f, seed * 1000003 + index);
      else {
        const float a = 1.0f / std::sqrt(float(d.cols));
        fill_uniform(dst, n, -a, a, seed * 1000003 + index);
      }
      d.dtype = DType::F32, d.data = dst, d.format = WFormat::F32, d.scale = nullptr;
      if (f != WFormat::F32) {
        void* data = w.alloc((wformat_data_bytes(f, d.rows, d.cols) + 3) / 4);
        const size_t ns = wformat_scale_count(f, d.rows, d.cols);
        float* scale = ns ? w.alloc(ns) : nullptr;
        quantize_matrix(dst, d.rows, d.cols, f, data, scale);
        d.dtype = f == WFormat::BF16 ? DType::BF16 : f == WFormat::Q8_ROW ? DType::I8 : DType::U8;
        d.data = data, d.format = f, d.scale = scale;
      }
      if (s.expert) dense_pool[key] = &d;
      return;
    }
    const auto& experts = w.layers[s.layer].moe.experts;
    const int e = int(s.expert - experts.data());
    const std::pair<int, int> key{e % distinct_experts, s.part};
    uint8_t*& bytes = pool[key];
    if (!bytes) {
      bytes = reinterpret_cast<uint8_t*>(w.alloc((n + 3) / 4));
      if (s.kind == TensorKind::ExpertScale) fill_bytes(bytes, n, 118, 124, seed * 7919 + index);
      else fill_bytes(bytes, n, 0, 255, seed * 7919 + index);
    }
    *s.bytes = bytes;
  });
  derive_attnres_mix(w);
  return m;
}

}  // namespace wren
