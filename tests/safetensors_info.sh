#!/usr/bin/env bash
# safetensors-info end to end (registered in tests/CMakeLists.txt):
#   1. --help prints the usage and exits 0 (it used to open a file called --help);
#   2. on a checkpoint's model.safetensors written by ditto-train: the tensors, exit 0, no warning;
#   3. the same file with 4 bytes of tensor data changed: a warning naming the file and both
#      CRC-32s (core/io/checkpoint.h, verify_checkpoint_crc), exit 1.
# Usage: safetensors_info.sh PATH/TO/safetensors-info PATH/TO/ditto-train WORK_DIR
set -u
info=$1
train=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

out=$("$info" --help 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "--help: expected exit 0, got $rc: $out"
echo "$out" | grep -q '^usage: safetensors-info \[--all\] FILE.safetensors' || fail "--help: $out"

"$train" --epochs 1 --checkpoint "$work/ck" > /dev/null || fail "ditto-train --checkpoint"
file=$(ls "$work"/ck/step-*/model.safetensors | head -n 1)
[ -f "$file" ] || fail "no model.safetensors under $work/ck"
out=$("$info" "$file" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "intact file: expected exit 0, got $rc: $out"
echo "$out" | grep -q '^metadata ditto.crc32=[0-9a-f]\{8\}$' || fail "intact file: no ditto.crc32: $out"
echo "$out" | grep -q '^tensor ' || fail "intact file: no tensor lines: $out"
echo "$out" | grep -q 'warning' && fail "intact file: unexpected warning: $out"

# The last bytes of the file are tensor data (the JSON header comes first).
size=$(wc -c < "$file")
printf '\001\002\003\004' | dd of="$file" bs=1 seek=$((size - 4)) conv=notrunc 2> /dev/null
out=$("$info" "$file" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "damaged file: expected exit 1, got $rc: $out"
echo "$out" | grep -q "^safetensors-info: warning: $file: checksum mismatch: the tensor data has CRC-32 [0-9a-f]\{8\}, the file records [0-9a-f]\{8\} (damaged file)$" \
  || fail "damaged file: no warning: $out"
echo "$out" | grep -q '^tensor ' || fail "damaged file: the tensors are no longer printed: $out"
echo PASS
