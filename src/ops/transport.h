// The transport between ranks (docs/parallel.md): point-to-point send/recv of f32 activation
// buffers that live on the ranks' backends, and grouped exchanges (every rank's sends and recvs of
// one step posted together: expert parallelism's dispatch and combine). Implementations: in-process
// single-threaded (model/pipeline.h: pipeline stages as backends of one process), threads as ranks
// (ops/thread_transport.h: each rank a thread of one process) and NCCL (backends/cuda/
// nccl_transport.h: one process per GPU).
#pragma once
#include <cstddef>
#include <vector>

namespace wren {

class Backend;

/// One message of a grouped exchange (Transport::exchange): n floats at `buf`, a buffer of the
/// exchange's backend, to or from rank `peer` (another rank: never the caller's own).
struct TransportPart {
  int peer = 0;
  float* buf = nullptr;  ///< read for a send, written for a recv
  size_t n = 0;
};

/// One host int32 message of a grouped exchange (Transport::exchange_host).
struct HostPart {
  int peer = 0;
  int* buf = nullptr;  ///< read for a send, written for a recv
  size_t n = 0;
};

/// Moves backend buffers between the ranks of one pipeline. Messages between a pair of ranks are
/// delivered in the order they were sent; a recv names the sender and the exact float count the
/// sender sent (a mismatch throws wren::Error, never truncates).
class Transport {
 public:
  virtual ~Transport() = default;
  /// Sends n floats at `buf`, a buffer of `be` (the sending stage's backend), to rank `to`. May
  /// return before the receiver took them (the data is copied or queued on be's stream), but the
  /// caller may overwrite `buf` with ops of `be` issued afterwards. Throws wren::Error.
  virtual void send(Backend& be, const float* buf, size_t n, int to) = 0;
  /// Receives n floats from rank `from` into `buf`, a buffer of `be` (the receiving stage's
  /// backend); ops of `be` issued afterwards see them. Throws wren::Error.
  virtual void recv(Backend& be, float* buf, size_t n, int from) = 0;
  /// Sends/receives n int32 values of host memory (the control header of a multi-process step).
  virtual void send_host(const int* v, size_t n, int to) = 0;
  virtual void recv_host(int* v, size_t n, int from) = 0;
  /// Every send and recv of one step between this rank and its peers, posted together so that no
  /// order of the ranks' calls can deadlock (NCCL: one ncclGroupStart/End). Each part moves
  /// exactly its n floats (the receiver knows the count, e.g. from an earlier exchange_host);
  /// parts with n = 0 are skipped on both sides; a part naming this rank throws. Messages between
  /// a pair keep their order (the k-th send to p matches p's k-th recv from this rank, counting
  /// send/recv too). On return every recv buffer holds its data and every send buffer may be
  /// reused. The default posts every send, then every recv: right for a transport whose send does
  /// not wait for the receiver (in-memory queues); NCCL overrides it. Throws wren::Error.
  virtual void exchange(Backend& be, const std::vector<TransportPart>& sends, const std::vector<TransportPart>& recvs);
  /// exchange for host int32 messages (the control words of an expert-parallel layer).
  virtual void exchange_host(const std::vector<HostPart>& sends, const std::vector<HostPart>& recvs);
  /// This process's rank and the number of ranks (in-process: 0 and the stage count).
  virtual int rank() const = 0;
  virtual int world() const = 0;
  /// Short name for run headers ("in-process", "nccl").
  virtual const char* name() const = 0;
};

/// Where one pipeline stage's boundary activations come from and go to (ForwardOptions::link).
struct StageLink {
  Transport* transport = nullptr;  ///< null: no pipeline (the whole model on one backend)
  int prev = -1;                   ///< rank that sends this stage its input; -1 = this stage embeds
  int next = -1;                   ///< rank this stage sends its output to; -1 = this stage has the head
};

}  // namespace wren
