#!/usr/bin/env bash
# gpu-check: the first GPU run of ditto's CUDA backend, made to fit a GPU machine lent for about
# 15 minutes with no network and no compiler worth using (issue 28). Two phases:
#
#   tools/gpu-check.sh --pack [--build DIR] [--jobs N] [--arch 90] [--sanitizer-wheel FILE]
#       On this (CPU) machine: configure and build the CUDA backend in a build folder of its own
#       (default build-gpu/: Release, sm_90, no -march=native, no MPI, no OpenBLAS, libstdc++ and
#       libgcc linked statically), then pack it without objects and static libraries into
#       gpu-carry/ditto-gpu-build.tar.xz plus gpu-carry/manifest.txt (its absolute paths, commit,
#       flags); compute-sanitizer (from the CUDA toolkit, or the nvidia-cuda-sanitizer-api wheel,
#       pip-downloaded into DIR-cache/ when neither is here) and libcudart go inside the archive.
#       Prints the device command to run.
#   tools/gpu-check.sh --run [--out DIR] [--results DIR] [--budget S] [--jobs N] [--epochs N]
#       On the GPU machine, from the repository root, gpu-carry/ carried: unpack, make the
#       recorded absolute paths hold (a symlink to this tree), put python3's nvidia/*/lib folders
#       (NCCL, cuBLAS, the CUDA runtime) on LD_LIBRARY_PATH, and run the check; nothing compiles.
#   tools/gpu-check.sh --rehearsal --build DIR [--out DIR] [--budget S]
#       Here, on a built tree: the whole --run with a stand-in nvidia-smi first on PATH (and a
#       stand-in compute-sanitizer), tiny sizes (--quick). Every CUDA step must
#       fail with the backend's clean "no CUDA device" error and every other step pass; exit 0
#       then ("rehearsal: PASS"). ctest GpuCheck.Rehearsal runs it.
#
# The check, in this order, each step under `timeout`, OUT/results.md rewritten after every step
# (a run cut short still reports), the whole at most --budget seconds (default 480):
#   1. the CUDA tests by name (ditto_tests --gtest_filter='*Cuda*:*cuda*'), then the tests listed
#      in tools/gpu-check-tests.txt when it exists (one gtest filter a line, '#' comments): a skip
#      is a failure, except a case that needs two GPUs or one mode only; then compute-sanitizer
#      --tool memcheck over the kernels' edge cases (the bitwise GEMMs of ragged sizes and the
#      sharded GEMM with empty shards: BackendOps cases), before the long steps 2 and 3 can use
#      up the budget;
#   2. sim = cuda params_checksum: the MLP on 1 and 8 devices bitwise; the GPT (f32 on 1 and 4
#      devices, with dropout under ddp, bf16 on 1 and 2, bf16 ddp with ZeRO-1 and 2 micro-steps,
#      f16 on 1 with 2 micro-steps, f16 ddp with ZeRO-1 checkpointed half-way and resumed;
#      fast-mode loss within 0.01);
#      logical devices share the GPU where there is one;
#   3. speed beside PyTorch on the same GPU: bench/torch_gpu_bench.py (nanoGPT's char config in
#      f32, TF32 and bf16; GPT-2 124M in bf16), ditto-train --backend cuda on the same
#      configurations in fast and bitwise mode, and the dry run's prediction (--profile of the
#      GPU nvidia-smi names: h100-sxm on an H100, h200 on an H200);
#   4. compute-sanitizer --tool memcheck over a tiny GPT on 2 devices bf16 ddp and the MLP, and
#      --tool racecheck over those and the two GEMM cases of step 1;
#   5. the rest of the suite (ctest without the CUDA tests and Install.*, which needs a compiler)
#      in the time left.
#
# Other options: --out DIR (default gpu-check-out/), --results DIR (after every step, a copy of
# results.md and the logs packed as logs.tar.gz: two files; on the device "$OUT", which brings
# back at most 8 files, 2 folders down, so OUT/logs/ itself would come back cut),
# --carry DIR (default gpu-carry/), --speed-steps N / --speed-warmup N (default 10 / 3),
# --quick (tiny sizes; --rehearsal sets it). Exit status: 0 when every check passed (a rehearsal:
# when it passed), 1 when one failed, 2 when the machine cannot run the check.
# Sourced parts (same shell, same variables): tools/gpu-check/pack.sh (--pack), tools/gpu-check/speed.sh
# (step 3).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
mode="" build="" carry="$root/gpu-carry" out="" results_dir="" arch=90 jobs="$(nproc 2>/dev/null || echo 4)"
budget=480 epochs=20 quick=0 sanitizer_wheel="" speed_steps=10 speed_warmup=3
usage() { sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) mode=pack; shift ;;
    --run) mode=run; shift ;;
    --rehearsal) mode=rehearsal; quick=1; shift ;;
    --build) build="$2"; shift 2 ;;
    --carry) carry="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --results) results_dir="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --speed-steps) speed_steps="$2"; shift 2 ;;
    --speed-warmup) speed_warmup="$2"; shift 2 ;;
    --sanitizer-wheel) sanitizer_wheel="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for n in "$budget" "$jobs" "$epochs" "$speed_steps" "$speed_warmup"; do
  case "$n" in ''|*[!0-9]*) echo "gpu-check: expected a whole number, got '$n'" >&2; exit 2 ;; esac
done
[ "$speed_steps" -ge 1 ] || { echo "gpu-check: --speed-steps: expected >= 1" >&2; exit 2; }
archive_name=ditto-gpu-build.tar.xz

# ================================ --pack: build here, pack ======================================
if [ "$mode" = pack ]; then
  . "$root/tools/gpu-check/pack.sh"  # builds, packs and prints the device command
  exit 0
fi
if [ "$mode" != run ] && [ "$mode" != rehearsal ]; then
  echo "gpu-check: expected --pack, --run or --rehearsal" >&2
  usage >&2
  exit 2
fi

# ============================ --run / --rehearsal: the check ===================================
start=$(date +%s)
out="${out:-$root/gpu-check-out}"
mkdir -p "$out/logs" || { echo "gpu-check: cannot create $out/logs" >&2; exit 2; }
out="$(cd "$out" && pwd)"
results="$out/results.md"
if [ -n "$results_dir" ]; then
  mkdir -p "$results_dir" && results_dir="$(cd "$results_dir" && pwd)" ||
    { echo "gpu-check: cannot create --results $results_dir" >&2; exit 2; }
  [ "$results_dir" != "$out" ] ||
    { echo "gpu-check: --results: expected a folder other than --out ($out)" >&2; exit 2; }
fi
summary="$out/logs/summary.tsv"
: >"$summary"
rm -f "$out"/logs/*.md
failed=0
[ $quick -eq 1 ] && { epochs=1; speed_steps=1; speed_warmup=1; }

elapsed() { echo $(( $(date +%s) - start )); }
remaining() { echo $(( budget - $(elapsed) )); }

# write_results [note]: results.md from what has run so far (rewritten after every step); with
# --results, copied there with the logs packed (logs.tar.gz).
write_results() {
  local name kind status secs detail  # read below: the callers' variables of these names stay
  {
    echo "# ditto gpu-check${rehearsal_title:-}"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), elapsed $(elapsed) s of a $budget s budget"
    [ -n "${build_line:-}" ] && echo "- $build_line"
    [ -f "$out/logs/gpu.txt" ] && sed 's/^/- gpu: /' "$out/logs/gpu.txt"
    [ -f "$out/logs/tools.txt" ] && sed 's/^/- /' "$out/logs/tools.txt"
    echo
    echo "| step | kind | status | seconds | detail |"
    echo "|---|---|---|---|---|"
    while IFS=$'\t' read -r name kind status secs detail; do
      echo "| $name | $kind | $status | $secs | $detail |"
    done <"$summary"
    local f
    for f in checksums gpt speed torch sanitizers; do
      [ -f "$out/logs/$f.md" ] && { echo; cat "$out/logs/$f.md"; }
    done
    if [ $# -gt 0 ]; then echo; echo "$1"; fi
    echo
    if [ -n "$results_dir" ]; then
      echo "Raw logs: logs.tar.gz beside this file (logs/, one file per step)."
    else
      echo "Raw logs: logs/ (one file per step)."
    fi
  } >"$results.tmp" && mv "$results.tmp" "$results"
  if [ -n "$results_dir" ]; then
    cp "$results" "$results_dir/results.md.tmp" && mv "$results_dir/results.md.tmp" "$results_dir/results.md"
    tar -czf "$results_dir/logs.tar.gz.tmp" -C "$out" logs &&
      mv "$results_dir/logs.tar.gz.tmp" "$results_dir/logs.tar.gz"
  fi
}

# record NAME KIND STATUS SECONDS DETAIL: one row (KIND: cuda, a step that needs the GPU; host,
# one that does not).
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(printf '%s' "$5" | tr '|\t\n' '/  ')" \
    >>"$summary"
  [ "$3" = "FAIL" ] && failed=1
  write_results
}

# why_failed LOG RC LIMIT: one line for a failed step: the backend's "no CUDA device" error when
# the log has it, a timeout, a crash (signal), else the exit status and the log's last line.
why_failed() {
  local log="$1" rc="$2" limit="$3" line san
  line="$(grep -o 'no CUDA device[^|]*' "$log" 2>/dev/null | head -n 1 | cut -c1-200)"
  san="$(grep -m1 -oE '(AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error):.*' "$log" \
         2>/dev/null | cut -c1-160)"
  if [ -n "$san" ]; then  # a host sanitizer's report (a --rehearsal on an ASan build)
    echo "sanitizer report (exit $rc): $san"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "timed out after ${limit}s"
  elif [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then  # 128 + the signal's number
    echo "crashed: signal $((rc - 128)); $(basename "$log") ends: $(tail -n 1 "$log" | cut -c1-160)"
  elif [ -n "$line" ]; then
    echo "$line"
  else
    echo "exit $rc; $(basename "$log") ends: $(tail -n 1 "$log" | cut -c1-160)"
  fi
}

# run_limited NAME LIMIT CMD...: CMD under timeout (at most the time left), output to
# logs/NAME.log; sets step_rc, step_secs, step_limit. Returns 1 without running when no time is
# left (step_rc 124).
run_limited() {
  local name="$1" limit="$2"; shift 2
  local left; left=$(( $(remaining) - 3 ))
  [ "$limit" -gt "$left" ] && limit=$left
  step_limit=$limit step_secs=0 step_rc=124
  [ "$limit" -le 0 ] && return 1
  local t0; t0=$(date +%s)
  echo "gpu-check: $name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" >"$out/logs/$name.log" 2>&1
  step_rc=$?
  step_secs=$(( $(date +%s) - t0 ))
  return 0
}

# step NAME KIND LIMIT CMD...: run_limited, then PASS / FAIL (why_failed) / SKIPPED (no time).
step() {
  local name="$1" kind="$2" limit="$3"; shift 3
  if ! run_limited "$name" "$limit" "$@"; then
    record "$name" "$kind" SKIPPED 0 "no time left in the budget"
    return 124
  fi
  if [ $step_rc -eq 0 ]; then
    record "$name" "$kind" PASS "$step_secs" ""
  else
    record "$name" "$kind" FAIL "$step_secs" "$(why_failed "$out/logs/$name.log" $step_rc $step_limit)"
  fi
  return $step_rc
}

fatal() {  # the machine cannot run the check: say why in one line and in results.md
  echo "gpu-check: error: $1" >&2
  record preflight host FAIL "$(elapsed)" "$1"
  exit 2
}

# ---- the build: unpacked here (--run) or the one given (--rehearsal) ---------------------------
if [ "$mode" = run ]; then
  manifest="$carry/manifest.txt"
  [ -f "$manifest" ] && [ -f "$carry/$archive_name" ] ||
    fatal "no $carry/manifest.txt and $archive_name: run tools/gpu-check.sh --pack on the CPU machine and carry gpu-carry"
  mf() { grep "^$1=" "$manifest" | head -n 1 | cut -d= -f2-; }
  src_dir="$(mf source_dir)" build_rel="$(mf build_rel)"
  [ -n "$src_dir" ] && [ -n "$build_rel" ] || fatal "$manifest: no source_dir or build_rel"
  t0=$(date +%s)
  rm -rf "${root:?}/$build_rel"
  if ! tar -C "$root" -xJf "$carry/$archive_name" >"$out/logs/unpack.log" 2>&1; then
    fatal "unpacking $archive_name failed: $(tail -n 1 "$out/logs/unpack.log")"
  fi
  # ctest and the test binaries hold the absolute paths of the packing machine: make them hold.
  if [ "$(cd "$src_dir" 2>/dev/null && pwd -P)" != "$(cd "$root" && pwd -P)" ]; then
    [ -e "$src_dir" ] && fatal "$src_dir (the packed build's source path) exists here and is not this tree"
    mkdir -p "$(dirname "$src_dir")" && ln -s "$root" "$src_dir" ||
      fatal "cannot link $src_dir to $root (the packed build's paths)"
  fi
  build="$src_dir/$build_rel"
  record unpack host PASS $(( $(date +%s) - t0 )) \
    "$archive_name ($(mf archive_bytes) bytes) into $build_rel; $src_dir -> $root"
  build_line="build: packed at commit $(mf commit | cut -c1-12) (uncommitted changes: $(mf dirty)), $(mf packed); $(mf nvcc)"
  # The libraries the binaries need: python3's nvidia wheels (torch's NCCL, cuBLAS, runtime),
  # then the CUDA runtime carried in the archive.
  libs=""
  if command -v python3 >/dev/null 2>&1; then
    libs="$(timeout 30 python3 - <<'EOF' 2>/dev/null
import glob, os, site, sys
dirs = []
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
EOF
)"
  fi
  export LD_LIBRARY_PATH="${libs:+$libs:}$build/gpu-check-carried/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  [ -n "$build" ] || { echo "gpu-check: --rehearsal: --build DIR (a built tree) is required" >&2; exit 2; }
  build="$(cd "$build" && pwd)" || exit 2
  rehearsal_title=" (rehearsal: a stand-in nvidia-smi, no GPU; not a GPU result)"
  build_line="build: $build (rehearsal)"
  # No GPU, also on a machine that has one (the real check's step 5 runs ctest, and with it
  # GpuCheck.Rehearsal, there): every CUDA step must meet the "no CUDA device" error, not the GPU.
  export CUDA_VISIBLE_DEVICES=""
  # Stand-ins first on PATH: nvidia-smi prints one fake GPU; compute-sanitizer (a real one stops
  # before its target starts when there is no driver) runs its target and reports no error, so
  # step 4's plumbing runs too.
  fake="$out/rehearsal-bin"
  mkdir -p "$fake"
  cat >"$fake/nvidia-smi" <<EOF
#!/bin/sh
# gpu-check --rehearsal: a stand-in for nvidia-smi (there is no GPU here).
echo "0, ${GPU_CHECK_STANDIN_GPU:-NVIDIA H100 80GB HBM3} (stand-in: gpu-check rehearsal, no GPU), 81559 MiB, 000.00.00"
EOF
  cat >"$fake/compute-sanitizer" <<'EOF'
#!/bin/sh
# gpu-check --rehearsal: a stand-in for compute-sanitizer: skips its options, runs the target.
# GPU_CHECK_STANDIN_SANITIZER=refuse: answers as on a gVisor host (the device refused).
if [ "${GPU_CHECK_STANDIN_SANITIZER:-}" = refuse ]; then
  echo "========= COMPUTE-SANITIZER"
  echo "========= Error: Device not supported (stand-in compute-sanitizer)"
  echo "error: cudaMalloc: unknown error (999)"
  exit 1
fi
while [ $# -gt 0 ]; do
  case "$1" in
    --tool|--error-exitcode|--target-processes) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors (stand-in compute-sanitizer: nothing checked)"
exit $rc
EOF
  chmod +x "$fake"/*
  export PATH="$fake:$PATH"
fi
train="$build/bin/ditto-train"
tests_bin="$build/bin/ditto_tests"
write_results

# ---- preflight: the GPU, the binaries and their libraries --------------------------------------
command -v nvidia-smi >/dev/null 2>&1 || fatal "no GPU: nvidia-smi not found"
if ! timeout 30 nvidia-smi --format=csv,noheader \
    --query-gpu=index,name,memory.total,driver_version \
    >"$out/logs/gpu.txt" 2>"$out/logs/nvidia-smi.err" || [ ! -s "$out/logs/gpu.txt" ]; then
  fatal "no GPU: nvidia-smi failed: $(head -n 1 "$out/logs/nvidia-smi.err")"
fi
for b in "$train" "$tests_bin"; do
  [ -x "$b" ] || fatal "$b: missing (the build has no such program)"
  missing="$(ldd "$b" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
  [ -z "$missing" ] || fatal "$b: libraries not found: $missing(LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
done
sanitizer=""
[ "$mode" = rehearsal ] && sanitizer="$fake/compute-sanitizer"
for c in "$(command -v compute-sanitizer 2>/dev/null)" \
         "$build/gpu-check-carried/sanitizer/bin/compute-sanitizer" \
         /usr/local/cuda/bin/compute-sanitizer; do
  [ -z "$sanitizer" ] && [ -n "$c" ] && [ -x "$c" ] && { sanitizer="$c"; break; }
done
# The first python3 with torch: its version, CUDA version and whether it sees a GPU (one import).
torch_py="" torch_info="" torch_cuda=no
for p in python3 /usr/bin/python3; do
  command -v "$p" >/dev/null 2>&1 || continue
  torch_info="$(timeout 60 "$p" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda,
                "GPU visible:", torch.cuda.is_available())' 2>/dev/null)" || continue
  torch_py="$(command -v "$p")"
  case "$torch_info" in *"GPU visible: True") torch_cuda=yes ;; esac
  break
done
{
  echo "ditto-train: $train ($("$train" --version 2>/dev/null | head -n 1))"
  echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-(empty)}"
  echo "compute-sanitizer: ${sanitizer:-none}"
  echo "torch: ${torch_py:-none}${torch_info:+ ($torch_info)}"
  echo "budget: $budget s; jobs: $jobs; quick: $quick"
} >"$out/logs/tools.txt"
ngpu="$(grep -c . "$out/logs/gpu.txt")"
# dry_profile_of NAME: the ditto-train --profile of the GPU nvidia-smi names (the speed section's
# dry run prices this card, not another), then a note when the profile is only the nearest one.
dry_profile_of() {
  case "$1" in
    *H200*) echo "h200" ;;
    *H100*PCIe*|*H100*NVL*) echo "h100-sxm (nearest: the profiles have no $1; it overstates it)" ;;
    *H100*) echo "h100-sxm" ;;
    *A100*80GB*) echo "a100-sxm-80gb" ;;
    *A100*) echo "a100-sxm-40gb" ;;
    *) echo "h200 (nearest: the profiles have no $1)" ;;
  esac
}
dry_note="$(dry_profile_of "$(head -n 1 "$out/logs/gpu.txt" | cut -d, -f2 | sed 's/^ *//')")"
dry_profile="${dry_note%% *}"
echo "dry-run profile: $dry_note" >>"$out/logs/tools.txt"
record preflight host PASS "$(elapsed)" "$(head -n 1 "$out/logs/gpu.txt"); dry run: --profile $dry_note"

# ---- 1. the CUDA tests, by name ----------------------------------------------------------------
# A skip is a failure (this machine has a GPU), except the cases that cannot run on one GPU or in
# one determinism mode.
allowed_skips='needs two GPUs|bitwise mode only'
# finished_ms LOG: the milliseconds gtest reports for the tests that finished in LOG.
finished_ms() {
  grep -o '^\[ *\(OK\|FAILED\|SKIPPED\) *\] .* (\([0-9]*\) ms)$' "$1" 2>/dev/null |
    sed 's/.*(\([0-9]*\) ms)$/\1/' | awk '{ s += $1 } END { print s + 0 }'
}
# gtest_step NAME LIMIT FILTER: ditto_tests --gtest_filter=FILTER; PASS when it passed, at least
# one test ran and none skipped but the allowed ones.
gtest_step() {
  local name="$1" limit="$2" filter="$3" f="$3" excluded="" crashed="" try log
  # A test that crashes the process (a first GPU run may) would take the rest with it: up to
  # twice, the crashed test (the last one started) is left out and the rest run again. A test
  # that hangs (the step's time limit ran out while the tests that finished took less than half
  # of it) is left out the same way, once: a slow list is not rerun.
  local hung=0
  for try in 1 2 3; do
    log="$name"; [ $try -gt 1 ] && log="$name-rerun$((try - 1))"
    if ! run_limited "$log" "$limit" "$tests_bin" --gtest_filter="$f" --gtest_color=no; then
      record "$name" cuda SKIPPED 0 "no time left in the budget${crashed:+; crashed:$crashed}"
      return
    fi
    local why
    if [ $step_rc -gt 128 ] && [ $step_rc -lt 160 ] && [ $step_rc -ne 137 ]; then
      why="signal $((step_rc - 128))"
    elif { [ $step_rc -eq 124 ] || [ $step_rc -eq 137 ]; } && [ $hung -eq 0 ] &&
         [ "$(finished_ms "$out/logs/$log.log")" -lt $((step_limit * 500)) ]; then
      why="hung: the ${step_limit} s limit ran out in it"; hung=1
    else
      break
    fi
    local t; t="$(grep '^\[ RUN      \]' "$out/logs/$log.log" | tail -n 1 | awk '{print $4}')"
    [ -n "$t" ] || break
    # The last test started must not have finished (a crash or hang between two tests).
    grep -q "^\[ *\(OK\|FAILED\|SKIPPED\) *\] $t " "$out/logs/$log.log" && break
    crashed="$crashed $t ($why, logs/$log.log)"
    excluded="${excluded:+$excluded:}$t"
    case "$filter" in *-*) f="$filter:$excluded" ;; *) f="$filter-$excluded" ;; esac
  done
  log="$out/logs/$log.log"
  local ran skips bad detail
  ran="$(grep -o '^\[==========\] [0-9]* tests\? from .* ran' "$log" | awk '{print $2}')"
  # Skipped tests and their messages (the lines between [ RUN ] and [  SKIPPED ]).
  skips="$(awk '/^\[ RUN      \]/ { name = $4; msg = ""; next }
                /^\[  SKIPPED \] .*\([0-9]+ ms\)$/ { print name "\t" msg; next }
                /^\[/ { next }
                { sub(/^[^ ]*: Skipped$/, ""); if ($0 != "") msg = msg (msg == "" ? "" : " ") $0 }' \
           "$log")"
  bad="$(printf '%s\n' "$skips" | grep . | grep -vE "$allowed_skips")"
  local nskip nbad; nskip="$(printf '%s\n' "$skips" | grep -c .)"; nbad="$(printf '%s\n' "$bad" | grep -c .)"
  local crash_note="${crashed:+; crashed or hung (left out, the rest rerun):$crashed}"
  if [ $step_rc -eq 0 ] && [ "${ran:-0}" -gt 0 ] && [ "$nbad" -eq 0 ] && [ -z "$crashed" ]; then
    record "$name" cuda PASS "$step_secs" "$ran tests ran, $nskip skipped (allowed: $allowed_skips)"
  elif [ $step_rc -eq 0 ] && [ "$nbad" -gt 0 ]; then
    detail="$(printf '%s\n' "$bad" | head -n 1 | cut -f2 | cut -c1-200)"
    record "$name" cuda FAIL "$step_secs" \
      "${ran:-0} tests ran, $nbad skipped on a GPU machine: $detail$crash_note"
  elif [ $step_rc -eq 0 ] && [ "${ran:-0}" -eq 0 ]; then
    record "$name" cuda FAIL "$step_secs" "no test matched $f"
  elif [ $step_rc -eq 0 ]; then
    record "$name" cuda FAIL "$step_secs" "${ran:-0} tests ran$crash_note"
  else
    local nfail; nfail="$(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$log")"
    record "$name" cuda FAIL "$step_secs" "$nfail failed: $(grep -m1 '^\[  FAILED  \]' "$log" |
      cut -c14- | cut -c1-120); $(why_failed "$log" $step_rc $step_limit)$crash_note"
  fi
}
# Issue 28's defect tests first (tools/gpu-check-tests.txt: one gtest filter a line; '#' starts
# a comment), then every other CUDA test (the listed ones left out, so nothing runs twice).
cuda_filter='*Cuda*:*cuda*'
list="$root/tools/gpu-check-tests.txt"
if [ -f "$list" ]; then
  extra="$(sed 's/#.*//' "$list" | tr -d ' \t' | grep . | paste -sd: -)"
  if [ -n "$extra" ]; then
    gtest_step cuda-tests-listed 90 "$extra"
    cuda_filter="$cuda_filter-$extra"
  else
    record cuda-tests-listed cuda FAIL 0 "$list names no test"
  fi
fi
gtest_step cuda-tests 150 "$cuda_filter"

# ---- 1b. compute-sanitizer memcheck of the kernels, early ----------------------------------------
# Before the checksums and the speed section, which may use up the budget: memcheck over the
# bitwise GEMMs of ragged sizes and the sharded GEMM with empty shards (BackendOps cases, the
# kernels' edges); the other sanitizer runs (whole programs, racecheck) are step 4.
{
  echo "## compute-sanitizer"
  echo
  echo "| run | tool | status | errors (ERROR SUMMARY / RACECHECK SUMMARY) |"
  echo "|---|---|---|---|"
} >"$out/logs/sanitizers.md"
sanitizer_refused=""  # the step where compute-sanitizer refused the device, if it did
san_runs=(
  "gpt-bf16-ddp-2:$train --model gpt --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --max-iters 2 --eval-interval 2 --eval-iters 1 --sample 0 --backend cuda --devices 2 --dtype bf16 --trainer ddp --determinism bitwise"
  "mlp-2:$train --backend cuda --devices 2 --epochs 1 --determinism fast"
  "gemm-ragged-bitwise:$tests_bin --gtest_color=no --gtest_filter=*/gemm_33x17x65_*_cuda_bitwise:*/gemm_130x3x257_*_cuda_bitwise"
  "gemm-sharded-empty-shards:$tests_bin --gtest_color=no --gtest_filter=*/sharded_K64_*_cuda_bitwise"
)
# sanitizer_step TOOL RUN: compute-sanitizer --tool TOOL over RUN ("name:command line") as a step
# of at most 45 s, and its row of the sanitizer table.
sanitizer_step() {
  local tool="$1" r="$2" name log summary_line status
  name="sanitizer-$tool-${r%%:*}"
  if [ -z "$sanitizer" ]; then
    record "$name" cuda SKIPPED 0 "no compute-sanitizer (pack with the toolkit's or the wheel's)"
    return
  fi
  if [ -n "$sanitizer_refused" ]; then  # no use asking again: 45 s a row
    record "$name" cuda SKIPPED 0 "compute-sanitizer refused this device in $sanitizer_refused"
    echo "| ${r%%:*} | $tool | SKIPPED | compute-sanitizer refused the device |" >>"$out/logs/sanitizers.md"
    write_results
    return
  fi
  # shellcheck disable=SC2086  # the command line is split on purpose
  step "$name" cuda 45 "$sanitizer" --tool "$tool" --error-exitcode 99 \
    --target-processes all ${r#*:}
  log="$out/logs/$name.log"
  summary_line="$(grep -oE '(ERROR|RACECHECK) SUMMARY: .*' "$log" | tail -n 1)"
  status=PASS
  [ $step_rc -ne 0 ] && status=FAIL
  # Some hosts' GPUs are not the sanitizer's to instrument: on gVisor compute-sanitizer answers
  # "Device not supported" and the target then fails its first allocation (error 999; seen there,
  # /work/.library/device/KINDS.md). Nothing of ditto's was checked: SKIPPED with that reason,
  # not FAIL, and the later sanitizer rows are not tried.
  if [ $step_rc -ne 0 ] && grep -qi 'device not supported' "$log" 2>/dev/null; then
    status=SKIPPED
    sanitizer_refused="$name"
    sed -i '$d' "$summary"
    record "$name" cuda SKIPPED "$step_secs" \
      "compute-sanitizer refused this device: $(grep -m1 -i 'device not supported' "$log" | cut -c1-120) (gVisor hosts do); ditto's kernels not checked"
    failed=0  # again from the rows left: this step's FAIL row is gone
    awk -F'\t' '$3 == "FAIL"' "$summary" | grep -q . && failed=1
  fi
  # gtest runs under the sanitizer: a skip (no GPU) is a failure as in step 1.
  if [ $step_rc -eq 0 ] && grep -q '^\[  SKIPPED \] .*ms)$' "$log"; then
    status=FAIL
    sed -i '$d' "$summary"
    record "$name" cuda FAIL "$step_secs" \
      "tests skipped: $(grep -m1 -o 'no CUDA device[^|]*' "$log" | cut -c1-160)"
  fi
  echo "| ${r%%:*} | $tool | $status | ${summary_line:-no summary} |" >>"$out/logs/sanitizers.md"
  write_results
}
for r in "${san_runs[@]}"; do
  case "${r%%:*}" in gemm-*) sanitizer_step memcheck "$r" ;; esac
done

# ---- 2. sim = cuda params_checksum -------------------------------------------------------------
final_field() { grep '^final:' "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }
no_device() {  # the first "no CUDA device" line of the given logs, or nothing
  local f
  for f in "$@"; do grep -o 'no CUDA device[^|]*' "$out/logs/$f.log" 2>/dev/null | head -n 1 |
    cut -c1-160 && return; done
}
{
  echo "## ditto-train params_checksum, bitwise, $epochs epochs (digits, MLP 64-128-10)"
  echo
  echo "| backend | devices | params_checksum | val_acc | train_time_s |"
  echo "|---|---|---|---|---|"
} >"$out/logs/checksums.md"
sums=() runs=()
for backend in sim cuda; do
  kind=host; [ $backend = cuda ] && kind=cuda
  for n in 1 8; do
    name="mlp-bitwise-$backend-$n"
    step "$name" $kind 45 "$train" --backend "$backend" --devices "$n" --determinism bitwise \
      --epochs "$epochs"
    log="$out/logs/$name.log"
    c="$(final_field "$log" params_checksum)"
    sums+=("${c:-missing}") runs+=("$name")
    echo "| $backend | $n | ${c:-missing} | $(final_field "$log" val_acc)" \
         "| $(final_field "$log" train_time_s) |" >>"$out/logs/checksums.md"
  done
done
if [ "$(printf '%s\n' "${sums[@]}" | sort -u | wc -l)" -eq 1 ] && [ "${sums[0]}" != missing ]; then
  record mlp-checksums-equal cuda PASS 0 "sim 1/8 and cuda 1/8: ${sums[0]}"
else
  nd="$(no_device "${runs[@]}")"
  record mlp-checksums-equal cuda FAIL 0 "${nd:+$nd; }sim1=${sums[0]} sim8=${sums[1]} cuda1=${sums[2]} cuda8=${sums[3]}"
fi
# Two GPUs or more: ranks on GPUs of their own talk over NCCL (one GPU: the in-GPU transport).
if [ "$ngpu" -ge 2 ]; then
  step "mlp-bitwise-cuda-nccl-$ngpu" cuda 45 "$train" --backend cuda --devices "$ngpu" \
    --determinism bitwise --epochs "$epochs"
  c="$(final_field "$out/logs/mlp-bitwise-cuda-nccl-$ngpu.log" params_checksum)"
  if [ -n "$c" ] && [ "$c" = "${sums[0]}" ]; then
    record "mlp-nccl-$ngpu-checksum" cuda PASS 0 "$c, as sim"
  else
    record "mlp-nccl-$ngpu-checksum" cuda FAIL 0 "${c:-missing}; sim ${sums[0]}"
  fi
fi

# The GPT: a small nanoGPT configuration on the bundled text; bitwise runs must agree on
# params_checksum, every logged loss and the sampled text (one key).
gpt_args=(--model gpt --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --batch-size 8
          --max-iters 20 --eval-interval 10 --eval-iters 2 --warmup-iters 2 --lr-decay-iters 20
          --sample 100)
[ $quick -eq 1 ] &&  # a tenth of the time (the rehearsal runs in CI, under ASan)
  gpt_args=(--model gpt --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4
            --max-iters 2 --eval-interval 1 --eval-iters 1 --warmup-iters 2 --lr-decay-iters 3
            --sample 8)
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
gpt_run() {  # gpt_run NAME BACKEND DEVICES DETERMINISM DROPOUT [MORE OPTIONS]
  local name="$1" be="$2" n="$3" det="$4" drop="$5" kind=host; shift 5
  [ "$be" = cuda ] && kind=cuda
  step "$name" $kind 45 "$train" "${gpt_args[@]}" --backend "$be" --devices "$n" \
    --determinism "$det" --dropout "$drop" "$@"
  local log="$out/logs/$name.log"
  echo "| $name${*:+ ($*)} | $be | $n | $det | $drop | $(gpt_sum "$log") | $(gpt_val "$log") |" \
       "$(gpt_key "$log") |" >>"$out/logs/gpt.md"
}
gpt_equal() {  # gpt_equal NAME RUN...: PASS when the runs have one key
  local name="$1" r k all=() detail=""; shift
  for r in "$@"; do
    k="$(gpt_key "$out/logs/$r.log")"
    all+=("${k:-missing}")
    detail="$detail $r=$(gpt_sum "$out/logs/$r.log")/${k:-missing}"
  done
  if [ "$(printf '%s\n' "${all[@]}" | sort -u | wc -l)" -eq 1 ] && [ "${all[0]}" != missing ]; then
    record "$name" cuda PASS 0 \
      "params_checksum $(gpt_sum "$out/logs/$1.log"), same losses and sample:$(printf ' %s' "$@")"
  else
    local nd; nd="$(no_device "$@")"
    record "$name" cuda FAIL 0 "${nd:+$nd; }checksum/key differ:$detail"
  fi
}
for backend in sim cuda; do
  for n in 1 4; do gpt_run "gpt-bitwise-$backend-$n" "$backend" "$n" bitwise 0; done
done
gpt_equal gpt-bitwise-equal gpt-bitwise-sim-1 gpt-bitwise-sim-4 gpt-bitwise-cuda-1 \
  gpt-bitwise-cuda-4
# Dropout under DDP (its ranks' SPMD all_reduces, each rank's masks at its slice of the global
# batch; bitwise, the bits of DataParallel on one device): the one compared row of plain DDP.
gpt_run gpt-dropout-sim-1 sim 1 bitwise 0.1
gpt_run gpt-dropout-cuda-4 cuda 4 bitwise 0.1 --trainer ddp
gpt_equal gpt-dropout-equal gpt-dropout-sim-1 gpt-dropout-cuda-4
for backend in sim cuda; do
  for n in 1 2; do gpt_run "gpt-bf16-$backend-$n" "$backend" "$n" bitwise 0 --dtype bf16; done
done
gpt_equal gpt-bf16-equal gpt-bf16-sim-1 gpt-bf16-sim-2 gpt-bf16-cuda-1 gpt-bf16-cuda-2
# ZeRO-1 with accumulation (bitwise: the fold, so step() does every reduce_scatter), and without
# (its reduce_scatters on ZeRO's communication stream during the backward: Note [ZeRO overlapped
# reduce_scatter]).
gpt_run gpt-bf16-zero-cuda-2 cuda 2 bitwise 0 --dtype bf16 --trainer ddp --zero-stage 1 \
  --grad-accum-steps 2
gpt_run gpt-bf16-zero-overlap-cuda-2 cuda 2 bitwise 0 --dtype bf16 --trainer ddp --zero-stage 1
gpt_equal gpt-bf16-zero-equal gpt-bf16-sim-1 gpt-bf16-zero-cuda-2 gpt-bf16-zero-overlap-cuda-2
# f16: GradScaler's unscale_ (sum_squares_multi and scale_multi on CUDA) on MasterWeights' f32
# copies (one device) and on ZeRO's shard, and a checkpoint of GPU tensors: ZeRO-1 run to half the
# iterations with --checkpoint, then --resume to the end; the resumed run's params_checksum must
# be the simulator's uninterrupted one.
half_iters=10
[ $quick -eq 1 ] && half_iters=1
rm -rf "$out/ckpt-f16"
gpt_run gpt-f16-sim-1 sim 1 bitwise 0 --dtype f16
# (and gradient accumulation outside ZeRO: 2 micro-steps, the same bits in bitwise mode)
gpt_run gpt-f16-cuda-1 cuda 1 bitwise 0 --dtype f16 --grad-accum-steps 2
gpt_equal gpt-f16-equal gpt-f16-sim-1 gpt-f16-cuda-1
gpt_run gpt-f16-zero-ckpt-cuda-2 cuda 2 bitwise 0 --dtype f16 --trainer ddp --zero-stage 1 \
  --max-iters "$half_iters" --checkpoint "$out/ckpt-f16"
gpt_run gpt-f16-zero-resume-cuda-2 cuda 2 bitwise 0 --dtype f16 --trainer ddp --zero-stage 1 \
  --resume "$out/ckpt-f16"
a="$(gpt_sum "$out/logs/gpt-f16-sim-1.log")" b="$(gpt_sum "$out/logs/gpt-f16-zero-resume-cuda-2.log")"
if [ -n "$a" ] && [ "$a" = "$b" ] && grep -q 'resumed from' "$out/logs/gpt-f16-zero-resume-cuda-2.log"; then
  record gpt-f16-resume-equal cuda PASS 0 "params_checksum $a: sim uninterrupted = cuda resumed at $half_iters"
else
  nd="$(no_device gpt-f16-zero-ckpt-cuda-2 gpt-f16-zero-resume-cuda-2)"
  record gpt-f16-resume-equal cuda FAIL 0 "${nd:+$nd; }sim ${a:-missing}, cuda resumed ${b:-missing}"
fi
for backend in sim cuda; do gpt_run "gpt-fast-$backend-4" "$backend" 4 fast 0; done
a="$(gpt_val "$out/logs/gpt-fast-sim-4.log")" b="$(gpt_val "$out/logs/gpt-fast-cuda-4.log")"
if [ -n "$a" ] && [ -n "$b" ] &&
   awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d <= 0.01 && d >= -0.01) }'; then
  record gpt-fast-loss cuda PASS 0 "val loss sim $a, cuda $b (within 0.01)"
else
  nd="$(no_device gpt-fast-cuda-4)"
  record gpt-fast-loss cuda FAIL 0 "${nd:+$nd; }val loss sim ${a:-missing}, cuda ${b:-missing}"
fi

# ---- 3. speed beside PyTorch (tools/gpu-check/speed.sh) ----------------------------------------
. "$root/tools/gpu-check/speed.sh"

# ---- 4. compute-sanitizer: memcheck and racecheck over the rest of the short runs ---------------
# (the kernels' memcheck ran before step 2: sanitizer_step)
for tool in memcheck racecheck; do
  for r in "${san_runs[@]}"; do
    case "$tool:${r%%:*}" in memcheck:gemm-*) continue ;; esac  # done early
    sanitizer_step "$tool" "$r"
  done
done

# ---- 5. the rest of the suite, in the time left ------------------------------------------------
if [ "$mode" = rehearsal ]; then
  # The rehearsal runs inside ctest: listing the suite proves the call, running it would nest.
  if command -v ctest >/dev/null 2>&1; then
    n="$(ctest --test-dir "$build" -N -E 'Cuda|cuda' 2>/dev/null | grep -o 'Total Tests: [0-9]*')"
    record rest-of-suite host PASS 0 "rehearsal: listed, not run (${n:-no count})"
  else
    record rest-of-suite host SKIPPED 0 "no ctest here"
  fi
elif [ "$(remaining)" -gt 20 ]; then
  if command -v ctest >/dev/null 2>&1; then
    step rest-of-suite host "$(( $(remaining) - 10 ))" ctest --test-dir "$build" -j "$jobs" \
      -E 'Cuda|cuda|^Install\.' --timeout 120 --output-on-failure
    total="$(grep -E 'tests passed|tests failed' "$out/logs/rest-of-suite.log" | tail -n 1)"
    [ -n "$total" ] && { sed -i '$d' "$summary"; record rest-of-suite host \
      "$([ $step_rc -eq 0 ] && echo PASS || echo FAIL)" "$step_secs" "$total"; }
  else
    step rest-of-suite host "$(( $(remaining) - 10 ))" "$tests_bin" --gtest_color=no \
      --gtest_brief=1 --gtest_filter="-$cuda_filter"
  fi
else
  record rest-of-suite host SKIPPED 0 "no time left in the budget"
fi

# ---- verdict -----------------------------------------------------------------------------------
if [ "$mode" = rehearsal ]; then
  # Passes when every CUDA step failed with the clean "no CUDA device" error (no crash, no
  # timeout) and every other step passed or was skipped for want of a tool.
  bad="$(awk -F'\t' '($2 == "cuda" && !($3 == "FAIL" && $5 ~ /no CUDA device/) &&
                      !($3 == "SKIPPED" && $5 ~ /compute-sanitizer refused this device/)) ||
                     ($2 == "host" && $3 == "FAIL") || $5 ~ /no time left/ {
                       print $1 ": " $3 " " $5 }' "$summary")"
  ncuda="$(awk -F'\t' '$2 == "cuda" && $3 == "FAIL"' "$summary" | grep -c .)"
  nhost="$(awk -F'\t' '$2 == "host" && $3 == "PASS"' "$summary" | grep -c .)"
  # ... and results.md has its tables.
  for header in '| step | kind | status | seconds | detail |' '| config | B x T | PyTorch |' \
                '| backend | devices | params_checksum |' '| run | tool | status |'; do
    grep -qF "$header" "$results" || bad="${bad:+$bad; }results.md has no table '$header'"
  done
  if [ -z "$bad" ] && [ "$ncuda" -gt 0 ]; then
    verdict="rehearsal: PASS: $ncuda CUDA steps failed with the clean 'no CUDA device' error, $nhost other steps passed, in $(elapsed) s."
    write_results "$verdict"
    echo "gpu-check: $verdict $results"
    exit 0
  fi
  verdict="rehearsal: FAIL: $(printf '%s\n' "${bad:-no CUDA step ran}" | head -n 5 | tr '\n' ';')"
  write_results "$verdict"
  echo "gpu-check: $verdict $results" >&2
  exit 1
fi
verdict="Every check passed."
[ $failed -eq 0 ] || verdict="Some checks FAILED: see the table."
write_results "$verdict"
echo "gpu-check: done in $(elapsed) s. $verdict $results"
exit $failed
