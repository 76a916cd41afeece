// ditto::dist: the processes of a job started by mpirun (torch.distributed's process group, with
// MPI as its launcher and bootstrap). One rank per process: each process holds its rank's device
// and creates its rank's Communicator handle with Communicator::init_rank (ncclCommInitRank).
//
//   int main(int argc, char** argv) {
//     ditto::dist::init(&argc, &argv);                       // MPI_Init_thread
//     ditto::init_backend("sim", {.device_count = 1});         // this rank's virtual device
//     auto comm = ditto::Communicator::init_rank(ditto::Device("sim", 0),
//                                                ditto::dist::world_size(), ditto::dist::rank());
//     ... comm.all_reduce(t); ...
//     ditto::dist::finalize();                                 // MPI_Finalize
//   }
//   $ mpirun -np 4 ./program
//
// MPI support is optional (CMake DITTO_WITH_MPI); without it available() is false, init() throws
// BackendError saying so, and the rest behaves as a world of one process. Nothing here includes
// <mpi.h>.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ditto::dist {

/// True when this library was built with MPI support (DITTO_WITH_MPI).
bool available();

/// True when this process was started by mpirun / mpiexec (Open MPI's OMPI_COMM_WORLD_SIZE, or
/// PMIX_RANK / PMI_SIZE of a PMI launcher are set). Does not need MPI support.
bool launched_by_mpirun();

/// Throws InvalidArgument when this process looks like one rank of a launcher whose environment
/// ditto does not read, torchrun's (WORLD_SIZE or LOCAL_WORLD_SIZE set to other than 1, RANK or
/// LOCAL_RANK to other than 0, e.g. WORLD_SIZE=2, 0, 02 or abc) outside mpirun
/// (launched_by_mpirun() false): each such process would run a whole job of its own (N full jobs
/// under `torchrun --no-python`). The message starts with `who` (the caller; ditto-train says
/// "environment"), names the variables seen and says to start the ranks with mpirun (docs/mpi.md)
/// or to run one process with --devices N. torchrun with one process (WORLD_SIZE=1, RANK=0) and
/// mpirun's processes (OMPI_* / PMI* variables; Open MPI sets no RANK) pass.
void check_not_torchrun(const std::string& who);

/// MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE): joins the job's processes. Collective: every
/// process of the job calls it. argc/argv may be null. Throws BackendError when MPI support is not
/// built, when MPI gives less than MPI_THREAD_MULTIPLE (the ranks' stream workers call MPI
/// concurrently), or when called after finalize(). A second call is a no-op; MPI initialized
/// earlier by the program is adopted (and then left for the program to finalize). Also works
/// outside mpirun (a world of one process).
void init(int* argc = nullptr, char*** argv = nullptr);

/// True between init() and finalize().
bool is_initialized();

/// Number of processes (MPI_Comm_size of MPI_COMM_WORLD); 1 when not initialized.
int world_size();

/// This process's rank in [0, world_size()) (MPI_Comm_rank); 0 when not initialized.
int rank();

/// This process's rank among the processes of the job on its node, in [0, local_size()): the
/// rank in the MPI_COMM_TYPE_SHARED split of MPI_COMM_WORLD (MPI_Comm_split_type), ordered by
/// rank(). torch.distributed's LOCAL_RANK, from MPI itself rather than a launcher's environment
/// variable (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK), so any MPI gives it. The index of the GPU
/// of its node that a process takes. 0 when not initialized.
int local_rank();

/// Number of processes of the job on this node (the size of that split); 1 when not
/// initialized.
int local_size();

/// Every process's `text`, in rank order (a rendezvous of settings before any communicator, as
/// torchrun's): each process contributes a fixed-size record (a 64-bit hash of its text and the
/// text's size) to one MPI_Iallgather over MPI_COMM_WORLD; only when the records differ do the
/// texts themselves follow (MPI_Iallgatherv), so that the caller can name what differs. When every
/// record agrees, each entry is `text`. Collective: every process calls it, at the same point, in
/// the same order relative to other calls on MPI_COMM_WORLD (Communicator::init_rank). Nothing in
/// it depends on a CommOptions setting, so processes that disagree on those meet safely. Not
/// initialized: {text}. Throws Timeout when some process does not arrive within `timeout_ms`,
/// InvalidArgument for a timeout_ms <= 0 or a text over 1 MiB.
std::vector<std::string> all_gather_text(const std::string& text, std::int64_t timeout_ms);

/// MPI_Finalize. Collective: it returns once every process of the job has called it, so a
/// process whose job failed (job_failure() not empty) calls abort() instead. Communicators created
/// by Communicator::init_rank should be destroyed before; later calls on one throw BackendError.
/// Collectives still queued on a stream are waited for first (each ends by its communicator's
/// timeout; Note [MPI work at finalize], core/backend_api/mpi_transport.h). No-op when not
/// initialized. MPI cannot be initialized again in the same process.
void finalize();

// Note [Ending a job after a communicator error]
// finalize() (MPI_Finalize) returns only once every process of the job has called it. After a
// collective timed out, the process that never came may never come (stopped, hung, on a dead
// node): a process that called finalize() then waited for it for ever, and mpirun, which ends a
// job when a process fails, never learned of the failure (tester C, C1: ditto-train printed its
// timeout and hung in MPI_Finalize). torch's NCCL watchdog does not wait either: on a timeout or
// a NCCL error it aborts the communicator and tears the process down
// (TORCH_NCCL_ASYNC_ERROR_HANDLING, default 3), and torchrun then stops the other workers. So a
// process whose communication failed, job_failure() not empty, prints its error and calls
// abort() (MPI_Abort: mpirun kills every process of the job). Two kinds of errors leave MPI so:
//   - a timeout of a collective, of Communicator::init_rank or of all_gather_text: requests are
//     left pending (Note [Timeouts over MPI], core/backend_api/mpi_transport.h) and a process of
//     the job did not come;
//   - this process's own failure of a communicator (Communicator::abort, which the launcher calls
//     when a rank's training fails): the others may wait for it in a collective.
// A process that only learned of another's failure (a PeerFailure from its abort notice) may
// still finalize(): the failed process ends the job. Errors that every process makes together
// leave MPI intact and end with finalize(): the ranks disagree on their settings, a rank refused
// its arguments (train::check_ranks_agree carries the refusal to all), a call mismatch.

/// Why this process should end the job with abort() rather than finalize() (Note [Ending a job
/// after a communicator error]): the first such error of this process ("all_reduce (collective #3
/// ...): timed out after ..."), or "" when it may finalize. "" when not initialized.
std::string job_failure();

/// Ends every process of the job at once: flushes stdout and stderr, then MPI_Abort(MPI_COMM_WORLD,
/// status) (mpirun kills the others, and exits with `status`). Does not return. For a process
/// whose job failed (job_failure()), after its error was printed: torch's
/// TORCH_NCCL_ASYNC_ERROR_HANDLING tearing the process down. Not initialized (or finalized):
/// std::exit(status).
[[noreturn]] void abort(int status);

}  // namespace ditto::dist
