// The collectives a communicator runs, named once: the kind a cost model predicts
// (backend_sim/cost_model.h, collective_time) and a communicator records for each call
// (core/internal/collective_call.h, not installed, reexports it as detail::CollectiveKind).
#pragma once

#include <cstdint>

namespace ditto {

/// NCCL's collectives (ncclAllReduce, ncclReduce, ncclBroadcast, ncclAllGather,
/// ncclReduceScatter; torch.distributed's all_reduce, reduce, broadcast, all_gather,
/// reduce_scatter_tensor) and a barrier (torch.distributed.barrier).
enum class CollectiveKind : std::uint8_t {
  all_reduce,
  reduce,
  broadcast,
  all_gather,
  reduce_scatter,
  barrier
};

/// "all_reduce", "reduce", ...: the name a message or a table gives the collective.
inline const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::reduce: return "reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::barrier: return "barrier";
  }
  return "collective";
}

}  // namespace ditto
