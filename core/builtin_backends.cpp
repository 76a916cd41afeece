// The list of backends compiled into this library. The one place that knows which backends were
// built; everything else looks them up by name.
#include "core/backend_init.h"

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
