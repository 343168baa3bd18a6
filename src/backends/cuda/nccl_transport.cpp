// The NCCL transport (see nccl_transport.h). NCCL's functions are resolved with dlsym from
// libnccl.so.2 at the first NcclTransport, so the binary does not need the library to start.
#include "backends/cuda/nccl_transport.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ops/backend.h"

#if defined(WREN_HAVE_CUDA) && defined(WREN_HAVE_NCCL)
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <type_traits>
#endif

namespace wren {

namespace {

/// An integer environment variable: false when unset; throws when set to anything but an integer.
bool env_int(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (!v) return false;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  check(*v != '\0' && *end == '\0' && x >= 0 && x < (1 << 20),
        std::string(name) + "='" + v + "' is not a rank number (expected a non-negative integer)");
  *out = int(x);
  return true;
}

}  // namespace

bool nccl_world_from_env(const std::string& id_file, NcclWorldOptions* out) {
  NcclWorldOptions o;
  o.id_file = id_file;
  bool found = env_int("RANK", &o.rank) && env_int("WORLD_SIZE", &o.world);
  if (found) {
    if (!env_int("LOCAL_RANK", &o.device)) o.device = o.rank;
  } else {
    found = env_int("OMPI_COMM_WORLD_RANK", &o.rank) && env_int("OMPI_COMM_WORLD_SIZE", &o.world);
    if (found && !env_int("OMPI_COMM_WORLD_LOCAL_RANK", &o.device)) o.device = o.rank;
  }
  if (!found) return false;
  check(o.world >= 1 && o.rank < o.world, "rank " + std::to_string(o.rank) + " is not below the world size " +
                                              std::to_string(o.world) + " (RANK / WORLD_SIZE)");
  *out = o;
  return true;
}

#if defined(WREN_HAVE_CUDA) && defined(WREN_HAVE_NCCL)

bool nccl_built() { return true; }

namespace {

/// The NCCL entry points Wren uses, from libnccl.so.2.
struct NcclApi {
  void* lib = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  std::string why;  ///< dlopen's error when the library is missing
};

const NcclApi& nccl_api() {
  static const NcclApi api = [] {
    NcclApi a;
    a.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!a.lib) a.lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!a.lib) {
      const char* e = dlerror();
      a.why = e ? e : "not found";
      return a;
    }
    auto sym = [&](auto& f, const char* name) { f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(a.lib, name)); };
    sym(a.get_unique_id, "ncclGetUniqueId");
    sym(a.comm_init_rank, "ncclCommInitRank");
    sym(a.comm_destroy, "ncclCommDestroy");
    sym(a.send, "ncclSend");
    sym(a.recv, "ncclRecv");
    sym(a.group_start, "ncclGroupStart");
    sym(a.group_end, "ncclGroupEnd");
    sym(a.error_string, "ncclGetErrorString");
    return a;
  }();
  if (!api.lib)
    throw Error("NCCL transport: cannot load libnccl.so.2 (" + api.why +
                "); install NCCL or add its lib folder to LD_LIBRARY_PATH");
  check(api.get_unique_id && api.comm_init_rank && api.comm_destroy && api.send && api.recv && api.group_start &&
            api.group_end && api.error_string,
        "NCCL transport: libnccl.so.2 lacks ncclSend/ncclRecv (NCCL 2.7 or later is needed)");
  return api;
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("NCCL ") + what + ": " + nccl_api().error_string(r));
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("NCCL transport: ") + what + ": " + cudaGetErrorString(e));
}

/// Rank 0 writes the id (tmp file, then rename: readers never see half of it); the others poll.
ncclUniqueId rendezvous(const NcclApi& api, const NcclWorldOptions& o) {
  ncclUniqueId id{};
  check(!o.id_file.empty() || o.world == 1, "NCCL transport: ranks need an id file to meet (--nccl-id-file)");
  if (o.rank == 0) {
    nccl_check(api.get_unique_id(&id), "ncclGetUniqueId");
    if (o.world == 1) return id;
    const std::string tmp = o.id_file + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(id.internal, sizeof id.internal);
      check(bool(f), "NCCL transport: cannot write " + tmp);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, o.id_file, ec);
    check(!ec, "NCCL transport: cannot rename " + tmp + " to " + o.id_file + ": " + ec.message());
    return id;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    std::ifstream f(o.id_file, std::ios::binary);
    if (f && f.read(id.internal, sizeof id.internal)) return id;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check(s < o.timeout_s, "NCCL transport: rank " + std::to_string(o.rank) + " waited " + std::to_string(int(s)) +
                               " s for rank 0's id file " + o.id_file);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Waits until every op `be` has queued is done (the CUDA backend's to_host synchronizes its stream).
void drain(Backend& be, const float* buf, size_t n) {
  if (n == 0) return;
  float last;
  be.to_host(buf + n - 1, 1, &last);
}

}  // namespace

struct NcclTransport::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int* staging = nullptr;  ///< device int32 for send_host / recv_host
  size_t staging_n = 0;
  int* host_stage(size_t n) {
    if (n > staging_n) {
      if (staging) cudaFree(staging);
      staging = nullptr;
      cuda_check(cudaMalloc(&staging, n * sizeof(int)), "cudaMalloc");
      staging_n = n;
    }
    return staging;
  }
  void sync() { cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after an NCCL call"); }
};

NcclTransport::NcclTransport(const NcclWorldOptions& o) : impl_(std::make_unique<Impl>()), rank_(o.rank), world_(o.world) {
  check(o.world >= 1 && o.rank >= 0 && o.rank < o.world, "NCCL transport: rank " + std::to_string(o.rank) +
                                                             " of a world of " + std::to_string(o.world));
  const NcclApi& api = nccl_api();
  // NVLink multicast (NVLS) stays off unless the caller's environment says otherwise: a program
  // using it can take shared GPUs out of service (docs/parallel.md).
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  impl_->device = o.device;
  cuda_check(cudaSetDevice(o.device), "cudaSetDevice");
  cuda_check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const ncclUniqueId id = rendezvous(api, o);
  nccl_check(api.comm_init_rank(&impl_->comm, o.world, id, o.rank), "ncclCommInitRank");
}

NcclTransport::~NcclTransport() {
  if (impl_->comm) nccl_api().comm_destroy(impl_->comm);
  if (impl_->staging) cudaFree(impl_->staging);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void NcclTransport::send(Backend& be, const float* buf, size_t n, int to) {
  drain(be, buf, n);
  cuda_check(cudaSetDevice(impl_->device), "cudaSetDevice");
  nccl_check(nccl_api().send(buf, n, ncclFloat32, to, impl_->comm, impl_->stream), "ncclSend");
  impl_->sync();
}

void NcclTransport::recv(Backend& be, float* buf, size_t n, int from) {
  drain(be, buf, n);  // nothing of be's may still read buf
  cuda_check(cudaSetDevice(impl_->device), "cudaSetDevice");
  nccl_check(nccl_api().recv(buf, n, ncclFloat32, from, impl_->comm, impl_->stream), "ncclRecv");
  impl_->sync();
}

void NcclTransport::send_host(const int* v, size_t n, int to) {
  cuda_check(cudaSetDevice(impl_->device), "cudaSetDevice");
  int* d = impl_->host_stage(n);
  cuda_check(cudaMemcpyAsync(d, v, n * sizeof(int), cudaMemcpyHostToDevice, impl_->stream), "cudaMemcpy");
  nccl_check(nccl_api().send(d, n, ncclInt32, to, impl_->comm, impl_->stream), "ncclSend");
  impl_->sync();
}

void NcclTransport::recv_host(int* v, size_t n, int from) {
  cuda_check(cudaSetDevice(impl_->device), "cudaSetDevice");
  int* d = impl_->host_stage(n);
  nccl_check(nccl_api().recv(d, n, ncclInt32, from, impl_->comm, impl_->stream), "ncclRecv");
  cuda_check(cudaMemcpyAsync(v, d, n * sizeof(int), cudaMemcpyDeviceToHost, impl_->stream), "cudaMemcpy");
  impl_->sync();
}

namespace {

template <class Part>
void check_peers(int rank, int world, const std::vector<Part>& parts) {
  for (const Part& p : parts)
    check(p.peer >= 0 && p.peer < world && p.peer != rank,
          "NCCL transport: an exchange of rank " + std::to_string(rank) + " names rank " + std::to_string(p.peer) +
              " (a peer must be another rank below " + std::to_string(world) + ")");
}

}  // namespace

void NcclTransport::exchange(Backend& be, const std::vector<TransportPart>& sends,
                             const std::vector<TransportPart>& recvs) {
  check_peers(rank_, world_, sends);
  check_peers(rank_, world_, recvs);
  // The backend's to_host waits for its whole stream: once, on any part, before NCCL reads the
  // send buffers or writes the recv buffers.
  for (const auto* parts : {&sends, &recvs}) {
    auto it = std::find_if(parts->begin(), parts->end(), [](const TransportPart& p) { return p.n > 0; });
    if (it != parts->end()) {
      drain(be, it->buf, it->n);
      break;
    }
  }
  const NcclApi& api = nccl_api();
  cuda_check(cudaSetDevice(impl_->device), "cudaSetDevice");
  nccl_check(api.group_start(), "ncclGroupStart");
  for (const TransportPart& p : sends)
    if (p.n) nccl_check(api.send(p.buf, p.n, ncclFloat32, p.peer, impl_->comm, impl_->stream), "ncclSend");
  for (const TransportPart& p : recvs)
    if (p.n) nccl_check(api.recv(p.buf, p.n, ncclFloat32, p.peer, impl_->comm, impl_->stream), "ncclRecv");
  nccl_check(api.group_end(), "ncclGroupEnd");
  impl_->sync();
}

void NcclTransport::exchange_host(const std::vector<HostPart>& sends, const std::vector<HostPart>& recvs) {
  check_peers(rank_, world_, sends);
  check_peers(rank_, world_, recvs);
  size_t total = 0;
  for (const HostPart& p : sends) total += p.n;
  for (const HostPart& p : recvs) total += p.n;
  if (total == 0) return;
  const NcclApi& api = nccl_api();
  cuda_check(cudaSetDevice(impl_->device), "cudaSetDevice");
  int* d = impl_->host_stage(total);
  size_t at = 0;
  for (const HostPart& p : sends) {
    if (p.n) cuda_check(cudaMemcpyAsync(d + at, p.buf, p.n * sizeof(int), cudaMemcpyHostToDevice, impl_->stream), "cudaMemcpy");
    at += p.n;
  }
  nccl_check(api.group_start(), "ncclGroupStart");
  at = 0;
  for (const HostPart& p : sends) {
    if (p.n) nccl_check(api.send(d + at, p.n, ncclInt32, p.peer, impl_->comm, impl_->stream), "ncclSend");
    at += p.n;
  }
  const size_t recv0 = at;
  for (const HostPart& p : recvs) {
    if (p.n) nccl_check(api.recv(d + at, p.n, ncclInt32, p.peer, impl_->comm, impl_->stream), "ncclRecv");
    at += p.n;
  }
  nccl_check(api.group_end(), "ncclGroupEnd");
  at = recv0;
  for (const HostPart& p : recvs) {
    if (p.n) cuda_check(cudaMemcpyAsync(p.buf, d + at, p.n * sizeof(int), cudaMemcpyDeviceToHost, impl_->stream), "cudaMemcpy");
    at += p.n;
  }
  impl_->sync();
}

void NcclTransport::self_exchange(const float* send_dev, float* recv_dev, size_t n) {
  const NcclApi& api = nccl_api();
  cuda_check(cudaSetDevice(impl_->device), "cudaSetDevice");
  nccl_check(api.group_start(), "ncclGroupStart");
  nccl_check(api.send(send_dev, n, ncclFloat32, rank_, impl_->comm, impl_->stream), "ncclSend");
  nccl_check(api.recv(recv_dev, n, ncclFloat32, rank_, impl_->comm, impl_->stream), "ncclRecv");
  nccl_check(api.group_end(), "ncclGroupEnd");
  impl_->sync();
}

#else  // no NCCL in this build

bool nccl_built() { return false; }

struct NcclTransport::Impl {};

namespace {
[[noreturn]] void no_nccl() {
  throw Error("this build has no NCCL transport (configure with -DWREN_CUDA=ON on a machine with nccl.h; "
              "docs/parallel.md)");
}
}  // namespace

NcclTransport::NcclTransport(const NcclWorldOptions& o) : rank_(o.rank), world_(o.world) { no_nccl(); }
NcclTransport::~NcclTransport() = default;
void NcclTransport::send(Backend&, const float*, size_t, int) { no_nccl(); }
void NcclTransport::recv(Backend&, float*, size_t, int) { no_nccl(); }
void NcclTransport::send_host(const int*, size_t, int) { no_nccl(); }
void NcclTransport::recv_host(int*, size_t, int) { no_nccl(); }
void NcclTransport::self_exchange(const float*, float*, size_t) { no_nccl(); }
void NcclTransport::exchange(Backend&, const std::vector<TransportPart>&, const std::vector<TransportPart>&) { no_nccl(); }
void NcclTransport::exchange_host(const std::vector<HostPart>&, const std::vector<HostPart>&) { no_nccl(); }

#endif

}  // namespace wren
