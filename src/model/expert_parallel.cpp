// Expert parallelism: partition, dispatch and the per-rank routed MoE (see expert_parallel.h).
#include "model/expert_parallel.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "ops/expert_source.h"

namespace wren {

int ExpertShard::owner(int e) const {
  return int(std::upper_bound(bounds.begin() + 1, bounds.end(), e) - (bounds.begin() + 1));
}

std::string ExpertShard::describe() const {
  std::string out = std::to_string(ranks()) + (ranks() == 1 ? " rank: experts " : " ranks: experts ");
  for (int r = 0; r < ranks(); ++r) {
    if (r) out += " | ";
    out += std::to_string(first(r)) + "-" + std::to_string(end(r) - 1);
  }
  return out;
}

ExpertShard shard_experts(int n_experts, int ranks) {
  usage_check(ranks >= 1 && ranks <= n_experts, "--expert-parallel " + std::to_string(ranks) + ": " +
                                                    std::to_string(ranks) + " ranks for " + std::to_string(n_experts) +
                                                    " routed experts (1 to n_experts ranks: every rank owns one at least)");
  ExpertShard s;
  s.bounds.assign(1, 0);
  for (int r = 0; r < ranks; ++r) s.bounds.push_back(s.bounds.back() + n_experts / ranks + (r < n_experts % ranks));
  return s;
}

ExpertShard parse_expert_shard(const std::string& spec, int n_experts) {
  const std::string bad = "--expert-parallel '" + spec + "': ";
  usage_check(!spec.empty() && spec.find_first_not_of("0123456789+") == std::string::npos,
              bad + "expected a rank count (e.g. 2) or experts per rank (e.g. 1+3+12)");
  usage_check(n_experts >= 1, bad + "the model has no routed experts (n_routed_experts is 0)");
  if (spec.find('+') == std::string::npos) {
    usage_check(spec.size() <= 6, bad + "expected 1 to " + std::to_string(n_experts) + " ranks");
    return shard_experts(n_experts, std::stoi(spec));
  }
  ExpertShard s;
  s.bounds.assign(1, 0);
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t plus = std::min(spec.find('+', at), spec.size());
    const std::string part = spec.substr(at, plus - at);
    usage_check(!part.empty() && part.size() <= 6 && std::stoi(part) >= 1, bad + "every rank needs one expert at least");
    s.bounds.push_back(s.bounds.back() + std::stoi(part));
    at = plus + 1;
  }
  usage_check(s.n_experts() == n_experts, bad + "the ranks own " + std::to_string(s.n_experts()) +
                                              " experts, the model has " + std::to_string(n_experts) + " per layer");
  return s;
}

ExpertDispatch plan_dispatch(const ExpertShard& s, const int* ids, int T, int k) {
  ExpertDispatch d;
  d.rows.assign(size_t(s.ranks()), {});
  for (int j = 0; j < T * k; ++j) {
    check(ids[j] >= 0 && ids[j] < s.n_experts(), "expert parallelism: expert id " + std::to_string(ids[j]) +
                                                     " outside [0, " + std::to_string(s.n_experts()) + ")");
    d.rows[size_t(s.owner(ids[j]))].push_back(j);
  }
  return d;
}

namespace {

/// The control words of a layer round, 3 int32 per peer: op, layer, rows that follow.
enum RoundOp : int { Serve = 0, Run = 1, Stop = 2 };

RoutedMoeParams layer_params(const Config& c, int layer) {
  return RoutedMoeParams{layer, c.n_experts, c.top_k, c.expert_io(), c.routed_scale, c.situ_b1, c.situ_b2,
                         c.expert_format, c.act, c.moe_inter};
}

}  // namespace

/// Host bookkeeping and backend buffers of one rank, grown on demand and kept.
struct ExpertParallelMoe::Scratch {
  std::vector<int> ids;                    // [T·k] router output of this rank's tokens
  std::vector<float> wts;                  // [T·k]
  std::vector<int> hdr_out, hdr_in;        // [world, 3]
  std::vector<int> n_out, n_in;            // [world] rows to / from each rank (self included)
  std::vector<size_t> off_out, off_in;     // [world] row offsets of each rank's segment
  std::vector<int> ids_out, ids_in;        // expert id per row, by segment
  std::vector<std::vector<int>> uses;      // [E] received rows per expert
  std::vector<int> unique, in_rows, out_rows;
  std::vector<const ExpertRef*> refs;
  MappedExperts mapped;
  float *send_z = nullptr, *back_y = nullptr, *recv_z = nullptr, *recv_y = nullptr;
  size_t send_cap = 0, back_cap = 0, recvz_cap = 0, recvy_cap = 0;
  float *g = nullptr, *u = nullptr, *act = nullptr;  // [inter] dense experts
};

ExpertParallelMoe::ExpertParallelMoe(const Config& c, Backend& be, Transport& t, ExpertShard shard)
    : c_(c), be_(be), t_(t), shard_(std::move(shard)), s_(std::make_unique<Scratch>()) {
  check(c.n_experts >= 1 && shard_.n_experts() == c.n_experts,
        "expert parallelism: a shard of " + std::to_string(shard_.n_experts()) + " experts for a model with " +
            std::to_string(c.n_experts) + " routed experts per layer");
  check(shard_.ranks() == t.world(), "expert parallelism: a shard over " + std::to_string(shard_.ranks()) +
                                         " ranks on a transport of " + std::to_string(t.world()) + " ranks");
  if (c.expert_format == ExpertFormat::Dense) {
    s_->g = be_.alloc(size_t(c.moe_inter));
    s_->u = be_.alloc(size_t(c.moe_inter));
    s_->act = be_.alloc(size_t(c.moe_inter));
  }
}

ExpertParallelMoe::~ExpertParallelMoe() {
  for (float* p : {s_->send_z, s_->back_y, s_->recv_z, s_->recv_y, s_->g, s_->u, s_->act})
    if (p) be_.release(p);
}

float* ExpertParallelMoe::grow(float*& buf, size_t& cap, size_t n) {
  if (n > cap) {
    if (buf) be_.release(buf);
    buf = nullptr;
    cap = std::max(n, 2 * cap);
    buf = be_.alloc(cap);
  }
  return buf;
}

void ExpertParallelMoe::run(const RoutedMoeParams& p, const MoeWeights& m, const float* logits, const float* z, int T,
                            const RoutedMoeWork& ws, float* out) {
  check(!stopped_, "expert parallelism: this rank told the others to stop");
  check(T >= 0, "expert parallelism: a negative token count");
  Scratch& s = *s_;
  const int K = p.top_k, io = p.io;
  const size_t pairs = size_t(T) * K;
  if (s.ids.size() < pairs) s.ids.resize(pairs), s.wts.resize(pairs);
  if (T > 0) {  // the single-rank rule: router_topk, then × routed_scale (Backend::host_routed_moe)
    be_.router_topk(logits, m.bias, T, p.n_experts, K, s.ids.data(), s.wts.data());
    if (p.routed_scale != 1.f)
      for (size_t j = 0; j < pairs; ++j) s.wts[j] *= p.routed_scale;
  }
  const bool ok = round(Run, p.layer, s.ids.data(), T, z, nullptr, &p, &m, ws.ys);
  check(ok, "expert parallelism: rank " + std::to_string(t_.rank()) + " runs layer " + std::to_string(p.layer) +
                " but another rank has stopped");
  for (int t = 0; t < T; ++t)  // on the token's rank, in slot order (as the single-rank path)
    be_.weighted_sum(ws.ys + size_t(t) * K * io, s.wts.data() + size_t(t) * K, K, io, out + size_t(t) * io);
}

bool ExpertParallelMoe::serve(const Model& model) {
  check(!stopped_, "expert parallelism: this rank told the others to stop");
  return round(Serve, -1, nullptr, 0, nullptr, &model, nullptr, nullptr, nullptr);
}

void ExpertParallelMoe::stop() noexcept {
  if (stopped_) return;
  stopped_ = true;
  try {
    round(Stop, -1, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wren: expert parallelism: telling the other ranks to stop failed: %s\n", e.what());
  }
}

bool ExpertParallelMoe::round(int op, int layer, const int* ids, int T, const float* z, const Model* model,
                              const RoutedMoeParams* p, const MoeWeights* m, float* ys) {
  Scratch& s = *s_;
  const int R = t_.world(), me = t_.rank(), K = c_.top_k, io = c_.expert_io();
  const std::string who = "expert parallelism: rank " + std::to_string(me);
  // 1. Control words: what each rank does this round and how many rows it sends to each other.
  const ExpertDispatch d = T > 0 ? plan_dispatch(shard_, ids, T, K) : ExpertDispatch{std::vector<std::vector<int>>(size_t(R))};
  s.hdr_out.assign(size_t(R) * 3, 0);
  s.hdr_in.assign(size_t(R) * 3, 0);
  std::vector<HostPart> hs, hr;
  for (int q = 0; q < R; ++q) {
    int* h = s.hdr_out.data() + size_t(q) * 3;
    h[0] = op, h[1] = layer, h[2] = int(d.rows[size_t(q)].size());
    if (q == me) continue;
    hs.push_back({q, h, 3});
    hr.push_back({q, s.hdr_in.data() + size_t(q) * 3, 3});
  }
  t_.exchange_host(hs, hr);
  if (op == Stop) return false;
  for (int q = 0; q < R; ++q) {
    if (q == me) continue;
    const int* h = s.hdr_in.data() + size_t(q) * 3;
    if (h[0] == Stop) {
      check(op == Serve, who + " runs layer " + std::to_string(layer) + " but rank " + std::to_string(q) + " has stopped");
      return false;
    }
    check((h[0] == Run && h[1] >= 0 && h[1] < c_.n_layers && h[2] >= 0) || (h[0] == Serve && h[2] == 0),
          who + " got bad control words from rank " + std::to_string(q) + " (op " + std::to_string(h[0]) + ", layer " +
              std::to_string(h[1]) + ", rows " + std::to_string(h[2]) + ")");
    if (h[0] != Run) continue;
    if (layer < 0) layer = h[1];  // a serving rank follows the running ones
    check(h[1] == layer, who + " is at layer " + std::to_string(layer) + ", rank " + std::to_string(q) +
                             " at layer " + std::to_string(h[1]) + " (the ranks are out of step)");
  }
  check(layer >= 0, who + ": every rank serves, none runs a layer (the ranks are out of step)");
  RoutedMoeParams served;
  if (!p) {
    check(model && c_.layers[size_t(layer)].ffn == Ffn::MoE,
          who + ": layer " + std::to_string(layer) + " named by a peer has no routed experts");
    served = layer_params(c_, layer);
    p = &served;
    m = &model->weights.layers[size_t(layer)].moe;
  }
  // Row counts and segment offsets: outgoing rows by destination, incoming rows by source (the
  // rows this rank owns itself are its own segment in both, copied without the transport).
  s.n_out.assign(size_t(R), 0), s.n_in.assign(size_t(R), 0);
  s.off_out.assign(size_t(R), 0), s.off_in.assign(size_t(R), 0);
  size_t tot_out = 0, tot_in = 0;
  for (int q = 0; q < R; ++q) {
    s.n_out[size_t(q)] = int(d.rows[size_t(q)].size());
    s.n_in[size_t(q)] = q == me ? s.n_out[size_t(q)] : s.hdr_in[size_t(q) * 3 + 2];
    s.off_out[size_t(q)] = tot_out, s.off_in[size_t(q)] = tot_in;
    tot_out += size_t(s.n_out[size_t(q)]), tot_in += size_t(s.n_in[size_t(q)]);
    if (q != me) rows_sent_ += uint64_t(s.n_out[size_t(q)]), rows_recv_ += uint64_t(s.n_in[size_t(q)]);
  }
  // 2. Expert ids of the rows, so the owner knows which of its experts each row wants.
  s.ids_out.assign(tot_out, 0), s.ids_in.assign(tot_in, 0);
  for (int q = 0; q < R; ++q)
    for (size_t i = 0; i < d.rows[size_t(q)].size(); ++i) s.ids_out[s.off_out[size_t(q)] + i] = ids[d.rows[size_t(q)][i]];
  std::copy_n(s.ids_out.begin() + long(s.off_out[size_t(me)]), s.n_out[size_t(me)], s.ids_in.begin() + long(s.off_in[size_t(me)]));
  hs.clear(), hr.clear();
  for (int q = 0; q < R; ++q) {
    if (q == me) continue;
    hs.push_back({q, s.ids_out.data() + s.off_out[size_t(q)], size_t(s.n_out[size_t(q)])});
    hr.push_back({q, s.ids_in.data() + s.off_in[size_t(q)], size_t(s.n_in[size_t(q)])});
  }
  t_.exchange_host(hs, hr);
  for (int q = 0; q < R; ++q)
    for (int i = 0; i < s.n_in[size_t(q)]; ++i) {
      const int e = s.ids_in[s.off_in[size_t(q)] + size_t(i)];
      check(e >= shard_.first(me) && e < shard_.end(me),
            who + " got a row of expert " + std::to_string(e) + " from rank " + std::to_string(q) + ", but owns experts " +
                std::to_string(shard_.first(me)) + "-" + std::to_string(shard_.end(me) - 1));
    }
  // 3. The input rows: row j of the pairs reads token j / k of z.
  float* send_z = grow(s.send_z, s.send_cap, std::max<size_t>(tot_out, 1) * size_t(io));
  float* recv_z = grow(s.recv_z, s.recvz_cap, std::max<size_t>(tot_in, 1) * size_t(io));
  float* recv_y = grow(s.recv_y, s.recvy_cap, std::max<size_t>(tot_in, 1) * size_t(io));
  float* back_y = grow(s.back_y, s.back_cap, std::max<size_t>(tot_out, 1) * size_t(io));
  for (int q = 0; q < R; ++q) {
    float* dst = q == me ? recv_z + s.off_in[size_t(me)] * size_t(io) : send_z + s.off_out[size_t(q)] * size_t(io);
    for (size_t i = 0; i < d.rows[size_t(q)].size(); ++i)
      be_.copy(z + size_t(d.rows[size_t(q)][i] / K) * io, size_t(io), dst + i * size_t(io));
  }
  std::vector<TransportPart> fs, fr;
  for (int q = 0; q < R; ++q) {
    if (q == me) continue;
    fs.push_back({q, send_z + s.off_out[size_t(q)] * size_t(io), size_t(s.n_out[size_t(q)]) * size_t(io)});
    fr.push_back({q, recv_z + s.off_in[size_t(q)] * size_t(io), size_t(s.n_in[size_t(q)]) * size_t(io)});
  }
  t_.exchange(be_, fs, fr);
  // 4. This rank's experts on every row it got, each unique expert once with its rows adjacent
  //    (as Backend::host_routed_moe: each output row equals expert_ffn on its input row).
  if (s.uses.size() < size_t(c_.n_experts)) s.uses.resize(size_t(c_.n_experts));
  for (int e : s.unique) s.uses[size_t(e)].clear();
  s.unique.clear();
  for (size_t i = 0; i < tot_in; ++i) {
    const int e = s.ids_in[i];
    if (s.uses[size_t(e)].empty()) s.unique.push_back(e);
    s.uses[size_t(e)].push_back(int(i));
  }
  if (p->format == ExpertFormat::Dense) {
    for (int e : s.unique)
      for (int i : s.uses[size_t(e)]) {
        const ExpertRef& ref = m->experts[size_t(e)];
        be_.gemm(ref.d1, recv_z + size_t(i) * io, 1, s.g);
        be_.gemm(ref.d3, recv_z + size_t(i) * io, 1, s.u);
        if (p->act == Activation::SiTU) be_.situ_glu(s.g, s.u, 1, p->inter, p->b1, p->b2, s.act);
        else be_.silu_glu(s.g, s.u, 1, p->inter, s.act);
        be_.gemm(ref.d2, s.act, 1, recv_y + size_t(i) * io);
      }
  } else if (!s.unique.empty()) {
    ExpertSource* src = be_.expert_source();
    if (!src) {
      s.mapped.bind(layer, m->experts);
      src = &s.mapped;
    }
    src->visit_batches(layer, s.unique, [&](const int* eids, const ExpertRef* const* views, int n) {
      s.refs.clear(), s.in_rows.clear(), s.out_rows.clear();
      for (int i = 0; i < n; ++i)
        for (int row : s.uses[size_t(eids[i])]) {
          s.refs.push_back(views[i]);
          s.in_rows.push_back(row);
          s.out_rows.push_back(row);
        }
      be_.expert_ffn_batch(s.refs.data(), s.in_rows.data(), s.out_rows.data(), int(s.refs.size()), recv_z, p->b1, p->b2,
                           recv_y);
    });
  }
  // 5. The results back to the tokens' ranks, in the order their rows came.
  fs.clear(), fr.clear();
  for (int q = 0; q < R; ++q) {
    if (q == me) continue;
    fs.push_back({q, recv_y + s.off_in[size_t(q)] * size_t(io), size_t(s.n_in[size_t(q)]) * size_t(io)});
    fr.push_back({q, back_y + s.off_out[size_t(q)] * size_t(io), size_t(s.n_out[size_t(q)]) * size_t(io)});
  }
  t_.exchange(be_, fs, fr);
  // 6. Each result to its (token, slot) row of ys, for the slot-order sum.
  for (int q = 0; q < R; ++q) {
    const float* src = q == me ? recv_y + s.off_in[size_t(me)] * size_t(io) : back_y + s.off_out[size_t(q)] * size_t(io);
    for (size_t i = 0; i < d.rows[size_t(q)].size(); ++i)
      be_.copy(src + i * size_t(io), size_t(io), ys + size_t(d.rows[size_t(q)][i]) * io);
  }
  return true;
}

void expert_worker_loop(const Model& model, Backend& be, Transport& t, const ExpertShard& shard) {
  ExpertParallelMoe ep(model.config, be, t, shard);
  while (ep.serve(model)) {
  }
}

}  // namespace wren
