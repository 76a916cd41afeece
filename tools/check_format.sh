#!/usr/bin/env bash
# ctest Format.ChangedFiles: the C++ files (not CUDA's .cu / .cuh, below) changed since the commit that added
# .clang-format are formatted by it (clang-format --dry-run --Werror). The tree older than that is
# not reformatted at once: a file is formatted when it is changed (Note [Format check]).
#
#   tools/check_format.sh          check; exit 1 naming each file that is not formatted
#   tools/check_format.sh --fix    format those files in place (clang-format -i)
#
# Exits 77 (ctest's skip) saying why when clang-format or git is missing, or outside a git
# checkout (a tarball): there is no "changed since" to check. CLANG_FORMAT names the program.
#
# Note [Format check]: the files are those `git diff BASE` names (committed since BASE, staged or
# not yet staged) plus untracked ones not ignored, where BASE is the first commit that added
# .clang-format; deleted files are left out. Whole files are checked, not only the changed lines,
# so a file once touched stays formatted.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
if [[ $# -eq 1 && $1 == --fix ]]; then
  fix=1
elif [[ $# -ne 0 ]]; then
  echo "usage: $0 [--fix]" >&2
  exit 2
fi
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "SKIP: $cf not found (tools/setup.sh check installs clang-format)"
  exit 77
fi
if ! command -v git >/dev/null 2>&1 || ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "SKIP: not a git checkout (or no git): no changed files to tell"
  exit 77
fi
base=$(git log --diff-filter=A --format=%H -- .clang-format | tail -n 1)
if [[ -z $base ]]; then
  echo "SKIP: .clang-format is not committed yet: no base commit to diff against"
  exit 77
fi
# CUDA sources (.cu, .cuh) are left out: clang-format 14 breaks a templated launch
# (`kernel<4><<<grid, block>>>(...)`) across lines, which tools/cuda_emu's extraction of the
# kernels (extract.py) then cannot read, and nvcc-only syntax is not what clang-format parses.
pattern='\.(c|cc|cpp|cxx|h|hh|hpp)$'
mapfile -t files < <({ git diff --name-only --diff-filter=ACMR "$base" --
                       git ls-files --others --exclude-standard; } | grep -E "$pattern" | sort -u)
if [[ ${#files[@]} -eq 0 ]]; then
  echo "PASS: no C++ file changed since ${base:0:7} (.clang-format added)"
  exit 0
fi
present=()
for f in "${files[@]}"; do
  if [[ -f $f ]]; then present+=("$f"); fi
done
# One clang-format for all the files: it checks each of them and names every one that differs
# (FILE:LINE:COL: error: code should be clang-formatted), where a process per file spent most of
# the test's time starting clang-format (14 s of CI's ctest for about 300 files). A failure that
# names no file (a bad .clang-format, say) falls back to a run per file, as before.
bad=()
if [[ ${#present[@]} -gt 0 ]] && ! report=$("$cf" --dry-run --Werror "${present[@]}" 2>&1); then
  declare -A named=()
  while IFS= read -r f; do
    named[$f]=1
  done < <(sed -n 's/^\(.*\):[0-9][0-9]*:[0-9][0-9]*: error: .*\[-Wclang-format-violations\]$/\1/p' \
             <<<"$report")
  for f in "${present[@]}"; do
    if [[ ${#named[@]} -eq 0 ]]; then
      "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    elif [[ -n ${named[$f]:-} ]]; then
      bad+=("$f")
    fi
  done
fi
if [[ ${#bad[@]} -eq 0 ]]; then
  echo "PASS: ${#files[@]} C++ file(s) changed since ${base:0:7} are formatted ($("$cf" --version))"
  exit 0
fi
if [[ $fix -eq 1 ]]; then
  "$cf" -i "${bad[@]}"
  printf 'formatted: %s\n' "${bad[@]}"
  exit 0
fi
echo "FAIL: ${#bad[@]} of ${#files[@]} C++/CUDA file(s) changed since ${base:0:7} are not formatted" \
     "by .clang-format; run tools/check_format.sh --fix (clang-format -i FILE):"
for f in "${bad[@]}"; do
  report=$("$cf" --dry-run "$f" 2>&1 || true)
  echo "  $f: $(grep -c 'warning:' <<<"$report" || true) place(s) differ, the first:"
  sed -n '1,3s/^/    /p' <<<"$report"
done
exit 1
