#!/usr/bin/env python3
"""Writes token data as llm.c and nanoGPT prepare it, for tests and measurements (issue 32).

llm.c (dev/data/data_common.py write_datafile): OUT/NAME_val_000000.bin and
OUT/NAME_train_000001.bin ... (--shards of them), each a header of 256 int32 (magic 20240520,
version 1, token count; --llama3: 20240801, 7, uint32 tokens) then the tokens.
nanoGPT (data/*/prepare.py): OUT/train.bin and OUT/val.bin, raw uint16 tokens, no header.

The tokens are the bytes of --text (cycled to the length asked for; vocab 256 holds them), or a
fixed pseudo-random stream below --vocab. Standard library only (no numpy), written in 4 MiB
pieces, so that a 2 GiB set costs little memory:

  tools/make_token_data.py --format llmc --out /tmp/d --name tiny --shards 3 \\
      --train-tokens 30000 --val-tokens 5000 --text examples/data/shakespeare.txt
  tools/make_token_data.py --format llmc --out /tmp/big --shards 8 --train-tokens 1073741824
"""
import argparse
import array
import os
import struct
import sys


def token_stream(args):
    """Yields array('H' or 'I') pieces of tokens forever."""
    code = "I" if args.llama3 else "H"
    if args.text:
        data = open(args.text, "rb").read()
        if not data:
            sys.exit(f"make_token_data.py: --text {args.text} is empty")
        piece = array.array(code, list(data))
        while True:
            yield piece
    x = args.seed & 0xFFFFFFFF
    n = 1 << 20
    pieces = []
    for _ in range(4):  # four distinct 1M-token pieces, cycled
        p = array.array(code, [0]) * n
        for i in range(n):
            x = (1103515245 * x + 12345) & 0x7FFFFFFF
            p[i] = (x >> 8) % args.vocab
        pieces.append(p)
    k = 0
    while True:
        yield pieces[k % 4]
        k += 1


class Tokens:
    def __init__(self, args):
        self.it = token_stream(args)
        self.buf = self.it.__next__()[:0]

    def take(self, n):
        """The next n tokens, as arrays of at most 2M tokens."""
        while n > 0:
            while len(self.buf) == 0:
                self.buf = next(self.it)
            k = min(n, len(self.buf), 2 << 20)
            yield self.buf[:k]
            self.buf = self.buf[k:]
            n -= k


def write_file(path, tokens, n, args):
    with open(path, "wb") as f:
        if args.format == "llmc":
            header = [0] * 256
            header[0], header[1] = (20240801, 7) if args.llama3 else (20240520, 1)
            header[2] = n
            f.write(struct.pack("<256i", *header))
        for piece in tokens.take(n):
            if sys.byteorder != "little":
                piece = array.array(piece.typecode, piece)
                piece.byteswap()
            piece.tofile(f)
    print(f"{path}: {n} tokens")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--format", choices=["llmc", "nanogpt"], required=True)
    p.add_argument("--out", required=True, help="directory to write into (created)")
    p.add_argument("--name", default="tiny", help="llm.c's dataset name (NAME_train_*.bin)")
    p.add_argument("--shards", type=int, default=1, help="llm.c training shards")
    p.add_argument("--train-tokens", type=int, required=True, help="training tokens in all")
    p.add_argument("--val-tokens", type=int, default=0, help="validation tokens (0: none)")
    p.add_argument("--text", help="take the tokens from this file's bytes")
    p.add_argument("--vocab", type=int, default=50257, help="pseudo-random tokens below this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--llama3", action="store_true", help="llm.c magic 20240801, uint32 tokens")
    args = p.parse_args()
    if args.llama3 and args.format != "llmc":
        sys.exit("make_token_data.py: --llama3 is an llm.c format")
    os.makedirs(args.out, exist_ok=True)
    tokens = Tokens(args)
    if args.format == "nanogpt":
        write_file(os.path.join(args.out, "train.bin"), tokens, args.train_tokens, args)
        if args.val_tokens:
            write_file(os.path.join(args.out, "val.bin"), tokens, args.val_tokens, args)
        return
    if args.val_tokens:  # llm.c's fineweb.py: shard 0 is the val split
        write_file(os.path.join(args.out, f"{args.name}_val_000000.bin"), tokens,
                   args.val_tokens, args)
    per = args.train_tokens // args.shards
    for k in range(args.shards):
        n = per if k + 1 < args.shards else args.train_tokens - per * (args.shards - 1)
        write_file(os.path.join(args.out, f"{args.name}_train_{k + 1:06d}.bin"), tokens, n, args)


if __name__ == "__main__":
    main()
