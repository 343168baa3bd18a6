// CUDA backend: device selection, the compute stream, weight upload (host-pointer -> device map;
// weights placed at load, place.cu, are in the map under their own device address),
// device memory ops and scratch. Layout: activations f32 device buffers from alloc(); weights in
// arenas, each tensor 256-byte aligned (dense f32 [rows, cols]; expert packed then scale bytes).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_common.cuh"
#include "ops/weights.h"

namespace wren {

using cuda::check_cuda;

bool cuda_device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // No driver at all reads "CUDA driver version is insufficient" (cudaErrorInsufficientDriver),
    // which misleads on a machine without a GPU: say what it means first.
    const bool none = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver;
    if (why)
      *why = std::string(none ? "no NVIDIA GPU/driver found (" : "cudaGetDeviceCount failed (") + cudaGetErrorName(err) +
             ": " + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (n == 0) {
    if (why) *why = "no NVIDIA GPU/driver found (cudaGetDeviceCount reports 0 devices)";
    return false;
  }
  return true;
}

// ---- Impl ----

const float* CudaBackend::Impl::dense(const DenseWeight& w, const char* op) const {
  if (w.format != WFormat::F32)
    throw Error(std::string("CUDA backend: ") + op + ": weight [" + std::to_string(w.rows) + ", " +
                std::to_string(w.cols) + "] is " + wformat_name(w.format) + "; this op reads f32 only");
  const auto it = weights.find(w.data);
  if (it == weights.end())
    throw Error(std::string("CUDA backend: ") + op + ": weight [" + std::to_string(w.rows) + ", " +
                std::to_string(w.cols) + "] has no device copy (call CudaBackend::upload first)");
  return static_cast<const float*>(it->second.ptr);
}

const uint8_t* CudaBackend::Impl::bytes(const uint8_t* host, const char* op) const {
  const auto it = weights.find(host);
  if (it == weights.end())
    throw Error(std::string("CUDA backend: ") + op +
                ": MXFP4 expert tensor has no device copy (call CudaBackend::upload first)");
  return static_cast<const uint8_t*>(it->second.ptr);
}

unsigned long long* CudaBackend::Impl::traffic_counters() {
  if (!expert_traffic && !capturing) {
    cuda::check_cuda(cudaMalloc(&expert_traffic, 2 * sizeof(unsigned long long)), "cudaMalloc (expert traffic counters)");
    cuda::check_cuda(cudaMemsetAsync(expert_traffic, 0, 2 * sizeof(unsigned long long), stream),
                     "cudaMemsetAsync (expert traffic counters)");
  }
  return expert_traffic;
}

void* CudaBackend::Impl::scratch(cuda::Scratch& s, size_t n) {
  if (s.bytes >= n) return s.ptr;
  // While recording a graph the old buffer may still be named by queued work and cudaFree would
  // synchronize: free it after the launch. Growth by at least 1.5x keeps decode (whose MLA score
  // span grows by one token a step) from reallocating every step.
  if (s.ptr) {
    if (capturing) deferred_free.push_back(s.ptr);
    else check_cuda(cudaFree(s.ptr), "cudaFree (scratch)");
  }
  const size_t grown = s.bytes + s.bytes / 2;
  s.ptr = nullptr;
  s.bytes = 0;
  const size_t want = std::max({n, grown, size_t(256)});
  check_cuda(cudaMalloc(&s.ptr, want), ("cudaMalloc of " + std::to_string(want) + " scratch bytes").c_str());
  s.bytes = want;
  return s.ptr;
}

void* CudaBackend::Impl::counter_scratch(cuda::Scratch& s, size_t n, const char* what) {
  const size_t had = s.bytes;
  void* p = scratch(s, n);
  if (s.bytes != had) {
    check_cuda(cudaMemsetAsync(p, 0, s.bytes, stream), what);
    if (capturing) zero_pending.push_back(&s);
  }
  return p;
}

void CudaBackend::Impl::rezero_pending() noexcept {
  for (cuda::Scratch* s : zero_pending)
    if (s->ptr) cudaMemsetAsync(s->ptr, 0, s->bytes, stream);
  zero_pending.clear();
}

void CudaBackend::Impl::launched(const char* what) {
  ++(capturing ? stats.graph_kernels : stats.launches);
  if (opts.fault_at != 0 && stats.launches + stats.graph_kernels == opts.fault_at)
    throw DeviceError(std::string("CUDA backend: ") + what + ": injected fault at launch " +
                      std::to_string(opts.fault_at) + " (--cuda-fault-at)");
  check_cuda(cudaGetLastError(), what);
  if (profiling && !capturing) prof_mark(what);
}

void CudaBackend::Impl::prof_mark(const char* what) {
  const size_t i = prof_labels.size();
  if (i == prof_events.size()) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cudaEventCreate (profile)");
    prof_events.push_back(e);
  }
  check_cuda(cudaEventRecord(prof_events[i], stream), "cudaEventRecord (profile)");
  prof_labels.emplace_back(what);
}

void CudaBackend::profile_begin() {
  Impl& m = *impl_;
  m.sync("profile begin");
  m.prof_labels.clear();
  m.profiling = true;
  m.prof_mark("(span start)");
}

std::vector<CudaOpTime> CudaBackend::profile_end(double* total_ms) {
  Impl& m = *impl_;
  m.profiling = false;  // before the sync: its own mark would not have completed
  m.sync("profile end");
  std::vector<CudaOpTime> out;
  std::unordered_map<std::string, size_t> at;
  double total = 0;
  for (size_t i = 1; i < m.prof_labels.size(); ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, m.prof_events[i - 1], m.prof_events[i]), "cudaEventElapsedTime (profile)");
    auto [it, fresh] = at.emplace(m.prof_labels[i], out.size());
    if (fresh) out.push_back({m.prof_labels[i], 0, 0});
    out[it->second].ms += ms;
    ++out[it->second].launches;
    total += ms;
  }
  m.prof_labels.clear();
  std::sort(out.begin(), out.end(), [](const CudaOpTime& a, const CudaOpTime& b) { return a.ms > b.ms; });
  if (total_ms) *total_ms = total;
  return out;
}

void CudaBackend::inject_fault(uint64_t at_launch) { impl_->opts.fault_at = at_launch; }

const CudaOptions& CudaBackend::options() const { return impl_->opts; }

void CudaBackend::set_options(const CudaOptions& o) {
  check_cuda_options(o, "CUDA backend options");
  impl_->opts = o;
}

void CudaBackend::Impl::sync(const char* what) {
  if (capturing)
    throw Error(std::string("CUDA backend: ") + what + " waits for the host while a decode graph is being recorded");
  ++stats.host_syncs;
  check_cuda(cudaStreamSynchronize(stream), what);
  if (profiling) prof_mark((std::string("host sync: ") + what).c_str());
}

// ---- lifetime ----

CudaBackend::CudaBackend(int device, const CudaOptions& options) : impl_(std::make_unique<Impl>()) {
  check_cuda_options(options, "CUDA backend options");
  impl_->opts = options;
  std::string why;
  if (!cuda_device_available(&why)) throw Error("no CUDA device: " + why);
  int n = 0;
  check_cuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  check(device >= 0 && device < n, "no CUDA device: device " + std::to_string(device) + " requested, " +
                                       std::to_string(n) + " present");
  impl_->device = device;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaDeviceGetAttribute(&impl_->sm_count, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute (multiprocessor count)");
  check_cuda(cudaDeviceGetAttribute(&impl_->max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
}

CudaBackend::~CudaBackend() {
  Impl& m = *impl_;
  if (m.stream) cudaStreamSynchronize(m.stream);
  cuda::lt_destroy(m);
  cuda::placer_destroy(m);
  for (cuda::Scratch* s : {&m.ids, &m.act, &m.scores, &m.router_ids, &m.router_w, &m.pair_table, &m.gemv_part, &m.gemv_count,
                            &m.argmax_part, &m.argmax_count, &m.mx_queue, &m.dense_queue})
    if (s->ptr) cudaFree(s->ptr);
  for (void* a : m.arenas) cudaFree(a);
  m.tier_reset();
  for (auto& [w, t] : m.tables)
    if (t.dev) cudaFree(t.dev);
  for (void* p : m.deferred_free) cudaFree(p);
  for (const auto& [rows, exec] : m.graph_execs)
    if (exec && exec != m.graph_exec) cudaGraphExecDestroy(exec);
  if (m.graph_exec) cudaGraphExecDestroy(m.graph_exec);
  if (m.expert_traffic) cudaFree(m.expert_traffic);
  for (const auto& [w, p] : m.kvb_f32) cudaFree(p);
  for (cudaEvent_t e : m.prof_events) cudaEventDestroy(e);
  if (m.pinned_ids) cudaFreeHost(m.pinned_ids);
  if (m.pinned_w) cudaFreeHost(m.pinned_w);
  if (m.stream) cudaStreamDestroy(m.stream);
}

CudaStats CudaBackend::stats() const {
  Impl& m = *impl_;
  CudaStats s = m.stats;
  if (m.expert_traffic && !m.capturing) {  // the device counters of the grouped routed MoE
    unsigned long long c[2] = {0, 0};
    check_cuda(cudaMemcpyAsync(c, m.expert_traffic, sizeof(c), cudaMemcpyDeviceToHost, m.stream),
               "cudaMemcpyAsync (expert traffic counters)");
    check_cuda(cudaStreamSynchronize(m.stream), "expert traffic counters");
    s.device_expert_visits = c[0], s.device_expert_bytes = c[1];
  }
  return s;
}

void CudaBackend::set_precision(GpuPrecision p) {
  impl_->opts.precision = p;
  impl_->opts.kda = p == GpuPrecision::Fast ? CudaKda::Chunked : CudaKda::Recurrent;
}
GpuPrecision CudaBackend::precision() const { return impl_->opts.precision; }

uint64_t CudaBackend::free_device_bytes() const {
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

void CudaBackend::synchronize() { impl_->sync("synchronize"); }

// ---- upload ----

namespace {

/// One host tensor to mirror.
struct Piece {
  const void* host;
  size_t bytes;
};

/// A dense weight's bytes as stored (f32, bf16, int8, or Q4_G64 groups) and, for Q8_ROW / Q4_G64,
/// its f32 scale array as a second tensor (both keyed by their host pointers).
void add_dense(std::vector<Piece>& out, const DenseWeight& w, const Backend* self) {
  if (!w.data) return;
  const std::string what = "CUDA backend: upload: " + std::string(wformat_name(w.format)) + " dense weight [" +
                           std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]";
  if (w.placed_on == self) return;  // placed in this backend's memory at load (place.cu)
  check(w.placed_on == nullptr, what + " lives in another backend's memory (placed there at load)");
  check(w.format != WFormat::F32 || w.dtype == DType::F32, what + " has element type other than f32");
  out.push_back({w.data, wformat_data_bytes(w.format, w.rows, w.cols)});
  if (const size_t ns = wformat_scale_count(w.format, w.rows, w.cols); ns != 0) {
    check(w.scale != nullptr, what + " has no scale array");
    out.push_back({w.scale, ns * sizeof(float)});
  }
}

void add_mx(std::vector<Piece>& out, const MxMatrix& m) {
  if (!m.packed) return;
  check(m.cols % 32 == 0, "CUDA backend: upload: MXFP4 matrix with " + std::to_string(m.cols) +
                              " columns (must be a multiple of 32)");
  out.push_back({m.packed, size_t(m.rows) * size_t(m.cols / 2)});
  out.push_back({m.scale, size_t(m.rows) * size_t(m.cols / 32)});
}

void add_expert(std::vector<Piece>& out, const ExpertRef& e, const Backend* self) {
  if (!e.w1.packed) {  // dense experts (Kimi Linear)
    for (const DenseWeight* d : {&e.d1, &e.d2, &e.d3}) add_dense(out, *d, self);
    return;
  }
  add_mx(out, e.w1);
  add_mx(out, e.w2);
  add_mx(out, e.w3);
}

/// Mirrors `pieces`: a host tensor already in the map is copied again into its device slot when
/// that slot is large enough (so a re-upload refreshes the contents, and a host address reused by a
/// new tensor never serves stale bytes, docs/gpu-method.md#residency); the others go into one new
/// device arena and are added to the map.
void upload_pieces(CudaBackend::Impl& m, const std::vector<Piece>& pieces) {
  constexpr size_t kAlign = 256;
  check(!m.capturing, "CUDA backend: upload while a decode graph is being recorded");
  ++m.generation;  // routed_moe's expert tables are rebuilt from the (possibly changed) map
  for (const auto& [w, p] : m.kvb_f32) check_cuda(cudaFree(p), "cudaFree (MLA kv_b decode)");  // decoded again
  m.kvb_f32.clear();
  m.eager_rows.clear();  // derived copies are made again: a batch size runs op by op first again
  std::vector<Piece> fresh;
  std::unordered_map<const void*, size_t> seen;  // host -> index in `fresh` or SIZE_MAX (refreshed)
  for (const Piece& p : pieces) {
    if (const auto s = seen.find(p.host); s != seen.end()) {  // the same tensor listed twice
      if (s->second != SIZE_MAX) fresh[s->second].bytes = std::max(fresh[s->second].bytes, p.bytes);
      else check(m.weights[p.host].bytes >= p.bytes, "CUDA backend: upload: one host tensor given with two sizes");
      continue;
    }
    const auto it = m.weights.find(p.host);
    if (it != m.weights.end() && it->second.bytes >= p.bytes) {
      // On the compute stream: ordered after every queued op that may still read the old bytes.
      check_cuda(cudaMemcpyAsync(it->second.ptr, p.host, p.bytes, cudaMemcpyHostToDevice, m.stream),
                 "cudaMemcpyAsync (weight refresh)");
      it->second.bytes = p.bytes;
      m.stats.uploaded_bytes += p.bytes;
      seen[p.host] = SIZE_MAX;
      continue;
    }
    seen[p.host] = fresh.size();
    fresh.push_back(p);
  }
  if (fresh.empty()) {
    m.sync("upload");
    return;
  }
  size_t total = 0;
  for (const Piece& p : fresh) total += (p.bytes + kAlign - 1) / kAlign * kAlign;
  void* arena = nullptr;
  check_cuda(cudaMalloc(&arena, total), ("cudaMalloc of a " + std::to_string(total) + "-byte weight arena").c_str());
  m.arenas.push_back(arena);
  size_t off = 0;
  for (const Piece& p : fresh) {
    char* dst = static_cast<char*>(arena) + off;
    check_cuda(cudaMemcpyAsync(dst, p.host, p.bytes, cudaMemcpyHostToDevice, m.stream), "cudaMemcpyAsync (weight upload)");
    m.weights[p.host] = {dst, p.bytes};
    off += (p.bytes + kAlign - 1) / kAlign * kAlign;
    m.stats.uploaded_bytes += p.bytes;
  }
  m.stats.resident_tensors = m.weights.size();
  m.sync("upload");
}

}  // namespace

void CudaBackend::upload(const WeightList& w) {
  std::vector<Piece> p, experts;
  for (const DenseWeight* d : w.dense) add_dense(p, *d, this);
  for (const std::vector<ExpertRef>* layer : w.experts)
    for (const ExpertRef& e : *layer) add_expert(experts, e, this);
  upload_pieces(*impl_, p);
  // Routed experts: all resident when they fit the VRAM expert budget, else the tier's slots.
  uint64_t expert_bytes = 0;
  std::unordered_map<const void*, size_t> distinct;
  for (const Piece& q : experts) distinct[q.host] = std::max(distinct[q.host], q.bytes);
  for (const auto& [h, b] : distinct) expert_bytes += b;
  if (!impl_->tier_setup(w, expert_bytes)) upload_pieces(*impl_, experts);
}

void CudaBackend::upload(const DenseWeight& w) {
  std::vector<Piece> p;
  add_dense(p, w, this);
  upload_pieces(*impl_, p);
}

void CudaBackend::upload(const ExpertRef& e) {
  std::vector<Piece> p;
  add_expert(p, e, this);
  upload_pieces(*impl_, p);
}

// ---- memory ops ----

float* CudaBackend::alloc(size_t n) {
  void* p = nullptr;
  const size_t bytes = (n ? n : 1) * sizeof(float);
  check_cuda(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  check_cuda(cudaMemsetAsync(p, 0, bytes, impl_->stream), "cudaMemsetAsync (alloc)");
  return static_cast<float*>(p);
}

void CudaBackend::release(float* p) {
  // Called from destructors: report, never throw.
  const cudaError_t err = cudaFree(p);
  if (err != cudaSuccess && !impl_->free_failed) {  // after a device failure every free fails: say it once
    impl_->free_failed = true;
    std::fprintf(stderr, "wren: CUDA backend: cudaFree failed: %s (further failures not reported)\n", cudaGetErrorString(err));
  }
}

void CudaBackend::to_host(const float* src, size_t n, float* dst) {
  check_cuda(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, impl_->stream),
             "cudaMemcpyAsync (to_host)");
  impl_->sync("to_host");
}

void CudaBackend::from_host(const float* src, size_t n, float* dst) {
  check_cuda(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, impl_->stream),
             "cudaMemcpyAsync (from_host)");
  impl_->sync("from_host");  // the caller may reuse `src` at once
}

void CudaBackend::copy(const float* src, size_t n, float* dst) {
  if (n == 0 || src == dst) return;
  const size_t bytes = n * sizeof(float);
  const char *s = reinterpret_cast<const char*>(src), *d = reinterpret_cast<const char*>(dst);
  if (s < d + bytes && d < s + bytes) {  // overlapping (memmove semantics): stage through scratch
    void* tmp = impl_->scratch(impl_->scores, bytes);
    check_cuda(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream), "cudaMemcpyAsync (copy)");
    check_cuda(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, impl_->stream), "cudaMemcpyAsync (copy)");
    return;
  }
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream), "cudaMemcpyAsync (copy)");
}

void CudaBackend::fill_zero(float* p, size_t n) {
  check_cuda(cudaMemsetAsync(p, 0, n * sizeof(float), impl_->stream), "cudaMemsetAsync (fill_zero)");
}

}  // namespace wren
