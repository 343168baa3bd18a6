// Pipeline parallelism by layers (see pipeline.h, docs/parallel.md).
#include "model/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "model/tensor_table.h"

namespace wren {

int StagePlan::stage_of(int layer) const {
  for (int s = 0; s < stages(); ++s)
    if (layer < end(s)) return s;
  return stages() - 1;
}

std::string StagePlan::describe(const std::vector<uint64_t>* bytes) const {
  std::string out = std::to_string(stages()) + (stages() == 1 ? " stage: layers " : " stages: layers ");
  for (int s = 0; s < stages(); ++s) {
    if (s) out += " | ";
    out += std::to_string(first(s)) + "-" + std::to_string(end(s) - 1);
    if (bytes) {
      uint64_t b = 0;
      for (int i = first(s); i < end(s); ++i) b += (*bytes)[size_t(i)];
      char buf[32];
      std::snprintf(buf, sizeof buf, " (%.1f MB)", double(b) / 1e6);
      out += buf;
    }
  }
  return out;
}

std::vector<uint64_t> layer_bytes(const Config& c) {
  std::vector<uint64_t> out(size_t(c.n_layers), 0);
  ModelWeights w;
  for_each_tensor(c, w, [&](const TensorSpec& s) {
    if (s.layer < 0 || s.layer >= c.n_layers) return;
    uint64_t n = 1;
    for (int64_t d : s.shape) n *= uint64_t(d);
    // MXFP4 parts are bytes as stored; dense tensors (and dense experts) resident as f32.
    out[size_t(s.layer)] += s.kind == TensorKind::Float ? 4 * n : n;
  });
  return out;
}

StagePlan plan_stages(int n_layers, int stages, StageSplit split, const std::vector<uint64_t>& bytes) {
  check(stages >= 1 && stages <= n_layers, "--pipeline " + std::to_string(stages) + ": needs 1 to " +
                                               std::to_string(n_layers) + " stages (one layer at least per stage)");
  StagePlan p;
  p.bounds.assign(1, 0);
  if (split == StageSplit::Even) {
    for (int s = 0; s < stages; ++s) p.bounds.push_back(p.bounds.back() + n_layers / stages + (s < n_layers % stages));
    return p;
  }
  check(int(bytes.size()) == n_layers, "pipeline split by bytes: " + std::to_string(bytes.size()) +
                                           " layer sizes for " + std::to_string(n_layers) + " layers");
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  uint64_t sum = 0;
  int i = 0;
  for (int s = 0; s + 1 < stages; ++s) {
    const double goal = double(total) * double(s + 1) / double(stages);
    // At least one layer for this stage, and leave one for every later stage.
    const int lo = p.bounds.back() + 1, hi = n_layers - (stages - 1 - s);
    while (i < lo) sum += bytes[size_t(i++)];
    // Take the next layer while that brings the prefix closer to the goal.
    while (i < hi && std::abs(double(sum + bytes[size_t(i)]) - goal) < std::abs(double(sum) - goal))
      sum += bytes[size_t(i++)];
    p.bounds.push_back(i);
  }
  p.bounds.push_back(n_layers);
  return p;
}

StageSplit parse_stage_split(const std::string& s) {
  if (s == "even") return StageSplit::Even;
  if (s == "bytes") return StageSplit::Bytes;
  throw UsageError("--pipeline-split: '" + s + "' (expected even or bytes)");
}

StagePlan parse_pipeline(const std::string& spec, int n_layers, StageSplit split, const std::vector<uint64_t>& bytes) {
  const std::string bad = "--pipeline '" + spec + "': ";
  usage_check(!spec.empty() && spec.find_first_not_of("0123456789+") == std::string::npos,
        bad + "expected a stage count (e.g. 2) or layers per stage (e.g. 3+2+1)");
  if (spec.find('+') == std::string::npos) {
    usage_check(spec.size() <= 6 && std::stoi(spec) >= 1 && std::stoi(spec) <= n_layers,
                bad + "expected 1 to " + std::to_string(n_layers) + " stages (one layer each at the most)");
    return plan_stages(n_layers, std::stoi(spec), split, bytes);
  }
  StagePlan p;
  p.bounds.assign(1, 0);
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t plus = std::min(spec.find('+', at), spec.size());
    const std::string part = spec.substr(at, plus - at);
    usage_check(!part.empty() && part.size() <= 6 && std::stoi(part) >= 1, bad + "every stage needs at least one layer");
    p.bounds.push_back(p.bounds.back() + std::stoi(part));
    at = plus + 1;
  }
  usage_check(p.bounds.back() == n_layers, bad + "the stages hold " + std::to_string(p.bounds.back()) +
                                         " layers, the model runs " + std::to_string(n_layers));
  return p;
}

std::vector<float>& InProcessTransport::push(int from, int to) {
  check(to >= 0 && to < world_ && from >= 0 && from < world_ && to != from,
        "in-process transport: no route from rank " + std::to_string(from) + " to rank " + std::to_string(to));
  auto& q = queues_[{from, to}];
  q.emplace_back();
  return q.back();
}

std::vector<float> InProcessTransport::pop(int from, int to, size_t n) {
  auto it = queues_.find({from, to});
  check(it != queues_.end() && !it->second.empty(),
        "in-process transport: rank " + std::to_string(to) + " waits for rank " + std::to_string(from) +
            ", which sent nothing (stages run out of order)");
  std::vector<float> m = std::move(it->second.front());
  it->second.pop_front();
  check(m.size() == n, "in-process transport: rank " + std::to_string(from) + " sent " + std::to_string(m.size()) +
                           " values, rank " + std::to_string(to) + " expected " + std::to_string(n));
  return m;
}

void InProcessTransport::send(Backend& be, const float* buf, size_t n, int to) {
  // Ranks are the stage indices; the sender is the stage before `to` (a chain), which is all
  // PipelineForward uses. The pair key keeps the per-route FIFO order.
  std::vector<float>& m = push(to - 1, to);
  m.resize(n);
  be.to_host(buf, n, m.data());
  floats_sent_ += n;
}

void InProcessTransport::recv(Backend& be, float* buf, size_t n, int from) {
  const std::vector<float> m = pop(from, from + 1, n);
  be.from_host(m.data(), n, buf);
}

void InProcessTransport::send_host(const int* v, size_t n, int to) {
  std::vector<float>& m = push(to - 1, to);
  m.resize(n);
  for (size_t i = 0; i < n; ++i) m[i] = float(v[i]);  // control words only: small ints, exact in f32
}

void InProcessTransport::recv_host(int* v, size_t n, int from) {
  const std::vector<float> m = pop(from, from + 1, n);
  for (size_t i = 0; i < n; ++i) v[i] = int(m[i]);
}

PipelineForward::PipelineForward(const Model& model, const std::vector<Backend*>& backends, const StagePlan& plan,
                                 ForwardOptions opts)
    : model_(model), backends_(backends), plan_(plan), chunk_(opts.max_chunk), transport_(plan.stages()) {
  const int S = plan.stages();
  check(S >= 1 && int(backends.size()) == S, "pipeline: " + std::to_string(backends.size()) + " backends for " +
                                                 std::to_string(S) + " stages");
  const int run_layers = opts.layers < 0 ? model.config.n_layers : opts.layers;
  check(plan.bounds.front() == 0 && plan.end(S - 1) == run_layers,
        "pipeline: the stages cover layers 0-" + std::to_string(plan.end(S - 1) - 1) + ", the model runs " +
            std::to_string(run_layers));
  for (int s = 0; s < S; ++s) {
    ForwardOptions o = opts;
    o.first_layer = plan.first(s);
    o.layers = plan.end(s);
    o.link = StageLink{S > 1 ? &transport_ : nullptr, s > 0 ? s - 1 : -1, s + 1 < S ? s + 1 : -1};
    stages_.push_back(std::make_unique<Forward>(model, *backends[size_t(s)], o));
  }
}

std::vector<Backend*> PipelineForward::layer_backends() const {
  std::vector<Backend*> out(size_t(model_.config.n_layers), backends_.back());
  for (int s = 0; s < plan_.stages(); ++s)
    for (int i = plan_.first(s); i < plan_.end(s); ++i) out[size_t(i)] = backends_[size_t(s)];
  return out;
}

std::unique_ptr<SequenceState> PipelineForward::new_sequence(int capacity) const {
  return std::make_unique<SequenceState>(layer_backends(), model_.config, capacity);
}

void PipelineForward::run(SequenceState& st, const int* ids, const float* x0, int T, float* logits, bool all_logits,
                          const ForwardHooks* hooks) {
  check(hooks == nullptr || (!hooks->before_layer && !hooks->trace && !hooks->dump), "pipeline: validation hooks (--trace, --dump-layer, validate) need a single stage");
  const size_t V = model_.config.vocab, D = model_.config.hidden;
  const int S = plan_.stages();
  // Chunk here, so each stage's message for a chunk is taken before the next chunk is sent.
  for (int t0 = 0; t0 < T; t0 += chunk_) {
    const int n = std::min(chunk_, T - t0);
    float* out = chunk_logits(logits, all_logits, t0, n, T, V);
    for (int s = 0; s < S; ++s)
      stages_[size_t(s)]->run(st, ids + t0, s == 0 && x0 ? x0 + t0 * D : nullptr, n, s + 1 == S ? out : nullptr,
                              all_logits);
  }
}

void PipelineForward::run_batch(SequenceState* const* states, const int* ids, int B, float* logits) {
  const size_t V = model_.config.vocab;
  const int S = plan_.stages();
  for (int g0 = 0; g0 < B; g0 += chunk_) {
    const int n = std::min(chunk_, B - g0);
    for (int s = 0; s < S; ++s)
      stages_[size_t(s)]->run_batch(states + g0, ids + g0, n, s + 1 == S && logits ? logits + size_t(g0) * V : nullptr);
  }
}

}  // namespace wren
