#!/usr/bin/python3
"""Convert nanoGPT's checkpoint (train.py's out_dir/ckpt.pt) to a safetensors file ditto reads.

    /usr/bin/python3 tools/nanogpt_to_safetensors.py out/ckpt.pt model.safetensors
    build/bin/ditto-train --model gpt --init-from model.safetensors --data ...

ckpt.pt is torch.save's pickle (a zip archive; before torch 1.6 a bare pickle): ditto does not
read it (unpickling runs Python), so this script, with Debian's /usr/bin/python3 and its torch
(python3-torch; no other package), does. It takes the checkpoint's `model` state_dict (or a
state_dict saved alone), strips torch.compile's `_orig_mod.` prefix (and DDP's `module.`) as
nanoGPT's sample.py does, drops the causal-mask buffers (`.attn.bias` of torch < 2.0's model) and
writes every tensor under nanoGPT's names, in its dtype (F32, BF16 or F16), with `__metadata__` `format: pt` and `ditto.n_head` (from
`model_args`, which ditto needs to split the heads). Only the parameters come over: nanoGPT's
optimizer state, iter_num and schedule do not (ditto's --resume takes its own checkpoints), so
the converted model starts a new run, as nanoGPT's init_from='gpt2' does. Prints one line: the
file written, the tensors and the sizes. Exits 1 with a message on a file that is not a nanoGPT
checkpoint (or not a GPT's), and on a destination that is a directory or the checkpoint itself;
the destination is written under a temporary name and renamed, so a failure leaves it as it was.
"""
import sys

DTYPES = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16"}


def fail(msg):
    sys.exit(f"nanogpt_to_safetensors.py: {msg}")


def tensor_bytes(t):
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
        t = t.view(torch.int16)
    return t.numpy().tobytes()  # little-endian on every machine torch runs on


def convert(src, dst):
    import os

    if os.path.isdir(dst):
        fail(f"'{dst}': expected the safetensors file to write, got a directory")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        fail(f"'{dst}': expected a file other than the checkpoint read ('{src}'): writing it "
             "would replace the checkpoint, and its optimizer state with it")
    try:
        import torch
    except ImportError:
        fail("needs torch (Debian: apt-get install python3-torch)")
    try:
        ck = torch.load(src, map_location="cpu")
    except Exception as e:  # not torch.save's format
        fail(f"'{src}': cannot be read by torch.load: {e}")
    if (isinstance(ck, dict) and "model" not in ck and ck
            and all(torch.is_tensor(v) for v in ck.values())):
        ck = {"model": ck}  # model.state_dict() saved alone: no model_args, no iter_num
    if not isinstance(ck, dict) or not isinstance(ck.get("model"), dict):
        fail(f"'{src}': expected nanoGPT's checkpoint (a dict with 'model', its state_dict), "
             f"got {type(ck).__name__}" + (f" with keys {sorted(ck)[:8]}" if isinstance(ck, dict)
                                           else ""))
    sd = {}
    for k, v in ck["model"].items():
        for prefix in ("_orig_mod.", "module."):  # torch.compile's, DDP's
            if k.startswith(prefix):
                k = k[len(prefix):]
        if k.endswith(".attn.bias") and v.dim() == 4:  # the causal mask (torch < 2.0), not a weight
            continue
        if not torch.is_tensor(v) or str(v.dtype) not in DTYPES:
            fail(f"'{src}': model['{k}']: expected a float32, bfloat16 or float16 tensor, got "
                 f"{getattr(v, 'dtype', type(v).__name__)}")
        sd[k] = v
    # A GPT's state_dict: nanoGPT's names (transformer.wte.weight, transformer.h.N...), not
    # another model's (ditto would refuse the file later, after the conversion said it worked).
    if "transformer.wte.weight" not in sd or not any(k.startswith("transformer.h.") for k in sd):
        fail(f"'{src}': expected nanoGPT's GPT state_dict (transformer.wte.weight, "
             f"transformer.h.N.*), got keys {sorted(sd)[:6]}")
    args = ck.get("model_args") or {}
    meta = {"format": "pt"}
    if isinstance(args, dict) and isinstance(args.get("n_head"), int):
        meta["ditto.n_head"] = str(args["n_head"])
    header, blobs, offset = {"__metadata__": meta}, [], 0
    for k in sorted(sd):
        b = tensor_bytes(sd[k])
        header[k] = {"dtype": DTYPES[str(sd[k].dtype)], "shape": list(sd[k].shape),
                     "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    # gpt_reference's writer (needs numpy, which torch brings): a temporary and a rename, so a
    # failure leaves dst as it was.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpt_reference import write_safetensors

    try:
        write_safetensors(dst, header, blobs)
    except OSError as e:
        fail(f"'{dst}': cannot write: {e.strerror}")
    sizes = " ".join(f"{k}={args[k]}" for k in ("n_layer", "n_head", "n_embd", "block_size",
                                                "vocab_size", "bias") if k in args)
    print(f"wrote {dst}: {len(sd)} tensors from '{src}' ("
          + (f"{sizes}; " if sizes else "no model_args; ")
          + f"iter_num {ck.get('iter_num', '?')}: the optimizer state is not converted)")


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__, end="")
        sys.exit(0)
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    convert(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
