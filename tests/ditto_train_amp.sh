#!/usr/bin/env bash
# ditto-train --dtype bf16 / f16 end to end (registered in tests/cmake/train_gpt.cmake), on the tiny GPT of
# ditto_train_gpt.sh over the bundled shakespeare.txt (10 iterations), bitwise mode:
#   1. bf16: one params_checksum for --devices 1, 2, 8 x --trainer dp, ddp (and 4 ddp ranks with
#      micro-steps below; AmpTrainer.* covers every count in-process); it differs from the f32
#      run's (the parameters are stored in bf16: 2 bytes an element are hashed);
#   2. f16: the same, and the GradScaler's line (scale and skipped steps) is printed; both also
#      with --grad-accum-steps 2 on 4 ddp ranks; fast mode bf16 (bf16 all_reduce) within 0.01 of
#      f32's validation loss;
#   3. a bf16 run that dies at step 7 resumes from its checkpoint of step 4 (f32 master weights in
#      optimizer.safetensors) to the uninterrupted checksum; an f32 run does not resume from it;
#   (each run samples 16 characters: generation from bf16 / f16 logits)
#   4. a bad --dtype ends the run at startup naming the option.
# Usage: ditto_train_amp.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail, checksum
tiny=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8
      --max-iters 10 --eval-interval 5 --eval-iters 2 --warmup-iters 2 --lr-decay-iters 10
      --sample 16)

F=$("$train" "${tiny[@]}" --devices 1 | checksum)
[ -n "$F" ] || fail "no f32 checksum"
for dt in bf16 f16; do
  out=$("$train" "${tiny[@]}" --dtype $dt --devices 1) || fail "--dtype $dt: $out"
  U=$(echo "$out" | checksum)
  [ -n "$U" ] && [ "$U" != "$F" ] || fail "--dtype $dt: checksum '$U' (f32: $F)"
  echo "$out" | grep -q "^final: .* dtype=$dt " || fail "--dtype $dt: no dtype on the final line: $out"
  echo "$out" | grep -q '^step 10: train loss [0-9.]*, val loss [0-9.]*' || fail "--dtype $dt: no step 10: $out"
  echo "$out" | grep -q '^sample (' || fail "--dtype $dt: no sample: $out"
  if [ $dt = f16 ]; then
    echo "$out" | grep -Eq '^grad_scaler: scale=[0-9.e+]+ skipped_steps=[0-9]+ ' || fail "no grad_scaler line: $out"
  else
    echo "$out" | grep -q '^grad_scaler:' && fail "bf16 printed a grad_scaler line: $out"
  fi
  for n in 2 8; do
    for t in dp ddp; do
      out=$("$train" "${tiny[@]}" --dtype $dt --devices $n --trainer $t) || fail "--dtype $dt --devices $n --trainer $t: $out"
      [ "$(echo "$out" | checksum)" = "$U" ] || fail "--dtype $dt --devices $n --trainer $t: $(echo "$out" | checksum) != $U"
    done
  done
  out=$("$train" "${tiny[@]}" --dtype $dt --devices 4 --trainer ddp --grad-accum-steps 2) || fail "--grad-accum-steps 2: $out"
  [ "$(echo "$out" | checksum)" = "$U" ] || fail "--dtype $dt --grad-accum-steps 2: $(echo "$out" | checksum) != $U"
  echo "--dtype $dt: one checksum $U for 1 device, 2 and 8 devices x dp, ddp and 2 micro-steps on 4 (f32: $F)"
done
# Fast mode: DDP all-reduces bf16 gradients (Note [DDP gradient dtype]); the loss stays near f32's.
vf=$("$train" "${tiny[@]}" --devices 2 --trainer ddp --determinism fast | grep -o 'val_loss=[0-9.]*' | cut -d= -f2)
vb=$("$train" "${tiny[@]}" --dtype bf16 --devices 2 --trainer ddp --determinism fast | grep -o 'val_loss=[0-9.]*' | cut -d= -f2)
awk -v a="$vf" -v b="$vb" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d < 0.01) }' ||
  fail "fast bf16 val_loss $vb vs f32 $vf"
echo "fast mode, 2 ddp ranks: val_loss f32 $vf, bf16 $vb"

U=$("$train" "${tiny[@]}" --dtype bf16 --devices 1 | checksum)
"$train" "${tiny[@]}" --dtype bf16 --devices 4 --trainer ddp --checkpoint "$work/a" \
  --checkpoint-every 4 --fault fail:device=1,step=7 > "$work/a.out" 2>&1 &&
  fail "the run with a failing device succeeded"
[ -f "$work/a/step-00000004/optimizer.safetensors" ] || fail "no checkpoint at step 4: $(ls "$work/a")"
grep -aq '"master.0"' "$work/a/step-00000004/optimizer.safetensors" || fail "no master weights in the checkpoint"
grep -aq '"BF16"' "$work/a/step-00000004/model.safetensors" || fail "the model is not stored in bf16"
out=$("$train" "${tiny[@]}" --dtype bf16 --devices 2 --resume "$work/a") || fail "resume: $out"
echo "$out" | grep -q "resumed from $work/a at step 4" || fail "not resumed at step 4: $out"
R=$(echo "$out" | checksum)
[ "$R" = "$U" ] || fail "resumed $R != uninterrupted $U"
echo "bf16 resumed from step 4: $R"
"$train" "${tiny[@]}" --resume "$work/a" > /dev/null 2> "$work/err" && fail "an f32 run resumed a bf16 checkpoint"
grep -q "ditto-train: error: resume: .*dtype" "$work/err" || fail "f32 resume: $(cat "$work/err")"

"$train" "${tiny[@]}" --dtype f64 > /dev/null 2> "$work/err" && fail "--dtype f64 ran"
grep -q "^ditto-train: error: --dtype: expected f32, bf16 or f16 (or nanoGPT's float32, bfloat16, float16), got 'f64'" "$work/err" || fail "$(cat "$work/err")"
rm -rf "$work"
echo PASS
