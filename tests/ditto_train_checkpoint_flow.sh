#!/usr/bin/env bash
# ditto-train's checkpoint flow when something goes wrong (tester4's report; registered in
# tests/cmake/train_outputs.cmake; Note [Checkpoint failures] in core/train/trainer.cpp):
#   1. the final checkpoint does not fit (`ulimit -f`, above the --export file's size, below the
#      optimizer state's): the final line, the sample and the --export file still come, then the
#      checkpoint's error, exit 1; no step-N.tmp and no temporary file left;
#   2. a periodic checkpoint (--checkpoint-every) that does not fit stops the run, exit 1, naming
#      the step and the newest checkpoint on disk (none);
#   3. --resume A --checkpoint B, B holding another run's checkpoints: refused before training,
#      naming both directories; B untouched;
#   4. --resume DIR/step-N resumes exactly that step: the checksum of an uninterrupted run;
#   5. unusable output paths are usage errors (exit 2) naming the flag, as --export's are:
#      --checkpoint, --trace, --metrics-jsonl, a missing --resume directory; --export, --trace
#      and --metrics-jsonl through a symbolic link into a missing directory (tester5);
#   6. SIGTERM (as Ctrl-C) while the sample is drawn (the final checkpoint written): no
#      checkpoint promised; the second exits 143 without saying a checkpoint was not written;
#   7. an --export that cannot be written (a file size limit under it) does not cost the
#      --export after it: that file is written, then the first one's error, exit 1 (tester5);
#   8. --checkpoint DIR/step-N (a checkpoint itself, not a directory to save in) is refused (exit 1) before
#      training, fresh or with --resume auto, and the step directory is left as it was (tester5:
#      the new run's latest, lock and step-N nested inside it).
# Usage: ditto_train_checkpoint_flow.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail, checksum

G=(--model gpt --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --max-iters 10
   --eval-interval 10 --eval-iters 1 --warmup-iters 2 --lr-decay-iters 10 --log-interval 0)

# 1. The final checkpoint fails; the result is kept.
(ulimit -f 40; exec "$train" "${G[@]}" --bias --sample 20 --checkpoint "$work/full" \
  --export llmc "$work/full.bin") > "$work/full.out" 2>&1
rc=$?
[ $rc = 1 ] || fail "final checkpoint too big: expected exit 1, got $rc: $(cat "$work/full.out")"
grep -q '^final: ' "$work/full.out" || fail "final checkpoint too big: no final line: $(cat "$work/full.out")"
grep -q '^sample (20 characters' "$work/full.out" || fail "final checkpoint too big: no sample: $(cat "$work/full.out")"
grep -q "^ditto-train: exported $work/full.bin" "$work/full.out" || fail "no export: $(cat "$work/full.out")"
[ -s "$work/full.bin" ] || fail "final checkpoint too big: $work/full.bin not written"
grep -q "^ditto-train: error: after training (the result above is complete): --checkpoint: the final checkpoint of step 10 was not written: io::write_file_replace: cannot write '$work/full/step-00000010.tmp/\.optimizer\.safetensors\.tmp\.[A-Za-z0-9]\{6\}': File too large; newest checkpoint on disk: none$" \
  "$work/full.out" || fail "final checkpoint too big: $(cat "$work/full.out")"
# The error comes after everything else on stdout (2>&1 into one file: the last line).
[ "$(tail -n 1 "$work/full.out" | cut -c1-24)" = "ditto-train: error: afte" ] ||
  fail "final checkpoint too big: the error is not last: $(cat "$work/full.out")"
[ -z "$(ls -A "$work/full" | grep -v '^lock$')" ] || fail "left in $work/full: $(ls -A "$work/full")"
[ -z "$(ls -A "$work" | grep '\.tmp\.')" ] || fail "left in $work: $(ls -A "$work")"

# 2. A periodic checkpoint fails: the run stops (as nanoGPT's torch.save error stops it).
(ulimit -f 30; exec "$train" "${G[@]}" --sample 0 --checkpoint "$work/every" \
  --checkpoint-every 5) > "$work/every.out" 2>&1
rc=$?
[ $rc = 1 ] || fail "periodic checkpoint too big: expected exit 1, got $rc: $(cat "$work/every.out")"
grep -q '^final: ' "$work/every.out" && fail "periodic checkpoint too big: the run went on: $(cat "$work/every.out")"
grep -q "^ditto-train: error: --checkpoint: the checkpoint of step 5 was not written: .*File too large; newest checkpoint on disk: none (the run stops, as nanoGPT's does when torch.save fails: free space and resume from it)$" \
  "$work/every.out" || fail "periodic checkpoint too big: $(cat "$work/every.out")"

# 3. --resume A --checkpoint B, B holding another run's checkpoints.
"$train" "${G[@]}" --sample 0 --checkpoint "$work/A" > /dev/null || fail "run A"
"$train" "${G[@]}" --sample 0 --seed 1 --max-iters 20 --lr-decay-iters 20 \
  --checkpoint "$work/B" > /dev/null || fail "run B"
"$train" "${G[@]}" --sample 0 --max-iters 20 --resume "$work/A" \
  --checkpoint "$work/B" > "$work/mix.out" 2>&1 && fail "--resume A --checkpoint B was accepted: $(cat "$work/mix.out")"
grep -q "^ditto-train: error: --checkpoint: expected a directory without checkpoints when resuming from another one (--resume '$work/A'), got '$work/B', which holds another run's (latest, step-00000020): the two runs' checkpoints would mix; to continue the run in '$work/B', pass --resume $work/B; to continue '$work/A' there, remove them or choose another directory$" \
  "$work/mix.out" || fail "--resume A --checkpoint B: $(cat "$work/mix.out")"
grep -q '^step \|^final' "$work/mix.out" && fail "the refused run trained: $(cat "$work/mix.out")"
[ "$(cat "$work/B/latest")" = step-00000020 ] || fail "B's latest changed: $(cat "$work/B/latest")"
# Resuming A into a new directory, or into A itself (also as A/step-N), is fine.
"$train" "${G[@]}" --sample 0 --max-iters 20 --resume "$work/A" \
  --checkpoint "$work/A2" > /dev/null || fail "--resume A --checkpoint A2 (a new directory)"
# A failed checkpoint in the new directory names A's as the newest on disk, not "none" (tester:
# "none" sent the user to start over).
(ulimit -f 30; exec "$train" "${G[@]}" --sample 0 --max-iters 20 --resume "$work/A" \
  --checkpoint "$work/A3" --checkpoint-every 15) > "$work/a3.out" 2>&1
rc=$?
[ $rc = 1 ] || fail "--resume A --checkpoint A3, too big: expected exit 1, got $rc: $(cat "$work/a3.out")"
grep -q "^ditto-train: error: --checkpoint: the checkpoint of step 15 was not written: .*File too large; newest checkpoint on disk: $work/A/step-00000010 (the checkpoint this run resumed from) (the run stops, " \
  "$work/a3.out" || fail "--resume A --checkpoint A3, too big: $(cat "$work/a3.out")"

# 4. --resume DIR/step-N: exactly that step (not DIR/latest), the uninterrupted run's checksum.
U=$("$train" "${G[@]}" --sample 0 --max-iters 20 --lr-decay-iters 20 | checksum)
"$train" "${G[@]}" --sample 0 --max-iters 15 --lr-decay-iters 20 --checkpoint "$work/S" \
  --checkpoint-every 5 > /dev/null || fail "run S"
[ "$(cat "$work/S/latest")" = step-00000015 ] || fail "S/latest: $(cat "$work/S/latest")"
out=$("$train" "${G[@]}" --sample 0 --max-iters 20 --lr-decay-iters 20 \
  --resume "$work/S/step-00000010" --checkpoint "$work/S" 2>&1) || fail "--resume S/step-10: $out"
echo "$out" | grep -q "^ditto-train: resumed from $work/S/step-00000010 at step 10" ||
  fail "--resume S/step-10 did not resume step 10: $out"
R=$(echo "$out" | checksum)
[ -n "$U" ] && [ "$R" = "$U" ] || fail "--resume S/step-10: checksum $R, uninterrupted $U"
[ "$(cat "$work/S/latest")" = step-00000020 ] || fail "S/latest after the resume: $(cat "$work/S/latest")"

# 5. Unusable output paths: exit 2 (usage), the flag named, nothing trained.
echo "a file" > "$work/file"
usage() {  # usage REGEX ARGS...: exit 2 and REGEX on stderr
  local re=$1
  shift
  "$train" "${G[@]}" --sample 0 "$@" > "$work/usage.out" 2>&1
  local rc=$?
  [ $rc = 2 ] || fail "$*: expected exit 2, got $rc: $(cat "$work/usage.out")"
  grep -q "$re" "$work/usage.out" || fail "$*: $(cat "$work/usage.out")"
}
usage "^ditto-train: error: --checkpoint: expected a directory it may create or write, got '$work/file/ck': cannot create directory '$work/file/ck': Not a directory$" \
  --checkpoint "$work/file/ck"
usage "^ditto-train: error: --trace: expected a file in an existing directory, got '$work/none/t.json'" \
  --trace "$work/none/t.json"
usage "^ditto-train: error: --metrics-jsonl: expected a file in an existing directory, got '$work/none/m.jsonl'" \
  --metrics-jsonl "$work/none/m.jsonl"
# A symbolic link into a missing directory (tester5): the write follows it (as open(link, "wb")
# does), so the start check probes the target's directory, not the link's; it passed and the
# --export failed after training (exit 1).
ln -s "$work/no-such-dir/x.bin" "$work/dangling.bin"
for opt in "--export llmc" --trace --metrics-jsonl; do
  # shellcheck disable=SC2086  # $opt: --export takes two words
  usage "^ditto-train: error: $opt: expected a file in an existing directory, got '$work/dangling.bin' (a symbolic link to '$work/no-such-dir/x.bin'; no directory '$work/no-such-dir')$" \
    --bias $opt "$work/dangling.bin"
done
[ ! -e "$work/no-such-dir" ] || fail "a refused run created $work/no-such-dir"
usage "^ditto-train: error: --resume: expected a checkpoint directory (the --checkpoint DIR of an earlier run, or one of its DIR/step-N), got '$work/none': No such file or directory$" \
  --resume "$work/none"
usage "^ditto-train: error: --resume: expected a checkpoint directory (the --checkpoint DIR of an earlier run, or one of its DIR/step-N), got '$work/file', a regular file$" \
  --resume "$work/file"
# Missing parents of --checkpoint are created (nanoGPT's os.makedirs(out_dir, exist_ok=True)).
"$train" "${G[@]}" --sample 0 --max-iters 1 --checkpoint "$work/new/a/b" > /dev/null ||
  fail "--checkpoint new/a/b"
[ "$(cat "$work/new/a/b/latest")" = step-00000001 ] || fail "--checkpoint new/a/b: no checkpoint"

# 6. A stop signal while the sample is drawn: the final checkpoint is on disk before the sample
#    starts. SIGTERM (torchrun's; Ctrl-C's SIGINT takes the same path, and a background job of
#    a script starts with SIGINT ignored, which ditto-train keeps).
"$train" "${G[@]}" --sample 200000 --checkpoint "$work/int" > "$work/int.out" 2> "$work/int.err" &
pid=$!
for _ in $(seq 600); do
  [ "$(cat "$work/int/latest" 2>/dev/null)" = step-00000010 ] && break
  sleep 0.1
done
sleep 2  # into the sample
kill -TERM $pid
sleep 1
kill -TERM $pid
wait $pid
rc=$?
[ $rc = 143 ] || fail "two SIGTERMs in the sample: expected exit 143, got $rc: $(cat "$work/int.err")"
grep -qxF "ditto-train: SIGTERM received after training: no step left to finish, no checkpoint to write (newest on disk: $work/int/step-00000010); finishing the output (final line, sample, exports), then exiting as usual (send it again to exit at once)" \
  "$work/int.err" || fail "first SIGTERM in the sample: $(cat "$work/int.err")"
grep -qxF "ditto-train: second SIGTERM: exiting at once; training was over; newest checkpoint on disk: $work/int/step-00000010" \
  "$work/int.err" || fail "second SIGTERM in the sample: $(cat "$work/int.err")"
grep -q "writing a checkpoint\|was not written" "$work/int.err" && fail "SIGTERM in the sample: $(cat "$work/int.err")"

# 7. One --export fails; the next one is still written. What the start checks cannot see: a
#    file size limit (`ulimit -f`) below the f32 file's size and above the bf16 one's.
(ulimit -f 16; exec "$train" "${G[@]}" --bias --sample 0 --export llmc "$work/big.bin" \
  --export llmc-bf16 "$work/ok.bin") > "$work/exp.out" 2>&1
rc=$?
[ $rc = 1 ] || fail "a failed --export: expected exit 1, got $rc: $(cat "$work/exp.out")"
grep -q "^ditto-train: exported $work/ok.bin (llm.c" "$work/exp.out" && [ -s "$work/ok.bin" ] ||
  fail "the --export after a failed one was not written: $(cat "$work/exp.out")"
grep -q "^ditto-train: error: after training (the result above is complete): --export: .*big.bin.*File too large" \
  "$work/exp.out" || fail "a failed --export: $(cat "$work/exp.out")"
[ ! -e "$work/big.bin" ] || fail "the failed --export left $work/big.bin"

# 8. --checkpoint into a checkpoint: refused, nothing written there.
"$train" "${G[@]}" --sample 0 --checkpoint "$work/run8" > "$work/run8.out" 2>&1 ||
  fail "run8: $(cat "$work/run8.out")"
step8=$work/run8/step-00000010
before=$(ls -A "$step8" | tr '\n' ' ')
for extra in "" "--resume auto"; do
  # shellcheck disable=SC2086  # $extra: no option or two words
  "$train" "${G[@]}" --sample 0 --seed 3 --checkpoint "$step8" $extra > "$work/nest.out" 2>&1
  rc=$?
  [ $rc = 1 ] || fail "--checkpoint DIR/step-N $extra: expected exit 1 (as the other refused directories), got $rc: $(cat "$work/nest.out")"
  grep -qF "ditto-train: error: --checkpoint: expected a directory to save checkpoints in, got '$step8', which is itself a checkpoint (a step-N of the run in '$work/run8'): pass that directory (with --resume $step8 to continue from this step) or another one" \
    "$work/nest.out" || fail "--checkpoint DIR/step-N $extra: $(cat "$work/nest.out")"
  [ "$(ls -A "$step8" | tr '\n' ' ')" = "$before" ] || fail "--checkpoint DIR/step-N $extra: wrote into it: $(ls -A "$step8")"
done
echo PASS
