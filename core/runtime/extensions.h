// Interfaces of backend extras that callers reach through Backend::extension<T>() instead of a
// dynamic_cast to a backend's class (ggml's get_proc_address): the simulator's cost model and
// its fault injection (backend_sim/ implements both; other backends return nullptr). Core code
// (the Trainer, core/train/) uses them without including any backend header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ditto {

/// The simulated cluster a cost model predicts for (backend_sim/profiles.h, cost_model.h).
struct CostClusterOptions {
  std::string profile;                ///< device profile key or .json file; "": keep the current
  std::string interconnect = "auto";  ///< auto (the profile's default), nvlink, pcie5, ...
  int nodes = 1;                      ///< nodes of devices_per_node devices each
  int devices_per_node = 1;
};

/// Totals of the cost model since its creation (read while every stream is idle). Virtual
/// times in integer picoseconds, so differences are exact.
struct CostSnapshot {
  std::int64_t now_ps = 0;            ///< latest virtual end time over all devices
  std::uint64_t gemm_flops = 0;       ///< FLOPs of matrix products, all devices
  std::vector<std::int64_t> comm_ps;  ///< per device: collectives and device-to-device copies
};

/// One kind of work of one device, summed: the kernels, copies or collectives of one name
/// priced on one unit (Note [Compute units] in backend_sim/cost_model.h), since the cost model's
/// creation. What ditto-train --dry-run --verbose tabulates per step.
struct CostLedgerRow {
  std::string name;          ///< "gemm", "attention_forward", "copy_h2d", "all_reduce", ...
  std::string unit;          ///< "tensor core bf16", "SIMT f32 (ditto)", "memory", "PCIe", ...
  std::int64_t count = 0;    ///< launches
  double flops = 0;          ///< FLOPs (0 for copies and collectives)
  double bytes = 0;          ///< bytes moved to or from device memory (or over the link)
  std::int64_t time_ps = 0;  ///< summed durations, integer picoseconds
};

/// What a cost model's trace recorded (CostModelExtension::trace_stats): a recorder keeps at
/// most max_events events, the first recorded, and counts the rest as dropped.
struct TraceStats {
  std::size_t events = 0;   ///< kept (written by write_trace)
  std::size_t dropped = 0;  ///< recorded past the cap: not in the file
  std::size_t max_events = 0;
  /// Virtual times (ps) of the dropped events: the earliest start, the latest end (0: none).
  std::int64_t first_dropped_ps = 0, last_dropped_end_ps = 0;
};

/// The rates a cost model prices kernels at (backend_sim/profiles.h, Note [Compute units]).
struct CostRates {
  double fp32_flops = 0, tf32_flops = 0, bf16_flops = 0, f16_flops = 0;  ///< FLOP/s peaks
  double memory_bandwidth = 0;                                           ///< bytes/s
  /// Achieved fractions: cuBLASLt's GEMMs, memory-bound kernels, ditto's own SIMT kernels.
  double gemm_efficiency = 1, memory_efficiency = 1, simt_efficiency = 1;
  bool allow_tf32 = false;  ///< BackendOptions::allow_tf32 (fast-mode f32 GEMMs on TF32)
  /// Achieved fraction of the bf16 / f16 peak of ditto's mma.sync kernels (fast-mode attention).
  double mma_efficiency = 1;
};

/// A backend's cost model (the simulator's virtual time, Note [Virtual time] in
/// backend_sim/cost_model.h). Configure it before enqueueing work.
class CostModelExtension {
 public:
  static constexpr std::string_view kExtensionName = "ditto.cost_model";
  virtual ~CostModelExtension() = default;

  /// Sets the cluster. Throws InvalidArgument for an unknown profile or interconnect.
  virtual void configure(const CostClusterOptions& cluster) = 0;
  /// Device `device`'s kernels take `factor` times longer (a straggler). Throws InvalidArgument
  /// for a device out of range or a factor not finite and > 0.
  virtual void set_slowdown(int device, double factor) = 0;
  /// Records every kernel, copy and collective for write_trace.
  virtual void set_tracing(bool on) = 0;
  /// The most events the trace keeps (TraceStats); those past it are dropped, and counted.
  /// Default: the cap stays the backend's own.
  virtual void set_trace_max_events(std::size_t max_events) { (void)max_events; }
  /// What the trace kept and dropped so far. Default: nothing recorded.
  virtual TraceStats trace_stats() const { return {}; }
  /// Writes the recorded events as Chrome trace JSON (Perfetto). Throws on an unwritable path.
  virtual void write_trace(const std::string& path) const = 0;
  virtual CostSnapshot totals() const = 0;
  /// The configured cluster: device name ("NVIDIA H100 SXM5 80GB"), interconnect key, nodes.
  virtual std::string device_name() const = 0;
  virtual std::string interconnect_name() const = 0;
  virtual int nodes() const = 0;
  /// FP32 peak FLOP/s of one device of the cluster.
  virtual double peak_flops() const = 0;
  /// BF16 tensor-core peak FLOP/s (dense) of one device: what nanoGPT's estimate_mfu and llm.c
  /// compare against. Default: peak_flops().
  virtual double bf16_peak_flops() const { return peak_flops(); }
  /// The device profile's achieved efficiencies (Note [Achieved efficiency],
  /// backend_sim/profiles.h): {gemm_efficiency, memory_efficiency}. Default: {1, 1}.
  virtual std::pair<double, double> efficiencies() const { return {1.0, 1.0}; }
  /// The rates of the configured device (Note [Compute units]). Default: all zero.
  virtual CostRates rates() const { return {}; }
  /// Device `device`'s ledger of priced work (CostLedgerRow), in first-seen order; read while
  /// every stream is idle. Default: none.
  virtual std::vector<CostLedgerRow> ledger(int device) const {
    (void)device;
    return {};
  }
  /// Memory (bytes) of the device profile `profile`, without configuring anything (the
  /// capacity a run on that profile should have). Throws InvalidArgument for an unknown one.
  virtual std::size_t profile_memory_bytes(const std::string& profile) const = 0;
};

/// A backend's fault injection (backend_sim/sim_faults.h: fail:device=D,step=S,
/// alloc:device=D,after=N, skip-collective:rank=R,index=K) and its communicators' timeout.
class FaultExtension {
 public:
  static constexpr std::string_view kExtensionName = "ditto.faults";
  virtual ~FaultExtension() = default;

  /// Replaces the injected faults with `specs` (the timeout set by set_comm_timeout stays).
  /// Throws InvalidArgument naming `flag`, the spec and the bad part.
  virtual void set_faults(const std::vector<std::string>& specs,
                          const std::string& flag = "--fault") = 0;
  /// The timeout (ms) of every communicator created afterwards (unset: CommOptions'); the faults
  /// set stay. Throws InvalidArgument when not in 1..2^31 ms.
  virtual void set_comm_timeout(std::optional<std::int64_t> comm_timeout_ms) = 0;
  /// The specs set that have not taken effect yet.
  virtual std::vector<std::string> unfired_faults() const = 0;
};

}  // namespace ditto
