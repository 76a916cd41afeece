// The simulator's cost model: virtual time for a simulated cluster (device and interconnect
// profiles, backend_sim/profiles.h). It only observes: the data work of kernels, copies and
// collectives is unchanged, so results (and bitwise checksums) do not depend on it.
//
// Note [Virtual time]
// Every SimStream carries a virtual clock (SimStream::virtual_now, integer picoseconds, so sums
// are exact and independent of thread interleaving). Each task advances its own stream's clock
// when it runs on the stream's worker, in stream order, so virtual times depend only on the order
// of work on each stream and on the dependencies between streams, never on wall-clock
// scheduling:
//   kernel      start = clock; clock += launch latency + max(flops / peak, bytes / bandwidth),
//               the peak that of the unit the kernel runs on (Note [Compute units]), times the
//               device's slowdown factor (a straggler, set_slowdown);
//   copy        host <-> device at the profile's PCIe bandwidth; device <-> device over the
//               interconnect (NVLink / PCIe inside a node, the NIC across nodes), or at memory
//               bandwidth (read + write) inside one device;
//   event       record() stores the recording stream's clock in the event; wait() sets the
//               waiting stream's clock to max(own, event's), so a communication stream and a
//               compute stream overlap as on a GPU (the later of the two, not their sum);
//   collective  starts when the last rank arrives (max over ranks of their stream clocks) and
//               lasts the alpha-beta estimate of the algorithm NCCL would pick
//               (collective_time); every rank's clock ends at start + duration.
//   host        a blocking copy or synchronize() costs no virtual time of its own, but work
//               launched after it starts no earlier than what the host waited for (Note [Host
//               clock]): a task starts at max(its stream's clock, the host clock it was launched
//               at).
// Kernel launch latency stands for the host's launch rate, which bounds small kernels.
//
// Note [Host clock]
// On a GPU the host that waited for work (cudaStreamSynchronize, cudaEventSynchronize, a
// blocking cudaMemcpy to the host) launches what follows only after that work ended, so nothing
// it launches next, on any stream, can run before it. The simulator keeps a host clock per
// device (DeviceHealth::host_clock, sim_stream.h): SimStream::synchronize raises it to the
// stream's clock, SimEvent::synchronize to the event's virtual time (on the recording device),
// SimStream::run_sync (blocking copies) to the end of its task; every task enqueued from a host
// thread carries the clock's value at its launch (SimStream::Task::floor) and, when it runs,
// first moves its stream's clock up to it. Work enqueued from inside stream work (a pool
// thread, or a host thread draining the stream it waits on) is not a host launch and carries
// none. Without it, DDP's first forward started in virtual time at the compute stream's own
// clock, concurrently with the parameter broadcast its constructor had waited for on the
// communication stream (issue 29: the predicted step then depended on --max-iters).
// Why per device, not per host thread (thread_local): a per-device clock is written and read
// only by the host code that drives that device, so it is deterministic whichever threads do
// it, and it carries a wait done on one thread to launches made on another after a hand-off
// (setup on the main thread, then a rank's thread). The trainers drive each device from one
// thread at a time: ddp one thread per rank and device, dp one thread for all devices; ddp's
// CostMeter synchronizes every device from the last rank to reach its barrier while the others
// wait there, so the order stays fixed. A thread_local clock would also order dp's launches on
// device 1 after a wait on device 0, which a per-device clock does not; but dp's devices run the
// same work and meet at every collective, so what that misses is at most the spread between
// devices, and a thread_local clock would make the clocks depend on which thread (a main
// thread, a rank's, the pool's) happened to run a wait. Polling (Stream::query, Event::query)
// does not raise it.
//
// Note [Collective model]
// Per rank, S bytes (the buffer of all_reduce / broadcast / reduce; for all_gather and
// reduce_scatter S is the full gathered buffer, n times the per-rank count). B is the per-GPU
// link bandwidth NCCL's ring reaches, a the fixed cost of one collective, h one step's latency.
//   ring all_reduce      a + 2(n-1) h + 2(n-1)/n * S / B
//   tree all_reduce      a + 2 ceil(log2 n) h + 2 S / B        (NCCL: tree algbw = busbw / 2)
//   NVLS all_reduce      a + 2 h + (n+1)/n * S / (B * eta)     (NVSwitch reduces: each GPU
//                        sends S + S/n and receives as much; eta = NCCL's nvlsEfficiency)
//   hierarchical         reduce-scatter inside each node (ring or NVLS), all_reduce of S/g
//                        across the m nodes over each GPU's own NIC, all-gather inside the node
//                        (phases added, not pipelined: a conservative estimate)
//   reduce_scatter / all_gather   a + (n-1) h + (n-1)/n * S / B
//   broadcast / reduce            a + (n-1) h + S / B   (pipelined chain)
//   all_to_all(_v), gather, scatter   a + (n-1) h + (n-1)/n * S / B   (p2p: each rank's n-1
//                        peers, one after the other on its link, as NCCL's alltoall; S is the
//                        full per-rank buffer of all_to_all, the root's buffer of gather /
//                        scatter, the most any rank sends or receives in all_to_all_v)
//   send / recv          a + h + S / B   (one message of S bytes between two ranks; h is the
//                        network's latency when they are on different nodes)
// Across nodes a ring's B is min(B_link, NICs per node * NIC bandwidth) and its steps that cross
// nodes cost the network's latency. all_reduce takes the fastest candidate, as NCCL's tuner
// does; nccl-tests' busbw = algbw * factor (2(n-1)/n for all_reduce, (n-1)/n for
// all_gather / reduce_scatter / alltoall / gather / scatter, 1 otherwise), so a ring's busbw
// tends to B at large S.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend_sim/profiles.h"
#include "core/numerics/determinism.h"
#include "core/runtime/collective_types.h"
#include "core/runtime/dtype.h"
#include "core/runtime/extensions.h"

namespace ditto {
struct GemmExArgs;
}

namespace ditto::sim {

class SimStream;
class TraceRecorder;

/// Virtual time in picoseconds. It saturates at kVTimeMax (about 106 days) instead of wrapping:
/// a duration past it (an absurd profile or slowdown) reads as kVTimeMax, never as a negative
/// or small time.
using VTime = std::int64_t;
constexpr double kPicosPerSecond = 1e12;
constexpr VTime kVTimeMax = std::numeric_limits<VTime>::max();
/// `seconds` (>= 0) rounded to picoseconds; negative -> 0, NaN or past kVTimeMax -> kVTimeMax.
inline VTime to_vtime(double seconds) {
  const double ps = seconds * kPicosPerSecond + 0.5;
  if (!(ps < 9223372036854775808.0)) return kVTimeMax;  // 2^63; also NaN and inf
  if (ps < 1.0) return 0;
  return static_cast<VTime>(ps);
}
/// a + b for a, b >= 0, saturating at kVTimeMax.
inline VTime vtime_add(VTime a, VTime b) { return a > kVTimeMax - b ? kVTimeMax : a + b; }
inline double to_seconds(VTime t) { return static_cast<double>(t) / kPicosPerSecond; }

// Note [Compute units]
// The cost model prices each kernel on the unit ditto's CUDA backend runs it on (issue 29):
//   GEMM, fast mode     cuBLASLt (GemmPath::library): bf16 / f16 operands on the tensor cores
//                       (f32 accumulate) at bf16_flops / f16_flops; f32 operands strict f32 on
//                       the SIMT cores at fp32_flops, or on the TF32 tensor cores at tf32_flops
//                       when BackendOptions::allow_tf32 is set (CostModel::set_allow_tf32); each
//                       times gemm_efficiency (a vendor library's fraction of its peak);
//   GEMM, bitwise mode  ditto's own fma-chain kernel (GemmPath::simt; also gemm_tn_sharded, the
//                       micro-sharded dW product): f32 math on the SIMT cores whatever the
//                       storage dtype, at fp32_flops x simt_efficiency (profiles.h);
//   GEMM, typed         Kernels::gemm_ex (a dry run: Note [Predicted launches]) by the same
//                       rule, fast mode cuBLASLt on the unit of its operands' dtype, bitwise mode
//                       ditto's SIMT kernel; bytes of A, B, C (and bias) in their own dtypes;
//   attention           ditto's own kernels on the SIMT cores in f32 math in both modes (fast: a
//                       flash-style fused kernel; bitwise: tiled through shared memory): the
//                       matrix-product FLOPs (KernelCost::matmul_flops: q k^T, att v and their
//                       backward products) at fp32_flops x simt_efficiency, the rest (exp,
//                       scaling, masks) at fp32_flops; bytes q, k, v, y and the softmax stats,
//                       never [B, H, T, T] (Note [Attention memory], core/numerics/gpt_math.h);
//                       the typed fast-mode attention (bf16 / f16, GemmPath::mma) puts its
//                       matrix products on the tensor cores at bf16_flops / f16_flops x
//                       mma_efficiency (an estimate: Note [Typed kernels]);
//   everything else     (LayerNorm, GELU, residual adds, softmax + cross-entropy, AdamW, clip,
//                       embedding) FLOPs at fp32_flops, bytes (in the storage dtype:
//                       native_cost) at memory_bandwidth x memory_efficiency.
// Each kernel is a roofline: launch_latency + max(compute, memory). kernel_price names the unit
// that bounds it (tensor core, SIMT, or memory when the bytes take longer), for the per-kernel
// table of a dry run (CostModel::ledger, ditto-train --dry-run --verbose).

/// How a matrix product runs on a GPU (Note [Compute units]).
enum class GemmPath : std::uint8_t {
  library,  ///< fast mode: cuBLASLt (tensor cores for bf16 / f16, TF32 with allow_tf32, else FP32)
  simt,     ///< bitwise mode: ditto's own fma-chain kernel on the SIMT cores
  /// ditto's own mma.sync kernel on the bf16 / f16 tensor cores: the matmul_flops of a fused
  /// non-gemm kernel (the typed fast-mode attention) at the operands' tensor-core peak x
  /// DeviceProfile::mma_efficiency; f32 operands fall back to the SIMT rate.
  mma,
};

/// What one kernel does: floating-point operations and bytes moved to or from device memory.
/// `gemm` marks matrix products, counted as model FLOPs (MFU); `path` says how one runs and
/// `operands` the storage dtype of its operands (native_cost sets it), which together choose its
/// unit and peak (Note [Compute units]). `matmul_flops` is the part of a fused non-gemm kernel's
/// flops that are matrix products (attention's q k^T, att v and their backward products: Note
/// [Attention memory] in core/numerics/gpt_math.h), priced at the SIMT rate x simt_efficiency
/// (GemmPath::mma: on the tensor cores). `launches`: the kernel launches the CUDA backend makes
/// for this work, each paying the launch latency (attention's backward: 2; Note [Predicted
/// launches]).
struct KernelCost {
  double flops = 0;
  double bytes = 0;
  bool gemm = false;
  double matmul_flops = 0;
  GemmPath path = GemmPath::library;
  DType operands = DType::f32;
  int launches = 1;
};

/// The unit a kernel's time is priced on: the one that bounds its roofline.
enum class PricedUnit : std::uint8_t {
  tensor_core_bf16,      ///< cuBLASLt on bf16 tensor cores
  tensor_core_f16,       ///< cuBLASLt on f16 tensor cores
  tensor_core_tf32,      ///< cuBLASLt on TF32 tensor cores (f32 operands, allow_tf32)
  simt_library,          ///< cuBLASLt strict f32 on the SIMT cores
  simt_ditto,            ///< ditto's own SIMT kernel (bitwise GEMM, attention's products)
  tensor_core_bf16_mma,  ///< ditto's own mma.sync kernel on bf16 tensor cores (typed attention)
  tensor_core_f16_mma,   ///< the same on f16 tensor cores
  simt,                  ///< other FLOPs on the SIMT cores at the FP32 peak
  memory,                ///< bytes at memory bandwidth (the bytes take longer than the FLOPs)
  pcie,                  ///< host <-> device copies
  interconnect,          ///< collectives and copies between devices
};
/// "tensor core bf16", "SIMT f32 (cuBLASLt)", "SIMT f32 (ditto)", "tensor core bf16 mma",
/// "SIMT f32", "memory", ... (at most 20 characters: the --verbose table's unit column)
const char* unit_name(PricedUnit u);

/// A kernel's price (Note [Compute units]): seconds = launch + max(compute_s, memory_s); `unit`
/// the one that bounds it; `compute_unit` the one its FLOPs run on (its unit when it is not
/// memory bound).
struct KernelPrice {
  double seconds = 0, compute_s = 0, memory_s = 0;
  PricedUnit unit = PricedUnit::memory;
  PricedUnit compute_unit = PricedUnit::simt;
};

/// The roofline price of one kernel on `device` (Note [Compute units]): launches x launch
/// latency + max(compute, memory); `allow_tf32` as
/// BackendOptions::allow_tf32 (only f32 GEMMs of GemmPath::library look at it).
KernelPrice kernel_price(const DeviceProfile& device, const KernelCost& cost,
                         bool allow_tf32 = false);

/// kernel_price(device, cost, allow_tf32).seconds: launch latency + max(flops / (peak x e_f),
/// bytes / (memory bandwidth x e_m)), in seconds (Note [Compute units], Note [Achieved
/// efficiency] in profiles.h).
double kernel_seconds(const DeviceProfile& device, const KernelCost& cost, bool allow_tf32 = false);

/// The cost of the native kernel over `storage` tensors whose f32 kernel costs `f32` (Note
/// [Mixed precision]): for bf16 / f16, bytes scaled by dtype_size(storage) / 4 and `operands`
/// set to `storage` (a library GEMM then runs on the tensor cores); `f32` itself for any other
/// storage dtype.
KernelCost native_cost(const KernelCost& f32, DType storage);

// Note [Typed kernels]
// The CUDA backend's kernels that read and write the storage dtype (bf16 / f16) instead of
// MixedOp's f32 scratch (Note [Mixed precision]), and how a dry run prices them:
//   gemm_ex (Kernels::has_gemm_ex; wired: a dry run takes it): gemm_ex_cost, one launch, the
//       bias epilogue inside it (no add_bias launch, its N x M adds not counted as FLOPs); in
//       fast mode (has_gemm_gelu_epilogue) the GPT MLP's GELU in c_fc's epilogue and its
//       gradient in c_proj's input-gradient GEMM (cuBLASLt's GELU_AUX_BIAS and DGELU, as CUDA
//       runs them once its probe finds the tanh form): the aux matrix's M x N elements written
//       or read in the same launch, no gelu_forward(_ex) / gelu_backward(_ex) launch, the GELU's
//       FLOPs not counted (a few per element beside the product's 2 K);
//   attention (has_attention_ex, issue 29 item 2; wired: a dry run takes it for bf16 / f16, head
//       widths up to 128, as CUDA does): attention_ex_cost. Fast mode bf16 / f16: FlashAttention-2
//       on the tensor cores (mma.sync m16n8k16, f32 accumulate, GemmPath::mma) at bf16_flops x
//       mma_efficiency, an ESTIMATE (0.25: profiles.cpp) until a device calibrates it; the
//       forward's matrix products are q k^T and P v, 2 passes of T x T x hd over the causal pairs;
//       the deterministic backward runs 2 kernels (dK / dV per key tile: S = q k^T, dP = dO v^T, dV
//       += P^T dO, dK += dS^T q; dQ per query tile: S, dP, dQ = dS k, with D = rowsum(dO o y)
//       from the forward's output y), S and P recomputed: 7 passes; 9 where the backward is not
//       given y (a first pass of the dq kernel recomputes S and dP for D = rowsum(P dP)). Head
//       widths other than 64 and 128 run the SIMT kernels with typed loads in fast mode (7 or 9
//       passes alike: the SIMT dq kernel reads D from y too; so does the f32
//       Kernels::attention_backward's, priced by gpt_kernels::attention_backward_cost). The
//       rest (exp, scale, masks: as the f32 kernels count them) at fp32_flops. Bitwise mode: the
//       same passes on the SIMT cores (fp32_flops x simt_efficiency) in f32 math. Bytes: q, k, v,
//       y (dy, dqkv) in the storage dtype, the softmax stats (and the backward's pd) in f32;
//   row kernels (has_rows_ex, issue 29 item 3: LayerNorm, GELU, softmax cross-entropy, the
//       embedding forward reading / writing the storage dtype with f32 math): storage_cost, the
//       f32 kernel's cost (gpt_kernels::*_cost, sim_kernels_gpt.h) with its tensor bytes scaled
//       to the storage dtype and the bytes that stay as they are named: LayerNorm's mean and
//       rstd (8 bytes a row), a loss (4 a row), a token id or target (8 a row). The embedding
//       gradient (embedding_backward_ex): dy in the storage dtype, grad_wte in its own (f32 in
//       bitwise mode, the storage dtype in fast), embedding_backward's six launches
//       (gpt_kernels::embedding_backward_ex_cost);
//   row sums (has_sum_rows_ex: the bias and LayerNorm parameter gradients, sum_rows in fast mode
//       and sum_rows_sharded in bitwise mode, x bf16 / f16 into an out of x's dtype or f32):
//       sum_rows_ex_cost, one launch over x and out in their own dtypes (fast mode:
//       fast_sum_rows_cost, CUDA's partials over row chunks where it splits the rows, one launch);
//   the LayerNorm backward with the residual gradient's add (has_layernorm_backward_add: f32,
//       bf16, f16, both modes; nn::Block's two adds per block, as CUDA's layernorm_backward_add
//       folds them): storage_cost of gpt_kernels::layernorm_backward_add_cost (the backward's,
//       one FLOP and one element read more per element, dx written once as the sum), one launch
//       where a real simulator run launches the backward and then the add;
//   the LayerNorm backward with its parameter gradients (has_layernorm_backward_params: f32,
//       bf16, f16, fast mode only; every nn::LayerNorm backward, with or without the residual's
//       add): layernorm_backward_params_cost, one launch where a real simulator run launches the
//       backward (and the add) and two row sums; dy_xhat is neither written nor read back, the
//       chunks' f32 partials are priced as bytes (cuda_layernorm_params_chunks).
//   the residual add with the LayerNorm forward after it (has_layernorm_forward_add: f32, bf16,
//       f16, both modes; the GPT forward's adds each followed by ln_2, the next block's ln_1 or
//       ln_f, as CUDA's layernorm_forward_add folds them): storage_cost of
//       gpt_kernels::layernorm_forward_add_cost (the forward's, one FLOP and two elements more
//       per element: branch read, the residual written), one launch where a real simulator run
//       launches the add and then the forward;
//   the softmax cross-entropy's forward and backward in one pass (has_cross_entropy_fused: f32,
//       bf16, f16, fast mode only; nn::CrossEntropyLoss::forward_backward, the GPT training
//       step's loss, as CUDA's cross_entropy_fused runs it): storage_cost of
//       cross_entropy_fused_cost (the backward's FLOPs, the logits read once and their gradient
//       written over them), one launch and no [rows, classes] gradient tensor where a real
//       simulator run launches cross_entropy(_ex) and then cross_entropy_backward(_ex).
// A kernel that has no typed CUDA version runs on CUDA through MixedOp's f32 scratch, and a dry
// run prices that as CUDA runs it (Note [Predicted launches]): its casts as launches, the f32
// kernel at f32 bytes, the scratch charged to the device.

/// Kernels::gemm_ex's cost (Note [Typed kernels]): 2 M N K FLOPs (a gemm: model FLOPs); bytes
/// M K x size(a_type) + K N x size(b_type) + M N x size(c_type) (twice when beta != 0: read and
/// written) + N x size(c_type) for a bias (GemmEpilogue::bias, gelu_aux_bias's) + M N x
/// size(c_type) for the aux matrix (gelu_aux_bias writes it, dgelu reads it); path library in
/// fast mode (cuBLASLt: tensor cores
/// for bf16 / f16 operands), simt in bitwise mode (ditto's canonical GEMM, bias fused); operands
/// a_type. One launch.
KernelCost gemm_ex_cost(const GemmExArgs& g);

/// A typed attention forward (backward = false) or backward over qkv [B, T, 3C] in `storage`
/// (f32, bf16 or f16) with nh heads, in `mode` (Note [Typed kernels]); with_y: the backward is
/// given the forward's output y (attention_backward_ex's y not null). Throws InvalidArgument for
/// nh < 1, C not a positive multiple of nh, B or T < 1, or a storage dtype other than those.
KernelCost attention_ex_cost(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh,
                             DType storage, Determinism mode, bool backward, bool dropout,
                             bool with_y = false);

/// A row kernel reading and writing `storage` (Note [Typed kernels]): the f32 kernel's cost
/// `f32` with its bytes except `fixed_bytes` scaled by dtype_size(storage) / 4 and `operands`
/// set to storage; fixed_bytes (f32 statistics, losses, i64 ids) stay. native_cost(f32, t) is
/// storage_cost(f32, t, 0) for bf16 / f16. Throws InvalidArgument when fixed_bytes is negative
/// or more than f32.bytes, or for a storage dtype other than f32, bf16, f16.
KernelCost storage_cost(const KernelCost& f32, DType storage, double fixed_bytes);

/// Kernels::sum_rows_ex's and sum_rows_sharded_ex's cost (Note [Typed kernels]): rows x cols
/// FLOPs; bytes rows x cols x size(x_type) + cols x size(out_type); operands x_type; one launch
/// (the CUDA kernels make one up to 64 shards, the f32 sum_rows_sharded's count).
KernelCost sum_rows_ex_cost(std::int64_t rows, std::int64_t cols, DType x_type, DType out_type);

/// The row chunks of CUDA's fast sum_rows / sum_rows_ex over a [rows, cols] x (Note [CUDA row
/// sums], backend_cuda/cuda_kernels.cu): fast_row_chunks(rows, cols).chunks, the split CUDA
/// launches (core/backend_api/cuda_launch_shapes.h, shared with backend_cuda). 1: one launch, no
/// partials.
std::int64_t cuda_fast_row_chunks(std::int64_t rows, std::int64_t cols);

/// The fast sum_rows' cost (Kernels::sum_rows and sum_rows_ex in fast mode, both backends'
/// price): sum_rows_ex_cost, and where CUDA splits the rows into k = cuda_fast_row_chunks > 1
/// chunks, the f32 partials written and read, 8 k cols bytes more, in the same one launch (the
/// last block of each 32 columns adds their partials). The partials' scratch (4 k cols bytes,
/// at most a few hundred KiB, freed at once) is not charged to the device's memory, nor the
/// stream's semaphores (4 KiB, once).
KernelCost fast_sum_rows_cost(std::int64_t rows, std::int64_t cols, DType x_type, DType out_type);

/// The row chunks of CUDA's layernorm_backward_params over N rows (Note [CUDA LayerNorm parameter
/// gradients], backend_cuda/cuda_fused.cu): layernorm_params_split(rows).chunks, the split CUDA
/// launches (core/backend_api/cuda_launch_shapes.h, shared with backend_cuda). 1: no partials.
std::int64_t cuda_layernorm_params_chunks(std::int64_t rows);

/// Kernels::layernorm_backward_params' cost (fast mode: the LayerNorm backward with its
/// parameter gradients in one launch, the dry run's price of CUDA's kernel; Note [Typed
/// kernels]): 14 N C FLOPs of layernorm_backward, N C for grad_w's sum, N C for grad_b's (`bias`)
/// and N C for the residual's add (`residual`); bytes dy, x, dx (and the residual) [N, C] and w
/// [C] in `storage`, mean and rstd f32 (8 N), each gradient's C elements in `grad_type` written
/// (and read first where accumulating), and where CUDA splits the rows into k =
/// cuda_layernorm_params_chunks > 1 chunks the f32 partials [2 C] of the chunks (and of their
/// g = ceil(k / 16) groups, g > 1) written and read: 16 C (k + g) bytes. One launch; operands
/// `storage`. The partials' scratch (at most 544 x 2 C floats, freed at once) is not charged to
/// the device's memory. Throws InvalidArgument for a storage or gradient dtype other than f32,
/// bf16 and f16, or N < 0 or C < 1.
KernelCost layernorm_backward_params_cost(std::int64_t N, std::int64_t C, DType storage,
                                          DType grad_type, bool residual, bool bias,
                                          bool accumulate_w, bool accumulate_b);

// Note [Predicted launches]
// A dry run predicts the CUDA backend (ditto's production target on a GPU): where that backend
// runs the same work differently from the simulator's own kernels, the dry run takes the CUDA
// backend's path and prices its launches, bytes and memory. A real simulator run keeps its own
// path, virtual time and memory accounting (and its bits: a dry run computes none). The paths:
//   typed GEMM          has_gemm_ex is true in a dry run for the dtypes of the CUDA backend's
//                       (a == b in {f32, bf16, f16}, c in {a, f32}: cuda_host_logic.h's
//                       typed_gemm_supported), so ops::gemm, matmul and linear call gemm_ex, priced
//                       by gemm_ex_cost: one launch on the operands' storage dtype, a Linear's bias
//                       in its epilogue (no add_bias launch: f32 runs too, as on CUDA), and in
//                       fast mode the GPT MLP's GELU and its gradient (has_gemm_gelu_epilogue:
//                       no GELU launches);
//   MixedOp's scratch   an op with no typed CUDA kernel runs on bf16 / f16 tensors through f32
//                       scratch on CUDA (Note [Mixed precision]): a dry run prices each of its
//                       conversions as the cast launch CUDA makes (ledger row cast_f32_scratch,
//                       n x (2 + 4) bytes), the op's f32 kernel at its f32 bytes, and charges the
//                       scratch to the device's memory (a real simulator run prices the
//                       conversions as free, the kernel at storage-dtype bytes, and does not
//                       charge the scratch: the cost of a native kernel);
//   several launches    attention_backward is two kernels on CUDA (per query tile, per key tile:
//                       cuda_attention.cu), embedding_backward(_ex) six (zero the counts,
//                       histogram, scan, scatter, sort the buckets, then the ordered sums; three
//                       with no tokens): KernelCost::launches;
//   multi-tensor        the optimizer's multi-tensor kernels (backend_cuda/cuda_multi_tensor.cu),
//                       below.
// Kernels CUDA launches as the simulator prices them, one launch each over the same bytes:
// cast, fill_f32, fill_bits, axpy, scale, add_bias, sum_rows (fast: fast_sum_rows_cost, its
// row chunks' partials), sum_inputs (up to 8 inputs),
// layernorm, gelu, dropout, cross_entropy, embedding_forward; copy_d2d is one cudaMemcpyAsync
// (read + write at memory bandwidth). Priced one launch at bandwidth though CUDA's may take
// longer where a serial chain bounds it: bitwise sum is one chain (thread 0 over tiles the block
// stages in shared memory), and bitwise sum_rows(_sharded) runs a chain per (column, shard) in
// parallel (Note [CUDA row sums], backend_cuda/cuda_kernels.cu): a chain of R rows takes at
// least R dependent adds (~4 cycles each: GPT-2 B 8's 1024-row shards about 2 us, under the
// 3 us its bf16 bytes take at bandwidth). The model has no latency term for chains; a GPU run
// that measures these rows says whether it needs one.
// The optimizer: in a dry run the simulator's
// has_multi_tensor_kernels() is true, so optim::Adam / AdamW (Adam::step_multi) and
// optim::clip_grad_norm_ make per device one call each, as on cuda, and each call is priced as
// CUDA's launches, one per table of at most kCudaMultiTensorCap tensors with elements (the
// table is the kernel's parameter), all in f32 (the optimizer's master weights and moments):
//   adam_step_multi     16 FLOPs an element (+1 where AdamW's decay is folded in: p *= 1 - lr wd
//                       in the same pass); bytes p, g, m, v read and p, m, v written, 28 an
//                       element (amsgrad: + max_exp_avg_sq read and written, 36);
//   sum_squares_multi   two launches a table: the leaves (bitwise gpt::kSquaresBlock elements,
//                       fast kCudaMultiTensorChunk), 2 FLOPs and 4 bytes an element plus 4 bytes
//                       a leaf written; then each tensor's leaves summed (a FLOP and 4 bytes a
//                       leaf read, 4 bytes a tensor written); every tensor counts, empty or not;
//   scale_multi         1 FLOP and 8 bytes (read and write) an element;
//   fill_multi          the moments a step creates (Adam::step_multi, zeroed as
//                       torch.optim.AdamW's zeros_like state): 4 bytes written an element,
//                       one launch per table of at most kCudaFillMultiCap tensors (GPT-2
//                       124M's 296 moments: one launch, not 296 fill_f32);
//   copy_multi          ZeRO-1's buffer packing and its masters' rounding (core/optim/zero.h):
//                       (from size + to size) bytes an element (an element a FLOP when it
//                       converts: cast's), one launch per table of at most kCudaCopyMultiCap
//                       pieces; named copy_multi (same dtype) or cast_multi (a conversion).
// Typed (optim::MasterWeights over bf16 / f16 weights, Note [Typed optimizer step] in
// core/optim/master_weights.h): a dry run's has_multi_tensor_ex is CUDA's (f32, bf16, f16), so
// the masters' step reads the model's gradients as stored and writes the model's weights in
// its launch (adam_step_multi_ex_costs, ledger row adam_step_multi_ex: no cast and no copy_d2d
// per parameter), the clip's sums read them as stored (sum_squares_multi_ex_costs, row
// sum_squares_multi_ex) and its scaling is AdamW's one mul more an element (no scale_multi).
// Launch latency is then paid per table instead of per parameter (GPT-2 124M: 148 parameters,
// one table), AdamW's decay costs no pass of its own, and the clip reads its sums back in one
// copy per device instead of one per parameter. The bits are those of the per-tensor kernels
// (Kernels::adam_step_multi), and a dry run computes none. A real simulator run keeps the
// per-tensor kernels and prices them, so its step differs from the dry run's of the same
// configuration by exactly these paths (tests/test_dry_run.cpp).

/// Tensors per launch of the CUDA backend's multi-tensor kernels (kMultiCap in
/// backend_cuda/cuda_multi_tensor.cu) and elements per block-chunk (kMultiChunk there).
inline constexpr std::size_t kCudaMultiTensorCap = 256;
inline constexpr std::int64_t kCudaMultiTensorChunk = 8192;
/// Tensors per launch of the CUDA backend's fill_multi (kFillCap in cuda_multi_tensor.cu).
inline constexpr std::size_t kCudaFillMultiCap = 1024;
/// Pieces per launch of the CUDA backend's copy_multi (kCopyCap in cuda_multi_tensor.cu).
inline constexpr std::size_t kCudaCopyMultiCap = 1000;

/// The launches of one adam_step_multi call over tensors of ns[i] elements (Note [Predicted
/// launches]): one KernelCost per launch; decay[i] says whether tensor i folds in AdamW's decay.
/// Tensors with no elements are skipped; none with elements: no launch.
std::vector<KernelCost> adam_step_multi_costs(const std::vector<std::int64_t>& ns,
                                              const std::vector<bool>& decay, bool amsgrad);
/// The launches of one sum_squares_multi call over tensors of ns[i] elements in `mode`.
std::vector<KernelCost> sum_squares_multi_costs(const std::vector<std::int64_t>& ns,
                                                Determinism mode);
/// The launches of one scale_multi call over tensors of ns[i] elements.
std::vector<KernelCost> scale_multi_costs(const std::vector<std::int64_t>& ns);
/// The launches of one fill_multi call over tensors of ns[i] elements.
std::vector<KernelCost> fill_multi_costs(const std::vector<std::int64_t>& ns);
/// The launches of one copy_multi call over pieces of ns[i] elements of `from` into `to`.
std::vector<KernelCost> copy_multi_costs(const std::vector<std::int64_t>& ns, DType from, DType to);
/// The launches of one adam_step_multi_ex call (Note [Typed optimizer step],
/// core/optim/master_weights.h; CUDA's one kernel): adam_step_multi_costs' with gradient i read
/// at grad_bytes[i] bytes an element (dtype_size of its storage dtype; missing: 4), model weight
/// i written at model_bytes[i] (0 or missing: none), and 1 FLOP an element more with
/// scale_grads (the clip's coefficient applied as the gradient is loaded).
std::vector<KernelCost> adam_step_multi_ex_costs(const std::vector<std::int64_t>& ns,
                                                 const std::vector<bool>& decay,
                                                 const std::vector<int>& grad_bytes,
                                                 const std::vector<int>& model_bytes, bool amsgrad,
                                                 bool scale_grads);
/// The launches of one sum_squares_multi_ex call: sum_squares_multi_costs' with tensor i read at
/// elem_bytes[i] bytes an element (missing: 4).
std::vector<KernelCost> sum_squares_multi_ex_costs(const std::vector<std::int64_t>& ns,
                                                   const std::vector<int>& elem_bytes,
                                                   Determinism mode);

/// p2p: direct transfers between pairs of ranks (all_to_all, gather, scatter, send / recv).
enum class CollectiveAlgo : std::uint8_t { local, ring, tree, nvls, hierarchical, p2p };
const char* algo_name(CollectiveAlgo a);

struct CollectiveEstimate {
  double seconds = 0;
  CollectiveAlgo algo = CollectiveAlgo::ring;
};

/// Alpha-beta estimate (Note [Collective model]) of one collective over `devices` (global
/// device indices; their nodes come from `cluster`) moving `bytes` per rank (see the note for
/// the other kinds). `force` restricts all_reduce to one algorithm (nvls and hierarchical when
/// applicable; otherwise InvalidArgument). One device: a local copy. send / recv: `devices` are
/// the two ranks' devices, source first ({d} or {d, d} for a send to itself: a local copy).
CollectiveEstimate collective_time(const ClusterSpec& cluster, CollectiveKind kind, double bytes,
                                   const std::vector<int>& devices,
                                   std::optional<CollectiveAlgo> force = std::nullopt);

/// nccl-tests' bus-bandwidth factor of `kind` over n ranks (busbw = algbw * factor).
double busbw_factor(CollectiveKind kind, int n);

/// Totals of the cost model since its creation or reset (read when the streams are idle).
struct CostTotals {
  VTime now = 0;                 ///< latest virtual end time over all devices
  std::vector<VTime> end;        ///< per device: latest end time of its streams
  std::vector<VTime> compute;    ///< per device: busy time of kernels
  std::vector<VTime> comm;       ///< per device: collectives and device-to-device copies
  std::vector<VTime> host_copy;  ///< per device: host <-> device copies
  std::uint64_t gemm_flops = 0;  ///< FLOPs of matrix products, all devices
};

class CostModel {
 public:
  CostModel(int device_count, ClusterSpec cluster);
  ~CostModel();

  int device_count() const { return static_cast<int>(devices_.size()); }
  /// Replace the cluster description. Call before work is enqueued (not synchronised with it).
  void configure(const ClusterSpec& cluster);
  const ClusterSpec& cluster() const { return cluster_; }

  /// Straggler: every kernel on `device` takes `factor` times its modelled time (factor >= 1
  /// slows it down; kMinSlowdown <= factor <= kMaxSlowdown). Throws InvalidArgument for a device
  /// out of range or a factor outside that range (or not finite).
  static constexpr double kMinSlowdown = 1e-3;
  static constexpr double kMaxSlowdown = 1e3;
  void set_slowdown(int device, double factor);
  double slowdown(int device) const;

  /// Dry run (Note [Dry run], sim_backend.h): the simulator's kernels, copies and collectives
  /// are priced here as usual but skip their data work. Set once by SimBackend before any work.
  void set_dry_run(bool on) { dry_run_ = on; }
  bool dry_run() const { return dry_run_; }

  /// Record a Chrome trace (backend_sim/trace.h) from now on.
  void set_tracing(bool on);
  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }
  /// Write the trace recorded so far as Chrome trace JSON (Perfetto, chrome://tracing), to a
  /// temporary file renamed onto `path` (TraceRecorder::write_chrome_json). Throws InvalidArgument
  /// when tracing was never enabled, BackendError when the file cannot be written.
  void write_trace(const std::string& path) const;
  /// The trace's cap (TraceRecorder::set_max_events) and what it kept and dropped.
  void set_trace_max_events(std::size_t max_events);
  TraceStats trace_stats() const;

  // ---- hooks: called by a task on `stream`'s worker when the work has run --------------------
  void on_kernel(SimStream& stream, const char* name, const KernelCost& cost);
  /// Host <-> device copy of `bytes` on `stream`.
  void on_host_copy(SimStream& stream, const char* name, std::size_t bytes);
  /// Device-to-device copy of `bytes` from device `src` into `stream`'s device.
  void on_device_copy(SimStream& stream, int src, std::size_t bytes);
  /// A collective on `stream` that started at `start` and lasts `estimate`.
  void on_collective(SimStream& stream, const char* name, VTime start,
                     const CollectiveEstimate& estimate, double bytes);
  /// Stream-ordered memory counter of `device` (for the trace): +bytes or -bytes.
  void on_memory(SimStream& stream, std::int64_t delta_bytes);

  CostTotals totals() const;

  /// BackendOptions::allow_tf32: fast-mode f32 GEMMs priced at the TF32 tensor-core rate (Note
  /// [Compute units]). Set once by SimBackend before any work.
  void set_allow_tf32(bool on) { allow_tf32_ = on; }
  bool allow_tf32() const { return allow_tf32_; }

  /// One kind of work on one device since the cost model's creation: the kernels, copies or
  /// collectives of one name priced on one unit, summed (what ditto-train --dry-run --verbose
  /// tabulates).
  struct LedgerRow {
    std::string
        name;  ///< the kernel's name ("gemm", "attention_forward"), a copy's, a collective's
    PricedUnit unit = PricedUnit::memory;
    std::int64_t count = 0;  ///< launches (a kernel of KernelCost::launches counts them all)
    double flops = 0, bytes = 0;
    VTime time = 0;  ///< summed durations (busy time on the device's streams)
  };
  /// Device `device`'s ledger, in the order its rows first appeared (read when the streams are
  /// idle). Throws InvalidArgument for a device out of range.
  std::vector<LedgerRow> ledger(int device) const;

 private:
  struct PerDevice {
    std::atomic<VTime> end{0}, compute{0}, comm{0}, host_copy{0};
    std::atomic<std::int64_t> mem{0};
    double slowdown = 1.0;
    mutable std::mutex ledger_mu;
    std::vector<LedgerRow> ledger;
  };
  void record(int device, const char* name, PricedUnit unit, double flops, double bytes,
              VTime duration, std::int64_t launches = 1);
  void finish(SimStream& stream, int device, VTime start, VTime end, const char* name,
              const char* cat, std::atomic<VTime>* busy);

  ClusterSpec cluster_;
  std::vector<std::unique_ptr<PerDevice>> devices_;
  std::atomic<std::uint64_t> gemm_flops_{0};
  std::atomic<bool> tracing_{false};
  bool dry_run_ = false;
  bool allow_tf32_ = false;
  std::unique_ptr<TraceRecorder> trace_;
};

}  // namespace ditto::sim
