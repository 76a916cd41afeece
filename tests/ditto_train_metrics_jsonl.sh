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
rm -rf "$work"
echo PASS
