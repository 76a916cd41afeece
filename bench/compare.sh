#!/usr/bin/env bash
# ditto against PyTorch (Gloo, DDP, single process), OpenMPI and the STREAM copy bandwidth, in one
# run on one machine; prints one table of ratios and writes CSVs and a PNG plot. The GPT rows:
# `ditto-bench gpt` (1 and 4 sim devices, fast and bitwise, dp and ddp) against
# `torch_bench.py gpt` (one process, all cores), same model (nanoGPT's CPU config) and batch.
#
#   bench/compare.sh [--quick] [--only-new] [--no-install] [--out DIR] [--build DIR]
#                    [--ranks 2,4,8] [--max-bytes BYTES] [--no-jax]
#
#   --quick        sizes up to 16 MiB, shorter timings (a smoke run of the whole pipeline)
#   --only-new     only issue 13's rows (below): skips STREAM, the older collectives, trainers, GPT
#   --no-install   installs nothing (tools/setup.sh and apt-get skipped); a missing package then
#                  fails its step (python3-matplotlib: no plot)
#   --out DIR      results: DIR/raw/*.csv, DIR/table.md, DIR/perf.png, DIR/log.txt
#                  (default bench/results)
#   --build DIR    ditto build folder (default build; configured if missing)
#   --ranks LIST   rank counts (default 2,4,8)
#   --no-jax       skips the JAX anchor (its virtual environment is made from PyPI otherwise)
#   --max-bytes B  largest collective size (default 67108864 = 64 MiB; sizes from 4 KiB, x4);
#                  268435456 (256 MiB) runs the issue's whole range but takes ~2x longer
#                  (Gloo's 8-rank all_gather of 256 MiB alone takes minutes on 2 cores)
#
# Issue 13's rows (every run; --only-new runs only them): all_to_all busbw at 4 and 8 ranks from
# 64 KiB to --max-bytes against OpenMPI's MPI_Alltoall (mpi_bench) and Gloo's all_to_all_single;
# bf16 against f32 all_reduce at the same byte count (ditto only); sendrecv (ring), gather and
# scatter (ditto only; nccl-tests' busbw factors).
#
# Issue 15's rows: bench_bitwise's GEMM GFLOP/s (bitwise against fast at 256, 512, 1024) and JAX
# (bench/jax_bench.py: the same MLP, batch sharded over 1 and 4 host-platform devices, in a
# virtual environment bench/.venv-jax made from PyPI with jax==$JAX_VERSION).
#
# Installs what it needs (tools/setup.sh, then python3-torch, libopenblas0-openmp, openmpi-bin,
# libopenmpi-dev, python3-matplotlib, python3-venv via apt-get, through sudo when not root; jax
# from PyPI into bench/.venv-jax). Never part of CI.
# Traps handled here:
#  - Debian's torch is importable only by /usr/bin/python3 (another python3 may come first on
#    PATH), so every Python step runs /usr/bin/python3 explicitly;
#  - without libopenblas0-openmp torch falls back to the reference BLAS (~30x slower);
#  - OpenBLAS picks its kernels from CPUID; on virtual CPUs that report a generic model it may
#    choose "Prescott" (SSE3, ~4x slower here); then OPENBLAS_CORETYPE is set from the CPU flags
#    (SKYLAKEX with AVX-512, HASWELL with AVX2), and the table's header says so;
#  - OpenMP's spinning waits: torch's single process is measured with the default policy and with
#    OMP_WAIT_POLICY=PASSIVE, and the better is the anchor (on a loaded machine spinning is ~4x
#    slower);
#  - torch's thread count is set explicitly (all cores for the single process, cores / ranks for
#    DDP, 1 per Gloo rank for collectives).
set -euo pipefail
t_start=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/bench/results
BUILD=$ROOT/build
RANKS=2,4,8
MAX_BYTES=$((64 << 20))
MIN_BYTES=4096
FACTOR=4
COLL_SECONDS=0.03
MAX_ITERS=10
TRAIN_SECONDS=1.0
QUICK=0
ONLY_NEW=0
NO_INSTALL=0
NO_JAX=0
JAX_VERSION=0.10.2
NEW_RANKS=4,8
NEW_MIN_BYTES=65536
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; MAX_BYTES=$((16 << 20)); COLL_SECONDS=0.02; TRAIN_SECONDS=0.3 ;;
    --only-new) ONLY_NEW=1 ;;
    --no-install) NO_INSTALL=1 ;;
    --no-jax) NO_JAX=1 ;;
    --out) OUT=$(realpath -m "$2"); shift ;;
    --build) BUILD=$(realpath -m "$2"); shift ;;
    --ranks) RANKS=$2; shift ;;
    --max-bytes) MAX_BYTES=$2; shift ;;
    -h|--help) sed -n "2,46p" "$0"; exit 0 ;;
    *) echo "compare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY=/usr/bin/python3
RAW=$OUT/raw
mkdir -p "$OUT"
rm -rf "$RAW"
mkdir -p "$RAW"
LOG=$OUT/log.txt
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }
step() { say ""; say "== $* ($(( $(date +%s) - t_start )) s)"; }

# ---- 1. install -------------------------------------------------------------------------------
step "install"
[ "$NO_INSTALL" = 0 ] && "$ROOT/tools/setup.sh"
need=()
for p in python3-torch libopenblas0-openmp openmpi-bin libopenmpi-dev python3-matplotlib python3-venv; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ] && [ "$NO_INSTALL" = 1 ]; then
  say "not installed (--no-install): ${need[*]}"
elif [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  say "installing ${need[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
$PY -c 'import torch' || { echo "compare.sh: /usr/bin/python3 cannot import torch" >&2; exit 1; }
blas_core=$(OPENBLAS_VERBOSE=2 $PY -c 'import torch; torch.ones(64,64) @ torch.ones(64,64)' 2>&1 |
            sed -n 's/^Core: //p' | head -1)
blas_note="OpenBLAS core: ${blas_core:-unknown} (detected)"
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ "${blas_core:-}" = "Prescott" ]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SKYLAKEX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=HASWELL
  fi
  [ -n "${OPENBLAS_CORETYPE:-}" ] && blas_note="OpenBLAS core: Prescott detected on a virtual CPU; OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE set from /proc/cpuinfo"
fi
say "$blas_note"
blas_lib=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
say "libblas.so.3 -> $blas_lib"
case "$blas_lib" in *openblas*) ;; *) say "WARNING: torch is not on OpenBLAS: its figures are meaningless";; esac
JAXPY=$ROOT/bench/.venv-jax/bin/python
if [ "$ONLY_NEW" = 0 ] && [ "$NO_JAX" = 0 ]; then
  if ! "$JAXPY" -c "import jax" 2>/dev/null; then
    if [ "$NO_INSTALL" = 1 ]; then
      say "jax not installed in bench/.venv-jax (--no-install): no JAX rows"; NO_JAX=1
    else
      say "installing jax==$JAX_VERSION from PyPI into bench/.venv-jax"
      python3 -m venv "$ROOT/bench/.venv-jax" &&
        "$JAXPY" -m pip install -q "jax==$JAX_VERSION" >> "$LOG" 2>&1 ||
        { say "WARNING: jax could not be installed: no JAX rows"; NO_JAX=1; }
    fi
  fi
fi

# ---- 2. build ---------------------------------------------------------------------------------
step "build ditto-bench"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >> "$LOG" 2>&1
fi
cmake --build "$BUILD" -j"$(nproc)" --target ditto-bench bench_bitwise >> "$LOG" 2>&1
mpicc -O2 -o "$OUT/mpi_bench" "$ROOT/bench/mpi_bench.c"

cores=$(nproc)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
say "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average before: $load_before"

# ---- 3. ditto ---------------------------------------------------------------------------------
if [ "$ONLY_NEW" = 0 ]; then
step "ditto-bench (STREAM copy, collectives, trainer)"
"$BUILD/bin/ditto-bench" --csv-dir "$RAW" all --backend auto --ranks "$RANKS" \
  --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --step-factor "$FACTOR" \
  --coll-seconds "$COLL_SECONDS" --max-iters "$MAX_ITERS" --train-seconds "$TRAIN_SECONDS" 2>&1 | tee -a "$LOG"

# G10 (issue 15): the 16 MiB all_reduce against the STREAM copy probe in the same round, 5
# rounds. On a shared virtual machine the memory bandwidth moves in spells of seconds (STREAM copy
# on this kind of VM: 40-47 or 70-81 GB/s, probes 10 s apart), and the sweep above sets one
# 30 ms window of ditto against the one probe at its start; report.py divides each round's
# all_reduce by its own probe and takes the median round.
step "G10: STREAM copy, then the 16 MiB all_reduce (4 ranks), 5 rounds"
mkdir -p "$RAW/g10"
for _ in 1 2 3 4 5; do
  "$BUILD/bin/ditto-bench" --csv-dir "$RAW/g10" stream >> "$LOG" 2>&1
  "$BUILD/bin/ditto-bench" --csv-dir "$RAW/g10" collectives --ops all_reduce --ranks 4 \
    --min-bytes 16M --max-bytes 16M --place both --coll-seconds 0.2 --max-iters 100 >> "$LOG" 2>&1
done

step "bench_bitwise (GEMM GFLOP/s: bitwise against fast)"
"$BUILD/bin/bench_bitwise" --gemm-only --csv "$RAW/gemm.csv" 2>&1 | tee -a "$LOG"
# Fast mode's GEMM is the AVX-512 kernel where OpenBLAS has no AVX-512 kernels for the CPU (Note
# [Fast GEMM choice], backend_sim/sim_gemm.cpp); the library's own figures, for G8's baseline:
step "bench_bitwise with the library GEMM in fast mode (DITTO_SIM_FAST_GEMM=blas)"
DITTO_SIM_FAST_GEMM=blas "$BUILD/bin/bench_bitwise" --gemm-only --csv "$RAW/gemm_blas.csv" 2>&1 |
  tee -a "$LOG"

step "ditto-bench gpt (nanoGPT's CPU config: tokens/s)"
"$BUILD/bin/ditto-bench" --csv-dir "$RAW" gpt --train-seconds "$TRAIN_SECONDS" 2>&1 | tee -a "$LOG"
fi

step "ditto-bench collectives (issue 13: all_to_all, sendrecv, gather, scatter; bf16 vs f32 all_reduce)"
"$BUILD/bin/ditto-bench" --csv-dir "$RAW" collectives --backend auto --ranks "$NEW_RANKS" \
  --ops all_to_all,sendrecv,gather,scatter --place out --min-bytes "$NEW_MIN_BYTES" \
  --max-bytes "$MAX_BYTES" --step-factor "$FACTOR" --coll-seconds "$COLL_SECONDS" \
  --max-iters "$MAX_ITERS" 2>&1 | tee -a "$LOG"
"$BUILD/bin/ditto-bench" --csv-dir "$RAW" collectives --backend auto --ranks "$NEW_RANKS" \
  --ops all_reduce -d bfloat16,float --place out --min-bytes "$NEW_MIN_BYTES" \
  --max-bytes "$MAX_BYTES" --step-factor "$FACTOR" --coll-seconds "$COLL_SECONDS" \
  --max-iters "$MAX_ITERS" 2>&1 | tee -a "$LOG"

# ---- 4. OpenMPI -------------------------------------------------------------------------------
if [ "$ONLY_NEW" = 0 ]; then
step "OpenMPI (MPI_Allreduce, MPI_Bcast, MPI_Allgather)"
for n in ${RANKS//,/ }; do
  mpirun --allow-run-as-root --oversubscribe -np "$n" "$OUT/mpi_bench" "$MIN_BYTES" "$MAX_BYTES" \
    "$FACTOR" "$COLL_SECONDS" "$MAX_ITERS" "$RAW/mpi_collectives.csv" 2>&1 | tee -a "$LOG"
done
fi
step "OpenMPI (MPI_Alltoall)"
for n in ${NEW_RANKS//,/ }; do
  mpirun --allow-run-as-root --oversubscribe -np "$n" "$OUT/mpi_bench" "$NEW_MIN_BYTES" "$MAX_BYTES" \
    "$FACTOR" "$COLL_SECONDS" "$MAX_ITERS" "$RAW/mpi_collectives.csv" all_to_all 2>&1 | tee -a "$LOG"
done

# ---- 5. PyTorch -------------------------------------------------------------------------------
if [ "$ONLY_NEW" = 0 ]; then
step "PyTorch Gloo collectives (one process per rank)"
$PY "$ROOT/bench/torch_bench.py" collectives --ranks "$RANKS" --min-bytes "$MIN_BYTES" \
  --max-bytes "$MAX_BYTES" --step-factor "$FACTOR" --seconds "$COLL_SECONDS" --max-iters "$MAX_ITERS" \
  --csv "$RAW/gloo_collectives.csv" 2>&1 | tee -a "$LOG"
fi
step "PyTorch Gloo all_to_all_single (one process per rank)"
$PY "$ROOT/bench/torch_bench.py" collectives --ranks "$NEW_RANKS" --ops all_to_all \
  --min-bytes "$NEW_MIN_BYTES" --max-bytes "$MAX_BYTES" --step-factor "$FACTOR" \
  --seconds "$COLL_SECONDS" --max-iters "$MAX_ITERS" --csv "$RAW/gloo_collectives.csv" 2>&1 |
  tee -a "$LOG"
if [ "$ONLY_NEW" = 0 ]; then
step "PyTorch training (single process, all cores; DDP with Gloo, 4 ranks)"
# The single process runs twice, with OpenMP's default (spinning) wait policy and with PASSIVE:
# on a loaded machine spinning threads that lose their core make torch several times slower; the
# table takes the better of the two for torch.
$PY "$ROOT/bench/torch_bench.py" train --part single --seconds "$TRAIN_SECONDS" \
  --csv "$RAW/torch_train.csv" 2>&1 | tee -a "$LOG"
OMP_WAIT_POLICY=PASSIVE $PY "$ROOT/bench/torch_bench.py" train --part single \
  --seconds "$TRAIN_SECONDS" --csv "$RAW/torch_train.csv" 2>&1 | tee -a "$LOG"
$PY "$ROOT/bench/torch_bench.py" train --part ddp --seconds "$TRAIN_SECONDS" \
  --csv "$RAW/torch_train.csv" 2>&1 | tee -a "$LOG"
step "PyTorch GPT training (single process, all cores; nanoGPT's CPU config)"
# Both wait policies again (see above); report.py takes the better.
$PY "$ROOT/bench/torch_bench.py" gpt --seconds "$TRAIN_SECONDS" --csv "$RAW/torch_gpt.csv" 2>&1 |
  tee -a "$LOG"
OMP_WAIT_POLICY=PASSIVE $PY "$ROOT/bench/torch_bench.py" gpt --seconds "$TRAIN_SECONDS" \
  --csv "$RAW/torch_gpt.csv" 2>&1 | tee -a "$LOG"

fi
if [ "$ONLY_NEW" = 0 ] && [ "$NO_JAX" = 0 ]; then
step "JAX (the MLP over 1 and 4 host-platform devices, batch sharded)"
"$JAXPY" "$ROOT/bench/jax_bench.py" --devices 1 --seconds "$TRAIN_SECONDS" \
  --csv "$RAW/jax_train.csv" 2>&1 | tee -a "$LOG" ||
  say "WARNING: jax_bench.py --devices 1 failed (log above): no JAX 1-device row"
# Without --xla_cpu_multi_thread_eigen=false JAX 0.10's 4-device all-reduce starves on 2 cores
# and XLA aborts the process after 40 s (bench/jax_bench.py's docstring).
"$JAXPY" "$ROOT/bench/jax_bench.py" --devices 4 --seconds "$TRAIN_SECONDS" \
  --flags=--xla_cpu_multi_thread_eigen=false --csv "$RAW/jax_train.csv" 2>&1 | tee -a "$LOG" ||
  say "WARNING: jax_bench.py --devices 4 failed (log above): no JAX 4-device row (G4 not measured)"
fi

# ---- 6. report --------------------------------------------------------------------------------
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
total=$(( $(date +%s) - t_start ))
step "table"
note="$cores cores; load average before $load_before, after $load_after; $blas_note; torch threads: $cores (single process), $((cores / 4 > 0 ? cores / 4 : 1)) per DDP rank, 1 per Gloo rank"
only_new_flag=()
[ "$ONLY_NEW" = 1 ] && only_new_flag=(--only-new)
$PY "$ROOT/bench/report.py" "$RAW" --table "$OUT/table.md" --png "$OUT/perf.png" \
  --note "$note" "${only_new_flag[@]}" 2>&1 | tee -a "$LOG"
say ""
say "compare.sh: CSVs in $RAW, table in $OUT/table.md, plot $OUT/perf.png, log $LOG"
say "compare.sh: total time $(( $(date +%s) - t_start )) s (benchmarks $total s)"
