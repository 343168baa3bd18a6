// The Kimi K3 forward pass (see forward.h). Reads like the block diagram: mix → norm → KDA or MLA →
// mix → norm → dense FFN or LatentMoE, then the final mix, norm and lm_head (docs/model.md#forward).
#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/argmax.h"
#include "core/error.h"

namespace wren {

/// Activation buffers [max_chunk, width], allocated from the backend once. Without a backend it
/// only counts (Forward::workspace_bytes).
struct Forward::Buffers {
  Backend* be;
  std::vector<float*> all;
  size_t floats = 0;
  explicit Buffers(Backend* b) : be(b) {}
  ~Buffers() {
    for (float* p : all) be->release(p);
  }
  float* make(size_t n) {
    floats += n;
    if (!be) return nullptr;
    all.push_back(be->alloc(n));
    return all.back();
  }
  void plan(const Config& c, size_t T);
  // Driver
  float* P = nullptr;                 // running block sum [T, D]
  std::vector<float*> blocks;         // AttnRes snapshots, each [T, D]
  float *mixed, *nrm, *att, *ffn, *tmp;  // [T, D]
  // KDA
  float *q, *k, *v, *fa, *ga, *z, *beta, *gate, *o;
  // MLA
  float *qa, *qan, *qfull, *ckv, *ctx, *mgate;
  // FFN
  float *g, *u, *act;                 // [T, max(inter)]
  float *rlog, *lat, *ys, *lsum, *lnorm;
  float* plog = nullptr;              // [T, E] next layer's router logits (ForwardOptions::predict)
  // Host list of the mix entries, sized once so that a step allocates nothing (the routed MoE's
  // host bookkeeping lives with the backend: Backend::host_routed_moe).
  std::vector<const float*> entries;
  // Head
  float *hnorm, *logits;
  float* greedy;  // [T]: argmax_rows of the head rows (run_mixed entries asking for greedy ids)
};

Forward::Forward(const Model& model, Backend& backend, ForwardOptions opts)
    : model_(model), cfg_(model.config), be_(backend), opts_(opts) {
  const Config& c = cfg_;
  check(opts.layers <= c.n_layers, "--layers " + std::to_string(opts.layers) + ": the model has only " +
                                       std::to_string(c.n_layers) + " layers (num_hidden_layers)");
  n_layers_ = opts.layers < 0 ? c.n_layers : opts.layers;
  check(opts_.max_chunk >= 1, "--chunk must be at least 1");
  check(opts_.first_layer == 0 || (opts_.first_layer > 0 && opts_.first_layer < n_layers_),  // 0 layers: allowed
        "pipeline stage: first layer " + std::to_string(opts_.first_layer) + " outside [0, " +
            std::to_string(n_layers_) + ")");
  check((opts_.first_layer == 0 || opts_.link.prev >= 0) &&
            (opts_.link.transport != nullptr || (opts_.link.prev < 0 && opts_.link.next < 0)),
        "pipeline stage: a stage after the first needs a transport and the rank it receives from");
  blocks0_ = snapshots_before(c, opts_.first_layer);
  if (opts_.experts.transport)
    ep_ = std::make_unique<ExpertParallelMoe>(c, be_, *opts_.experts.transport, opts_.experts.shard);
  buf_ = std::make_unique<Buffers>(&be_);
  buf_->plan(c, opts_.max_chunk);
  for (int i = opts_.first_layer; i < n_layers_; ++i)
    if (c.layers[i].ffn == Ffn::MoE) step_moe_.push_back({routed_params(i), &model.weights.layers[i].moe});
  next_moe_.assign(size_t(n_layers_), -1);
  if (c.expert_format == ExpertFormat::MXFP4)
    for (int i = n_layers_ - 2, next = -1; i >= 0; --i) {
      if (c.layers[i + 1].ffn == Ffn::MoE) next = i + 1;
      next_moe_[i] = next;
    }
}

int Forward::snapshots_before(const Config& c, int layer) {
  int n = 0;
  for (int i = 0; i < layer; ++i) n += c.layers[size_t(i)].snapshot ? 1 : 0;
  return n;
}

void Forward::recv_boundary(int T) {
  Buffers& b = *buf_;
  const size_t n = size_t(T) * cfg_.hidden;
  Transport& t = *opts_.link.transport;
  t.recv(be_, b.P, n, opts_.link.prev);
  for (int k = 0; k < blocks0_; ++k) t.recv(be_, b.blocks[size_t(k)], n, opts_.link.prev);
}

void Forward::send_boundary(int T, int n_blocks) {
  Buffers& b = *buf_;
  const size_t n = size_t(T) * cfg_.hidden;
  Transport& t = *opts_.link.transport;
  t.send(be_, b.P, n, opts_.link.next);
  for (int k = 0; k < n_blocks; ++k) t.send(be_, b.blocks[size_t(k)], n, opts_.link.next);
}

size_t Forward::workspace_bytes(const Config& c, int max_chunk) {
  Buffers b(nullptr);
  b.plan(c, max_chunk);
  return b.floats * sizeof(float);
}

void Forward::Buffers::plan(const Config& c, size_t T) {
  Buffers& b = *this;
  const size_t D = c.hidden, P = c.kda_width();
  b.P = b.make(T * D);
  b.blocks.resize(c.max_mix_entries());
  for (auto& blk : b.blocks) blk = b.make(T * D);
  b.mixed = b.make(T * D), b.nrm = b.make(T * D), b.att = b.make(T * D);
  b.ffn = b.make(T * D), b.tmp = b.make(T * D);
  b.q = b.make(T * P), b.k = b.make(T * P), b.v = b.make(T * P), b.z = b.make(T * P);
  b.gate = b.make(T * P), b.o = b.make(T * P);
  b.fa = b.make(T * c.kda_head_dim), b.beta = b.make(T * c.kda_heads);
  b.ga = b.make(T * std::max(c.kda_gate_rank, 1));
  b.qa = b.make(T * c.q_lora), b.qan = b.make(T * c.q_lora);
  b.qfull = b.make(T * c.mla_heads * c.mla_q_head()), b.ckv = b.make(T * c.mla_cache_width());
  b.ctx = b.make(T * c.mla_heads * c.v_head), b.mgate = b.make(T * c.mla_heads * c.v_head);
  const size_t inter = std::max({c.dense_inter, c.shared_inter(), c.moe_inter});
  b.g = b.make(T * inter), b.u = b.make(T * inter), b.act = b.make(T * inter);
  const size_t io = c.expert_io();
  b.rlog = b.make(T * c.n_experts), b.lat = b.make(T * io);
  if (c.expert_format == ExpertFormat::MXFP4) b.plog = b.make(T * c.n_experts);
  b.ys = b.make(T * c.top_k * io), b.lsum = b.make(T * io), b.lnorm = b.make(T * io);
  if (b.be) b.entries.reserve(c.max_mix_entries() + 1);  // host only
  b.hnorm = b.make(T * D), b.logits = b.make(T * size_t(c.vocab));
  b.greedy = b.make(T);
}

Forward::~Forward() = default;

namespace {

/// Index of the first NaN or ±Inf in v[0, n), or n when all are finite. The scan is an integer
/// OR-reduction the compiler vectorizes (V floats per decode step: far below the lm_head GEMV).
size_t first_non_finite(const float* v, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, 4);
    bad |= uint32_t((u & 0x7f800000u) == 0x7f800000u);  // exponent all ones
  }
  if (!bad) return n;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) return i;
  return n;
}

std::string value_str(float x) { return std::isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf"; }

}  // namespace

void Forward::check_rows(const float* host, int T, size_t width, int pos0, const std::string& what) const {
  const size_t n = size_t(T) * width, at = first_non_finite(host, n);
  if (at == n) return;
  throw Error(value_str(host[at]) + " in " + what + " at token position " + std::to_string(pos0 + int(at / width)) +
              ", element " + std::to_string(at % width) +
              (opts_.check_finite ? std::string(" (found by --check-finite)")
                                  : std::string("; run again with --check-finite to name the first layer that "
                                                "produced it")));
}

void Forward::run(SequenceState& st, const int* ids, const float* x0, int T, float* logits,
                  bool all_logits, const ForwardHooks* hooks) {
  check(st.holds(be_, opts_.first_layer, n_layers_), "forward: the sequence state belongs to another backend");
  const size_t V = cfg_.vocab, D = cfg_.hidden;
  if (x0) {
    const size_t n = size_t(T) * D, at = first_non_finite(x0, n);
    check(at == n, "x0 (the input embeddings) row " + std::to_string(at / D) + ", column " + std::to_string(at % D) +
                       " is " + value_str(x0[at < n ? at : 0]) + "; every value must be finite");
  }
  for (int t0 = 0; t0 < T; t0 += opts_.max_chunk) {
    const int n = std::min(opts_.max_chunk, T - t0);
    float* out = chunk_logits(logits, all_logits, t0, n, T, V);
    chunk(st, ids + t0, x0 ? x0 + t0 * D : nullptr, n, t0, out, all_logits, hooks);
  }
}

void run_entry(TokenStep& step, const BatchEntry& e) {
  if (!e.greedy) return step.run(*e.st, e.ids, nullptr, e.n, e.logits, false);
  const int V = step.config().vocab;
  std::vector<float> own;
  float* row = e.logits;
  if (!row) own.resize(size_t(V)), row = own.data();
  step.run(*e.st, e.ids, nullptr, e.n, row, false);  // throws on non-finite logits
  *e.greedy = argmax(row, V);
}

void Forward::run_batch(SequenceState* const* states, const int* ids, int B, float* logits) {
  for (int b = 0; b < B; ++b) {
    check(states[b]->holds(be_, opts_.first_layer, n_layers_), "forward: a sequence state of the batch belongs to another backend");
    for (int c = 0; c < b; ++c)
      check(states[c] != states[b], "forward: sequence state " + std::to_string(b) + " of the batch is also entry " +
                                        std::to_string(c) + " (one token per sequence per step)");
  }
  const size_t V = cfg_.vocab;
  for (int g0 = 0; g0 < B; g0 += opts_.max_chunk) {
    const int n = std::min(opts_.max_chunk, B - g0);
    segs_.clear();
    for (int b = 0; b < n; ++b) segs_.push_back({states[g0 + b], b, 1});
    if (opts_.link.prev >= 0) recv_boundary(n);  // before a recorded step: the transport may wait
    const bool recorded = be_.step_begin(step_info(n, nullptr, nullptr));
    try {
      chunk_ops(ids + g0, nullptr, n, 0, logits ? logits + size_t(g0) * V : nullptr, true, nullptr, recorded);
    } catch (...) {
      if (recorded) be_.step_abort();
      throw;
    }
  }
}

void Forward::run_mixed(const BatchEntry* entries, int n) {
  for (int i = 0; i < n; ++i) {
    check(entries[i].st->holds(be_, opts_.first_layer, n_layers_), "forward: a sequence state of the step belongs to another backend");
    check(entries[i].n >= 1, "forward: entry " + std::to_string(i) + " of the step has no tokens");
    for (int j = 0; j < i; ++j)
      check(entries[j].st != entries[i].st, "forward: sequence state " + std::to_string(i) + " of the step is also entry " +
                                                std::to_string(j) + " (one part per sequence per step)");
  }
  const size_t V = cfg_.vocab;
  const int C = opts_.max_chunk;
  // Groups of at most C rows, in entry order; an entry may continue into the next group (its
  // state advances in between, so the order of its tokens is kept).
  std::vector<float*> outs;  // per head row of the group: where its logits go (null: greedy id only)
  int i = 0, done = 0;       // entry i has `done` of its tokens run
  while (i < n) {
    segs_.clear(), head_rows_.clear(), mixed_ids_.clear(), outs.clear(), greedy_outs_.clear();
    int rows = 0;
    while (i < n && rows < C) {
      const BatchEntry& e = entries[i];
      const int take = std::min(C - rows, e.n - done);
      segs_.push_back({e.st, rows, take});
      mixed_ids_.insert(mixed_ids_.end(), e.ids + done, e.ids + done + take);
      rows += take, done += take;
      if (done == e.n) {
        if (e.logits || e.greedy) head_rows_.push_back(rows - 1), outs.push_back(e.logits), greedy_outs_.push_back(e.greedy);
        ++i, done = 0;
      }
    }
    bool want = false;  // logits to the host (some entry asks for them)
    for (float* o : outs) want = want || o;
    // The head rows' logits go straight to the caller's rows when every head row wants them and
    // they are consecutive (the scheduler's decode rows), else through mixed_logits_.
    bool direct = want && outs[0];
    for (size_t r = 1; r < outs.size() && direct; ++r) direct = outs[r] == outs[0] + r * V;
    if (want && !direct) {
      mixed_logits_.resize(head_rows_.size() * V);
      // Greedy-only rows beside rows that want logits: only the wanted rows come to the host.
      for (float* o : outs) host_rows_.push_back(o ? 1 : 0);
    }
    bool recorded = false;
    try {
      recorded = be_.step_begin(step_info(rows, nullptr, nullptr));
      chunk_ops(mixed_ids_.data(), nullptr, rows, 0, !want ? nullptr : direct ? outs[0] : mixed_logits_.data(), false,
                nullptr, recorded);
    } catch (...) {
      if (recorded) be_.step_abort();
      head_rows_.clear(), greedy_outs_.clear(), host_rows_.clear();
      throw;
    }
    if (want && !direct)
      for (size_t r = 0; r < outs.size(); ++r)
        if (outs[r]) std::copy(mixed_logits_.begin() + long(r * V), mixed_logits_.begin() + long((r + 1) * V), outs[r]);
    head_rows_.clear(), greedy_outs_.clear(), host_rows_.clear();
  }
}

void Forward::chunk(SequenceState& st, const int* ids, const float* x0, int T, int t0,
                    float* logits, bool all_logits, const ForwardHooks* hooks) {
  // The backend may record the whole step (CUDA: one decode graph) from what it needs of the host.
  segs_.assign(1, Segment{&st, 0, T});
  if (opts_.link.prev >= 0) recv_boundary(T);  // before a recorded step: the transport may wait
  const bool recorded = be_.step_begin(step_info(T, x0, hooks));
  try {
    chunk_ops(ids, x0, T, t0, logits, all_logits, hooks, recorded);
  } catch (...) {
    if (recorded) be_.step_abort();
    throw;
  }
}

void Forward::chunk_ops(const int* ids, const float* x0, int T, int t0, float* logits, bool all_logits,
                        const ForwardHooks* hooks, bool recorded) {
  const int pos0 = segs_[0].st->position();  // for error messages (the first sequence's position)
  Buffers& b = *buf_;
  const Config& c = cfg_;
  const ModelWeights& w = model_.weights;
  const size_t D = c.hidden, TD = T * D;
  if (opts_.link.prev < 0) {  // else a later stage: its input came through recv_boundary
    if (x0) be_.from_host(x0, TD, b.P);
    else if (embed_from_) be_.embed_ids(w.embed, embed_from_, T, b.P);  // decode_greedy's step recorded ahead
    else be_.embed(w.embed, ids, T, b.P);
  }
  predict_now_ = opts_.predict && !recorded && be_.uses_prediction() && be_.streams_experts();

  int n_blocks = blocks0_;
  // Where nothing is mixed (no AttnRes snapshot yet: the norm reads P itself) and no hook looks in
  // between, a residual add and the norm after it are one op (Backend::add_rms_norm, bit-identical):
  // after the mixer, and the FFN's add with the next layer's input norm (`pending`: the FFN output
  // not yet added to P). Where nothing reads the FFN output itself (no hook, no finiteness check),
  // an MoE's shared-experts output is added to P with the routed one in that same op (add2,
  // add2_rms_norm; `pending2`) instead of into the FFN output first.
  float* pending = nullptr;
  const float* pending2 = nullptr;
  const bool defer_shared = !hooks && !opts_.check_finite;
  for (int i = opts_.first_layer; i < n_layers_; ++i) {
    const LayerWeights& l = w.layers[i];
    const LayerSpec& spec = c.layers[i];
    if (pending) {
      if (pending2) be_.add2_rms_norm(b.P, pending, pending2, T, int(D), l.input_norm, c.rms_eps, b.nrm);
      else be_.add_rms_norm(b.P, pending, T, int(D), l.input_norm, c.rms_eps, b.nrm);
      pending = nullptr, pending2 = nullptr;
    } else {
      if (hooks && hooks->before_layer) hooks->before_layer(i, t0, T, LayerIo{be_, b.P, b.blocks.data(), n_blocks, D});
      // Pre-attention mix (skipped while there is no snapshot: the only candidate is P itself).
      const float* mixed = pre_mix(l.attn_mix, b.blocks, n_blocks, T);
      if (spec.snapshot) {  // P becomes a snapshot (its bytes stay where `mixed` may point); a new block starts at zero
        std::swap(b.blocks[n_blocks], b.P);
        ++n_blocks;
        be_.fill_zero(b.P, TD);
      }
      be_.rms_norm(mixed, T, int(D), l.input_norm, c.rms_eps, b.nrm);
    }
    if (spec.mixer == Mixer::KDA) kda_layer(l, i, T);
    else mla_layer(l, i, T);
    if (!hooks && n_blocks == 0) {
      be_.add_rms_norm(b.P, b.att, T, int(D), l.post_norm, c.rms_eps, b.nrm);
      if (opts_.check_finite) check_sub(b.att, T, pos0, i, spec.mixer == Mixer::KDA ? "KDA" : "MLA");
    } else {
      be_.add(b.P, b.att, TD);
      if (opts_.check_finite) check_sub(b.att, T, pos0, i, spec.mixer == Mixer::KDA ? "KDA" : "MLA");
      const float* mixed = pre_mix(l.mlp_mix, b.blocks, n_blocks, T);
      if (hooks && hooks->dump && i == hooks->dump_layer) dump(hooks, -1, t0, T);  // nrm_attn, att
      be_.rms_norm(mixed, T, int(D), l.post_norm, c.rms_eps, b.nrm);
    }
    const float* shared = nullptr;  // deferred: the MoE's shared-experts output, not yet in b.ffn
    if (spec.ffn == Ffn::Dense) dense_mlp(l, T);
    else shared = moe(i, l.moe, T, defer_shared);
    if (!hooks && n_blocks == 0 && i + 1 < n_layers_ && !c.layers[i + 1].snapshot) pending = b.ffn, pending2 = shared;
    else if (shared) be_.add2(b.P, b.ffn, shared, TD);
    else be_.add(b.P, b.ffn, TD);
    if (hooks && hooks->dump && i == hooks->dump_layer) dump(hooks, i, t0, T);  // nrm_mlp, mlp, hidden
    if (opts_.check_finite)
      check_sub(b.ffn, T, pos0, i, spec.ffn == Ffn::Dense ? "dense MLP" : "MoE");
    if (hooks && hooks->trace)
      for (int t = 0; t < T; ++t)
        be_.to_host(b.P + t * D, D, hooks->trace + ((size_t(t0) + t) * n_layers_ + i) * D);
  }
  if (opts_.link.next >= 0) {  // a stage before the last: hand over, no head
    if (recorded) be_.step_end();
    send_boundary(T, n_blocks);
    return;
  }
  for (const Segment& sg : segs_) sg.st->advance(sg.n);
  const bool greedy = wants_greedy();
  const int rows = logits || greedy ? head(n_blocks, T, all_logits) : 0;
  if (greedy) be_.argmax_rows(b.logits, rows, c.vocab, b.greedy);
  if (recorded) hold_ ? be_.step_hold() : be_.step_end();
  if (logits) {
    const size_t V = c.vocab;
    // Each run of consecutive rows that want logits in one copy (all rows: one copy).
    for (int r0 = 0; r0 < rows;) {
      if (!host_rows_.empty() && !host_rows_[size_t(r0)]) {
        ++r0;
        continue;
      }
      int r1 = r0 + 1;
      while (r1 < rows && (host_rows_.empty() || host_rows_[size_t(r1)])) ++r1;
      be_.to_host(b.logits + size_t(r0) * V, size_t(r1 - r0) * V, logits + size_t(r0) * V);
      check_rows(logits + size_t(r0) * V, r1 - r0, V, pos0 + (all_logits ? r0 : T - 1), "the logits");
      r0 = r1;
    }
  }
  if (greedy && !keep_ids_) deliver_greedy(rows);
}

bool Forward::wants_greedy() const {
  for (int* g : greedy_outs_)
    if (g) return true;
  return false;
}

void Forward::deliver_greedy(int rows) {
  Buffers& b = *buf_;
  greedy_host_.resize(size_t(rows));
  be_.to_host(b.greedy, size_t(rows), greedy_host_.data());
  for (int r = 0; r < rows; ++r) {
    if (!greedy_outs_[size_t(r)]) continue;
    const Segment* sg = &segs_[0];
    for (const Segment& s : segs_)
      if (s.r0 <= head_rows_[size_t(r)]) sg = &s;
    *greedy_outs_[size_t(r)] = checked_greedy(r, sg->st->position() - 1);
  }
}

int Forward::checked_greedy(int r, int pos) {
  const size_t V = cfg_.vocab;
  const float id = greedy_host_[size_t(r)];
  if (id < 0.f) {  // a non-finite row: its logits name the element (check_rows throws)
    check_buf_.resize(V);
    be_.to_host(buf_->logits + size_t(r) * V, V, check_buf_.data());
    check_rows(check_buf_.data(), 1, V, pos, "the logits");
    throw Error("argmax_rows: row " + std::to_string(r) + " was flagged non-finite, yet its logits are finite");
  }
  check(id < float(V) && id == float(int(id)), "argmax_rows: row " + std::to_string(r) + " gave id " +
                                                   std::to_string(id) + ", outside the vocabulary");
  return int(id);
}

int TokenStep::decode_greedy(SequenceState& st, int first, int max_steps, const std::function<bool(int)>& on_id) {
  int in = first;
  for (int done = 1; done <= max_steps; ++done) {
    int id = -1;
    const BatchEntry e{&st, &in, 1, nullptr, &id};
    run_mixed(&e, 1);
    if (!on_id(id) || done == max_steps) return done;
    in = id;
  }
  return 0;
}

bool Forward::greedy_step(SequenceState& st, const int* id, bool ahead) {
  segs_.assign(1, Segment{&st, 0, 1});
  head_rows_.clear(), host_rows_.clear();
  greedy_outs_.assign(1, &greedy_sink_);
  hold_ = ahead, embed_from_ = ahead ? buf_->greedy : nullptr, keep_ids_ = true;
  struct Reset {  // the step's modes end with it, thrown or not
    Forward& f;
    ~Reset() { f.hold_ = false, f.embed_from_ = nullptr, f.keep_ids_ = false, f.greedy_outs_.clear(); }
  } reset{*this};
  bool recorded = false;
  try {
    recorded = be_.step_begin(step_info(1, nullptr, nullptr));
    if (ahead && !recorded) return false;  // the backend runs it op by op: not before its id is known
    chunk_ops(id, nullptr, 1, 0, nullptr, false, nullptr, recorded);
  } catch (...) {
    if (recorded) be_.step_abort();
    throw;
  }
  return true;
}

int Forward::decode_greedy(SequenceState& st, int first, int max_steps, const std::function<bool(int)>& on_id) {
  if (opts_.link.prev >= 0 || opts_.link.next >= 0)  // a pipeline stage: its neighbours wait on each step
    return TokenStep::decode_greedy(st, first, max_steps, on_id);
  check(st.holds(be_, opts_.first_layer, n_layers_), "forward: the sequence state belongs to another backend");
  // Step `done` is recorded and held (or its recording failed midway): its counters advanced from
  // mark_. Dropped by step_discard (a no-op when the backend holds nothing) and rewound.
  bool held = false;
  auto drop = [&]() noexcept {
    if (held) be_.step_discard(), st.rewind(mark_), held = false;
  };
  try {
    if (max_steps <= 0) return 0;
    greedy_step(st, &first, false);
    for (int done = 1;; ++done) {
      const int pos = st.position() - 1;  // the token whose logits gave step done-1's id
      if (done < max_steps) {             // record the next step while this one runs
        st.mark(mark_);
        held = true;
        try {
          held = greedy_step(st, nullptr, true);
        } catch (const DeviceError&) {  // the device failed: the caller decides (Runner: the fallback
          throw;                        // runs step done-1 again from the log)
        } catch (...) {  // step done-1's id is still good: the step runs again unrecorded below, and
          drop();        // throws there if the error is its own (e.g. a full context)
        }
      }
      greedy_host_.resize(1);
      be_.to_host(buf_->greedy, 1, greedy_host_.data());  // waits for step done-1 (not the held one)
      const int id = checked_greedy(0, pos);
      if (!on_id(id) || done == max_steps) {
        drop();
        return done;
      }
      if (held) be_.step_submit(), held = false;  // a failed launch: rewound below
      else greedy_step(st, &id, false);
    }
  } catch (...) {
    drop();
    throw;
  }
}

void Forward::check_sub(const float* dev, int T, int pos0, int layer, const char* block) {
  const size_t D = cfg_.hidden;
  std::vector<float>& h = check_buf_;
  h.resize(size_t(T) * D);
  be_.to_host(dev, h.size(), h.data());
  check_rows(h.data(), T, D, pos0, "the layer " + std::to_string(layer) + " " + block + " output");
}

StepInfo Forward::step_info(int T, const float* x0, const ForwardHooks* hooks) const {
  StepInfo s;
  s.tokens = T;
  // Recordable: a decode step, one token per sequence (a single-token step, or a batched step of
  // at most ForwardOptions::graph_rows one-token segments); a prefill chunk runs op by op. Whether
  // the routed MoE (dense or MXFP4 experts) can run without the host is the backend's call
  // (Backend::routed_moe_on_device).
  bool decode = true;
  for (const Segment& sg : segs_) decode = decode && sg.n == 1;
  s.may_record = opts_.graph && (T == 1 || (decode && T <= opts_.graph_rows));
  s.host_midway = opts_.check_finite || x0 || (hooks && (hooks->trace || hooks->dump || hooks->before_layer)) ||
                  ep_ != nullptr;  // expert parallelism: the transport waits on the host
  s.moe = step_moe_.data();
  s.n_moe = int(step_moe_.size());
  s.greedy_ids = wants_greedy();
  s.ahead = hold_;
  return s;
}

RoutedMoeParams Forward::routed_params(int layer) const {
  const Config& c = cfg_;
  return RoutedMoeParams{layer, c.n_experts, c.top_k, c.expert_io(), c.routed_scale, c.situ_b1, c.situ_b2,
                         c.expert_format, c.act, c.moe_inter};
}

/// Mix(blocks + [P]) (AttnRes, docs/model.md#attnres) into b.mixed, returned; or P itself (no
/// copy) when there is nothing to mix: before the first snapshot, and always with the plain
/// residual (Kimi Linear), whose sublayer input is the residual stream. The caller reads the
/// result before anything writes P again.
const float* Forward::pre_mix(const DenseWeight& w, const std::vector<float*>& blocks, int n_blocks, int T) {
  Buffers& b = *buf_;
  const size_t D = cfg_.hidden;
  if (n_blocks == 0) return b.P;
  std::vector<const float*>& entries = b.entries;
  entries.assign(blocks.begin(), blocks.begin() + n_blocks);
  entries.push_back(b.P);
  be_.attnres_mix(entries.data(), int(entries.size()), T, int(D), w, cfg_.rms_eps, b.mixed);
  return b.mixed;
}

void Forward::glu_down(const DenseWeight& down, const float* g, const float* u, int T, float* act, float* y) {
  const InputMap map = cfg_.act == Activation::SiTU ? InputMap{InputMap::Kind::SituGlu, u, cfg_.situ_b1, cfg_.situ_b2}
                                                    : InputMap{InputMap::Kind::SiluGlu, u};
  be_.gemm_mapped(down, g, map, T, act, y);
}

void Forward::kda_layer(const LayerWeights& l, int layer, int T) {
  Buffers& b = *buf_;
  const KdaWeights& k = l.kda;
  // The projections of the normed input in one batch, then the second halves of the low-rank
  // gates (f, and the output gate in Kimi Linear) in another (Backend::gemm_batch).
  const bool low_rank_gate = cfg_.kda_gate_rank != 0;
  const GemmJob first[] = {{&k.q, b.nrm, b.q},       {&k.k, b.nrm, b.k},    {&k.v, b.nrm, b.v},
                           {&k.f_a, b.nrm, b.fa},    {&k.b, b.nrm, b.beta},
                           low_rank_gate ? GemmJob{&k.g_a, b.nrm, b.ga} : GemmJob{&k.g, b.nrm, b.gate}};
  be_.gemm_batch(first, 6, T);
  const GemmJob second[] = {{&k.f_b, b.fa, b.z}, {&k.g_b, b.ga, b.gate}};
  be_.gemm_batch(second, low_rank_gate ? 2 : 1, T);
  const KdaParams p{cfg_.kda_heads, cfg_.kda_head_dim, cfg_.conv_kernel, cfg_.gate_lower_bound,
                    cfg_.rms_eps, cfg_.kda_gate};
  const size_t P = cfg_.kda_width(), H = cfg_.kda_heads;
  // Each sequence's recurrence on its own state: a run of consecutive one-token segments (the
  // decode rows of a batched step) in one kda_decode_batch, a longer segment in kda_core.
  for (size_t i = 0, j; i < segs_.size(); i = j) {
    const Segment& sg = segs_[i];
    const size_t r = size_t(sg.r0);
    j = decode_run(i);
    if (j - i > 1) {
      kda_states_.clear();
      for (size_t t = i; t < j; ++t) kda_states_.push_back(&segs_[t].st->kda(layer));
      be_.kda_decode_batch(p, k, kda_states_.data(), int(j - i), b.q + r * P, b.k + r * P, b.v + r * P, b.z + r * P,
                           b.beta + r * H, b.gate + r * P, b.o + r * P);
    } else {
      be_.kda_core(p, k, sg.st->kda(layer), b.q + r * P, b.k + r * P, b.v + r * P, b.z + r * P, b.beta + r * H,
                   b.gate + r * P, sg.n, b.o + r * P);
    }
  }
  be_.gemm(k.o, b.o, T, b.att);
}

size_t Forward::decode_run(size_t i) const {
  if (segs_[i].n != 1) return i + 1;
  size_t j = i + 1;
  while (j < segs_.size() && segs_[j].n == 1 && segs_[j].r0 == segs_[i].r0 + int(j - i)) ++j;
  return j;
}

void Forward::mla_layer(const LayerWeights& l, int layer, int T) {
  Buffers& b = *buf_;
  const MlaWeights& m = l.mla;
  // The projections of the normed input in one batch (Backend::gemm_batch): the query (or its
  // low-rank first half), the latent KV row and the output gate.
  GemmJob jobs[3];
  int n = 0;
  jobs[n++] = cfg_.q_lora > 0 ? GemmJob{&m.q_a, b.nrm, b.qa} : GemmJob{&m.q, b.nrm, b.qfull};
  jobs[n++] = {&m.kv_a, b.nrm, b.ckv};
  if (cfg_.mla_out_gate) jobs[n++] = {&m.g, b.nrm, b.mgate};
  be_.gemm_batch(jobs, n, T);
  if (cfg_.q_lora > 0) {
    be_.rms_norm(b.qa, T, cfg_.q_lora, m.q_a_norm, cfg_.mla_latent_eps, b.qan);
    be_.gemm(m.q_b, b.qan, T, b.qfull);
  }
  const MlaParams p{cfg_.mla_heads, cfg_.qk_nope, cfg_.qk_extra, cfg_.v_head, cfg_.kv_lora, cfg_.mla_latent_eps};
  const size_t Q = size_t(cfg_.mla_heads) * cfg_.mla_q_head(), W = cfg_.mla_cache_width(),
               C = size_t(cfg_.mla_heads) * cfg_.v_head;
  // Each sequence attends over its own cache: a run of consecutive one-token segments (the decode
  // rows of a batched step) in one mla_decode_batch, a longer segment in mla_attend.
  for (size_t i = 0, j; i < segs_.size(); i = j) {
    const Segment& sg = segs_[i];
    const size_t r = size_t(sg.r0);
    j = decode_run(i);
    if (j - i > 1) {
      mla_caches_.clear();
      for (size_t t = i; t < j; ++t) mla_caches_.push_back(&segs_[t].st->mla(layer));
      be_.mla_decode_batch(p, m, mla_caches_.data(), int(j - i), b.qfull + r * Q, b.ckv + r * W, b.ctx + r * C);
    } else {
      be_.mla_attend(p, m, sg.st->mla(layer), b.qfull + r * Q, b.ckv + r * W, sg.n, b.ctx + r * C);
    }
  }
  // The output gate and o_proj in one op (ctx gated in place where the backend does not fuse them).
  if (cfg_.mla_out_gate) be_.gemm_mapped(m.o, b.ctx, InputMap{InputMap::Kind::SigmoidGate, b.mgate}, T, b.ctx, b.att);
  else be_.gemm(m.o, b.ctx, T, b.att);
}

void Forward::dense_mlp(const LayerWeights& l, int T) {
  Buffers& b = *buf_;
  const GemmJob jobs[] = {{&l.mlp.gate, b.nrm, b.g}, {&l.mlp.up, b.nrm, b.u}};
  be_.gemm_batch(jobs, 2, T);
  glu_down(l.mlp.down, b.g, b.u, T, b.act, b.ffn);
}

const float* Forward::moe(int layer, const MoeWeights& m, int T, bool defer_shared) {
  Buffers& b = *buf_;
  const Config& c = cfg_;
  const size_t D = c.hidden;
  const bool latent = c.moe_kind == MoeKind::Latent, shared = c.n_shared > 0;
  // The products of the normed input in one batch (Backend::gemm_batch): the latent
  // down-projection, the router logits, the shared experts' gate and up.
  GemmJob jobs[4];
  int n = 0;
  if (latent) jobs[n++] = {&m.down, b.nrm, b.lat};
  jobs[n++] = {&m.router, b.nrm, b.rlog};
  if (shared) jobs[n++] = {&m.shared_gate, b.nrm, b.g}, jobs[n++] = {&m.shared_up, b.nrm, b.u};
  be_.gemm_batch(jobs, n, T);
  if (shared) {  // before the routed experts, whose workspace reuses g, u and act
    glu_down(m.shared_down, b.g, b.u, T, b.act, b.tmp);
  }
  if (latent) {  // Stable LatentMoE (docs/model.md#moe)
    routed_experts(layer, m, b.lat, T, b.lsum);
    const float* u = b.lsum;
    if (c.latent_norm) {
      be_.rms_norm(b.lsum, T, c.latent, m.norm, c.rms_eps, b.lnorm);
      u = b.lnorm;
    }
    be_.gemm(m.up, u, T, b.ffn);
  } else {  // plain MoE on the hidden state (docs/model.md#kimi-linear)
    routed_experts(layer, m, b.nrm, T, b.ffn);
  }
  if (!shared) return nullptr;
  if (defer_shared) return b.tmp;
  be_.add(b.ffn, b.tmp, size_t(T) * D);
  return nullptr;
}

/// out[T, io] = Σ_k w_k · expert_k(z) over each token's top-k (docs/model.md#moe, steps 1-5), from
/// the router logits in b.rlog (moe), in the backend's one routed-MoE op.
void Forward::routed_experts(int layer, const MoeWeights& m, const float* z, int T, float* out) {
  Buffers& b = *buf_;
  if (predict_now_) predict_next(layer, T);
  if (ep_) ep_->run(routed_params(layer), m, b.rlog, z, T, RoutedMoeWork{b.ys, b.g, b.u, b.act}, out);
  else be_.routed_moe(routed_params(layer), m, b.rlog, z, T, RoutedMoeWork{b.ys, b.g, b.u, b.act}, out);
}

void Forward::predict_next(int layer, int T) {
  const int next = next_moe_[layer];
  if (next < 0) return;
  Buffers& b = *buf_;
  const Config& c = cfg_;
  const MoeWeights& nm = model_.weights.layers[next].moe;
  // The guess: layer `next`'s router on this layer's router input (its real input is one mixer
  // and one mix further on). Its own buffers, so nothing routed_moe reads changes.
  const size_t pairs = size_t(T) * c.top_k;
  if (guess_ids_.size() < pairs) guess_ids_.resize(pairs), guess_w_.resize(pairs);
  be_.gemm(nm.router, b.nrm, T, b.plog);
  be_.router_topk(b.plog, nm.bias, T, c.n_experts, c.top_k, guess_ids_.data(), guess_w_.data());
  be_.prefetch_experts(next, guess_ids_.data(), int(pairs));
}

int Forward::head(int n_blocks, int T, bool all_logits) {
  Buffers& b = *buf_;
  const ModelWeights& w = model_.weights;
  const size_t D = cfg_.hidden;
  const float* mixed = pre_mix(w.out_mix, b.blocks, n_blocks, T);  // final mix (the residual itself when plain)
  if (!head_rows_.empty()) {  // run_mixed: the last row of each entry that wants logits
    const int n = int(head_rows_.size());
    bool consecutive = true;  // e.g. a step of decodes only: one norm over the rows (row-independent)
    for (int r = 1; r < n && consecutive; ++r) consecutive = head_rows_[size_t(r)] == head_rows_[0] + r;
    if (consecutive) {
      be_.rms_norm(mixed + size_t(head_rows_[0]) * D, n, int(D), w.final_norm, cfg_.rms_eps, b.hnorm);
    } else {
      for (int r = 0; r < n; ++r)
        be_.rms_norm(mixed + size_t(head_rows_[r]) * D, 1, int(D), w.final_norm, cfg_.rms_eps, b.hnorm + size_t(r) * D);
    }
    be_.gemm(w.lm_head, b.hnorm, n, b.logits);
    return n;
  }
  // Only the last position needs the head unless every position's logits are asked for.
  const int first = all_logits ? 0 : T - 1, n = T - first;
  be_.rms_norm(mixed + first * D, n, int(D), w.final_norm, cfg_.rms_eps, b.hnorm);
  be_.gemm(w.lm_head, b.hnorm, n, b.logits);
  return n;
}

void Forward::dump(const ForwardHooks* h, int layer, int t0, int T) {
  const int t = h->dump_token - t0;
  if (t < 0 || t >= T) return;
  Buffers& b = *buf_;
  const size_t D = cfg_.hidden;
  if (layer < 0) {  // after the mixer: nrm_attn, att
    be_.to_host(b.nrm + t * D, D, h->dump);
    be_.to_host(b.att + t * D, D, h->dump + D);
  } else {          // after the FFN: nrm_mlp, mlp, hidden
    be_.to_host(b.nrm + t * D, D, h->dump + 2 * D);
    be_.to_host(b.ffn + t * D, D, h->dump + 3 * D);
    be_.to_host(b.P + t * D, D, h->dump + 4 * D);
  }
}

}  // namespace wren
