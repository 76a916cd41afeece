#!/usr/bin/env bash
# tools/gpu-check.sh's gtest_step on a stand-in test binary (no GPU needed): a listed test that
# hangs is left out and the rest of the list rerun once, and the step is reported as FAIL naming
# it; a test that crashes the process is left out the same way. gtest_step and the helpers it
# calls are taken from the script itself (sed), with record / why_failed / remaining stubbed.
# Usage: gpu_check_gtest_step.sh PATH/TO/tools/gpu-check.sh WORK_DIR
set -u
script=$1 work=$2
rm -rf "$work" && mkdir -p "$work/logs" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
# A stand-in gtest binary: three tests; MODE=hang makes the second sleep, MODE=crash kill itself.
cat > "$work/fake_tests" <<'FAKE'
#!/usr/bin/env bash
f="${1#--gtest_filter=}"
echo "[==========] Running tests"
n=0
for t in CudaA.One CudaA.Bad CudaA.Two; do
  case "$f" in *-*"$t"*) continue ;; esac
  echo "[ RUN      ] $t"
  if [ $t = CudaA.Bad ]; then
    [ "$MODE" = hang ] && sleep 60
    [ "$MODE" = crash ] && kill -SEGV $$
  fi
  echo "[       OK ] $t (10 ms)"; n=$((n + 1))
done
echo "[==========] $n tests from 1 test suite ran. (20 ms total)"
echo "[  PASSED  ] $n tests."
FAKE
chmod +x "$work/fake_tests"
{
  echo "out='$work'; tests_bin='$work/fake_tests'; allowed_skips='needs two GPUs'"
  echo 'remaining() { echo 1000; }; record() { echo "RECORD: $*"; }; why_failed() { echo "rc $2"; }'
  sed -n '/^run_limited() {/,/^}/p;/^finished_ms() {/,/^}/p;/^gtest_step() {/,/^}/p' "$script"
  echo 'gtest_step listed 3 "CudaA.*"'
} > "$work/harness.sh"
for mode in hang crash; do
  rm -f "$work"/logs/*
  got=$(MODE=$mode bash "$work/harness.sh" 2>&1)
  echo "$got" | grep -q "^RECORD: listed cuda FAIL .*CudaA.Bad" || fail "$mode: $got"
  [ -f "$work/logs/listed-rerun1.log" ] || fail "$mode: no rerun: $got"
  grep -q '^\[       OK \] CudaA.Two' "$work/logs/listed-rerun1.log" || fail "$mode: CudaA.Two did not run again"
  grep -q 'CudaA.Bad' "$work/logs/listed-rerun1.log" && fail "$mode: the rerun ran CudaA.Bad again"
  echo "$mode: $(echo "$got" | grep '^RECORD')"
done
echo PASS
