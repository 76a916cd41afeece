#!/usr/bin/env bash
# tools/measure_token_rss.sh BUILD_DIR [WORK_DIR] [GIB]: the memory of ditto-train --model gpt on
# llm.c shards (issue 32; Note [Mapped shards] in core/data/token_source.h). Run once by hand (it
# writes GIB, default 2, GiB of shards: too much for CI):
#   1. writes a GIB GiB llm.c shard set (8 train shards of uint16 tokens, and a val shard) and a
#      tiny one (3 x 100k tokens), tools/make_token_data.py;
#   2. trains the same GPT on each (/usr/bin/time -v) and prints both peak RSS figures and their
#      difference: the data's own cost, which must stay under 300 MiB (it fails otherwise);
#   3. evicts the big set from the page cache (posix_fadvise DONTNEED), runs a start (2 steps),
#      and counts the pages of the set in the page cache afterwards (fincore): a start that read
#      the data whole would leave all of them; it must leave under 1%.
# Exit 0 when both hold. WORK_DIR (default /tmp/ditto_token_rss) is removed at the end.
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [WORK_DIR] [GIB]}
work=${2:-/tmp/ditto_token_rss}
gib=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
train=$build/bin/ditto-train
[ -x "$train" ] || { echo "no $train" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
tokens=$((gib * 512 * 1024 * 1024))  # uint16: 2 bytes a token
echo "writing $gib GiB of llm.c shards ($tokens tokens) under $work/big"
python3 "$here/make_token_data.py" --format llmc --out "$work/big" --name big --shards 8 \
  --train-tokens "$tokens" --val-tokens 1000000 --vocab 50257 > /dev/null
python3 "$here/make_token_data.py" --format llmc --out "$work/tiny" --name tiny --shards 3 \
  --train-tokens 300000 --val-tokens 100000 --vocab 50257 > /dev/null
du -sh "$work/big" "$work/tiny"
args=(--model gpt --max-iters 20 --eval-interval 10 --eval-iters 4 --sample 0 --devices 2
      --trainer ddp --log-interval 0)
peak_kib() {  # peak_kib NAME DATA: runs, prints the run's lines, returns Maximum resident set size
  /usr/bin/time -v "$train" "${args[@]}" --data "$2" 2> "$work/$1.time" > "$work/$1.out"
  grep -E '^(ditto-train: data|final:)' "$work/$1.out" >&2
  grep 'Maximum resident set size' "$work/$1.time" | awk '{print $NF}'
}
small=$(peak_kib tiny "$work/tiny/tiny_train_*.bin")
big=$(peak_kib big "$work/big/big_train_*.bin")
diff_mib=$(( (big - small) / 1024 ))
echo "peak RSS: tiny shard set $((small / 1024)) MiB, $gib GiB shard set $((big / 1024)) MiB: the data cost $diff_mib MiB (limit 300)"
status=0
[ "$diff_mib" -lt 300 ] || { echo "FAIL: the $gib GiB set costs $diff_mib MiB >= 300 MiB" >&2; status=1; }

# A start does not read the data whole: evict, start (2 steps), count what came into the cache.
python3 - "$work"/big/*.bin <<'EOF'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
EOF
cached() { fincore --bytes --noheadings --output RES "$work"/big/*.bin | awk '{s += $1} END {print s + 0}'; }
before=$(cached)
"$train" "${args[@]}" --max-iters 2 --eval-iters 0 --data "$work/big/big_train_*.bin" > /dev/null
after=$(cached)
total=$(du -cb "$work"/big/*.bin | tail -1 | cut -f1)
echo "page cache of the $gib GiB set: $before bytes before a 2-step start, $after after (of $total: $(awk -v a="$after" -v t="$total" 'BEGIN {printf "%.4f", 100 * a / t}')%)"
[ "$((after * 100))" -lt "$total" ] || { echo "FAIL: the start brought $after of $total bytes in" >&2; status=1; }
rm -rf "$work"
[ "$status" = 0 ] && echo PASS
exit $status
