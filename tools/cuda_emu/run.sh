#!/usr/bin/env bash
# Runs the CUDA backend's kernels (backend_cuda/cuda_kernels.cu) on the CPU, without a GPU or a
# CUDA toolkit, and compares every Kernels method bit for bit with the simulator's (fast-mode
# reductions within a tolerance). extract.py rewrites the .cu into host C++ (CUDA includes ->
# emu.h, kernel<<<grid, block, ...>>>(args) -> emu_launch(kernel, grid, block, args)); emu.h runs
# each CUDA thread as a fiber (Note [Emulated threads]), blocks one after another, __shared__ as function statics,
# __syncthreads and warp shuffles as barriers. It checks indexing, tiling, synchronisation and
# operation order; not performance, not cuBLAS (fast-mode gemm), not real-GPU rounding of
# intrinsics (those are IEEE operations on both sides).
#
# The build is CMake's (tools/cuda_emu/CMakeLists.txt, target cuda_emu_test, ctest
# CudaEmu.Kernels); this script builds that target in BUILD_DIR and runs it (a few seconds; about
# 40 s of one core under ASan).
# Usage: tools/cuda_emu/run.sh [BUILD_DIR]   (default build-emu: configured here when it has no
#        CMakeCache.txt, simulator-only; any existing build folder of the project works too).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-emu}
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -DDITTO_WITH_CUDA=OFF -DDITTO_BUILD_EXAMPLES=OFF \
        -DDITTO_BUILD_BENCH=OFF > /dev/null
fi
cmake --build "$build" -j2 --target cuda_emu_test > /dev/null
"$build/bin/cuda_emu_test"
