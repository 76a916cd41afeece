// Tests of ditto::dist (core/distributed/distributed.h) and Communicator::init_rank in a plain
// process (not started by mpirun, no dist::init): the world of one process, and clear errors. The
// multi-process behaviour is tested under mpirun by tests/mpi/test_mpi_communicator.cpp.
#include <gtest/gtest.h>

#include <string>

#include "core/comm/communicator.h"
#include "core/distributed/distributed.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using test::expect_error;

TEST(Distributed, WithoutInitIsAWorldOfOneProcess) {
  EXPECT_FALSE(dist::is_initialized());
  EXPECT_EQ(dist::world_size(), 1);
  EXPECT_EQ(dist::rank(), 0);
  EXPECT_EQ(dist::local_rank(), 0);
  EXPECT_EQ(dist::local_size(), 1);
  dist::finalize();  // no-op when not initialized
  EXPECT_FALSE(dist::is_initialized());
}

TEST(Distributed, InitRankWithoutInitSaysToCallIt) {
  expect_error<BackendError>([] { Communicator::init_rank(Device("sim", 0), 1, 0); },
                             "Communicator::init_rank: no process group: call dist::init() first");
}

TEST(Distributed, InitWithoutMpiSupportSaysSo) {
  if (dist::available()) GTEST_SKIP() << "MPI support is built (tested under mpirun)";
  expect_error<BackendError>([] { dist::init(); },
                             "dist::init: this build of ditto has no MPI support");
}

}  // namespace
}  // namespace ditto
