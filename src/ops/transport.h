// The transport between pipeline stages (docs/parallel.md): point-to-point send/recv of f32
// activation buffers that live on the stages' backends. Two implementations: in-process
// (model/pipeline.h: stages as separate backends of one process) and NCCL (backends/cuda/
// nccl_transport.h: one process per GPU).
#pragma once
#include <cstddef>

namespace wren {

class Backend;

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
