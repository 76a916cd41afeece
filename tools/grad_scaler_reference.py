#!/usr/bin/env python3
"""Writes tests/data/grad_scaler_reference.txt: torch.amp.GradScaler's scale after each update()
for given sequences of found_inf flags, the reference of tests/test_grad_scaler.cpp (ditto's
optim::GradScaler must give the same float bits).

    /usr/bin/python3 tools/grad_scaler_reference.py tests/data/grad_scaler_reference.txt

With torch importable (2.x), each update is torch's own op on CPU tensors:
    torch._amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                             growth_interval)
which is what GradScaler.update() calls (torch/amp/grad_scaler.py), with scale a float32 tensor
of init_scale (GradScaler._lazy_init_scale_growth_tracker) and growth_tracker int32. Without
torch (this machine's PyPI torch is the CUDA build only), the same kernel transliterated from
aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp (_amp_update_scale_cpu_kernel), with float32
rounding by struct: the file's first line says which ran.

Scenarios (one line each: name, options, then per step "found_inf:scale_bits:tracker"):
  default_interval3:  init 2^16, growth 2, backoff 0.5, interval 3, inf at steps 3 and 7 (0-based)
  odd_factors:        init 1000.1, growth 1.7, backoff 0.3, interval 2 (rounding of float*double)
  overflow:           init 2^126, growth 2, interval 1: 2^127, then the growth to inf is refused
  all_inf:            init 2^16, backoff 0.5: 30 backoffs, 2^16 down to 2^-14
"""
import struct
import sys


def f32(x):
    # Round to nearest even float32 (C's (float)x); struct refuses a result that rounds to inf.
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return float("inf") if x > 0 else float("-inf")


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def update_transliterated(scale, tracker, found_inf, growth, backoff, interval):
    # _amp_update_scale_cpu_kernel: *scale = (*scale) * backoff_factor (float * double -> float)
    if found_inf:
        return f32(scale * backoff), 0
    successful = tracker + 1
    if successful == interval:
        new_scale = f32(scale * growth)
        if new_scale not in (float("inf"), float("-inf")) and new_scale == new_scale:
            scale = new_scale
        return scale, 0
    return scale, successful


def run(name, init, growth, backoff, interval, flags, torch):
    out = []
    if torch is not None:
        s = torch.full((1,), init, dtype=torch.float32)
        t = torch.zeros((1,), dtype=torch.int32)
        for fi in flags:
            torch._amp_update_scale_(s, t, torch.full((1,), float(fi)), growth, backoff, interval)
            out.append((fi, bits(float(s.item())), int(t.item())))
    else:
        s, t = f32(init), 0
        for fi in flags:
            s, t = update_transliterated(s, t, fi, growth, backoff, interval)
            out.append((fi, bits(s), t))
    steps = " ".join(f"{fi}:{b:08x}:{tr}" for fi, b, tr in out)
    return f"{name} {init!r} {growth!r} {backoff!r} {interval} {steps}"


def main():
    try:
        import torch  # noqa: F401
        source = f"torch {torch.__version__} torch._amp_update_scale_ (CPU)"
    except ImportError:
        torch = None
        source = "transliteration of _amp_update_scale_cpu_kernel (torch not importable)"
    flags12 = [1 if i in (3, 7) else 0 for i in range(12)]
    lines = [
        "# " + source,
        run("default_interval3", 65536.0, 2.0, 0.5, 3, flags12, torch),
        run("odd_factors", 1000.1, 1.7, 0.3, 2, [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0], torch),
        run("overflow", 2.0 ** 126, 2.0, 0.5, 1, [0, 0, 0, 1, 0], torch),
        run("all_inf", 65536.0, 2.0, 0.5, 2000, [1] * 30, torch),
    ]
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
