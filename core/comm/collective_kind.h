// The collectives a communicator runs, named once: the kind a cost model predicts
// (backend_sim/cost_model.h, collective_time) and a communicator records for each call
// (core/internal/collective_call.h, not installed, reexports it as detail::CollectiveKind).
#pragma once

#include <cstdint>

namespace ditto {

/// NCCL's collectives (ncclAllReduce, ncclReduce, ncclBroadcast, ncclAllGather,
/// ncclReduceScatter, ncclAlltoAll, ncclGather, ncclScatter; torch.distributed's all_reduce,
/// reduce, broadcast, all_gather, reduce_scatter_tensor, all_to_all_single, gather, scatter),
/// all_to_all_v (MPI_Alltoallv; torch's all_to_all_single with split sizes), a barrier
/// (torch.distributed.barrier) and the point-to-point calls (ncclSend / ncclRecv).
/// New values go at the end (traces and cost tables index by name, not value).
enum class CollectiveKind : std::uint8_t {
  all_reduce,
  reduce,
  broadcast,
  all_gather,
  reduce_scatter,
  barrier,
  all_to_all,
  all_to_all_v,
  gather,
  scatter,
  send,
  recv
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
    case CollectiveKind::all_to_all: return "all_to_all";
    case CollectiveKind::all_to_all_v: return "all_to_all_v";
    case CollectiveKind::gather: return "gather";
    case CollectiveKind::scatter: return "scatter";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
  }
  return "collective";
}

}  // namespace ditto
