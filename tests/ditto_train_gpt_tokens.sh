#!/usr/bin/env bash
# ditto-train --model gpt on token files (issue 32; Note [Token files] in core/data/token_source.h),
# bitwise mode, a tiny GPT for 10 iterations on a 3-shard llm.c dataset written here
# (tools/make_token_data.py: shakespeare.txt's bytes as tokens, vocab 256):
#   1. one params_checksum for --devices 1, 2, 4, 8 x --trainer dp, ddp, and (MPIRUN given)
#      mpirun -np 2; the val shard beside the glob is found and evaluated;
#   2. a checkpoint resumes to it (other shards refused); the same checksum from the comma list of the shards and from nanoGPT's train.bin of the
#      same tokens (with val.bin beside it);
#   3. the refusals of the CLI: a raw .bin without --vocab-size (naming meta.pkl), a glob that
#      matches nothing, a missing file of a list, no val data with evaluation, a token past
#      --vocab-size (naming the file and offset), a text given --val-data.
# Usage: ditto_train_gpt_tokens.sh PATH/TO/ditto-train WORK_DIR [MPIRUN...]
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail, checksum
shift 2
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/../tools/make_token_data.py" --format llmc --out "$work/d" --name tiny --shards 3 \
  --train-tokens 90000 --val-tokens 10000 --text "$here/../examples/data/shakespeare.txt" > /dev/null ||
  fail "make_token_data.py"
tiny=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8
      --max-iters 10 --eval-interval 5 --eval-iters 2 --warmup-iters 2 --lr-decay-iters 10
      --sample 8 --vocab-size 256)
glob="$work/d/tiny_train_*.bin"

U=$("$train" "${tiny[@]}" --data "$glob" --devices 1 | tee "$work/u.out" | checksum)
[ -n "$U" ] || fail "no checksum: $(cat "$work/u.out")"
grep -qF "ditto-train: data=$glob format=llmc files=3 (train 90000 tokens; val $work/d/tiny_val_000000.bin: 10000 tokens)" "$work/u.out" ||
  fail "start line: $(cat "$work/u.out")"
grep -q '^step 10: train loss [0-9.]*, val loss [0-9.]*' "$work/u.out" || fail "no step 10 line: $(cat "$work/u.out")"
grep -A1 '^sample (8 token ids' "$work/u.out" | tail -1 | grep -Eq '^[0-9]+( [0-9]+){7}$' ||
  fail "no sample of 8 token ids: $(cat "$work/u.out")"
for n in 1 2 4 8; do
  for t in dp ddp; do
    out=$("$train" "${tiny[@]}" --data "$glob" --devices $n --trainer $t) || fail "--devices $n --trainer $t: $out"
    [ "$(echo "$out" | checksum)" = "$U" ] || fail "--devices $n --trainer $t: $(echo "$out" | checksum) != $U"
  done
done
echo "one checksum $U for 1, 2, 4, 8 devices x dp, ddp on 3 llm.c shards"
if [ ${#mpirun[@]} -gt 0 ]; then
  # Under ASan the ranks need LeakSanitizer's slow unwinder for tools/sanitizers/lsan.supp to
  # reach Open MPI's own leaks (tests/cmake/mpi.cmake); the runs without mpirun keep the fast one.
  out=$(LSAN_OPTIONS="fast_unwind_on_malloc=0:${LSAN_OPTIONS:-}" \
        "${mpirun[@]}" -np 2 "$train" "${tiny[@]}" --data "$glob" --trainer ddp 2>&1) ||
    fail "mpirun -np 2: $out"
  [ "$(echo "$out" | grep -c '^final: ')" = 1 ] || fail "mpirun -np 2: not one final line: $out"
  [ "$(echo "$out" | checksum)" = "$U" ] || fail "mpirun -np 2: $(echo "$out" | checksum) != $U"
  echo "mpirun -np 2: checksum $U"
else
  echo "mpirun: skipped (no MPI in this build)"
fi

# A checkpoint of step 5 resumes (on 4 ddp ranks) to the same bits; other data is refused.
"$train" "${tiny[@]}" --data "$glob" --devices 2 --max-iters 5 --checkpoint "$work/ck" > /dev/null || fail "checkpoint"
out=$("$train" "${tiny[@]}" --data "$glob" --devices 4 --trainer ddp --resume "$work/ck") || fail "resume: $out"
echo "$out" | grep -q "resumed from $work/ck at step 5" || fail "not resumed at step 5: $out"
[ "$(echo "$out" | checksum)" = "$U" ] || fail "resumed: $(echo "$out" | checksum) != $U"
"$train" "${tiny[@]}" --data "$work/d/tiny_train_000001.bin" --resume "$work/ck" > /dev/null 2> "$work/err" &&
  fail "resumed on other data"
grep -Eq "was saved with (data_fingerprint|train_tokens)=" "$work/err" || fail "$(cat "$work/err")"
echo "resumed from step 5: $U; other data refused"

# The comma list, and nanoGPT's raw tokens of the same sequence: the same windows, the same bits.
list="$work/d/tiny_train_000001.bin,$work/d/tiny_train_000002.bin,$work/d/tiny_train_000003.bin"
out=$("$train" "${tiny[@]}" --data "$list" --devices 2) || fail "comma list: $out"
[ "$(echo "$out" | checksum)" = "$U" ] || fail "comma list: $(echo "$out" | checksum) != $U"
mkdir -p "$work/n"
for f in "$work"/d/tiny_train_*.bin; do tail -c +1025 "$f"; done > "$work/n/train.bin"
tail -c +1025 "$work/d/tiny_val_000000.bin" > "$work/n/val.bin"
out=$("$train" "${tiny[@]}" --data "$work/n/train.bin" --devices 4 --trainer ddp) || fail "nanoGPT: $out"
echo "$out" | grep -qF "format=nanogpt files=1 (train 90000 tokens; val $work/n/val.bin: 10000 tokens)" || fail "nanoGPT start line: $out"
[ "$(echo "$out" | checksum)" = "$U" ] || fail "nanoGPT train.bin: $(echo "$out" | checksum) != $U"
echo "the comma list and nanoGPT's train.bin: checksum $U"

# Refusals: exit 2 for a usage error, 1 for a file's problem; each names what it expected.
refused() {  # refused RC REGEX ARGS...
  local rc=$1 re=$2
  shift 2
  "$train" "$@" > /dev/null 2> "$work/err"
  local got=$?
  [ "$got" = "$rc" ] || fail "exit $got, expected $rc: $* : $(cat "$work/err")"
  grep -Eq "$re" "$work/err" || fail "expected /$re/: $(cat "$work/err")"
}
small=(--model gpt --n-layer 1 --n-head 1 --n-embd 8 --block-size 8 --max-iters 1 --sample 0)
refused 2 "^ditto-train: error: --vocab-size: expected the vocabulary size of nanoGPT's uint16 tokens in '$work/n/train.bin' \(meta.pkl's vocab_size.*--data-format text if it is a text\)" \
  "${small[@]}" --data "$work/n/train.bin"
refused 1 "^ditto-train: error: --data: the pattern '$work/d/nope_\*.bin' matches no file$" \
  "${small[@]}" --data "$work/d/nope_*.bin"
refused 1 "^ditto-train: error: --data: TokenDataSource: cannot open '$work/d/gone.bin': No such file or directory$" \
  "${small[@]}" --data "$work/d/tiny_train_000001.bin,$work/d/gone.bin" --vocab-size 256
mkdir -p "$work/solo"
cp "$work/d/tiny_train_000001.bin" "$work/solo/solo_train_000001.bin"
refused 2 "^ditto-train: error: --val-data: expected validation data for '$work/solo/solo_train_000001.bin'" \
  "${small[@]}" --data "$work/solo/solo_train_000001.bin" --vocab-size 256
"$train" "${small[@]}" --data "$work/solo/solo_train_000001.bin" --vocab-size 256 --eval-iters 0 > /dev/null ||
  fail "--eval-iters 0 without val data"
"$train" "${small[@]}" --data "$work/solo/solo_train_000001.bin" --vocab-size 256 \
  --val-data "$work/d/tiny_val_000000.bin" > /dev/null || fail "--val-data"
refused 1 "^ditto-train: error: TokenDataSource: '$work/d/tiny_train_00000[123].bin': offset [0-9]+: expected a token < vocab_size = 64, got [0-9]+$" \
  "${small[@]}" --data "$glob" --vocab-size 64
refused 2 "^ditto-train: error: --val-data: expected token data with it" \
  "${small[@]}" --val-data "$work/n/val.bin"
echo "refusals named"
rm -rf "$work"
echo PASS
