// The checkpoint writer (see synth.h). Dtypes as in docs/model.md#tensors: F32 for A_log, dt_bias,
// conv weights, o_norm and the router correction bias; BF16 for every other dense tensor; U8 for
// the MXFP4 experts, whose six tensors are written back to back.
#include "synth/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mxfp4.h"
#include "loader/config.h"
#include "model/tensor_table.h"

namespace wren {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// splitmix64: a tiny, portable generator so files are identical on every platform.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float((next() >> 40) * (1.0 / (1ull << 24))); }   // [0, 1)
  float symmetric() { return 2.f * uniform() - 1.f; }                         // [-1, 1)
};

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char ch : name) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

struct Planned {
  std::string name;  // full name as written
  std::string key;   // name without prefix: seeds the contents (independent of prefix/sharding)
  DType dtype;
  std::vector<int64_t> shape;
  TensorKind kind;
  int rows = 0, cols = 0;  // logical MXFP4 matrix (experts)
  int heads = 0;           // A_log: real entries
  uint64_t nbytes = 0;
};

DType float_dtype(const std::string& n) {
  for (const char* f : {"A_log", "dt_bias", "conv1d.weight", "o_norm.weight", "e_score_correction_bias"})
    if (ends_with(n, f)) return DType::F32;
  return DType::BF16;
}

/// Values of one dense tensor, by role.
std::vector<float> dense_values(const Planned& p, Rng& r) {
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  const std::string& s = p.name;
  const float fan_in = float(p.shape.back());
  if (ends_with(s, "A_log")) {
    for (int64_t i = 0; i < n; ++i) v[i] = i < p.heads ? std::log(1.f + 15.f * r.uniform()) : 0.f;
  } else if (ends_with(s, "dt_bias") || ends_with(s, "e_score_correction_bias")) {
    for (auto& x : v) x = 0.05f * r.symmetric();
  } else if (ends_with(s, "conv1d.weight")) {
    for (auto& x : v) x = 0.6f * r.symmetric();
  } else if (ends_with(s, "norm.weight") || ends_with(s, "layernorm.weight")) {
    for (auto& x : v) x = 1.f + 0.2f * r.symmetric();
  } else if (ends_with(s, "embed_tokens.weight")) {
    for (auto& x : v) x = 1.7f * r.symmetric();
  } else {  // Linear [out, in] and the [1, D] AttnRes projections: uniform with std 1/sqrt(in)
    const float a = std::sqrt(3.f / fan_in);
    for (auto& x : v) x = a * r.symmetric();
  }
  return v;
}

std::vector<uint8_t> tensor_bytes(const Planned& p, uint64_t seed) {
  Rng r{name_seed(seed, p.key)};
  std::vector<uint8_t> out(p.nbytes);
  if (p.kind == TensorKind::ExpertPacked) {
    for (auto& b : out) b = uint8_t(r.next());
  } else if (p.kind == TensorKind::ExpertScale) {
    // RMS of a uniform random e2m1 code is ~2.93; aim for weights of std ~ 1/sqrt(cols).
    const int base = 127 + int(std::lround(std::log2(1.0 / (2.93 * std::sqrt(double(p.cols)))))) - 1;
    for (auto& b : out) b = uint8_t(base + int(r.next() % 3));
  } else {
    const std::vector<float> v = dense_values(p, r);
    if (p.dtype == DType::F32) {
      std::memcpy(out.data(), v.data(), out.size());
    } else {
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
  }
  return out;
}

void write_shard(const std::string& path, const std::vector<Planned>& ts, uint64_t seed) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const Planned& p : ts) {
    h[p.name] = {{"dtype", dtype_name(p.dtype)}, {"shape", p.shape}, {"data_offsets", {off, off + p.nbytes}}};
    off += p.nbytes;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  check(bool(f), path + ": cannot create");
  const uint64_t n = hs.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(hs.data(), std::streamsize(n));
  for (const Planned& p : ts) {
    const std::vector<uint8_t> b = tensor_bytes(p, seed);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
  check(bool(f), path + ": write failed");
}

}  // namespace

void write_synthetic_checkpoint(const json& config, const std::string& dir, const SynthOptions& o) {
  const Config c = parse_config(config, "--config");
  fs::create_directories(dir);
  {
    std::ofstream f(dir + "/config.json");
    f << config.dump(1) << "\n";
    check(bool(f), dir + "/config.json: write failed");
  }
  const std::string pfx = o.prefix ? "language_model." : "";
  // Plan in units that never straddle a shard: one dense tensor, or one expert's six tensors.
  // Per layer: dense tensors, then experts in shuffled order; globals go last, as in the release
  // (embedding, norms and lm_head in the last text shard).
  using Unit = std::vector<Planned>;
  std::vector<std::vector<Unit>> dense_units(c.n_layers + 1), expert_units(c.n_layers);
  ModelWeights w;
  for_each_tensor(c, w, [&](const TensorSpec& s) {
    Planned p{pfx + s.name, s.name, s.is_expert() ? DType::U8 : float_dtype(s.name), s.shape, s.kind};
    uint64_t n = 1;
    for (int64_t d : s.shape) n *= uint64_t(d);
    p.nbytes = n * dtype_size(p.dtype);
    p.heads = c.kda_heads;
    if (s.is_expert()) {
      const MxMatrix& m = s.part < 2 ? s.expert->w1 : s.part < 4 ? s.expert->w2 : s.expert->w3;
      p.rows = m.rows, p.cols = m.cols;
      auto& ex = expert_units[s.layer];
      if (s.part == 0) ex.emplace_back();
      ex.back().push_back(p);
    } else {
      dense_units[s.layer < 0 ? c.n_layers : s.layer].push_back({p});
    }
  });
  Rng shuffle{o.seed ^ 0x5bd1e995ull};
  std::vector<Unit> units;
  for (int i = 0; i <= c.n_layers; ++i) {
    units.insert(units.end(), dense_units[i].begin(), dense_units[i].end());
    if (i == c.n_layers) break;
    auto& ex = expert_units[i];
    if (o.shuffle_experts)
      for (size_t j = ex.size(); j > 1; --j) std::swap(ex[j - 1], ex[shuffle.next() % j]);
    units.insert(units.end(), ex.begin(), ex.end());
  }
  std::vector<std::vector<Planned>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const Unit& u : units) {
    if (cur >= o.shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    for (const Planned& p : u) {
      shards.back().push_back(p);
      cur += p.nbytes;
      total += p.nbytes;
    }
  }
  const int n_text = int(shards.size()), n_all = n_text + (o.vision_shard ? 1 : 0);
  auto shard_name = [&](int k) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%06d.safetensors", k + 1, n_all);
    return std::string(buf);
  };
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
  for (int k = 0; k < n_text; ++k) {
    write_shard(dir + "/" + shard_name(k), shards[k], o.seed);
    for (const Planned& p : shards[k]) index["weight_map"][p.name] = shard_name(k);
  }
  if (o.vision_shard) {
    std::vector<Planned> vis = {{"vision_tower.patch_embed.weight", "vision", DType::F16, {8, 8}, TensorKind::Float}};
    vis[0].nbytes = 128;
    write_shard(dir + "/" + shard_name(n_text), vis, o.seed);
    index["weight_map"][vis[0].name] = shard_name(n_text);
  }
  std::ofstream f(dir + "/model.safetensors.index.json");
  f << index.dump(1) << "\n";
  check(bool(f), dir + "/model.safetensors.index.json: write failed");
}

}  // namespace wren
