// The simulator's option rows and the parsing of --straggler (sim_options.h).
#include "backend_sim/sim_options.h"

#include "core/base/error.h"

namespace ditto::sim {

std::pair<int, double> parse_straggler(const std::string& s, const std::string& name) {
  const auto colon = s.find(':');
  int dev = -1;
  double factor = 0;
  bool ok = colon != std::string::npos;
  try {
    std::size_t u1 = 0, u2 = 0;
    if (ok) {
      dev = std::stoi(s.substr(0, colon), &u1);
      factor = std::stod(s.substr(colon + 1), &u2);
      ok = u1 == colon && u2 == s.size() - colon - 1;
    }
  } catch (...) {
    ok = false;
  }
  DITTO_CHECK(ok, name, ": expected DEVICE:FACTOR such as 3:2.5, got '", s, "'");
  return {dev, factor};
}

SimRunOptions SimOptions::parsed(const train::TrainerConfig& c) const {
  SimRunOptions out = run;
  for (const std::string& s : stragglers)
    out.stragglers.push_back(parse_straggler(s, c.name_of("stragglers")));
  return out;
}

train::OptionTable sim_options(SimOptions& o) {
  return {
      train::option("--profile", &o.run.profile,
                    "sim: device profile for the cost model and memory capacity (h100-sxm, h200, "
                    "a100-sxm-80gb, a100-sxm-40gb, rtx4070-laptop, or a .json file); prints the "
                    "predicted step",
                    "a profile name or .json file")
          .no_default(),
      train::option("--interconnect", &o.run.interconnect,
                    "sim: links between GPUs: auto, nvlink, nvlink3, pcie5, pcie4"),
      train::option("--nodes", &o.run.nodes,
                    "sim: nodes of --devices GPUs each (InfiniBand between)",
                    "an integer in 1..4096"),
      train::option("--trace", &o.run.trace,
                    "sim: write a Chrome trace JSON (Perfetto) to this file", "a file name")
          .no_default(),
      train::option(
          "--straggler", &o.stragglers,
          "sim: DEVICE:FACTOR, that device's kernels take FACTOR times longer (repeatable)")
          .sets("stragglers")
          .no_default()
          .repeated(),
      train::option("--fault", &o.run.faults,
                    "sim: inject a fault (repeatable): fail:device=D,step=S | "
                    "alloc:device=D,after=N | skip-collective:rank=R,index=K")
          .sets("faults")
          .no_default()
          .repeated()};
}

}  // namespace ditto::sim
