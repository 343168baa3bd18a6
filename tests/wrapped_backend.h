// A test backend that forwards every op to another backend, with two hooks: `before(op)` runs
// before each op (fault injection: throw DeviceError there) and `after(op, out, n)` sees each
// op's float output (planted bugs: perturb it). Used by the fallback and validate tests.
#pragma once
#include <functional>

#include "ops/backend.h"

namespace wren::test {

class WrappedBackend final : public Backend {
 public:
  explicit WrappedBackend(Backend& inner) : in_(inner) {}
  std::function<void(const char* op)> before;
  std::function<void(const char* op, float* out, size_t n)> after;

  const char* name() const override { return "wrapped"; }
  float* alloc(size_t n) override { return in_.alloc(n); }
  void release(float* p) override { in_.release(p); }
  void to_host(const float* s, size_t n, float* d) override { hook("to_host"), in_.to_host(s, n, d); }
  void from_host(const float* s, size_t n, float* d) override { hook("from_host"), in_.from_host(s, n, d); }
  void copy(const float* s, size_t n, float* d) override { hook("copy"), in_.copy(s, n, d); }
  void fill_zero(float* p, size_t n) override { hook("fill_zero"), in_.fill_zero(p, n); }
  void embed(const DenseWeight& t, const int* ids, int T, float* x) override {
    hook("embed"), in_.embed(t, ids, T, x), out("embed", x, size_t(T) * t.cols);
  }
  void gemm(const DenseWeight& W, const float* x, int T, float* y) override {
    hook("gemm"), in_.gemm(W, x, T, y), out("gemm", y, size_t(T) * W.rows);
  }
  void rms_norm(const float* x, int T, int n, const DenseWeight& w, float eps, float* y) override {
    hook("rms_norm"), in_.rms_norm(x, T, n, w, eps, y), out("rms_norm", y, size_t(T) * n);
  }
  void add(float* y, const float* x, size_t n) override { hook("add"), in_.add(y, x, n), out("add", y, n); }
  void situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* o) override {
    hook("situ_glu"), in_.situ_glu(g, u, T, n, b1, b2, o), out("situ_glu", o, size_t(T) * n);
  }
  void silu_glu(const float* g, const float* u, int T, int n, float* o) override {
    hook("silu_glu"), in_.silu_glu(g, u, T, n, o), out("silu_glu", o, size_t(T) * n);
  }
  void sigmoid_gate(float* y, const float* g, size_t n) override {
    hook("sigmoid_gate"), in_.sigmoid_gate(y, g, n), out("sigmoid_gate", y, n);
  }
  void attnres_mix(const float* const* e, int ne, int T, int D, const DenseWeight& w, float eps, float* o) override {
    hook("attnres_mix"), in_.attnres_mix(e, ne, T, D, w, eps, o), out("attnres_mix", o, size_t(T) * D);
  }
  void kda_core(const KdaParams& p, const KdaWeights& w, KdaState& s, const float* q, const float* k, const float* v,
                const float* z, const float* beta, const float* gate, int T, float* o) override {
    hook("kda_core"), in_.kda_core(p, w, s, q, k, v, z, beta, gate, T, o);
    out("kda_core", o, size_t(T) * p.heads * p.head_dim);
  }
  void mla_attend(const MlaParams& p, const MlaWeights& w, MlaCache& c, const float* q, const float* ckv, int T,
                  float* ctx) override {
    hook("mla_attend"), in_.mla_attend(p, w, c, q, ckv, T, ctx), out("mla_attend", ctx, size_t(T) * p.heads * p.v_head);
  }
  void router_topk(const float* l, const DenseWeight& b, int T, int E, int k, int* ids, float* w) override {
    hook("router_topk"), in_.router_topk(l, b, T, E, k, ids, w);
  }
  void expert_ffn(const ExpertRef& e, const float* z, float b1, float b2, float* y) override {
    hook("expert_ffn"), in_.expert_ffn(e, z, b1, b2, y), out("expert_ffn", y, size_t(e.w1.cols));
  }
  void expert_ffn_batch(const ExpertRef* const* e, const int* in_rows, const int* out_rows, int n, const float* z,
                        float b1, float b2, float* ys) override {
    hook("expert_ffn_batch"), in_.expert_ffn_batch(e, in_rows, out_rows, n, z, b1, b2, ys);
  }
  void weighted_sum(const float* ys, const float* w, int m, int n, float* y) override {
    hook("weighted_sum"), in_.weighted_sum(ys, w, m, n, y), out("weighted_sum", y, size_t(n));
  }

 private:
  void hook(const char* op) {
    if (before) before(op);
  }
  void out(const char* op, float* o, size_t n) {
    if (after) after(op, o, n);
  }
  Backend& in_;
};

}  // namespace wren::test
