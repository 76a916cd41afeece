// Which optional fields a JSON device profile leaves out (backend_sim/profiles.cpp gives them
// fallbacks): SimRun::validate refuses a run whose dtype needs a missing rate. Its own header so
// that profiles.h, which much of the tree includes, does not change.
#pragma once

#include <string>
#include <vector>

namespace ditto::sim {

/// The optional rate fields (tf32_tflops, bf16_tflops, f16_tflops) that the JSON profile `key`
/// (a path ending in .json) does not give; empty for a built-in profile, which gives them all,
/// and for a file that cannot be read or parsed (device_profile reports that).
std::vector<std::string> json_profile_missing_rates(const std::string& key);

}  // namespace ditto::sim
