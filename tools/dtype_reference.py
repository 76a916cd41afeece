#!/usr/bin/env python3
"""Writes tests/data/dtype_ref.safetensors: PyTorch's dtype conversions on hard values, the
reference of tests/test_dtype_ref.cpp (ditto's Tensor::to must give the same bits).

Run with the torch of this machine (1.13, /usr/bin/python3; not in CI, so its output is committed):
    /usr/bin/python3 tools/dtype_reference.py tests/data/dtype_ref.safetensors

Tensors (name: dtype [n]):
  f32_in: F32 hard values (f16 / bf16 ties and their neighbours, subnormals of f32, f16 and bf16,
          values past the f16 range, +-0, +-inf, NaN, random magnitudes)
  f32_to_f16, f32_to_bf16: torch's x.to(torch.float16 / torch.bfloat16)
  f64_in: F64 hard values (the f32 ones widened, plus values between two f32s: double rounding)
  f64_to_f16, f64_to_bf16, f64_to_f32
  f32_i32_in / f32_to_i32, f32_i8_in / f32_to_i8, f32_u8_in / f32_to_u8: in-range values only
          (torch's float -> int is C++'s cast, undefined out of range; ditto saturates there)
  i64_in / i64_to_f32 / i64_to_f16 / i64_to_bf16, i32_in / i32_to_*, i8_in / i8_to_*, u8_in /
          u8_to_*: integers (past 2^24 and 2^53 for i64) to the float types
torch 1.13 has no fp8: tests/test_dtype.cpp checks fp8 against a brute-force reference.
The file is written by hand (Note [safetensors layout] in core/io/safetensors.h): no dependency
on the safetensors package.
"""
import json
import struct
import sys

import torch

SAFETENSORS_NAMES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8",
}


def f32_bits(u):
    return torch.tensor(u, dtype=torch.int64).to(torch.int32).view(torch.float32)


def hard_f32():
    g = torch.Generator().manual_seed(13)
    vals = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 65504.0, 65519.0,
            65520.0, 65536.0, 3.3895313892515355e38, 3.4e38, 1e-45, -1e-45, 1.17e-38, 6e-8,
            5.960464477539063e-08, 2.9802322387695312e-08, 2.98023259e-08, 1e-40]
    out = [torch.tensor(vals, dtype=torch.float32)]
    # Every f16 value's neighbourhood over a range of exponents: the value, the tie to the next
    # one, and one f32 ulp on either side of the tie (f16 codes -> f32 -> bits).
    codes = torch.arange(0, 0x7C00, 37, dtype=torch.int32).to(torch.int16).view(torch.float16)
    a = codes.to(torch.float32)
    b = (codes.view(torch.int16) + 1).view(torch.float16).to(torch.float32)
    mid = (a.double() + b.double()) / 2
    m32 = mid.to(torch.float32)
    bits = m32.view(torch.int32)
    out += [a, m32, (bits + 1).view(torch.float32), (bits - 1).view(torch.float32), -m32]
    # bf16 ties likewise: f32 values whose low 16 bits are 0x8000 (tie), 0x8001, 0x7FFF, with an
    # odd and an even kept part.
    hi = torch.randint(0, 0x7F80, (400,), generator=g, dtype=torch.int32) << 16
    for low in (0x8000, 0x8001, 0x7FFF, 0x0000, 0x18000):
        out.append((hi + low).view(torch.float32))
    # Subnormals of f32 and values near f16's smallest subnormal.
    out.append((torch.randint(1, 0x800000, (200,), generator=g, dtype=torch.int32)).view(torch.float32))
    out.append(torch.rand(200, generator=g) * 1.2e-7)
    # Random magnitudes.
    out.append((torch.rand(600, generator=g) * 2 - 1) * torch.pow(2.0, torch.randint(-30, 20, (600,), generator=g).float()))
    x = torch.cat(out)
    return x


def main(path):
    t = {}
    x = hard_f32()
    t["f32_in"] = x
    t["f32_to_f16"] = x.to(torch.float16)
    t["f32_to_bf16"] = x.to(torch.bfloat16)
    g = torch.Generator().manual_seed(17)
    between = x.double() * (1 + torch.rand(x.numel(), generator=g, dtype=torch.float64) * 2 ** -30)
    d = torch.cat([x.double(), between, torch.tensor([1e300, -1e300, 1e-320, 65519.99999999,
                                                      1.00048828125 + 1e-12], dtype=torch.float64)])
    t["f64_in"] = d
    t["f64_to_f16"] = d.to(torch.float16)
    t["f64_to_bf16"] = d.to(torch.bfloat16)
    t["f64_to_f32"] = d.to(torch.float32)
    for name, dt, lo, hi in (("i32", torch.int32, -2.0 ** 31, 2.0 ** 31 - 129),
                             ("i8", torch.int8, -128.0, 127.0), ("u8", torch.uint8, 0.0, 255.0)):
        v = torch.rand(1000, generator=g, dtype=torch.float64) * (hi - lo) + lo
        v = torch.cat([v.to(torch.float32), torch.tensor([lo, hi, 0.5, -0.5, 0.0, -0.0, 0.99999994],
                                                          dtype=torch.float32)])
        v = v[(v >= lo) & (v <= hi)] if name != "u8" else v[(v > -1) & (v <= hi)]
        t["f32_%s_in" % name] = v
        t["f32_to_%s" % name] = v.to(dt)
    ints = {
        "i64": torch.cat([torch.randint(-2 ** 62, 2 ** 62, (500,), generator=g, dtype=torch.int64),
                          torch.tensor([2 ** 24 + 1, 2 ** 24 + 3, 2 ** 53 + 1, -2 ** 63, 2 ** 63 - 1,
                                        65504, 65519, 65520, 2049, 2051, 257, 259, 0, -1],
                                       dtype=torch.int64),
                          torch.randint(-70000, 70000, (500,), generator=g, dtype=torch.int64)]),
        "i32": torch.cat([torch.randint(-2 ** 31, 2 ** 31 - 1, (500,), generator=g, dtype=torch.int32),
                          torch.randint(-5000, 5000, (200,), generator=g, dtype=torch.int32)]),
        "i8": torch.arange(-128, 128, dtype=torch.int8),
        "u8": torch.arange(0, 256, dtype=torch.int32).to(torch.uint8),
    }
    for name, v in ints.items():
        t["%s_in" % name] = v
        for fname, fdt in (("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)):
            t["%s_to_%s" % (name, fname)] = v.to(fdt)

    header = {"__metadata__": {"torch": torch.__version__, "script": "tools/dtype_reference.py"}}
    blobs, off = [], 0
    for name, v in t.items():
        v = v.contiguous()
        raw = v.view(torch.uint8).numpy().tobytes() if v.dtype != torch.uint8 else v.numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS_NAMES[v.dtype], "shape": list(v.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    print("wrote %s: %d tensors, %d bytes of data" % (path, len(t), off))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/dtype_ref.safetensors")
