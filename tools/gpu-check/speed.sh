# gpu-check step 3 (sourced by tools/gpu-check.sh --run / --rehearsal, after steps 1 and 2, with
# its helpers step, record and write_results): ditto's speed beside PyTorch's on the same GPU.
# shellcheck shell=bash
# ---- 3. speed beside PyTorch -------------------------------------------------------------------
# Configurations: name, ditto-train options, dtype, B x T. char-tf32 runs ditto's fast mode with
# --allow-tf32 (bitwise mode never uses TF32: n/a); gpt2-f32 is the strict-f32 baseline of the
# bitwise goal (issue 29: bitwise >= 0.5x PyTorch strict f32 on both models), so ditto runs it in
# bitwise mode only.
char_opts=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64)
gpt2_opts=(--preset gpt2 --batch-size 8)
speed_configs=(char-f32 char-tf32 char-bf16 gpt2-f32 gpt2-bf16)
torch_steps=20
[ $quick -eq 1 ] && torch_steps=1
declare -A sp  # sp[config:column] = value
speed_opts() {  # the ditto-train options of a configuration
  case "$1" in
    char-f32) echo "${char_opts[*]} --dtype f32" ;;
    char-tf32) echo "${char_opts[*]} --dtype f32 --allow-tf32" ;;
    char-bf16) echo "${char_opts[*]} --dtype bf16" ;;
    gpt2-f32) echo "${gpt2_opts[*]} --dtype f32" ;;
    gpt2-bf16) echo "${gpt2_opts[*]} --dtype bf16" ;;
  esac
}
speed_modes() {  # the determinism modes ditto runs a configuration in
  case "$1" in
    char-tf32) echo fast ;;
    gpt2-f32) echo bitwise ;;
    *) echo fast bitwise ;;
  esac
}
ratio_of() {  # a / b with two decimals when both are numbers, else empty
  if [[ "$1" =~ ^[0-9.]+$ && "$2" =~ ^[0-9.]+$ ]]; then
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b }'
  fi
}
write_speed() {
  {
    echo "## Speed: tokens/s on the GPT of ditto-train --model gpt, one GPU"
    echo
    echo "PyTorch: bench/torch_gpu_bench.py (eager, F.scaled_dot_product_attention, fused AdamW),"
    echo "B x T / the median step time of $torch_steps steps after 5 of warm-up." \
         "ditto: ditto-train --backend cuda --devices 1: B x T / the median step time of its" \
         "$speed_steps steps after $speed_warmup of warm-up (its 'iter N: ... time' lines). Dry run: ditto-train" \
         "--backend sim --dry-run --profile $dry_note (the cost model's prediction, not a run)."
    echo "Issue 29's goals: fast / PyTorch >= 0.9 (gpt2-bf16), >= 1.0 (char-f32, char-bf16);"
    echo "bitwise / PyTorch strict f32 >= 0.5 (char-f32, gpt2-f32); dry run / measured within 0.75-1.25."
    echo
    echo "| config | B x T | PyTorch | ditto fast | ditto bitwise | dry run fast | dry run bitwise |" \
         "fast / PyTorch | bitwise / PyTorch f32 | dry / measured fast | dry / measured bitwise |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    local c bt f32
    for c in "${speed_configs[@]}"; do
      case "$c" in char-*) bt="64 x 256"; f32=char-f32 ;; *) bt="8 x 1024"; f32=gpt2-f32 ;; esac
      echo "| $c | $bt | ${sp[$c:torch]:-} | ${sp[$c:fast]:-} | ${sp[$c:bitwise]:-} |" \
           "${sp[$c:dry-fast]:-} | ${sp[$c:dry-bitwise]:-} |" \
           "$(ratio_of "${sp[$c:fast]:-}" "${sp[$c:torch]:-}") |" \
           "$(ratio_of "${sp[$c:bitwise]:-}" "${sp[$f32:torch]:-}") |" \
           "$(ratio_of "${sp[$c:dry-fast]:-}" "${sp[$c:fast]:-}") |" \
           "$(ratio_of "${sp[$c:dry-bitwise]:-}" "${sp[$c:bitwise]:-}") |"
    done
  } >"$out/logs/speed.md"
}
for c in "${speed_configs[@]}"; do
  case " $(speed_modes "$c") " in *" fast "*) ;; *) sp[$c:fast]="n/a"; sp[$c:dry-fast]="n/a" ;; esac
  case " $(speed_modes "$c") " in *" bitwise "*) ;; *) sp[$c:bitwise]="n/a"; sp[$c:dry-bitwise]="n/a" ;; esac
done
write_speed
# PyTorch first, all four configurations in one process (its start-up paid once).
if [ -z "$torch_py" ]; then
  record speed-torch host SKIPPED 0 "no python3 with torch here"
  for c in "${speed_configs[@]}"; do sp[$c:torch]="skipped: no torch"; done
elif [ $torch_cuda = no ]; then
  record speed-torch host SKIPPED 0 "$torch_py's torch sees no CUDA device"
  for c in "${speed_configs[@]}"; do sp[$c:torch]="skipped: torch without CUDA"; done
else
  step speed-torch host 150 "$torch_py" "$root/bench/torch_gpu_bench.py" --device cuda \
    --steps "$torch_steps" --warmup 5 \
    --json "$out/logs/torch.json" --markdown "$out/logs/torch.md"
  if [ -f "$out/logs/torch.json" ]; then
    while read -r c v; do sp[$c:torch]="$v"; done < <("$torch_py" -c '
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["config"], "%.0f" % r["tokens_per_s"] if "tokens_per_s" in r else "failed")' \
      "$out/logs/torch.json")
  fi
fi
write_speed
# ditto: the dry run's prediction, then the run, fast and bitwise. Tokens/s of the run: B x T /
# the median of its step times after the warm-up ('iter N: loss L, time Tms', every step logged),
# as PyTorch's column. (Before: the last evaluation line's tokens/s, which covered only the steps
# since the evaluation before it: evaluations come every --eval-interval steps, so 1 step of 10.)
speed_iters=$((speed_warmup + speed_steps))
tokens_per_step() { case "$1" in char-*) echo $((64 * 256)) ;; *) echo $((8 * 1024)) ;; esac; }
# median_tokens_per_s LOG TOKENS WARMUP: TOKENS / the median time of the iter lines >= WARMUP.
median_tokens_per_s() {
  grep -o '^iter [0-9]*: loss [^,]*, time [0-9.]*ms' "$1" 2>/dev/null |
    awk -v w="$3" '{ it = $2; sub(":", "", it); t = $6; sub("ms", "", t); if (it + 0 >= w) print t }' |
    sort -g | awk -v tok="$2" '{ a[n++] = $1 }
      END { if (n) { m = n % 2 ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2;
                     if (m > 0) printf "%.0f", tok / (m / 1000) } }'
}
for c in "${speed_configs[@]}"; do
  # shellcheck disable=SC2207  # the options are words
  opts=($(speed_opts "$c"))
  for det in $(speed_modes "$c"); do
    name="speed-dry-$c-$det"
    step "$name" host 30 "$train" --model gpt "${opts[@]}" --backend sim --devices 1 \
      --dry-run --profile "$dry_profile" --determinism "$det" --max-iters 2 --eval-iters 0 --sample 0
    v="$(grep -o 'predicted GPT: [0-9]* tokens/s' "$out/logs/$name.log" | awk '{print $3}')"
    sp[$c:dry-$det]="${v:-failed}"
    write_speed
    name="speed-ditto-$c-$det"
    step "$name" cuda 60 "$train" --model gpt "${opts[@]}" --backend cuda --devices 1 \
      --determinism "$det" --max-iters "$speed_iters" --eval-interval "$speed_iters" \
      --log-interval 1 --eval-iters 1 --warmup-iters 0 --lr-decay-iters $((speed_iters + 1)) \
      --sample 0
    v="$(median_tokens_per_s "$out/logs/$name.log" "$(tokens_per_step "$c")" "$speed_warmup")"
    if [ -n "$v" ] && grep -q '^final:' "$out/logs/$name.log"; then
      sp[$c:$det]="$v"
    elif grep -q 'no CUDA device' "$out/logs/$name.log"; then
      sp[$c:$det]="no CUDA device"
    elif [ $step_rc -eq 124 ] || [ $step_rc -eq 137 ]; then
      sp[$c:$det]="timed out (${step_limit} s)"
    else
      sp[$c:$det]="failed (logs/$name.log)"
    fi
    write_speed
  done
done
