#!/bin/sh
# ctest TorchGpuBench.CpuSmoke: bench/torch_gpu_bench.py --device cpu --tiny runs its four
# configurations and writes them as JSON and markdown. Exit 77 (ctest: skipped) with the reason
# where /usr/bin/python3 has no torch (Debian: python3-torch).
#   torch_gpu_bench_smoke.sh BENCH_SCRIPT WORK_DIR
set -u
py=/usr/bin/python3
bench="$1" work="$2"
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "skipped: $py cannot import torch (Debian: apt-get install python3-torch)"
  exit 77
fi
mkdir -p "$work" && rm -f "$work/torch.json" "$work/torch.md"
"$py" "$bench" --device cpu --tiny --steps 2 --warmup 1 --json "$work/torch.json" \
  --markdown "$work/torch.md" || { echo "torch_gpu_bench.py failed"; exit 1; }
"$py" - "$work/torch.json" "$work/torch.md" <<'PY' || exit 1
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
names = [r["config"] for r in rows]
assert names == ["char-f32", "char-tf32", "char-bf16", "gpt2-f32", "gpt2-bf16"], names
for r in rows:
    want = r["batch_size"] * r["block_size"] / (r["step_ms_median"] / 1e3)
    assert r["tokens_per_s"] > 0 and abs(r["tokens_per_s"] - want) <= 1e-9 * want, r
    assert r["precision"] == r["config"].split("-")[1], r
md = open(sys.argv[2]).read()
assert "| config | precision | B | T | params | step ms (median) | tokens/s | note |" in md, md
print("ok: 4 rows,", ", ".join(f"{r['config']} {r['tokens_per_s']:.0f} tokens/s" for r in rows))
PY
