#!/usr/bin/env bash
# Note [Graceful stop] (core/train/graceful_stop.h; issue 31): with --checkpoint, a SIGTERM (or
# Ctrl-C's SIGINT) finishes the step in progress, writes a checkpoint of it and exits 143 (130);
# a run resumed from it ends with the checksum of a run that never stopped. For dp and for ddp's
# rank threads (which must all stop after the same step). No timing is asserted: the script waits
# (bounded) for the run's start line, signals it, and checks what it wrote. A signal during the
# last step lets the run complete (exit 0, final line, exports).
# Usage: ditto_train_stop.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"

# alive: the run has not exited (a child that exited stays a zombie until bash reaps it, which
# it may do at any moment: the status is read once, so a run reaped between two reads is not
# taken for alive, as it was when a test under load saw /proc/PID vanish between them).
alive() {
  local s
  s=$(cat /proc/$pid/status 2>/dev/null) || return 1
  [ -n "$s" ] && ! grep -q '^State:[[:space:]]*Z' <<<"$s"
}

# start_run NAME ARGS...: ditto-train in the background (far more epochs than it will run), its
# output in $work/NAME.out; waits (at most 60 s) for its start line, printed once the handlers
# are installed and the model is built. Sets pid.
start_run() {
  local name=$1; shift
  "$train" --epochs 100000 --checkpoint "$work/$name" "$@" > "$work/$name.out" 2>&1 &
  pid=$!
  wait_start "$name" "^ditto-train: \(backend\|trainer\)="
}

# wait_start NAME PATTERN: waits (at most 60 s) for run $pid to print a line matching PATTERN
# (its start line) to $work/NAME.out; fails when the run ends first or never prints it.
wait_start() {
  for _ in $(seq 600); do
    grep -q "$2" "$work/$1.out" && return 0
    alive || fail "$1 ended before its start line: $(cat "$work/$1.out")"
    sleep 0.1
  done
  kill -KILL $pid; fail "$1 printed no start line in 60 s: $(cat "$work/$1.out")"
}

# wait_run: waits (at most 60 s) for the run to exit; sets rc.
wait_run() {
  for _ in $(seq 600); do
    alive || break
    sleep 0.1
  done
  if alive; then kill -KILL $pid; fail "the run did not stop within 60 s"; fi
  wait $pid
  rc=$?
}

for trainer in dp ddp; do
  name=$trainer
  start_run $name --trainer $trainer --devices 2 --metrics-jsonl "$work/$name.jsonl"
  kill -TERM $pid
  wait_run
  out=$(cat "$work/$name.out")
  [ "$rc" = 143 ] || fail "$trainer: SIGTERM: expected exit status 143, got $rc: $out"
  line=$(echo "$out" | grep "^ditto-train: stopped by SIGTERM after step ") ||
    fail "$trainer: no 'stopped by SIGTERM' line: $out"
  step=$(echo "$line" | sed 's/.*after step \([0-9]*\):.*/\1/')
  [ "$step" -ge 1 ] || fail "$trainer: stopped after step '$step'"
  ck=$(printf 'step-%08d' "$step")
  echo "$line" | grep -q "checkpoint $work/$name/$ck written; resume with --resume $work/$name" ||
    fail "$trainer: $line"
  [ "$(cat "$work/$name/latest")" = "$ck" ] || fail "$trainer: latest is $(cat "$work/$name/latest"), expected $ck"
  echo "$out" | grep -q "^final:" && fail "$trainer: a stopped run printed a final line: $out"
  # The JSON lines end with the stop's record (a reader told a stop from a crash by nothing).
  [ "$(tail -n 1 "$work/$name.jsonl")" = "{\"checkpoint\":\"$work/$name/$ck\",\"event\":\"stopped\",\"signal\":\"SIGTERM\",\"step\":$step}" ] ||
    fail "$trainer: the JSON lines' last record: $(tail -n 2 "$work/$name.jsonl")"
  # The checkpoint's epoch (trainer.json: 0-based epoch of the next batch): resume and finish the
  # next epoch, against a run that never stopped.
  epoch=$(grep -o '"epoch": *[0-9]*' "$work/$name/$ck/trainer.json" | grep -o '[0-9]*$')
  epochs=$((epoch + 1))
  resumed=$("$train" --epochs $epochs --trainer $trainer --devices 2 --resume "$work/$name" 2>&1) ||
    fail "$trainer: resume: $resumed"
  echo "$resumed" | grep -q "resumed from $work/$name at step $step " || fail "$trainer: $resumed"
  fresh=$("$train" --epochs $epochs --devices 2 2>&1) || fail "fresh: $fresh"
  a=$(echo "$resumed" | checksum) b=$(echo "$fresh" | checksum)
  [ -n "$a" ] && [ "$a" = "$b" ] ||
    fail "$trainer: stopped at step $step and resumed: $a, a run that never stopped: $b"
  echo "$trainer: SIGTERM after step $step (epoch $epochs), resumed to the same checksum $a"
done

# SIGINT (Ctrl-C): 130. Job control on, so that the background run does not inherit SIGINT
# ignored (a non-interactive shell's background jobs do, and ditto-train keeps it ignored).
set -m
start_run int
kill -INT $pid
wait_run
set +m
[ "$rc" = 130 ] || fail "SIGINT: expected exit status 130, got $rc: $(cat "$work/int.out")"
grep -q "^ditto-train: stopped by SIGINT after step " "$work/int.out" || fail "$(cat "$work/int.out")"

# A stop request during the last step (tester5: --max-iters 1 and Ctrl-C ended as "stopped by
# SIGINT after step 1, checkpoint written", without the final line and the exports): the step
# completes, and with it the run: exit 0, the final line, the --export file, the final
# checkpoint, and no "stopped by" line. Deterministic: the signal is sent while the run cannot
# have finished its only step: after its handlers are installed (the config warning of
# --bucket-cap-mb on a dp run is printed after them, before training) and before it can open its
# --metrics-jsonl FIFO (at the start of training), which this script opens only afterwards.
mkfifo "$work/last.fifo"
set -m
"$train" --model gpt --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 \
  --max-iters 1 --eval-iters 1 --sample 0 --log-interval 0 --bias --bucket-cap-mb 25 \
  --checkpoint "$work/last" --metrics-jsonl "$work/last.fifo" --export llmc "$work/last.bin" \
  > "$work/last.out" 2>&1 &
pid=$!
set +m
wait_start last "^ditto-train: warning: --bucket-cap-mb"
kill -INT $pid
timeout 60 cat "$work/last.fifo" > "$work/last.jsonl"
wait_run
out=$(cat "$work/last.out")
[ "$rc" = 0 ] || fail "SIGINT during the last step: expected exit 0 (the run is complete), got $rc: $out"
echo "$out" | grep -q "^ditto-train: signal received: finishing the current step" ||
  fail "SIGINT during the last step: the signal came after the step: $out"
# That message promised a stop checkpoint, which a run of one step never writes: taken back as
# the step begins (Note [Graceful stop]; before, nothing said so).
echo "$out" | grep -qxF "ditto-train: SIGINT: no step is left to stop before (the next is the run's last), so no stop checkpoint after all; completing the run as usual (final evaluation, checkpoint, line, sample, exports), then exiting as usual (send it again to exit at once)" ||
  fail "SIGINT before the only step: the promise of a stop checkpoint was not taken back: $out"
echo "$out" | grep -q "^final: " || fail "SIGINT during the last step: no final line: $out"
echo "$out" | grep -q "^ditto-train: exported $work/last.bin (llm.c" && [ -s "$work/last.bin" ] ||
  fail "SIGINT during the last step: no export: $out"
echo "$out" | grep -q "stopped by" && fail "SIGINT during the last step: a stopped run: $out"
[ "$(cat "$work/last/latest")" = step-00000001 ] || fail "SIGINT during the last step: latest is $(cat "$work/last/latest")"
grep -q '^{.*"event":"final"' "$work/last.jsonl" || fail "SIGINT during the last step: no final record: $(cat "$work/last.jsonl")"

# A second signal exits at once (both may land before the step ends, or the second after the
# stop began: either way 143, and never a crash).
# The second one says on stderr that the stop checkpoint was not written and names the newest
# checkpoint on disk (DIR/latest's), or none (GNU `timeout -s TERM` sends two SIGTERMs at once;
# it used to exit 143 silently after promising a checkpoint). If the stop finished before the
# second signal arrived, the run said "stopped by SIGTERM" instead, and if it came once the stop
# checkpoint was saved, the line says that it was written: all three are accepted.
# check_twice NAME NEWEST: NEWEST is the line's expected end (a path or "none").
check_twice() {
  local out; out=$(cat "$work/$1.out")
  [ "$rc" = 143 ] || fail "two SIGTERMs: expected exit status 143, got $rc: $out"
  echo "$out" | grep -q "^ditto-train: stopped by SIGTERM after step " && return 0
  echo "$out" | grep -qxF "ditto-train: second SIGTERM: exiting at once; the stop checkpoint was not written; newest checkpoint on disk: $2" &&
    return 0
  # The second signal landed once the stop's checkpoint was saved (the first one came as a step
  # ended, or with --checkpoint-every 1 that step's periodic checkpoint is the stop's): it says
  # so, and that checkpoint is the newest, the one DIR/latest names. Seen in CI's timing: the
  # first SIGTERM, sent as soon as DIR/latest appeared, fell between step 1's save and its stop
  # check.
  local ck; ck="$work/$1/$(cat "$work/$1/latest" 2>/dev/null)"
  echo "$out" | grep -qxF "ditto-train: second SIGTERM: exiting at once; the stop checkpoint was written: $ck; newest checkpoint on disk: $ck" &&
    return 0
  fail "two SIGTERMs ($1): expected a line naming '$2' as the newest checkpoint, or '$ck' as the stop's, written: $out"
}
# A GPT whose steps take a while (about a second here), so that the second signal, sent once the
# first was handled, usually lands before the stop ends (two signals sent at once may coalesce
# into one: a pending signal is not queued twice).
start_gpt() {
  local name=$1; shift
  "$train" --model gpt --n-layer 4 --n-head 4 --n-embd 256 --block-size 128 --batch-size 16 \
    --max-iters 100000 --eval-iters 0 --sample 0 --eval-interval 100000 --devices 1 \
    --data "$(dirname "$0")/../examples/data/shakespeare.txt" --checkpoint "$work/$name" "$@" \
    > "$work/$name.out" 2>&1 &
  pid=$!
  wait_start "$name" "^ditto-train: model=gpt "
}
# two_terms NAME: SIGTERM, then (once the first was handled, bounded wait) SIGTERM again.
two_terms() {
  kill -TERM $pid
  for _ in $(seq 600); do
    grep -q "^ditto-train: signal received" "$work/$1.out" && break
    sleep 0.1
  done
  kill -TERM $pid 2>/dev/null
  wait_run
}
start_gpt twice
two_terms twice
check_twice twice none
# With a checkpoint on disk (--checkpoint-every 1, waited for, bounded), the line names the one
# DIR/latest names when the run exits.
start_gpt twice_every --checkpoint-every 1
for _ in $(seq 600); do [ -s "$work/twice_every/latest" ] && break; sleep 0.1; done
two_terms twice_every
[ -s "$work/twice_every/latest" ] || fail "--checkpoint-every 1 wrote no DIR/latest in 60 s"
check_twice twice_every "$work/twice_every/$(cat "$work/twice_every/latest")"
for name in twice twice_every; do
  grep -q "^ditto-train: second SIGTERM" "$work/$name.out" &&
    echo "$name: $(grep "^ditto-train: second SIGTERM" "$work/$name.out")" ||
    echo "$name: the stop ended before the second SIGTERM (checked that instead)"
done

# Without --checkpoint there is nothing to keep: SIGTERM ends the run at once (its default).
"$train" --epochs 100000 > "$work/plain.out" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "^ditto-train: backend=" "$work/plain.out" && break; sleep 0.1; done
kill -TERM $pid
wait_run
[ "$rc" = 143 ] || fail "no --checkpoint: expected 143 (killed by SIGTERM), got $rc"
grep -q "stopped by" "$work/plain.out" && fail "no --checkpoint: $(cat "$work/plain.out")"
echo PASS
