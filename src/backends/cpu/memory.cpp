// CPU backend: host memory ops.
#include <cstdlib>
#include <cstring>
#include <new>

#include "backends/cpu/cpu_backend.h"

namespace wren {

float* CpuBackend::alloc(size_t n) {
  void* p = std::calloc(n ? n : 1, sizeof(float));
  if (!p) throw std::bad_alloc();
  return static_cast<float*>(p);
}
void CpuBackend::release(float* p) { std::free(p); }
void CpuBackend::to_host(const float* src, size_t n, float* dst) { std::memcpy(dst, src, n * 4); }
void CpuBackend::from_host(const float* src, size_t n, float* dst) { std::memcpy(dst, src, n * 4); }
void CpuBackend::copy(const float* src, size_t n, float* dst) { std::memmove(dst, src, n * 4); }
void CpuBackend::fill_zero(float* p, size_t n) { std::memset(p, 0, n * 4); }

}  // namespace wren
