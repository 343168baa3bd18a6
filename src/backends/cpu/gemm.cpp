// CPU backend: construction, scratch, embedding lookup, the GEMM/GEMV op entry and element-wise ops.
// Layout: W [rows, cols] row-major (PyTorch Linear [out, in]) in any WFormat; x [T, cols];
// y [T, rows]. gemm dispatches on W.format once and splits rows over the pool; every row is one
// task's, computed for all T tokens while its weights are in cache (weights stream once per chunk).
#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "ops/weights.h"

namespace wren {

namespace cpu {
float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

float situ(float g, float u, float b1, float b2) {
  return (b1 * std::tanh(g / b1) * sigmoid(g)) * (b2 * std::tanh(u / b2));
}

float* Scratch::f(int slot, size_t n) {
  if (f_.size() <= size_t(slot)) f_.resize(slot + 1);
  if (f_[slot].size() < n) f_[slot].resize(n);
  return f_[slot].data();
}

int8_t* Scratch::i8(int slot, size_t n) {
  if (i8_.size() <= size_t(slot)) i8_.resize(slot + 1);
  if (i8_[slot].size() < n) i8_[slot].resize(n);
  return i8_[slot].data();
}
}  // namespace cpu

CpuBackend::CpuBackend(const CpuOptions& opts) : opts_(opts) {
  check(opts.threads >= 1, "CPU backend: threads must be at least 1 (got " + std::to_string(opts.threads) + ")");
  check(cpu::isa_supported(opts.isa), std::string("CPU backend: this CPU does not support the ") +
                                          cpu::isa_name(opts.isa) + " kernels");
  k_ = &cpu::kernels_for(opts.isa);
  pool_ = std::make_unique<cpu::ThreadPool>(opts.threads);
  local_.resize(opts.threads);
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::embed(const DenseWeight& table, const int* ids, int T, float* x) {
  for (int t = 0; t < T; ++t) {
    check(ids[t] >= 0 && ids[t] < table.rows,
          "token id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
              std::to_string(table.rows) + ")");
    dequant_row(table, ids[t], x + size_t(t) * table.cols);
  }
}

void CpuBackend::gemm(const DenseWeight& W, const float* x, int T, float* y) {
  const cpu::DenseRowsFn fn = k_->dense[size_t(W.format)];
  const int rows = int(W.rows);
  // ~8 tasks per thread for balance on a shared machine; a multiple of 4 rows keeps row blocks whole.
  const int block = std::max(4, (rows / (8 * opts_.threads) + 3) / 4 * 4);
  const int tasks = (rows + block - 1) / block;
  parallel(tasks, double(W.rows) * double(W.cols) * T, [&](int i, int) {
    const int r0 = i * block;
    fn(W, x, T, y, rows, r0, std::min(rows, r0 + block));
  });
}

void CpuBackend::add(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuBackend::situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* out) {
  k_->situ(g, u, size_t(T) * n, b1, b2, out);
}

void CpuBackend::silu_glu(const float* g, const float* u, int T, int n, float* out) {
  for (size_t i = 0; i < size_t(T) * n; ++i) out[i] = g[i] * cpu::sigmoid(g[i]) * u[i];
}

void CpuBackend::sigmoid_gate(float* y, const float* gate, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= cpu::sigmoid(gate[i]);
}

}  // namespace wren
