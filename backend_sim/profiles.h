// Device and interconnect profiles of the simulator's cost model (backend_sim/cost_model.h): the
// public figures of a GPU (peak FLOP/s per dtype, memory size and bandwidth, kernel launch
// latency) and of the links between GPUs (NVLink switch, PCIe, InfiniBand between nodes). Built-in
// profiles carry their sources in profiles.cpp; more can be loaded from a JSON file.
//
// Units everywhere: FLOP/s, bytes, bytes/s, seconds (SI: 1 GB/s = 1e9 bytes/s).
#pragma once

#include <string>
#include <vector>

namespace ditto::sim {

/// One GPU model. Peak figures are dense (no 2:4 sparsity) at boost clock, as data sheets give.
struct DeviceProfile {
  std::string key;              ///< command-line name, e.g. "h100-sxm"
  std::string name;             ///< e.g. "NVIDIA H100 SXM5 80GB"
  double fp32_flops = 0;        ///< FP32 on the SIMT (CUDA) cores
  double tf32_flops = 0;        ///< TF32 on tensor cores (f32 GEMMs with allow_tf32)
  double bf16_flops = 0;        ///< BF16 on tensor cores (FP32 accumulate)
  double f16_flops = 0;         ///< FP16 on tensor cores (FP32 accumulate); 0: bf16_flops
  double memory_bytes = 0;      ///< device memory (the simulator's capacity per device)
  double memory_bandwidth = 0;  ///< HBM / GDDR bandwidth
  double launch_latency = 0;    ///< time one small kernel occupies a stream (launch + drain)
  double host_bandwidth = 0;    ///< host <-> device copies (PCIe), per direction
  double host_latency = 0;      ///< fixed cost of one host <-> device copy
  std::string source;           ///< where the figures come from
  // Achieved efficiency (Note [Achieved efficiency]): the fraction of a data-sheet peak that
  // real kernels reach. kernel_seconds (cost_model.h) divides by peak * efficiency.
  /// Fraction of the FLOP/s peak (tensor-core BF16 / FP16 / TF32, or FP32) that a vendor
  /// library's matrix products (cuBLASLt: fast-mode KernelCost::gemm) of a training step reach,
  /// in (0, 1]. Other kernels' FLOPs are priced at the peak (they are memory-bound).
  double gemm_efficiency = 1.0;
  /// Fraction of memory_bandwidth that memory-bound kernels reach, in (0, 1].
  double memory_efficiency = 1.0;
  /// Where the efficiencies come from ("" while they are the 1.0 placeholders).
  std::string efficiency_source;
  /// Fraction of the FP32 peak that ditto's own SIMT matrix-product kernels reach (the bitwise
  /// fma-chain GEMM, the micro-sharded dW GEMM, attention's products in both modes: Note
  /// [Compute units], cost_model.h), in (0, 1]. kSimtEfficiency (profiles.cpp, with its
  /// source: 18.237 / 38.7) unless a JSON profile sets "simt_efficiency"; a device run
  /// calibrates it.
  double simt_efficiency = 18.237 / 38.7;
  /// Fraction of the BF16 / FP16 tensor-core peak that ditto's own mma.sync kernels reach (the
  /// typed fast-mode attention, FlashAttention-2 style: Note [Typed kernels], cost_model.h), in
  /// (0, 1]. An ESTIMATE, not a measurement: kMmaEfficiency (profiles.cpp: 0.25, below
  /// FlashAttention-2's 35-50% of the H100 BF16 peak forward, for a kernel without wgmma or TMA)
  /// unless a JSON profile sets "mma_efficiency"; a device run calibrates it.
  double mma_efficiency = 0.25;
};

// Note [Achieved efficiency]
// A roofline at data-sheet peaks predicts the fastest a kernel could run; real GPUs reach a
// fraction of it: cuBLAS GEMMs of a GPT-2 training step reach well under the tensor-core peak,
// and elementwise kernels reach part of the HBM bandwidth. Each device profile carries two
// fractions, gemm_efficiency (matrix products' FLOP/s) and memory_efficiency (bytes/s), applied in
// kernel_seconds:
//   time = launch_latency + max(flops / (peak * e_f), bytes / (memory_bandwidth * e_m)),
//   e_f = gemm_efficiency for cuBLASLt's GEMMs (fast mode), simt_efficiency for ditto's own SIMT
//   matrix products (bitwise GEMMs, attention), 1 otherwise; e_m = memory_efficiency; the peak is
//   the unit's (Note [Compute units] in cost_model.h).
// The built-in A100 / H100 / H200 profiles hold published micro-benchmark fractions (profiles.cpp
// cites each: GEMM from Bekman's Maximum Achievable Matmul FLOPS table, BF16: A100 SXM 0.869,
// H100 SXM 0.803, H200 as H100; HBM from Azure's STREAM Triad runs: A100 80GB 0.834, H100 0.887,
// H200 0.865), never fractions fitted to a training run (backend_sim/published.h compares dry
// runs with published training runs; fitting to them would make that circular); the laptop
// profile holds 1.0 (no published measurement). JSON profiles may set "gemm_efficiency" and
// "memory_efficiency" (each in [0.001, 1]). Collectives are not derated here: their
// interconnect profiles already hold the bandwidth NCCL reaches.
// ditto's own SIMT kernels (bitwise GEMM, attention: Note [Compute units] in cost_model.h) are
// priced at fp32_flops x simt_efficiency instead of gemm_efficiency: a hand-tiled SIMT SGEMM
// reaches less of the FP32 peak than cuBLAS (profiles.cpp, kSimtEfficiency, cites the figure).

/// The links between the GPUs of one node, and the network between nodes.
struct InterconnectProfile {
  std::string key;  ///< "nvlink", "pcie4", "pcie5"
  std::string name;
  /// Per-GPU bandwidth per direction that NCCL's ring reaches (the busbw ceiling of a ring).
  double link_bandwidth = 0;
  double link_peak_bandwidth = 0;  ///< the data-sheet figure per direction, for reference
  double hop_latency = 0;          ///< one step of a ring or tree inside a node
  double base_latency = 0;         ///< fixed cost of one collective (kernel launch, sync)
  /// NVLink SHARP (NVLS): the NVSwitch reduces in the switch; 0 when absent.
  double nvls_efficiency = 0;
  // Between nodes (used when a communicator spans more than one node).
  double nic_bandwidth = 0;    ///< per NIC per direction, achievable
  int nics_per_node = 0;       ///< one NIC per GPU on HGX systems
  double net_hop_latency = 0;  ///< one step across the network
  std::string source;
};

/// The simulated cluster: `nodes` nodes of `devices_per_node` GPUs of one model.
struct ClusterSpec {
  DeviceProfile device;
  InterconnectProfile interconnect;
  int nodes = 1;
  int devices_per_node = 8;

  int node_of(int device) const { return devices_per_node > 0 ? device / devices_per_node : 0; }
};

/// Built-in device profiles: "h100-sxm", "h200", "a100-sxm-80gb", "a100-sxm-40gb",
/// "rtx4070-laptop".
const std::vector<DeviceProfile>& builtin_device_profiles();
/// Built-in interconnects: "nvlink" (HGX NVSwitch, NVLink 4, NVLS; InfiniBand NDR between
/// nodes), "pcie5", "pcie4" (no NVLink; same network between nodes).
const std::vector<InterconnectProfile>& builtin_interconnects();

/// The device profile named `key`: a built-in key, or the path of a JSON file (any name ending
/// in ".json") whose object holds the DeviceProfile fields by name, e.g.
///   {"key": "tiny", "name": "tiny GPU", "fp32_tflops": 10, "memory_gib": 0.0625,
///    "memory_bandwidth_gbps": 500, "launch_latency_us": 3}
/// (optional: tf32_tflops, bf16_tflops, f16_tflops (default bf16_tflops), host_bandwidth_gbps,
/// host_latency_us, source, gemm_efficiency, memory_efficiency (fractions in [0.001, 1], default
/// 1), simt_efficiency (in [0.001, 1], default 0.471), efficiency_source; GB/s and
/// TFLOP/s in SI units, memory in GiB). Throws InvalidArgument naming the key or the file and
/// field for an unknown key, an unreadable file, one that is not a regular file or has more
/// than 16 MiB (io::kMaxJsonBytes: Note [Bounded reads] in core/io/file.h), malformed JSON, a
/// field that is none of these (naming it, the nearest known one and all of them), or a missing
/// field or one outside its plausible range: TFLOP/s in [1e-3, 1e5], GB/s in [1e-3, 1e6],
/// memory_gib in [1/1024, 1e5], latencies (us) in [0, 1e6].
DeviceProfile device_profile(const std::string& key);

/// The interconnect a device profile normally comes with, by its key: "nvlink" for h100-sxm and
/// h200, "nvlink3" for a100-sxm-80gb and a100-sxm-40gb, "pcie4" otherwise (laptops, and JSON
/// profiles whose "key" names none of these; one that names a built-in profile gets its links).
std::string default_interconnect(const std::string& device_key);

/// The interconnect named `key` (built-in). Throws InvalidArgument listing the known keys.
InterconnectProfile interconnect_profile(const std::string& key);

}  // namespace ditto::sim
