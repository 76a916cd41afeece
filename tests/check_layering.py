#!/usr/bin/env python3
"""Checks the layering rules of Note [Layering] (CMakeLists.txt) on the source tree, one rule per
ctest (Layering.<Check>):

  CoreIncludesNoBackend      core/ includes nothing from backend_sim/ or backend_cuda/
  CoreFloorOrder             core's folders stand on the floors of CORE_FLOORS (Note [Floors]):
                             no file includes a header of a folder on its own floor or above, and
                             every folder of core/ has a floor
  BackendsIndependent        backend_sim/ and backend_cuda/ never include each other
  InstalledHeadersArePublic  every "..." include of an installed header is itself installed (so
                             none includes core/backend_api/ or a backend-internal header); the
                             installed list is the build's public_headers.txt (Note [Public
                             headers], cmake/ditto_install.cmake)
  NamedHeadersAreInstalled   every header named in the user-facing docs (README.md, docs/api.md)
                             or in the text of an installed header (not its includes: the check
                             above) is installed, unless INTERNAL_MENTIONS says it is named as an
                             internal one (core/backend_api/ always is): backend_sim/sim_run.h,
                             which both sent users to, was not installed (tester hB 2)
  NoCudaMacroInCore          no DITTO_WITH_CUDA under core/ (the registry knows what was built)
  NoBackendDynamicCast       no dynamic_cast to sim:: or cuda:: outside that backend's folder
                             (callers use the backend's extension lookup)

The include roots (Note [Layering]) already stop a library from compiling against what it may not
see; this also covers headers that no target compiles, and tests/, examples/, bench/ and tools/.

Usage: check_layering.py ROOT CHECK [--public-headers FILE]
       check_layering.py --self-test   (each check fails on a tree that breaks its rule)
Prints "PASS <check>" or one "FAIL <check>: file:line: ..." per violation (exit status 1).
"""
import os
import re
import sys
import tempfile

SOURCE_EXT = ('.h', '.hpp', '.cpp', '.cc', '.cu', '.cuh', '.in')
TREES = ('core', 'backend_sim', 'backend_cuda', 'examples', 'tests', 'bench', 'tools')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
CAST = re.compile(r'dynamic_cast\s*<\s*(?:const\s+)?(?:::)?(?:ditto::)?(sim|cuda)::')
BACKEND_DIR = {'sim': 'backend_sim', 'cuda': 'backend_cuda'}


def sources(root, top):
    base = os.path.join(root, top)
    for d, dirs, files in os.walk(base):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(SOURCE_EXT):
                yield os.path.relpath(os.path.join(d, f), root)


def lines(root, rel):
    with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
        for n, line in enumerate(f, 1):
            yield n, line


def includes(root, rel):
    for n, line in lines(root, rel):
        m = INCLUDE.match(line)
        if m:
            yield n, m.group(1)


# Note [Floors]
# core's folders, from the ground floor up. A file may include the headers of its own folder and
# of every folder on a LOWER floor; never one on its own floor (the rooms of a floor are
# independent of each other) or above. So errors can be raised from anywhere, the numerics know
# nothing of tensors, the backend contract knows the tensors but no communicator, and a
# checkpoint stands above the model and the optimizer it saves. A new folder gets a floor here
# (CoreFloorOrder fails until it has one); a new arrow that runs up means the file belongs higher,
# or what it needs lower.
CORE_FLOORS = (
    ('base',),                    # ditto::Error and its kinds, cat(): includes nothing of core
    ('numerics',),                # float formats, canonical math, random streams, determinism
    ('runtime',),                 # dtypes, tensors, devices, Backend and Kernels, streams, ops
    ('backend_api',),             # what a backend implements beside runtime/backend.h: recorded
                                  # collective calls, rendezvous, p2p matching, process transport
    ('distributed',),             # the processes of the job (mpirun): dist::init, rank, world
    ('comm',),                    # Communicator and the collectives
    ('io', 'nn'),                 # files, safetensors | modules, layers, the GPT model
    ('data', 'optim'),            # datasets, loaders, every data source | optimizers, ZeRO
    ('parallel', 'checkpoint'),   # DataParallel, DDP | checkpoints, GPT-2 weights
    ('train',),                   # the Trainer
)


def check_core_floor_order(root, _):
    floor = {name: n for n, names in enumerate(CORE_FLOORS) for name in names}
    out = []
    base = os.path.join(root, 'core')
    folders = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))) \
        if os.path.isdir(base) else []
    out += ['core/%s/: on no floor (add it to CORE_FLOORS in tests/check_layering.py)' % d
            for d in folders if d not in floor]
    for f in sources(root, 'core'):
        parts = f.split(os.sep)
        if len(parts) < 3 or parts[1] not in floor:
            continue
        mine = parts[1]
        for n, inc in includes(root, f):
            ip = inc.split('/')
            if len(ip) < 3 or ip[0] != 'core' or ip[1] == mine or ip[1] not in floor:
                continue
            if floor[ip[1]] >= floor[mine]:
                where = 'its own floor' if floor[ip[1]] == floor[mine] else 'a higher floor'
                out.append('%s:%d: includes %s, a header of %s (core/%s/ is on floor %d, core/%s/ on '
                           'floor %d; Note [Floors])' % (f, n, inc, where, mine, floor[mine] + 1,
                                                         ip[1], floor[ip[1]] + 1))
    return out


def check_core_includes_no_backend(root, _):
    return ['%s:%d: includes %s' % (f, n, inc) for f in sources(root, 'core')
            for n, inc in includes(root, f) if inc.startswith(('backend_sim/', 'backend_cuda/'))]


def check_backends_independent(root, _):
    out = []
    for mine, other in (('backend_sim', 'backend_cuda/'), ('backend_cuda', 'backend_sim/')):
        out += ['%s:%d: includes %s' % (f, n, inc) for f in sources(root, mine)
                for n, inc in includes(root, f) if inc.startswith(other)]
    return out


def check_installed_headers_are_public(root, public):
    if public is None:
        return ['--public-headers FILE is required for this check']
    out = []
    for h in sorted(public):
        if not os.path.isfile(os.path.join(root, h)):
            out.append('%s: listed as installed but not in the source tree' % h)
            continue
        for n, inc in includes(root, h):
            if inc not in public:
                why = 'internal' if inc.startswith('core/backend_api/') else 'not installed'
                out.append('%s:%d: installed header includes %s (%s)' % (h, n, inc, why))
    return out


HEADER_NAME = re.compile(r'\b((?:core|backend_sim|backend_cuda)/[A-Za-z0-9_/]+\.h)\b')
USER_DOCS = ('README.md', 'docs/api.md')
# Headers that installed headers name as internal (where a mechanism lives), never as one to
# include; each with why it stays uninstalled. core/backend_api/ is internal as a whole.
INTERNAL_MENTIONS = {
    'core/runtime/ops_mixed.h': "core's private helpers (DITTO_CORE_PRIVATE_HEADERS)",
    'backend_sim/trace.h': "the simulator's trace writer (SimBackend::start_trace's format)",
    'backend_sim/sim_gemm.h': "the simulator's GEMM (sim_executor.h's large kernels)",
}


def check_named_headers_are_installed(root, public):
    if public is None:
        return ['--public-headers FILE is required for this check']
    out = []
    for f in list(USER_DOCS) + sorted(public):
        if not os.path.isfile(os.path.join(root, f)):
            continue
        for n, line in lines(root, f):
            if INCLUDE.match(line):
                continue  # InstalledHeadersArePublic's
            for h in HEADER_NAME.findall(line):
                if h in public or h in INTERNAL_MENTIONS or h.startswith('core/backend_api/'):
                    continue
                out.append('%s:%d: names %s, which is not installed (install it: '
                           'cmake/ditto_install.cmake, Note [Public headers]; or list it in '
                           'INTERNAL_MENTIONS, tests/check_layering.py, if it is named as '
                           'internal)' % (f, n, h))
    return out


def check_no_cuda_macro_in_core(root, _):
    return ['%s:%d: mentions DITTO_WITH_CUDA' % (f, n) for f in sources(root, 'core')
            for n, line in lines(root, f) if 'DITTO_WITH_CUDA' in line]


# Passes only once the trainer branch (issue 11, item 3: extension lookup on Backend) has replaced
# the casts in examples/ditto_train.cpp, bench/bench_ddp.cpp and tests/.
def check_no_backend_dynamic_cast(root, _):
    out = []
    for top in TREES:
        for f in sources(root, top):
            for n, line in lines(root, f):
                for m in CAST.finditer(line):
                    if top != BACKEND_DIR[m.group(1)]:
                        out.append('%s:%d: dynamic_cast to %s:: outside %s/' %
                                   (f, n, m.group(1), BACKEND_DIR[m.group(1)]))
    return out


CHECKS = {
    'CoreIncludesNoBackend': check_core_includes_no_backend,
    'CoreFloorOrder': check_core_floor_order,
    'BackendsIndependent': check_backends_independent,
    'InstalledHeadersArePublic': check_installed_headers_are_public,
    'NamedHeadersAreInstalled': check_named_headers_are_installed,
    'NoCudaMacroInCore': check_no_cuda_macro_in_core,
    'NoBackendDynamicCast': check_no_backend_dynamic_cast,
}


def run(root, name, public):
    problems = CHECKS[name](root, public)
    for p in problems:
        print('FAIL %s: %s' % (name, p))
    if not problems:
        print('PASS %s' % name)
        if name == 'CoreFloorOrder':
            print('floors, ground first: ' + ' < '.join(f[0] if len(f) == 1 else '{%s}' % ', '.join(f) for f in CORE_FLOORS))
    return not problems


def self_test():
    """A clean tree passes every check; each broken tree fails exactly the check it breaks."""
    files_ok = {
        'core/runtime/tensor.h': '#pragma once\n#include "core/runtime/dtype.h"\n',
        'core/runtime/dtype.h': '#pragma once\n',
        'core/runtime/backend_init.h': '#pragma once\n',
        'core/runtime/backend.cpp': '#include "core/runtime/backend_init.h"\n',
        'backend_sim/sim_backend.h': '#pragma once\n#include "core/runtime/tensor.h"\n',
        'backend_sim/sim_gemm.h': '#pragma once\n',
        'backend_sim/sim_backend.cpp': '#include "backend_sim/sim_gemm.h"\n'
                                       'auto* p = dynamic_cast<sim::SimBackend*>(b);\n',
        'backend_cuda/cuda_backend.cpp': '#include "core/runtime/tensor.h"\n',
        'examples/demo.cpp': '#include "backend_sim/sim_backend.h"\n',
    }
    public = {'core/runtime/tensor.h', 'core/runtime/dtype.h', 'backend_sim/sim_backend.h'}
    breaks = {
        'CoreIncludesNoBackend': ('core/runtime/ops.cpp', '#include "backend_sim/sim_backend.h"\n'),
        'CoreFloorOrder': ('core/base/x.cpp', '#include "core/runtime/tensor.h"\n'),
        'BackendsIndependent': ('backend_cuda/x.cpp', '#include "backend_sim/sim_gemm.h"\n'),
        'InstalledHeadersArePublic': ('core/runtime/tensor.h',
                                      '#pragma once\n#include "core/runtime/backend_init.h"\n'),
        'NamedHeadersAreInstalled': ('docs/api.md',
                                     'attach it with `backend_sim/sim_run.h`\n'),
        'NoCudaMacroInCore': ('core/runtime/backend.cpp', '#ifdef DITTO_WITH_CUDA\n#endif\n'),
        'NoBackendDynamicCast': ('tests/test_x.cpp',
                                 'auto& s = dynamic_cast<const ditto::cuda::CudaStream&>(x);\n'),
    }
    ok = True
    for broken in [None] + sorted(breaks):
        with tempfile.TemporaryDirectory() as root:
            files = dict(files_ok)
            if broken:
                path, text = breaks[broken]
                files[path] = text
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), 'w') as f:
                    f.write(text)
            for name, check in CHECKS.items():
                failed = bool(check(root, public))
                if failed != (name == broken):
                    ok = False
                    print('FAIL self-test: %s on a tree breaking %s: %s' %
                          (name, broken or 'nothing', 'failed' if failed else 'passed'))
    if ok:
        print('PASS self-test: %d checks, each fails only on the tree that breaks it' % len(CHECKS))
    return ok


def main(argv):
    if argv[1:] == ['--self-test']:
        return 0 if self_test() else 1
    if len(argv) not in (3, 5) or argv[2] not in CHECKS or (len(argv) == 5 and
                                                            argv[3] != '--public-headers'):
        sys.stderr.write(__doc__)
        return 2
    public = None
    if len(argv) == 5:
        with open(argv[4]) as f:
            public = {line.strip() for line in f if line.strip()}
    return 0 if run(argv[1], argv[2], public) else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv))
