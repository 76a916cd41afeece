#!/usr/bin/env python3
"""Check that ditto's safetensors files and Hugging Face's `safetensors` package read each other.

Not part of CI (it needs `pip install safetensors numpy`). From the repository root, after building
ditto-train and safetensors-info:

    python3 tools/safetensors_interop.py [--build build] [--write-fixture tests/data/FILE]

1. ditto writes, Python reads: runs `ditto-train --epochs 2 --checkpoint DIR`, loads the
   checkpoint's model.safetensors and optimizer.safetensors with safetensors.numpy, and checks
   the names and shapes, the CRC-32 in the metadata (zlib), and that FNV-1a over the parameters'
   bytes equals the params_checksum ditto-train printed.
2. Python writes, ditto reads: saves F32 and I64 tensors (2-D, 1-D, 0-dim, empty) and metadata
   with safetensors.numpy.save_file and compares what `safetensors-info --all` prints.
--write-fixture also keeps the Python-written file (tests/data/python_written.safetensors is one).
Exits 0 when every check passes and prints one line per check.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import zlib

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from params_checksum import fnv1a  # noqa: E402


def python_tensors():
    return {
        "w": (np.arange(6, dtype=np.float32).reshape(2, 3) / 4 - 0.5),
        "idx": np.arange(5, dtype=np.int64) - 2,
        "scalar": np.array(3.5, dtype=np.float32),
        "iscalar": np.array(-7, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--write-fixture")
    args = ap.parse_args()
    train = os.path.join(args.build, "bin", "ditto-train")
    info = os.path.join(args.build, "bin", "safetensors-info")
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    with tempfile.TemporaryDirectory() as tmp:
        # 1. ditto writes, Python reads.
        ck = os.path.join(tmp, "ck")
        out = subprocess.run([train, "--epochs", "2", "--checkpoint", ck], check=True,
                             capture_output=True, text=True).stdout
        checksum = int(re.search(r"params_checksum=([0-9a-f]{16})", out).group(1), 16)
        step = open(os.path.join(ck, "latest")).read().strip()
        model_path = os.path.join(ck, step, "model.safetensors")
        params = load_file(model_path)
        names = ["0.weight", "0.bias", "2.weight", "2.bias"]
        check(sorted(params) == sorted(names), f"python loads ditto's {model_path}: {sorted(params)}")
        check([params[n].shape for n in names] == [(128, 64), (128,), (10, 128), (10,)]
              and all(params[n].dtype == np.float32 for n in names),
              "shapes and dtypes as torch.nn.Sequential(Linear(64,128), ReLU, Linear(128,10))")
        with safe_open(model_path, framework="numpy") as f:
            meta = f.metadata()
            # The file's tensor order is the buffer order; CRC-32 over the buffer.
            raw = open(model_path, "rb").read()
            n = int.from_bytes(raw[:8], "little")
            crc = zlib.crc32(raw[8 + n:])
        check(meta.get("ditto.crc32") == f"{crc:08x}", f"metadata ditto.crc32 = zlib.crc32 of the buffer ({crc:08x})")
        check(fnv1a([params[n] for n in names]) == checksum,
              f"FNV-1a of the parameters python read = ditto-train's params_checksum {checksum:016x}")
        opt = load_file(os.path.join(ck, step, "optimizer.safetensors"))
        check(sorted(opt) == sorted(f"state.{i}.momentum_buffer" for i in range(4)) and
              all(opt[f"state.{i}.momentum_buffer"].shape == params[n].shape for i, n in enumerate(names)),
              "python loads optimizer.safetensors: one momentum_buffer per parameter, same shapes")

        # 2. Python writes, ditto reads.
        path = args.write_fixture or os.path.join(tmp, "python.safetensors")
        ts = python_tensors()
        save_file(ts, path, metadata={"source": "python safetensors", "note": "é ünïcode"})
        res = subprocess.run([info, "--all", path], capture_output=True, text=True)
        check(res.returncode == 0, f"ditto loads the python-written {path} ({res.stderr.strip()})")
        got = {}
        for line in res.stdout.splitlines():
            if line.startswith("tensor "):
                head, _, vals = line.partition(":")
                _, name, dtype, shape = head.split(" ", 3)
                got[name] = (dtype, shape, vals.split())
            elif line.startswith("metadata "):
                k, _, v = line[len("metadata "):].partition("=")
                got["meta:" + k] = v
        for name, a in ts.items():
            dtype = "F32" if a.dtype == np.float32 else "I64"
            shape = "[" + ", ".join(str(s) for s in a.shape) + "]"
            vals = [float(v) if dtype == "F32" else int(v) for v in a.reshape(-1)]
            g = got.get(name)
            gv = None if g is None else [float(v) if dtype == "F32" else int(v) for v in g[2]]
            check(g is not None and g[0] == dtype and g[1] == shape and gv == vals,
                  f"ditto reads python's {name}: {dtype} {shape} {vals}")
        check(got.get("meta:note") == "é ünïcode" and got.get("meta:source") == "python safetensors",
              "ditto reads python's __metadata__ (UTF-8)")
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
