// Eigen for the simulator's kernel files (sim_gemm.cpp, sim_kernels.cpp); internal to
// backend_sim, not installed. Include it before any other header that may include Eigen.
#pragma once

// GCC 12 reports false (maybe-)uninitialized warnings inside Eigen's AVX-512 packet code
// (_mm512_undefined_ps); they are raised after inlining, so only a file-wide pragma silences them
// (a pragma in a header stays in force for the rest of the including file).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <Eigen/Core>

namespace ditto::sim {

/// A row-major f32 matrix, the layout of every 2-dim tensor.
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

}  // namespace ditto::sim
