#!/usr/bin/env bash
# ditto-train --model gpt end to end (registered in tests/cmake/train_gpt.cmake), on a tiny GPT over the
# bundled shakespeare.txt (10 iterations), bitwise mode:
#   1. one params_checksum and one generated sample for --devices 1, 2, 4 x --trainer dp, ddp
#      (and one parameter count: ddp prints nanoGPT's formula, dp the model's own count);
#      evaluations at steps 0, 5 and 10, each with train and val loss (tokens/s and ETA after 0),
#      also as JSON lines (--metrics-jsonl);
#   2. a run that dies at step 7 resumes from its checkpoint of step 4 (on 2 devices, ddp) to the
#      uninterrupted checksum; the checkpoint has nanoGPT's names, lm_head.weight and the
#      vocabulary; a resume on another text (another vocabulary) is refused naming the setting;
#   3. --dropout 0.1: one checksum for 1 and 4 devices;
#   4. --grad-accum-steps 2 and 4: the checksum of 1 (dp and ddp).
# Usage: ditto_train_gpt.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail, checksum
tiny=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8
      --max-iters 10 --eval-interval 5 --eval-iters 2 --warmup-iters 2 --lr-decay-iters 10
      --sample 64)
sample() { sed -n '/^sample (/,/^final: /p' | sed '1d;$d'; }

U=$("$train" "${tiny[@]}" --devices 1 --metrics-jsonl "$work/m.jsonl" | tee "$work/u.out" | checksum)
[ -n "$U" ] || fail "no checksum: $(cat "$work/u.out")"
[ "$(grep -c '"event":"eval"' "$work/m.jsonl")" = 3 ] || fail "expected 3 eval lines: $(cat "$work/m.jsonl")"
grep '"event":"final"' "$work/m.jsonl" | grep -q "\"max_iters\":10,.*\"params_checksum\":\"$U\"" ||
  fail "final line: $(cat "$work/m.jsonl")"
grep -q '^step 0: train loss [0-9.]*, val loss [0-9.]* (lr ' "$work/u.out" || fail "no step 0 line: $(cat "$work/u.out")"
grep -Eq '^step 5: train loss [0-9.]+, val loss [0-9.]+ \(lr [0-9.e+-]+, [0-9]+ tokens/s, ETA [0-9]+:[0-9]{2}:[0-9]{2}\)$' "$work/u.out" ||
  fail "no step 5 line with tokens/s and ETA: $(cat "$work/u.out")"
grep -q '^step 10: ' "$work/u.out" || fail "no step 10 line"
grep -q 'final: .* iters=10 ' "$work/u.out" || fail "no final line with iters=10"
S=$(sample < "$work/u.out")
[ "${#S}" -ge 60 ] || fail "sample too short: '$S'"
P=$(grep -o ' params=[0-9]*' "$work/u.out")  # the model's count (dp)
for n in 1 2 4; do
  for t in dp ddp; do
    out=$("$train" "${tiny[@]}" --devices $n --trainer $t) || fail "--devices $n --trainer $t: $out"
    [ "$(echo "$out" | grep -o ' params=[0-9]*')" = "$P" ] || fail "--trainer $t: not$P: $out"
    [ "$(echo "$out" | checksum)" = "$U" ] || fail "--devices $n --trainer $t: $(echo "$out" | checksum) != $U"
    [ "$(echo "$out" | sample)" = "$S" ] || fail "--devices $n --trainer $t: another sample"
  done
done
echo "one checksum $U and one sample for 1, 2, 4 devices x dp, ddp"
# --grad-accum-steps K: K micro-steps of the batch, the same bits (Note [Gradient accumulation]).
for run in "1 dp 4" "2 ddp 2" "4 ddp 4"; do
  set -- $run
  out=$("$train" "${tiny[@]}" --devices $1 --trainer $2 --grad-accum-steps $3) || fail "--grad-accum-steps $3: $out"
  [ "$(echo "$out" | checksum)" = "$U" ] || fail "--devices $1 --trainer $2 --grad-accum-steps $3: $(echo "$out" | checksum) != $U"
done
echo "--grad-accum-steps 4, 2, 4 (1 dp, 2 ddp, 4 ddp devices): checksum $U"

"$train" "${tiny[@]}" --devices 4 --checkpoint "$work/a" --checkpoint-every 4 \
  --fault fail:device=1,step=7 > "$work/a.out" 2>&1 && fail "the run with a failing device succeeded"
[ -f "$work/a/step-00000004/model.safetensors" ] || fail "no checkpoint at step 4: $(ls "$work/a")"
for name in transformer.wte.weight transformer.wpe.weight transformer.h.1.attn.c_attn.weight \
            transformer.h.0.mlp.c_proj.weight transformer.ln_f.weight lm_head.weight; do
  grep -aq "\"$name\"" "$work/a/step-00000004/model.safetensors" || fail "no $name in the checkpoint"
done
grep -q '"vocab": "0a2021' "$work/a/step-00000004/trainer.json" || fail "no vocabulary: $(cat "$work/a/step-00000004/trainer.json")"
out=$("$train" "${tiny[@]}" --devices 2 --trainer ddp --resume "$work/a") || fail "resume: $out"
echo "$out" | grep -q "resumed from $work/a at step 4" || fail "not resumed at step 4: $out"
R=$(echo "$out" | checksum)
[ "$R" = "$U" ] || fail "resumed $R != uninterrupted $U"
echo "resumed from step 4: $R"
head -c 200000 "$(dirname "$0")/../examples/data/shakespeare.txt" > "$work/other.txt"
"$train" "${tiny[@]}" --data "$work/other.txt" --resume "$work/a" > /dev/null 2> "$work/err" &&
  fail "resumed on another text"
grep -q "ditto-train: error: resume: checkpoint '.*' does not match this run's model: vocab_size: checkpoint 78, this run 66$" "$work/err" ||
  fail "$(cat "$work/err")"
# Issue 31: a model option that differs is named as the option (it printed both model strings).
"$train" "${tiny[@]}" --dropout 0.1 --resume "$work/a" > /dev/null 2> "$work/err" &&
  fail "resumed with another --dropout"
grep -q "ditto-train: error: resume: checkpoint '.*' does not match this run's model: --dropout: checkpoint 0, this run 0.1$" "$work/err" ||
  fail "$(cat "$work/err")"

D1=$("$train" "${tiny[@]}" --dropout 0.1 --devices 1 | checksum)
D4=$("$train" "${tiny[@]}" --dropout 0.1 --devices 4 --trainer ddp | checksum)
[ -n "$D1" ] && [ "$D1" = "$D4" ] && [ "$D1" != "$U" ] || fail "--dropout 0.1: 1 device $D1, 4 devices $D4 (no dropout $U)"
echo "--dropout 0.1: $D1 on 1 and 4 devices"
rm -rf "$work"
echo PASS
