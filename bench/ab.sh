#!/usr/bin/env bash
# A/B of two ditto builds on the same machine in the same run: ditto-bench trainer (both models,
# 1 and 4 devices, fast and bitwise, dp and ddp) and 64 KiB collectives on 2 and 4 ranks, the two
# builds interleaved ROUNDS times, then a table of medians and new/old with each side's spread.
#   bench/ab.sh OLD_BUILD NEW_BUILD [OUT_DIR] [ROUNDS]     (e.g. a build of the previous commit)
set -euo pipefail
old=$1 new=$2 out=${3:-bench/results/ab} rounds=${4:-3}
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for side in old new; do
    b=$old; [ "$side" = new ] && b=$new
    "$b/bin/ditto-bench" trainer --models 784-1024-1024-10 10-5-2 --devices 1 4 --modes fast bitwise \
      --trainers dp ddp --train-seconds 1.0 > "$out/trainer-$side-$round.txt" 2>&1
    "$b/bin/ditto-bench" collectives --ranks 2 4 --ops broadcast all_gather all_reduce --place out \
      --min-bytes 65536 --max-bytes 65536 --coll-seconds 0.3 --max-iters 1000 \
      > "$out/coll-$side-$round.txt" 2>&1
  done
done
python3 - "$out" "$rounds" <<'PY'
import collections, re, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def coll(path):
    out, cur = {}, None
    for line in open(path):
        m = re.match(r'# (\w+)\s+backend=sim ranks=(\d+)', line)
        if m: cur = f'busbw {m.group(1)} {m.group(2)} ranks'; continue
        f = line.split()
        if cur and f and f[0] == '65536': out[cur] = float(f[4])
    return out
def trainer(path):
    return {'samples/s ' + ' '.join(f[0:5]): float(f[5]) for f in map(str.split, open(path))
            if len(f) >= 7 and f[1].isdigit()}
res = collections.defaultdict(lambda: {'old': [], 'new': []})
for side in ('old', 'new'):
    for r in range(1, rounds + 1):
        for parse, kind in ((coll, 'coll'), (trainer, 'trainer')):
            for k, v in parse(f'{d}/{kind}-{side}-{r}.txt').items(): res[k][side].append(v)
print(f"{'measure':52s} {'old':>10s} {'new':>10s} {'new/old':>8s}  spread old / new")
for k, v in res.items():
    if not v['old'] or not v['new']: continue
    o, n = statistics.median(v['old']), statistics.median(v['new'])
    spread = lambda xs, m: (max(xs) - min(xs)) / m * 100
    print(f"{k:52s} {o:10.2f} {n:10.2f} {n / o:8.3f}  {spread(v['old'], o):4.0f}% / {spread(v['new'], n):4.0f}%")
PY
