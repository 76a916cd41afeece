#!/usr/bin/env bash
# tools/fuzz/smoke.sh BUILD_DIR SECONDS [TARGET...]: run each libFuzzer target of a DITTO_FUZZ=ON
# build for SECONDS over its committed corpus (tools/fuzz/corpus/<name>/; new inputs go to a
# scratch folder, the committed corpus is not changed). Fails (exit 1) on the first crash,
# sanitizer report, hang (-timeout=10 s per input) or memory blow-up (-rss_limit_mb=2048), and
# leaves the input that did it in the scratch folder it names. Default targets: all six.
set -euo pipefail
if [[ $# -lt 2 || ! "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build=$1 seconds=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(csv safetensors checkpoint profile text_source token_source)
for t in "${targets[@]}"; do
  if [[ ! -x $build/bin/fuzz_$t ]]; then
    echo "smoke.sh: $build/bin/fuzz_$t: missing (configure with -DDITTO_FUZZ=ON and build it)" >&2
    exit 1
  fi
  if [[ ! -d $here/corpus/$t ]]; then
    echo "smoke.sh: $here/corpus/$t: missing seed corpus" >&2
    exit 1
  fi
done
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ditto-fuzz-smoke.XXXXXX")
status=0
for t in "${targets[@]}"; do
  bin=$build/bin/fuzz_$t
  corpus=$here/corpus/$t
  dict=()
  [[ -f $here/$t.dict ]] && dict=(-dict="$here/$t.dict")
  mkdir -p "$scratch/$t/new" "$scratch/$t/artifacts"
  log=$scratch/$t/log
  echo "smoke.sh: fuzz_$t for ${seconds}s over $corpus"
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin" -max_total_time="$seconds" -timeout=10 \
       -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$scratch/$t/artifacts/" \
       "${dict[@]}" "$scratch/$t/new" "$corpus" >"$log" 2>&1; then
    grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec)' "$log" || true
  else
    status=1
    tail -n 40 "$log"
    echo "smoke.sh: fuzz_$t FAILED; input and log in $scratch/$t/" >&2
  fi
done
if [[ $status -eq 0 ]]; then
  rm -rf "$scratch"
  echo "smoke.sh: all ${#targets[@]} targets ran ${seconds}s each without a finding"
fi
exit $status
