#!/usr/bin/env bash
# safetensors-info end to end (registered in tests/cmake/train_outputs.cmake):
#   1. --help prints the usage and exits 0 (it used to open a file called --help);
#   2. on a checkpoint's model.safetensors written by ditto-train: the tensors, exit 0, no warning;
#   3. the same file with 4 bytes of tensor data changed: a warning naming the file and both
#      CRC-32s (core/checkpoint/checkpoint.h, verify_checkpoint_crc), exit 1;
#   4. (with DTYPE_FILE, tests/data/dtype_ref.safetensors) tensors of other dtypes print with
#      their safetensors names and values (BF16, F16, F64, I8, U8, I32).
# Usage: safetensors_info.sh PATH/TO/safetensors-info PATH/TO/ditto-train WORK_DIR [DTYPE_FILE]
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

if [ $# -ge 4 ]; then
  out=$("$info" "$4" 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || fail "dtype file: expected exit 0, got $rc: $out"
  for want in '^tensor f32_to_bf16 BF16 \[[0-9]*\]: 0 -0 1 -1 inf -inf' \
              '^tensor f32_to_f16 F16 \[[0-9]*\]: 0 -0 1 -1 inf -inf' \
              '^tensor f64_in F64 \[[0-9]*\]: 0 -0 1 -1 inf -inf' \
              '^tensor i8_in I8 \[256\]: -128 -127 -126 -125 -124 -123 \.\.\.$' \
              '^tensor u8_in U8 \[256\]: 0 1 2 3 4 5 \.\.\.$' \
              '^tensor i32_in I32 \[[0-9]*\]: -\?[0-9]'; do
    echo "$out" | grep -q "$want" || fail "dtype file: no line matching $want: $out"
  done
fi
echo PASS
