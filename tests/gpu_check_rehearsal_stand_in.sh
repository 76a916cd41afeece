#!/usr/bin/env bash
# tools/gpu-check.sh --rehearsal over a stand-in build whose ditto-train and ditto_tests act as if
# the machine had a GPU (they run) unless CUDA_VISIBLE_DEVICES is set and empty (they fail with the
# backend's "no CUDA device" error), then checks what review 2 of issue 29 fixed:
#  1. the rehearsal hides the GPU (it runs in the real check's step 5, ctest, on the GPU machine,
#     where its CUDA steps found the GPU and it failed);
#  2. --results DIR gets results.md and logs.tar.gz only (the device brings back at most 8 files
#     from $OUT, and logs/ holds some 60);
#  3. every compute-sanitizer row of results.md has its status (write_results read the steps
#     table into the caller's `status`, so a row recorded by the sanitizer loop itself lost it).
#  4. --help prints the whole header (it printed lines 2-40: not the options and exit statuses
#     after them).
#  5. the kernels' memcheck runs before the checksums and the speed section (after them it could
#     get no time left in the budget), the other sanitizer runs after the speed section.
#  6. where compute-sanitizer refuses the device (gVisor hosts: "Device not supported"), its first
#     row is SKIPPED with that reason, not FAIL, and the other seven are not tried (45 s each).
# Usage: gpu_check_rehearsal_stand_in.sh PATH/TO/tools/gpu-check.sh WORK_DIR
set -u
script=$1 work=$2
rm -rf "$work" && mkdir -p "$work/build/bin" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
cat > "$work/build/bin/ditto-train" <<'FAKE'
#!/usr/bin/env bash
# Stand-in ditto-train: a GPU unless CUDA_VISIBLE_DEVICES is set and empty.
[ "${1:-}" = --version ] && { echo "ditto-train 0.0 (stand-in)"; exit 0; }
be=sim prev=""
for a in "$@"; do [ "$prev" = --backend ] && be=$a; prev=$a; done
if [ "$be" = cuda ] && [ "${CUDA_VISIBLE_DEVICES-unset}" = "" ]; then
  echo "ditto-train: error: no CUDA device: no CUDA-capable device is detected"
  exit 1
fi
echo "step 0: train loss 4.0000, val loss 4.0000"
echo "predicted GPT: 1000 tokens/s"
echo "final: params_checksum=0123456789abcdef val_acc=0.9000 train_time_s=0.001"
FAKE
cat > "$work/build/bin/ditto_tests" <<'FAKE'
#!/usr/bin/env bash
# Stand-in ditto_tests: two CUDA tests that pass on the GPU, skip without one.
echo "[==========] Running 2 tests from 1 test suite."
for t in CudaStandIn.One CudaStandIn.Two; do
  echo "[ RUN      ] $t"
  if [ "${CUDA_VISIBLE_DEVICES-unset}" = "" ]; then
    echo "tests/test_stand_in.cpp:1: Skipped"
    echo "cuda backend unavailable: no CUDA device: no CUDA-capable device is detected"
    echo "[  SKIPPED ] $t (0 ms)"
  else
    echo "[       OK ] $t (1 ms)"
  fi
done
echo "[==========] 2 tests from 1 test suite ran. (1 ms total)"
FAKE
chmod +x "$work/build/bin/"*
unset CUDA_VISIBLE_DEVICES  # this machine "has" a GPU
got=$(bash "$script" --rehearsal --build "$work/build" --out "$work/out" \
        --results "$work/results" --budget 120 2>&1)
echo "$got" | grep -q "gpu-check: rehearsal: PASS" || fail "1. the rehearsal saw the GPU: $got"
files=$(cd "$work/results" 2>/dev/null && ls | tr '\n' ' ')
[ "$files" = "logs.tar.gz results.md " ] || fail "2. --results holds '$files'"
tar -tzf "$work/results/logs.tar.gz" | grep -q '^logs/preflight\|^logs/gpu.txt' ||
  fail "2. logs.tar.gz has no logs/gpu.txt"
cmp -s "$work/results/results.md" "$work/out/results.md" || fail "2. results.md differs"
rows=$(grep -cE '^\| [^|]* \| (memcheck|racecheck) \| ' "$work/out/results.md")
good=$(grep -cE '^\| [^|]* \| (memcheck|racecheck) \| (PASS|FAIL) \| ' "$work/out/results.md")
[ "$rows" -eq 8 ] && [ "$good" -eq 8 ] ||
  fail "3. $good of $rows sanitizer rows have a status: $(grep -E '(memcheck|racecheck)' "$work/out/results.md")"
bash "$script" --help | grep -q "^when it passed), 1 when one failed, 2 when the machine cannot" ||
  fail "4. --help stops before the exit statuses: $(bash "$script" --help | tail -n 2)"
order=$(grep -oE '^\| (sanitizer-memcheck-gemm-ragged-bitwise|mlp-bitwise-sim-1|speed-torch|sanitizer-racecheck-gpt-bf16-ddp-2) ' \
          "$work/out/results.md" | tr -d '| ' | paste -sd' ' -)
[ "$order" = "sanitizer-memcheck-gemm-ragged-bitwise mlp-bitwise-sim-1 speed-torch sanitizer-racecheck-gpt-bf16-ddp-2" ] ||
  fail "5. steps in the order: $order"
got6=$(GPU_CHECK_STANDIN_SANITIZER=refuse bash "$script" --rehearsal --build "$work/build" \
         --out "$work/out6" --budget 120 2>&1)
echo "$got6" | grep -q "gpu-check: rehearsal: PASS" || fail "6. a refused sanitizer failed the check: $got6"
skipped=$(grep -cE '^\| [^|]* \| (memcheck|racecheck) \| SKIPPED \| ' "$work/out6/results.md")
[ "$skipped" -eq 8 ] || fail "6. $skipped of 8 sanitizer rows SKIPPED: $(grep -E '(memcheck|racecheck)' "$work/out6/results.md")"
grep -qE '^\| sanitizer-memcheck-gemm-ragged-bitwise \| cuda \| SKIPPED \| [0-9]+ \| compute-sanitizer refused this device: .*Device not supported' \
  "$work/out6/results.md" || fail "6. the first sanitizer row does not say why: $(grep sanitizer-memcheck-gemm-ragged "$work/out6/results.md")"
tried=$(ls "$work/out6/logs" | grep -c '^sanitizer-.*\.log$')
[ "$tried" -eq 1 ] || fail "6. compute-sanitizer was tried $tried times after it refused the device"
echo "PASS: $(echo "$got" | grep 'rehearsal: PASS' | cut -c1-100)"
