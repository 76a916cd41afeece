#!/usr/bin/python3
"""PyTorch reference for Note [Mixed precision] (core/runtime/mixed_precision.h).

Computes, for one small fixed case, a bf16-storage / f32-compute op chain the way torch does it
for bf16 tensors (each op: inputs .float(), the f32 op, the result .bfloat16(): rounded once) and
writes tests/data/mp_reference.json, checked by tests/test_mixed_precision.cpp
(MixedPrecisionTest.MatchesTheTorchReference):

  x [N, C] bf16, w [H, C] bf16, b [H] bf16, targets [N] (in [0, H))
  mm     = torch.matmul(x.float(), w.float().t()).bfloat16()        exact (f32 accumulate, one
                                                                    rounding; ditto's canonical
                                                                    order may differ only below
                                                                    f32 precision: checked)
  biased = (mm.float() + b.float()).bfloat16()                      exact
  act    = F.gelu(biased.float(), approximate='tanh').bfloat16()    within 1 bf16 ulp
  normed = F.layer_norm(act.float(), [H], eps=1e-5).bfloat16()      within 1 bf16 ulp
  loss   = F.cross_entropy(normed.float(), targets)                 f32, within 1e-6 relative
  dlogits = the gradient of loss w.r.t. normed.float(), .bfloat16()  within 1 bf16 ulp

Tensors are stored as their bf16 bit patterns (uint16) so the C++ side reads the exact values.
Run: apt-get install -y libopenblas0-openmp python3-torch; /usr/bin/python3 tools/mp_reference.py
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

N, C, H = 6, 24, 10


def values(n, seed):
    """n deterministic values in about [-1, 1) (an LCG, so the file is reproducible anywhere)."""
    out, s = [], seed
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(((s >> 40) / float(1 << 24)) * 2.0 - 1.0)
    return out


def bits(t):
    """bf16 tensor -> list of uint16 bit patterns."""
    return t.contiguous().view(torch.int16).flatten().tolist()


def u16(lst):
    return [v & 0xFFFF for v in lst]


def main():
    torch.set_num_threads(1)
    x = torch.tensor(values(N * C, 1), dtype=torch.float32).view(N, C).bfloat16()
    w = torch.tensor(values(H * C, 2), dtype=torch.float32).view(H, C).bfloat16()
    b = torch.tensor(values(H, 3), dtype=torch.float32).bfloat16()
    targets = torch.tensor([(i * 7 + 3) % H for i in range(N)], dtype=torch.int64)

    mm = torch.matmul(x.float(), w.float().t()).bfloat16()
    biased = (mm.float() + b.float()).bfloat16()
    act = F.gelu(biased.float(), approximate="tanh").bfloat16()
    normed = F.layer_norm(act.float(), [H], eps=1e-5).bfloat16()
    logits = normed.float().requires_grad_(True)
    loss = F.cross_entropy(logits, targets)
    loss.backward()
    dlogits = logits.grad.bfloat16()

    out = {
        "source": "tools/mp_reference.py, torch " + torch.__version__,
        "N": N, "C": C, "H": H,
        "x": u16(bits(x)), "w": u16(bits(w)), "b": u16(bits(b)),
        "targets": targets.tolist(),
        "mm": u16(bits(mm)), "biased": u16(bits(biased)), "act": u16(bits(act)),
        "normed": u16(bits(normed)), "dlogits": u16(bits(dlogits)),
        "loss": float(loss.item()),
    }
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "tests", "data", "mp_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, "loss", out["loss"])


if __name__ == "__main__":
    sys.exit(main())
