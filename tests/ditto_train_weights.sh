#!/usr/bin/env bash
# ditto-train --model gpt's weights in and out (issue 32; registered in tests/cmake/train_gpt.cmake), on
# tests/data/gpt2_tiny (tools/gpt2_fixtures.py) over the bundled shakespeare.txt:
#   1. --init-from the llm.c f32 file, the Hugging Face safetensors and (--devices 2 --trainer ddp)
#      the llm.c bf16 file, with --eval-only: each run evaluates once ("step 0: ..."), trains
#      nothing (iters=0) and prints the fixture's params_checksum (54a161db9f9f74c2: the FNV-1a
#      of its f32 parameters, tools/gpt2_fixtures.py's params_fnv1a_f32; the bf16 file's is that
#      of the rounded weights); llm.c f32 and HF give the same losses;
#   2. a flag that contradicts the file is refused naming both values (exit 2);
#   3. round trips: 3 training steps from the f32 file with --export llmc / hf, then --init-from
#      the exported file gives the training run's params_checksum; --export llmc-bf16 then
#      --init-from it with --dtype bf16 gives the checksum of --init-from the f32 export with
#      --dtype bf16 (the same rounding); the exported llm.c f32 file of the untrained model is the
#      fixture's own bytes;
#   4. --init-from a checkpoint directory of a run gives that run's checksum, and a fine-tune from
#      it trains; --eval-only writes no checkpoint and refuses --checkpoint; --resume DIR
#      --eval-only evaluates the checkpoint; ck/step-N/model.safetensors takes n_head from the
#      trainer.json beside it;
#   5. refused at the start (exit 2, before any training, so no run is lost at its end): an
#      --export target that is a FIFO, a read-only file (left as it was), in a directory that
#      takes no files (/proc; a 555 directory as the user nobody); --eval-only without
#      --init-from or --resume; --init-from ''; a model whose vocabulary is smaller than the
#      text's (naming --init-from, not --vocab-size); two
#      --export write both files and keep an existing file's mode; (exit 1, a file that cannot be
#      read) a config.json that is not JSON; a Hugging Face folder loads
#      its model.safetensors, another folder is refused without talking of 'latest'.
# Usage: ditto_train_weights.sh PATH/TO/ditto-train FIXTURE_DIR WORK_DIR
fixtures=$2
set -- "$1" "$3"
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail, checksum
F="$fixtures/model_f32.bin"
want=54a161db9f9f74c2
eval_only=(--model gpt --eval-only --eval-iters 2 --devices 1)

out=$("$train" "${eval_only[@]}" --init-from "$F") || fail "--init-from f32: $out"
echo "$out" | grep -q "^ditto-train: init_from=$F (llm.c model file (f32, version 3)): n_layer=2 n_head=4 (from the header) n_embd=32 block_size=64 vocab_size=512 bias=True$" ||
  fail "no init_from line: $out"
# nanoGPT's eval_only line: no learning rate of a run that trains nothing (session 56, B4).
echo "$out" | grep -q '^step 0: train loss [0-9.]*, val loss [0-9.]*$' || fail "no evaluation without lr: $out"
echo "$out" | grep -q "final: .* iters=0 train_loss=[0-9.]* val_loss=[0-9.]* .*params_checksum=$want$" ||
  fail "f32: expected iters=0 and params_checksum=$want: $out"
echo "$out" | grep -q '^sample' && fail "--eval-only sampled: $out"
L=$(echo "$out" | grep -o 'train_loss=.*val_loss=[0-9.]*')
out=$("$train" "${eval_only[@]}" --init-from "$fixtures/hf/model.safetensors") || fail "--init-from hf: $out"
echo "$out" | grep -q "(Hugging Face GPT-2 safetensors): n_layer=2 n_head=4 (from $fixtures/hf/config.json)" || fail "hf: $out"
[ "$(echo "$out" | checksum)" = $want ] || fail "hf: expected $want: $out"
[ "$(echo "$out" | grep -o 'train_loss=.*val_loss=[0-9.]*')" = "$L" ] || fail "hf: other losses than llm.c's $L: $out"
out=$("$train" --model gpt --eval-only --eval-iters 2 --devices 2 --trainer ddp \
      --init-from "$fixtures/model_bf16.bin") || fail "--init-from bf16: $out"
B=$(echo "$out" | checksum)
[ -n "$B" ] && [ "$B" != $want ] || fail "bf16: expected a checksum of the rounded weights: $out"
echo "--init-from llm.c f32, hf, llm.c bf16 (ddp) with --eval-only: $want, $want, $B ($L)"

out=$("$train" "${eval_only[@]}" --init-from "$F" --n-layer 4 2>&1) && fail "--n-layer 4 accepted: $out"
echo "$out" | grep -q "^ditto-train: error: --n-layer: expected the --init-from file's 2 ('$F', llm.c model file (f32, version 3)), got 4$" ||
  fail "--n-layer 4: $out"
out=$("$train" "${eval_only[@]}" --init-from "$F" --checkpoint "$work/no" 2>&1) && fail "--checkpoint accepted: $out"
echo "$out" | grep -q "expected none with --eval-only" || fail "--checkpoint with --eval-only: $out"
[ -e "$work/no" ] && fail "--eval-only made $work/no"
echo "--n-layer 4 and --checkpoint refused"

steps=(--model gpt --init-from "$F" --max-iters 3 --eval-iters 1 --eval-interval 3 --batch-size 4
       --warmup-iters 1 --lr-decay-iters 3 --sample 0 --devices 2)
T=$("$train" "${steps[@]}" --export llmc "$work/t.bin" | tee "$work/t.out" | checksum)
grep -q "^ditto-train: exported $work/t.bin (llm.c model file, f32 (version 3))$" "$work/t.out" || fail "no export line: $(cat "$work/t.out")"
[ -n "$T" ] && [ "$T" != $want ] || fail "3 steps: $(cat "$work/t.out")"
out=$("$train" "${steps[@]}" --trainer ddp --export hf "$work/t.safetensors") || fail "export hf: $out"
[ "$(echo "$out" | checksum)" = "$T" ] || fail "ddp export run: $out"
"$train" "${steps[@]}" --export llmc-bf16 "$work/t_bf16.bin" > /dev/null || fail "export llmc-bf16"
for f in t.bin t.safetensors; do
  out=$("$train" "${eval_only[@]}" --init-from "$work/$f") || fail "--init-from $f: $out"
  [ "$(echo "$out" | checksum)" = "$T" ] || fail "--init-from exported $f: expected $T: $out"
done
B1=$("$train" "${eval_only[@]}" --init-from "$work/t.bin" --dtype bf16 | checksum)
B2=$("$train" "${eval_only[@]}" --init-from "$work/t_bf16.bin" --dtype bf16 | checksum)
[ -n "$B1" ] && [ "$B1" = "$B2" ] || fail "bf16 export: $B1 != $B2"
"$train" "${eval_only[@]}" --init-from "$F" --eval-iters 0 --export llmc "$work/u.bin" > /dev/null || fail "export untrained"
cmp "$work/u.bin" "$F" || fail "the untrained export is not the fixture's bytes"
echo "export -> init-from: llmc and hf $T, llmc-bf16 $B1; the untrained llmc export is the fixture"

C=$("$train" "${steps[@]}" --checkpoint "$work/ck" | checksum)
[ "$C" = "$T" ] || fail "the checkpointed run: $C != $T"
out=$("$train" "${eval_only[@]}" --init-from "$work/ck") || fail "--init-from ck: $out"
echo "$out" | grep -q "(ditto checkpoint $work/ck/step-00000003): n_layer=2 n_head=4 (from the checkpoint)" || fail "ck: $out"
[ "$(echo "$out" | checksum)" = "$T" ] || fail "--init-from ck: expected $T: $out"
out=$("$train" "${steps[@]}" --eval-only --resume "$work/ck") || fail "--resume --eval-only: $out"
echo "$out" | grep -q "resumed from $work/ck at step 3" || fail "not resumed: $out"
echo "$out" | grep -q "final: .* iters=3 .*params_checksum=$T$" || fail "--resume --eval-only: $out"
[ "$(ls "$work/ck")" = "$(printf 'latest\nlock\nstep-00000003')" ] || fail "--eval-only wrote: $(ls "$work/ck")"
out=$("$train" "${steps[@]/#$F/$work/ck}") || fail "fine-tune from ck: $out"
[ "$(echo "$out" | checksum)" != "$T" ] || fail "the fine-tune did not train"
echo "--init-from ck: $T; --resume ck --eval-only: iters=3 $T"
out=$("$train" "${eval_only[@]}" --init-from "$work/ck/step-00000003/model.safetensors" 2>&1) ||
  fail "--init-from ck/step-N/model.safetensors: $out"
echo "$out" | grep -q "n_head=4 (from $work/ck/step-00000003/trainer.json)" || fail "step model: $out"
[ "$(echo "$out" | checksum)" = "$T" ] || fail "--init-from ck/step-N/model.safetensors: expected $T: $out"
echo "--init-from ck/step-N/model.safetensors: n_head from its trainer.json, $T"

# refused WHAT MESSAGE COMMAND...: expects exit 2 (a usage error; rc=1 refused ...: a file that
# cannot be read) and MESSAGE (a fixed string) in the output; the run never starts.
refused() {
  local what=$1 msg=$2 want_rc=${rc:-2}
  shift 2
  local rc=0
  out=$(timeout 120 "$@" 2>&1) || rc=$?
  [ $rc = "$want_rc" ] || fail "$what: expected exit $want_rc at the start, got $rc: $out"
  echo "$out" | grep -qF -- "$msg" || fail "$what: expected '$msg': $out"
  echo "$out" | grep -q '^step 0' && fail "$what: evaluated before refusing: $out"
  echo "$out" | grep -q 'n_head_hint' && fail "$what: an internal name: $out"
  return 0
}
mkfifo "$work/fifo.bin"
refused "--export onto a FIFO" "--export llmc: expected a regular file (or none: it is created), got '$work/fifo.bin', a FIFO" \
  "$train" "${eval_only[@]}" --init-from "$F" --export llmc "$work/fifo.bin"
printf 'keep' > "$work/ro.bin"
chmod 444 "$work/ro.bin"
refused "--export onto a read-only file" "--export llmc: expected a file it may replace, got '$work/ro.bin': Permission denied / read-only: remove it or chmod u+w" \
  "$train" "${eval_only[@]}" --init-from "$F" --export llmc "$work/ro.bin"
[ "$(cat "$work/ro.bin")" = keep ] || fail "the read-only file was replaced"
if [ -d /proc/self ]; then
  refused "--export under /proc" "--export hf: expected a file in a directory it may write, got '/proc/m.bin'" \
    "$train" "${eval_only[@]}" --init-from "$F" --export hf /proc/m.bin
fi
mkdir -m 555 "$work/ro"
if [ "$(id -u)" != 0 ]; then
  refused "--export in a 555 directory" "--export llmc: expected a file in a directory it may write, got '$work/ro/m.bin'" \
    "$train" "${eval_only[@]}" --init-from "$F" --export llmc "$work/ro/m.bin"
elif command -v runuser > /dev/null && runuser -u nobody -- test -x "$train" -a -r "$F" 2> /dev/null; then
  refused "--export in a 555 directory (as nobody)" "--export llmc: expected a file in a directory it may write, got '$work/ro/m.bin' (directory '$work/ro': Permission denied)" \
    runuser -u nobody -- "$train" "${eval_only[@]}" --init-from "$F" --export llmc "$work/ro/m.bin"
else
  echo "skipped: --export in a 555 directory (running as root, and runuser -u nobody cannot run $train)"
fi
refused "--eval-only alone" "--eval-only: expected a model to evaluate, --init-from FILE or --resume DIR, got neither" \
  "$train" "${eval_only[@]}"
refused "--init-from ''" "--init-from: expected a model file or a checkpoint directory, got ''" \
  "$train" "${eval_only[@]}" --init-from ''
refused "--export twice to one file" "--export: expected a different file for each --export, got '$work/a.bin' twice" \
  "$train" "${eval_only[@]}" --init-from "$F" --export llmc "$work/a.bin" --export hf "$work/a.bin"
mkdir "$work/badcfg"
cp "$fixtures/hf/model.safetensors" "$work/badcfg/"
printf '{"n_head": 4,' > "$work/badcfg/config.json"
rc=1 refused "a malformed config.json" "--init-from: io::load_gpt_weights: '$work/badcfg/config.json' (the config.json beside '$work/badcfg/model.safetensors'): could not be parsed as JSON" \
  "$train" "${eval_only[@]}" --init-from "$work/badcfg/model.safetensors"
mkdir "$work/empty"
rc=1 refused "an empty folder" "got a folder with neither: pass the model file itself (DIR/model.safetensors" \
  "$train" "${eval_only[@]}" --init-from "$work/empty"
echo "$out" | grep -q "missing or damaged" && fail "an empty folder: talks of a checkpoint's latest: $out"
head -c 3000 "$fixtures/../../../examples/data/shakespeare.txt" | tr 'A-Z' 'a-z' | tr -cd 'a-z \n' > "$work/small.txt"
"$train" --model gpt --data "$work/small.txt" --n-layer 1 --n-head 1 --n-embd 8 --block-size 8 --bias \
  --max-iters 1 --eval-iters 0 --sample 0 --devices 1 --export llmc "$work/small.bin" > /dev/null || fail "small model"
V=$(od -An -t d4 -j 12 -N 4 "$work/small.bin" | tr -d ' ')
refused "a model's vocabulary smaller than the text's" "--init-from '$work/small.bin' (llm.c model file" \
  "$train" "${eval_only[@]}" --init-from "$work/small.bin"
echo "$out" | grep -qF "expected a vocab_size of at least the text's vocabulary of" || fail "vocab: $out"
echo "$out" | grep -qE "got $V\$" || fail "vocab: $out"
echo "refused at the start: a FIFO, a read-only file, /proc, a 555 directory, --eval-only alone, --init-from '', one file twice, a bad config.json, an empty folder, vocab $V"

printf 'x' > "$work/mode.bin"
chmod 600 "$work/mode.bin"
out=$("$train" "${eval_only[@]}" --init-from "$F" --eval-iters 0 --export llmc "$work/mode.bin" \
      --export hf "$work/two.safetensors") || fail "two --export: $out"
cmp "$work/mode.bin" "$F" || fail "two --export: the llmc file is not the fixture's bytes"
[ "$(stat -c %a "$work/mode.bin")" = 600 ] || fail "the replaced file's mode: $(stat -c %a "$work/mode.bin")"
[ "$(echo "$out" | grep -c '^ditto-train: exported ')" = 2 ] || fail "two --export: $out"
out=$("$train" "${eval_only[@]}" --init-from "$work/two.safetensors") || fail "--init-from two: $out"
[ "$(echo "$out" | checksum)" = $want ] || fail "the second --export: expected $want: $out"
out=$("$train" "${eval_only[@]}" --init-from "$fixtures/hf") || fail "--init-from a Hugging Face folder: $out"
echo "$out" | grep -q "(Hugging Face GPT-2 safetensors): n_layer=2 n_head=4 (from $fixtures/hf/config.json)" || fail "hf folder: $out"
[ "$(echo "$out" | checksum)" = $want ] || fail "hf folder: expected $want: $out"
echo "two --export wrote both (mode 600 kept); --init-from a Hugging Face folder: $want"
echo PASS
