// The simulator's command-line options (train::OptionRow, core/train/options.h): --profile,
// --interconnect, --nodes, --trace, --straggler and --fault, the fields of sim::SimRunOptions
// (backend_sim/sim_run.h) they set, beside them as the Trainer's are beside TrainerConfig. Their
// checks are SimRun::validate's (the run's devices, a known profile, the options that change only
// the cost model's times without --profile or --trace), so a library caller gets them too.
//
//   ditto::sim::SimOptions s;
//   ditto::train::OptionTable rows = ditto::sim::sim_options(s);
//   // ... a parser writes the values given (--straggler 3:2.5), then:
//   auto run = ditto::sim::add_sim_run(cfg, s.parsed(cfg));
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backend_sim/sim_run.h"
#include "core/train/options.h"

namespace ditto::sim {

/// SimRunOptions as a command line sets them: the stragglers as text ("DEVICE:FACTOR").
struct SimOptions {
  SimRunOptions run;
  std::vector<std::string> stragglers;  ///< --straggler DEVICE:FACTOR, repeatable

  /// `run` with the stragglers parsed (InvalidArgument naming the option by c.name_of
  /// ("stragglers"): "--straggler: expected DEVICE:FACTOR such as 3:2.5, got '3x2'").
  SimRunOptions parsed(const train::TrainerConfig& c) const;
};

/// The simulator's options, in the general --help group; their help begins "sim: ".
train::OptionTable sim_options(SimOptions& o);

/// "DEVICE:FACTOR" (3:2.5) as {device, factor}; InvalidArgument naming `name` otherwise.
std::pair<int, double> parse_straggler(const std::string& s, const std::string& name);

}  // namespace ditto::sim
