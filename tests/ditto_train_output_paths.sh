#!/usr/bin/env bash
# Output paths and bounded inputs (Notes [Atomic write] and [Bounded reads] in core/io/file.h;
# registered in tests/cmake/train_outputs.cmake):
#   --trace LINK writes through the symbolic link (the link stays a link, its target gets the
#   trace); --trace FIFO writes into the FIFO (it stays a FIFO; a FIFO stands in for /dev/null,
#   which this test never writes, since a wrong rename as root would replace it); --data and
#   safetensors-info refuse /dev/zero and a FIFO at once, naming the path and its type;
#   --checkpoint DIR whose DIR/lock another process holds is refused before training, naming the
#   lock and that process (lock_checkpoint_dir in core/checkpoint/checkpoint.h).
# Usage: ditto_train_output_paths.sh PATH/TO/ditto-train PATH/TO/safetensors-info WORK_DIR
set -u
train=$1 info=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work/real"
# A run that reads /dev/zero whole would fill memory before failing: bound it (not under a
# sanitizer, whose shadow memory needs a large address space).
if ! grep -aq -e __asan_init -e __tsan_init -e __msan_init "$train"; then ulimit -v 4000000; fi

# --trace through a symbolic link (relative, as `ln -s` makes it).
echo old > "$work/real/trace.json"
ln -s real/trace.json "$work/link.json"
timeout 60 "$train" --epochs 1 --trace "$work/link.json" > "$work/out" 2>&1 || fail "exit $?: $(cat "$work/out")"
[ -L "$work/link.json" ] || fail "--trace replaced the symbolic link by a regular file"
[ "$(readlink "$work/link.json")" = real/trace.json ] || fail "link now points at $(readlink "$work/link.json")"
grep -q '"traceEvents"' "$work/real/trace.json" || fail "the link's target has no trace: $(head -c 100 "$work/real/trace.json")"

# --trace into a FIFO: written straight through, the FIFO kept.
mkfifo "$work/trace.fifo"
timeout 60 cat "$work/trace.fifo" > "$work/from_fifo" &
reader=$!
timeout 60 "$train" --epochs 1 --trace "$work/trace.fifo" > "$work/out" 2>&1 || { kill $reader 2>/dev/null; fail "exit $?: $(cat "$work/out")"; }
[ -p "$work/trace.fifo" ] || { kill $reader 2>/dev/null; fail "--trace replaced the FIFO by a regular file"; }
wait $reader
grep -q '"traceEvents"' "$work/from_fifo" || fail "the FIFO's reader got no trace: $(head -c 100 "$work/from_fifo")"

# --data /dev/zero and a FIFO: refused at once (a FIFO without a writer must not hang the run).
expect_refused() {  # expect_refused REGEX COMMAND...
  local re=$1; shift
  timeout 30 "$@" > "$work/out" 2>&1
  local rc=$?
  [ $rc = 1 ] || fail "$*: exit status $rc, expected 1: $(head -c 300 "$work/out")"
  grep -q -- "$re" "$work/out" || fail "$*: expected '$re' in: $(head -c 300 "$work/out")"
}
mkfifo "$work/data.fifo"
expect_refused "ditto-train: error: read_csv: '/dev/zero' is a character device, expected a regular file" \
  "$train" --epochs 1 --data /dev/zero
expect_refused "ditto-train: error: read_csv: '$work/data.fifo' is a FIFO, expected a regular file" \
  "$train" --epochs 1 --data "$work/data.fifo"
expect_refused "ditto-train: error: --data: TextDataSource: '/dev/zero' is a character device, expected a regular file" \
  "$train" --model gpt --max-iters 1 --data /dev/zero
expect_refused "io::load_safetensors: '/dev/zero' is a character device, expected a regular file" \
  "$info" /dev/zero
expect_refused "io::load_safetensors: '$work/data.fifo' is a FIFO, expected a regular file" \
  "$info" "$work/data.fifo"

# --checkpoint DIR while another process holds DIR/lock (this shell, on fd 9, with pid 4242
# written in it as a writer would): refused before any training; once released, a run succeeds.
mkdir -p "$work/ck"
echo 4242 > "$work/ck/lock"
exec 9<>"$work/ck/lock"
flock -n 9 || fail "cannot take the test's own lock"
expect_refused "ditto-train: error: --checkpoint: checkpoint: checkpoint directory '$work/ck' is in use: its lock '$work/ck/lock' is held by process 4242" \
  "$train" --epochs 1 --checkpoint "$work/ck"
[ -z "$(ls "$work/ck" | grep step-)" ] || fail "the refused run wrote a checkpoint: $(ls "$work/ck")"
grep -q '^epoch' "$work/out" && fail "the refused run trained: $(head -c 300 "$work/out")"
exec 9<&-
timeout 60 "$train" --epochs 1 --checkpoint "$work/ck" > "$work/out" 2>&1 || fail "exit $? after the lock was released: $(cat "$work/out")"
[ -f "$work/ck/latest" ] || fail "no checkpoint after the lock was released"
rm -rf "$work"
echo PASS
