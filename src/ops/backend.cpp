// The routed MoE's host-routed reference and the fallback bookkeeping of the op contract (see
// backend.h). The instruction order is the forward pass's before routed_moe became one op, so
// CPU results are bit-identical to it.
#include "ops/backend.h"

#include <cstdio>
#include <vector>

#include "core/argmax.h"
#include "core/error.h"

namespace wren {

/// Host bookkeeping of host_routed_moe, grown on first use and kept: router output, expert ->
/// its (token·k + slot) entries, the chunk's unique experts in first-use order, one batch's
/// (expert, in row, out row) triples, and the mapped source used when none was set.
struct Backend::HostMoe {
  std::vector<int> ids;
  std::vector<float> wts;
  std::vector<std::vector<int>> uses;
  std::vector<int> unique, in_rows, out_rows;
  std::vector<const ExpertRef*> refs;
  MappedExperts mapped;
};

Backend::Backend() = default;
Backend::~Backend() = default;

void Backend::add_rms_norm(float* y, const float* x, int T, int n, const DenseWeight& w, float eps, float* out) {
  add(y, x, size_t(T) * size_t(n));
  rms_norm(y, T, n, w, eps, out);
}

void Backend::add2(float* y, float* x, const float* x2, size_t n) {
  add(x, x2, n);
  add(y, x, n);
}

void Backend::add2_rms_norm(float* y, float* x, const float* x2, int T, int n, const DenseWeight& w, float eps,
                            float* out) {
  add(x, x2, size_t(T) * size_t(n));
  add_rms_norm(y, x, T, n, w, eps, out);
}

void Backend::gemm_mapped(const DenseWeight& W, const float* a, const InputMap& map, int T, float* x, float* y) {
  const size_t n = size_t(T) * size_t(W.cols);
  switch (map.kind) {
    case InputMap::Kind::SiluGlu: silu_glu(a, map.b, T, int(W.cols), x); break;
    case InputMap::Kind::SituGlu: situ_glu(a, map.b, T, int(W.cols), map.b1, map.b2, x); break;
    case InputMap::Kind::SigmoidGate:
      if (x != a) copy(a, n, x);
      sigmoid_gate(x, map.b, n);
      break;
  }
  gemm(W, x, T, y);
}

void Backend::gemm_batch(const GemmJob* jobs, int n, int T) {
  for (int i = 0; i < n; ++i) gemm(*jobs[i].W, jobs[i].x, T, jobs[i].y);
}

void Backend::kda_decode_batch(const KdaParams& p, const KdaWeights& w, KdaState* const* states, int B,
                               const float* q, const float* k, const float* v, const float* z, const float* beta,
                               const float* gate, float* out) {
  const size_t P = size_t(p.heads) * size_t(p.head_dim), H = size_t(p.heads);
  for (int b = 0; b < B; ++b) {
    const size_t o = size_t(b);
    check(states[b] != nullptr, "kda_decode_batch: the state of sequence " + std::to_string(b) + " is null");
    kda_core(p, w, *states[b], q + o * P, k + o * P, v + o * P, z + o * P, beta + o * H, gate + o * P, 1, out + o * P);
  }
}

void check_mla_batch(MlaCache* const* caches, int B) {
  check(B >= 0, "mla_decode_batch: B = " + std::to_string(B) + " (must be >= 0)");
  for (int b = 0; b < B; ++b) {
    check(caches[b] != nullptr, "mla_decode_batch: the cache of sequence " + std::to_string(b) + " is null");
    if (caches[b]->length + 1 > caches[b]->capacity)
      throw Error("context limit reached: the MLA cache holds " + std::to_string(caches[b]->capacity) +
                  " tokens (raise --ctx)");
    for (int t = 0; t < b; ++t)
      check(caches[t] != caches[b], "mla_decode_batch: sequences " + std::to_string(t) + " and " + std::to_string(b) +
                                        " share one cache");
  }
}

void Backend::mla_decode_batch(const MlaParams& p, const MlaWeights& w, MlaCache* const* caches, int B,
                               const float* q, const float* ckv, float* ctx) {
  const size_t Q = size_t(p.heads) * size_t(p.nope + p.extra), W = size_t(p.kv_lora + p.extra),
               C = size_t(p.heads) * size_t(p.v_head);
  check_mla_batch(caches, B);
  for (int b = 0; b < B; ++b) {
    const size_t o = size_t(b);
    mla_attend(p, w, *caches[b], q + o * Q, ckv + o * W, 1, ctx + o * C);
  }
}

void Backend::embed_ids(const DenseWeight& table, const float* ids, int T, float* x) {
  std::vector<float> f(static_cast<size_t>(T));
  to_host(ids, f.size(), f.data());
  std::vector<int> h(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) {
    const float id = f[size_t(t)];
    check(id >= 0.f && id < float(table.rows) && id == float(int(id)),
          "embed_ids: id " + std::to_string(id) + " at row " + std::to_string(t) + " is outside the vocabulary [0, " +
              std::to_string(table.rows) + ")");
    h[size_t(t)] = int(id);
  }
  embed(table, h.data(), T, x);
}

void Backend::argmax_rows(const float* x, int rows, int cols, float* out) {
  check(cols >= 1 && cols <= (1 << 24), "argmax_rows: " + std::to_string(cols) +
                                            " columns; a float holds every index exactly only up to 2^24");
  std::vector<float> h(size_t(rows) * size_t(cols)), ids(static_cast<size_t>(rows));
  to_host(x, h.size(), h.data());
  for (int r = 0; r < rows; ++r) ids[size_t(r)] = float(finite_argmax(h.data() + size_t(r) * size_t(cols), cols));
  from_host(ids.data(), ids.size(), out);
}

void Backend::place_dense(DenseWeight& w, const PlaceRequest& r) {
  (void)w;
  throw Error(std::string(name()) + " backend: " + r.where + ": this backend does not place weights (places_dense() is false)");
}

void Backend::note_fallback(const std::string& what) {
  ++fallbacks_;
  if (strict_)
    throw Error(std::string(name()) + " backend: " + what + " (--strict forbids slow fallbacks)");
  if (!fallback_logged_) {
    fallback_logged_ = true;
    std::fprintf(stderr, "wren: %s backend: %s (slower path; later fallbacks are counted, not logged)\n", name(),
                 what.c_str());
  }
}

void Backend::host_routed_moe(const RoutedMoeParams& p, const MoeWeights& m, const float* logits, const float* z,
                              int T, const RoutedMoeWork& ws, float* out) {
  if (!host_moe_) host_moe_ = std::make_unique<HostMoe>();
  HostMoe& h = *host_moe_;
  const int K = p.top_k, io = p.io;
  const size_t pairs = size_t(T) * K;
  if (h.ids.size() < pairs) h.ids.resize(pairs), h.wts.resize(pairs);
  router_topk(logits, m.bias, T, p.n_experts, K, h.ids.data(), h.wts.data());
  if (p.routed_scale != 1.f)
    for (size_t j = 0; j < pairs; ++j) h.wts[j] *= p.routed_scale;
  // Each unique expert once over the chunk (batch union); outputs land per (token, slot) so the
  // weighted sum below runs in slot order whatever the grouping or the source's visiting order.
  if (h.uses.size() < size_t(p.n_experts)) h.uses.resize(size_t(p.n_experts));
  for (int e : h.unique) h.uses[e].clear();
  h.unique.clear();
  for (size_t j = 0; j < pairs; ++j) {
    const int e = h.ids[j];
    if (h.uses[e].empty()) h.unique.push_back(e);
    h.uses[e].push_back(int(j));
  }
  {  // traffic: each unique expert once (Backend::expert_traffic)
    auto mx = [](const MxMatrix& w) { return uint64_t(w.rows) * uint64_t(w.cols) / 2 + uint64_t(w.rows) * uint64_t(w.cols / 32); };
    auto dn = [](const DenseWeight& w) { return uint64_t(w.rows) * uint64_t(w.cols) * dtype_size(w.dtype); };
    for (int e : h.unique) {
      if (size_t(e) >= m.experts.size()) continue;  // no shape at hand (not expected): not counted
      const ExpertRef& r = m.experts[size_t(e)];
      traffic_.bytes += p.format == ExpertFormat::Dense ? dn(r.d1) + dn(r.d2) + dn(r.d3) : mx(r.w1) + mx(r.w2) + mx(r.w3);
    }
    traffic_.visits += h.unique.size();
  }
  if (p.format == ExpertFormat::Dense) {  // dense experts are resident weights
    for (int e : h.unique)
      for (int j : h.uses[e]) {
        const ExpertRef& ref = m.experts[e];
        gemm(ref.d1, z + size_t(j / K) * io, 1, ws.g);
        gemm(ref.d3, z + size_t(j / K) * io, 1, ws.u);
        if (p.act == Activation::SiTU) situ_glu(ws.g, ws.u, 1, p.inter, p.b1, p.b2, ws.act);
        else silu_glu(ws.g, ws.u, 1, p.inter, ws.act);
        gemm(ref.d2, ws.act, 1, ws.ys + size_t(j) * io);
      }
  } else {
    ExpertSource* src = experts_;
    if (!src) {
      h.mapped.bind(p.layer, m.experts);
      src = &h.mapped;
    }
    src->visit_batches(p.layer, h.unique, [&](const int* ids, const ExpertRef* const* views, int n) {
      // Every expert the source hands over at once in one call (so the backend can run them
      // concurrently), each with all its tokens adjacent: the backend streams it once for them.
      h.refs.clear(), h.in_rows.clear(), h.out_rows.clear();
      for (int i = 0; i < n; ++i)
        for (int j : h.uses[ids[i]]) {
          h.refs.push_back(views[i]);
          h.in_rows.push_back(j / K);
          h.out_rows.push_back(j);
        }
      expert_ffn_batch(h.refs.data(), h.in_rows.data(), h.out_rows.data(), int(h.refs.size()), z, p.b1, p.b2, ws.ys);
    });
  }
  for (int t = 0; t < T; ++t)
    weighted_sum(ws.ys + size_t(t) * K * io, h.wts.data() + size_t(t) * K, K, io, out + size_t(t) * io);
}

}  // namespace wren
