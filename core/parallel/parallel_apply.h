// parallel_apply: run one function per replica on host threads (torch.nn.parallel.parallel_apply):
// one thread each for up to 16 replicas (or hardware_concurrency, if more), past that each thread
// runs every T-th replica, so 1024 simulated replicas do not need 1024 threads. Every replica runs to completion or failure; if any failed, the caller gets one
// ditto::Error naming the first failing replica index and its device, with its message. Nothing is
// left running when it returns or throws.
#pragma once

#include <functional>
#include <vector>

#include "core/runtime/device.h"

namespace ditto::parallel {

/// Call fn(i) for i in [0, devices.size()), on host threads (inline when there is one). fn(i)
/// must not wait for another fn(j): with many replicas, j may run after i on the same thread.
/// `what` names the phase for error messages ("forward", "backward"). The error keeps the
/// replica's type for OutOfMemory, Timeout, InvalidArgument and BackendError (else Error).
void parallel_apply(const std::vector<Device>& devices, const char* what,
                    const std::function<void(int)>& fn);

}  // namespace ditto::parallel
