#!/usr/bin/env bash
# ditto-train --model gpt --data: what the token-data side refuses, and how it names it (issue 32,
# the hostile newcomer's D34, P01, D28/D50/G06/K09, D48, X07; Note [Token files] in
# core/data/token_source.h). Each case runs under `timeout`: a hang is a failure, not a stall.
#   1. D34: a FIFO given as --data (named .bin or not, alone, in a glob, in a list) or found
#      beside it as the val file is refused at once as "is a FIFO, expected a regular file".
#   2. P01: an llm.c shard the user cannot read is "cannot open FILE: Permission denied", not a
#      request for nanoGPT's --vocab-size (run as nobody under runuser when this runs as root,
#      whom the file's mode does not stop; skipped, saying so, where neither is possible).
#   3. D28...: a validation file's error names --val-data, or says it was found beside --data.
#   4. D48: a bracket glob of the training shards finds the val shard as a list or a ? glob does.
#   5. X07: a text whose vocabulary is larger than the --init-from file's names --init-from.
# Usage: ditto_train_gpt_token_refusals.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail
here=$(cd "$(dirname "$0")" && pwd)
chmod 755 "$work"
python3 "$here/../tools/make_token_data.py" --format llmc --out "$work/d" --name tiny --shards 3 \
  --train-tokens 3000 --val-tokens 500 --text "$here/../examples/data/shakespeare.txt" > /dev/null ||
  fail "make_token_data.py"
small=(--model gpt --n-layer 1 --n-head 1 --n-embd 8 --block-size 8 --batch-size 4 --max-iters 1
       --eval-iters 1 --sample 0 --devices 1 --vocab-size 256)

refused() {  # refused RC REGEX ARGS...: exit RC within 30 s, stderr matching REGEX
  local rc=$1 re=$2
  shift 2
  timeout 30 "$train" "$@" > /dev/null 2> "$work/err"
  local got=$?
  [ "$got" = 124 ] && fail "timed out (a hang): $*"
  [ "$got" = "$rc" ] || fail "exit $got, expected $rc: $* : $(cat "$work/err")"
  grep -Eq "$re" "$work/err" || fail "expected /$re/: $(cat "$work/err")"
}

# 1. FIFOs (no writer: an open without O_NONBLOCK waits for one forever).
mkdir -p "$work/f" "$work/v"
mkfifo "$work/f/fifo_train.bin" "$work/f/fifo.txt"
refused 1 "^ditto-train: error: --data: TokenDataSource: '$work/f/fifo_train.bin' is a FIFO, expected a regular file$" \
  "${small[@]}" --data "$work/f/fifo_train.bin"
refused 1 "^ditto-train: error: --data: TextDataSource: '$work/f/fifo.txt' is a FIFO, expected a regular file$" \
  "${small[@]}" --data "$work/f/fifo.txt"
refused 1 "^ditto-train: error: --data: TokenDataSource: '$work/f/fifo_train.bin' is a FIFO, expected a regular file$" \
  "${small[@]}" --data "$work/f/fifo_*.bin"
refused 1 "^ditto-train: error: --data: TokenDataSource: '$work/f/fifo_train.bin' is a FIFO, expected a regular file$" \
  "${small[@]}" --data "$work/d/tiny_train_000001.bin,$work/f/fifo_train.bin"
refused 1 "^ditto-train: error: --val-data: TokenDataSource: '$work/f/fifo_train.bin' is a FIFO, expected a regular file$" \
  "${small[@]}" --data "$work/d/tiny_train_000001.bin" --val-data "$work/f/fifo_train.bin"
cp "$work/d/tiny_train_000001.bin" "$work/v/v_train_000001.bin"
mkfifo "$work/v/v_val_000000.bin"
refused 1 "^ditto-train: error: --data \(validation file found beside it\): TokenDataSource: '$work/v/v_val_000000.bin' is a FIFO, expected a regular file$" \
  "${small[@]}" --data "$work/v/v_train_000001.bin"
echo "FIFOs refused at once"

# 2. A shard its user cannot read (mode 000), named .bin as llm.c's are.
mkdir -p "$work/p"
cp "$work/d/tiny_train_000001.bin" "$work/p/locked_train_000001.bin"
chmod 000 "$work/p/locked_train_000001.bin"
as=()
if [ "$(id -u)" = 0 ]; then
  if command -v runuser > /dev/null && runuser -u nobody -- test -x "$train" 2> /dev/null; then
    as=(runuser -u nobody --)
  else
    as=(skip)
  fi
fi
if [ "${as[0]:-}" = skip ]; then
  echo "permission case skipped: running as root (whom mode 000 does not stop) without runuser -u nobody able to run $train"
else
  # No --vocab-size: detection could not read the magic and took the .bin for nanoGPT's tokens,
  # then asked for their vocabulary.
  timeout 30 "${as[@]}" "$train" "${small[@]:0:${#small[@]}-2}" --data "$work/p/locked_train_000001.bin" \
    --eval-iters 0 > /dev/null 2> "$work/err"
  got=$?
  [ "$got" = 1 ] || fail "unreadable shard: exit $got, expected 1: $(cat "$work/err")"
  grep -Eq "^ditto-train: error: --data: TokenDataSource: cannot open '$work/p/locked_train_000001.bin': Permission denied$" "$work/err" ||
    fail "unreadable shard: $(cat "$work/err")"
  echo "an unreadable shard: cannot open, Permission denied${as[0]:+ (as nobody)}"
fi

# 3. Validation files' errors name where they came from.
printf 'not a shard, 28 bytes long.' > "$work/v/bad_val.bin"
refused 1 "^ditto-train: error: --val-data: TokenDataSource: '$work/v/bad_val.bin': offset 0: expected an llm.c header of 1024 bytes" \
  "${small[@]}" --data "$work/d/tiny_train_000001.bin" --val-data "$work/v/bad_val.bin"
refused 1 "^ditto-train: error: --val-data: TokenDataSource: cannot open '$work/v/gone_val.bin': No such file or directory$" \
  "${small[@]}" --data "$work/d/tiny_train_000001.bin" --val-data "$work/v/gone_val.bin"
mkdir -p "$work/s"
cp "$work/d/tiny_train_000001.bin" "$work/s/s_train_000001.bin"
python3 -c "
import struct, sys
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, 4, *[0] * 253) + struct.pack('<4H', 1, 2, 3, 4))
" "$work/s/s_val_000000.bin" || fail "short val shard"
refused 1 "^ditto-train: error: --data \(validation file found beside it\): TokenDataSource: '$work/s/s_val_000000.bin': expected more than block_size = 8 tokens of validation data, got 4$" \
  "${small[@]}" --data "$work/s/s_train_000001.bin"
echo "validation files' errors named --val-data or found beside --data"

# 4. A bracket glob (and the other spellings of the shard numbers) finds the val shard.
for spec in "$work/d/tiny_train_00000[12].bin" "$work/d/tiny_train_00000?.bin" \
            "$work/d/tiny_train_000001.bin,$work/d/tiny_train_000002.bin"; do
  out=$(timeout 120 "$train" "${small[@]}" --data "$spec" 2>&1) || fail "$spec: $out"
  echo "$out" | grep -qF "ditto-train: data=$spec format=llmc files=" || fail "$spec: $out"
  echo "$out" | grep -qF "val $work/d/tiny_val_000000.bin: 500 tokens)" || fail "$spec: no val shard: $out"
done
echo "a bracket glob finds the val shard"

# 5. --init-from a model of a smaller vocabulary than the text's: the refusal names the file.
for i in $(seq 40); do echo abcabcabc; done > "$work/abc.txt"
timeout 120 "$train" --model gpt --n-layer 1 --n-head 1 --n-embd 8 --block-size 8 --batch-size 4 \
  --max-iters 1 --eval-iters 0 --sample 0 --devices 1 --bias --data "$work/abc.txt" \
  --export llmc "$work/abc_model.bin" > "$work/out" 2>&1 || fail "export: $(cat "$work/out")"
refused 2 "^ditto-train: error: --init-from '$work/abc_model.bin' \(.*\): expected a vocab_size of at least the text's vocabulary of [0-9]+ tokens \('.*shakespeare.txt'\), got 4$" \
  --model gpt --max-iters 1 --eval-iters 0 --sample 0 --devices 1 --init-from "$work/abc_model.bin"
refused 2 "^ditto-train: error: --vocab-size: expected 0 or at least the text's vocabulary of [0-9]+ tokens \('.*shakespeare.txt'\), got 4$" \
  --model gpt --max-iters 1 --eval-iters 0 --sample 0 --devices 1 --vocab-size 4
echo "a vocabulary too small named where it came from"
rm -rf "$work"
echo PASS
