// libFuzzer target: sim::device_profile (backend_sim/profiles.h) on a JSON profile file holding
// the input, then the cost model's roofline over an accepted profile. Seeds: corpus/profile/.
// A ditto::Error is the expected refusal; any other exception or a crash is a finding.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backend_sim/cost_model.h"
#include "backend_sim/profiles.h"
#include "core/base/error.h"
#include "tools/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = ditto_fuzz::scratch_dir() + "/profile.json";
  ditto_fuzz::write_bytes(path, std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const ditto::sim::DeviceProfile p = ditto::sim::device_profile(path);
    // An accepted profile holds finite, positive figures (the documented ranges).
    for (double v :
         {p.fp32_flops, p.tf32_flops, p.bf16_flops, p.f16_flops, p.memory_bytes, p.memory_bandwidth,
          p.host_bandwidth, p.gemm_efficiency, p.memory_efficiency, p.simt_efficiency})
      if (!(std::isfinite(v) && v > 0)) std::abort();
    if (!(p.launch_latency >= 0 && p.host_latency >= 0)) std::abort();
    (void)ditto::sim::interconnect_profile(ditto::sim::default_interconnect(p.key));
    // The cost model's roofline over the profile: a finite, non-negative time.
    // Every unit (Note [Compute units]): library GEMMs over each dtype (and TF32), ditto's SIMT
    // GEMM, a fused kernel with matrix-product FLOPs.
    using ditto::DType;
    using ditto::sim::GemmPath;
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (GemmPath path : {GemmPath::library, GemmPath::simt})
        for (bool gemm : {false, true})
          for (bool tf32 : {false, true}) {
            const double s =
                ditto::sim::kernel_seconds(p, {1e12, 1e9, gemm, gemm ? 0.0 : 1e11, path, t}, tf32);
            if (!(std::isfinite(s) && s >= 0)) std::abort();
            (void)ditto::sim::to_vtime(s);
          }
  } catch (const ditto::Error&) {
  }
  return 0;
}
