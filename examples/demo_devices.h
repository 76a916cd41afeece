// The demos' devices (comm_demo, dataparallel_demo): `prog [devices=4]` starts the sim backend
// with that many virtual GPUs and uses them all.
#pragma once

#include <cstdlib>
#include <vector>

#include "core/runtime/backend.h"

namespace ditto_examples {

/// init_backend("sim") with argv[1] (default 4) devices; returns devices("sim", that count).
/// Throws what init_backend throws (InvalidArgument for a count < 1).
inline std::vector<ditto::Device> demo_sim_devices(int argc, char** argv) {
  const int n_dev = argc > 1 ? std::atoi(argv[1]) : 4;
  ditto::BackendOptions bo;
  bo.device_count = n_dev;
  ditto::init_backend("sim", bo);
  return ditto::devices("sim", n_dev);
}

}  // namespace ditto_examples
