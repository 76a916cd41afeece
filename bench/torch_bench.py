#!/usr/bin/python3
"""PyTorch anchors for bench/compare.sh, with the same sizes, ranks and models as ditto-bench.

Run with Debian's /usr/bin/python3 (python3-torch is installed for it only).

  torch_bench.py collectives --ranks 2,4,8 --min-bytes 4096 --max-bytes 268435456 --csv FILE
      torch.distributed with the Gloo backend, one process per rank (torch.multiprocessing),
      all_reduce, broadcast, all_gather (and with --ops all_to_all: all_to_all_single with equal
      splits) of float32 tensors; time per call as nccl-tests measures it (calls back to back,
      then a barrier), algbw and busbw with nccl-tests' factors. Sizes as nccl-tests:
      all_gather's size is the gathered buffer, all_to_all's each rank's whole send buffer.
  torch_bench.py train [--part all|single|ddp] --csv FILE
      single-process training (torch.set_num_threads = all cores) of the 10-5-2 MLP (batch 32)
      and the 784-1024-1024-10 MLP (batch 256): SGD(lr 0.01, momentum 0.9), cross-entropy,
      synthetic data; median of 3 runs; and DistributedDataParallel with Gloo over 4 processes
      (global batch 256, 64 per rank, threads = cores / 4, at least 1) on the large MLP.
  torch_bench.py gpt --csv FILE [--seconds 2]
      single-process training (all cores) of nanoGPT's CPU configuration (n_layer 4, n_head 4,
      n_embd 128, block_size 64, batch 12, vocab 65, bias False, dropout 0), the model of
      tools/gpt_reference.py (nanoGPT's architecture, GELU tanh, tied head), as `ditto-bench gpt`
      runs it: one step = forward + cross-entropy, backward, clip_grad_norm_(1.0), AdamW(lr 1e-3,
      betas (0.9, 0.99), wd 0.1 on 2-D params), loss.item(); random tokens; tokens/s = B*T*steps/s,
      median of 3 runs.
"""
import argparse
import csv
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def append_rows(path, header, rows):
    fresh = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if fresh:
            w.writerow(header)
        w.writerows(rows)


BUS = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "broadcast": lambda n: 1.0, "all_to_all": lambda n: (n - 1) / n}
COLL_HEADER = ["backend", "op", "ranks", "place", "determinism", "bytes", "count", "iters",
               "time_us", "algbw_GBps", "busbw_GBps", "mem_GBps", "wrong"]


def coll_worker(rank, world, port, sizes, ops, seconds, max_iters, out_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = []
    for op in ops:
        for nbytes in sizes:
            total = nbytes // 4
            if op == "all_gather":
                total = total // world * world
                if total == 0:
                    continue
                count = total // world
                send = torch.full((count,), float(rank + 1))
                outs = [torch.empty(count) for _ in range(world)]
                call = lambda: dist.all_gather(outs, send)
            elif op == "all_to_all":
                total = total // world * world
                if total == 0:
                    continue
                count = total // world
                send = torch.arange(total, dtype=torch.float32) % 13 + float(rank + 1)
                out = torch.empty(total)
                call = lambda: dist.all_to_all_single(out, send)
            elif op == "all_reduce":
                send = torch.full((total,), float(rank + 1))
                call = lambda: dist.all_reduce(send)
            else:
                send = torch.full((total,), float(rank + 1))
                call = lambda: dist.broadcast(send, 0)
            # checked call
            if op == "all_reduce":
                send.fill_(float(rank + 1))
            call()
            if op == "all_reduce":
                wrong = int((send != float(world * (world + 1) // 2)).sum())
            elif op == "broadcast":
                wrong = int((send != 1.0).sum())
            elif op == "all_to_all":
                idx = torch.arange(total)
                want = ((rank * count + idx % count) % 13 + idx // count + 1).float()
                wrong = int((out != want).sum())
            else:
                wrong = sum(int((outs[q] != float(q + 1)).sum()) for q in range(world))
            # warm-up estimates the call time; rank 0 decides the iteration count
            dist.barrier()
            t0 = time.perf_counter()
            call()
            dist.barrier()
            one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.broadcast(one, 0)
            iters = max(1, min(max_iters, int(seconds / max(one.item(), 1e-7))))
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            dist.barrier()
            t = (time.perf_counter() - t0) / iters
            wrong_t = torch.tensor([wrong], dtype=torch.int64)
            dist.all_reduce(wrong_t)
            if rank == 0:
                algbw = nbytes / t / 1e9
                rows.append(["gloo", op, world,
                             "out" if op in ("all_gather", "all_to_all") else "in", "-",
                             nbytes, total, iters, t * 1e6, algbw, algbw * BUS[op](world), "",
                             int(wrong_t.item())])
                print(f"  gloo {op:10s} ranks={world} {nbytes:>11d} B {t*1e6:11.1f} us "
                      f"busbw {algbw * BUS[op](world):7.2f} GB/s wrong {int(wrong_t.item())}",
                      flush=True)
    dist.destroy_process_group()
    if rank == 0:
        out_q.put(rows)


def run_ranks(ctx, worker, world, what, args):
    """Runs worker(rank, world, port, *args, queue) in `world` processes of ctx, returns the one
    result put on the queue (by rank 0), and exits naming `what` if a rank process fails."""
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    result = q.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"torch_bench: {what} rank process failed with exit code {p.exitcode}")
    return result


def cmd_collectives(a):
    sizes = []
    s = a.min_bytes
    while s <= a.max_bytes:
        sizes.append(s)
        s *= a.step_factor
    ctx = mp.get_context("spawn")
    for world in a.ranks:
        rows = run_ranks(ctx, coll_worker, world, "gloo",
                         (sizes, a.ops, a.seconds, a.max_iters))
        append_rows(a.csv, COLL_HEADER, rows)


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def sgd_step_fn(model, x, y):
    """One training step of `model` on (x, y): SGD lr 0.01 momentum 0.9, cross-entropy."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # a trainer reads the loss every step

    return step


def train_rate(model, x, y, seconds, reps=3):
    return step_rate(sgd_step_fn(model, x, y), seconds, reps)


def step_rate(step, seconds, reps=3):
    """Median steps/s of `step` over `reps` runs of about `seconds` (one timed call first sets
    the step count)."""
    t0 = time.perf_counter()
    step()
    one = time.perf_counter() - t0
    steps = max(2, int(seconds / max(one, 1e-6)))
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        rates.append(steps / (time.perf_counter() - t0))
    return statistics.median(rates)  # steps/s


def ddp_worker(rank, world, port, sizes, batch, threads, seconds, out_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(mlp(sizes))
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(batch // world, sizes[0], generator=g) * 2 - 1
    y = torch.arange(batch // world) % sizes[-1]
    # every rank runs the same number of steps: rank 0's estimate, broadcast
    step = sgd_step_fn(model, x, y)
    dist.barrier()
    t0 = time.perf_counter()
    step()
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.broadcast(one, 0)
    steps = max(2, int(seconds / max(one.item(), 1e-6)))
    rates = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        dist.barrier()
        rates.append(steps / (time.perf_counter() - t0))
    dist.destroy_process_group()
    if rank == 0:
        out_q.put(statistics.median(rates))


TRAIN_HEADER = ["model", "batch", "devices", "determinism", "trainer", "samples_per_s",
                "steps_per_s"]


def cmd_train(a):
    cores = os.cpu_count() or 1
    rows = []
    torch.set_num_threads(cores)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"BLAS: {blas_name()}", flush=True)
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    for name, batch in (("10-5-2", 32), ("784-1024-1024-10", 256)):
        if a.part == "ddp":
            break
        sizes = [int(v) for v in name.split("-")]
        torch.manual_seed(0)
        model = mlp(sizes)
        x = torch.rand(batch, sizes[0]) * 2 - 1
        y = torch.arange(batch) % sizes[-1]
        sps = train_rate(model, x, y, a.seconds)
        rows.append([name, batch, 1, "-", f"torch threads={cores} OMP_WAIT_POLICY={policy}",
                     sps * batch, sps])
        print(f"  torch single process (OMP_WAIT_POLICY={policy}) {name:18s} batch {batch:4d}: "
              f"{sps * batch:10.1f} samples/s", flush=True)
    if a.part == "single":
        append_rows(a.csv, TRAIN_HEADER, rows)
        return
    world = a.ddp_ranks
    name, batch = "784-1024-1024-10", 256
    sizes = [int(v) for v in name.split("-")]
    threads = max(1, cores // world)
    ctx = mp.get_context("spawn")
    sps = run_ranks(ctx, ddp_worker, world, "DDP", (sizes, batch, threads, a.seconds))
    rows.append([name, batch, world, "-", f"torch DDP gloo threads/rank={threads}", sps * batch,
                 sps])
    print(f"  torch DDP gloo {world} ranks  {name:18s} batch {batch:4d}: {sps * batch:10.1f} "
          f"samples/s", flush=True)
    append_rows(a.csv, TRAIN_HEADER, rows)


GPT_HEADER = ["model", "batch", "block_size", "devices", "determinism", "trainer", "tokens_per_s",
              "steps_per_s"]
GPT_BENCH = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, bias=False,
                 dropout=0.0)
GPT_BATCH = 12


def cmd_gpt(a):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import gpt_reference as ref
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    cfg, B, T = GPT_BENCH, GPT_BATCH, GPT_BENCH["block_size"]
    P = ref.init_params(cfg, 0)
    for t in P.values():
        t.requires_grad_(True)
    params = list(P.values())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(cfg["vocab_size"], (B, T), generator=g)
    y = torch.randint(cfg["vocab_size"], (B, T), generator=g)

    def step():
        loss = ref.loss_of(ref.forward(P, cfg, x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    step()  # warm-up
    sps = step_rate(step, a.seconds)
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    name = "gpt-{n_layer}l-{n_head}h-{n_embd}".format(**cfg)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, BLAS: {blas_name()}")
    print(f"  torch single process (OMP_WAIT_POLICY={policy}) {name} batch {B} block {T}: "
          f"{sps * B * T:10.1f} tokens/s ({sps:.2f} steps/s)", flush=True)
    append_rows(a.csv, GPT_HEADER, [[name, B, T, 1, "-",
                                     f"torch threads={cores} OMP_WAIT_POLICY={policy}",
                                     sps * B * T, sps]])


def blas_name():
    cfg = torch.__config__.show()
    for key in ("BLAS_INFO=", "LAPACK_INFO="):
        for part in cfg.replace(",", "\n").splitlines():
            if key in part:
                return part.strip()
    return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collectives")
    c.add_argument("--ranks", default="2,4,8")
    c.add_argument("--ops", default="all_reduce,broadcast,all_gather")
    c.add_argument("--min-bytes", type=int, default=4096)
    c.add_argument("--max-bytes", type=int, default=256 << 20)
    c.add_argument("--step-factor", type=int, default=2)
    c.add_argument("--seconds", type=float, default=0.05)
    c.add_argument("--max-iters", type=int, default=20)
    c.add_argument("--csv", required=True)
    t = sub.add_parser("train")
    t.add_argument("--seconds", type=float, default=1.0)
    t.add_argument("--ddp-ranks", type=int, default=4)
    t.add_argument("--part", choices=("all", "single", "ddp"), default="all",
                   help="single: single-process runs only; ddp: the DDP run only")
    t.add_argument("--csv", required=True)
    g = sub.add_parser("gpt")
    g.add_argument("--seconds", type=float, default=2.0)
    g.add_argument("--csv", required=True)
    a = p.parse_args()
    if a.cmd == "collectives":
        a.ranks = [int(v) for v in a.ranks.split(",")]
        a.ops = a.ops.split(",")
        cmd_collectives(a)
    elif a.cmd == "gpt":
        cmd_gpt(a)
    else:
        cmd_train(a)


if __name__ == "__main__":
    main()
