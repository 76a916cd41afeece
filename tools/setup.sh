#!/usr/bin/env bash
# Install what ditto's build needs on Debian/Ubuntu, only what is missing (apt-get; sudo when not
# root). Safe to run repeatedly: with everything present it does nothing.
set -euo pipefail
# libopenblas-dev: the simulator's fast-mode GEMM (optional to CMake: without it, Eigen).
# python3: for the ctests Layering.* (tests/check_layering.py) and CudaEmu.Kernels (extract.py).
pkgs=(cmake g++ make libeigen3-dev libgtest-dev libgmock-dev librandom123-dev libcli11-dev nlohmann-json3-dev zlib1g-dev libopenblas-dev openmpi-bin libopenmpi-dev python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "tools/setup.sh: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
