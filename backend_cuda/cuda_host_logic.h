// Internal: decisions of the CUDA backend that need no GPU, as pure host functions, so that
// tests/test_cuda_host_logic.cpp checks them on any machine (the GPU paths that use them run only
// where a GPU is). Plain C++: no CUDA or NCCL header.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/backend_api/collective_call.h"
#include "core/backend_api/cuda_launch_shapes.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/numerics/gpt_math.h"
#include "core/runtime/backend.h"
#include "core/runtime/dtype.h"

namespace ditto::cuda {

// ---- in-GPU collectives (cuda_communicator.cpp) -------------------------------------------------

/// Whether launch_comm_reduce with ONE source writes that source's bits unchanged: sum, prod, min
/// and max do; avg does not (finish() divides, by 1, which quiets a signalling NaN) and premul_sum
/// does not (it multiplies by the rank's scalar: all_reduce(t, t, premul_sum 0.5) on one rank is
/// t * 0.5).
constexpr bool one_source_is_copy(ReduceOp op) {
  return op != ReduceOp::avg && op != ReduceOp::premul_sum;
}

/// The destinations one in-GPU launch must write, given its sources and `op` (the op of a
/// reduction; sum for data movement): all of `dsts`, except that with one source whose result is
/// a copy of its bits (one_source_is_copy), a destination equal to that source is no work and is
/// dropped (in-place broadcast, all_gather, sum / min / max on one rank). A 1-rank in-place
/// all_reduce, reduce or reduce_scatter with avg or premul_sum keeps its destination.
inline std::vector<void*> comm_destinations(const std::vector<const void*>& srcs,
                                            std::vector<void*> dsts, ReduceOp op) {
  if (srcs.size() == 1 && one_source_is_copy(op))
    dsts.erase(std::remove(dsts.begin(), dsts.end(), srcs[0]), dsts.end());
  return dsts;
}

// ---- one rank per process (cuda_communicator_mpi.cpp) ------------------------------------------

/// The first two ranks (lower rank first) whose GPUs are the same GPU, given every rank's GPU
/// identity (host and GPU UUID, as the MPI communicator exchanges them), or nullopt when every
/// rank has a GPU of its own.
inline std::optional<std::pair<int, int>> first_shared_gpu(const std::vector<std::string>& gpus) {
  for (std::size_t a = 0; a < gpus.size(); ++a)
    for (std::size_t b = a + 1; b < gpus.size(); ++b)
      if (gpus[a] == gpus[b]) return std::pair<int, int>(static_cast<int>(a), static_cast<int>(b));
  return std::nullopt;
}

/// Throws BackendError when two ranks of a one-rank-per-process CUDA communicator are on one GPU
/// (`gpus`: each rank's GPU identity; `gpu_names[r]`: how rank r's GPU is named, "cuda:0 (GPU 0)
/// on host h"). NCCL refuses two ranks of one communicator on one GPU (ncclCommInitRank fails
/// with "Duplicate GPU detected"), and the processes cannot share one in-GPU transport (each
/// holds its own memory), so the only honest answer is to refuse, before NCCL is asked, naming
/// the two ways that work: one process per GPU, or one process driving every rank (ditto-train
/// --devices N, Communicator::init_all), whose in-GPU transport shares a GPU between ranks.
inline void check_one_rank_per_gpu(const std::vector<std::string>& gpus,
                                   const std::vector<std::string>& gpu_names) {
  const auto shared = first_shared_gpu(gpus);
  if (!shared) return;
  const auto [a, b] = *shared;
  throw BackendError(detail::cat(
      "Communicator::init_rank: ranks ", a, " and ", b, " of ", gpus.size(),
      " are on the same GPU (", gpu_names[static_cast<std::size_t>(a)],
      "); NCCL refuses two ranks of one communicator on one GPU. Run one process per GPU "
      "(mpirun -np at most the number of GPUs per node), or one process driving every rank "
      "(ditto-train --devices N without mpirun; Communicator::init_all), which shares a GPU "
      "between ranks"));
}

// ---- NCCL at run time (cuda_nccl.cpp) -----------------------------------------------------------

/// NCCL's version code for X.Y.Z, as nccl.h's NCCL_VERSION(X, Y, Z) and ncclGetVersion give it:
/// X * 1000 + Y * 100 + Z up to 2.8, X * 10000 + Y * 100 + Z from 2.9 (2.28.0 is 22800).
constexpr int nccl_version_code(int x, int y, int z) {
  return (x <= 2 && y <= 8) ? x * 1000 + y * 100 + z : x * 10000 + y * 100 + z;
}

/// How all_to_all, gather and scatter reach NCCL (Note [NCCL newer than the library]).
enum class NcclRootedPath : std::uint8_t {
  native,    ///< ncclAlltoAll / ncclGather / ncclScatter (NCCL 2.28+)
  send_recv  ///< ncclSend / ncclRecv per peer (any NCCL from 2.7)
};

/// The path, given the version the loaded libnccl reports (ncclGetVersion) and whether it
/// exports all three of ncclAlltoAll, ncclGather and ncclScatter (dlsym): native only with both;
/// the headers ditto was built with do not matter (the GPU machine's libnccl comes from whatever
/// PyTorch wheel is installed, possibly older than they are).
constexpr NcclRootedPath nccl_rooted_path(int runtime_version, bool symbols_present) {
  return runtime_version >= nccl_version_code(2, 28, 0) && symbols_present
             ? NcclRootedPath::native
             : NcclRootedPath::send_recv;
}

/// "X.Y.Z" of an NCCL version code (nccl_version_code's inverse; 0: "unknown").
inline std::string nccl_version_string(int code) {
  if (code <= 0) return "unknown";
  const bool five = code >= 10000;  // from 2.9: X * 10000 + Y * 100 + Z
  const int x = five ? code / 10000 : code / 1000;
  const int y = five ? code / 100 % 100 : code / 100 % 10;
  return detail::cat(x, ".", y, ".", code % 100);
}

// Note [NCCL fp8]
// NCCL names fp8 (ncclFloat8e4m3, ncclFloat8e5m2) from 2.24 and answers ncclInvalidArgument for
// them before; the GPU machine's libnccl is whatever PyTorch's wheel brings (Note [NCCL newer than
// the library], cuda_nccl.cpp), possibly older. Only a reduction needs NCCL to know the element
// type: every call that only moves data (broadcast, all_gather, all_to_all(_v), gather, scatter,
// send / recv, and the bitwise block algorithm's copies and all-gathers, where ditto's kernel
// does the arithmetic) gives NCCL fp8 as ncclUint8, the same byte count (fp8 is one byte), which
// every NCCL takes. NCCL's own fp8 reductions (fast mode's all_reduce, reduce, reduce_scatter)
// need NCCL 2.24 in the headers ditto was built with and in the library loaded at run time
// (ncclGetVersion, asked at the call): else check_nccl_reduction_dtype refuses them, before
// anything is enqueued, with a BackendError naming both versions and bitwise mode, which reduces
// fp8 on any NCCL.

/// The first NCCL with ncclFloat8e4m3 / ncclFloat8e5m2 (2.24.0).
inline constexpr int kNcclFp8Version = nccl_version_code(2, 24, 0);

/// The dtype NCCL is told for a call that only moves `t`'s bytes (Note [NCCL fp8]): fp8 as u8
/// (ncclUint8, same count), every other dtype as itself.
constexpr DType nccl_move_dtype(DType t) {
  return t == DType::f8_e4m3 || t == DType::f8_e5m2 ? DType::u8 : t;
}

/// The dtype NCCL is told for `t` in NCCL's own call of collective `kind` (nccl_enqueue): the
/// reductions (all_reduce, reduce, reduce_scatter: NCCL does the arithmetic) keep it, every other
/// kind only moves data (nccl_move_dtype).
inline DType nccl_wire_dtype(CollectiveKind kind, DType t) {
  return detail::uses_op(kind) ? t : nccl_move_dtype(t);
}

/// Throws BackendError naming `where` when NCCL's own reduction (fast mode's all_reduce, reduce,
/// reduce_scatter) of `dtype` cannot run with the NCCL headers ditto was built with
/// (`header_version`, NCCL_VERSION_CODE) or the library loaded (`runtime_version`,
/// ncclGetVersion; 0: unknown): fp8 needs 2.24 in both (Note [NCCL fp8]). Other kinds and
/// dtypes: nothing.
inline void check_nccl_reduction_dtype(CollectiveKind kind, DType dtype, int header_version,
                                       int runtime_version, const std::string& where) {
  if (!detail::uses_op(kind) || nccl_move_dtype(dtype) == dtype) return;
  if (header_version >= kNcclFp8Version && runtime_version >= kNcclFp8Version) return;
  throw BackendError(detail::cat(
      where, ": ", collective_name(kind), " of ", dtype_name(dtype),
      " in fast mode: NCCL reduces fp8 from 2.24 (ncclFloat8e4m3 / ncclFloat8e5m2); ditto was "
      "built with NCCL ",
      nccl_version_string(header_version), "'s headers and runs NCCL ",
      nccl_version_string(runtime_version),
      "; use Determinism::bitwise (ditto's kernel reduces, NCCL only moves the bytes), another "
      "dtype, or a libnccl.so.2 of 2.24 or later first on LD_LIBRARY_PATH"));
}

// ---- NCCL groups (cuda_communicator.cpp, cuda_communicator_mpi.cpp) -----------------------------

/// One NCCL call per rank in one group, exception-safe: prepare(r) for every rank BEFORE the
/// group opens (whatever may fail outside NCCL's enqueue: ncclRedOpCreatePreMulSum, memory),
/// then start(), enqueue(r, prepared[r]) for r = 0..n-1, end(). Returns the prepared values
/// (keep them until the group's end: premul_sum ops). So an exception while preparing rank r > 0
/// leaves no group open and no rank enqueued: nothing of the collective reaches a GPU (before,
/// the op of rank r was made inside the group, and the group's guard ended the group while
/// unwinding, launching ranks 0..r-1 without the others). An exception from enqueue(r) (an NCCL
/// call that failed: NCCL records it in the group, and ncclGroupEnd then launches none of the
/// group) calls abandon() (ncclGroupEnd, so the thread leaves the group) and rethrows; the caller
/// aborts the communicator (ncclCommAbort), which frees whatever did reach a GPU.
template <class Prepared, class Prepare, class Start, class Enqueue, class End, class Abandon>
std::vector<Prepared> enqueue_group(int n, Prepare&& prepare, Start&& start, Enqueue&& enqueue,
                                    End&& end, Abandon&& abandon) {
  std::vector<Prepared> prepared;
  prepared.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) prepared.push_back(prepare(r));
  start();
  try {
    for (int r = 0; r < n; ++r) enqueue(r, prepared[static_cast<std::size_t>(r)]);
  } catch (...) {
    abandon();
    throw;
  }
  end();
  return prepared;
}

// ---- waiting for a stream while NCCL work may hang it (cuda_stream.cpp) -------------------------

/// What a host wait on a stream does at one poll (Note [Waiting on NCCL work],
/// cuda_communicator_mpi.cpp).
enum class WaitStep : std::uint8_t {
  done,      ///< the stream's work is complete
  poll,      ///< not yet: poll again
  failed,    ///< a communicator reported an asynchronous error: abort it, throw BackendError
  timed_out  ///< a collective has run past its timeout: abort its communicator, throw Timeout
};

/// One poll of a host wait: `stream_done` (cudaStreamQuery == cudaSuccess), `comm_error`
/// (ncclCommGetAsyncError of a watched communicator gave an error other than ncclInProgress),
/// and, for that communicator's oldest unfinished collective, how long it has been enqueued and
/// its timeout (`pending_ms` < 0: none pending). A finished stream wins over everything: its
/// work is done, whatever a communicator says now.
constexpr WaitStep wait_step(bool stream_done, bool comm_error, std::int64_t pending_ms,
                             std::int64_t timeout_ms) {
  if (stream_done) return WaitStep::done;
  if (comm_error) return WaitStep::failed;
  if (pending_ms >= 0 && timeout_ms > 0 && pending_ms > timeout_ms) return WaitStep::timed_out;
  return WaitStep::poll;
}

// ---- memory (cuda_backend.cpp)
// -------------------------------------------------------------------

/// Whether cudaDeviceEnablePeerAccess's answer (a cudaError_t as an int: no CUDA header here)
/// leaves peer access enabled: cudaSuccess (0), or cudaErrorPeerAccessAlreadyEnabled (704:
/// someone else in the process, PyTorch, enabled it). Anything else (cudaErrorTooManyPeers, a
/// peer the hardware refuses, ...) did not enable it.
constexpr bool peer_access_granted(int status) { return status == 0 || status == 704; }

/// Which ordered GPU pairs (p, q) this process has enabled peer access for (p's context may
/// reach q's memory: cudaDeviceEnablePeerAccess(q) on p), so that each pair is enabled once per
/// process. Peer access belongs to the process's primary contexts and outlives a CudaBackend; a
/// second backend calling cudaDeviceEnablePeerAccess again got cudaErrorPeerAccessAlreadyEnabled,
/// an API error that compute-sanitizer reports (tools/gpu-check.sh), although it was expected.
/// A pair counts as enabled only once the call succeeded (peer_access_granted): a failed call is
/// tried again at the next ensure (before, the pair was recorded before the call, so a failure
/// was never retried and the pair passed for enabled). Not thread-safe by itself (CudaBackend
/// holds a mutex around it).
class PeerPairs {
 public:
  bool enabled(int p, int q) const {
    return std::find(done_.begin(), done_.end(), std::pair<int, int>{p, q}) != done_.end();
  }
  /// Whether (p, q) is enabled, calling `enable()` (cudaDeviceEnablePeerAccess(q) on p, its
  /// status as an int) first when it is not yet; recorded only when peer_access_granted.
  template <class Enable>
  bool ensure(int p, int q, Enable&& enable) {
    if (enabled(p, q)) return true;
    if (!peer_access_granted(enable())) return false;
    done_.emplace_back(p, q);
    return true;
  }

 private:
  std::vector<std::pair<int, int>> done_;
};

/// The CUDA call CudaBackend::device_malloc makes for a logical device: cudaMallocFromPoolAsync
/// from the device's memory pool when it has one, else cudaMalloc (a GPU without memory pools).
/// Errors name it (before, an error of cudaMalloc was reported as cudaMallocFromPoolAsync's).
constexpr const char* device_malloc_call(bool pooled) {
  return pooled ? "cudaMallocFromPoolAsync" : "cudaMalloc";
}

/// A logical device's live and peak bytes. reserve() counts a request against the capacity
/// (throwing nothing: false when it does not fit); commit() makes a reserved request that CUDA
/// then granted count towards the peak; release() undoes a reservation (a failed allocation) or
/// frees. The peak therefore counts only allocations that succeeded (before, the peak was raised
/// at reserve time, so a request that then failed in CUDA still showed in memory_stats().peak).
/// Not thread-safe by itself: CudaBackend keeps it in atomics with the same rules.
struct MemoryAccount {
  std::size_t capacity = 0;
  std::size_t in_use = 0;     ///< reserved or allocated
  std::size_t peak = 0;       ///< most bytes allocated at once (successful allocations only)
  std::size_t committed = 0;  ///< allocated (in_use less the reservations in flight)

  bool reserve(std::size_t bytes) {
    if (bytes > capacity || in_use > capacity - bytes) return false;
    in_use += bytes;
    return true;
  }
  void commit(std::size_t bytes) {
    committed += bytes;
    peak = std::max(peak, committed);
  }
  void release(std::size_t bytes, bool was_committed) {
    in_use -= bytes;
    if (was_committed) committed -= bytes;
  }
};

/// The release threshold of a logical device's memory pool (cudaMemPoolAttrReleaseThreshold):
/// how many freed bytes the pool may keep for reuse at a synchronisation instead of returning
/// them to the driver. Finite, so that NCCL's and cuBLAS's own allocations (cudaMalloc outside
/// the pool) still find memory: the pool keeps up to a quarter of the GPU's memory, shared by
/// the `logical` devices on it (before: UINT64_MAX, every freed byte kept for ever).
constexpr std::uint64_t pool_release_threshold(std::uint64_t gpu_bytes, int logical_on_gpu) {
  return gpu_bytes / 4 / static_cast<std::uint64_t>(logical_on_gpu > 0 ? logical_on_gpu : 1);
}

// ---- the typed GEMM (Kernels::gemm_ex; cuda_kernels.cu, cuda_blaslt.cpp) ---------------------

/// Whether the CUDA backend runs gemm_ex natively for these storage dtypes (has_gemm_ex): A and B
/// of one dtype among f32, bf16, f16 (cuBLASLt has no mixed A / B types with f32 compute) and C
/// of A's dtype or f32 (cuBLASLt's CUBLAS_COMPUTE_32F table: 16BF x 16BF -> 16BF or 32F, 16F x
/// 16F -> 16F or 32F, 32F x 32F -> 32F). Other combinations take MixedOp's f32 scratch.
constexpr bool typed_gemm_supported(DType a, DType b, DType c) {
  const bool storage = a == DType::f32 || a == DType::bf16 || a == DType::f16;
  return storage && b == a && (c == a || c == DType::f32);
}

/// Whether the CUDA backend runs gemm_tn_sharded_ex natively (has_gemm_tn_sharded_ex): A and B
/// (dY and X) of one dtype among f32, bf16, f16 (one kernel instantiation per dtype), C (dW) of
/// any of the three (its dtype is a run-time argument of the kernel's epilogue).
constexpr bool typed_sharded_gemm_supported(DType a, DType b, DType c) {
  auto storage = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  return storage(a) && b == a && storage(c);
}

/// Whether the CUDA backend runs sum_rows_ex / sum_rows_sharded_ex natively (has_sum_rows_ex):
/// x bf16 or f16 (one kernel instantiation each), out of x's dtype or f32 (a run-time argument
/// of the kernels' store), in both modes.
constexpr bool typed_sum_rows_supported(DType x, DType out) {
  return (x == DType::bf16 || x == DType::f16) && (out == x || out == DType::f32);
}

// ---- row chunks: fast sum_rows (cuda_kernels.cu, Note [CUDA row sums]) and the LayerNorm
// backward with its parameter gradients (cuda_fused.cu), core/backend_api/cuda_launch_shapes.h ---

using detail::fast_row_chunks;
using detail::kLnParamsGroup;
using detail::kLnParamsMinChunk;
using detail::kLnParamsTargetBlocks;
using detail::kRowSumMinChunk;
using detail::kRowSumOnePassRows;
using detail::kRowSumTargetBlocks;
using detail::layernorm_params_split;
using detail::LnParamsSplit;
using detail::RowChunks;

/// Semaphores of a CUDA stream (CudaStream::semaphores): unsigned counters, zero between kernels.
/// The fast sum_rows takes one per block of 32 columns when it splits the rows: a split needs
/// fewer than kRowSumTargetBlocks column blocks (chunks > 1 needs ceil(1024 / blocks) >= 2).
inline constexpr std::int64_t kStreamSemaphores = kRowSumTargetBlocks;

/// cuBLASLt's compute type for A / B of dtype `ab`: CUBLAS_COMPUTE_32F (tf32 == false), or
/// CUBLAS_COMPUTE_32F_FAST_TF32 for f32 operands when BackendOptions::allow_tf32 (torch's
/// allow_tf32: f32 inputs rounded to TF32 on the tensor cores, f32 accumulation). bf16 / f16
/// operands always accumulate in f32 (torch's default; no reduced-precision reduction).
constexpr bool lt_use_tf32(DType ab, bool allow_tf32) { return allow_tf32 && ab == DType::f32; }

/// One matrix of a column-major cuBLASLt matmul: its layout as stored (cublasLtMatrixLayoutCreate
/// rows, cols, ld, column-major: element (i, j) at i + j * ld) and whether the matmul transposes
/// it (CUBLASLT_MATMUL_DESC_TRANSA / TRANSB = CUBLAS_OP_T).
struct LtMatrix {
  std::int64_t rows = 0, cols = 0, ld = 0;
  bool trans = false;
};

/// ditto's row-major C[M,N] = op(A)[M,K] @ op(B)[K,N] as one column-major cuBLASLt matmul
/// D[m,n] = op(first)[m,k] @ op(second)[k,n]. A row-major [r, c] matrix with row stride ld is the
/// column-major [c, r] with leading dimension ld, so C is the column-major C^T [N, M] and
/// C^T = op(B)^T @ op(A)^T: cuBLASLt's first operand (its "A") is ditto's B, its second (its
/// "B") ditto's A, m = N, n = M, k = K (what cublasSgemm(h, op_b, op_a, N, M, K, B, ldb, A, lda,
/// C, ldc) does). The bias of GemmEpilogue::bias (one value per column n of ditto's C) is
/// cuBLASLt's per-row bias of D (CUBLASLT_EPILOGUE_BIAS: length m).
struct LtGemmPlan {
  std::int64_t m = 0, n = 0, k = 0;
  LtMatrix first;   ///< ditto's B
  LtMatrix second;  ///< ditto's A
  LtMatrix out;     ///< ditto's C (the C and D of cublasLtMatmul, in place)
};

constexpr LtGemmPlan lt_gemm_plan(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                                  std::int64_t K, std::int64_t lda, std::int64_t ldb,
                                  std::int64_t ldc) {
  LtGemmPlan p;
  p.m = N;
  p.n = M;
  p.k = K;
  // B stored row-major [K, N] (or [N, K] when trans_b) = column-major [N, K] (or [K, N]).
  p.first = trans_b ? LtMatrix{K, N, ldb, true} : LtMatrix{N, K, ldb, false};
  // A stored row-major [M, K] (or [K, M] when trans_a) = column-major [K, M] (or [M, K]).
  p.second = trans_a ? LtMatrix{M, K, lda, true} : LtMatrix{K, M, lda, false};
  p.out = LtMatrix{N, M, ldc, false};
  return p;
}

/// Whether cuBLASLt can take the plan: k > 0 and every leading dimension at least its rows (and
/// 1). Otherwise (K == 0, strides cuBLASLt refuses) the backend runs its own kernel.
constexpr bool lt_plan_valid(const LtGemmPlan& p) {
  auto ok = [](const LtMatrix& x) { return x.rows > 0 && x.cols > 0 && x.ld >= x.rows; };
  return p.m > 0 && p.n > 0 && p.k > 0 && ok(p.first) && ok(p.second) && ok(p.out);
}

/// The alignment cuBLASLt may assume of a pointer (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES):
/// the largest power of two dividing `address`, at most 256 (cuBLASLt's default assumption,
/// which a view at an odd offset would break).
constexpr std::uint32_t lt_alignment(std::uintptr_t address) {
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// ---- the GELU epilogues (Kernels::has_gemm_gelu_epilogue; cuda_kernels.cu, cuda_blaslt.cpp) ----

/// Whether gemm_ex may take GemmEpilogue::gelu_aux_bias / dgelu for A, B, C, bias and aux of
/// dtype `t` in `mode` (has_gemm_gelu_epilogue, before the probe's answer): fast mode only
/// (bitwise keeps the separate GEMM and GELU kernels and their bits), t among the typed GEMM's
/// storage dtypes (f32, bf16, f16: the GELU input matrix has the output's type, cuBLASLt's
/// default for CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE outside fp8).
constexpr bool gemm_gelu_epilogue_supported(DType t, Determinism mode) {
  return mode == Determinism::fast && typed_gemm_supported(t, t, t);
}

/// Whether cuBLASLt can take g's epilogue operands. With gelu_aux_bias or dgelu: an aux matrix
/// whose leading dimension is a multiple of 8 and at least the output's rows (cublasLt.h,
/// CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: "Must be divisible by 8 and be no less than the number
/// of rows in the output matrix"; the column-major output's rows are ditto's N), at a 16-byte
/// aligned address (cuBLASLt derives the alignment it assumes of the aux pointer from its value
/// and has no preference to lower it; llm.c's matmul_cublaslt requires 16 bytes of every
/// pointer). Other epilogues: true. Where false the backend runs the unfused GEMM and its GELU
/// kernel (GPT-2's 4C = 3072 columns pass; a width not a multiple of 8 takes the kernel).
/// With a bias (GemmEpilogue::bias, gelu_aux_bias with one): a 16-byte aligned bias pointer too.
/// cuBLASLt's alignment preferences cover A, B, C and D but not the bias, and its heuristic may
/// pick a kernel that loads the bias 16 bytes at a time: a bias that is a view at an odd offset
/// (ops::linear takes any bias tensor) then faults with "misaligned address", a sticky error that
/// ends the process's CUDA context (torch's addmm falls back to the unfused path for the same
/// reason, pytorch PR 194497). Where false the canonical kernel adds the bias.
inline bool lt_epilogue_valid(const GemmExArgs& g) {
  const bool bias = g.epilogue == GemmEpilogue::bias ||
                    (g.epilogue == GemmEpilogue::gelu_aux_bias && g.bias != nullptr);
  if (bias && reinterpret_cast<std::uintptr_t>(g.bias) % 16 != 0) return false;
  if (g.epilogue != GemmEpilogue::gelu_aux_bias && g.epilogue != GemmEpilogue::dgelu) return true;
  const auto aux = reinterpret_cast<std::uintptr_t>(g.aux);
  return aux != 0 && aux % 16 == 0 && g.ld_aux % 8 == 0 && g.ld_aux >= g.N;
}

/// What a cuBLASLt answer means for the caller (lt_heuristic_answer, lt_matmul_answer).
enum class LtAnswer : std::uint8_t {
  ok,        ///< an algorithm was found / the GEMM was enqueued
  declined,  ///< cuBLASLt does not offer this here: take the unfused path / ditto's kernel
  failed     ///< a real failure (no memory, a sticky CUDA error, ...): rethrow where met
};

// Note [cuBLASLt declines]
// cuBLASLt's statuses (cublas_api.h's cublasStatus_t, as ints: no CUDA header here), as
// cublasLt.h documents them for the two calls whose answer decides a path:
//  - cublasLtMatmulAlgoGetHeuristic: NOT_SUPPORTED (15) "no heuristic function available for
//    current configuration"; SUCCESS (0) with no result, or a result whose state is not SUCCESS:
//    no algorithm; INVALID_VALUE (7) is documented for requestedAlgoCount <= 0, which ditto never
//    passes (1), so here it is cuBLASLt refusing the descriptors (a layout or epilogue it cannot
//    take: what it answers for one it rejects, e.g. a negative leading dimension);
//  - cublasLtMatmul: NOT_SUPPORTED (15) "current implementation on selected device doesn't support
//    configured operation", ARCH_MISMATCH (8) "cannot be run using selected device", INVALID_VALUE
//    (7) "parameters are in conflict or in an impossible configuration" (and the documented
//    answer to an unsupported type / scale / compute combination); these enqueue nothing.
// All of these mean "not offered here": the caller takes the unfused path (the GELU probe) or its
// own kernel (blaslt_gemm), whose results are right, only slower. Every other status is a failure
// that must surface where it was met: NOT_INITIALIZED (1), ALLOC_FAILED (3), MAPPING_ERROR (11),
// EXECUTION_FAILED (13: a sticky CUDA error from an earlier fault), INTERNAL_ERROR (14),
// LICENSE_ERROR (16). (Before, the probe rethrew INVALID_VALUE and a heuristic's INVALID_VALUE,
// ending a fast-mode run that the unfused path would have run.)

/// cublasLtMatmulAlgoGetHeuristic's answer: its status, how many results it returned and the first
/// result's state (Note [cuBLASLt declines]).
constexpr LtAnswer lt_heuristic_answer(int status, int found, int first_state) {
  if (status == 0) return found > 0 && first_state == 0 ? LtAnswer::ok : LtAnswer::declined;
  return status == 15 || status == 7 || status == 8 ? LtAnswer::declined : LtAnswer::failed;
}

/// cublasLtMatmul's answer (Note [cuBLASLt declines]).
constexpr LtAnswer lt_matmul_answer(int status) {
  if (status == 0) return LtAnswer::ok;
  return status == 15 || status == 8 || status == 7 ? LtAnswer::declined : LtAnswer::failed;
}

/// Rows of the probe's matrices (blaslt_gelu_epilogue: [rows, kGeluProbeCols], 2048 values).
inline constexpr std::int64_t kGeluProbeRows = 128;
/// The probe's inputs span [-kGeluProbeRange, kGeluProbeRange]: the tanh and the erf form
/// differ by up to 4.7e-4 there (near x = -2.7) and agree to 1e-8 at its ends.
inline constexpr float kGeluProbeRange = 6.0f;
/// How far the probe's GELU may lie from the form it is classed as, at any input: the largest
/// |d - (tanh form + a (erf form - tanh form))| after the fit below. Loose on purpose: a tanh
/// form computed with a fast tanh (PTX tanh.approx.f32, absolute error up to 2^-10.99) is still
/// the tanh form; a value past it is not a GELU of either kind.
inline constexpr double kGeluProbeResidual = 2.0e-3;
/// How close the fitted share a of the erf form must be to 0 (tanh) or 1 (erf).
inline constexpr double kGeluProbeShareTolerance = 0.25;

/// The probe's n inputs: x[i] = -range + 2 range i / (n - 1), i = 0..n-1 (n >= 2).
inline std::vector<float> gelu_probe_inputs(std::int64_t n) {
  std::vector<float> x(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = -kGeluProbeRange +
           2.0f * kGeluProbeRange * static_cast<float>(i) / static_cast<float>(x.size() - 1);
  return x;
}

/// GELU's erf form (torch.nn.GELU(), nanoGPT's): 0.5 x (1 + erf(x / sqrt(2))), in double.
inline double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

/// Which GELU a probe's outputs d (of inputs x) are. The two forms differ by delta(x) = erf form -
/// tanh form (up to 4.7e-4 on the probe's range, smooth and one-signed on each side of 0), so d
/// is fitted as tanh(x) + a delta(x) by least squares over every input (tanh(x): gpt::gelu, the
/// unfused kernels' f32 function): tanh when |a| <= kGeluProbeShareTolerance, erf when
/// |a - 1| is, other in between. A fast tanh's error has almost no component along delta (it is
/// not smooth in x the way delta is), so it does not move a, where a per-point bound against each
/// form would take it for neither. Other too when the fit leaves any |residual| over
/// kGeluProbeResidual (not a GELU), when d has a NaN or an inf, the sizes differ, or there are no
/// values.
enum class GeluForm : std::uint8_t { tanh, erf, other };
inline GeluForm gelu_epilogue_form(const std::vector<float>& x, const std::vector<float>& d) {
  if (x.empty() || x.size() != d.size()) return GeluForm::other;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(d[i])) return GeluForm::other;
    const double t = gpt::gelu(x[i]), delta = gelu_erf(x[i]) - t;
    num += (d[i] - t) * delta;
    den += delta * delta;
  }
  if (!(den > 0)) return GeluForm::other;
  const double a = num / den;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double t = gpt::gelu(x[i]), delta = gelu_erf(x[i]) - t;
    if (std::fabs(d[i] - (t + a * delta)) > kGeluProbeResidual) return GeluForm::other;
  }
  if (std::fabs(a) <= kGeluProbeShareTolerance) return GeluForm::tanh;
  if (std::fabs(a - 1.0) <= kGeluProbeShareTolerance) return GeluForm::erf;
  return GeluForm::other;
}

// ---- cuBLASLt descriptor cache (cuda_blaslt.cpp) -----------------------------------------------

/// What the descriptors of one cuBLASLt typed GEMM depend on (the matmul descriptor, the three
/// layouts, the preference and the heuristic's algorithm; cuda_blaslt.cpp caches them per stream
/// under this key): transposes, sizes, row strides, storage dtypes, epilogue, compute type (TF32
/// or strict), the alignment cuBLASLt may assume of A, B and C (lt_alignment: the heuristic's
/// choice depends on it), and with a GELU epilogue the aux matrix's row stride and alignment
/// (and, forward, whether it has a bias).
/// Not the pointers themselves, alpha or beta: those are passed per call (the bias and aux
/// pointers are set on the cached descriptor before each call).
struct LtGemmKey {
  bool trans_a = false, trans_b = false;
  std::int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  DType a_type = DType::f32, b_type = DType::f32, c_type = DType::f32;
  int epilogue = 0;  ///< GemmEpilogue's value
  bool tf32 = false;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0;
  bool bias = false;            ///< gelu_aux_bias: with a bias (CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
  std::int64_t ld_aux = 0;      ///< the GELU epilogues' aux row stride (else 0)
  std::uint32_t align_aux = 0;  ///< and its alignment (else 0)
  friend bool operator==(const LtGemmKey&, const LtGemmKey&) = default;
};

/// The key of a typed GEMM (Kernels::gemm_ex's arguments) run with `tf32` (lt_use_tf32).
inline LtGemmKey lt_gemm_key(const GemmExArgs& g, bool tf32) {
  LtGemmKey k;
  k.trans_a = g.trans_a;
  k.trans_b = g.trans_b;
  k.M = g.M, k.N = g.N, k.K = g.K, k.lda = g.lda, k.ldb = g.ldb, k.ldc = g.ldc;
  k.a_type = g.a_type, k.b_type = g.b_type, k.c_type = g.c_type;
  k.epilogue = static_cast<int>(g.epilogue);
  k.tf32 = tf32;
  k.align_a = lt_alignment(reinterpret_cast<std::uintptr_t>(g.A));
  k.align_b = lt_alignment(reinterpret_cast<std::uintptr_t>(g.B));
  k.align_c = lt_alignment(reinterpret_cast<std::uintptr_t>(g.C));
  if (g.epilogue == GemmEpilogue::gelu_aux_bias || g.epilogue == GemmEpilogue::dgelu) {
    k.bias = g.epilogue == GemmEpilogue::gelu_aux_bias && g.bias != nullptr;
    k.ld_aux = g.ld_aux;
    k.align_aux = lt_alignment(reinterpret_cast<std::uintptr_t>(g.aux));
  }
  return k;
}

struct LtGemmKeyHash {
  std::size_t operator()(const LtGemmKey& k) const noexcept {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    auto mix = [&](std::uint64_t v) {
      h ^= v;
      h *= 1099511628211ull;
    };
    mix((k.trans_a ? 1u : 0u) | (k.trans_b ? 2u : 0u) | (k.tf32 ? 4u : 0u) | (k.bias ? 8u : 0u));
    for (std::int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc}) mix(static_cast<std::uint64_t>(v));
    for (DType t : {k.a_type, k.b_type, k.c_type}) mix(static_cast<std::uint64_t>(t));
    mix(static_cast<std::uint64_t>(k.epilogue));
    mix((std::uint64_t{k.align_a} << 32) ^ (std::uint64_t{k.align_b} << 16) ^ k.align_c);
    mix(static_cast<std::uint64_t>(k.ld_aux) ^ (std::uint64_t{k.align_aux} << 48));
    return static_cast<std::size_t>(h);
  }
};

/// A bounded map with least-recently-used eviction: find() of a present key is a hit and makes
/// it the most recent; insert() of a new key when `capacity` entries are held destroys the least
/// recent entry first (its Value's destructor: for cuBLASLt descriptors, their destroy calls).
/// Values stay at one address while they are held (a list node each). Not thread-safe: the
/// owner locks.
template <class Key, class Value, class Hash>
class LruCache {
 public:
  explicit LruCache(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

  /// The value under `key`, made most recent (counted as a hit), or nullptr (a miss).
  Value* find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    entries_.splice(entries_.begin(), entries_, it->second);
    return &it->second->second;
  }

  /// Stores `value` under `key` (absent: find() just missed) as the most recent entry, evicting
  /// the least recent one when full; returns the stored value.
  Value& insert(const Key& key, Value value) {
    if (const auto it = index_.find(key); it != index_.end()) {  // replace (not the cache's use)
      it->second->second = std::move(value);
      entries_.splice(entries_.begin(), entries_, it->second);
      return it->second->second;
    }
    if (entries_.size() >= capacity_) {
      index_.erase(entries_.back().first);
      entries_.pop_back();
      ++evictions_;
    }
    entries_.emplace_front(key, std::move(value));
    index_.emplace(key, entries_.begin());
    return entries_.front().second;
  }

  std::size_t size() const { return entries_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::int64_t hits() const { return hits_; }
  std::int64_t misses() const { return misses_; }
  std::int64_t evictions() const { return evictions_; }

 private:
  std::size_t capacity_;
  std::list<std::pair<Key, Value>> entries_;  ///< most recent first
  std::unordered_map<Key, typename std::list<std::pair<Key, Value>>::iterator, Hash> index_;
  std::int64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

/// Entries of each stream's cuBLASLt descriptor cache: a training step's GEMMs are a few dozen
/// distinct shapes (GPT-2: about 4 per layer kind forward and 8 backward, shared by the layers),
/// so 64 holds a step's set and bounds a run whose shapes keep changing.
inline constexpr std::size_t kLtCacheEntries = 64;

}  // namespace ditto::cuda
