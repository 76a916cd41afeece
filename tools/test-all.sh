#!/usr/bin/env bash
# The whole test suite under GCC's sanitizers and in the Release build (docs/sanitizers.md), from
# the repository root: a second opinion beside CI's check build (Clang, `cmake --preset check`),
# about 24 min from a fresh clone on 2 cores. Two builds, every test run once:
#   build/       the normal build (CUDA backend when nvcc, the toolkit and NCCL are found): it must
#                compile and link everything; it runs only the tests that build-asan/ lacks (the
#                CUDA tests, which skip without a GPU).
#   build-asan/  ASan + UBSan, CPU only (-DDITTO_SANITIZE=address,undefined -DDITTO_WITH_CUDA=OFF):
#                runs every other test, so each of them also checks for memory errors, leaks and
#                undefined behaviour (docs/sanitizers.md).
# A test is in build/'s share when its name is not in build-asan/'s list (`ctest -N`), so a test
# added later runs in one of the two without editing this file. Both shares run even when the
# first fails; the exit status is 1 when any test failed. Extra arguments go to both ctest runs
# (e.g. -R DdpTest to narrow while developing).
set -euo pipefail
export LC_ALL=C  # one collation for sort and join
cd "$(dirname "$0")/.."
jobs="${DITTO_TEST_JOBS:-2}"
t0=$SECONDS

cmake -S . -B build
cmake --build build -j"$jobs"
cmake -S . -B build-asan -DDITTO_SANITIZE=address,undefined -DDITTO_WITH_CUDA=OFF
cmake --build build-asan -j"$jobs"
t_built=$SECONDS

# Test numbers of build/ whose names build-asan/ does not have, as ctest -I's file: "start,end,
# stride,n,n,...". The range is the first number alone (start = end): 0,0,0 would select every
# test, and a -R regex of 100+ names is past ctest's regex size. `ctest -N` lists "#NUMBER: NAME";
# a parameterized gtest's NAME goes on after a space ("  # GetParam() = ..."), so the first word
# is the name.
names() { ctest --test-dir "$1" -N | sed -n 's/^ *Test *#\([0-9]*\): \([^ ]*\).*$/\1 \2/p'; }
names build-asan | cut -d' ' -f2 | sort -u > build/tests-in-build-asan.txt
only_here=$(names build | sort -k2,2 | join -1 2 -2 1 -v 1 -o 1.1 - build/tests-in-build-asan.txt \
            | sort -n)

status=0
echo "tools/test-all.sh: build-asan/ (ASan + UBSan): $(wc -l < build/tests-in-build-asan.txt) tests"
ctest --test-dir build-asan -j"$jobs" --output-on-failure "$@" || status=1
t_asan=$SECONDS
if [ -n "$only_here" ]; then
  first=$(printf '%s\n' "$only_here" | head -n 1)
  echo "$first,$first,1,$(printf '%s\n' "$only_here" | paste -sd, -)" > build/tests-only-here.txt
  echo "tools/test-all.sh: build/: the $(printf '%s\n' "$only_here" | wc -l) tests build-asan/ lacks"
  ctest --test-dir build -j"$jobs" --output-on-failure -I build/tests-only-here.txt "$@" || status=1
fi
echo "tools/test-all.sh: builds $((t_built - t0)) s, build-asan/ tests $((t_asan - t_built)) s," \
     "build/ tests $((SECONDS - t_asan)) s, total $((SECONDS - t0)) s: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
