#!/usr/bin/env bash
# Tester C, C1 (Note [Ending a job after a communicator error], core/distributed/distributed.h):
# rank 1 of `mpirun -np 2 ditto-train` stops answering (SIGSTOP) while it trains; rank 0's next
# collective times out after --comm-timeout-ms 1000, and the job must end with that error, exit
# status 1, within 30 s. Before, rank 0 printed the timeout and then waited in MPI_Finalize for
# rank 1 for ever (mpirun, which ends a job when a process fails, never learned of it).
# Usage: mpi_rank_stops.sh PATH/TO/ditto-train WORK_DIR MPIRUN...
source "$(dirname "$0")/ditto_train_common.sh"
mpirun=("${@:3}")
out=$work/out

# descendants PID: the processes below PID (mpirun's ranks, or a launcher's helpers and theirs).
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

# rank_pid R: the ditto-train process of rank R (its launcher's variable says so).
rank_pid() {
  local p
  for p in $(descendants $mp); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = ditto-train ] || continue
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null |
      grep -qxE "(OMPI_COMM_WORLD_RANK|PMIX_RANK|PMI_RANK)=$1" && { echo $p; return; }
  done
}

"${mpirun[@]}" -np 2 "$train" --epochs 100000 --comm-timeout-ms 1000 > "$out" 2>&1 &
mp=$!
for _ in $(seq 600); do  # at most 60 s for the first epoch: the ranks are in their collectives
  grep -q "^epoch " "$out" && break
  kill -0 $mp 2>/dev/null || fail "the job ended before its first epoch: $(cat "$out")"
  sleep 0.1
done
grep -q "^epoch " "$out" || { kill -KILL $mp; fail "no epoch line in 60 s: $(cat "$out")"; }
r1=$(rank_pid 1)
[ -n "$r1" ] || { kill -KILL $mp; fail "rank 1's process not found below mpirun ($mp)"; }
kill -STOP "$r1"
start=$(date +%s%N)
for _ in $(seq 300); do
  kill -0 $mp 2>/dev/null || break
  sleep 0.1
done
if kill -0 $mp 2>/dev/null; then
  kill -CONT "$r1"
  kill -KILL "$r1" $mp
  fail "the job did not end within 30 s after rank 1 stopped: $(cat "$out")"
fi
wait $mp
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
if kill -0 "$r1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' /proc/"$r1"/status 2>/dev/null; then
  kill -CONT "$r1"
  kill -KILL "$r1"
  fail "mpirun exited but left rank 1 ($r1) behind: $(cat "$out")"
fi
[ "$rc" = 1 ] || fail "expected exit status 1, got $rc after $ms ms: $(cat "$out")"
grep -qE "^ditto-train: error: rank 0: [a-z_]+ \(collective #[0-9]+ on this communicator\): timed out after 1000 ms" "$out" ||
  fail "no timeout error of rank 0: $(cat "$out")"
echo "PASS: the job ended $ms ms after rank 1 stopped, with rank 0's timeout"
