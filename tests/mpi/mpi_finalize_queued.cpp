// Tester C, C4 (Note [MPI work at finalize], core/backend_api/mpi_transport.h): each rank queues an
// all_reduce, lets its Communicator go without synchronizing the stream and calls
// dist::finalize(). finalize waits for the queued collective, so every rank prints the sum of the
// ranks' values (1 + 2 + ... + N) and exits 0. Before, the stream worker was still polling MPI
// when MPI_Finalize ran: Open MPI aborted the job ("MPI_Testsome() ... called after
// MPI_FINALIZE"), exit 1. The last rank queues its call 300 ms late, so that the others are in
// finalize while their worker waits for it.
//   mpirun -np 2 ditto_mpi_finalize_queued
#include <chrono>
#include <cstdio>
#include <thread>

#include "core/comm/communicator.h"
#include "core/distributed/distributed.h"
#include "core/runtime/backend.h"

int main(int argc, char** argv) {
  using namespace ditto;
  dist::init(&argc, &argv);
  init_backend("sim", {.device_count = 1});
  const int me = dist::rank(), n = dist::world_size();
  const Device local("sim", 0);
  Tensor t = Tensor::full({8}, float(me + 1), local);
  {
    CommOptions o;
    o.timeout_ms = 20000;
    Communicator c = Communicator::init_rank(local, n, me, o);
    if (me == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c.all_reduce(t);
  }  // not synchronized
  dist::finalize();
  std::printf("rank %d: finalized; all_reduce gave %g\n", me, double(t.to_vector<float>()[7]));
  return 0;
}
