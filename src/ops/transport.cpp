// The default grouped exchanges of Transport (see transport.h): every send, then every recv.
#include "ops/transport.h"

#include <string>

#include "core/error.h"

namespace wren {

namespace {

template <class Part>
void check_parts(const Transport& t, const std::vector<Part>& parts, const char* what) {
  for (const Part& p : parts)
    check(p.peer >= 0 && p.peer < t.world() && p.peer != t.rank(),
          std::string(t.name()) + " transport: " + what + " of rank " + std::to_string(t.rank()) + " names rank " +
              std::to_string(p.peer) + " (a peer must be another rank below " + std::to_string(t.world()) + ")");
}

}  // namespace

void Transport::exchange(Backend& be, const std::vector<TransportPart>& sends, const std::vector<TransportPart>& recvs) {
  check_parts(*this, sends, "an exchange send");
  check_parts(*this, recvs, "an exchange recv");
  for (const TransportPart& p : sends)
    if (p.n) send(be, p.buf, p.n, p.peer);
  for (const TransportPart& p : recvs)
    if (p.n) recv(be, p.buf, p.n, p.peer);
}

void Transport::exchange_host(const std::vector<HostPart>& sends, const std::vector<HostPart>& recvs) {
  check_parts(*this, sends, "a host exchange send");
  check_parts(*this, recvs, "a host exchange recv");
  for (const HostPart& p : sends)
    if (p.n) send_host(p.buf, p.n, p.peer);
  for (const HostPart& p : recvs)
    if (p.n) recv_host(p.buf, p.n, p.peer);
}

}  // namespace wren
