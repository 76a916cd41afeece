// Built-in device and interconnect profiles, each figure with its public source, and the JSON
// loader for user profiles.
#include "backend_sim/profiles.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend_sim/profile_fields.h"
#include "core/base/error.h"
#include "core/io/file.h"

namespace ditto::sim {

namespace {
constexpr double kT = 1e12;   // TFLOP/s
constexpr double kG = 1e9;    // GB/s
constexpr double kUs = 1e-6;  // microseconds
constexpr double kGiB = 1073741824.0;
constexpr double kMiB = 1048576.0;
// Memory capacity: nvidia-smi's memory.total of the card, not the data sheet's "80 GB" / "141 GB"
// (141e9 bytes made the H200 131.32 GiB against the H100's 80 GiB). On the H100 it is the total a
// CUDA program sees (cudaMemGetInfo / torch's total_memory: 85,520,809,984 bytes = 81559 MiB);
// on the A100 CUDA's total is a little less than nvidia-smi's (docs/prediction.md: 39.59 GiB of
// the 40GB's 40 GiB). Read off public nvidia-smi outputs (no GPU was at hand to read them here):
//  [smi-H100] NVIDIA/nccl issue #1264 (HGX H100 SXM, driver 550.54.15): "NVIDIA H100 80GB HBM3 ...
//             0MiB / 81559MiB"; modal-labs/modal-client pull request #2797 lists nvidia-smi's
//             totals: H100 81559MiB (85,520,809,984 bytes, which it read as the CUDA total),
//             A100 80GB 81920MiB, A100 40GB 40960MiB.
//  [smi-H200] nvidia-smi of HGX H200 boards (700 W SXM, driver 570.158.01), in several public
//             logs: "NVIDIA H200 ... 0MiB / 143771MiB" (= 140.40 GiB; the data sheet's 141 GB).
//  [smi-4070] a public benchmark report of an RTX 4070 Laptop GPU (driver 595.79): "8,188 MiB
//             total (GDDR6)"; one report, not checked on a second machine.

// Kernel launch latency: the time a small kernel occupies a stream when kernels are launched
// back to back from the host (launch overhead + execution + drain), about 3 us on recent
// GPUs and drivers: NVIDIA Developer Blog, "Getting Started with CUDA Graphs" (2019), measured
// per-kernel times of a few microseconds for tiny kernels launched on a stream.
constexpr double kLaunch = 3.0 * kUs;
// One small host <-> device cudaMemcpy: about 10 us (approximate; driver call + DMA setup).
constexpr double kHostCopy = 10.0 * kUs;
// Achieved efficiency (Note [Achieved efficiency], profiles.h): 1.0 = the data-sheet roofline,
// the placeholder of a profile with no published measurement (empty efficiency_source).
constexpr double kEffPlaceholder = 1.0;

// The measured fractions (Note [Achieved efficiency]). They are micro-benchmark results
// published by others, never fitted to a training run: backend_sim/published.h compares the
// dry runs with llm.c's published step times, and fitting these to those would make that
// comparison circular.
//  [MAMF]  S. Bekman, "Machine Learning Engineering", compute/accelerator/README.md, "Maximum
//          Achievable Matmul FLOPS comparison table", BF16 torch.matmul (no sparsity), the best
//          shape of a search, mean of 100 iterations after 50 warm-up
//          (github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md):
//          "NVIDIA A100 SXM | 271.2 | 312 | 86.9% | 1024x10240x5120" and
//          "NVIDIA H100 SXM | 794.5 | 989 | 80.3% | 2048x2048x13312". The best shape makes it an
//          upper bound for a training step's GEMMs; for comparison Azure's cuBLASLt FP16 on
//          A100-SXM4-80GB measured 228.0 TFLOPS at 4096^3 (73%) and 253.7 at 8192^3 (81%)
//          ([Azure], GEMM CuBLASLt table; its Hopper tables are FP8 only).
//  [Azure] Azure AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md,
//          ND_H100_v5_results.md, ND_H200_v5_results.md, "HBM Bandwidth" table, Triad
//          (github.com/Azure/AI-benchmarking-guide/tree/main/Azure_Results): A100-SXM4-80GB
//          1.70 TB/s of 2.039 = 0.834, H100 80GB HBM3 2.97 of 3.35 = 0.887, H200 4.15 of 4.8 =
//          0.865 (Copy: 1.61, 2.90, 4.01 TB/s).
// The GEMM fraction is measured in BF16 on tensor cores; FP32 GEMMs (CUDA cores) take the same
// fraction (a community run of torch.matmul FP32 4096^3 on an H100 80GB HBM3 reached 51.88 of
// 67 TFLOPS, 77%: github.com/zzc0721/torch-performance-test-data/issues/79).
constexpr double kA100Gemm = 271.2 / 312;  // [MAMF] 0.869
constexpr double kH100Gemm = 794.5 / 989;  // [MAMF] 0.803
constexpr double kA100Hbm = 1.70 / 2.039;  // [Azure] Triad 0.834
constexpr double kH100Hbm = 2.97 / 3.35;   // [Azure] Triad 0.887
constexpr double kH200Hbm = 4.15 / 4.8;    // [Azure] Triad 0.865
// ditto's own SIMT matrix-product kernels (Note [Compute units], cost_model.h): the bitwise
// fma-chain GEMM (issue 29 item 4: 2-D register tiles, vectorised loads, one fma chain per output)
// and the attention kernels' products. [SGEMM] S. Boehm, "How to Optimize a CUDA Matmul Kernel
// for cuBLAS-like Performance" (siboehm.com/articles/22/CUDA-MMM, 2022), FP32 4092^2 on an RTX
// A6000 (38.7 TFLOP/s FP32 peak, NVIDIA RTX A6000 data sheet): kernel 6 "Vectorized Mem Access"
// (2-D block tiling, float4 loads: the design item 4 describes) 18,237 GFLOP/s = 0.47 of the
// peak (cuBLAS 23,250 = 0.60). A fraction of a hand-tiled SIMT SGEMM, taken for every profile
// (it describes ditto's code more than the GPU); a device run (tools/gpu-check.sh) calibrates it.
constexpr double kSimtEfficiency = 18.237 / 38.7;  // [SGEMM] 0.471
// ditto's own tensor-core kernels (mma.sync m16n8k16, bf16 / f16 in, f32 accumulate): the typed
// fast-mode attention (Note [Typed kernels], cost_model.h). An ESTIMATE to be calibrated on a
// device, not a measurement: [FA2] T. Dao, "FlashAttention-2: Faster Attention with Better
// Parallelism and Work Partitioning" (arXiv 2307.08691, 2023): 50-73% of an A100's BF16 peak,
// and on an H100 without Hopper's wgmma / TMA up to 335 TFLOP/s (34% of 989); issue 29 takes
// FA2 at roughly 35-50% of the H100 BF16 dense peak forward and less backward. ditto's kernel is
// simpler (mma.sync, no wgmma, no TMA, no warp specialisation): 0.25 of the peak, for every
// profile, forward and backward alike, until tools/gpu-check.sh measures it.
constexpr double kMmaEfficiency = 0.25;
const char* const kEffMamfAzure =
    "GEMM: Bekman, ML Engineering, MAMF table (BF16 best shape); HBM: Azure "
    "AI-benchmarking-guide ND results, STREAM Triad";
}  // namespace

const std::vector<DeviceProfile>& builtin_device_profiles() {
  static const std::vector<DeviceProfile> profiles = {
      // NVIDIA H100 Tensor Core GPU data sheet (H100 SXM column): FP32 67 TFLOPS; TF32 tensor
      // 989 TFLOPS, BF16 and FP16 1,979 TFLOPS each *with sparsity* (dense = half); 80 GB HBM3 at
      // 3.35 TB/s; PCIe Gen5 x16 (128 GB/s both directions = 64 GB/s each way).
      {"h100-sxm", "NVIDIA H100 SXM5 80GB", 67 * kT, 494.5 * kT, 989.5 * kT, 989.5 * kT,
       81559 * kMiB,  // [smi-H100]
       3350 * kG, kLaunch, 64 * kG, kHostCopy,
       "NVIDIA H100 Tensor Core GPU data sheet (SXM); dense = sparse/2", kH100Gemm, kH100Hbm,
       kEffMamfAzure, kSimtEfficiency, kMmaEfficiency},
      // NVIDIA H200 Tensor Core GPU data sheet (H200 SXM): FP32 67 TFLOPS; TF32 989, BF16 and
      // FP16 1,979 TFLOPS each with sparsity; 141 GB HBM3e at 4.8 TB/s; PCIe Gen5 x16.
      {"h200", "NVIDIA H200 SXM 141GB", 67 * kT, 494.5 * kT, 989.5 * kT, 989.5 * kT,
       143771 * kMiB,  // [smi-H200] (141e9 bytes, the data sheet's GB, was 131.32 GiB: 7% short)
       4800 * kG, kLaunch, 64 * kG, kHostCopy,
       "NVIDIA H200 Tensor Core GPU data sheet (SXM); dense = sparse/2",
       // H200's tensor cores and peak are H100 SXM's (989 TFLOPS dense BF16 in both data
       // sheets): H100's GEMM fraction; its own HBM3e Triad.
       kH100Gemm, kH200Hbm, kEffMamfAzure, kSimtEfficiency, kMmaEfficiency},
      // NVIDIA A100 Tensor Core GPU data sheet (A100 80GB SXM): FP32 19.5 TFLOPS; TF32 156,
      // BF16 312 and FP16 312 TFLOPS dense (312 / 624 with sparsity); 80 GB HBM2e at 2,039 GB/s;
      // PCIe Gen4
      // x16 (64 GB/s both directions).
      {"a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", 19.5 * kT, 156 * kT, 312 * kT, 312 * kT,
       81920 * kMiB,  // [smi-H100]'s A100 80GB row
       2039 * kG, kLaunch, 32 * kG, kHostCopy, "NVIDIA A100 Tensor Core GPU data sheet (80GB SXM)",
       kA100Gemm, kA100Hbm, kEffMamfAzure, kSimtEfficiency, kMmaEfficiency},
      // Same data sheet, A100 40GB SXM column: FP32 19.5, TF32 156, BF16 / FP16 312 TFLOPS dense;
      // 40 GB HBM2 at 1,555 GB/s; PCIe Gen4 x16.
      {"a100-sxm-40gb", "NVIDIA A100 SXM4 40GB", 19.5 * kT, 156 * kT, 312 * kT, 312 * kT,
       40960 * kMiB,  // [smi-H100]'s A100 40GB row
       1555 * kG, kLaunch, 32 * kG, kHostCopy, "NVIDIA A100 Tensor Core GPU data sheet (40GB SXM)",
       // The same GPU as the 80GB: its GEMM fraction; no published STREAM figure of the 40GB's
       // HBM2 was found, so it takes the 80GB's Triad fraction (an assumption).
       kA100Gemm, kA100Hbm,
       "GEMM: Bekman, ML Engineering, MAMF table (A100 SXM, BF16); HBM: the 80GB's Azure Triad "
       "fraction, assumed",
       kSimtEfficiency, kMmaEfficiency},
      // NVIDIA GeForce RTX 4070 Laptop GPU (specifications page): 4,608 CUDA cores, boost clock
      // up to 2,175 MHz, 8 GB GDDR6 on a 128-bit bus (16 Gbps: 256 GB/s), PCIe 4.0 x8.
      // FP32 = 4608 * 2 FLOP * 2.175 GHz = 20.0 TFLOPS. NVIDIA Ada Lovelace architecture
      // whitepaper (GeForce RTX 4090 table): TF32 tensor rate = FP32 rate, BF16 and FP16 with
      // FP32 accumulate = 2x FP32 rate on GeForce Ada parts.
      {"rtx4070-laptop", "NVIDIA GeForce RTX 4070 Laptop GPU 8GB", 20.04 * kT, 20.04 * kT,
       40.09 * kT, 40.09 * kT, 8188 * kMiB /* [smi-4070] */, 256 * kG, kLaunch, 16 * kG, kHostCopy,
       "NVIDIA RTX 4070 Laptop specifications; Ada Lovelace whitepaper (rate ratios)",
       kEffPlaceholder, kEffPlaceholder, "", kSimtEfficiency, kMmaEfficiency},
  };
  return profiles;
}

const std::vector<InterconnectProfile>& builtin_interconnects() {
  // Shared sources:
  //  [NCCL-topo]   NVIDIA/nccl src/graph/topo.h: NCCL's model of usable link bandwidth:
  //                SM90_NVLINK_BW 20.6 GB/s per NVLink 4 link, SM80_NVLINK_BW 20.0 per NVLink 3
  //                link, PCI_BW 12 GB/s for PCIe Gen3 x16 (x2 per generation), NET_BW 12 GB/s
  //                per 100 Gb/s, INTEL_P2P_OVERHEAD(bw) = bw * 6/5 for GPU-to-GPU traffic
  //                through the CPU's PCIe root complex.
  //  [NCCL-tuning] NVIDIA/nccl src/graph/tuning.cc: baseLat Ring/LL 6.6 us; hwLat (one ring
  //                step, LL protocol) NVLink 0.6 us, PCI 1.0 us, network 2.7 us;
  //                nvlsEfficiency 0.85 on Hopper.
  //  [IB-NDR]      NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand: 400 Gb/s per port; HGX H100/H200
  //                systems (DGX H100 user guide) have one 400 Gb/s NIC per GPU, 8 per node.
  static const std::vector<InterconnectProfile> ics = {
      // HGX H100 / H200: each GPU has 18 NVLink 4 links to the NVSwitches, 900 GB/s both
      // directions (450 GB/s each way; H100/H200 data sheets); NCCL models 18 x 20.6 GB/s.
      {"nvlink", "NVLink 4 + NVSwitch (HGX H100/H200), NVLS; InfiniBand NDR between nodes",
       18 * 20.6 * kG, 450 * kG, 0.6 * kUs, 6.6 * kUs, 0.85, 48 * kG, 8, 2.7 * kUs,
       "H100/H200 data sheets (900 GB/s NVLink); NCCL topo.h/tuning.cc; NDR 400 Gb/s per GPU"},
      // HGX A100: 12 NVLink 3 links per GPU, 600 GB/s both directions (A100 data sheet); no
      // NVLS on Ampere.
      {"nvlink3", "NVLink 3 + NVSwitch (HGX A100); InfiniBand NDR between nodes", 12 * 20.0 * kG,
       300 * kG, 0.6 * kUs, 6.6 * kUs, 0.0, 48 * kG, 8, 2.7 * kUs,
       "A100 data sheet (600 GB/s NVLink); NCCL topo.h/tuning.cc"},
      // PCIe Gen5 x16: 32 GT/s x 16 lanes = 64 GB/s each way (PCI-SIG); NCCL: 4 x 12 GB/s = 48,
      // / 1.2 for peer traffic through the CPU = 40 GB/s.
      {"pcie5", "PCIe Gen5 x16 (no NVLink); InfiniBand NDR between nodes", 40 * kG, 64 * kG,
       1.0 * kUs, 6.6 * kUs, 0.0, 48 * kG, 8, 2.7 * kUs,
       "PCI-SIG Gen5 (64 GB/s per direction); NCCL topo.h PCI_BW, INTEL_P2P_OVERHEAD"},
      // PCIe Gen4 x16: 32 GB/s each way; NCCL: 2 x 12 = 24 GB/s, / 1.2 = 20 GB/s.
      {"pcie4", "PCIe Gen4 x16 (no NVLink); InfiniBand NDR between nodes", 20 * kG, 32 * kG,
       1.0 * kUs, 6.6 * kUs, 0.0, 48 * kG, 8, 2.7 * kUs,
       "PCI-SIG Gen4 (32 GB/s per direction); NCCL topo.h PCI_BW, INTEL_P2P_OVERHEAD"},
  };
  return ics;
}

namespace {

std::string known_keys_devices() {
  std::string s;
  for (const auto& p : builtin_device_profiles()) s += (s.empty() ? "" : ", ") + p.key;
  return s;
}

// A number field of a JSON profile, in [lo, hi] (its unit's plausible range: a value far outside
// it is a typo or a unit mistake and would make every prediction absurd).
double ranged_field(const nlohmann::json& j, const std::string& file, const char* field,
                    bool required, double fallback, double lo, double hi) {
  if (!j.contains(field)) {
    DITTO_CHECK(!required, "device_profile: ", file, ": missing field '", field, "'");
    return fallback;
  }
  const auto& v = j.at(field);
  // Not v.dump() for a non-number: dump() recurses once per level, so a value nested 100,000
  // deep overflowed the stack (SIGSEGV instead of this error; reproduced with
  // tools/fuzz/fuzz_profile).
  DITTO_CHECK(v.is_number(), "device_profile: ", file, ": field '", field,
              "': expected a number, got ",
              v.is_array() || v.is_object() ? std::string(v.type_name()) : v.dump().substr(0, 80));
  double d = v.get<double>();
  DITTO_CHECK(std::isfinite(d) && d >= lo && d <= hi, "device_profile: ", file, ": field '", field,
              "': expected ", lo, " <= value <= ", hi, ", got ", v.dump());
  return d;
}

// Every field a JSON profile may have: a field outside it is refused (a typo such as
// "memory_bandwith_gbps" would otherwise leave the default and go unnoticed), naming the nearest
// known field when one is within a third of its length, and listing them all.
void check_known_fields(const nlohmann::json& j, const std::string& file) {
  static const std::vector<std::string> known{"key",
                                              "name",
                                              "source",
                                              "fp32_tflops",
                                              "tf32_tflops",
                                              "bf16_tflops",
                                              "f16_tflops",
                                              "memory_gib",
                                              "memory_bandwidth_gbps",
                                              "launch_latency_us",
                                              "host_bandwidth_gbps",
                                              "host_latency_us",
                                              "gemm_efficiency",
                                              "memory_efficiency",
                                              "efficiency_source",
                                              "simt_efficiency",
                                              "mma_efficiency"};
  for (const auto& [field, value] : j.items()) {
    if (std::find(known.begin(), known.end(), field) != known.end()) continue;
    std::string nearest, all;
    std::size_t best = std::max<std::size_t>(2, field.size() / 3) + 1;
    for (const std::string& k : known) {
      all += (all.empty() ? "" : ", ") + k;
      if (const std::size_t d = detail::edit_distance(field, k); d < best) best = d, nearest = k;
    }
    throw InvalidArgument(detail::cat("device_profile: ", file, ": unknown field '", field, "'",
                                      nearest.empty() ? "" : " (did you mean '" + nearest + "'?)",
                                      ": expected one of ", all));
  }
}

// Plausible ranges of the JSON fields, in the fields' units.
constexpr double kMinTflops = 1e-3, kMaxTflops = 1e5;     // TFLOP/s
constexpr double kMinGBps = 1e-3, kMaxGBps = 1e6;         // GB/s
constexpr double kMinGiB = 1.0 / 1024, kMaxGiB = 1e5;     // GiB
constexpr double kMinLatencyUs = 0, kMaxLatencyUs = 1e6;  // microseconds
constexpr double kMinEfficiency = 1e-3;                   // fraction of a peak (max 1)

DeviceProfile load_json_profile(const std::string& path) {
  std::string text;
  try {
    text = io::read_file(path, io::kMaxJsonBytes, "device_profile");  // Note [Bounded reads]
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(detail::cat("device_profile: ", path, ": malformed JSON: ", e.what()));
  }
  DITTO_CHECK(j.is_object(), "device_profile: ", path, ": expected a JSON object, got ",
              j.type_name());
  DeviceProfile p;
  try {
    check_known_fields(j, path);
    p.key = j.value("key", path);
    p.name = j.value("name", p.key);
    p.fp32_flops = ranged_field(j, path, "fp32_tflops", true, 0, kMinTflops, kMaxTflops) * kT;
    p.tf32_flops =
        ranged_field(j, path, "tf32_tflops", false, p.fp32_flops / kT, kMinTflops, kMaxTflops) * kT;
    p.bf16_flops =
        ranged_field(j, path, "bf16_tflops", false, p.tf32_flops / kT, kMinTflops, kMaxTflops) * kT;
    p.f16_flops =
        ranged_field(j, path, "f16_tflops", false, p.bf16_flops / kT, kMinTflops, kMaxTflops) * kT;
    p.memory_bytes = ranged_field(j, path, "memory_gib", true, 0, kMinGiB, kMaxGiB) * kGiB;
    p.memory_bandwidth =
        ranged_field(j, path, "memory_bandwidth_gbps", true, 0, kMinGBps, kMaxGBps) * kG;
    p.launch_latency = ranged_field(j, path, "launch_latency_us", false, kLaunch / kUs,
                                    kMinLatencyUs, kMaxLatencyUs) *
                       kUs;
    p.host_bandwidth =
        ranged_field(j, path, "host_bandwidth_gbps", false, 32, kMinGBps, kMaxGBps) * kG;
    p.host_latency = ranged_field(j, path, "host_latency_us", false, kHostCopy / kUs, kMinLatencyUs,
                                  kMaxLatencyUs) *
                     kUs;
    p.source = j.value("source", "user profile " + path);
    p.gemm_efficiency = ranged_field(j, path, "gemm_efficiency", false, 1.0, kMinEfficiency, 1.0);
    p.memory_efficiency =
        ranged_field(j, path, "memory_efficiency", false, 1.0, kMinEfficiency, 1.0);
    p.efficiency_source = j.value("efficiency_source", "");
    p.simt_efficiency =
        ranged_field(j, path, "simt_efficiency", false, kSimtEfficiency, kMinEfficiency, 1.0);
    p.mma_efficiency =
        ranged_field(j, path, "mma_efficiency", false, kMmaEfficiency, kMinEfficiency, 1.0);
  } catch (const nlohmann::json::exception& e) {  // e.g. "key": 3 (not a string)
    throw InvalidArgument(detail::cat("device_profile: ", path, ": ", e.what()));
  }
  return p;
}

}  // namespace

DeviceProfile device_profile(const std::string& key) {
  for (const auto& p : builtin_device_profiles())
    if (p.key == key) return p;
  if (key.size() > 5 && key.compare(key.size() - 5, 5, ".json") == 0) return load_json_profile(key);
  throw InvalidArgument(detail::cat("device_profile: unknown profile '", key, "': expected one of ",
                                    known_keys_devices(), " or a .json file"));
}

std::vector<std::string> json_profile_missing_rates(const std::string& key) {
  if (key.size() <= 5 || key.compare(key.size() - 5, 5, ".json") != 0) return {};
  for (const auto& p : builtin_device_profiles())
    if (p.key == key) return {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(key, io::kMaxJsonBytes, "device_profile"));
  } catch (const std::exception&) {
    return {};  // device_profile's error, when the run loads it
  }
  if (!j.is_object()) return {};
  std::vector<std::string> missing;
  for (const char* field : {"tf32_tflops", "bf16_tflops", "f16_tflops"})
    if (!j.contains(field)) missing.emplace_back(field);
  return missing;
}

std::string default_interconnect(const std::string& device_key) {
  if (device_key == "h100-sxm" || device_key == "h200") return "nvlink";
  if (device_key == "a100-sxm-80gb" || device_key == "a100-sxm-40gb") return "nvlink3";
  return "pcie4";
}

InterconnectProfile interconnect_profile(const std::string& key) {
  std::string known;
  for (const auto& p : builtin_interconnects()) {
    if (p.key == key) return p;
    known += (known.empty() ? "" : ", ") + p.key;
  }
  throw InvalidArgument(detail::cat("interconnect_profile: unknown interconnect '", key,
                                    "': expected one of ", known));
}

}  // namespace ditto::sim
