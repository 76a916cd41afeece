#!/usr/bin/env bash
# tools/gpu-check/speed.sh (gpu-check step 3) with a stand-in ditto-train whose cuda runs log
# every --log-interval steps ('iter N: loss L, time Tms'; 10 by default): warm-up steps of 1000 ms, timed steps of 100 ms with one
# of 700 ms, and evaluation lines whose tokens/s cover only the steps since the evaluation before
# (the last one, 999 tokens/s, a single step). ditto's tokens/s must be B x T / the median timed
# step (PyTorch's column's rule): 16384 / 0.1 s = 163840 for the char model, 81920 for GPT-2.
# Review 2 of issue 29: it was the last evaluation line's tokens/s, one step of ten.
# Usage: gpu_check_speed.sh PATH/TO/tools/gpu-check/speed.sh WORK_DIR
set -u
script=$1 work=$2
rm -rf "$work" && mkdir -p "$work/logs" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
cat > "$work/ditto-train" <<'FAKE'
#!/usr/bin/env bash
be=sim iters=0 log=10 prev=""  # ditto-train's --log-interval default for --model gpt: 10
for a in "$@"; do
  [ "$prev" = --backend ] && be=$a
  [ "$prev" = --max-iters ] && iters=$a
  [ "$prev" = --log-interval ] && log=$a
  prev=$a
done
if [ "$be" = sim ]; then echo "predicted GPT: 5000 tokens/s (16384 tokens per step)"; exit 0; fi
for ((i = 0; i < iters; ++i)); do
  t=100.00
  [ $i -lt 3 ] && t=1000.00
  [ $i -eq 5 ] && t=700.00
  [ $((i % log)) -eq 0 ] && echo "iter $i: loss 4.0000, time ${t}ms"
  [ $((i % 3)) -eq 2 ] && echo "step $((i + 1)): train loss 4.0, val loss 4.0 (lr 1e-04, 5555 tokens/s, ETA 0:00:00)"
done
echo "step $iters: train loss 4.0, val loss 4.0 (lr 1e-04, 999 tokens/s, ETA 0:00:00)"
echo "final: backend=cuda iters=$iters params_checksum=0123456789abcdef"
FAKE
chmod +x "$work/ditto-train"
{
  echo "out='$work'; train='$work/ditto-train'; quick=0; speed_steps=10; speed_warmup=3"
  echo 'torch_py=""; torch_cuda=no; step_rc=0; step_limit=60'
  echo 'record() { :; }; write_results() { :; }'
  echo 'step() { local name=$1; shift 3; "$@" > "$out/logs/$name.log" 2>&1; step_rc=$?; }'
  echo ". '$script'"
} > "$work/harness.sh"
bash "$work/harness.sh" > "$work/harness.out" 2>&1 || fail "speed.sh: $(cat "$work/harness.out")"
md="$work/logs/speed.md"
row() { grep "^| $1 |" "$md" | cut -d'|' -f"$2" | tr -d ' '; }
[ "$(row char-f32 5)" = 163840 ] || fail "char-f32 fast: '$(row char-f32 5)', not 163840: $(cat "$md")"
[ "$(row char-f32 6)" = 163840 ] || fail "char-f32 bitwise: '$(row char-f32 6)', not 163840"
[ "$(row gpt2-bf16 5)" = 81920 ] || fail "gpt2-bf16 fast: '$(row gpt2-bf16 5)', not 81920"
echo "PASS: char-f32 $(row char-f32 5), gpt2-bf16 $(row gpt2-bf16 5) tokens/s"
