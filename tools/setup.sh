#!/usr/bin/env bash
# Install what ditto's build needs on Debian/Ubuntu, only what is missing (apt-get; sudo when not
# root). Safe to run repeatedly: with everything present it does nothing.
#
#   tools/setup.sh          the build: g++, CMake, the libraries
#   tools/setup.sh check    also Clang and its compiler runtime (ASan, UBSan, libFuzzer),
#                           clang-format and lld, for the test suite's build (cmake --preset
#                           check; README "Two commands")
set -euo pipefail
if [[ $# -gt 1 || ( $# -eq 1 && $1 != check ) ]]; then
  echo "usage: $0 [check]" >&2
  exit 2
fi
# libopenblas-dev: the simulator's fast-mode GEMM (optional to CMake: without it, Eigen).
# python3: for the ctests Layering.* (tests/check_layering.py) and CudaEmu.Kernels (extract.py).
pkgs=(cmake g++ make libeigen3-dev libgtest-dev libgmock-dev librandom123-dev libcli11-dev nlohmann-json3-dev zlib1g-dev libopenblas-dev openmpi-bin libopenmpi-dev python3)
# clang-format: ctest Format.ChangedFiles; lld: the check preset's linker.
[[ ${1:-} == check ]] && pkgs+=(clang clang-format lld)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
updated=0
install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "tools/setup.sh: installing ${missing[*]}"
  if [ $updated -eq 0 ]; then
    $SUDO apt-get update -qq
    updated=1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
install_missing "${pkgs[@]}"

if [[ ${1:-} == check ]]; then
  # Clang's sanitizer and libFuzzer runtimes: a package named for its major version on Debian 12
  # and later (libclang-rt-14-dev), inside libclang-common-N-dev (a dependency of clang) before.
  clang_major=$(clang -dumpversion | cut -d. -f1)
  if apt-cache show "libclang-rt-$clang_major-dev" >/dev/null 2>&1; then
    install_missing "libclang-rt-$clang_major-dev"
  fi
fi
