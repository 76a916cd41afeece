# Rewrites a kernel file of backend_cuda/ (cuda_kernels.cu, cuda_gemm.cu, cuda_kernels_gpt.cu, cuda_fused.cu,
# the .cuh)
# into host C++ for the CPU emulator (tools/cuda_emu/CMakeLists.txt runs it at build time): CUDA
# includes -> emu.h, kernel<<<grid, block, smem, stream>>>(args) -> emu_launch(kernel, grid, block,
# args), and namespace ditto::cuda -> ditto::cuda_emu, so the emulated kernels and emu.h's stubs
# never share a symbol with the real CUDA backend that a CUDA build links into the same program.
# Usage: extract.py IN.cu OUT.cpp
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r'\bnamespace ditto::cuda\b', 'namespace ditto::cuda_emu', src)
src = re.sub(r'(?<![\w:])(ditto::)?cuda::', lambda m: (m.group(1) or '') + 'cuda_emu::', src)
# convert<To> (core/numerics/float_formats.h) as nvcc compiles it: emu.h's emu_gpu_convert models
# the GPU's cvt between f64 and f32, which returns the canonical NaN (Note [CUDA NaN casts]).
src = re.sub(r'(?<![\w:])convert<', 'emu_gpu_convert<', src)
src = re.sub(r'#include <cublas_v2.h>\n#include <cuda_runtime.h>\n', '#include "emu.h"\n', src)
src = re.sub(r'#include <cuda_runtime.h>\n', '#include "emu.h"\n', src)
for h in ['backend_cuda/cuda_backend.h', 'backend_cuda/cuda_check.h', 'backend_cuda/cuda_stream.h',
          'backend_cuda/cublas_lazy.h', 'backend_cuda/cuda_blaslt.h']:
    src = src.replace('#include "%s"\n' % h, '')
# Note [Unroll pragmas in the emulator]: `#pragma unroll` means nothing to GCC, but Clang (the
# check build, CI) unrolls as told, and the unrolled fiber kernels under ASan + UBSan at -O1 took
# minutes to compile (cuda_gemm_emu.cpp: 99 s of CPU and a 7.9 MB object; 6 s and 1 MB without
# the pragmas). Unrolling changes no arithmetic, which is what the emulator checks; the line
# stays, as a comment, so that line numbers match the .cu.
src = re.sub(r'^([ \t]*)#pragma unroll\b.*$', r'\1// (#pragma unroll: dropped for the host)', src,
             flags=re.M)
# Note [Grid-constant parameters in the emulator]: a `const __grid_constant__ T name` kernel
# parameter is, on the GPU, one read-only object in the launch's parameter space that every thread
# reads in place (its address is the same for all). Passed by value to each emulated thread, it
# was copied once per thread: the multi-tensor kernels' tables are up to several KB, and those
# copies (memmove plus ASan's checks of them) were 40% of `cuda_emu_test fused` under ASan. The
# emulator passes it as `const T&` to the launch's one argument instead, which is what the
# qualifier means; a kernel that wrote to it would not compile on either side.
src = re.sub(r'\bconst\s+__grid_constant__\s+([A-Za-z_]\w*(?:\s*<[^<>()]*>)?)\s+([A-Za-z_]\w*)',
             r'const \1& \2', src)
out = []; i = 0
while True:
    j = src.find('<<<', i)
    if j < 0: out.append(src[i:]); break
    # kernel name: scan back to start of expression (after whitespace/newline/'(' )
    k = j
    depth = 0
    while k > 0:
        c = src[k-1]
        if c == '>': depth += 1
        elif c == '<': depth -= 1
        if depth == 0 and (c.isspace() or c in ';{}'):
            break
        k -= 1
    name = src[k:j]
    e = src.find('>>>', j)
    cfg = src[j+3:e]
    # parse args with paren matching
    assert src[e+3] == '(' , src[e:e+20]
    p = e+4; d = 1
    while d:
        if src[p] == '(': d += 1
        elif src[p] == ')': d -= 1
        p += 1
    args = src[e+4:p-1]
    parts = []; d = 0; cur = ''
    for ch in cfg:
        if ch in '([<': d += 1
        if ch in ')]>': d -= 1
        if ch == ',' and d == 0: parts.append(cur); cur = ''
        else: cur += ch
    parts.append(cur)
    out.append(src[i:k])
    out.append('emu_launch(%s, dim3(%s), dim3(%s), %s)' % (name, parts[0].strip(), parts[1].strip(), args))
    i = p
open(sys.argv[2], 'w').write(''.join(out))
