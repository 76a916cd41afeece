#!/usr/bin/python3
"""PyTorch reference for ditto's GPT (nn::GPT): nanoGPT's architecture written here from the maths,
not copied from nanoGPT's model.py, and the fixtures tests/test_gpt_reference.cpp checks ditto with
(as llm.c's test_gpt2.c checks its C model against PyTorch's).

Run with Debian's /usr/bin/python3 (python3-torch is installed for it only). Needs torch and
numpy; safetensors files are read and written by the small codec below (Hugging Face's
`safetensors` package is not needed; tools/safetensors_interop.py checks ditto against that one).

  gpt_reference.py make-fixture [--text examples/data/shakespeare.txt] [--out tests/data]
      Writes tests/data/gpt_ref_nobias.safetensors and gpt_ref_bias.safetensors: a tiny GPT
      (FIXTURE_CONFIG), its torch-initialised parameters with nanoGPT's state_dict names, ten
      batches of text windows, the step-0 logits and loss, the losses of ten AdamW steps with
      nanoGPT's recipe (RECIPE) and the parameters after them ("final.<name>"). The recipe, the
      config, the torch version and the float32-vs-float64 deviation of torch itself go into
      __metadata__ (Note [GPT reference fixture]).
  gpt_reference.py compare --checkpoint DIR|FILE [--fixture tests/data/gpt_ref_nobias.safetensors]
      Loads a ditto checkpoint (DIR/latest's model.safetensors, or a .safetensors file) that ditto
      trained from the fixture's initial parameters on its batches for k steps with its recipe
      (k = the file's "ditto.step" metadata, or --steps), reruns those k steps in torch and
      prints, per parameter, the largest absolute difference and the relative difference
      ||ditto - torch|| / ||torch - init||, then the losses of both on the fixture's batches.
      Exits 1 when a relative difference exceeds --tol (default 1e-3) or a name or shape differs.

Note [GPT reference fixture]
Model (nanoGPT's GPT with dropout 0): x = wte[idx] + wpe[0:T]; per block x += attn(ln_1(x)),
x += mlp(ln_2(x)), attn = c_proj(softmax(causal(q k^T / sqrt(hs))) v) over n_head heads of
c_attn(x) split [q | k | v], mlp = c_proj(gelu_tanh(c_fc(x))); logits = ln_f(x) wte^T (the head is
tied to wte); LayerNorm eps 1e-5; loss = F.cross_entropy(logits.view(-1, V), y.view(-1)), the mean
over B*T tokens. GELU is the tanh approximation (ditto's gelu); nanoGPT's nn.GELU() is the exact erf
form, so tools/nanogpt_eval.py patches nanoGPT's model to approximate='tanh'.
Initialisation: nanoGPT's _init_weights (Linear and Embedding weights normal(0, 0.02), every
c_proj.weight normal(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weight 1 and bias 0), drawn
with torch.manual_seed(SEED) in named_parameters order. The bias variant then perturbs every bias by
normal(0, 0.02) and every LayerNorm weight by normal(0, 0.1) so that the step-0 logits exercise them
(zero biases and unit gains would hide a bias or gain read from the wrong place).
Training step `it` (0-based, RECIPE["steps"] of them): lr = nanoGPT get_lr(it); loss = forward on
batch it; backward; torch.nn.utils.clip_grad_norm_(params, grad_clip); AdamW step (torch's
formula, foreach=False). The loss recorded for step `it` is the one before its update (nanoGPT's
"iter it: loss"). Batches: window j of batch it starts at torch.randint(len(train) - T) (generator
seeded DATA_SEED), x = tokens[i:i+T], y = tokens[i+1:i+T+1], train = the first 90% of the text's
bytes, tokens = indices into the sorted distinct bytes (nanoGPT's prepare.py).
Determinism: float32, torch.set_num_threads(1), torch.use_deterministic_algorithms(True).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

FIXTURE_CONFIG = dict(n_layer=2, n_head=3, n_embd=24, block_size=16, dropout=0.0)
BATCH_SIZE = 4
SEED = 1337
DATA_SEED = 2024
RECIPE = dict(learning_rate=1e-3, min_lr=1e-4, warmup_iters=2, lr_decay_iters=10, steps=10,
              beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
LN_EPS = 1e-5

# ---- safetensors (Note [safetensors layout] in core/io/safetensors.h) -----------------------------
_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.float64): "F64"}
_NP = {v: k for k, v in _DTYPES.items()}


def save_safetensors(path, tensors, metadata=None):
    """Write `tensors` (name -> numpy array, in order) and string `metadata` to `path` atomically,
    header padded with spaces to a multiple of 8 bytes as ditto writes it."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype not in _DTYPES:
            raise ValueError(f"save_safetensors: {name}: dtype {a.dtype} not one of F32, I64, F64")
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    write_safetensors(path, header, blobs)


def write_safetensors(path, header, blobs):
    """Write a safetensors file from its `header` (the dict, __metadata__ included, as it is to be
    written) and the tensors' bytes `blobs` in data_offsets order: the header padded with spaces
    to a multiple of 8 bytes as ditto writes it, through a temporary of this process's own beside
    `path` and a rename, so a failure leaves `path` as it was and no temporary. Raises OSError."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_safetensors(path):
    """(tensors: name -> numpy array in file order, metadata: dict) of a safetensors file; raises
    ValueError naming the file for anything malformed or a dtype other than F32/I64/F64."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: shorter than 8 bytes, not a safetensors file")
    n = struct.unpack("<Q", raw[:8])[0]
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} past the end of the file ({len(raw)} bytes)")
    header = json.loads(raw[8:8 + n].decode())
    meta = header.pop("__metadata__", {}) or {}
    buf = raw[8 + n:]
    out = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if e["dtype"] not in _NP:
            raise ValueError(f"{path}: tensor {name}: dtype {e['dtype']} not one of F32, I64, F64")
        b, end = e["data_offsets"]
        dt = _NP[e["dtype"]].newbyteorder("<")
        out[name] = np.frombuffer(buf[b:end], dtype=dt).astype(_NP[e["dtype"]]).reshape(e["shape"])
    return out, meta


def checkpoint_model_file(path):
    """model.safetensors of a ditto checkpoint: DIR/latest's step directory, DIR/model.safetensors,
    or `path` itself when it is a file (Note [Checkpoint layout] in core/checkpoint/checkpoint.h)."""
    if os.path.isfile(path):
        return path
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip(), "model.safetensors")
    direct = os.path.join(path, "model.safetensors")
    if os.path.isfile(direct):
        return direct
    raise FileNotFoundError(f"{path}: neither a file, nor a checkpoint directory with 'latest' "
                            f"or model.safetensors")


# ---- the model ----------------------------------------------------------------------------------
def param_shapes(cfg):
    """nanoGPT's named_parameters() names and shapes, in its order (lm_head.weight is wte, tied,
    so not listed)."""
    C, V, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"]
    bias = cfg["bias"]
    shapes = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (cfg["block_size"], C))]

    def linear(name, out, inp):
        shapes.append((name + ".weight", (out, inp)))
        if bias:
            shapes.append((name + ".bias", (out,)))

    def layernorm(name):
        shapes.append((name + ".weight", (C,)))
        if bias:
            shapes.append((name + ".bias", (C,)))

    for l in range(L):
        h = f"transformer.h.{l}."
        layernorm(h + "ln_1")
        linear(h + "attn.c_attn", 3 * C, C)
        linear(h + "attn.c_proj", C, C)
        layernorm(h + "ln_2")
        linear(h + "mlp.c_fc", 4 * C, C)
        linear(h + "mlp.c_proj", C, 4 * C)
    layernorm("transformer.ln_f")
    return shapes


def config_from_params(params, n_head, block_size=None):
    """GPT config read off nanoGPT-named parameter shapes (n_head is not in the shapes)."""
    V, C = params["transformer.wte.weight"].shape
    L = 0
    while f"transformer.h.{L}.ln_1.weight" in params:
        L += 1
    return dict(n_layer=L, n_head=n_head, n_embd=C, vocab_size=V,
                block_size=block_size or params["transformer.wpe.weight"].shape[0],
                bias="transformer.ln_f.bias" in params, dropout=0.0)


def init_params(cfg, seed):
    """nanoGPT's initialisation (Note [GPT reference fixture]) as float32 torch tensors by name."""
    g = torch.Generator().manual_seed(seed)
    std_proj = 0.02 / math.sqrt(2 * cfg["n_layer"])
    P = {}
    for name, shape in param_shapes(cfg):
        if name.endswith(".bias"):
            t = torch.zeros(shape)
        elif len(shape) == 1:  # LayerNorm weight
            t = torch.ones(shape)
        else:
            std = std_proj if name.endswith("c_proj.weight") else 0.02
            t = torch.empty(shape).normal_(0.0, std, generator=g)
        P[name] = t
    if cfg["bias"]:
        for name, t in P.items():
            if name.endswith(".bias"):
                t.add_(torch.empty(t.shape).normal_(0.0, 0.02, generator=g))
            elif t.dim() == 1:
                t.add_(torch.empty(t.shape).normal_(0.0, 0.1, generator=g))
    return P


def forward(P, cfg, idx):
    """logits [B, T, V] of idx [B, T] (int64) under parameters P (name -> tensor)."""
    B, T = idx.shape
    C, nh = cfg["n_embd"], cfg["n_head"]
    hs = C // nh

    def ln(x, name):
        return F.layer_norm(x, (C,), P[name + ".weight"], P.get(name + ".bias"), LN_EPS)

    def lin(x, name):
        return F.linear(x, P[name + ".weight"], P.get(name + ".bias"))

    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:T]
    for l in range(cfg["n_layer"]):
        h = f"transformer.h.{l}."
        q, k, v = lin(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.reshape(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + lin(y, h + "attn.c_proj")
        m = F.gelu(lin(ln(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh")
        x = x + lin(m, h + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return F.linear(x, P["transformer.wte.weight"])


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def nanogpt_lr(it, r=RECIPE):
    """nanoGPT train.py get_lr(it)."""
    if it < r["warmup_iters"]:
        return r["learning_rate"] * (it + 1) / (r["warmup_iters"] + 1)
    if it > r["lr_decay_iters"]:
        return r["min_lr"]
    ratio = (it - r["warmup_iters"]) / (r["lr_decay_iters"] - r["warmup_iters"])
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return r["min_lr"] + coeff * (r["learning_rate"] - r["min_lr"])


def train(P, cfg, xs, ys, steps, r=RECIPE):
    """Runs `steps` nanoGPT training steps on P (modified in place; leaves requires_grad set) on
    batches xs[it], ys[it]; returns the loss of each step before its update."""
    for t in P.values():
        t.requires_grad_(True)
    params = list(P.values())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": r["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=r["learning_rate"], betas=(r["beta1"], r["beta2"]),
                            eps=r["eps"], foreach=False)
    losses = []
    for it in range(steps):
        for g in opt.param_groups:
            g["lr"] = nanogpt_lr(it, r)
        loss = loss_of(forward(P, cfg, xs[it]), ys[it])
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, r["grad_clip"])
        opt.step()
    return losses


def deterministic():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)


# ---- make-fixture -------------------------------------------------------------------------------
def text_tokens(path):
    data = open(path, "rb").read()
    vocab = sorted(set(data))
    stoi = {b: i for i, b in enumerate(vocab)}
    tokens = np.array([stoi[b] for b in data], dtype=np.int64)
    return tokens[:int(len(data) * 0.9)], bytes(vocab)


def make_batches(train_tokens, steps, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    data = torch.from_numpy(train_tokens)
    xs, ys = [], []
    for _ in range(steps):
        ix = torch.randint(len(data) - T, (B,), generator=g)
        xs.append(torch.stack([data[i:i + T] for i in ix]))
        ys.append(torch.stack([data[i + 1:i + 1 + T] for i in ix]))
    return torch.stack(xs), torch.stack(ys)


def fixture_variant(bias, xs, ys, vocab, text_path):
    cfg = dict(FIXTURE_CONFIG, vocab_size=len(vocab), bias=bias)
    steps = RECIPE["steps"]
    P = init_params(cfg, SEED)
    init = {n: t.clone() for n, t in P.items()}
    with torch.no_grad():
        logits0 = forward(P, cfg, xs[0])
        loss0 = loss_of(logits0, ys[0])
    losses = train(P, cfg, xs, ys, steps)
    # torch's own float32 error: the same computation in float64
    P64 = {n: t.double() for n, t in init.items()}
    with torch.no_grad():
        logits64 = forward(P64, cfg, xs[0])
        loss64 = loss_of(logits64, ys[0])
    losses64 = train(P64, cfg, xs, ys, steps)
    scale = logits64.abs().max().item()
    dev = dict(logits_max_abs_over_max_abs=(logits0.double() - logits64).abs().max().item() / scale,
               loss0=abs(loss0.item() - loss64.item()),
               losses=max(abs(a - b) for a, b in zip(losses, losses64)),
               final_rel=max(((P[n].detach().double() - P64[n].detach()).norm() /
                              (P64[n].detach() - init[n].double()).norm()).item() for n in P))
    tensors = {n: t.numpy() for n, t in init.items()}
    tensors.update({"final." + n: t.detach().numpy() for n, t in P.items()})
    tensors.update(x=xs.numpy(), y=ys.numpy(), logits0=logits0.numpy(),
                   loss0=np.array(loss0.item(), dtype=np.float32),
                   losses=np.array(losses, dtype=np.float32))
    meta = {"generated_by": "tools/gpt_reference.py make-fixture",
            "torch_version": torch.__version__, "numpy_version": np.__version__,
            "config": json.dumps(cfg), "batch_size": str(BATCH_SIZE), "seed": str(SEED),
            "recipe": json.dumps(RECIPE),
            "recipe_text": ("nanoGPT: for it in range(steps): lr = get_lr(it) (linear warmup "
                            "learning_rate*(it+1)/(warmup_iters+1), cosine to min_lr at "
                            "lr_decay_iters); loss = cross_entropy(forward(x[it]), y[it]); "
                            "backward; clip_grad_norm_(params, grad_clip); torch.optim.AdamW("
                            "betas=(beta1, beta2), eps, weight_decay on params with dim >= 2, "
                            "0 on the others, foreach=False).step(); losses[it] = loss"),
            "lrs": json.dumps([nanogpt_lr(it) for it in range(steps)]),
            "init": ("nanoGPT _init_weights, torch.Generator().manual_seed(seed), normal_ in "
                     "named_parameters order" +
                     ("; then biases += normal(0, 0.02), LayerNorm weights += normal(0, 0.1)"
                      if bias else "")),
            "data": (f"{os.path.basename(text_path)}: first 90% of the bytes, tokens = index in "
                     f"the sorted distinct bytes; window starts torch.randint(len(train) - T, (B,)) "
                     f"with torch.Generator().manual_seed({DATA_SEED})"),
            "vocab_hex": vocab.hex(),
            "model": "nanoGPT GPT, dropout 0, GELU tanh approximation, lm_head tied to wte, "
                     "LayerNorm eps 1e-5",
            "tensors": "nanoGPT names = initial parameters; final.<name> = after the steps; "
                       "x, y [steps, B, T] batches; logits0 [B, T, V] and loss0 on batch 0; "
                       "losses [steps]",
            "torch_f32_vs_f64": json.dumps(dev)}
    return tensors, meta, dev


def cmd_make_fixture(a):
    deterministic()
    train_tokens, vocab = text_tokens(a.text)
    T = FIXTURE_CONFIG["block_size"]
    xs, ys = make_batches(train_tokens, RECIPE["steps"], BATCH_SIZE, T, DATA_SEED)
    for bias in (False, True):
        tensors, meta, dev = fixture_variant(bias, xs, ys, vocab, a.text)
        path = os.path.join(a.out, f"gpt_ref_{'bias' if bias else 'nobias'}.safetensors")
        save_safetensors(path, tensors, meta)
        print(f"wrote {path} ({os.path.getsize(path)} bytes): loss0 {tensors['loss0']:.6f}, "
              f"losses {' '.join(f'{v:.5f}' for v in tensors['losses'])}")
        print(f"  torch float32 vs float64: {meta['torch_f32_vs_f64']}")
    return 0


# ---- compare ------------------------------------------------------------------------------------
def cmd_compare(a):
    deterministic()
    fx, meta = load_safetensors(a.fixture)
    cfg = json.loads(meta["config"])
    recipe = json.loads(meta["recipe"])
    path = checkpoint_model_file(a.checkpoint)
    got, gmeta = load_safetensors(path)
    steps = a.steps if a.steps is not None else int(gmeta.get("ditto.step", recipe["steps"]))
    names = [n for n, _ in param_shapes(cfg)]
    bad = False
    extra = sorted(set(got) - set(names) - {"lm_head.weight"})
    missing = [n for n in names if n not in got]
    if missing or extra:
        print(f"FAIL names: missing {missing}, unexpected {extra}")
        return 1
    for n in names:
        if tuple(got[n].shape) != tuple(fx[n].shape):
            print(f"FAIL {n}: shape {tuple(got[n].shape)}, fixture {tuple(fx[n].shape)}")
            bad = True
    if bad:
        return 1
    if not 0 <= steps <= len(fx["x"]):
        print(f"FAIL steps {steps}: the fixture has {len(fx['x'])} batches")
        return 1
    xs, ys = torch.from_numpy(fx["x"]), torch.from_numpy(fx["y"])
    P = {n: torch.from_numpy(fx[n].copy()) for n in names}
    torch_losses = train(P, cfg, xs, ys, steps, recipe) if steps else []
    print(f"{path}: {steps} steps of the fixture's recipe ({a.fixture}), torch {torch.__version__}")
    print(f"{'parameter':40s} {'max|ditto-torch|':>17s} {'rel to update':>14s}")
    worst = 0.0
    for n in names:
        t = P[n].detach().double()
        d = torch.from_numpy(got[n].astype(np.float64))
        upd = (t - torch.from_numpy(fx[n].astype(np.float64))).norm().item()
        rel = (d - t).norm().item() / upd if upd > 0 else (d - t).norm().item()
        worst = max(worst, rel)
        print(f"{n:40s} {(d - t).abs().max().item():17.3e} {rel:14.3e}")
    Pd = {n: torch.from_numpy(got[n].copy()) for n in names}
    with torch.no_grad():
        ld = [loss_of(forward(Pd, cfg, xs[i]), ys[i]).item() for i in range(len(xs))]
        lt = [loss_of(forward(P, cfg, xs[i]), ys[i]).item() for i in range(len(xs))]
    print("loss on the fixture's batches with ditto's parameters: " + " ".join(f"{v:.6f}" for v in ld))
    print("                                    with torch's:      " + " ".join(f"{v:.6f}" for v in lt))
    if torch_losses:
        print("torch's training losses: " + " ".join(f"{v:.6f}" for v in torch_losses))
    ok = worst <= a.tol
    print(f"{'ok' if ok else 'FAIL'}: largest relative difference {worst:.3e} (tolerance {a.tol:g})")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    m = sub.add_parser("make-fixture")
    m.add_argument("--text", default=os.path.join(root, "examples", "data", "shakespeare.txt"))
    m.add_argument("--out", default=os.path.join(root, "tests", "data"))
    c = sub.add_parser("compare")
    c.add_argument("--checkpoint", required=True)
    c.add_argument("--fixture", default=os.path.join(root, "tests", "data", "gpt_ref_nobias.safetensors"))
    c.add_argument("--steps", type=int)
    c.add_argument("--tol", type=float, default=1e-3)
    a = p.parse_args()
    return cmd_make_fixture(a) if a.cmd == "make-fixture" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
