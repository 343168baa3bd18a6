// The greedy draw: the first index of a row's largest value. One definition for the host sampler,
// the backends' argmax_rows (the CUDA kernel gives the same index) and the benchmarks.
#pragma once
#include <cmath>

namespace wren {

/// Index of the largest of logits[0, n); ties go to the lower id (the strict '>' scan from index
/// 0). -0 and +0 are equal. A NaN never wins, except at index 0, where the scan keeps it.
/// Two passes the compiler can vectorize (8 independent running maxima, then the first index
/// equal to their maximum): a 163,840-id row took ~0.67 ms with a one-pass scan on the GPU
/// machine's host (bench batch, run 24-serve).
inline int argmax(const float* logits, int n) {
  if (n <= 1 || std::isnan(logits[0])) return 0;
  float m[8];
  for (float& x : m) x = logits[0];
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) m[j] = logits[i + j] > m[j] ? logits[i + j] : m[j];
  float best = m[0];
  for (int j = 1; j < 8; ++j) best = m[j] > best ? m[j] : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (i = 0; i < n; ++i)
    if (logits[i] == best) return i;
  return 0;
}

/// The greedy id of a logits row that must be finite (Backend::argmax_rows' rule): argmax(row, n),
/// or -1 when the row holds a NaN or an infinity.
inline int finite_argmax(const float* row, int n) {
  for (int i = 0; i < n; ++i)
    if (!std::isfinite(row[i])) return -1;
  return argmax(row, n);
}

}  // namespace wren
