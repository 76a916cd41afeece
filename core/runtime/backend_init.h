// Internal: the built-in backends register themselves through this one function, called once when
// the registry is first used (static-library registration by global constructors would be dropped
// by the linker). Defined in the file CMake generates from cmake/builtin_backends.cpp.in (the one
// place that knows which backends were built), compiled into the `ditto` library.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/runtime/backend.h"

namespace ditto::detail {
/// The transport that joins processes (an MPI communicator; defined in
/// core/backend_api/mpi_transport.h, so only *_mpi.cpp sources see it).
struct ProcessLink;

/// A backend's multi-process communicator (Communicator::init_rank): one rank of a communicator
/// spanning processes, on `backend`'s device `device_index`, over `link` (the factory takes
/// ownership of it). Empty for a backend that has none.
using ProcessCommunicatorFactory = std::function<std::shared_ptr<CommunicatorImpl>(
    ProcessLink& link, Backend& backend, int device_index, const CommOptions& options)>;

using RegisterFn =
    std::function<void(const std::string&, BackendFactory, ProcessCommunicatorFactory)>;
void register_builtin_backends(const RegisterFn& add);

/// The registry's generation (Note [Backend lookup cache], backend.cpp): it changes whenever a
/// backend instance is created or replaced (init_backend, a first get_backend). An object that
/// read it after looking its instance up knows, while it is unchanged, that its instance is still
/// the live one (one integer compare; Note [Communicators of a replaced backend]).
std::uint64_t backend_generation() noexcept;

/// The multi-process communicator factory registered with backend `name`; empty when the backend
/// has none in this build (no MPI, or a backend without a transport). Throws InvalidArgument for an
/// unknown name.
ProcessCommunicatorFactory process_communicator_factory(const std::string& name);
}  // namespace ditto::detail
