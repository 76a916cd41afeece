#!/usr/bin/env bash
# --init-from a ditto checkpoint of a character model keeps the checkpoint's vocabulary (Note
# [Checkpoint vocabulary] in core/checkpoint/gpt_weights.h; session 56, B1; registered in
# tests/cmake/train_gpt.cmake). A tiny GPT trained a few steps on the first 100 kB of the bundled
# text A, then:
#   1. its sample (seed 0) from --init-from ck on A, on a lower-cased copy B (fewer
#      distinct bytes: in B's own vocabulary every id after the capitals means another
#      character) and from ck/step-N/model.safetensors on B is the same string: the ids are
#      decoded with the checkpoint's characters (before, B's gave another string);
#   2. the --init-from line says which vocabulary; --eval-only on B reports a validation loss
#      below the uniform ln(V) (before: above it, ids read as other characters);
#   3. a text with a byte the checkpoint has no token for ('~') is refused at the start (exit 1,
#      as --data's other problems) naming the byte, where it first is and the checkpoint's
#      trainer.json.
# Prints PASS, or FAIL: ... at the first check that does not hold.
# Usage: ditto_train_init_from_vocab.sh PATH/TO/ditto-train SOURCE_DIR WORK_DIR
set -u
train=$1 src=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || fail "cannot make $work"
head -c 100000 "$src/examples/data/shakespeare.txt" > A.txt
tr 'A-Z' 'a-z' < A.txt > B.txt
{ head -c 50000 B.txt; printf '~'; tail -c +50001 B.txt; } > C.txt
"$train" --model gpt --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8 \
  --max-iters 40 --eval-interval 40 --eval-iters 1 --warmup-iters 2 --lr-decay-iters 40 --lr 1e-2 \
  --sample 0 --devices 1 --data A.txt --checkpoint ck > train.out 2>&1 || fail "training: $(cat train.out)"
step=ck/step-00000040
V=$(grep -o '"vocab": "[0-9a-f]*"' $step/trainer.json | cut -d'"' -f4)
chars=$((${#V} / 2))
[ "$chars" -gt 40 ] || fail "the checkpoint's vocabulary: $V"
ev=(--model gpt --devices 1 --eval-only --eval-iters 2 --sample 60)
sample() { awk '/^sample \(/ { on = 1; next } /^final: / { on = 0 } on' "$1"; }
"$train" "${ev[@]}" --init-from ck --data A.txt > a.out 2>&1 || fail "on A: $(cat a.out)"
"$train" "${ev[@]}" --init-from ck --data B.txt > b.out 2>&1 || fail "on B: $(cat b.out)"
"$train" "${ev[@]}" --init-from $step/model.safetensors --data B.txt > m.out 2>&1 ||
  fail "model.safetensors on B: $(cat m.out)"
[ -n "$(sample a.out)" ] || fail "no sample: $(cat a.out)"
[ "$(sample b.out)" = "$(sample a.out)" ] ||
  fail "the sample on B is not the checkpoint's: '$(sample b.out)' vs '$(sample a.out)'"
[ "$(sample m.out)" = "$(sample a.out)" ] ||
  fail "the sample from model.safetensors is not the checkpoint's: '$(sample m.out)'"
grep -q "^ditto-train: init_from=ck (ditto checkpoint $step): .* vocab_size=$chars bias=False vocab=$chars characters ($step/trainer.json)$" b.out ||
  fail "the init_from line: $(cat b.out)"
grep -q "model.safetensors (safetensors in nanoGPT's layout): .* vocab=$chars characters ($step/trainer.json)$" m.out ||
  fail "the init_from line of model.safetensors: $(cat m.out)"
val=$(grep -o 'final: .*val_loss=[0-9.]*' b.out | grep -o 'val_loss=[0-9.]*' | cut -d= -f2)
awk -v v="$val" -v n="$chars" 'BEGIN { exit !(v != "" && v < log(n)) }' ||
  fail "val_loss on B: expected below ln($chars), got '$val': $(cat b.out)"
rc=0
"$train" "${ev[@]}" --init-from ck --data C.txt > c.out 2>&1 || rc=$?
[ $rc = 1 ] || fail "a byte outside the vocabulary: expected exit 1, got $rc: $(cat c.out)"
grep -qF "ditto-train: error: --data: TextDataSource: 'C.txt': expected only the $chars bytes of the --init-from checkpoint's vocabulary ('$step/trainer.json'), got 1 byte it has no token for: 0x7e '~' at byte 50000" c.out ||
  fail "a byte outside the vocabulary: $(cat c.out)"
echo "sample on A, B and model.safetensors: '$(sample a.out | head -c 40)...'; val_loss on B $val < ln($chars)"
echo PASS
