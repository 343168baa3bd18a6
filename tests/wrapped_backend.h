// A test backend that forwards every op to another backend, with two hooks: `before(op)` runs
// before each op (fault injection: throw DeviceError there) and `after(op, out, n)` sees each
// op's float output (planted bugs: perturb it); `on_step` sees each step's StepInfo. Used by the fallback and validate tests. With
// `place` set it also stands in for a backend that places its own weights at load (as CUDA does,
// Backend::place_dense): it keeps them in its own host storage, upcast by the same rule (exact), so
// the inner CPU backend reads them; `placed` counts them and a non-finite f32 weight is reported
// by place_finish (the CUDA contract: float data checked on the device, reported at the end).
#pragma once
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/backend.h"

namespace wren::test {

class WrappedBackend final : public Backend {
 public:
  explicit WrappedBackend(Backend& inner) : in_(inner) {}
  std::function<void(const char* op)> before;
  std::function<void(const char* op, float* out, size_t n)> after;
  /// Planted decline: routed_moe reports a slow fallback (Backend::note_fallback) before running
  /// the host-routed reference through this wrapper's ops, as the default does.
  bool decline_moe = false;

  bool place = false;
  int placed = 0;  ///< weights placed so far
  size_t host_floats = 0;  ///< floats copied to the host (to_host) so far
  /// Sees what each step offers for recording (Backend::step_begin).
  std::function<void(const StepInfo& s)> on_step;
  /// Records steps as the CUDA backend does, in host memory: from step_begin (a step with
  /// may_record and nothing of the host midway) to step_end / step_hold each op is queued with its
  /// arguments as they are then (ids copied; an MLA cache's row count advanced at once, the
  /// device work queued on a copy of its counters, as CUDA bakes the length into the kernel). A
  /// step ended or submitted runs as a device would, later: at the next op outside a recording
  /// (to_host included), so a step recorded meanwhile sees none of its results on the host side.
  /// to_host while recording throws. Counts below.
  bool record = false;
  int recorded = 0, held = 0, submitted = 0, discarded = 0;
  /// Called for each op queued while recording (fault injection in a recording: throw there).
  std::function<void(const char* op)> on_record;

  bool step_begin(const StepInfo& s) override {
    if (on_step) on_step(s);
    if (!record || !s.may_record || s.host_midway) return false;
    check(queue_.empty() && !recording_, "wrapped: step_begin inside a step");
    check(held_.empty(), "wrapped: a step begun while another is held");
    recording_ = true, ahead_ = s.ahead, ++recorded;
    return true;
  }
  void step_end() override {
    check(recording_, "wrapped: step_end without step_begin");
    check(!ahead_, "wrapped: step_end of a step recorded ahead");
    recording_ = false;
    for (auto& f : queue_) pending_.push_back(std::move(f));
    queue_.clear();
  }
  void step_abort() noexcept override { recording_ = false, queue_.clear(); }
  void step_hold() override {
    check(recording_, "wrapped: step_hold without step_begin");
    check(ahead_, "wrapped: step_hold of a step not recorded ahead");
    check(held_.empty(), "wrapped: a second step held");
    recording_ = false, ++held;
    held_.swap(queue_);
  }
  void step_submit() override {
    check(!held_.empty(), "wrapped: step_submit without a held step");
    ++submitted;
    for (auto& f : held_) pending_.push_back(std::move(f));
    held_.clear();
  }
  void step_discard() noexcept override {
    if (!held_.empty()) ++discarded;
    held_.clear();
  }

  const char* name() const override { return "wrapped"; }
  bool places_dense() const override { return place; }
  void place_dense(DenseWeight& w, const PlaceRequest& r) override {
    if (!place) return Backend::place_dense(w, r);
    const size_t n = size_t(w.rows * w.cols);
    const auto* src = static_cast<const uint8_t*>(r.src);
    if (w.format == WFormat::F32) {
      check(r.count == n, r.where + ": wrong element count");
      auto& v = store_.emplace_back(new uint8_t[n * 4]);
      float* f = reinterpret_cast<float*>(v.get());
      for (size_t i = 0; i < n; ++i) {
        uint32_t u = 0;
        uint16_t h = 0;
        if (r.src_dtype == DType::F32) std::memcpy(&u, src + 4 * i, 4);
        else if (r.src_dtype == DType::BF16) std::memcpy(&h, src + 2 * i, 2), u = uint32_t(h) << 16;
        else throw Error(r.where + ": the test placer takes F32 and BF16 only");
        std::memcpy(f + i, &u, 4);
        if (!std::isfinite(f[i]) && bad_.empty()) bad_ = r.where;
      }
      if (r.consumed) r.consumed(0, n * dtype_size(r.src_dtype));
      w.dtype = DType::F32, w.data = f, w.scale = nullptr;
    } else {
      check(r.count == wformat_data_bytes(w.format, w.rows, w.cols), r.where + ": wrong byte count");
      auto& v = store_.emplace_back(new uint8_t[r.count]);
      std::memcpy(v.get(), src, r.count);
      if (r.src_dtype == DType::BF16)  // stored bytes kept as they are: the backend checks them
        for (size_t i = 0; i + 1 < r.count; i += 2)
          if ((src[i + 1] & 0x7f) == 0x7f && (src[i] & 0x80) && bad_.empty()) bad_ = r.where;
      w.data = v.get();
      w.scale = nullptr;
      if (const size_t ns = wformat_scale_count(w.format, w.rows, w.cols)) {
        auto& sv = store_.emplace_back(new uint8_t[ns * 4]);
        std::memcpy(sv.get(), r.scale, ns * 4);
        w.scale = reinterpret_cast<const float*>(sv.get());
      }
      w.dtype = w.format == WFormat::BF16 ? DType::BF16 : w.format == WFormat::Q8_ROW ? DType::I8 : DType::U8;
    }
    w.placed_on = this;
    ++placed;
  }
  void place_finish() override {
    if (!bad_.empty()) throw Error(bad_ + ": holds a NaN or an infinity; every weight must be a finite number");
  }
  float* alloc(size_t n) override { return in_.alloc(n); }
  void release(float* p) override { flush(), in_.release(p); }
  void argmax_rows(const float* x, int rows, int cols, float* out) override {
    op([=, this] { hook("argmax_rows"), in_.argmax_rows(x, rows, cols, out); });
  }
  void to_host(const float* s, size_t n, float* d) override {
    check(!recording_, "wrapped: to_host while a step is recorded");
    flush();
    hook("to_host"), host_floats += n, in_.to_host(s, n, d);
  }
  void from_host(const float* s, size_t n, float* d) override {
    op([=, this, h = std::vector<float>(s, s + n)] { hook("from_host"), in_.from_host(h.data(), n, d); });
  }
  void copy(const float* s, size_t n, float* d) override { op([=, this] { hook("copy"), in_.copy(s, n, d); }); }
  void fill_zero(float* p, size_t n) override { op([=, this] { hook("fill_zero"), in_.fill_zero(p, n); }); }
  void embed(const DenseWeight& t, const int* ids, int T, float* x) override {
    op([=, this, t = &t, h = std::vector<int>(ids, ids + T)] {
      hook("embed"), in_.embed(*t, h.data(), T, x), out("embed", x, size_t(T) * t->cols);
    });
  }
  void embed_ids(const DenseWeight& t, const float* ids, int T, float* x) override {
    op([=, this, t = &t] {  // the ids are read when the step runs (CUDA: on the device)
      hook("embed_ids"), in_.embed_ids(*t, ids, T, x), out("embed_ids", x, size_t(T) * t->cols);
    });
  }
  void gemm(const DenseWeight& W, const float* x, int T, float* y) override {
    op([=, this, W = &W] { hook("gemm"), in_.gemm(*W, x, T, y), out("gemm", y, size_t(T) * W->rows); });
  }
  void rms_norm(const float* x, int T, int n, const DenseWeight& w, float eps, float* y) override {
    op([=, this, w = &w] { hook("rms_norm"), in_.rms_norm(x, T, n, *w, eps, y), out("rms_norm", y, size_t(T) * n); });
  }
  void add(float* y, const float* x, size_t n) override {
    op([=, this] { hook("add"), in_.add(y, x, n), out("add", y, n); });
  }
  void situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* o) override {
    op([=, this] { hook("situ_glu"), in_.situ_glu(g, u, T, n, b1, b2, o), out("situ_glu", o, size_t(T) * n); });
  }
  void silu_glu(const float* g, const float* u, int T, int n, float* o) override {
    op([=, this] { hook("silu_glu"), in_.silu_glu(g, u, T, n, o), out("silu_glu", o, size_t(T) * n); });
  }
  void sigmoid_gate(float* y, const float* g, size_t n) override {
    op([=, this] { hook("sigmoid_gate"), in_.sigmoid_gate(y, g, n), out("sigmoid_gate", y, n); });
  }
  void attnres_mix(const float* const* e, int ne, int T, int D, const DenseWeight& w, float eps, float* o) override {
    op([=, this, w = &w, h = std::vector<const float*>(e, e + ne)] {
      hook("attnres_mix"), in_.attnres_mix(h.data(), ne, T, D, *w, eps, o), out("attnres_mix", o, size_t(T) * D);
    });
  }
  void kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* q, const float* k, const float* v,
                const float* z, const float* beta, const float* gate, int T, float* o) override {
    op([=, this, s = &s, w = &w] {
      hook("kda_core"), in_.kda_core(p, *w, *s, q, k, v, z, beta, gate, T, o);
      out("kda_core", o, size_t(T) * p.heads * p.head_dim);
    });
  }
  void mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& c, const float* q, const float* ckv, int T,
                  float* ctx) override {
    if (!recording_) {
      flush();
      hook("mla_attend"), in_.mla_attend(p, w, c, q, ckv, T, ctx);
      return out("mla_attend", ctx, size_t(T) * p.heads * p.v_head);
    }
    if (on_record) on_record("mla_attend");
    check(c.length + T <= c.capacity, "context limit reached (wrapped)");
    MlaCache at = c;  // the rows go where the cache ends now; the host's count moves on at once
    c.length += T;
    queue_.emplace_back([=, this, w = &w]() mutable {
      hook("mla_attend"), in_.mla_attend(p, *w, at, q, ckv, T, ctx), out("mla_attend", ctx, size_t(T) * p.heads * p.v_head);
    });
  }
  void router_topk(const float* l, const DenseWeight& b, int T, int E, int k, int* ids, float* w) override {
    check(!recording_, "wrapped: router_topk (host ids) while a step is recorded");
    flush();
    hook("router_topk"), in_.router_topk(l, b, T, E, k, ids, w);
  }
  void expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) override {
    check(!recording_, "wrapped: expert_ffn while a step is recorded");
    flush();
    hook("expert_ffn"), in_.expert_ffn(e, z, b1, b2, y), out("expert_ffn", y, size_t(e.w1.cols));
  }
  void expert_ffn_batch(const ExpertRef* const* e, const int* in_rows, const int* out_rows, int n, const float* z,
                        float b1, float b2, float* ys) override {
    check(!recording_, "wrapped: expert_ffn_batch while a step is recorded");
    flush();
    hook("expert_ffn_batch"), in_.expert_ffn_batch(e, in_rows, out_rows, n, z, b1, b2, ys);
  }
  void routed_moe(const RoutedMoeParams& p, const MoeWeights& m, const float* logits, const float* z, int T,
                  const RoutedMoeWork& ws, float* o) override {
    if (decline_moe) note_fallback("routed_moe layer " + std::to_string(p.layer) + ": planted decline");
    // Recording: the whole host-routed MoE runs with the step (CUDA routes on the device).
    op([=, this, m = &m] { host_routed_moe(p, *m, logits, z, T, ws, o); });
  }
  void weighted_sum(const float* ys, const float* w, int m, int n, float* y) override {
    op([=, this] { hook("weighted_sum"), in_.weighted_sum(ys, w, m, n, y), out("weighted_sum", y, size_t(n)); });
  }

 private:
  void hook(const char* op) {
    if (before) before(op);
  }
  void out(const char* op, float* o, size_t n) {
    if (after) after(op, o, n);
  }
  /// Runs f now, or queues it while a step is recorded.
  template <class F>
  void op(F&& f) {
    if (recording_) {
      if (on_record) on_record("op");
      return queue_.emplace_back(std::forward<F>(f)), void();
    }
    flush();
    f();
  }
  /// Runs the submitted steps (the device catching up).
  void flush() {
    std::vector<std::function<void()>> ops;
    ops.swap(pending_);
    for (auto& f : ops) f();
  }
  bool recording_ = false, ahead_ = false;
  /// The step being recorded; the held one; steps submitted and not yet run.
  std::vector<std::function<void()>> queue_, held_, pending_;
  Backend& in_;
  std::vector<std::unique_ptr<uint8_t[]>> store_;  ///< placed weights (the stand-in device memory)
  std::string bad_;                                ///< the first non-finite f32 weight placed
};

}  // namespace wren::test
