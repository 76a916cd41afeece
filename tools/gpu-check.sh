#!/usr/bin/env bash
# gpu-check: builds the working tree with the CUDA backend on a machine with a GPU and no network,
# runs the cuda tests of every dtype, op and collective (issue 13: bf16 all_reduce, all_to_all,
# the send/recv ring; a skip fails), runs the whole test suite (the cuda tests now run instead of
# skipping), compares ditto-train's
# params_checksum between --backend sim and --backend cuda for 1 and 8 devices in bitwise mode,
# compares fast-mode accuracy, trains the GPT (ditto-train --model gpt) on both backends (1 and 4
# devices, bitwise, also with dropout, and in bf16 (--dtype bf16, 1 and 2 devices, and 2 ddp
# ranks with ZeRO-1 and 2 micro-steps): one params_checksum, the same losses and sample; fast
# mode: the same validation loss within 0.01), runs the benchmarks, and writes OUT/results.md
# plus raw logs.
# Every step runs under `timeout`; the whole script stays under 6 minutes (--budget).
#
#   tools/gpu-check.sh --deps DIR --out DIR [--arch 90] [--jobs N] [--build DIR] [--budget S]
#                      [--epochs N] [--build-only]
#
#   --deps DIR    folder made by tools/pack-gpu-deps.sh (Eigen, Random123, CLI11 headers and their
#                 CMake packages, GoogleTest sources; layout in that script)
#   --out DIR     where results.md and logs/ go (created)
#   --arch A      CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200)
#   --jobs N      build and test parallelism (default: all cores)
#   --build DIR   build folder (default build-gpu-check in the repository)
#   --budget S    seconds for the whole run (default 345)
#   --epochs N    ditto-train epochs for the checksum and accuracy runs (default 20)
#   --build-only  configure and build only, without a GPU (to check the build on a CPU machine)
#
# NCCL: found by cmake/FindNCCL.cmake (NCCL_ROOT, the CUDA toolkit, or the pip wheel
# nvidia-nccl-cu13, whose folder this script passes as NCCL_ROOT). Exit status: 0 when every
# check passed, 1 when one failed, 2 when the machine cannot run the check (no GPU, no nvcc...).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
deps="" out="" arch=90 jobs="$(nproc 2>/dev/null || echo 4)" build="$root/build-gpu-check"
budget=345 epochs=20 build_only=0
usage() { sed -n '13,24p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) deps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [ -z "$deps" ] || [ -z "$out" ]; then
  echo "gpu-check: --deps DIR and --out DIR are required" >&2
  usage >&2
  exit 2
fi

start=$(date +%s)
mkdir -p "$out/logs" || { echo "gpu-check: cannot create $out/logs" >&2; exit 2; }
out="$(cd "$out" && pwd)"
results="$out/results.md"
summary="$out/logs/summary.tsv"
: >"$summary"
failed=0

elapsed() { echo $(( $(date +%s) - start )); }
remaining() { echo $(( budget - $(elapsed) )); }

# write_results [note]: results.md from what has run so far (rewritten after every step, so a
# run cut short still leaves a readable file).
write_results() {
  {
    echo "# ditto gpu-check"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), elapsed $(elapsed) s of a $budget s budget"
    local dirty=""
    git -C "$root" status --porcelain 2>/dev/null | grep -q . && dirty=" (with uncommitted changes)"
    echo "- commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')$dirty"
    [ -f "$out/logs/gpu.txt" ] && sed 's/^/- gpu: /' "$out/logs/gpu.txt"
    [ -f "$out/logs/tools.txt" ] && sed 's/^/- /' "$out/logs/tools.txt"
    echo
    echo "| step | status | seconds | detail |"
    echo "|---|---|---|---|"
    while IFS=$'\t' read -r name status secs detail; do
      echo "| $name | $status | $secs | $detail |"
    done <"$summary"
    [ -f "$out/logs/checksums.md" ] && { echo; cat "$out/logs/checksums.md"; }
    [ -f "$out/logs/accuracy.md" ] && { echo; cat "$out/logs/accuracy.md"; }
    [ -f "$out/logs/gpt.md" ] && { echo; cat "$out/logs/gpt.md"; }
    [ -f "$out/logs/bench.md" ] && { echo; cat "$out/logs/bench.md"; }
    if [ $# -gt 0 ]; then echo; echo "$1"; fi
    echo
    echo "Raw logs: logs/ (one file per step)."
  } >"$results"
}

record() {  # record NAME STATUS SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$summary"
  [ "$2" = "FAIL" ] && failed=1
  write_results
}

# step NAME LIMIT_S CMD...: runs CMD under timeout (at most the time left), logs to
# logs/NAME.log, records PASS / FAIL / TIMEOUT. Returns CMD's status.
step() {
  local name="$1" limit="$2"; shift 2
  local left; left=$(( $(remaining) - 5 ))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    record "$name" "SKIPPED" 0 "no time left in the budget"
    return 124
  fi
  local t0 rc; t0=$(date +%s)
  echo "gpu-check: $name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" >"$out/logs/$name.log" 2>&1
  rc=$?
  local secs=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    record "$name" "PASS" "$secs" ""
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" "FAIL" "$secs" "timed out after ${limit}s"
  else
    local last; last="$(tail -n 1 "$out/logs/$name.log" | tr '|\t' '/ ' | cut -c1-160)"
    record "$name" "FAIL" "$secs" "exit $rc; logs/$name.log ends: $last"
  fi
  return $rc
}

fatal() {  # the machine cannot run the check: say why in one line and in results.md
  echo "gpu-check: error: $1" >&2
  record "preflight" "FAIL" "$(elapsed)" "$1"
  exit 2
}

# ---- preflight: GPU, tools, deps ---------------------------------------------------------------
if [ $build_only -eq 0 ]; then
  command -v nvidia-smi >/dev/null 2>&1 ||
    fatal "no GPU: nvidia-smi not found (to only build, pass --build-only)"
  if ! timeout 30 nvidia-smi --format=csv,noheader \
      --query-gpu=index,name,memory.total,driver_version \
      >"$out/logs/gpu.txt" 2>"$out/logs/nvidia-smi.err" || [ ! -s "$out/logs/gpu.txt" ]; then
    fatal "no GPU: nvidia-smi failed: $(head -n 1 "$out/logs/nvidia-smi.err")"
  fi
fi
nvcc_bin="${CUDACXX:-}"
[ -z "$nvcc_bin" ] && nvcc_bin="$(command -v nvcc 2>/dev/null || true)"
for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
  [ -z "$nvcc_bin" ] && [ -x "$c" ] && nvcc_bin="$c"
done
[ -n "$nvcc_bin" ] ||
  fatal "no CUDA compiler: nvcc neither on PATH nor in /usr/local/cuda*/bin (set CUDACXX)"
command -v cmake >/dev/null 2>&1 || fatal "cmake not found"
[ -d "$deps" ] || fatal "--deps $deps: not a folder (make it with tools/pack-gpu-deps.sh)"
deps="$(cd "$deps" && pwd)"
for f in include/eigen3/Eigen/Core include/Random123/philox.h include/CLI/CLI.hpp \
         src/googletest/CMakeLists.txt; do
  [ -e "$deps/$f" ] || fatal "--deps $deps: missing $f (layout: tools/pack-gpu-deps.sh)"
done

# NCCL: an explicit NCCL_ROOT wins; else the pip wheel if Python has one; else FindNCCL's search
# (the CUDA toolkit, system paths).
nccl_root="${NCCL_ROOT:-}"
if [ -z "$nccl_root" ] && command -v python3 >/dev/null 2>&1; then
  nccl_root="$(timeout 30 python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' \
                2>/dev/null || true)"
fi
nccl_args=()
if [ -n "$nccl_root" ]; then
  nccl_args=(-DNCCL_ROOT="$nccl_root")
  export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
  echo "nvcc: $nvcc_bin ($("$nvcc_bin" --version 2>/dev/null | grep -o 'release [0-9.]*'))"
  echo "cmake: $(cmake --version | head -n 1)"
  echo "NCCL_ROOT: ${nccl_root:-(FindNCCL default search)}"
  echo "deps: $deps; build: $build; arch: sm_$arch; jobs: $jobs"
} >"$out/logs/tools.txt"
gpu_line="build only, no GPU"
[ -s "$out/logs/gpu.txt" ] && gpu_line="$(head -n 1 "$out/logs/gpu.txt")"
record "preflight" "PASS" "$(elapsed)" "$gpu_line"

# ---- build: GoogleTest from source, then ditto with DITTO_WITH_CUDA=ON --------------------------
gtest_prefix="$build/_deps/gtest-install"
step gtest 90 bash -c "cmake -S '$deps/src/googletest' -B '$build/_deps/gtest-build' \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX='$gtest_prefix' -DBUILD_GMOCK=ON \
    -DINSTALL_GTEST=ON && cmake --build '$build/_deps/gtest-build' -j '$jobs' \
    && cmake --install '$build/_deps/gtest-build'" ||
  { write_results "GoogleTest did not build: see logs/gtest.log."; exit 1; }

step configure 60 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DDITTO_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_PREFIX_PATH="$deps;$gtest_prefix" "${nccl_args[@]}" \
  || { write_results "Configure failed: see logs/configure.log."; exit 1; }
grep -E '^(Eigen3|CLI11|GTest)_DIR:|^(RANDOM123|NCCL)_INCLUDE_DIR:|^NCCL_LIBRARY:' \
  "$build/CMakeCache.txt" >"$out/logs/found.txt" 2>/dev/null
build_limit=240  # about 90 s with 16 cores; a --build-only run on a small machine may use it all
[ $build_only -eq 1 ] && build_limit=$budget
step build "$build_limit" cmake --build "$build" -j "$jobs" ||
  { write_results "Build failed: see logs/build.log."; exit 1; }
if [ $build_only -eq 1 ]; then
  write_results "Build only (--build-only): nothing was run."
  echo "gpu-check: build only: done in $(elapsed) s; $results"
  exit $failed
fi

# ---- checksums: sim and cuda, 1 and 8 devices, bitwise -----------------------------------------
train="$build/bin/ditto-train"
final_field() { grep '^final:' "$1" 2>/dev/null | grep -o "$2=[^ ]*" | cut -d= -f2; }
{
  echo "## ditto-train params_checksum, bitwise, $epochs epochs (digits, MLP 64-128-10)"
  echo
  echo "| backend | devices | params_checksum | val_acc | train_time_s |"
  echo "|---|---|---|---|---|"
} >"$out/logs/checksums.md"
sums=()
for backend in sim cuda; do
  for n in 1 8; do
    name="train-bitwise-$backend-$n"
    step "$name" 60 "$train" --backend "$backend" --devices "$n" --determinism bitwise \
      --epochs "$epochs"
    log="$out/logs/$name.log"
    c="$(final_field "$log" params_checksum)"
    sums+=("${c:-missing}")
    echo "| $backend | $n | ${c:-missing} | $(final_field "$log" val_acc)" \
         "| $(final_field "$log" train_time_s) |" >>"$out/logs/checksums.md"
  done
done
uniq_sums="$(printf '%s\n' "${sums[@]}" | sort -u | wc -l)"
if [ "$uniq_sums" -eq 1 ] && [ "${sums[0]}" != "missing" ]; then
  echo -e "\nAll four checksums are equal." >>"$out/logs/checksums.md"
  record "checksums-equal" "PASS" 0 "sim 1/8 and cuda 1/8: ${sums[0]}"
else
  echo -e "\nThe checksums differ." >>"$out/logs/checksums.md"
  record "checksums-equal" "FAIL" 0 \
    "sim1=${sums[0]} sim8=${sums[1]} cuda1=${sums[2]} cuda8=${sums[3]}"
fi

# ---- two GPUs or more: the NCCL transports -----------------------------------------------------
# Ranks on GPUs of their own talk over NCCL (bitwise: the block algorithm of Note [CUDA bitwise
# collectives] over NcclTransport): in one process with one device per GPU, and one rank per
# process under mpirun. On one GPU every communicator above used the in-GPU transport.
ngpu="$(grep -c . "$out/logs/gpu.txt" 2>/dev/null || echo 0)"
if [ "$ngpu" -ge 2 ]; then
  runs=("train-bitwise-cuda-nccl-$ngpu:$train --backend cuda --devices $ngpu")
  if command -v mpirun >/dev/null 2>&1 && [ -x "$build/bin/ditto_mpi_tests" ]; then
    runs+=("train-bitwise-cuda-mpi-2:mpirun --allow-run-as-root --oversubscribe -np 2 $train --backend cuda")
  fi
  for run in "${runs[@]}"; do
    name="${run%%:*}"
    # shellcheck disable=SC2086  # the command line is split on purpose
    step "$name" 60 ${run#*:} --determinism bitwise --epochs "$epochs"
    c="$(final_field "$out/logs/$name.log" params_checksum | head -n 1)"
    if [ -n "$c" ] && [ "$c" = "${sums[0]}" ]; then
      record "$name-checksum" "PASS" 0 "$c, as sim"
    else
      record "$name-checksum" "FAIL" 0 "${c:-missing}; sim ${sums[0]}"
    fi
  done
else
  record "nccl-transports" "SKIPPED" 0 \
    "one GPU: the NCCL paths need two (ranks sharing a GPU use the in-GPU transport)"
fi

# ---- fast mode: the same accuracy -------------------------------------------------------------
{
  echo "## ditto-train fast mode, 8 devices, $epochs epochs"
  echo
  echo "| backend | val_acc | val_loss | train_time_s |"
  echo "|---|---|---|---|"
} >"$out/logs/accuracy.md"
for backend in sim cuda; do
  name="train-fast-$backend-8"
  step "$name" 60 "$train" --backend "$backend" --devices 8 --determinism fast \
    --epochs "$epochs"
  log="$out/logs/$name.log"
  echo "| $backend | $(final_field "$log" val_acc) | $(final_field "$log" val_loss)" \
       "| $(final_field "$log" train_time_s) |" >>"$out/logs/accuracy.md"
done
# within NAME WHAT SIM CUDA TOL: PASS when both values are there and |SIM - CUDA| <= TOL.
within() {
  if [ -n "$3" ] && [ -n "$4" ] &&
     awk -v a="$3" -v b="$4" -v t="$5" 'BEGIN { d = a - b; exit !(d <= t && d >= -t) }'
  then
    record "$1" "PASS" 0 "$2 sim $3, cuda $4 (within $5)"
  else
    record "$1" "FAIL" 0 "$2 sim ${3:-missing}, cuda ${4:-missing}"
  fi
}
within fast-accuracy val_acc "$(final_field "$out/logs/train-fast-sim-8.log" val_acc)" \
  "$(final_field "$out/logs/train-fast-cuda-8.log" val_acc)" 0.02

# ---- the GPT: bitwise sim = cuda for 1 and 4 devices (also with dropout), fast-mode loss ---------
# A small nanoGPT configuration on the bundled text (ditto-train --model gpt) with a short
# warm-up, so 20 steps move the loss: every transformer kernel of backend_cuda/cuda_gpt.cu is on
# the training path, the sample at the end runs generate(). Bitwise runs must agree on
# params_checksum, on every logged loss and on the sampled text (compared as one key).
gpt_args=(--model gpt --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --batch-size 8
          --max-iters 20 --eval-interval 10 --eval-iters 2 --warmup-iters 2 --lr-decay-iters 20
          --sample 100)
gpt_sum() { grep -o 'params_checksum=[0-9a-f]*' "$1" 2>/dev/null | tail -n 1 | cut -d= -f2; }
gpt_val() { grep -o 'val loss [0-9.]*' "$1" 2>/dev/null | tail -n 1 | awk '{print $3}'; }
gpt_key() {  # checksum, losses and sample of a run's log, hashed; empty without a checksum
  [ -n "$(gpt_sum "$1")" ] || return 0
  { gpt_sum "$1"; grep -o '^step [0-9]*: train loss [0-9.]*, val loss [0-9.]*' "$1"
    sed -n '/^sample (/,/^final:/p' "$1" | grep -v '^final:'; } | md5sum | cut -c1-12
}
{
  echo "## ditto-train --model gpt (${gpt_args[*]:2})"
  echo
  echo "| run | backend | devices | determinism | dropout | params_checksum | val loss | key |"
  echo "|---|---|---|---|---|---|---|---|"
} >"$out/logs/gpt.md"
# gpt_run NAME BACKEND DEVICES DETERMINISM DROPOUT [MORE OPTIONS]: one run, its row in gpt.md.
gpt_run() {
  local name="$1" be="$2" n="$3" det="$4" drop="$5"; shift 5
  step "$name" 45 "$train" "${gpt_args[@]}" --backend "$be" --devices "$n" --determinism "$det" \
    --dropout "$drop" "$@"
  local log="$out/logs/$name.log"
  echo "| $name${*:+ ($*)} | $be | $n | $det | $drop | $(gpt_sum "$log") | $(gpt_val "$log") |" \
       "$(gpt_key "$log") |" >>"$out/logs/gpt.md"
}
# gpt_equal NAME RUN...: PASS when the runs have one key (checksum, losses, sample).
gpt_equal() {
  local name="$1" r k all=() detail=""; shift
  for r in "$@"; do
    k="$(gpt_key "$out/logs/$r.log")"
    all+=("${k:-missing}")
    detail="$detail $r=$(gpt_sum "$out/logs/$r.log")/${k:-missing}"
  done
  if [ "$(printf '%s\n' "${all[@]}" | sort -u | wc -l)" -eq 1 ] && [ "${all[0]}" != missing ]; then
    record "$name" "PASS" 0 \
      "params_checksum $(gpt_sum "$out/logs/$1.log"), same losses and sample:$(printf ' %s' "$@")"
  else
    record "$name" "FAIL" 0 "checksum/key differ:$detail"
  fi
}
for backend in sim cuda; do
  for n in 1 4; do gpt_run "gpt-bitwise-$backend-$n" "$backend" "$n" bitwise 0; done
done
gpt_equal gpt-bitwise-equal gpt-bitwise-sim-1 gpt-bitwise-sim-4 gpt-bitwise-cuda-1 \
  gpt-bitwise-cuda-4
gpt_run gpt-dropout-sim-1 sim 1 bitwise 0.1
gpt_run gpt-dropout-cuda-4 cuda 4 bitwise 0.1
gpt_equal gpt-dropout-equal gpt-dropout-sim-1 gpt-dropout-cuda-4
# Issue 14: the GPT in bf16 mixed precision (bf16 parameters and activations, f32 master
# weights; --dtype bf16), bitwise: cuda's bf16 kernels (f32 arithmetic, one rounding per output,
# Note [Mixed precision]) give the simulator's checksum, losses and sample, on 1 and 2 devices
# (2 ranks share the GPU where there is one).
for backend in sim cuda; do
  for n in 1 2; do gpt_run "gpt-bf16-$backend-$n" "$backend" "$n" bitwise 0 --dtype bf16; done
done
gpt_equal gpt-bf16-equal gpt-bf16-sim-1 gpt-bf16-sim-2 gpt-bf16-cuda-1 gpt-bf16-cuda-2
# ZeRO-1 (each rank steps its shard's f32 masters; reduce_scatter, the sharded clip through
# sum_squares_blocks, all_gather) and gradient accumulation (2 micro-steps under no_sync) on
# cuda, bf16, bitwise: still the one-device checksum (Note [ZeRO mixed precision], Note
# [Gradient accumulation]); attention recomputes att from its stats (Note [Attention memory]).
gpt_run gpt-bf16-zero-cuda-2 cuda 2 bitwise 0 --dtype bf16 --trainer ddp --zero-stage 1 \
  --grad-accum-steps 2
gpt_equal gpt-bf16-zero-equal gpt-bf16-sim-1 gpt-bf16-zero-cuda-2
for backend in sim cuda; do gpt_run "gpt-fast-$backend-4" "$backend" 4 fast 0; done
within gpt-fast-loss "val loss" "$(gpt_val "$out/logs/gpt-fast-sim-4.log")" \
  "$(gpt_val "$out/logs/gpt-fast-cuda-4.log")" 0.01

# ---- issue 13: every dtype and op, the new collectives, send / recv -----------------------------
# The cuda tests of every dtype x op (bitwise = the simulator, bit for bit), all_to_all(_v),
# gather, scatter and the send/recv ring (tests/test_cuda_comm_dtypes.cpp; the collective matrix's
# cuda cases where built), run on their own first so that a skip or a failure shows here by name
# (ctest below runs them again among the rest). A skip counts as a failure: this machine has a
# GPU.
tests_bin="$build/bin/ditto_tests"
if [ -x "$tests_bin" ]; then
  step cuda-dtypes-collectives 90 bash -c "'$tests_bin' \
      --gtest_filter='CudaCommDtypes.*:*Matrix*Cuda*:*Matrix*cuda*' --gtest_brief=1 \
      > '$out/logs/cuda-dtypes-gtest.txt' 2>&1; rc=\$?; cat '$out/logs/cuda-dtypes-gtest.txt'; \
      if grep -q '\[  SKIPPED \]' '$out/logs/cuda-dtypes-gtest.txt'; then \
        echo 'cuda tests skipped on a GPU machine'; exit 1; fi; exit \$rc"
fi
# bf16 all_reduce, all_to_all and the send/recv ring through ditto-bench (nccl-tests' names), when
# this ditto-bench has them.
if [ -x "$build/bin/ditto-bench" ]; then
  for spec in "all_reduce:bfloat16" "alltoall:float" "sendrecv:float"; do
    op="${spec%%:*}" dt="${spec#*:}"
    if ! grep -qa -- "$op" "$build/bin/ditto-bench"; then
      record "ditto-bench-$op-$dt" "SKIPPED" 0 "this ditto-bench has no $op"
      continue
    fi
    for det in fast bitwise; do
      step "ditto-bench-$op-$dt-$det" 60 "$build/bin/ditto-bench" collectives --backend cuda \
        --ops "$op" --dtype "$dt" --ranks 8 --min-bytes 1M --max-bytes 64M --step-factor 8 \
        --coll-seconds 0.1 --determinism "$det"
    done
  done
fi
# The reduce kernel of the collectives against the host rule on the CPU (no GPU needed; also in
# ctest as CudaEmu.CommKernels).
[ -x "$build/bin/cuda_emu_comm_test" ] &&
  step cuda-emu-comm-kernels 60 "$build/bin/cuda_emu_comm_test"

# ---- the whole test suite ---------------------------------------------------------------------
step ctest 150 ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 120
ctest_log="$out/logs/ctest.log"
total_line="$(grep -E 'tests passed|tests failed' "$ctest_log" | tail -n 1)"
# CUDA tests: the Cuda* suites and the backend-ops table's cuda instances (..._cuda_bitwise/fast).
cuda_tests="$(grep -cE 'Test +#[0-9]+: [^ ]*(Cuda|_cuda_)' "$ctest_log")"
# Tests of the NCCL transports skip on one GPU (they need two): not held against a 1-GPU run.
multi_gpu_tests='BitwiseNccl'
cuda_skipped="$(grep -E 'Test +#[0-9]+: [^ ]*(Cuda|_cuda_)[^ ]* .*Skipped' "$ctest_log" |
  { if [ "$ngpu" -ge 2 ]; then cat; else grep -vE "$multi_gpu_tests"; fi; } | grep -c .)"
cuda_ok=FAIL
[ "$cuda_tests" -gt 0 ] && [ "$cuda_skipped" -eq 0 ] && cuda_ok=PASS
record "ctest-summary" "$cuda_ok" 0 \
  "${total_line:-no summary}; cuda tests run: $cuda_tests, skipped: $cuda_skipped"

# ---- benchmarks -------------------------------------------------------------------------------
{
  echo "## Benchmarks"
  echo
} >"$out/logs/bench.md"
shopt -s nullglob
benches=("$build"/bin/bench_cuda* "$build"/bin/bench_gpu*)
for b in "$build"/bin/bench_*; do
  case " ${benches[*]} " in *" $b "*) ;; *) benches+=("$b") ;; esac
done
for b in "${benches[@]}"; do
  [ -x "$b" ] || continue
  name="$(basename "$b")"
  # bench_ddp measures the simulator only (cost-model predictions take minutes on a CPU).
  [ "$name" = bench_ddp ] && continue
  args=()
  grep -qa -- '--quick' "$b" && args=(--quick)
  step "$name" 120 "$b" "${args[@]}"
  {
    echo "### $name ${args[*]}"
    echo
    echo '```'
    tail -n 40 "$out/logs/$name.log"
    echo '```'
    echo
  } >>"$out/logs/bench.md"
done
[ ${#benches[@]} -eq 0 ] && echo "No bench binaries were built." >>"$out/logs/bench.md"
# nccl-tests-style all_reduce over 8 ranks on the GPU(s) (oversubscribed on one GPU), both modes.
if [ -x "$build/bin/ditto-bench" ]; then
  mkdir -p "$out/csv"
  for det in fast bitwise; do
    name="ditto-bench-allreduce-$det"
    step "$name" 90 "$build/bin/ditto-bench" --csv-dir "$out/csv" collectives --backend cuda \
      --ops all_reduce --ranks 8 --place out --min-bytes 1M --max-bytes 256M --step-factor 4 \
      --coll-seconds 0.2 --determinism "$det"
    { echo "### $name"; echo; echo '```'; tail -n 30 "$out/logs/$name.log"; echo '```'; echo; } \
      >>"$out/logs/bench.md"
  done
fi

verdict="Every check passed."
[ $failed -eq 0 ] || verdict="Some checks FAILED: see the table."
write_results "$verdict"
echo "gpu-check: done in $(elapsed) s. $verdict $results"
exit $failed
