#!/usr/bin/env bash
# Install what ditto's build needs on Debian/Ubuntu, only what is missing (apt-get; sudo when not
# root). Safe to run repeatedly: with everything present it does nothing.
#
#   tools/setup.sh          the build: g++, CMake, the libraries
#   tools/setup.sh check    also Clang and its compiler runtime (ASan, UBSan, libFuzzer), for the
#                           test suite's build (cmake --preset check; README "Two commands")
set -euo pipefail
if [[ $# -gt 1 || ( $# -eq 1 && $1 != check ) ]]; then
  echo "usage: $0 [check]" >&2
  exit 2
fi
# python3: for the ctests Layering.* (tests/check_layering.py) and CudaEmu.Kernels (extract.py).
pkgs=(cmake g++ make libeigen3-dev libgtest-dev libgmock-dev librandom123-dev libcli11-dev nlohmann-json3-dev zlib1g-dev openmpi-bin libopenmpi-dev python3)
if [[ ${1:-} == check ]]; then
  # The runtime's package is named for Clang's major version (Debian 12: libclang-rt-14-dev); older
  # releases ship it inside libclang-common-N-dev, which clang already depends on.
  pkgs+=(clang)
  clang_major=$(apt-cache depends clang 2>/dev/null | sed -n 's/.*Depends: clang-\([0-9][0-9]*\)$/\1/p' | head -n 1)
  if [[ -n $clang_major ]] && apt-cache show "libclang-rt-$clang_major-dev" >/dev/null 2>&1; then
    pkgs+=("libclang-rt-$clang_major-dev")
  fi
fi
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
