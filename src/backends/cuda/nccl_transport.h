// The NCCL transport between pipeline ranks (docs/parallel.md): one process per GPU, ncclSend /
// ncclRecv of the stage boundary activations. NCCL is loaded at run time (dlopen of
// libnccl.so.2), so a build made with nccl.h still starts on a machine without the library; only
// a multi-process run then fails, naming the library. Built when CMake found nccl.h
// (WREN_HAVE_NCCL); without it every entry point throws saying so.
#pragma once
#include <memory>
#include <string>

#include "ops/transport.h"

namespace wren {

/// True when this build has the NCCL transport (nccl.h found at configure time).
bool nccl_built();

/// One rank of an NCCL world.
struct NcclWorldOptions {
  int rank = 0;        ///< this process's rank, 0 .. world-1
  int world = 1;       ///< number of ranks
  int device = 0;      ///< CUDA device of this rank (LOCAL_RANK under a launcher)
  /// Rendezvous: rank 0 writes its ncclUniqueId (128 bytes) to this file (write then rename), the
  /// others wait for it. Must be fresh per job (the `wren run --gpus` launcher makes a new one);
  /// on several hosts it must be on a filesystem every host sees.
  std::string id_file;
  double timeout_s = 120;  ///< how long a rank waits for the id file
};

/// Reads RANK, WORLD_SIZE and LOCAL_RANK (torchrun; OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
/// under Open MPI's mpirun) into options with `id_file`. Returns false when neither set is present
/// (not under a launcher). Throws wren::Error on values that are not integers or out of range.
bool nccl_world_from_env(const std::string& id_file, NcclWorldOptions* out);

/// A Transport over an NCCL communicator of `world` ranks. Sets NCCL_NVLS_ENABLE=0 before
/// creating the communicator unless the variable is already set (NVLink multicast stays off:
/// docs/parallel.md). send/recv first wait for the backend's queued work (a one-float to_host),
/// then run the NCCL call on the transport's own stream and wait for it: ordering is simple and
/// safe, at the cost of a host round trip per message (see docs/parallel.md, "what is left").
/// Every call throws wren::Error naming the NCCL error string.
class NcclTransport final : public Transport {
 public:
  explicit NcclTransport(const NcclWorldOptions& o);
  ~NcclTransport() override;
  void send(Backend& be, const float* buf, size_t n, int to) override;
  void recv(Backend& be, float* buf, size_t n, int from) override;
  void send_host(const int* v, size_t n, int to) override;
  void recv_host(int* v, size_t n, int from) override;
  /// One NCCL group of every ncclSend / ncclRecv (after waiting for the backend's queued work),
  /// then a wait for the group: expert parallelism's dispatch and combine.
  void exchange(Backend& be, const std::vector<TransportPart>& sends, const std::vector<TransportPart>& recvs) override;
  /// The same through the device staging buffer (int32 control words and expert ids).
  void exchange_host(const std::vector<HostPart>& sends, const std::vector<HostPart>& recvs) override;
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  const char* name() const override { return "nccl"; }
  /// Sends and receives n floats of device memory with itself in one NCCL group (rank r to rank r):
  /// the one-GPU smoke test of the communicator (CudaNccl.*).
  void self_exchange(const float* send_dev, float* recv_dev, size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1;
};

}  // namespace wren
