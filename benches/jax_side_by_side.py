"""JAX 0.10.2's side of benches/side_by_side.sh: the workloads of examples/side_by_side.rs,
one per process, printing `jax PROGRAM dev=N first_ms=.. loop_ms=..` (the first call: trace,
compile and one step, blocked; then the mean of a loop of steps with the params chained and one
block at the end).

usage: python3 benches/jax_side_by_side.py PROGRAM DEVICES STEPS   (seed | host | pmap | big | cnn)
"""
import os
import sys
import time

program, devices, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402


def init(key, widths, scaled):
    keys = jax.random.split(key, len(widths) - 1)
    return [{"w": jax.random.normal(k, (a, b)) * (1.0 / np.sqrt(a) if scaled else 0.1),
             "b": jnp.zeros((b,))} for k, a, b in zip(keys, widths[:-1], widths[1:])]


def loss(layers, x, y):
    h = x
    for i, l in enumerate(layers):
        h = h @ l["w"] + l["b"]
        if i + 1 < len(layers):
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


def step(p, x, y):
    l, g = jax.value_and_grad(loss)(p, x, y)
    return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), l


def pstep(p, x, y):
    l, g = jax.value_and_grad(loss)(p, x, y)
    g = jax.lax.pmean(g, "i")
    return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), jax.lax.pmean(l, "i")


n = jax.device_count()
key = jax.random.PRNGKey
if program in ("seed", "big", "host"):
    widths, batch = ([10, 32, 1], 256) if program != "big" else ([784, 1024, 1024, 10], 512)
    p = init(key(0), widths, program == "big")
    x = jax.random.normal(key(1), (batch, widths[0]))
    y = jax.random.normal(key(2), (batch, widths[-1]))
    if program != "host":
        mesh = jax.make_mesh((n,), ("dp",))
        p = jax.device_put(p, NamedSharding(mesh, P()))
        x = jax.device_put(x, NamedSharding(mesh, P("dp")))
        y = jax.device_put(y, NamedSharding(mesh, P("dp")))
    f = jax.jit(step)
elif program == "pmap":
    p = jax.tree.map(lambda a: jnp.stack([a] * n), init(key(0), [10, 32, 1], False))
    x = jax.random.normal(key(1), (n * 64, 10)).reshape(n, 64, 10)
    y = jax.random.normal(key(2), (n * 64, 1)).reshape(n, 64, 1)
    f = jax.pmap(pstep, axis_name="i")
elif program == "cnn":
    # benches/jax_compare.py's CNN step (examples/cnn_digits.rs's), on random data of the
    # digits' shapes, one device.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from jax_compare import cnn_init, cnn_step  # noqa: E402
    cp = cnn_init(key(0))
    zeros = jax.tree.map(jnp.zeros_like, cp)
    p = (cp, zeros, zeros, jnp.float32(0.0))
    x = jax.random.uniform(key(1), (128, 64), maxval=16.0)
    y = jax.random.randint(key(2), (128,), 0, 10)
    f = jax.jit(cnn_step)
else:
    sys.exit(f"unknown program {program!r} (seed, host, pmap, big, cnn)")

t = time.perf_counter()
p, l = f(p, x, y)
jax.block_until_ready((p, l))
first = (time.perf_counter() - t) * 1e3
for _ in range(min(50, steps)):
    p, l = f(p, x, y)
jax.block_until_ready((p, l))
t = time.perf_counter()
for _ in range(steps):
    p, l = f(p, x, y)
jax.block_until_ready((p, l))
loop = (time.perf_counter() - t) * 1e3 / steps
print(f"jax {program} dev={n} first_ms={first:.2f} loop_ms={loop:.4f}")
