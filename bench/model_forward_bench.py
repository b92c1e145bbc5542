"""CPU forward throughput of bertjax vs transformers (PyTorch, sdpa) on identical inputs, same run.

    python -m bench.model_forward_bench [--models bert-base modernbert-base] [--shapes 8x128 2x512] [--cpu-time]

`--cpu-time` runs XLA and torch on one thread each and times CPU seconds instead of wall time: on a machine
shared with other jobs that is the comparison their load disturbs least.

Both sides use random weights from one config (bertjax's weights are copied into the PyTorch model through
`bertjax.save_pretrained`, so the outputs are also compared). Tokens/s counts every position of the batch.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile

import sys

if "--cpu-time" in sys.argv:  # XLA reads its flags when jax is imported: one thread for every XLA computation
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"

from bertjax.cpu_allocator import reuse_freed_memory  # noqa: E402

reuse_freed_memory()  # as `bertjax` commands do on CPU, for both frameworks in this process

import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bench.timing import median_call

def bench_model(name: str, shapes: list[tuple[int, int]], repeats: int, cpu_time: bool = False) -> list[dict]:
    """`cpu_time`: rates per CPU second instead of per wall second."""
    import torch
    import transformers

    config = bertjax.get_config(name, dropout_rate=0.0)
    model = bertjax.EncoderModel(config)  # with its pooler when the family has one, as the HF model
    params = bertjax.init_params(model, jax.random.key(0))
    with tempfile.TemporaryDirectory() as tmp:
        bertjax.save_pretrained(tmp, model, params)
        torch_model = transformers.AutoModel.from_pretrained(tmp, attn_implementation="sdpa").eval()

    forward = jax.jit(lambda p, ids, mask: model.apply({"params": p}, ids, attention_mask=mask).last_hidden_state)
    rows = []
    rng = np.random.default_rng(0)
    for batch, seq in shapes:
        ids = rng.integers(5, config.vocab_size, (batch, seq)).astype(np.int32)
        mask = np.ones((batch, seq), np.int32)
        jax_ids, jax_mask = jnp.asarray(ids), jnp.asarray(mask)
        t_ids, t_mask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))

        def run_jax():
            forward(params, jax_ids, jax_mask).block_until_ready()

        def run_torch():
            with torch.no_grad():
                torch_model(input_ids=t_ids, attention_mask=t_mask)

        with torch.no_grad():
            diff = np.abs(np.asarray(forward(params, jax_ids, jax_mask))
                          - torch_model(input_ids=t_ids, attention_mask=t_mask).last_hidden_state.numpy()).max()
        clock = 1 if cpu_time else 0  # median_call gives (wall, cpu)
        t_jax = median_call(run_jax, repeats)[clock]
        t_torch = median_call(run_torch, repeats)[clock]
        tokens = batch * seq
        row = dict(model=name, shape=f"{batch}x{seq}", jax_tok_s=tokens / t_jax, torch_tok_s=tokens / t_torch,
                   ratio=t_torch / t_jax, max_abs_diff=float(diff))
        print(f"{name:16s} {batch}x{seq:<5d} bertjax {row['jax_tok_s']:8.0f} tok/s   transformers "
              f"{row['torch_tok_s']:8.0f} tok/s   ratio {row['ratio']:.2f}x   max|diff| {diff:.1e}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert-base", "modernbert-base"])
    parser.add_argument("--shapes", nargs="+", default=["8x128", "2x512"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu-time", action="store_true", help="one thread each, CPU seconds (a shared machine)")
    args = parser.parse_args()
    import torch
    if args.cpu_time:
        torch.set_num_threads(1)
    import transformers
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; jax {jax.__version__} "
          f"({jax.default_backend()}); torch {torch.__version__} ({torch.get_num_threads()} threads); "
          f"transformers {transformers.__version__}", flush=True)
    for name in args.models:
        bench_model(name, shapes, args.repeats, args.cpu_time)


if __name__ == "__main__":
    main()
