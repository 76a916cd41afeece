#!/usr/bin/env bash
# ditto-train --metrics-jsonl FILE (registered in tests/cmake/train_outputs.cmake): one JSON line per epoch
# with the values of the epoch lines, and a final line with the final line's checksum.
# Usage: ditto_train_metrics_jsonl.sh PATH/TO/ditto-train WORK_DIR
set -u
train=$1 work=$2
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
out=$("$train" --epochs 2 --devices 2 --metrics-jsonl "$work/m.jsonl") || fail "exit status $?: $out"
[ "$(grep -c '"event":"epoch"' "$work/m.jsonl")" = 2 ] || fail "expected 2 epoch lines: $(cat "$work/m.jsonl")"
acc=$(echo "$out" | grep '^epoch   2' | grep -o 'val_acc=[0-9.]*' | cut -d= -f2)
json_acc=$(grep '"epoch":2,' "$work/m.jsonl" | grep -o '"val_acc":[0-9.e-]*' | cut -d: -f2)
[ -n "$acc" ] && [ "$(printf '%.4f' "$json_acc")" = "$acc" ] ||
  fail "epoch 2: val_acc=$acc printed, $json_acc in: $(cat "$work/m.jsonl")"
sum=$(echo "$out" | grep -o 'params_checksum=[0-9a-f]*' | cut -d= -f2)
grep '"event":"final"' "$work/m.jsonl" | grep -q "\"params_checksum\":\"$sum\"" || fail "final checksum $sum not in: $(cat "$work/m.jsonl")"
"$train" --epochs 0 --metrics-jsonl "$work/no/such/dir/m.jsonl" 2>"$work/err" && fail "expected an error for an unwritable file"
grep -q "ditto-train: error: --metrics-jsonl: expected a file in an existing directory, got '.*m.jsonl' (no directory " "$work/err" || fail "$(cat "$work/err")"
# A run refused by its options leaves the file alone (it is opened when the run starts).
echo precious > "$work/keep.txt"
"$train" --epochs -1 --metrics-jsonl "$work/keep.txt" 2>"$work/err" && fail "expected --epochs -1 to be refused"
[ "$(cat "$work/keep.txt")" = precious ] || fail "a refused run emptied --metrics-jsonl's file"
"$train" --epochs 1 --metrics-jsonl "" 2>"$work/err" && fail "expected --metrics-jsonl '' to be refused"
grep -q "ditto-train: error: --metrics-jsonl: expected a file name, got an empty string" "$work/err" || fail "$(cat "$work/err")"
# A resumed run continues the file (tester: it was emptied, the first part's records lost, as
# TensorBoard's and wandb's resumed runs keep theirs): epochs 1-2 and their final record, then
# the resume's record, epochs 3-4 and the resumed run's final record. dp (the resume comes before
# the file opens) and ddp (after).
for trainer in dp ddp; do
  rm -rf "$work/ck" "$work/r.jsonl"
  "$train" --trainer $trainer --epochs 2 --devices 2 --checkpoint "$work/ck" \
    --metrics-jsonl "$work/r.jsonl" > /dev/null || fail "$trainer: first part"
  "$train" --trainer $trainer --epochs 4 --devices 2 --resume "$work/ck" --checkpoint "$work/ck" \
    --metrics-jsonl "$work/r.jsonl" > /dev/null || fail "$trainer: resumed part"
  events=$(sed -E 's/^\{"epoch":([0-9]+),.*/epoch\1/; s/.*"event":"([a-z]+)".*/\1/' "$work/r.jsonl" | tr '\n' ' ')
  [ "$events" = "epoch1 epoch2 final resume epoch3 epoch4 final " ] ||
    fail "$trainer: resumed --metrics-jsonl: $events: $(cat "$work/r.jsonl")"
  grep -qxF "{\"event\":\"resume\",\"from\":\"$work/ck\",\"step\":46}" "$work/r.jsonl" ||
    fail "$trainer: the resume's record: $(cat "$work/r.jsonl")"
done
rm -rf "$work"
echo PASS
