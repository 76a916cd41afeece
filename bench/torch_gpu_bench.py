#!/usr/bin/python3
"""PyTorch's speed on the GPT that `ditto-train --model gpt` trains, for tools/gpu-check.sh's speed
table (issue 28): the same model on the same GPU, so ditto's tokens/s has a reference beside it.

Model: nanoGPT's GPT as ditto's nn::GPT builds it (core/nn/gpt*.cpp; the maths in
tools/gpt_reference.py, Note [GPT reference fixture]): token + position embeddings, n_layer blocks
of x += attn(ln_1(x)), x += mlp(ln_2(x)), ln_f, the head tied to wte; GELU tanh; LayerNorm eps
1e-5; biases only with --bias (ditto's default: none; the gpt2 preset has them); dropout 0.
Initialisation: nanoGPT's _init_weights (normal(0, 0.02), every c_proj.weight normal(0,
0.02/sqrt(2 n_layer)), biases 0, LayerNorm gains 1). Attention: F.scaled_dot_product_attention
(is_causal=True; flash / memory-efficient kernels where the dtype allows). Training step as
nanoGPT's train.py: forward, cross-entropy over B*T tokens, backward, clip_grad_norm_(1.0),
torch.optim.AdamW(fused=True on a GPU; betas (0.9, 0.99), weight decay 0.1 on the 2-D weights),
zero_grad(set_to_none=True). Eager mode (no torch.compile). Batches: random windows of random
tokens in [0, vocab) (speed does not depend on the text), made on the device before timing.

Configurations (--config, repeatable; default all):
  char-f32    nanoGPT's shakespeare_char: 6 layers, 384 wide, 6 heads, T 256, B 64, the
              vocabulary of ditto-train's bundled examples/data/shakespeare.txt (78 bytes), float32
              strict (torch.backends.cuda.matmul.allow_tf32 = False, cudnn too)
  char-tf32   the same with TF32 matmuls (allow_tf32 = True)
  char-bf16   the same under torch.autocast(bfloat16) (parameters and AdamW state float32)
  gpt2-bf16   GPT-2 124M: 12 layers, 768 wide, 12 heads, T 1024, B 8, vocab 50304, biases, bf16
              autocast

tokens/s = B * T / (median step time of the --steps timed steps after --warmup steps); each step
is timed with torch.cuda.synchronize() around it (time.perf_counter on the CPU).

  torch_gpu_bench.py [--device cuda|cpu] [--config NAME]... [--steps N] [--warmup N]
                     [--json FILE] [--markdown FILE] [--tiny]

--device cpu --tiny: a smoke run (the same code on a 2-layer, 32-wide model with T 16, B 4) so a
machine without a GPU can check that the script runs (ctest TorchGpuBench.CpuSmoke). Exit status 0
when every configuration ran; 1 when one failed (its row says why); 2 on bad arguments or when the
device is not there.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - the ctest checks for torch before running this
    print(f"torch_gpu_bench: error: torch is not importable ({e}); run with a python3 that has it",
          file=sys.stderr)
    sys.exit(2)

def text_vocab(default=65):
    """Distinct bytes of ditto-train's bundled text (its --model gpt vocabulary: 78), else
    nanoGPT's shakespeare_char's 65."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "data",
                        "shakespeare.txt")
    try:
        with open(path, "rb") as f:
            return len(set(f.read()))
    except OSError:
        return default


CHAR = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64,
            vocab_size=text_vocab(), bias=False)
GPT2 = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch_size=8, vocab_size=50304,
            bias=True)
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, vocab_size=65, bias=False)
# name -> (model, precision): precision is f32 (strict), tf32 or bf16 (autocast)
CONFIGS = {"char-f32": (CHAR, "f32"), "char-tf32": (CHAR, "tf32"), "char-bf16": (CHAR, "bf16"),
           "gpt2-f32": (GPT2, "f32"), "gpt2-bf16": (GPT2, "bf16")}
LN_EPS = 1e-5


class LayerNorm(nn.Module):
    """nn.LayerNorm with an optional bias (as nanoGPT's own; nn.LayerNorm's bias= needs torch 2.1)."""

    def __init__(self, C, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = nn.Parameter(torch.zeros(C)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, LN_EPS)


def causal_attention(q, k, v):
    """F.scaled_dot_product_attention(is_causal=True); torch < 2.0 (Debian's 1.13, CPU smoke runs
    only) lacks it: the same maths written out."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, bias = c["n_embd"], c["bias"]
        self.n_head = c["n_head"]
        self.ln_1 = LayerNorm(C, bias)
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)
        self.attn_proj = nn.Linear(C, C, bias=bias)
        self.ln_2 = LayerNorm(C, bias)
        self.c_fc = nn.Linear(C, 4 * C, bias=bias)
        self.mlp_proj = nn.Linear(4 * C, C, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = LayerNorm(c["n_embd"], c["bias"])
        std_proj = 0.02 / math.sqrt(2 * c["n_layer"])
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # LayerNorm gains 1, biases 0 (their constructors' values)
            nn.init.normal_(p, 0.0, std_proj if name.endswith("_proj.weight") else 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the head tied to wte
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def num_params(model, c):
    return sum(p.numel() for p in model.parameters()) - c["block_size"] * c["n_embd"]


def set_precision(precision, device):
    tf32 = precision == "tf32"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def run_config(name, c, precision, device, steps, warmup):
    """One configuration: {config, precision, B, T, params, step_ms_median, tokens_per_s, ...}."""
    set_precision(precision, device)
    torch.manual_seed(1337)
    model = GPT(c).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    fused = dict(fused=True) if device.type == "cuda" else {}  # fused AdamW: CUDA, torch >= 2.0
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), eps=1e-8, **fused)
    B, T, V = c["batch_size"], c["block_size"], c["vocab_size"]
    g = torch.Generator(device="cpu").manual_seed(2024)
    batches = [(torch.randint(V, (B, T), generator=g).to(device),
                torch.randint(V, (B, T), generator=g).to(device)) for _ in range(4)]
    amp = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
           if precision == "bf16" else None)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times, loss = [], float("nan")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for it in range(warmup + steps):
        x, y = batches[it % len(batches)]
        sync()
        t0 = time.perf_counter()
        if amp is not None:
            with amp:
                l = model(x, y)
        else:
            l = model(x, y)
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
        loss = l.item()
    med = statistics.median(times)
    out = dict(config=name, precision=precision, device=str(device), n_layer=c["n_layer"],
               n_embd=c["n_embd"], n_head=c["n_head"], block_size=T, batch_size=B, vocab_size=V,
               params=num_params(model, c), steps=steps, warmup=warmup,
               step_ms_median=med * 1e3, step_ms_min=min(times) * 1e3,
               tokens_per_s=B * T / med, last_loss=loss)
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def markdown(rows, header):
    lines = [header, "",
             "| config | precision | B | T | params | step ms (median) | tokens/s | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['precision']} | | | | | | FAILED: {r['error']} |")
        else:
            lines.append(f"| {r['config']} | {r['precision']} | {r['batch_size']} | "
                         f"{r['block_size']} | {r['params'] / 1e6:.2f}M | "
                         f"{r['step_ms_median']:.2f} | {r['tokens_per_s']:.0f} | "
                         f"loss {r['last_loss']:.3f} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--config", action="append", choices=sorted(CONFIGS),
                   help="configuration to run (repeatable; default all)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--tiny", action="store_true",
                   help="every configuration on a tiny model (a smoke run, e.g. on the CPU)")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--markdown", help="write the table as markdown here")
    a = p.parse_args()
    if a.steps < 1 or a.warmup < 0:
        p.error(f"--steps: expected >= 1 and --warmup >= 0, got {a.steps} and {a.warmup}")
    if a.device not in ("cuda", "cpu"):
        p.error(f"--device: expected cuda or cpu, got {a.device}")
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_gpu_bench: error: --device cuda: torch {torch.__version__} sees no CUDA "
              f"device (torch.version.cuda={torch.version.cuda})", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    names = a.config or list(CONFIGS)
    if a.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = (f"## PyTorch {torch.__version__} eager on {gpu}: tokens/s = B*T / median step "
              f"({a.steps} steps after {a.warmup} warm-up{', tiny models' if a.tiny else ''})")
    print(header, flush=True)
    rows, failed = [], 0
    for name in names:
        c, precision = CONFIGS[name]
        if a.tiny:
            c = TINY
        try:
            r = run_config(name, c, precision, device, a.steps, a.warmup)
            print(f"{name}: {r['tokens_per_s']:.0f} tokens/s, median step "
                  f"{r['step_ms_median']:.2f} ms, loss {r['last_loss']:.4f}", flush=True)
        except Exception as e:  # one configuration failing (e.g. out of memory) still reports
            failed += 1
            r = dict(config=name, precision=precision, error=f"{type(e).__name__}: {e}"[:200])
            print(f"{name}: FAILED: {r['error']}", flush=True)
        rows.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        # Rewritten after every configuration: a run cut short by a time limit still reports.
        meta = dict(torch=torch.__version__, cuda=torch.version.cuda, device=gpu, rows=rows)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(meta, f, indent=1)
        if a.markdown:
            with open(a.markdown, "w") as f:
                f.write(markdown(rows, header))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
