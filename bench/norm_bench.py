"""The residual add + norm on a GPU: bertjax's Pallas kernel (pallas_gpu_norm) against XLA's fusions of the same
arithmetic, at modernbert-base's train-step shape (32 rows of 1,024 tokens, 768 features, bfloat16, LayerNorm
without bias), forward and forward+backward, with each side's bytes per second.

    python -m bench.norm_bench                      # xla, then pallas_gpu at its default tiles
    python -m bench.norm_bench --tune               # and every block_rows x num_warps the kernel takes
    python -m bench.norm_bench --rows 4096 --dry-run  # CPU: the kernel in interpret mode, a tiny shape (the path only)

The bytes are what the kernel has to move, the same for both sides: forward x and delta in, the sum and the norm
out (4 arrays); forward+backward adds the backward's sum, the norm's and the sum's cotangents in and one gradient
out (4 more). XLA moves more than that (docs/benchmarks.md: 303 MB per direction per norm against these 200), so its
bytes per second here are what the kernel would need to match it, not what XLA streams.
"""

from __future__ import annotations

import argparse
import datetime
import itertools

import jax
import jax.numpy as jnp

from bench.attention_bench import machine_description, median_seconds
from bertjax.ops.normalize import add_normalize


def program(implementation: str, passes: str, interpret: bool, **tiles):
    def norm(x, delta, scale):
        if implementation == "xla":
            return add_normalize(x, delta, scale, None, epsilon=1e-5, centered=True, dtype=x.dtype)
        from bertjax.ops.pallas_gpu_norm import add_normalize as kernel
        return kernel(x, delta, scale, None, epsilon=1e-5, centered=True, dtype=x.dtype, interpret=interpret,
                      **tiles)

    if passes == "forward":
        return jax.jit(lambda x, delta, scale, g_s, g_y: norm(x, delta, scale))

    def both(x, delta, scale, g_s, g_y):
        out, vjp = jax.vjp(norm, x, delta, scale)
        return out, vjp((g_s, g_y))

    return jax.jit(both)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32 * 1024)
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--tune", action="store_true", help="also time every block_rows x num_warps")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=0.2)
    parser.add_argument("--dry-run", action="store_true", help="CPU: interpret mode (checks the path, times nothing "
                        "meaningful)")
    args = parser.parse_args(argv)
    if min(args.rows, args.features, args.repeats) <= 0:
        parser.error("--rows, --features and --repeats must be positive")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if jax.default_backend() != "gpu" and not args.dry_run:
        raise SystemExit(f"JAX's backend is {jax.default_backend()!r}: this times a GPU kernel (or give --dry-run)")
    print(f"# {datetime.date.today()}  {machine_description()}")
    keys = jax.random.split(jax.random.key(0), 5)
    shape = (args.rows, args.features)
    x, delta, g_s, g_y = (jax.random.normal(k, shape, jnp.bfloat16) for k in keys[:4])
    scale = 1 + 0.1 * jax.random.normal(keys[4], (args.features,))
    operands = (x, delta, scale, g_s, g_y)
    array_bytes = x.size * x.dtype.itemsize
    settings = [("xla", {}), ("pallas_gpu", {})]
    if args.tune:
        settings += [("pallas_gpu", dict(block_rows=r, num_warps=w)) for r, w in itertools.product((1, 2, 4, 8),
                                                                                                     (2, 4, 8))]
    print(f"# {args.rows:,} rows x {args.features} features, bfloat16, LayerNorm without bias")
    print("| implementation | tiles | forward us | GB/s | forward+backward us | GB/s |")
    print("|---|---|---:|---:|---:|---:|")
    seconds = {}
    try:
        for implementation, tiles in settings:
            label = ", ".join(f"{k} {v}" for k, v in tiles.items()) or "default"
            cells = []
            for passes, arrays in (("forward", 4), ("both", 8)):
                try:
                    took = median_seconds(program(implementation, passes, args.dry_run, **tiles), operands,
                                          args.repeats, args.min_seconds)
                    seconds[implementation, label, passes] = took
                    cells += [f"{took * 1e6:.0f}", f"{arrays * array_bytes / took / 1e9:,.0f}"]
                except Exception as error:  # noqa: BLE001 (a setting that fails to compile or run: its row says so)
                    cells += [f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:60]}", "-"]
            print(f"| {implementation} | {label} | " + " | ".join(cells) + " |", flush=True)
    except KeyboardInterrupt:  # launch/gpu_session.sh's time cap
        print("# interrupted: the rows above are what was measured", flush=True)
    for passes, name in (("forward", "forward"), ("both", "forward+backward")):
        xla, kernel = seconds.get(("xla", "default", passes)), seconds.get(("pallas_gpu", "default", passes))
        if xla and kernel:
            fastest = min((took, label) for (impl, label, p), took in seconds.items()
                          if impl == "pallas_gpu" and p == passes)
            print(f"# {name}: the kernel at its defaults runs {xla / kernel:.2f}x XLA's speed; its fastest tiles "
                  f"({fastest[1]}) {xla / fastest[0]:.2f}x")

if __name__ == "__main__":
    main()
