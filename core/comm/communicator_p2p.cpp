// Communicator::send / recv: argument checks and the call record (kind send / recv, peer,
// count = numel, dtype); the backend matches them per pair of ranks (Note [Point-to-point
// matching], core/internal/p2p_match.h).
// TEMPORARY (c13-p2p): the core side of send / recv belongs to c13-coll's communicator.cpp;
// this file stands in until it lands and is deleted at the merge (the two would define the
// same functions).
#include "core/comm/communicator.h"

#include "core/internal/collective_call.h"
#include "core/runtime/error.h"

namespace ditto {

namespace {

void check_p2p(const Communicator& c, const char* call, const Tensor& t, int peer) {
  DITTO_CHECK(t.defined(), "Communicator::", call, ": tensor: expected a tensor on ",
              c.device().str(), " (rank ", c.rank(), " of ", c.size(), "), got an undefined "
              "tensor");
  DITTO_CHECK(t.device() == c.device(), "Communicator::", call, ": tensor: expected a tensor on ",
              c.device().str(), " (rank ", c.rank(), " of ", c.size(), "), got ", t.str());
  DITTO_CHECK(peer >= 0 && peer < c.size(), "Communicator::", call,
              ": peer: expected a rank in [0, ", c.size(), "), got ", peer);
}

}  // namespace

void Communicator::send(const Tensor& tensor, int peer) {
  check_p2p(*this, "send", tensor, peer);
  detail::CollectiveCall call;
  call.kind = detail::CollectiveKind::send;
  call.send = tensor.data_ptr();
  call.count = tensor.numel();
  call.dtype = tensor.dtype();
  call.peer = peer;
  submit(call);
}

void Communicator::recv(Tensor& tensor, int peer) {
  check_p2p(*this, "recv", tensor, peer);
  detail::CollectiveCall call;
  call.kind = detail::CollectiveKind::recv;
  call.recv = tensor.data_ptr();
  call.count = tensor.numel();
  call.dtype = tensor.dtype();
  call.peer = peer;
  submit(call);
}

}  // namespace ditto
