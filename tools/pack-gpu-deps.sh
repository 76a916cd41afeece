#!/usr/bin/env bash
# Packs the header-only and source dependencies of ditto's build (Eigen, Random123, CLI11,
# GoogleTest sources) from this Debian machine's packages into one folder, for a machine with a
# GPU and no network (tools/gpu-check.sh --deps DIR). Writes third_party_carry/gpu-deps by default
# (git-ignored). Needs the packages tools/setup.sh installs.
#
#   tools/pack-gpu-deps.sh [OUT_DIR]
#
# Layout (an install prefix, so that -DCMAKE_PREFIX_PATH=DIR finds everything but GoogleTest):
#   DIR/include/eigen3/Eigen/...               Eigen 3.4 headers (or EIGEN3_INCLUDE_DIR)
#   DIR/share/eigen3/cmake/Eigen3Config.cmake  Eigen's relocatable CMake package (Eigen3_DIR)
#   DIR/include/Random123/philox.h ...         Random123 headers (or RANDOM123_INCLUDE_DIR)
#   DIR/include/CLI/CLI.hpp ...                CLI11 headers (or CLI11_INCLUDE_DIR)
#   DIR/share/cmake/CLI11/CLI11Config.cmake    CLI11's relocatable CMake package (CLI11_DIR)
#   DIR/include/nlohmann/json.hpp ...          nlohmann-json headers
#   DIR/share/cmake/nlohmann_json/...          its relocatable CMake package (nlohmann_json_DIR)
#   DIR/include/zlib.h, zconf.h, DIR/lib/libz.a  zlib, static (FindZLIB through the prefix path)
#   DIR/src/googletest/                        GoogleTest + GoogleMock sources (a CMake project);
#                                              gpu-check.sh builds and installs them first
#   DIR/VERSIONS.txt                           the Debian package versions they came from
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/third_party_carry/gpu-deps}"

need() {
  if [ ! -e "$1" ]; then
    echo "pack-gpu-deps: missing $1 ($2); run tools/setup.sh first" >&2
    exit 1
  fi
}
need /usr/include/eigen3/Eigen/Core "libeigen3-dev"
need /usr/share/eigen3/cmake/Eigen3Config.cmake "libeigen3-dev"
need /usr/include/Random123/philox.h "librandom123-dev"
need /usr/include/CLI/CLI.hpp "libcli11-dev"
need /usr/share/cmake/CLI11/CLI11Config.cmake "libcli11-dev"
need /usr/src/googletest/CMakeLists.txt "googletest (libgtest-dev)"
need /usr/include/nlohmann/json.hpp "nlohmann-json3-dev"
need /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake "nlohmann-json3-dev"
need /usr/include/zlib.h "zlib1g-dev"
libz_a=$(dpkg -L zlib1g-dev 2>/dev/null | grep '/libz\.a$' | head -n 1)
need "${libz_a:-/usr/lib/libz.a}" "zlib1g-dev"

tmp="$out.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include/eigen3" "$tmp/share/eigen3/cmake" "$tmp/share/cmake/CLI11" "$tmp/src" \
  "$tmp/share/cmake/nlohmann_json" "$tmp/lib"
# Eigen/ only: ditto uses nothing from unsupported/.
cp -a /usr/include/eigen3/Eigen /usr/include/eigen3/signature_of_eigen3_matrix_library \
  "$tmp/include/eigen3/"
cp -a /usr/share/eigen3/cmake/*.cmake "$tmp/share/eigen3/cmake/"
cp -a /usr/include/Random123 /usr/include/CLI "$tmp/include/"
cp -a /usr/share/cmake/CLI11/*.cmake "$tmp/share/cmake/CLI11/"
cp -a /usr/src/googletest "$tmp/src/googletest"
cp -a /usr/include/nlohmann /usr/include/zlib.h /usr/include/zconf.h "$tmp/include/"
cp -a /usr/share/cmake/nlohmann_json/*.cmake "$tmp/share/cmake/nlohmann_json/"
cp -a "$libz_a" "$tmp/lib/libz.a"
{
  echo "Packed by tools/pack-gpu-deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from:"
  for p in libeigen3-dev librandom123-dev libcli11-dev googletest libgtest-dev nlohmann-json3-dev zlib1g-dev; do
    dpkg-query -W -f='  ${Package} ${Version}\n' "$p" 2>/dev/null || echo "  $p (version unknown)"
  done
} >"$tmp/VERSIONS.txt"

rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$tmp" "$out"
trap - EXIT
echo "pack-gpu-deps: wrote $out ($(du -sh "$out" | cut -f1))"
