#!/usr/bin/python3
"""Load a ditto GPT checkpoint into nanoGPT's own GPT class and print its validation loss over the
evaluation windows ditto uses, to compare with the val loss ditto-train printed (issue 12: within
1e-4).

  /usr/bin/python3 tools/nanogpt_eval.py --nanogpt DIR --checkpoint CKPT --data FILE [--split val]

  --nanogpt DIR     a clone of https://github.com/karpathy/nanoGPT (its model.py is imported from
                    there; nothing of it is copied into this repository)
  --checkpoint CKPT a ditto-train --model gpt checkpoint directory (CKPT/latest names the step
                    directory) or one step directory of it
  --data FILE       the text ditto trained on (data/shakespeare.txt)
  --eval-iters N    evaluation batches (default 20, ditto-train's --eval-iters default; give the
                    run's value: the checkpoint does not record it)
  --split S         val (default) or train

nanoGPT's MLP uses nn.GELU(), the exact erf form; ditto's GELU is the tanh approximation (torch's
approximate='tanh', as GPT-2), so each block's mlp.gelu is replaced by nn.GELU(approximate='tanh')
after nanoGPT builds the model: the one change to nanoGPT's computation. On torch < 2 nanoGPT
uses its "slow attention" (masked softmax; it prints a WARNING saying so); its causal-mask buffers
(transformer.h.N.attn.bias) are not parameters and keep the values nanoGPT gives them.
lm_head.weight is transformer.wte.weight (tied), as in nanoGPT.

The windows mirror ditto's train::TextDataSource (Note [Text batches], core/data/text_source.h):
vocabulary = sorted distinct bytes, train = the first int(n * 0.9) tokens, val the rest; evaluation
batch k of split p (0 train, 1 val) has B windows, window j at offset
philox_u64(seed, stream_id(kStreamEvalBatch = 8, p << 32 | k), j) % (len(split) - T) in the split,
x = tokens[i:i+T], y = tokens[i+1:i+T+1]. The loss of a split is the mean over its eval_iters
batches of F.cross_entropy over the batch's B*T tokens (nanoGPT's estimate_loss). The checkpoint's
trainer.json gives the seed, batch_size, block_size, n_head (in "model": "gpt(n_layer=..,
n_head=.., ...)") and the vocabulary (checked against --data's).
"""
import argparse
import json
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402

# ---- Philox4x32-10 (Note [Philox layout] in core/numerics/random.h) -----------------------------
_M0, _M1, _W0, _W1, _MASK = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & _MASK, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK)
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return c0, c1, c2, c3


def philox_u32(seed, stream, index):
    block = index >> 2
    out = philox4x32_10((block & _MASK, block >> 32, stream & _MASK, stream >> 32),
                        (seed & _MASK, seed >> 32))
    return out[index & 3]


def philox_u64(seed, stream, index):
    return (philox_u32(seed, stream, 2 * index) << 32) | philox_u32(seed, stream, 2 * index + 1)


def stream_id(kind, sub):
    return (kind << 48) | (sub & ((1 << 48) - 1))


def self_test():
    """Random123's known answers (as tests/test_random.cpp checks ditto's)."""
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)
    assert philox4x32_10((_MASK,) * 4, (_MASK, _MASK)) == (0x408f276d, 0x41c83b0e, 0xa20bc7c6,
                                                           0x6d5451fd)
    assert philox4x32_10((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344),
                         (0xa4093822, 0x299f31d0)) == (0xd16cfe09, 0x94fdcceb, 0x5001e420,
                                                       0x24126ea1)
    assert philox_u64(0, 0, 1) == (0xbc57ac4c << 32) | 0x9b00dbd8


# ---- ditto's text source -----------------------------------------------------------------------
K_STREAM_EVAL_BATCH = 8
SPLIT_ID = {"train": 0, "val": 1}


def split_tokens(path, vocab=None):
    """(train tokens, val tokens, vocabulary bytes) of the text at `path`, as nanoGPT's
    prepare.py; `vocab` (the checkpoint's) must equal the text's sorted distinct bytes."""
    data = open(path, "rb").read()
    chars = bytes(sorted(set(data)))
    if vocab is not None and vocab != chars:
        sys.exit(f"nanogpt_eval: {path}: its vocabulary ({len(chars)} bytes) is not the "
                 f"checkpoint's ({len(vocab)} bytes): not the text ditto trained on")
    lut = np.zeros(256, dtype=np.int64)
    lut[list(chars)] = np.arange(len(chars))
    tokens = lut[np.frombuffer(data, dtype=np.uint8)]
    n = int(len(data) * 0.9)
    return tokens[:n], tokens[n:], chars


def eval_batch(tokens, seed, split, k, B, T):
    stream = stream_id(K_STREAM_EVAL_BATCH, SPLIT_ID[split] << 32 | k)
    starts = [philox_u64(seed, stream, j) % (len(tokens) - T) for j in range(B)]
    x = np.stack([tokens[i:i + T] for i in starts])
    y = np.stack([tokens[i + 1:i + 1 + T] for i in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


# ---- the checkpoint ----------------------------------------------------------------------------
def read_checkpoint(path):
    """(tensors, config dict) of a ditto GPT checkpoint directory or step directory."""
    model_file = ref.checkpoint_model_file(path)
    tensors, meta = ref.load_safetensors(model_file)
    trainer_json = os.path.join(os.path.dirname(model_file), "trainer.json")
    config = {}
    if os.path.isfile(trainer_json):
        with open(trainer_json) as f:
            config = json.load(f).get("config", {})
    return model_file, tensors, meta, config


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nanogpt", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--eval-iters", type=int)
    p.add_argument("--split", choices=("val", "train"), default="val")
    a = p.parse_args()
    self_test()
    if not os.path.isfile(os.path.join(a.nanogpt, "model.py")):
        sys.exit(f"nanogpt_eval: --nanogpt {a.nanogpt}: no model.py there (expected a clone of "
                 f"github.com/karpathy/nanoGPT)")
    sys.path.insert(0, os.path.abspath(a.nanogpt))
    import model as nanogpt  # nanoGPT's model.py

    model_file, tensors, meta, config = read_checkpoint(a.checkpoint)

    def setting(key):
        if key not in config:
            sys.exit(f"nanogpt_eval: {a.checkpoint}: the checkpoint's trainer.json has no "
                     f"config '{key}'")
        return config[key]

    model_name = setting("model")
    match = re.search(r"n_head=(\d+)", model_name)
    if not match:
        sys.exit(f"nanogpt_eval: {a.checkpoint}: model '{model_name}' is not ditto's GPT")
    n_head, B, T = int(match.group(1)), int(setting("batch_size")), int(setting("block_size"))
    seed = int(setting("seed"))
    eval_iters = a.eval_iters or 20
    vocab = bytes.fromhex(config["vocab"]) if "vocab" in config else None
    cfg = ref.config_from_params(tensors, n_head)
    torch.set_num_threads(os.cpu_count() or 1)
    model = nanogpt.GPT(nanogpt.GPTConfig(**{k: cfg[k] for k in (
        "block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias")}))
    for block in model.transformer.h:
        block.mlp.gelu = torch.nn.GELU(approximate="tanh")  # ditto's GELU (see the top)
    sd = model.state_dict()
    unknown = sorted(set(tensors) - set(sd))
    if unknown:
        sys.exit(f"nanogpt_eval: {model_file}: tensors nanoGPT's GPT does not have: {unknown}")
    for k, v in tensors.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            sys.exit(f"nanogpt_eval: {model_file}: {k}: shape {tuple(v.shape)}, nanoGPT's "
                     f"{tuple(sd[k].shape)}")
        sd[k] = torch.from_numpy(v.copy())
    if "lm_head.weight" in tensors and not np.array_equal(tensors["lm_head.weight"],
                                                          tensors["transformer.wte.weight"]):
        sys.exit(f"nanogpt_eval: {model_file}: lm_head.weight differs from transformer.wte.weight "
                 f"(nanoGPT ties them)")
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    params = {n for n, _ in model.named_parameters()} | {"lm_head.weight"}
    not_given = sorted(params - set(tensors) - {"lm_head.weight"})
    if not_given:
        sys.exit(f"nanogpt_eval: {model_file}: parameters missing: {not_given}")
    model.load_state_dict(sd, strict=True)
    model.eval()
    train_tokens, val_tokens, _ = split_tokens(a.data, vocab)
    tokens = val_tokens if a.split == "val" else train_tokens
    losses = torch.zeros(eval_iters)
    with torch.no_grad():
        for k in range(eval_iters):
            x, y = eval_batch(tokens, seed, a.split, k, B, T)
            _, loss = model(x, y)
            losses[k] = loss.item()
    print(f"nanoGPT model.py ({a.nanogpt}) with {model_file}: n_layer {cfg['n_layer']}, n_head "
          f"{n_head}, n_embd {cfg['n_embd']}, block_size {cfg['block_size']}, vocab "
          f"{cfg['vocab_size']}, bias {cfg['bias']}; GELU patched to approximate='tanh'")
    print(f"{a.split} loss {losses.mean().item():.6f} over {eval_iters} batches of {B} x {T} "
          f"(seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
