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
//               times the device's slowdown factor (a straggler, set_slowdown);
//   copy        host <-> device at the profile's PCIe bandwidth; device <-> device over the
//               interconnect (NVLink / PCIe inside a node, the NIC across nodes), or at memory
//               bandwidth (read + write) inside one device;
//   event       record() stores the recording stream's clock in the event; wait() sets the
//               waiting stream's clock to max(own, event's), so a communication stream and a
//               compute stream overlap as on a GPU (the later of the two, not their sum);
//   collective  starts when the last rank arrives (max over ranks of their stream clocks) and
//               lasts the alpha-beta estimate of the algorithm NCCL would pick
//               (collective_time); every rank's clock ends at start + duration.
// The host has no clock: a blocking copy or synchronize() costs no virtual time of its own.
// Kernel launch latency stands for the host's launch rate, which bounds small kernels.
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
#include "core/comm/collective_kind.h"
#include "core/runtime/dtype.h"

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

/// What one kernel does: floating-point operations and bytes moved to or from device memory.
/// `gemm` marks matrix products, counted as model FLOPs (MFU). `tensor_core` marks a matrix
/// product over bf16 / f16 storage, priced at the profile's bf16_flops (tensor cores, f32
/// accumulate; f16 at the same figure) instead of fp32_flops (Note [Mixed precision]).
/// `matmul_flops` is the part of a fused non-gemm kernel's flops that are matrix products
/// (attention's q k^T, att v and their backward products: Note [Attention memory] in
/// core/numerics/gpt_math.h); a tensor_core kernel runs that part at bf16_flops x
/// gemm_efficiency (flash attention on tensor cores) and the rest at fp32_flops.
struct KernelCost {
  double flops = 0;
  double bytes = 0;
  bool gemm = false;
  bool tensor_core = false;
  double matmul_flops = 0;
};

/// Roofline time of one kernel on `device`: launch latency + max(flops / (peak * e_f),
/// bytes / (memory bandwidth * e_m)), in seconds; the peak is fp32_flops (ditto's f32 kernels run
/// on CUDA cores in both determinism modes: no TF32), bf16_flops for a tensor_core kernel; e_f and
/// e_m are the profile's achieved efficiencies (Note [Achieved efficiency], profiles.h; e_f only
/// for gemm kernels). A tensor_core kernel with matmul_flops runs those at bf16_flops x e_f and
/// the rest at fp32_flops (the two summed).
double kernel_seconds(const DeviceProfile& device, const KernelCost& cost);

/// The cost of the native kernel over `storage` tensors whose f32 kernel costs `f32` (Note
/// [Mixed precision]): for bf16 / f16, bytes scaled by dtype_size(storage) / 4 and a gemm marked
/// tensor_core (and a kernel with matmul_flops); `f32` itself for any other storage dtype.
KernelCost native_cost(const KernelCost& f32, DType storage);

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
CollectiveEstimate collective_time(const ClusterSpec& cluster, CollectiveKind kind,
                                   double bytes, const std::vector<int>& devices,
                                   std::optional<CollectiveAlgo> force = std::nullopt);

/// nccl-tests' bus-bandwidth factor of `kind` over n ranks (busbw = algbw * factor).
double busbw_factor(CollectiveKind kind, int n);

/// Totals of the cost model since its creation or reset (read when the streams are idle).
struct CostTotals {
  VTime now = 0;                     ///< latest virtual end time over all devices
  std::vector<VTime> end;            ///< per device: latest end time of its streams
  std::vector<VTime> compute;        ///< per device: busy time of kernels
  std::vector<VTime> comm;           ///< per device: collectives and device-to-device copies
  std::vector<VTime> host_copy;      ///< per device: host <-> device copies
  std::uint64_t gemm_flops = 0;      ///< FLOPs of matrix products, all devices
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
  /// temporary file renamed onto `path` (TraceRecorder::write_chrome_json). Throws InvalidArgument when tracing was never enabled,
  /// BackendError when the file cannot be written.
  void write_trace(const std::string& path) const;

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

 private:
  struct PerDevice {
    std::atomic<VTime> end{0}, compute{0}, comm{0}, host_copy{0};
    std::atomic<std::int64_t> mem{0};
    double slowdown = 1.0;
  };
  void finish(SimStream& stream, int device, VTime start, VTime end, const char* name,
              const char* cat, std::atomic<VTime>* busy);

  ClusterSpec cluster_;
  std::vector<std::unique_ptr<PerDevice>> devices_;
  std::atomic<std::uint64_t> gemm_flops_{0};
  std::atomic<bool> tracing_{false};
  bool dry_run_ = false;
  std::unique_ptr<TraceRecorder> trace_;
};

}  // namespace ditto::sim
