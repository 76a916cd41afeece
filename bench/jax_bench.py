"""JAX anchor for bench/compare.sh: the MLP 784-1024-1024-10, batch 256, trained data-parallel over
N host-platform devices (XLA's simulated CPU devices), the peer a user would pick for simulating
devices on one machine.

  <venv>/bin/python jax_bench.py --devices N --csv FILE [--seconds 1.0] [--flags "..."]

Same step as torch_bench.py's: Linear layers with ReLU between, cross-entropy, SGD lr 0.01 momentum
0.9, the loss read every step. The batch is sharded over a 1-D mesh of N devices (jax.sharding
NamedSharding, the parameters replicated), so XLA inserts the gradient all-reduce itself, as
pjit / jit with shardings does for a user. N devices come from
--xla_force_host_platform_device_count=N; the XLA_FLAGS must be set before jax is imported, so
each device count is its own process (compare.sh runs it once per count).

--flags adds to XLA_FLAGS: on 2 cores JAX 0.10's multi-device CPU all-reduce needs
--xla_cpu_multi_thread_eigen=false (with the default flags its rendezvous starves and XLA aborts
the process after 40 s; measured here for issue 15), so compare.sh passes it for N > 1.

Appends one row to FILE (header model,batch,devices,trainer,samples_per_s,steps_per_s,flags,jax),
the columns of torch_bench.py's train CSV plus the flags and the jax version.
"""
import argparse
import csv
import os
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--flags", default="")
    p.add_argument("--batch", type=int, default=256)
    a = p.parse_args()
    if a.devices < 1 or a.batch % a.devices:
        sys.exit(f"jax_bench.py: --devices: expected a divisor of --batch {a.batch}, got {a.devices}")
    flags = f"--xla_force_host_platform_device_count={a.devices} {a.flags}".strip()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devs = jax.devices()
    if len(devs) != a.devices:
        sys.exit(f"jax_bench.py: asked for {a.devices} host devices, jax has {len(devs)}")
    mesh = Mesh(devs, ("data",))
    batch_sh = NamedSharding(mesh, P("data"))
    repl = NamedSharding(mesh, P())

    sizes = [784, 1024, 1024, 10]
    key = jax.random.PRNGKey(0)
    params = []
    for i in range(len(sizes) - 1):
        key, kw, kb = jax.random.split(key, 3)
        bound = 1.0 / (sizes[i] ** 0.5)  # torch.nn.Linear's init range
        params.append((jax.random.uniform(kw, (sizes[i], sizes[i + 1]), jnp.float32, -bound, bound),
                       jax.random.uniform(kb, (sizes[i + 1],), jnp.float32, -bound, bound)))
    momentum = jax.tree_util.tree_map(jnp.zeros_like, params)
    params = jax.device_put(params, repl)
    momentum = jax.device_put(momentum, repl)
    key, kx = jax.random.split(key)
    x = jax.device_put(jax.random.uniform(kx, (a.batch, sizes[0]), jnp.float32, -1, 1), batch_sh)
    y = jax.device_put(jnp.arange(a.batch, dtype=jnp.int32) % sizes[-1], batch_sh)

    def loss_fn(ps, x, y):
        h = x
        for i, (w, b) in enumerate(ps):
            h = h @ w + b
            if i < len(ps) - 1:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def step(ps, mom, x, y):
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        mom = jax.tree_util.tree_map(lambda m, gi: 0.9 * m + gi, mom, g)  # torch's SGD momentum
        ps = jax.tree_util.tree_map(lambda p_, m: p_ - 0.01 * m, ps, mom)
        return ps, mom, loss

    state = [params, momentum]

    def one():
        state[0], state[1], loss = step(state[0], state[1], x, y)
        return float(loss)  # the loss read every step, as the other trainers do

    one()  # compile
    t0 = time.perf_counter()
    one()
    first = time.perf_counter() - t0
    steps = max(2, int(a.seconds / max(first, 1e-6)))
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            one()
        rates.append(steps / (time.perf_counter() - t0))
    sps = statistics.median(rates)
    new = not os.path.exists(a.csv)
    with open(a.csv, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["model", "batch", "devices", "trainer", "samples_per_s", "steps_per_s",
                        "flags", "jax"])
        w.writerow(["784-1024-1024-10", a.batch, a.devices, "jax jit, batch sharded",
                    f"{sps * a.batch:.3f}", f"{sps:.4f}", flags, jax.__version__])
    print(f"  jax {jax.__version__} {a.devices} host device(s) 784-1024-1024-10 batch {a.batch}: "
          f"{sps * a.batch:10.1f} samples/s  (XLA_FLAGS: {flags})", flush=True)


if __name__ == "__main__":
    main()
