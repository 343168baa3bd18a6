// The decode memory floor (decode_floor.h).
#include "bench/decode_floor.h"

#include <algorithm>
#include <chrono>

#include "model/weights.h"

namespace wren::bench {

double DecodeBytes::total() const {
  double s = outside;
  for (double b : layer) s += b;
  return s;
}

double weight_bytes(const DenseWeight& w) {
  if (!w.data) return 0;  // absent in this model
  return double(wformat_data_bytes(w.format, w.rows, w.cols)) + 4.0 * double(wformat_scale_count(w.format, w.rows, w.cols));
}

double routed_expert_bytes(const Model& m) {
  for (const LayerWeights& l : m.weights.layers)
    if (!l.moe.experts.empty()) {
      const ExpertRef& e = l.moe.experts[0];
      if (e.w1.packed) return double(m.config.expert_bytes());
      return weight_bytes(e.d1) + weight_bytes(e.d2) + weight_bytes(e.d3);
    }
  return 0;
}

DecodeBytes decode_bytes(const Model& m, int position) {
  const Config& c = m.config;
  const ModelWeights& w = m.weights;
  DecodeBytes out;
  const double expert = routed_expert_bytes(m);
  for (int i = 0; i < c.n_layers; ++i) {
    double b = 0;
    for (const DenseWeight* d : weight_list(w, i, i + 1, false, false).dense) b += weight_bytes(*d);
    if (c.layers[i].ffn == Ffn::MoE) b += double(c.top_k) * expert;
    if (c.layers[i].mixer == Mixer::KDA) b += 2.0 * c.kda_heads * c.kda_head_dim * c.kda_head_dim * 4;
    else b += double(position + 1) * c.mla_cache_width() * 4;
    out.layer.push_back(b);
  }
  const WeightList head = weight_list(w, 0, 0, false, true);
  for (const DenseWeight* d : head.dense) out.outside += weight_bytes(*d);
  if (w.embed.data) out.outside += weight_bytes(w.embed) / double(std::max<int64_t>(w.embed.rows, 1));  // one row
  return out;
}

double copy_bandwidth(Backend& be, size_t floats) {
  using clock_type = std::chrono::steady_clock;
  float* a = be.alloc(floats);
  float* b = be.alloc(floats);
  std::vector<double> t;
  float probe;
  for (int i = 0; i < 6; ++i) {
    be.to_host(a, 1, &probe);  // drain the queue
    const auto t0 = clock_type::now();
    be.copy(a, floats, b);
    be.to_host(b, 1, &probe);
    if (i) t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  be.release(a);
  be.release(b);
  std::sort(t.begin(), t.end());
  return 2.0 * double(floats) * 4 / t[t.size() / 2];
}

}  // namespace wren::bench
