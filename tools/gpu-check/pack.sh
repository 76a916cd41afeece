# gpu-check --pack (sourced by tools/gpu-check.sh, which has parsed the options): on this (CPU)
# machine, configure and build the CUDA backend in a build folder of its own, then pack it with
# compute-sanitizer and libcudart into gpu-carry/ (tools/gpu-check.sh's header says what and why).
# shellcheck shell=bash
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
  run(command='bash tools/gpu-check.sh --run --results "\$OUT"', carry=["$carry_rel"], timeout_s=560)
EOF
