#!/usr/bin/env bash
# Rewrites the #include lines of a program written against ditto's headers before issue 30's new
# folders (docs/migrating.md has the table): `#include "core/runtime/error.h"` becomes
# `#include "core/base/error.h"`, and so on. Only include lines change; a file already migrated is
# left as it is, so running it twice is harmless. Both spellings of an installed header are
# understood: "core/..." (P/include/ditto on the include path, as ditto::ditto sets it) and
# <ditto/core/...>.
#
# Usage: tools/migrate_includes.sh [--check] PATH...
#   PATH     C/C++/CUDA sources, or folders searched for them (*.h *.hh *.hpp *.hxx *.inl *.ipp
#            *.c *.cc *.cpp *.cxx *.cu *.cuh)
#   --check  change nothing; print the include lines that would change, exit 1 if there are any
#   tools/migrate_includes.sh --self-test   (run from a ditto checkout: every new path of the table
#            exists, and each old include of the table is rewritten to it)
set -euo pipefail

# old -> new, the table of the move (the same lines as the relayout that made it; the first line
# that matches wins):
#   old/            new/             every header under old/
#   dir/prefix*     dir2/prefix2*    every header of dir/ whose name starts with prefix, renamed
#   dir/*suffix*    dir2/            every header of dir/ whose name matches, same name
#   dir/file        dir2/file2       one header
MAPPING='
core/internal/ops_check.h       core/runtime/ops_check.h
core/internal/ops_mixed.h       core/runtime/ops_mixed.h
core/internal/backend_init.h    core/runtime/backend_init.h
core/internal/comm_checks.h     core/comm/comm_checks.h
core/internal/                  core/backend_api/
core/comm/rendezvous.cpp        core/backend_api/rendezvous.cpp
core/comm/collective_kind.h     core/runtime/collective_types.h
core/dist/                      core/distributed/
core/runtime/error.h            core/base/error.h
core/io/checkpoint*             core/checkpoint/checkpoint*
core/io/gpt_weights*            core/checkpoint/gpt_weights*
core/train/*_source.*           core/data/
backend_sim/sim_p2p*            backend_sim/sim_communicator_p2p*
backend_sim/sim_reduce*         backend_sim/sim_comm_kernels*
backend_cuda/cuda_gpt*          backend_cuda/cuda_kernels_gpt*
backend_cuda/cuda_dtype*        backend_cuda/cuda_kernels_dtype*
'

# One sed -E expression per line of the table, applied to #include lines only. \1 is the start
# of the line up to the opening quote or bracket and an optional "ditto/".
sed_program() {
  local old new lead='^([[:space:]]*#[[:space:]]*include[[:space:]]*["<](ditto/)?)'
  while read -r old new; do
    [[ -z "$old" ]] && continue
    local o="${old//./\\.}"
    case "$old" in
      */) echo "s|${lead}${o}|\\1${new}|" ;;
      *'*'*'*'*)  # dir/*suffix*: the pattern's stars match a file name's characters
        local dir="${old%/*}" pat="${old##*/}"
        pat="${pat//./\\.}"
        pat="${pat//\*/[A-Za-z0-9_]*}"
        echo "s|${lead}${dir}/(${pat})([\">])|\\1${new%/}/\\3\\4|" ;;
      *'*') echo "s|${lead}${o%\*}|\\1${new%\*}|" ;;
      *) echo "s|${lead}${o}([\">])|\\1${new}\\3|" ;;
    esac
  done <<<"$MAPPING"
}

SOURCE_NAMES=(-name '*.h' -o -name '*.hh' -o -name '*.hpp' -o -name '*.hxx' -o -name '*.inl'
              -o -name '*.ipp' -o -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.cxx'
              -o -name '*.cu' -o -name '*.cuh')

self_test() {
  local root tmp fail=0
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  local old new
  while read -r old new; do
    [[ -z "$old" || "$old" == *'*'* || "$old" == */ ]] && continue
    [[ "$new" == *.h ]] || continue
    if [[ ! -f "$root/$new" ]]; then
      echo "FAIL self-test: $old -> $new: no $new in $root"
      fail=1
      continue
    fi
    printf '#include "%s"\n#include <ditto/%s>\n' "$old" "$old" >"$tmp/a.cpp"
    "$0" "$tmp/a.cpp" >/dev/null
    if [[ "$(cat "$tmp/a.cpp")" != "$(printf '#include "%s"\n#include <ditto/%s>' "$new" "$new")" ]]; then
      echo "FAIL self-test: $old -> $new: got $(tr '\n' ' ' <"$tmp/a.cpp")"
      fail=1
    fi
  done <<<"$MAPPING"
  # The globbed lines, on headers of today's tree: each old spelling comes back as the file.
  local h
  for h in core/data/text_source.h core/data/token_source.h core/checkpoint/checkpoint.h \
           core/checkpoint/gpt_weights.h core/distributed/distributed.h \
           core/backend_api/rendezvous.h backend_sim/sim_communicator_p2p.h; do
    [[ -f "$root/$h" ]] || { echo "FAIL self-test: $h is not in $root"; fail=1; continue; }
  done
  printf '%s\n' '#include "core/train/text_source.h"' '#include "core/train/token_source.h"' \
    '#include "core/io/checkpoint.h"' '#include "core/io/gpt_weights.h"' \
    '#include "core/dist/distributed.h"' '#  include <ditto/core/internal/rendezvous.h>' \
    '#include "backend_sim/sim_p2p.h"' '#include "core/io/file.h"' \
    '#include "core/runtime/error.hpp"' '// core/runtime/error.h stays in a comment' >"$tmp/b.cpp"
  "$0" "$tmp/b.cpp" >/dev/null
  local want
  want="$(printf '%s\n' '#include "core/data/text_source.h"' '#include "core/data/token_source.h"' \
    '#include "core/checkpoint/checkpoint.h"' '#include "core/checkpoint/gpt_weights.h"' \
    '#include "core/distributed/distributed.h"' '#  include <ditto/core/backend_api/rendezvous.h>' \
    '#include "backend_sim/sim_communicator_p2p.h"' '#include "core/io/file.h"' \
    '#include "core/runtime/error.hpp"' '// core/runtime/error.h stays in a comment')"
  if [[ "$(cat "$tmp/b.cpp")" != "$want" ]]; then
    echo "FAIL self-test: globbed lines:"
    diff <(echo "$want") "$tmp/b.cpp" || true
    fail=1
  fi
  cp "$tmp/b.cpp" "$tmp/c.cpp"
  "$0" "$tmp/c.cpp" >/dev/null
  cmp -s "$tmp/b.cpp" "$tmp/c.cpp" || { echo "FAIL self-test: a second run changed the file"; fail=1; }
  if "$0" --check "$tmp/c.cpp" >/dev/null; then :; else
    echo "FAIL self-test: --check on a migrated file exited non-zero"; fail=1
  fi
  [[ $fail == 0 ]] && echo "PASS self-test: the table's new headers exist and every old include is rewritten once"
  return $fail
}

if [[ "${1:-}" == "--self-test" ]]; then
  self_test
  exit
fi
check=0
if [[ "${1:-}" == "--check" ]]; then
  check=1
  shift
fi
if [[ $# == 0 ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi

program="$(sed_program)"
changed=0
while IFS= read -r -d '' f; do
  if ! out="$(sed -E "$program" "$f")"; then
    echo "migrate_includes.sh: sed failed on $f" >&2
    exit 2
  fi
  # $(...) drops the file's trailing newlines; compare and write through the same path.
  if [[ "$out" != "$(cat "$f")" ]]; then
    changed=$((changed + 1))
    if [[ $check == 1 ]]; then
      diff --unchanged-line-format= --old-line-format="$f: - %L" --new-line-format="$f: + %L" \
        "$f" <(printf '%s\n' "$out") || true
    else
      sed -E -i "$program" "$f"
      echo "migrated $f"
    fi
  fi
done < <(for p in "$@"; do
           if [[ -d "$p" ]]; then find "$p" -type f \( "${SOURCE_NAMES[@]}" \) -print0
           elif [[ -f "$p" ]]; then printf '%s\0' "$p"
           else echo "migrate_includes.sh: no file or folder $p" >&2; exit 2; fi
         done)
if [[ $check == 1 && $changed -gt 0 ]]; then
  echo "migrate_includes.sh: $changed file(s) include headers by their old paths (docs/migrating.md)" >&2
  exit 1
fi
exit 0
