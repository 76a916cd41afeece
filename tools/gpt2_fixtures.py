#!/usr/bin/python3
"""Fixtures of issue 32 (a tiny GPT-2 in the formats people bring) and the check that ditto's
exported files load in PyTorch. Run with Debian's /usr/bin/python3 (torch, numpy); no
`safetensors` or `transformers` package: the formats are read and written by hand below.

  gpt2_fixtures.py make [--out tests/data/gpt2_tiny]
      Writes, for a tiny GPT-2 (CONFIG: 2 layers, 4 heads, n_embd 32, block_size 64, vocab 512,
      biases) with random weights (gpt_reference.init_params with biases: nanoGPT's init, then
      every bias and LayerNorm gain perturbed so that a bias read from the wrong place shows):
        model_f32.bin, model_bf16.bin   llm.c model files (train_gpt2.py write_model: header of
                                        256 int32, magic 20240326, version 3 / 5; wte padded to a
                                        multiple of 128; layer-major parameters)
        hf/model.safetensors            Hugging Face's GPT-2 layout as the hub's gpt2 file: names
                                        without "transformer.", Conv1D weights [in, out], the
                                        attention mask buffers h.N.attn.bias (F32 [1, 1, T, T])
        hf/config.json                  its n_head, n_layer, n_embd, n_ctx, vocab_size
        train.bin, val.bin, meta.pkl    nanoGPT's data: raw uint16 tokens, meta.pkl {vocab_size}
        tiny_train_000001.bin, tiny_val_000000.bin
                                        llm.c's data shards (header 256 int32: 20240520, 1,
                                        token count; uint16 tokens), the same tokens
        expected.safetensors            a fixed batch (idx, targets [2, 64] I64) and PyTorch's
                                        logits [2, 64, 512] and mean cross-entropy loss: logits_f32
                                        / loss_f32 with the f32 weights, logits_bf16 / loss_bf16
                                        computed in f32 with the weights rounded to bf16 (what the
                                        bf16 file holds)
      The forward is gpt_reference.forward (nanoGPT's GPT, tanh GELU as GPT-2 and ditto).
  gpt2_fixtures.py check-exports [--build build] [--fixtures tests/data/gpt2_tiny]
      Trains the f32 fixture 3 steps with ditto-train (--init-from, --export llmc / llmc-bf16 /
      hf), loads each exported file here in PyTorch with this script's own readers (llm.c's
      layout; Hugging Face's names and Conv1D transposes as nanoGPT's from_pretrained), and
      checks that the FNV-1a of the parameters PyTorch read equals the params_checksum ditto
      printed (bf16: of a --dtype bf16 --eval-only run from the f32 export), that the header and
      names are llm.c's / Hugging Face's, and that the forward in PyTorch gives a finite loss;
      also that --export of the untrained fixture gives back the fixture's logits in PyTorch.
      Prints one line per check; exit status 1 when one fails.
"""
import argparse
import json
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
from params_checksum import bf16_canonical_nans, fnv1a  # noqa: E402

CONFIG = dict(n_layer=2, n_head=4, n_embd=32, block_size=64, vocab_size=512, bias=True,
              dropout=0.0)
SEED = 20240326
DATA_SEED = 20240520
B = 2
TRAIN_TOKENS, VAL_TOKENS = 8192, 2048
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
LAYER_ORDER = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
               "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
               "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


# ---- llm.c model file (Note [llm.c model file] in core/checkpoint/gpt_weights.h) -----------------------
def bf16_bytes(t):
    return bf16_canonical_nans(t.to(torch.bfloat16).view(torch.int16).numpy()).astype("<i2").tobytes()


def write_llmc(path, P, cfg, version):
    """train_gpt2.py write_model: header, then the parameters layer-major, wte padded to 128."""
    V, C, L = cfg["vocab_size"], cfg["n_embd"], cfg["n_layer"]
    Vp = (V + 127) // 128 * 128
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20240326, version, cfg["block_size"], V, L, cfg["n_head"], C, Vp]
    wte = torch.cat([P["transformer.wte.weight"], torch.zeros(Vp - V, C)])
    order = [wte, P["transformer.wpe.weight"]]
    for k in LAYER_ORDER:
        order += [P[f"transformer.h.{l}.{k}"] for l in range(L)]
    order += [P["transformer.ln_f.weight"], P["transformer.ln_f.bias"]]
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        for t in order:
            f.write(t.numpy().astype("<f4").tobytes() if version == 3 else bf16_bytes(t))
    os.replace(path + ".tmp", path)


def read_llmc(path):
    """(cfg, P name -> f32 tensor, dtype) of an llm.c model file, written here independently of
    ditto's reader: the padded wte rows dropped."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:1024], dtype="<i4")
    assert h[0] == 20240326 and h[1] in (3, 5), f"{path}: header {h[:8]}"
    T, V, L, nh, C, Vp = (int(x) for x in h[2:8])
    cfg = dict(n_layer=L, n_head=nh, n_embd=C, block_size=T, vocab_size=V, bias=True, dropout=0.0)
    elem = 4 if h[1] == 3 else 2
    pos = 1024

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        b = raw[pos:pos + n * elem]
        pos += n * elem
        if elem == 4:
            return torch.from_numpy(np.frombuffer(b, dtype="<f4").copy()).reshape(shape)
        i = np.frombuffer(b, dtype="<u2").astype(np.uint32) << 16
        return torch.from_numpy(i.view(np.float32).copy()).reshape(shape)

    P = {"transformer.wte.weight": take(Vp, C)[:V].clone(), "transformer.wpe.weight": take(T, C)}
    shapes = dict(ref.param_shapes(cfg))
    for k in LAYER_ORDER:
        for l in range(L):
            name = f"transformer.h.{l}.{k}"
            P[name] = take(*shapes[name])
    P["transformer.ln_f.weight"] = take(C)
    P["transformer.ln_f.bias"] = take(C)
    assert pos == len(raw), f"{path}: {len(raw) - pos} bytes past the parameters"
    return cfg, P, ("f32" if elem == 4 else "bf16")


# ---- Hugging Face GPT-2 safetensors ------------------------------------------------------------
def hf_tensors(P, cfg, prefix=""):
    out = {}
    for name, _ in ref.param_shapes(cfg):
        t = P[name]
        if name.endswith(CONV1D):
            t = t.t().contiguous()
        out[prefix + name[len("transformer."):]] = t.numpy()
    return out


def read_hf(path, n_head, block_size=None):
    """nanoGPT's from_pretrained mapping: names with or without "transformer.", mask buffers
    ignored, Conv1D weights transposed to Linear's layout."""
    T, meta = ref.load_safetensors(path)
    P = {}
    for k, a in T.items():
        name = k if k.startswith("transformer.") else "transformer." + k
        if re.search(r"\.attn\.(bias|masked_bias)$", name) and a.ndim == 4:
            continue
        if k == "lm_head.weight":
            continue
        t = torch.from_numpy(np.array(a))
        P[name] = t.t().contiguous() if name.endswith(CONV1D) else t
    cfg = ref.config_from_params(P, n_head)
    return cfg, P, meta


# ---- data ----------------------------------------------------------------------------------------
def write_shard(path, tokens):
    """llm.c dev/data/data_common.py write_datafile (GPT-2: magic 20240520, version 1, uint16)."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def round_bf16(P):
    return {k: v.to(torch.bfloat16).to(torch.float32) for k, v in P.items()}


def cmd_make(a):
    ref.deterministic()
    out = a.out
    os.makedirs(os.path.join(out, "hf"), exist_ok=True)
    cfg = CONFIG
    P = ref.init_params(cfg, SEED)
    write_llmc(os.path.join(out, "model_f32.bin"), P, cfg, 3)
    write_llmc(os.path.join(out, "model_bf16.bin"), P, cfg, 5)
    T, L = cfg["block_size"], cfg["n_layer"]
    hf = hf_tensors(P, cfg)
    mask = np.tril(np.ones((T, T), dtype=np.float32)).reshape(1, 1, T, T)
    for l in range(L):  # the hub's gpt2 file holds these buffers; ditto ignores them
        hf[f"h.{l}.attn.bias"] = mask
    ref.save_safetensors(os.path.join(out, "hf", "model.safetensors"), hf, {"format": "pt"})
    with open(os.path.join(out, "hf", "config.json"), "w") as f:
        json.dump(dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=L,
                       n_head=cfg["n_head"], n_embd=cfg["n_embd"], n_ctx=T, n_positions=T,
                       vocab_size=cfg["vocab_size"], activation_function="gelu_new",
                       layer_norm_epsilon=1e-5), f, indent=2)
        f.write("\n")
    g = torch.Generator().manual_seed(DATA_SEED)
    tokens = torch.randint(cfg["vocab_size"], (TRAIN_TOKENS + VAL_TOKENS,), generator=g).numpy()
    train, val = tokens[:TRAIN_TOKENS], tokens[TRAIN_TOKENS:]
    train.astype("<u2").tofile(os.path.join(out, "train.bin"))
    val.astype("<u2").tofile(os.path.join(out, "val.bin"))
    with open(os.path.join(out, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": cfg["vocab_size"]}, f, protocol=2)
    write_shard(os.path.join(out, "tiny_train_000001.bin"), train)
    write_shard(os.path.join(out, "tiny_val_000000.bin"), val)
    # The fixed batch: windows at 0 and 1000 of the training tokens.
    starts = [0, 1000]
    x = torch.tensor(np.stack([train[s:s + T] for s in starts]).astype(np.int64))
    y = torch.tensor(np.stack([train[s + 1:s + T + 1] for s in starts]).astype(np.int64))
    with torch.no_grad():
        logits = ref.forward(P, cfg, x)
        loss = ref.loss_of(logits, y)
        Pb = round_bf16(P)
        logits_b = ref.forward(Pb, cfg, x)
        loss_b = ref.loss_of(logits_b, y)
        P64 = {k: v.double() for k, v in P.items()}
        dev = (ref.forward(P64, cfg, x) - logits.double()).abs().max().item()
    ref.save_safetensors(os.path.join(out, "expected.safetensors"), {
        "idx": x.numpy(), "targets": y.numpy(),
        "logits_f32": logits.numpy(), "loss_f32": np.array(loss.item(), dtype=np.float32),
        "logits_bf16": logits_b.numpy(), "loss_bf16": np.array(loss_b.item(), dtype=np.float32),
    }, {"config": json.dumps(cfg), "torch": torch.__version__, "seed": str(SEED),
        "torch_f32_vs_f64": f"{dev:.3e}",
        "params_fnv1a_f32": f"{fnv1a([P[n].numpy() for n, _ in ref.param_shapes(cfg)]):016x}"})
    print(f"wrote {out}: loss_f32 {loss.item():.6f} loss_bf16 {loss_b.item():.6f} "
          f"(torch f32 vs f64 logits: {dev:.2e})")
    return 0


def cmd_check_exports(a):
    ref.deterministic()
    train = os.path.join(a.build, "bin", "ditto-train")
    fx = a.fixtures
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and bool(cond)

    def run(*args):
        r = subprocess.run([train, "--model", "gpt", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"ditto-train {' '.join(args)}: exit {r.returncode}: {r.stderr}")
        return int(re.search(r"params_checksum=([0-9a-f]{16})", r.stdout).group(1), 16)

    exp, meta = ref.load_safetensors(os.path.join(fx, "expected.safetensors"))
    x, y = torch.from_numpy(exp["idx"]), torch.from_numpy(exp["targets"])
    with tempfile.TemporaryDirectory() as tmp:
        f = lambda n: os.path.join(tmp, n)  # noqa: E731
        init = os.path.join(fx, "model_f32.bin")
        # Untrained: the exports hold the fixture's weights, so PyTorch's logits are the fixture's.
        run("--init-from", init, "--eval-only", "--eval-iters", "0", "--devices", "1",
            "--export", "hf", f("untrained.safetensors"))
        cfg, P, _ = read_hf(f("untrained.safetensors"), CONFIG["n_head"])
        with torch.no_grad():
            lg = ref.forward(P, cfg, x)
        d = (lg - torch.from_numpy(exp["logits_f32"])).abs().max().item()
        check(d == 0.0, f"untrained --export hf loads in PyTorch: logits equal the fixture's (max diff {d})")
        # Trained 3 steps, exported in every format.
        args = ["--init-from", init, "--max-iters", "3", "--eval-iters", "1", "--eval-interval",
                "3", "--batch-size", "4", "--warmup-iters", "1", "--lr-decay-iters", "3",
                "--sample", "0", "--devices", "2"]
        ck = run(*args, "--export", "llmc", f("t.bin"))
        ck_hf = run(*args, "--export", "hf", f("t.safetensors"))
        check(ck == ck_hf, f"the two training runs agree: params_checksum {ck:016x}")
        run(*args, "--export", "llmc-bf16", f("t_bf16.bin"))
        ck_b = run("--init-from", f("t.bin"), "--dtype", "bf16", "--eval-only", "--eval-iters",
                   "0", "--devices", "1")
        for path, kind in ((f("t.bin"), "llmc"), (f("t.safetensors"), "hf"),
                           (f("t_bf16.bin"), "llmc-bf16")):
            if kind == "hf":
                cfg, P, meta = read_hf(path, CONFIG["n_head"])
                raw = open(path, "rb").read()
                n = struct.unpack("<Q", raw[:8])[0]
                names = json.loads(raw[8:8 + n])
                check("transformer.h.0.attn.c_attn.weight" in names and
                      names["transformer.h.0.attn.c_attn.weight"]["shape"] == [32, 96] and
                      meta.get("format") == "pt",
                      f"{kind}: Hugging Face's names, Conv1D [in, out] shapes, format pt")
                dtype = "f32"
            else:
                cfg, P, dtype = read_llmc(path)
            check(cfg["n_layer"] == 2 and cfg["n_head"] == 4 and cfg["n_embd"] == 32 and
                  cfg["vocab_size"] == 512 and cfg["block_size"] == 64,
                  f"{kind}: the configuration read in PyTorch: {cfg}")
            order = [P[name] for name, _ in ref.param_shapes(cfg)]
            if dtype == "bf16":
                got = fnv1a([bf16_bytes(t) for t in order])
                want = ck_b
            else:
                got = fnv1a([t.numpy() for t in order])
                want = ck
            check(got == want, f"{kind}: FNV-1a of the parameters PyTorch read {got:016x} = "
                               f"ditto's params_checksum {want:016x}")
            with torch.no_grad():
                loss = ref.loss_of(ref.forward(P, cfg, x), y).item()
            check(math.isfinite(loss), f"{kind}: PyTorch's forward of the exported model: loss {loss:.6f}")
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", default="tests/data/gpt2_tiny")
    c = sub.add_parser("check-exports")
    c.add_argument("--build", default="build")
    c.add_argument("--fixtures", default="tests/data/gpt2_tiny")
    a = ap.parse_args()
    return cmd_make(a) if a.cmd == "make" else cmd_check_exports(a)


if __name__ == "__main__":
    sys.exit(main())
