// The vocabulary of collectives, below both the public Communicator (core/comm/communicator.h)
// and the contract a backend implements (core/backend_api/): the collectives a communicator runs,
// named once (the kind a cost model predicts, backend_sim/cost_model.h collective_time, and a
// communicator records for each call, core/backend_api/collective_call.h, which reexports it as
// detail::CollectiveKind), the reduction ops, and a communicator's options.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "core/numerics/determinism.h"

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

/// NCCL's reduction ops (ncclSum, ncclProd, ncclMin, ncclMax, ncclAvg) and the pre-multiplied sum
/// of ncclRedOpCreatePreMulSum. premul_sum carries a per-rank scalar, so it is passed as a
/// PreMulSum value (the overloads of core/comm/communicator.h), never as a bare ReduceOp (refused
/// with InvalidArgument). The arithmetic of every op on every dtype, and the bitwise rule for f16 /
/// bf16 / fp8 (the canonical tree accumulates in f32 and rounds once): Note [Reductions over ranks]
/// in core/numerics/reduce_math.h. Values match rmath::Op.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg, premul_sum };

/// "sum", "prod", ..., "premul_sum".
const char* reduce_op_name(ReduceOp op);

/// The longest CommOptions::timeout_ms (and sim fault-config timeout) accepted: 2^31 ms, about
/// 24.9 days. Larger values are refused with InvalidArgument (now + timeout would overflow the
/// clock's nanoseconds and time out at once).
inline constexpr std::int64_t kMaxCommTimeoutMs = std::int64_t(1) << 31;

struct CommOptions {
  Determinism determinism = Determinism::fast;
  /// A rank waiting longer than this (ms, 1..kMaxCommTimeoutMs) for the others fails.
  std::int64_t timeout_ms = 300000;
};

namespace detail {
/// Clock::now() + timeout_ms, with timeout_ms clamped to 0..kMaxCommTimeoutMs so the sum cannot
/// overflow (the deadline of a collective; validated values never reach the clamp).
template <typename Clock>
typename Clock::time_point comm_deadline(std::int64_t timeout_ms) {
  const std::int64_t ms = timeout_ms < 0 ? 0 : std::min(timeout_ms, kMaxCommTimeoutMs);
  return Clock::now() + std::chrono::milliseconds(ms);
}
}  // namespace detail

}  // namespace ditto
