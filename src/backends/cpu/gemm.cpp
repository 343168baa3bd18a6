// CPU backend: embedding lookup, f32 GEMM/GEMV and element-wise ops.
// Layout: W [rows, cols] row-major (PyTorch Linear [out, in]); x [T, cols]; y [T, rows].
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

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
}  // namespace cpu

void CpuBackend::embed(const DenseWeight& table, const int* ids, int T, float* x) {
  for (int t = 0; t < T; ++t) {
    check(ids[t] >= 0 && ids[t] < table.rows,
          "token id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
              std::to_string(table.rows) + ")");
    std::memcpy(x + size_t(t) * table.cols, table.f32() + size_t(ids[t]) * table.cols, table.cols * 4);
  }
}

void CpuBackend::gemm(const DenseWeight& W, const float* x, int T, float* y) {
  const float* w = W.f32();
  const int rows = int(W.rows), cols = int(W.cols);
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < rows; ++r)
      y[size_t(t) * rows + r] = cpu::dot(w + size_t(r) * cols, x + size_t(t) * cols, cols);
}

void CpuBackend::add(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuBackend::situ_glu(const float* g, const float* u, int T, int n, float b1, float b2, float* out) {
  for (size_t i = 0; i < size_t(T) * n; ++i) out[i] = cpu::situ(g[i], u[i], b1, b2);
}

void CpuBackend::silu_glu(const float* g, const float* u, int T, int n, float* out) {
  for (size_t i = 0; i < size_t(T) * n; ++i) out[i] = g[i] * cpu::sigmoid(g[i]) * u[i];
}

void CpuBackend::sigmoid_gate(float* y, const float* gate, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= cpu::sigmoid(gate[i]);
}

}  // namespace wren
