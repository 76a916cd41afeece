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
#   tools/gpu-check.sh --run [--out DIR] [--budget S] [--jobs N] [--epochs N]
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
#      is a failure, except a case that needs two GPUs or one mode only;
#   2. sim = cuda params_checksum: the MLP on 1 and 8 devices bitwise; the GPT (f32 on 1 and 4
#      devices, with dropout, bf16 on 1 and 2, bf16 ddp with ZeRO-1 and 2 micro-steps; fast-mode
#      loss within 0.01); logical devices share the GPU where there is one;
#   3. speed beside PyTorch on the same GPU: bench/torch_gpu_bench.py (nanoGPT's char config in
#      f32, TF32 and bf16; GPT-2 124M in bf16), ditto-train --backend cuda on the same
#      configurations in fast and bitwise mode, and the dry run's prediction (--profile h200);
#   4. compute-sanitizer --tool memcheck and --tool racecheck over short runs: a tiny GPT on 2
#      devices bf16 ddp, the MLP, the bitwise GEMMs of ragged sizes and the sharded GEMM with
#      empty shards (BackendOps cases);
#   5. the rest of the suite (ctest without the CUDA tests and Install.*, which needs a compiler)
#      in the time left.
#
# Other options: --out DIR (default gpu-check-out/; on the device use "$OUT/gpu-check"),
# --carry DIR (default gpu-carry/), --speed-steps N / --speed-warmup N (default 10 / 3),
# --quick (tiny sizes; --rehearsal sets it). Exit status: 0 when every check passed (a rehearsal:
# when it passed), 1 when one failed, 2 when the machine cannot run the check.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
mode="" build="" carry="$root/gpu-carry" out="" arch=90 jobs="$(nproc 2>/dev/null || echo 4)"
budget=480 epochs=20 quick=0 sanitizer_wheel="" speed_steps=10 speed_warmup=3
usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) mode=pack; shift ;;
    --run) mode=run; shift ;;
    --rehearsal) mode=rehearsal; quick=1; shift ;;
    --build) build="$2"; shift 2 ;;
    --carry) carry="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
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
  build="${build:-$root/build-gpu}"
  mkdir -p "$build" "$carry" || exit 2
  build="$(cd "$build" && pwd)" carry="$(cd "$carry" && pwd)"
  case "$build/" in "$root"/*) ;; *)
    echo "gpu-check: --pack: --build $build: expected a folder inside $root (it travels with" \
         "the tree)" >&2; exit 2 ;;
  esac
  case "$carry/" in "$root"/*) ;; *)
    echo "gpu-check: --pack: --carry $carry: expected a folder inside $root" >&2; exit 2 ;;
  esac
  build_rel="${build#"$root"/}" carry_rel="${carry#"$root"/}"
  t0=$(date +%s)
  launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  gen=()
  command -v ninja >/dev/null 2>&1 && [ ! -f "$build/Makefile" ] && gen=(-G Ninja)
  # What the GPU machine has: sm_90, an unknown CPU (no -march=native), no MPI, no OpenBLAS, a C++
  # runtime of unknown age (libstdc++ and libgcc linked in).
  flags=(-DCMAKE_BUILD_TYPE=Release -DDITTO_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
         -DDITTO_MARCH_NATIVE=OFF -DDITTO_WITH_MPI=OFF -DDITTO_WITH_OPENBLAS=OFF
         "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc")
  echo "gpu-check: --pack: configure $build"
  cmake -S "$root" -B "$build" "${gen[@]}" "${flags[@]}" "${launcher[@]}" >"$build/gpu-check-configure.log" 2>&1 ||
    { tail -n 20 "$build/gpu-check-configure.log" >&2; echo "gpu-check: --pack: configure failed" \
        "($build/gpu-check-configure.log)" >&2; exit 1; }
  echo "gpu-check: --pack: build ($jobs jobs)"
  cmake --build "$build" -j "$jobs" >"$build/gpu-check-build.log" 2>&1 ||
    { tail -n 30 "$build/gpu-check-build.log" >&2; echo "gpu-check: --pack: build failed" \
        "($build/gpu-check-build.log)" >&2; exit 1; }
  t_built=$(date +%s)
  # compute-sanitizer for step 4: the toolkit's, else the wheel's (pip download, cached).
  san_dir=""
  nvcc_dir="$(dirname "$(grep '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)")"
  if [ -x "$nvcc_dir/compute-sanitizer" ]; then
    san_dir="$(cd "$nvcc_dir/.." && pwd)"
  else
    cache="$build-cache"
    if [ -z "$sanitizer_wheel" ]; then
      sanitizer_wheel="$(ls "$cache"/nvidia_cuda_sanitizer_api-*.whl 2>/dev/null | head -n 1)"
      if [ -z "$sanitizer_wheel" ] && command -v pip >/dev/null 2>&1; then
        cuda_major="$(grep -o 'release [0-9]*' <("$nvcc_dir/nvcc" --version) | awk '{print $2}')"
        mkdir -p "$cache"
        timeout 120 pip download -q --no-deps -d "$cache" \
          "nvidia-cuda-sanitizer-api==${cuda_major:-13}.0.*" >"$cache/pip.log" 2>&1 || true
        sanitizer_wheel="$(ls "$cache"/nvidia_cuda_sanitizer_api-*.whl 2>/dev/null | head -n 1)"
      fi
    fi
    if [ -n "$sanitizer_wheel" ]; then
      rm -rf "$cache/wheel" && mkdir -p "$cache/wheel" &&
        python3 -m zipfile -e "$sanitizer_wheel" "$cache/wheel" &&
        san_dir="$(dirname "$(dirname "$(find "$cache/wheel" -name compute-sanitizer -type f |
                                          head -n 1)")")"
    fi
  fi
  rm -rf "$build/gpu-check-carried" && mkdir -p "$build/gpu-check-carried/lib"
  if [ -n "$san_dir" ] && [ -f "$san_dir/bin/compute-sanitizer" ]; then
    mkdir -p "$build/gpu-check-carried/sanitizer"
    cp -a "$san_dir/bin" "$build/gpu-check-carried/sanitizer/" 2>/dev/null
    mkdir -p "$build/gpu-check-carried/sanitizer/lib"
    cp -a "$san_dir"/lib/libsanitizer* "$san_dir"/lib/libInterceptor* "$san_dir"/lib/libTree* \
      "$build/gpu-check-carried/sanitizer/lib/" 2>/dev/null
    chmod +x "$build/gpu-check-carried/sanitizer/bin/compute-sanitizer"
  else
    echo "gpu-check: --pack: note: no compute-sanitizer (toolkit or wheel): step 4 will say so" >&2
  fi
  # The CUDA runtime this build linked (a fallback after python3's nvidia packages there).
  cudart="$(ldd "$build/bin/ditto-train" | awk '/libcudart/ {print $3}')"
  [ -n "$cudart" ] && cp -L "$cudart" "$build/gpu-check-carried/lib/"
  needed="$(readelf -d "$build/bin/ditto-train" "$build/bin/ditto_tests" 2>/dev/null |
            grep -o 'NEEDED.*\[.*\]' | grep -o '\[.*\]' | tr -d '[]' | sort -u | tr '\n' ' ')"
  commit="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  dirty=no
  git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && dirty=yes
  echo "gpu-check: --pack: pack $build_rel into $carry_rel/$archive_name"
  rm -f "$carry/$archive_name"
  tar -C "$root" --exclude='*.o' --exclude='*.a' --exclude='CMakeFiles' --exclude='Testing' \
      --exclude='.ninja_deps' --exclude='.ninja_log' --exclude='*.log' \
      --exclude='gpu-check-rehearsal' --exclude='torch_gpu_bench_smoke' -cf - "$build_rel" |
    xz -9 -T "$jobs" >"$carry/$archive_name" || { echo "gpu-check: --pack: tar failed" >&2; exit 1; }
  bytes=$(stat -c %s "$carry/$archive_name")
  unpacked=$(xz -dc "$carry/$archive_name" | wc -c)
  t1=$(date +%s)
  {
    echo "source_dir=$root"
    echo "build_dir=$build"
    echo "build_rel=$build_rel"
    echo "commit=$commit"
    echo "dirty=$dirty"
    echo "packed=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "flags=${flags[*]}"
    echo "nvcc=$(grep -o 'release [0-9.]*' <("$nvcc_dir/nvcc" --version))"
    echo "nccl=$(grep -E '^NCCL_LIBRARY:' "$build/CMakeCache.txt" | cut -d= -f2)"
    echo "needed=$needed"
    echo "compute_sanitizer=$([ -d "$build/gpu-check-carried/sanitizer" ] && echo carried || echo none)"
    echo "archive=$archive_name"
    echo "archive_bytes=$bytes"
    echo "unpacked_bytes=$unpacked"
    echo "sha256=$(sha256sum "$carry/$archive_name" | cut -d' ' -f1)"
    echo "build_s=$((t_built - t0)) pack_s=$((t1 - t_built))"
  } >"$carry/manifest.txt"
  mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
  echo "gpu-check: --pack: $carry_rel/$archive_name: $mib MiB ($bytes bytes; unpacked" \
       "$((unpacked / 1048576)) MiB); build $((t_built - t0)) s, pack $((t1 - t_built)) s"
  if [ "$bytes" -ge $((64 * 1048576)) ]; then
    echo "gpu-check: --pack: error: the archive is over the 64 MiB a device run carries" >&2
    exit 1
  fi
  cat <<EOF
gpu-check: --pack: done. On the GPU machine (the device tool; gpu-carry/ is git-ignored, so carry it):
  run(command='bash tools/gpu-check.sh --run --out "\$OUT/gpu-check"', carry=["$carry_rel"], timeout_s=560)
EOF
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
summary="$out/logs/summary.tsv"
: >"$summary"
rm -f "$out"/logs/*.md
failed=0
[ $quick -eq 1 ] && { epochs=1; speed_steps=1; speed_warmup=1; }

elapsed() { echo $(( $(date +%s) - start )); }
remaining() { echo $(( budget - $(elapsed) )); }

# write_results [note]: results.md from what has run so far (rewritten after every step).
write_results() {
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
    echo "Raw logs: logs/ (one file per step)."
  } >"$results.tmp" && mv "$results.tmp" "$results"
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
  # Stand-ins first on PATH: nvidia-smi prints one fake GPU; compute-sanitizer (a real one stops
  # before its target starts when there is no driver) runs its target and reports no error, so
  # step 4's plumbing runs too.
  fake="$out/rehearsal-bin"
  mkdir -p "$fake"
  cat >"$fake/nvidia-smi" <<'EOF'
#!/bin/sh
# gpu-check --rehearsal: a stand-in for nvidia-smi (there is no GPU here).
echo "0, NVIDIA H200 (stand-in: gpu-check rehearsal, no GPU), 143771 MiB, 000.00.00"
EOF
  cat >"$fake/compute-sanitizer" <<'EOF'
#!/bin/sh
# gpu-check --rehearsal: a stand-in for compute-sanitizer: skips its options, runs the target.
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
record preflight host PASS "$(elapsed)" "$(head -n 1 "$out/logs/gpu.txt")"

# ---- 1. the CUDA tests, by name ----------------------------------------------------------------
# A skip is a failure (this machine has a GPU), except the cases that cannot run on one GPU or in
# one determinism mode.
allowed_skips='needs two GPUs|bitwise mode only'
# gtest_step NAME LIMIT FILTER: ditto_tests --gtest_filter=FILTER; PASS when it passed, at least
# one test ran and none skipped but the allowed ones.
gtest_step() {
  local name="$1" limit="$2" filter="$3" f="$3" excluded="" crashed="" try log
  # A test that crashes the process (a first GPU run may) would take the rest with it: up to
  # twice, the crashed test (the last one started) is left out and the rest run again.
  for try in 1 2 3; do
    log="$name"; [ $try -gt 1 ] && log="$name-rerun$((try - 1))"
    if ! run_limited "$log" "$limit" "$tests_bin" --gtest_filter="$f" --gtest_color=no; then
      record "$name" cuda SKIPPED 0 "no time left in the budget${crashed:+; crashed:$crashed}"
      return
    fi
    [ $step_rc -gt 128 ] && [ $step_rc -lt 160 ] && [ $step_rc -ne 137 ] || break
    local t; t="$(grep '^\[ RUN      \]' "$out/logs/$log.log" | tail -n 1 | awk '{print $4}')"
    [ -n "$t" ] || break
    crashed="$crashed $t (signal $((step_rc - 128)), logs/$log.log)"
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
  local crash_note="${crashed:+; crashed (left out, the rest rerun):$crashed}"
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
gpt_run gpt-dropout-sim-1 sim 1 bitwise 0.1
gpt_run gpt-dropout-cuda-4 cuda 4 bitwise 0.1
gpt_equal gpt-dropout-equal gpt-dropout-sim-1 gpt-dropout-cuda-4
for backend in sim cuda; do
  for n in 1 2; do gpt_run "gpt-bf16-$backend-$n" "$backend" "$n" bitwise 0 --dtype bf16; done
done
gpt_equal gpt-bf16-equal gpt-bf16-sim-1 gpt-bf16-sim-2 gpt-bf16-cuda-1 gpt-bf16-cuda-2
gpt_run gpt-bf16-zero-cuda-2 cuda 2 bitwise 0 --dtype bf16 --trainer ddp --zero-stage 1 \
  --grad-accum-steps 2
gpt_equal gpt-bf16-zero-equal gpt-bf16-sim-1 gpt-bf16-zero-cuda-2
for backend in sim cuda; do gpt_run "gpt-fast-$backend-4" "$backend" 4 fast 0; done
a="$(gpt_val "$out/logs/gpt-fast-sim-4.log")" b="$(gpt_val "$out/logs/gpt-fast-cuda-4.log")"
if [ -n "$a" ] && [ -n "$b" ] &&
   awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d <= 0.01 && d >= -0.01) }'; then
  record gpt-fast-loss cuda PASS 0 "val loss sim $a, cuda $b (within 0.01)"
else
  nd="$(no_device gpt-fast-cuda-4)"
  record gpt-fast-loss cuda FAIL 0 "${nd:+$nd; }val loss sim ${a:-missing}, cuda ${b:-missing}"
fi

# ---- 3. speed beside PyTorch -------------------------------------------------------------------
# Configurations: name, ditto-train options, dtype, B x T. char-tf32 runs ditto's fast mode with
# --allow-tf32 (bitwise mode never uses TF32: n/a); gpt2-f32 is the strict-f32 baseline of the
# bitwise goal (issue 29: bitwise >= 0.5x PyTorch strict f32 on both models), so ditto runs it in
# bitwise mode only.
char_opts=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64)
gpt2_opts=(--preset gpt2 --batch-size 8)
speed_configs=(char-f32 char-tf32 char-bf16 gpt2-f32 gpt2-bf16)
torch_steps=20
[ $quick -eq 1 ] && torch_steps=1
declare -A sp  # sp[config:column] = value
speed_opts() {  # the ditto-train options of a configuration
  case "$1" in
    char-f32) echo "${char_opts[*]} --dtype f32" ;;
    char-tf32) echo "${char_opts[*]} --dtype f32 --allow-tf32" ;;
    char-bf16) echo "${char_opts[*]} --dtype bf16" ;;
    gpt2-f32) echo "${gpt2_opts[*]} --dtype f32" ;;
    gpt2-bf16) echo "${gpt2_opts[*]} --dtype bf16" ;;
  esac
}
speed_modes() {  # the determinism modes ditto runs a configuration in
  case "$1" in
    char-tf32) echo fast ;;
    gpt2-f32) echo bitwise ;;
    *) echo fast bitwise ;;
  esac
}
ratio_of() {  # a / b with two decimals when both are numbers, else empty
  if [[ "$1" =~ ^[0-9.]+$ && "$2" =~ ^[0-9.]+$ ]]; then
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b }'
  fi
}
write_speed() {
  {
    echo "## Speed: tokens/s on the GPT of ditto-train --model gpt, one GPU"
    echo
    echo "PyTorch: bench/torch_gpu_bench.py (eager, F.scaled_dot_product_attention, fused AdamW),"
    echo "B x T / the median step time of $torch_steps steps after 5 of warm-up." \
         "ditto: ditto-train --backend cuda --devices 1: B x T x $speed_steps / the time of" \
         "$speed_steps steps after $speed_warmup of warm-up (its tokens/s line). Dry run: ditto-train" \
         "--backend sim --dry-run --profile h200 (the cost model's prediction, not a run)."
    echo "Issue 29's goals: fast / PyTorch >= 0.9 (gpt2-bf16), >= 1.0 (char-f32, char-bf16);"
    echo "bitwise / PyTorch strict f32 >= 0.5 (char-f32, gpt2-f32); dry run / measured within 0.75-1.25."
    echo
    echo "| config | B x T | PyTorch | ditto fast | ditto bitwise | dry run fast | dry run bitwise |" \
         "fast / PyTorch | bitwise / PyTorch f32 | dry / measured fast | dry / measured bitwise |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    local c bt f32
    for c in "${speed_configs[@]}"; do
      case "$c" in char-*) bt="64 x 256"; f32=char-f32 ;; *) bt="8 x 1024"; f32=gpt2-f32 ;; esac
      echo "| $c | $bt | ${sp[$c:torch]:-} | ${sp[$c:fast]:-} | ${sp[$c:bitwise]:-} |" \
           "${sp[$c:dry-fast]:-} | ${sp[$c:dry-bitwise]:-} |" \
           "$(ratio_of "${sp[$c:fast]:-}" "${sp[$c:torch]:-}") |" \
           "$(ratio_of "${sp[$c:bitwise]:-}" "${sp[$f32:torch]:-}") |" \
           "$(ratio_of "${sp[$c:dry-fast]:-}" "${sp[$c:fast]:-}") |" \
           "$(ratio_of "${sp[$c:dry-bitwise]:-}" "${sp[$c:bitwise]:-}") |"
    done
  } >"$out/logs/speed.md"
}
for c in "${speed_configs[@]}"; do
  case " $(speed_modes "$c") " in *" fast "*) ;; *) sp[$c:fast]="n/a"; sp[$c:dry-fast]="n/a" ;; esac
  case " $(speed_modes "$c") " in *" bitwise "*) ;; *) sp[$c:bitwise]="n/a"; sp[$c:dry-bitwise]="n/a" ;; esac
done
write_speed
# PyTorch first, all four configurations in one process (its start-up paid once).
if [ -z "$torch_py" ]; then
  record speed-torch host SKIPPED 0 "no python3 with torch here"
  for c in "${speed_configs[@]}"; do sp[$c:torch]="skipped: no torch"; done
elif [ $torch_cuda = no ]; then
  record speed-torch host SKIPPED 0 "$torch_py's torch sees no CUDA device"
  for c in "${speed_configs[@]}"; do sp[$c:torch]="skipped: torch without CUDA"; done
else
  step speed-torch host 150 "$torch_py" "$root/bench/torch_gpu_bench.py" --device cuda \
    --steps "$torch_steps" --warmup 5 \
    --json "$out/logs/torch.json" --markdown "$out/logs/torch.md"
  if [ -f "$out/logs/torch.json" ]; then
    while read -r c v; do sp[$c:torch]="$v"; done < <("$torch_py" -c '
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["config"], "%.0f" % r["tokens_per_s"] if "tokens_per_s" in r else "failed")' \
      "$out/logs/torch.json")
  fi
fi
write_speed
# ditto: the dry run's prediction, then the run, fast and bitwise. Tokens/s of the run: the
# ditto-train evaluation line after the timed steps (evaluations at the warm-up's end and at the
# end; the clock skips them).
speed_iters=$((speed_warmup + speed_steps))
eval_every=$speed_warmup
[ "$eval_every" -ge 1 ] || eval_every=$speed_iters
for c in "${speed_configs[@]}"; do
  # shellcheck disable=SC2207  # the options are words
  opts=($(speed_opts "$c"))
  for det in $(speed_modes "$c"); do
    name="speed-dry-$c-$det"
    step "$name" host 30 "$train" --model gpt "${opts[@]}" --backend sim --devices 1 \
      --dry-run --profile h200 --determinism "$det" --max-iters 2 --eval-iters 0 --sample 0
    v="$(grep -o 'predicted GPT: [0-9]* tokens/s' "$out/logs/$name.log" | awk '{print $3}')"
    sp[$c:dry-$det]="${v:-failed}"
    write_speed
    name="speed-ditto-$c-$det"
    step "$name" cuda 60 "$train" --model gpt "${opts[@]}" --backend cuda --devices 1 \
      --determinism "$det" --max-iters "$speed_iters" --eval-interval "$eval_every" \
      --eval-iters 1 --warmup-iters 0 --lr-decay-iters $((speed_iters + 1)) --sample 0
    v="$(grep -o '[0-9]* tokens/s' "$out/logs/$name.log" | tail -n 1 | awk '{print $1}')"
    if [ -n "$v" ] && grep -q '^final:' "$out/logs/$name.log"; then
      sp[$c:$det]="$v"
    elif grep -q 'no CUDA device' "$out/logs/$name.log"; then
      sp[$c:$det]="no CUDA device"
    elif [ $step_rc -eq 124 ] || [ $step_rc -eq 137 ]; then
      sp[$c:$det]="timed out (${step_limit} s)"
    else
      sp[$c:$det]="failed (logs/$name.log)"
    fi
    write_speed
  done
done

# ---- 4. compute-sanitizer: memcheck and racecheck over short runs -------------------------------
{
  echo "## compute-sanitizer"
  echo
  echo "| run | tool | status | errors (ERROR SUMMARY / RACECHECK SUMMARY) |"
  echo "|---|---|---|---|"
} >"$out/logs/sanitizers.md"
san_runs=(
  "gpt-bf16-ddp-2:$train --model gpt --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --max-iters 2 --eval-interval 2 --eval-iters 1 --sample 0 --backend cuda --devices 2 --dtype bf16 --trainer ddp --determinism bitwise"
  "mlp-2:$train --backend cuda --devices 2 --epochs 1 --determinism fast"
  "gemm-ragged-bitwise:$tests_bin --gtest_color=no --gtest_filter=*/gemm_33x17x65_*_cuda_bitwise:*/gemm_130x3x257_*_cuda_bitwise"
  "gemm-sharded-empty-shards:$tests_bin --gtest_color=no --gtest_filter=*/sharded_K64_*_cuda_bitwise"
)
for tool in memcheck racecheck; do
  for r in "${san_runs[@]}"; do
    name="sanitizer-$tool-${r%%:*}"
    if [ -z "$sanitizer" ]; then
      record "$name" cuda SKIPPED 0 "no compute-sanitizer (pack with the toolkit's or the wheel's)"
      continue
    fi
    # shellcheck disable=SC2086  # the command line is split on purpose
    step "$name" cuda 45 "$sanitizer" --tool "$tool" --error-exitcode 99 \
      --target-processes all ${r#*:}
    log="$out/logs/$name.log"
    summary_line="$(grep -oE '(ERROR|RACECHECK) SUMMARY: .*' "$log" | tail -n 1)"
    status=PASS
    [ $step_rc -ne 0 ] && status=FAIL
    # gtest runs under the sanitizer: a skip (no GPU) is a failure as in step 1.
    if [ $step_rc -eq 0 ] && grep -q '^\[  SKIPPED \] .*ms)$' "$log"; then
      status=FAIL
      sed -i '$d' "$summary"
      record "$name" cuda FAIL "$step_secs" \
        "tests skipped: $(grep -m1 -o 'no CUDA device[^|]*' "$log" | cut -c1-160)"
    fi
    echo "| ${r%%:*} | $tool | $status | ${summary_line:-no summary} |" >>"$out/logs/sanitizers.md"
    write_results
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
  bad="$(awk -F'\t' '($2 == "cuda" && !($3 == "FAIL" && $5 ~ /no CUDA device/)) ||
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
