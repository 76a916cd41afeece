#!/usr/bin/env bash
# Runs the CUDA backend's kernels (backend_cuda/cuda_kernels.cu, cuda_gemm.cu and the header
# they share, cuda_kernels_common.cuh) on the CPU, without a GPU or a CUDA toolkit, and compares
# every Kernels method bit for bit with the simulator's (fast-mode reductions within a
# tolerance). extract.py rewrites each kernel file into host C++ (CUDA includes -> emu.h,
# kernel<<<grid, block, ...>>>(args) -> emu_launch(kernel, grid, block, args)); emu.h runs
# each CUDA thread as a host thread, blocks one after another, __shared__ as function statics,
# __syncthreads and warp shuffles as barriers. It checks indexing, tiling, synchronisation and
# operation order; not performance, not cuBLAS (fast-mode gemm), not real-GPU rounding of
# intrinsics (those are IEEE operations on both sides).
#
# Usage: tools/cuda_emu/run.sh [BUILD_DIR]   (default build-emu; a simulator-only build,
#        -DDITTO_WITH_CUDA=OFF, whose lib/libditto.a is linked for the simulator). About a minute.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-emu}
if [[ ! -f $build/lib/libditto.a ]]; then
  cmake -S "$root" -B "$build" -DDITTO_WITH_CUDA=OFF -DDITTO_BUILD_TESTS=OFF \
        -DDITTO_BUILD_EXAMPLES=OFF -DDITTO_BUILD_BENCH=OFF > /dev/null
  cmake --build "$build" -j2 --target ditto > /dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The kernel files, rewritten under $work/backend_cuda/ (searched before the repository, so their
# includes of one another find the rewritten copies), then compiled as one program.
mkdir -p "$work/backend_cuda"
sources=(cuda_kernels_common.cuh cuda_gemm.cu cuda_kernels.cu)
for f in "${sources[@]}"; do
  python3 "$root/tools/cuda_emu/extract.py" "$root/backend_cuda/$f" "$work/backend_cuda/$f"
done
{ for f in "${sources[@]:1}"; do echo "#include \"backend_cuda/$f\""; done
  cat "$root/tools/cuda_emu/test_emu.cpp"; } > "$work/all.cpp"
"${CXX:-g++}" -std=c++20 -O2 -ffp-contract=off -Wno-unknown-pragmas -Wno-stringop-overread -I"$work" \
  -I"$root" -I"$root/tools/cuda_emu" "$work/all.cpp" -o "$work/emu_test" "$build/lib/libditto.a" \
  -lpthread
"$work/emu_test"
