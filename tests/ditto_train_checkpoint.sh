#!/usr/bin/env bash
# ditto-train checkpoints end to end (registered in tests/cmake/train_outputs.cmake):
#   1. --epochs 2 --checkpoint A, then --resume A --epochs 4: the checksum of an uninterrupted
#      --epochs 4 run;
#   2. a run SIGKILLed while writing its 5th checkpoint (DITTO_TEST_KILL_IN_CHECKPOINT, Note [Crash
#      test] in core/checkpoint/checkpoint.cpp) leaves the 4th (mid-epoch, step 28) as latest and no
#      step-35; resuming from it gives the same checksum again;
#   3. a truncated newest checkpoint: --resume says on stderr that it falls back to the previous
#      one (step 21), and still gets the same checksum;
#   4. --resume with another --hidden or --optimizer: a clear error naming what differs;
#   5.-7. issue 16: the resume of a finished run prints that run's final line; a refused resume
#      prints no "resumed from"; other data of the same shape is refused (data_fnv1a);
#   10. a fresh run into a directory holding another run's checkpoints is refused.
# Usage: ditto_train_checkpoint.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail, checksum

U=$("$train" --epochs 4 | checksum)
[ -n "$U" ] || fail "no checksum from the uninterrupted run"
echo "uninterrupted --epochs 4: $U"

"$train" --epochs 2 --checkpoint "$work/a" > "$work/a.out" || fail "--epochs 2 --checkpoint"
R=$("$train" --resume "$work/a" --epochs 4 | checksum)
echo "--epochs 2, then --resume --epochs 4: $R"
[ "$R" = "$U" ] || fail "resumed $R != uninterrupted $U"

# 23 batches per epoch; checkpoints at steps 7, 14, 21, 28; killed while writing step 35's.
DITTO_TEST_KILL_IN_CHECKPOINT=5 "$train" --epochs 4 --checkpoint "$work/b" --checkpoint-every 7 \
  > /dev/null 2>&1
rc=$?
[ "$rc" -eq 137 ] || fail "expected the run to die of SIGKILL (exit 137), got $rc"
[ "$(cat "$work/b/latest")" = "step-00000028" ] || fail "latest: $(cat "$work/b/latest")"
[ ! -e "$work/b/step-00000035" ] || fail "a partial step-00000035 exists under its final name"
[ -f "$work/b/step-00000021/model.safetensors" ] || fail "the previous checkpoint was not kept"
K=$("$train" --resume "$work/b" --epochs 4 | checksum)
echo "killed while writing step 35, resumed from step 28: $K"
[ "$K" = "$U" ] || fail "resumed after SIGKILL $K != uninterrupted $U"

truncate -s -1 "$work/b/step-00000028/model.safetensors"
F=$("$train" --resume "$work/b" --epochs 4 2> "$work/stderr" | checksum)
grep -q "step-00000028' is unusable: .*model.safetensors" "$work/stderr" || fail "$(cat "$work/stderr")"
grep -q "falling back to '$work/b/step-00000021'" "$work/stderr" || fail "$(cat "$work/stderr")"
echo "step 28 truncated, fell back to step 21: $F"
[ "$F" = "$U" ] || fail "after the fall-back $F != uninterrupted $U"

out=$("$train" --resume "$work/a" --epochs 4 --hidden 64 2>&1)
echo "$out" | grep -q "error: resume: checkpoint '.*' was saved with model=64-128-10, this run has model=64-64-10" \
  || fail "--hidden 64: $out"
out=$("$train" --resume "$work/a" --epochs 4 --optimizer adam 2>&1)
echo "$out" | grep -q "error: resume: checkpoint '.*' was saved with optimizer=sgd, this run has optimizer=adam" \
  || fail "--optimizer adam: $out"
out=$("$train" --resume "$work/a" --epochs 4 --lr 0.1 2>&1)
echo "$out" | grep -q "does not match this run's optimizer: --lr: checkpoint 0.05, this run 0.1$" \
  || fail "--lr 0.1: $out"
# 5. Resuming the finished --epochs 2 run: the final line of that run (train_time_s aside), not
#    train_loss=0 val_loss=0 val_acc=0.
final() { grep '^final:' | sed 's/ train_time_s=[^ ]*//'; }
A=$(final < "$work/a.out")
D=$("$train" --resume "$work/a" --epochs 2 | final)
echo "finished run resumed: $D"
[ -n "$A" ] && [ "$D" = "$A" ] || fail "resumed finished run: '$D', the run ended with '$A'"
# 6. A refused resume does not say "resumed from" first.
out=$("$train" --resume "$work/a" --epochs 1 2>&1)
echo "$out" | grep -q "error: --resume: the checkpoint is past the end of epoch 2" || fail "--epochs 1: $out"
echo "$out" | grep -q "resumed from" && fail "a refused resume printed 'resumed from': $out"
# 7. Other data of the same shape (one value changed): refused, naming both fingerprints.
data="$(dirname "$0")/../examples/data/digits.csv"  # the default --data
sed '5s/^\([^,]*\),/\1.5,/' "$data" > "$work/other.csv"
cmp -s "$data" "$work/other.csv" && fail "other.csv is the same file"
out=$("$train" --resume "$work/a" --epochs 4 --data "$work/other.csv" 2>&1)
echo "$out" | grep -q "error: resume: checkpoint '.*' was saved with data_fnv1a=[0-9a-f]\{16\}, this run has data_fnv1a=[0-9a-f]\{16\}" \
  || fail "other data: $out"
# 8. Issue 31: an f32 checkpoint resumed with --dtype bf16, and a bf16 one with f32: both values
#    named (an f32 run records no dtype: it said "dtype=(not recorded)" and "a setting this run
#    does not have").
out=$("$train" --resume "$work/a" --epochs 4 --dtype bf16 2>&1)
echo "$out" | grep -q "error: resume: checkpoint '.*' was saved with dtype=f32, this run has dtype=bf16" \
  || fail "f32 checkpoint, --dtype bf16: $out"
"$train" --epochs 1 --dtype bf16 --checkpoint "$work/bf16" > /dev/null || fail "--dtype bf16 --checkpoint"
out=$("$train" --resume "$work/bf16" --epochs 2 2>&1)
echo "$out" | grep -q "error: resume: checkpoint '.*' was saved with dtype=bf16, this run has dtype=f32" \
  || fail "bf16 checkpoint, --dtype f32: $out"
# 9. A file size limit (`ulimit -f 10`: 10 KiB, less than the model's 38 KB): the write fails with
#    EFBIG, reported naming the file, exit 1, and no step-N.tmp left behind (SIGXFSZ killed the
#    run with no message and left DIR/step-N.tmp/model.safetensors.tmp). It is the final
#    checkpoint: the final line comes first (Note [Checkpoint failures]).
(ulimit -f 10; exec "$train" --epochs 1 --checkpoint "$work/fsize") > "$work/fsize.out" 2>&1
rc=$?
[ $rc = 1 ] || fail "ulimit -f 10: expected exit status 1, got $rc: $(cat "$work/fsize.out")"
grep -q "^ditto-train: error: after training (the result above is complete): --checkpoint: the final checkpoint of step 23 was not written: .*cannot write '$work/fsize/step-00000023.tmp/\.model\.safetensors\.tmp\.[A-Za-z0-9]\{6\}': File too large" \
  "$work/fsize.out" || fail "ulimit -f 10: $(cat "$work/fsize.out")"
grep -q "^final: " "$work/fsize.out" || fail "ulimit -f 10: no final line: $(cat "$work/fsize.out")"
ls -d "$work"/fsize/step-* 2>/dev/null && fail "ulimit -f 10: left $(ls -d "$work"/fsize/step-*)"
# 10. A fresh run (no --resume) given a --checkpoint directory holding another run's checkpoints
#     mixed its own with them: refused before training, naming the directory, what it holds and
#     --resume; a directory holding other files is fine. A relative --checkpoint is named as typed.
(cd "$work" && "$train" --epochs 1 --checkpoint a) > "$work/fresh.out" 2>&1 \
  && fail "a fresh run over a's checkpoints was accepted: $(cat "$work/fresh.out")"
grep -q "^ditto-train: error: --checkpoint: expected a directory without checkpoints for a fresh run (no --resume), got 'a', which holds another run's (latest, step-00000046): the two runs' checkpoints would mix; to continue that run, pass --resume a; to start over, remove them or choose another directory" \
  "$work/fresh.out" || fail "fresh run over checkpoints: $(cat "$work/fresh.out")"
grep -q "^epoch" "$work/fresh.out" && fail "the refused run trained: $(cat "$work/fresh.out")"
mkdir -p "$work/notes" && echo "not a checkpoint" > "$work/notes/README"
"$train" --epochs 1 --checkpoint "$work/notes" > /dev/null || fail "a directory with other files"
[ -f "$work/notes/step-00000023/model.safetensors" ] || fail "no checkpoint beside other files"
echo "PASS"
