#!/usr/bin/python3
"""Table of ratios and the busbw plot from the CSVs bench/compare.sh writes.

  report.py RAW_DIR [--table table.md] [--png perf.png] [--plot-ranks 4]

RAW_DIR holds ditto-bench's collectives.csv, stream.csv, trainer.csv, gpt.csv and the anchors'
gloo_collectives.csv, mpi_collectives.csv, torch_train.csv, torch_gpt.csv, and bench_bitwise's
gemm.csv and jax_bench.py's jax_train.csv. Prints ONE table: the goals of issue 15 first (each a ratio measured in the same run, with its goal and met / MISSED), then
ditto's busbw against Gloo and OpenMPI for each collective, rank count and a few sizes.
The plot: busbw against size for ditto, Gloo and MPI (one panel per collective, --plot-ranks
ranks), with the memory-bandwidth ceiling from the STREAM copy probe drawn.
"""
import argparse
import csv
import os
import sys


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fmt_size(b):
    b = int(b)
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m} {unit}"
    return f"{b} B"


# Bytes an in-memory collective must read + write per call, per byte of nccl-tests' size S
# (as ditto-bench's memGB/s column): all_reduce, all_to_all, sendrecv 2N; gather, scatter 2;
# broadcast, all_gather, reduce_scatter, reduce (N + 1).
def traffic_per_byte(op, n):
    if op in ("all_reduce", "all_to_all", "sendrecv"):
        return 2.0 * n
    return 2.0 if op in ("gather", "scatter") else n + 1.0


def bus_factor(op, n):
    """nccl-tests' busbw factors (doc/PERFORMANCE.md)."""
    return {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n,
            "gather": (n - 1) / n, "scatter": (n - 1) / n}.get(op, 1.0)


def ceiling_busbw(op, n, stream_gbps):
    """busbw an in-memory collective reaches when its unavoidable traffic runs at STREAM copy."""
    return stream_gbps * bus_factor(op, n) / traffic_per_byte(op, n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("raw")
    p.add_argument("--table")
    p.add_argument("--png")
    p.add_argument("--plot-ranks", type=int, default=4)
    p.add_argument("--note", default="")
    p.add_argument("--only-new", action="store_true",
                   help="only the busbw rows and issue 13's (compare.sh --only-new ran no trainer)")
    a = p.parse_args()

    coll = read(os.path.join(a.raw, "collectives.csv"))
    stream = read(os.path.join(a.raw, "stream.csv"))
    trainer = read(os.path.join(a.raw, "trainer.csv"))
    gloo = read(os.path.join(a.raw, "gloo_collectives.csv"))
    mpi = read(os.path.join(a.raw, "mpi_collectives.csv"))
    torch_train = read(os.path.join(a.raw, "torch_train.csv"))
    gpt = read(os.path.join(a.raw, "gpt.csv"))
    torch_gpt = read(os.path.join(a.raw, "torch_gpt.csv"))
    jax_train = read(os.path.join(a.raw, "jax_train.csv"))
    gemm = read(os.path.join(a.raw, "gemm.csv"))
    gemm_blas = read(os.path.join(a.raw, "gemm_blas.csv"))  # fast mode on the BLAS library
    stream_gbps = max((float(r["copy_GBps"]) for r in stream), default=None)

    def ditto_row(op, ranks, nbytes, place, backend="sim", det="fast", dtype="f32"):
        for r in coll:
            if (r["backend"] == backend and r["op"] == op and int(r["ranks"]) == ranks
                    and int(r["bytes"]) == nbytes and r["place"] == place
                    and r["determinism"] == det and (r.get("dtype") or "f32") == dtype):
                return r
        return None

    def anchor_row(rows, op, ranks, nbytes):
        for r in rows:
            if r["op"] == op and int(r["ranks"]) == ranks and int(r["bytes"]) == nbytes:
                return r
        return None

    def train_rate(model, devices, det, trainer_kind="DataParallel", col="samples_per_s"):
        for r in trainer:
            if (r["model"] == model and int(r["devices"]) == devices
                    and r["determinism"] == det and r["trainer"] == trainer_kind):
                return float(r[col])
        return None

    def torch_rate(model, prefix, col="samples_per_s"):
        """The best of torch's rows for model whose trainer starts with prefix (compare.sh runs
        the single process twice: OpenMP's default spinning wait policy and PASSIVE)."""
        best = (None, "")
        for r in torch_train:
            if r["model"] == model and r["trainer"].startswith(prefix):
                if best[0] is None or float(r[col]) > best[0]:
                    best = (float(r[col]), r["trainer"])
        return best

    rows = []  # (benchmark, ditto, anchor, ratio, goal, verdict)

    def add(name, dv, av, unit, goal=None, note=""):
        if dv is None or av is None or av == 0:
            rows.append((name, "n/a" if dv is None else f"{dv:.2f} {unit}",
                         "n/a" if av is None else f"{av:.2f} {unit}", "n/a",
                         f">= {goal:.2f}" if goal else "", "not measured" if goal else note))
            return
        ratio = dv / av
        verdict = ("met" if ratio >= goal else "MISSED") if goal else note
        rows.append((name, f"{dv:,.2f} {unit}", f"{av:,.2f} {unit}", f"{ratio:.2f}",
                     f">= {goal:.2f}" if goal else "", verdict))

    mib16 = 16 << 20
    big = "784-1024-1024-10"
    trainers = (("dp", "DataParallel"), ("ddp", "DDP"))

    def add_trainer_goal(label, model, devices, det, av, unit, goal, col="samples_per_s"):
        """A trainer goal for ditto's better trainer (named in the row), then the other trainer's
        ratio as an info row: the goal is about ditto's training, whichever trainer does it."""
        rates = [(train_rate(model, devices, det, kind, col), short) for short, kind in trainers]
        measured = [r for r in rates if r[0] is not None]
        best = max(measured, default=(None, "dp"))
        add(f"{label} [{best[1]}, the better trainer]", best[0], av, unit, goal)
        for rate, short in rates:
            if short != best[1]:
                add(f"   same, {short}", rate, av, unit, None, "(info)")
        return best[0]

    def jax_rate(devices):
        for r in jax_train:
            if int(r["devices"]) == devices:
                return float(r["samples_per_s"])
        return None

    # Issue 15's goals, in its order (G1-G4 the MLP, G5 the seed model, G6-G7 the GPT, G8 the
    # bitwise GEMM, G9 small collectives, G10 the 16 MiB all_reduce against STREAM copy).
    t1, t1name = torch_rate(big, "torch threads")
    add_trainer_goal(f"G1 MLP {big} b256 fast, 4 sim devices vs torch 1 process ({t1name})",
                     big, 4, "fast", t1, "smp/s", 1.0)
    tddp, tddpname = torch_rate(big, "torch DDP")
    add_trainer_goal(f"G2 MLP {big} b256 fast, 4 sim devices vs torch DDP ({tddpname}, 4 ranks)",
                     big, 4, "fast", tddp, "smp/s", 2.5)
    add_trainer_goal(f"G3 MLP {big} b256 fast, 1 sim device vs torch 1 process",
                     big, 1, "fast", t1, "smp/s", 1.0)
    add_trainer_goal(f"G4 MLP {big} b256 fast, 4 sim devices vs JAX 4 host-platform devices "
                     "(--xla_cpu_multi_thread_eigen=false)", big, 4, "fast", jax_rate(4), "smp/s",
                     1.5)
    add_trainer_goal(f"   MLP {big} b256 fast, 1 sim device vs JAX 1 device", big, 1, "fast",
                     jax_rate(1), "smp/s", None)
    ts, tsname = torch_rate("10-5-2", "torch threads", col="steps_per_s")
    add_trainer_goal(f"G5 seed 10-5-2 b32 fast, 4 sim devices vs torch 1 process: steps/s",
                     "10-5-2", 4, "fast", ts, "steps/s", 1.0, col="steps_per_s")
    s4b = train_rate("10-5-2", 4, "bitwise", col="steps_per_s")
    add(f"   seed 10-5-2 b32 bitwise, 4 sim devices vs torch 1 process: steps/s", s4b, ts,
        "steps/s", None, "(info)")

    # GPT (nanoGPT's CPU config): tokens/s against torch's better wait policy
    tg = max(torch_gpt, key=lambda r: float(r["tokens_per_s"]), default=None)

    def gpt_rate(devices, det, kind):
        for r in gpt:
            if int(r["devices"]) == devices and r["determinism"] == det and r["trainer"] == kind:
                return float(r["tokens_per_s"])
        return None

    gpt_best = {}
    for det in ("fast", "bitwise"):
        rates = [(gpt_rate(4, det, kind), short) for short, kind in trainers]
        gpt_best[det] = max([r for r in rates if r[0] is not None], default=(None, "dp"))
    fb, fshort = gpt_best["fast"]
    add(f"G6 GPT (nanoGPT CPU config) fast, 4 sim devices vs torch 1 process: tokens/s "
        f"[{fshort}, the better trainer]", fb, float(tg["tokens_per_s"]) if tg else None, "tok/s",
        1.0)
    bb, bshort = gpt_best["bitwise"]
    add(f"G7 GPT bitwise vs fast, 4 sim devices: tokens/s [{bshort} vs {fshort}]", bb, fb, "tok/s",
        0.6)
    for r in gpt:
        short = "dp" if r["trainer"] == "DataParallel" else "ddp"
        add(f"   GPT {r['model']} b{r['batch']} T{r['block_size']} {r['determinism']}, "
            f"{r['devices']} sim dev {short} vs torch 1 process"
            + (f" ({tg['trainer'].replace('torch ', '')})" if tg else ""),
            float(r["tokens_per_s"]), float(tg["tokens_per_s"]) if tg else None, "tok/s", None,
            "(info)")

    # G8's fast GEMM: the faster of fast mode's choice (gemm.csv) and the library's (gemm_blas.csv,
    # the same binary with DITTO_SIM_FAST_GEMM=blas); fast mode may run the bitwise kernel itself.
    for n in (256, 512, 1024):
        g_ = next((r for r in gemm if r["benchmark"] == f"gemm {n}x{n}"), None)
        b_ = next((r for r in gemm_blas if r["benchmark"] == f"gemm {n}x{n}"), None)
        fast = max([float(r["fast"]) for r in (g_, b_) if r], default=None)
        add(f"G8 GEMM {n}x{n}x{n} f32, 1 sim device: bitwise vs fast (GFLOP/s)"
            + (" (faster of fast mode and BLAS)" if b_ else ""),
            float(g_["bitwise"]) if g_ else None, fast, "GF/s", 0.8)
        if g_ and b_:
            add(f"   GEMM {n}x{n}x{n}: fast mode's GEMM vs the BLAS library's", float(g_["fast"]),
                float(b_["fast"]), "GF/s", None, "(info)")
    for r in gemm:
        if r["benchmark"] not in ("gemm 256x256", "gemm 512x512", "gemm 1024x1024"):
            add(f"   {r['benchmark']}: bitwise vs fast", float(r["bitwise"]), float(r["fast"]),
                r["unit"].replace("GFLOP/s", "GF/s"), None, "(info)")

    kib64 = 64 << 10
    for op in ("broadcast", "all_gather", "all_reduce"):
        for ranks in sorted({int(r["ranks"]) for r in coll}):
            m = anchor_row(mpi, op, ranks, kib64)
            d = ditto_row(op, ranks, kib64, m["place"]) if m else None
            add(f"G9 {op} {ranks} ranks 64 KiB busbw vs OpenMPI",
                float(d["busbw_GBps"]) if d else None, float(m["busbw_GBps"]) if m else None,
                "GB/s", 1.0)

    ar = ditto_row("all_reduce", 4, mib16, "out")
    ar_in = ditto_row("all_reduce", 4, mib16, "in")
    # compare.sh's G10 step (raw/g10): rounds of one STREAM probe then the 16 MiB all_reduce
    # (out-of-place, in-place), 5 times. The memory bandwidth of a shared VM moves in spells of
    # seconds, so each round's all_reduce is divided by that round's probe and the goal row is
    # the round with the median ratio; runs without the step (older, or --only-new) take the
    # sweep's figure.
    g10_coll = read(os.path.join(a.raw, "g10", "collectives.csv"))
    g10_stream = read(os.path.join(a.raw, "g10", "stream.csv"))

    def g10_series(place):
        return [float(r["mem_GBps"]) for r in g10_coll
                if r["op"] == "all_reduce" and int(r["ranks"]) == 4 and int(r["bytes"]) == mib16
                and r["place"] == place]

    g10_out, g10_in = g10_series("out"), g10_series("in")
    g10_probe = [float(r["copy_GBps"]) for r in g10_stream]

    def by_ratio(series):
        """The rounds (all_reduce, its probe), in the order of their ratios."""
        return sorted(zip(series, g10_probe), key=lambda r: r[0] / r[1])

    if g10_out and len(g10_out) == len(g10_probe):
        rounds = by_ratio(g10_out)
        med = rounds[len(rounds) // 2]
        add(f"G10 all_reduce 4 ranks 16 MiB (out-of-place): 2NS/t vs STREAM copy, same round "
            f"(median of {len(rounds)}: " + ", ".join(f"{d / p_:.2f}" for d, p_ in rounds) + ")",
            med[0], med[1], "GB/s", 0.70)
        if len(g10_in) == len(g10_probe):
            rin = by_ratio(g10_in)
            add("   same, in-place", *rin[len(rin) // 2], "GB/s", None, "(info)")
        add("   same, out-of-place, best of the 5 against the best probe", max(g10_out),
            max(g10_probe), "GB/s", None, "(info)")
        add("   same, out-of-place, from the sweep (one window of <= 10 calls) vs its STREAM probe",
            float(ar["mem_GBps"]) if ar else None, stream_gbps, "GB/s", None, "(info)")
    else:
        add("G10 all_reduce 4 ranks 16 MiB (out-of-place): 2NS/t vs STREAM copy",
            float(ar["mem_GBps"]) if ar else None, stream_gbps, "GB/s", 0.70)
        add("   same, in-place: 2NS/t vs STREAM copy",
            float(ar_in["mem_GBps"]) if ar_in else None, stream_gbps, "GB/s", None, "(info)")

    add(f"   MLP {big} b256, 4 sim devices, DataParallel: bitwise vs fast",
        train_rate(big, 4, "bitwise"), train_rate(big, 4, "fast"), "smp/s", None, "(info)")
    add(f"   same, DDP: bitwise vs fast", train_rate(big, 4, "bitwise", "DDP"),
        train_rate(big, 4, "fast", "DDP"), "smp/s", None, "(info)")
    add(f"   MLP {big} b256, 1 sim device: bitwise vs fast", train_rate(big, 1, "bitwise"),
        train_rate(big, 1, "fast"), "smp/s", None, "(info)")

    if a.only_new:  # the goals and training rows above had nothing to measure
        del rows[:]

    # busbw ratios for every collective the anchors run
    sizes = sorted({int(r["bytes"]) for r in coll})
    show = [s for s in sizes if s in (64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20)] \
        or sizes[-3:]
    for op in ("all_reduce", "broadcast", "all_gather", "all_to_all"):
        for ranks in sorted({int(r["ranks"]) for r in coll}):
            for s in show:
                for name, rows_a in (("OpenMPI", mpi), ("Gloo", gloo)):
                    ar_ = anchor_row(rows_a, op, ranks, s)
                    if not ar_:
                        continue
                    d = ditto_row(op, ranks, s, ar_["place"])
                    add(f"   {op} {ranks} ranks {fmt_size(s)} busbw ({ar_['place']}-of-place"
                        .replace("in-of-place", "in-place") + f") vs {name}",
                        float(d["busbw_GBps"]) if d else None, float(ar_["busbw_GBps"]),
                        "GB/s", None, "")

    # issue 13: bf16 against f32 all_reduce at the same byte count (half the elements), and the
    # collectives without an anchor here (sendrecv, gather, scatter: ditto's busbw only)
    for ranks in sorted({int(r["ranks"]) for r in coll if r.get("dtype") == "bf16"}):
        for s in show:
            bf = ditto_row("all_reduce", ranks, s, "out", dtype="bf16")
            f32 = ditto_row("all_reduce", ranks, s, "out")
            if bf or f32:
                add(f"   all_reduce {ranks} ranks {fmt_size(s)} busbw (out-of-place): bf16 vs f32, "
                    "same bytes", float(bf["busbw_GBps"]) if bf else None,
                    float(f32["busbw_GBps"]) if f32 else None, "GB/s", None, "(info)")
    for op in ("sendrecv", "gather", "scatter"):
        for ranks in sorted({int(r["ranks"]) for r in coll if r["op"] == op}):
            for s in show:
                d = ditto_row(op, ranks, s, "out")
                if d:
                    add(f"   {op} {ranks} ranks {fmt_size(s)} busbw (out-of-place)",
                        float(d["busbw_GBps"]), None, "GB/s", None, "(ditto only)")

    head = ("benchmark", "ditto", "anchor", "ratio", "goal", "")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines = []
    if a.note:
        lines.append(a.note)
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        lines.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    text = "\n".join(lines)
    print(text)
    if a.table:
        with open(a.table, "w") as f:
            f.write(text + "\n")

    if a.png:
        plot(a.png, coll, gloo, mpi, stream_gbps, a.plot_ranks)


def plot(path, coll, gloo, mpi, stream_gbps, ranks):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib missing (apt-get install python3-matplotlib); no plot",
              file=sys.stderr)
        return
    ops = ("all_reduce", "broadcast", "all_gather", "all_to_all")
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6), sharey=True)
    for ax, op in zip(axes, ops):
        def series(rows, place=None, backend=None):
            pts = sorted((int(r["bytes"]), float(r["busbw_GBps"])) for r in rows
                         if r["op"] == op and int(r["ranks"]) == ranks
                         and (place is None or r["place"] == place)
                         and (backend is None or r["backend"] == backend)
                         and r.get("determinism", "fast") in ("fast", "-")
                         and (r.get("dtype") or "f32") == "f32")
            return [p[0] for p in pts], [p[1] for p in pts]
        for place, style in (("out", "-o"), ("in", "--o")):
            x, y = series(coll, place, "sim")
            if x:
                ax.plot(x, y, style, color="C0", label=f"ditto sim ({place}-of-place)"
                        .replace("in-of-place", "in-place"), markersize=3)
        x, y = series(gloo)
        if x:
            ax.plot(x, y, "-s", color="C1", label="PyTorch Gloo", markersize=3)
        x, y = series(mpi)
        if x:
            ax.plot(x, y, "-^", color="C2", label="OpenMPI", markersize=3)
        if stream_gbps:
            c = ceiling_busbw(op, ranks, stream_gbps)
            ax.axhline(c, color="k", linestyle=":",
                       label=f"STREAM copy ceiling ({c:.2f} GB/s busbw)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op}, {ranks} ranks")
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("busbw (GB/s, nccl-tests)")
    fig.suptitle("ditto simulator vs PyTorch Gloo vs OpenMPI, one machine; ceiling: busbw when "
                 "the unavoidable memory traffic runs at STREAM copy speed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"report.py: wrote {path}")


if __name__ == "__main__":
    main()
