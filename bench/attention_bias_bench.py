"""ALiBi (MosaicBERT) and Longformer attention layers: forward + backward time and compiled memory of every
implementation on this backend, against the dense XLA reference and plain attention, measured in the same run.

    python -m bench.attention_bias_bench [--seqs 1024 4096 16384] [--window 512] [--globals 8] [--heads 12]
                                         [--head-dim 64] [--dtype float32|bfloat16] [--max-gib 4] [--repeats 3]

Layers per sequence length:
- alibi: a global layer with ALiBi slopes (MosaicBERT); "plain" is the same layer without the bias, so
  "vs plain" is the cost of ALiBi (target on GPU: <= 1.15x).
- longformer: a local layer (window --window) with --globals global tokens spread over the row (Longformer);
  "plain" is the same window without global tokens, so "vs plain" is the cost of the global tokens (target on
  GPU: <= 1.2x at 8 globals).
Memory is the compiled program's temporary buffers (`memory_analysis().temp_size_in_bytes`); a program over
--max-gib is compiled (to report its size) but not run. Speed-up and memory are relative to the dense `xla` program
of the same layer in the same run.
"""

from __future__ import annotations

import argparse
import datetime

import jax
import jax.numpy as jnp
import numpy as np

from bench.attention_bench import gib, machine_description, median_seconds
from bertjax import ops
from bertjax.config import alibi_slopes

IMPLEMENTATIONS_BY_BACKEND = {
    "cpu": ["xla", "xla_blockwise", "xla_auto"],
    "gpu": ["xla", "xla_blockwise", "pallas_gpu"],
    "tpu": ["xla", "xla_blockwise", "pallas_tpu"],
}


def layer_fn(name: str, layer: str, features: bool, seq: int, heads: int, window: int, num_globals: int):
    """fn(q, k, v) -> out for one implementation and layer; features=False drops ALiBi / global tokens."""
    scale = 1.0
    slopes = np.asarray(alibi_slopes(heads), np.float32)
    glob = np.zeros((1, seq), bool)
    glob[0, np.linspace(0, seq - 1, num_globals).astype(int)] = True
    kwargs = {"implementation": name}
    if layer == "alibi":
        kwargs.update(alibi_slopes=slopes if features else None)
    else:
        kwargs.update(local_window=window, global_tokens=glob if features else None,
                      max_global_tokens=num_globals if features else None)
    return lambda q, k, v: ops.attention(q, k, v, scale=scale, **kwargs)


def measure(fn, shape, dtype, repeats, max_bytes) -> dict:
    keys = jax.random.split(jax.random.key(shape[1]), 4)
    q, k, v, ct = (jax.random.normal(key, shape, dtype) for key in keys)

    def fwd_bwd(q, k, v, ct):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(ct)

    try:
        compiled = jax.jit(fwd_bwd).lower(q, k, v, ct).compile()
    except ValueError as error:  # the implementation cannot serve the layer
        return {"status": f"n/a: {str(error).splitlines()[0][:60]}"}
    temp = compiled.memory_analysis().temp_size_in_bytes
    if temp > max_bytes:
        return {"status": "skipped", "temp": temp}
    return {"status": "ok", "seconds": median_seconds(compiled, (q, k, v, ct), repeats, 0.0), "temp": temp}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--globals", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--implementations", nargs="+", default=None)
    parser.add_argument("--layers", nargs="+", choices=["alibi", "longformer"], default=["alibi", "longformer"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-gib", type=float, default=4.0)
    args = parser.parse_args(argv)

    backend = jax.default_backend()
    names = args.implementations or IMPLEMENTATIONS_BY_BACKEND.get(backend, ["xla", "xla_blockwise"])
    dtype = jnp.dtype(args.dtype or ("float32" if backend == "cpu" else "bfloat16"))
    print(f"# attention_bias_bench  {datetime.date.today()}  {machine_description()}")
    print(f"# batch 1, heads {args.heads}, head_dim {args.head_dim}, {dtype.name}; forward+backward; longformer: "
          f"window {args.window}, {args.globals} global tokens; memory = compiled temp buffers (GiB)\n")
    print("| layer | seq | implementation | time (ms) | speed-up vs xla | time vs plain | temp (GiB) | memory vs xla |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    shape_of = lambda seq: (1, seq, args.heads, args.head_dim)
    for layer in args.layers:
        for seq in args.seqs:
            reference = None
            for name in names:
                run = lambda features: measure(
                    layer_fn(name, layer, features, seq, args.heads, args.window, args.globals), shape_of(seq),
                    dtype, args.repeats, args.max_gib * 2**30)
                r = run(True)
                plain = run(False) if name != "xla" and r["status"] == "ok" else None
                if name == "xla":
                    reference = r
                print(row(layer, seq, name, r, reference, plain), flush=True)


def row(layer, seq, name, r, reference, plain) -> str:
    if r["status"] != "ok":
        status = r["status"] if r["status"] != "skipped" else f"not run: temp {gib(r['temp'])} GiB over limit"
        return f"| {layer} | {seq} | {name} | {status} | | | {gib(r.get('temp'))} | |"
    vs_xla = vs_plain = memory = ""
    if reference is not None and reference["status"] == "ok":
        vs_xla = f"{reference['seconds'] / r['seconds']:.2f}x"
    if reference is not None and reference.get("temp"):
        memory = f"{r['temp'] / reference['temp']:.3f}"
    if plain is not None and plain["status"] == "ok":
        vs_plain = f"{r['seconds'] / plain['seconds']:.2f}x"
    return (f"| {layer} | {seq} | {name} | {r['seconds'] * 1e3:.1f} | {vs_xla} | {vs_plain} | {gib(r['temp'])} "
            f"| {memory} |")


if __name__ == "__main__":
    main()
