// parallel_apply: run one function per replica on its own host thread (torch.nn.parallel.
// parallel_apply). Every replica runs to completion or failure; if any failed, the caller gets one
// ditto::Error naming the first failing replica index and its device, with its message. Nothing is
// left running when it returns or throws.
#pragma once

#include <functional>
#include <vector>

#include "core/device.h"

namespace ditto::parallel {

/// Call fn(i) for i in [0, devices.size()), each on its own thread (inline when there is one).
/// `what` names the phase for error messages ("forward", "backward").
void parallel_apply(const std::vector<Device>& devices, const char* what,
                    const std::function<void(int)>& fn);

}  // namespace ditto::parallel
