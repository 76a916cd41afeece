// The list of backends (and the process transport) compiled into this library. The one place that
// knows which were built; everything else looks them up by name.
#include "core/backend_init.h"
#include "core/process_group.h"

namespace ditto {
std::shared_ptr<Backend> make_host_backend(const BackendOptions&);
std::shared_ptr<Backend> make_sim_backend(const BackendOptions&);
#ifdef DITTO_WITH_CUDA
std::shared_ptr<Backend> make_cuda_backend(const BackendOptions&);
#endif

void detail::register_builtin_backends(const RegisterFn& add) {
  add("cpu", make_host_backend);
  add("sim", make_sim_backend);
#ifdef DITTO_WITH_CUDA
  add("cuda", make_cuda_backend);
#endif
}
}  // namespace ditto

// The transport that joins processes (core/process_group.h): MPI when it was built.
namespace ditto {
#ifdef DITTO_WITH_MPI
std::unique_ptr<detail::ProcessGroup> make_mpi_process_group(int* argc, char*** argv);
#endif

detail::ProcessGroupFactory detail::builtin_process_group() {
#ifdef DITTO_WITH_MPI
  return make_mpi_process_group;
#else
  return nullptr;
#endif
}
}  // namespace ditto
