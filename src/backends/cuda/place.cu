// Weight placement at load (Backend::place_dense, model/load.h LoadOptions::place_on): each dense
// matrix goes from the mapped checkpoint through a pinned staging buffer to device memory, and is
// upcast to f32 on the device where its format is F32 (BF16/F16 -> f32 is exact, so the device
// copy holds the same bits as the CPU loader's host copy). No host copy of the tensor is made;
// the loader drops the tensor's mapped pages once this returns.
//
// Staging: kBufs pinned buffers of kChunk bytes used in turn. For each chunk the host waits for
// that buffer's previous copy (its event), copies the chunk out of the mapping into it (the page
// faults of the mapping happen here), and queues the host-to-device copy and, for BF16/F16 data,
// the upcast kernel; so reading the next chunk overlaps the transfer of the last one. Placed
// weights live in 256-byte aligned slices of device arena blocks (Impl::arenas) and are entered in
// the weight map under their own device address (UVA keeps device and host addresses apart), so
// every op finds them as it finds uploaded ones. Finite check: a kernel over each placed f32
// (or stored BF16) weight keeps the lowest index of a tensor holding a NaN or an infinity (atomicMin on one device
// int); place_finish reads it once and names that tensor.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.cuh"

namespace wren {

using cuda::check_cuda;

namespace cuda {

struct Placer {
  static constexpr size_t kChunk = size_t(64) << 20;
  static constexpr int kBufs = 2;
  static constexpr size_t kBlock = size_t(256) << 20;  ///< arena block size (a larger tensor gets its own)
  uint8_t* pinned[kBufs] = {};
  void* raw[kBufs] = {};  ///< device staging of stored BF16/F16 chunks before the upcast
  cudaEvent_t done[kBufs] = {};
  int next = 0;
  char* block = nullptr;  ///< current arena block
  size_t used = 0, cap = 0;
  int* bad = nullptr;     ///< device: lowest index in `names` of a non-finite f32 weight, INT_MAX = none
  std::vector<std::string> names;  ///< the f32 weights placed (their PlaceRequest::where)
};

namespace {

constexpr size_t kAlign = 256;

/// 0: check f32 in place; 1: BF16 -> f32; 2: F16 -> f32. Grid-stride over n elements.
__global__ void upcast_kernel(const void* __restrict__ src, int mode, size_t n, float* __restrict__ dst) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    if (mode == 1) dst[i] = __uint_as_float(uint32_t(static_cast<const uint16_t*>(src)[i]) << 16);
    else if (mode == 2) dst[i] = __half2float(static_cast<const __half*>(src)[i]);
  }
}

/// Keeps idx in *bad when an element of v [n] has its exponent all ones (NaN or ±Inf): f32 words,
/// or BF16 words when `bf16`.
__global__ void finite_kernel(const void* __restrict__ v, bool bf16, size_t n, int idx, int* bad) {
  uint32_t any = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    any |= bf16 ? uint32_t((static_cast<const uint16_t*>(v)[i] & 0x7f80u) == 0x7f80u)
                : uint32_t((__float_as_uint(static_cast<const float*>(v)[i]) & 0x7f800000u) == 0x7f800000u);
  if (__any_sync(kFull, any) && (threadIdx.x & (kWarp - 1)) == 0) atomicMin(bad, idx);
}

Placer& placer(CudaBackend::Impl& m) {
  if (m.placer) return *m.placer;
  auto* p = new Placer;
  m.placer = p;  // owned from here on (placer_destroy frees what was made so far)
  for (int b = 0; b < Placer::kBufs; ++b) {
    check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&p->pinned[b]), Placer::kChunk, cudaHostAllocDefault),
               "cudaHostAlloc (weight staging)");
    check_cuda(cudaMalloc(&p->raw[b], Placer::kChunk), "cudaMalloc (weight staging)");
    check_cuda(cudaEventCreateWithFlags(&p->done[b], cudaEventDisableTiming), "cudaEventCreate (weight staging)");
  }
  check_cuda(cudaMalloc(&p->bad, sizeof(int)), "cudaMalloc (placement check)");
  const int none = INT_MAX;
  check_cuda(cudaMemcpy(p->bad, &none, sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy (placement check)");
  return *p;
}

/// `bytes` of device memory for one placed tensor, 256-byte aligned, from the current arena block.
char* carve(CudaBackend::Impl& m, Placer& p, size_t bytes) {
  const size_t need = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (!p.block || p.used + need > p.cap) {
    const size_t cap = std::max(need, Placer::kBlock);
    void* a = nullptr;
    check_cuda(cudaMalloc(&a, cap), ("cudaMalloc of a " + std::to_string(cap) + "-byte weight arena").c_str());
    m.arenas.push_back(a);
    p.block = static_cast<char*>(a), p.used = 0, p.cap = cap;
  }
  char* at = p.block + p.used;
  p.used += need;
  return at;
}

/// Streams `bytes` host bytes at `src` into device memory: as they are into `dst` (mode 0), or
/// as BF16/F16 elements upcast into the f32 array `dst` (mode 1/2).
void stream_in(CudaBackend::Impl& m, Placer& p, const uint8_t* src, size_t bytes, int mode, void* dst,
               const std::function<void(size_t, size_t)>& consumed = {}) {
  const size_t esz = mode == 0 ? 1 : 2;
  for (size_t off = 0; off < bytes; off += Placer::kChunk) {
    const size_t len = std::min(Placer::kChunk, bytes - off);
    const int b = p.next;
    p.next = (p.next + 1) % Placer::kBufs;
    check_cuda(cudaEventSynchronize(p.done[b]), "cudaEventSynchronize (weight staging)");
    std::memcpy(p.pinned[b], src + off, len);
    if (consumed) consumed(off, len);  // read out of the mapping: the loader may drop those pages
    if (mode == 0) {
      check_cuda(cudaMemcpyAsync(static_cast<char*>(dst) + off, p.pinned[b], len, cudaMemcpyHostToDevice, m.stream),
                 "cudaMemcpyAsync (weight placement)");
    } else {
      check_cuda(cudaMemcpyAsync(p.raw[b], p.pinned[b], len, cudaMemcpyHostToDevice, m.stream),
                 "cudaMemcpyAsync (weight placement)");
      const size_t n = len / esz;
      upcast_kernel<<<grid_for(n, 256, 4096), 256, 0, m.stream>>>(p.raw[b], mode, n, static_cast<float*>(dst) + off / esz);
      check_cuda(cudaGetLastError(), "place_dense (upcast)");  // not counted as a launch: fault_at counts ops
    }
    check_cuda(cudaEventRecord(p.done[b], m.stream), "cudaEventRecord (weight staging)");
  }
}

}  // namespace

void placer_destroy(CudaBackend::Impl& m) noexcept {
  Placer* p = m.placer;
  if (!p) return;
  m.placer = nullptr;
  if (m.stream) cudaStreamSynchronize(m.stream);
  for (int b = 0; b < Placer::kBufs; ++b) {
    if (p->pinned[b]) cudaFreeHost(p->pinned[b]);
    if (p->raw[b]) cudaFree(p->raw[b]);
    if (p->done[b]) cudaEventDestroy(p->done[b]);
  }
  if (p->bad) cudaFree(p->bad);
  delete p;
}

}  // namespace cuda

void CudaBackend::place_dense(DenseWeight& w, const PlaceRequest& r) {
  Impl& m = *impl_;
  check(!m.capturing, "CUDA backend: place_dense while a decode graph is being recorded");
  check(w.rows > 0 && w.cols > 0, "CUDA backend: place_dense: " + r.where + ": empty weight");
  cuda::Placer& p = cuda::placer(m);
  const auto* src = static_cast<const uint8_t*>(r.src);
  char* data = nullptr;
  size_t data_bytes = 0;
  if (w.format == WFormat::F32) {
    const size_t n = size_t(w.rows) * size_t(w.cols);
    check(r.count == n, "CUDA backend: place_dense: " + r.where + ": " + std::to_string(r.count) +
                            " elements given for a [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] weight");
    const int mode = r.src_dtype == DType::F32 ? 0 : r.src_dtype == DType::BF16 ? 1 : r.src_dtype == DType::F16 ? 2 : -1;
    check(mode >= 0, "CUDA backend: place_dense: " + r.where + ": stored dtype " + dtype_name(r.src_dtype) +
                         ", expected BF16, F16 or F32");
    data_bytes = n * sizeof(float);
    data = cuda::carve(m, p, data_bytes);
    cuda::stream_in(m, p, src, n * dtype_size(r.src_dtype), mode, data, r.consumed);
    const int idx = int(p.names.size());
    p.names.push_back(r.where);
    cuda::finite_kernel<<<cuda::grid_for(n, 256, 4096), 256, 0, m.stream>>>(data, false, n, idx, p.bad);
    check_cuda(cudaGetLastError(), "place_dense (finite check)");
    w.dtype = DType::F32;
    w.scale = nullptr;
  } else {
    data_bytes = wformat_data_bytes(w.format, w.rows, w.cols);
    check(r.count == data_bytes, "CUDA backend: place_dense: " + r.where + ": " + std::to_string(r.count) + " bytes given, " +
                                     wformat_name(w.format) + " needs " + std::to_string(data_bytes));
    data = cuda::carve(m, p, data_bytes);
    cuda::stream_in(m, p, src, data_bytes, 0, data, r.consumed);
    if (r.src_dtype == DType::BF16) {  // stored BF16 kept as it is: checked here (packed data by the loader)
      const size_t n = data_bytes / 2;
      const int idx = int(p.names.size());
      p.names.push_back(r.where);
      cuda::finite_kernel<<<cuda::grid_for(n, 256, 4096), 256, 0, m.stream>>>(data, true, n, idx, p.bad);
      check_cuda(cudaGetLastError(), "place_dense (finite check)");
    }
    const size_t ns = wformat_scale_count(w.format, w.rows, w.cols);
    w.scale = nullptr;
    if (ns) {
      check(r.scale != nullptr, "CUDA backend: place_dense: " + r.where + ": " + wformat_name(w.format) + " weight without its scales");
      char* sc = cuda::carve(m, p, ns * sizeof(float));
      cuda::stream_in(m, p, reinterpret_cast<const uint8_t*>(r.scale), ns * sizeof(float), 0, sc);
      m.weights[sc] = {sc, ns * sizeof(float)};
      m.stats.uploaded_bytes += ns * sizeof(float);
      w.scale = reinterpret_cast<const float*>(sc);
    }
    w.dtype = w.format == WFormat::BF16 ? DType::BF16 : w.format == WFormat::Q8_ROW ? DType::I8 : DType::U8;
  }
  m.weights[data] = {data, data_bytes};
  m.stats.uploaded_bytes += data_bytes;
  m.stats.resident_tensors = m.weights.size();
  w.data = data;
  w.placed_on = this;
  // r.src / r.scale are read in full by now (copied into the pinned buffers), so the caller may
  // free them; the queued copies and kernels run on while the next tensor is read.
}

void CudaBackend::place_finish() {
  Impl& m = *impl_;
  if (!m.placer) return;
  m.sync("place_finish");
  int bad = INT_MAX;
  check_cuda(cudaMemcpy(&bad, m.placer->bad, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy (placement check)");
  const std::string name = bad != INT_MAX && size_t(bad) < m.placer->names.size() ? m.placer->names[size_t(bad)] : "";
  cuda::placer_destroy(m);
  ++m.generation;
  for (const auto& [w, p] : m.kvb_f32) cuda::check_cuda(cudaFree(p), "cudaFree (MLA kv_b decode)");  // decoded again
  m.kvb_f32.clear();
  m.eager_rows.clear();  // derived copies are made again: a batch size runs op by op first again
  if (!name.empty())
    throw Error(name + ": holds a NaN or an infinity; every weight must be a finite number");
}

}  // namespace wren
