"""JAX 0.10.2 on this machine, the same workloads as benches/train_step.rs, for the side-by-side
table in docs/PERFORMANCE.md.

Run (needs `pip install jax==0.10.2`; the Rust benches never need Python):
  python3 benches/jax_compare.py            # every workload
  python3 benches/jax_compare.py cnn rnn    # only those (seed, mlp, rnn, cnn)
"""
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import jax
import jax.numpy as jnp
import numpy as np


def seed_init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (10, 32)) * 0.1, "b1": jnp.zeros((32,)),
            "w2": jax.random.normal(k2, (32, 1)) * 0.1, "b2": jnp.zeros((1,))}


def seed_loss(p, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)


def deep_init(key, widths):
    keys = jax.random.split(key, len(widths) - 1)
    return [{"w": jax.random.normal(k, (a, b)) * (1.0 / np.sqrt(a)), "b": jnp.zeros((b,))}
            for k, a, b in zip(keys, widths[:-1], widths[1:])]


def deep_loss(layers, x, y):
    h = x
    for i, l in enumerate(layers):
        h = h @ l["w"] + l["b"]
        if i + 1 < len(layers):
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


def make_step(loss):
    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g), l
    return step


def per_step(step, p, x, y, n):
    p, l = step(p, x, y)
    jax.block_until_ready((p, l))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        p, l = step(p, x, y)
        jax.block_until_ready((p, l))
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def rnn_data(t, b=8):
    """The data of examples/rnn_scan.rs: 8 phase-shifted sine waves, next-step targets."""
    k = np.arange(t)[:, None]
    ph = 0.7 * np.arange(b)[None, :]
    xs = np.sin(0.05 * k + ph).astype(np.float32)[..., None]
    ys = np.sin(0.05 * (k + 1) + ph).astype(np.float32)[..., None]
    return jnp.asarray(xs), jnp.asarray(ys)


def rnn_init(key, h=16):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"wx": jax.random.normal(k1, (1, h)) * 0.5,
            "wh": jax.random.normal(k2, (h, h)) * (1.0 / np.sqrt(h)),
            "b": jnp.zeros((h,)), "wo": jax.random.normal(k3, (h, 1)) * 0.1}


def rnn_loss(p, xs, ys):
    def body(h, xy):
        x, y = xy
        h2 = jnp.tanh(x @ p["wx"] + h @ p["wh"] + p["b"])
        return h2, jnp.sum((h2 @ p["wo"] - y) ** 2)
    _, errs = jax.lax.scan(body, jnp.zeros((xs.shape[1], p["wh"].shape[0])), (xs, ys))
    return jnp.sum(errs) / (xs.shape[0] * xs.shape[1])


def cnn_init(key):
    """examples/cnn_digits.rs's CNN: NHWC 8x8x1 -> conv 3x3x16 -> pool -> conv 3x3x32 -> pool
    -> dense 128 -> 10."""
    k = jax.random.split(key, 3)
    return {"k1": jax.random.normal(k[0], (3, 3, 1, 16)) / 3.0, "c1": jnp.zeros((16,)),
            "k2": jax.random.normal(k[1], (3, 3, 16, 32)) / 12.0, "c2": jnp.zeros((32,)),
            "w": jax.random.normal(k[2], (128, 10)) / 11.3, "b": jnp.zeros((10,))}


def cnn_loss(p, images, labels):
    n = images.shape[0]
    dn = ("NHWC", "HWIO", "NHWC")

    def conv_relu(x, k, c):
        return jax.nn.relu(jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=dn) + c)

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    h = pool(conv_relu(images.reshape(n, 8, 8, 1), p["k1"], p["c1"]))
    h = pool(conv_relu(h, p["k2"], p["c2"]))
    logits = h.reshape(n, 128) @ p["w"] + p["b"]
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels.reshape(n, 1), 1)
    return -jnp.sum(picked) / n


def cnn_step(state, x, y):
    """One Adam step (examples/common/digits.rs's adam_update, lr 3e-3)."""
    p, m, v, t = state
    l, g = jax.value_and_grad(cnn_loss)(p, x, y)
    t = t + 1.0
    m = jax.tree_util.tree_map(lambda m, g: m * 0.9 + g * 0.1, m, g)
    v = jax.tree_util.tree_map(lambda v, g: v * 0.999 + g * g * 0.001, v, g)
    c1, c2 = 1.0 - 0.9 ** t, 1.0 - 0.999 ** t
    p = jax.tree_util.tree_map(lambda p, m, v: p - (m / c1) / (jnp.sqrt(v / c2) + 1e-8) * 3e-3, p, m, v)
    return (p, m, v, t), l


def first_call(loss, p, x, y):
    step = jax.jit(make_step(loss))
    t = time.perf_counter()
    jax.block_until_ready(step(p, x, y))
    return (time.perf_counter() - t) * 1e3


def main():
    print(f"jax {jax.__version__}, devices {jax.device_count()}")
    want = set(sys.argv[1:]) or {"seed", "mlp", "rnn", "cnn"}
    if "seed" in want:
        seed_part()
    if "mlp" in want:
        mlp_part()
    if "rnn" in want:
        rnn_part()
    if "cnn" in want:
        cnn_part()


def seed_part():
    p = seed_init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (256, 10))
    y = jax.random.normal(jax.random.PRNGKey(2), (256, 1))
    print(f"seed first call: {first_call(seed_loss, p, x, y):.1f} ms")
    step = jax.jit(make_step(seed_loss))
    print(f"seed step (median, blocked): {per_step(step, p, x, y, 2000):.4f} ms")


def mlp_part():
    bp = deep_init(jax.random.PRNGKey(0), [784, 1024, 1024, 10])
    bx = jax.random.normal(jax.random.PRNGKey(1), (512, 784))
    by = jax.random.normal(jax.random.PRNGKey(2), (512, 10))
    print(f"big MLP first call: {first_call(deep_loss, bp, bx, by):.1f} ms")
    bstep = jax.jit(make_step(deep_loss))
    print(f"big MLP step (median, blocked): {per_step(bstep, bp, bx, by, 20):.2f} ms")


def rnn_part():
    rp = rnn_init(jax.random.PRNGKey(0))
    xs, ys = rnn_data(400)
    print(f"rnn scan T=400 first call: {first_call(rnn_loss, rp, xs, ys):.1f} ms")
    rstep = jax.jit(make_step(rnn_loss))
    print(f"rnn scan T=400 step (median, blocked): {per_step(rstep, rp, xs, ys, 200):.3f} ms")


def cnn_part():
    cp = cnn_init(jax.random.PRNGKey(0))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, cp)
    cstate = (cp, zeros, zeros, jnp.float32(0.0))
    cx = jax.random.uniform(jax.random.PRNGKey(1), (128, 64), maxval=16.0)
    cy = jax.random.randint(jax.random.PRNGKey(2), (128,), 0, 10)
    cstep = jax.jit(cnn_step)
    t = time.perf_counter()
    jax.block_until_ready(cstep(cstate, cx, cy))
    print(f"cnn batch 128 first call: {(time.perf_counter() - t) * 1e3:.1f} ms")
    print(f"cnn batch 128 step (median, blocked): {per_step(cstep, cstate, cx, cy, 200):.3f} ms")


if __name__ == "__main__":
    main()
