// The simulator's answers to Backend::extension (core/runtime/extensions.h): its cost model and
// its fault injection behind the core interfaces, and the SimBackend itself under
// SimBackend::kExtensionName (for tests and tools of the simulator).
#pragma once

#include <memory>

#include "core/runtime/extensions.h"

namespace ditto::sim {

class CostModel;
class SimBackend;

/// CostModelExtension over `cost` (which must outlive it).
std::unique_ptr<CostModelExtension> make_cost_model_extension(CostModel& cost);
/// FaultExtension over `backend` (which must outlive it).
std::unique_ptr<FaultExtension> make_fault_extension(SimBackend& backend);

}  // namespace ditto::sim
