"""Memory of a contrastive train step: cached (GradCache) large batches against uncached ones, same run.

    JAX_PLATFORMS=cpu python -m bench.embedder_memory [--preset bert-base] [--seq 128] [--batch 4096] [--chunk 64]

XLA's own accounting of the compiled programs (`compiled.memory_analysis()`: the temporary buffers a step needs
besides its arguments and outputs), so nothing runs: each program is only compiled for the backend at hand
(CPU here; on a GPU or TPU the same script gives that device's numbers). Three programs, all computing the loss
and the gradient of the in-batch ranking loss (anchors and positives of `--seq` tokens) over the same model:
uncached at `--chunk` pairs, uncached at `--batch` pairs, cached at `--batch` pairs in chunks of `--chunk`.
Printed: temporary memory of each, and the ratios cached(batch) / uncached(chunk) and uncached(batch) /
cached(batch). A cached batch costs about what its chunk costs plus the [batch, dim] embeddings and the [batch,
batch] score matrix; the uncached one grows with the batch.
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp


def step_memory(preset: str, seq: int, batch: int, chunk: int) -> list[dict]:
    import bertjax
    from bertjax.embeddings import EncoderForEmbedding, PoolingConfig
    from bertjax.embeddings.contrastive import (cached_loss_and_grads, multiple_negatives_ranking_loss,
                                                uncached_loss_and_grads)
    from bertjax.models import init_params

    config = bertjax.get_config(preset, dropout_rate=0.0, max_position_embeddings=max(seq, 128))
    model = EncoderForEmbedding(config, pooling=PoolingConfig(modes=("mean",)))
    params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    key = jax.random.key(0)

    def embed(p, rows, _):
        ids, segments = rows["input_ids"], rows["segment_ids"]
        n, columns, length = ids.shape
        out = model.apply({"params": p}, ids.reshape(n * columns, length), segments.reshape(n * columns, length), 1)
        return out.reshape(n, columns, -1)

    def loss_of(e):
        return multiple_negatives_ranking_loss(e[:, 0], e[:, 1])

    def rows(n):
        shape = jax.ShapeDtypeStruct((n, 2, seq), jnp.int32)
        return {"input_ids": shape, "segment_ids": shape}

    results = []
    for name, rows_in_batch, chunks in (("uncached", chunk, 1), ("uncached", batch, 1),
                                         ("cached", batch, batch // chunk)):
        if chunks == 1:
            fn = jax.jit(lambda p, r: uncached_loss_and_grads(embed, loss_of, p, r, key))
        else:
            fn = jax.jit(lambda p, r, c=chunks: cached_loss_and_grads(embed, loss_of, p, r, key, c))
        began = time.perf_counter()
        memory = fn.lower(params, rows(rows_in_batch)).compile().memory_analysis()
        results.append({"name": name, "batch": rows_in_batch, "chunk": rows_in_batch // chunks,
                        "temp_mib": memory.temp_size_in_bytes / 2 ** 20,
                        "compile_s": time.perf_counter() - began})
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bert-base")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=64)
    args = parser.parse_args(argv)
    if args.batch % args.chunk:
        parser.error("--chunk must divide --batch")
    print(f"{args.preset}, {args.seq} tokens per text, pairs (anchor, positive); {jax.devices()[0].platform} "
          f"({platform.processor() or platform.machine()}), jax {jax.__version__}")
    results = step_memory(args.preset, args.seq, args.batch, args.chunk)
    for r in results:
        print(f"{r['name']:>9} batch {r['batch']:>6} (chunks of {r['chunk']:>5}): temporaries {r['temp_mib']:10.1f} MiB"
              f"   (compiled in {r['compile_s']:.0f} s)")
    small, large, cached = (r["temp_mib"] for r in results)
    print(f"cached batch {args.batch} / uncached batch {args.chunk}: {cached / small:.2f}x memory; "
          f"uncached batch {args.batch} / cached: {large / cached:.1f}x")


if __name__ == "__main__":
    main()
