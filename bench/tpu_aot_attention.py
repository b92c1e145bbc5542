"""AOT-compile a ModernBERT forward + backward for a TPU slice from this (CPU) machine and print its memory.

    pip install -e ".[tpu-aot]"
    python -m bench.tpu_aot_attention [--model modernbert-base] [--topology v5e:2x2] [--batch 8] [--seq 1024]
                                      [--implementations pallas_tpu xla]
    python -m bench.tpu_aot_attention --layers alibi longformer --topology v5p:2x2x1 --seq 4096 16384

With --layers, one attention layer (12 heads x 64, bfloat16, one document per row) is compiled instead of a model:
"alibi" is a MosaicBERT layer (global attention with ALiBi), "longformer" a window of 512 with 8 global tokens per
row (max_global_tokens=8). Both run on bertjax's own Pallas TPU kernel under `pallas_tpu`; the report gives the
kernel's key blocks per query block (its grid) against a dense layer's, since compiled cost analysis does not count
work inside Pallas calls.

The loss is the masked-LM cross-entropy over every position (random labels); the gradient is taken with respect to
all parameters. Parameters are replicated, the batch is split over a "data" axis spanning every chip. Each
implementation is compiled in the same run, so the dense `xla` reference gives the memory ratio.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from bertjax.config import get_config
from bertjax.models import EncoderForMaskedLM, init_params
from bertjax.tpu_aot import aot_compile, memory_report, topology_mesh

def mlm_loss_fn(model: EncoderForMaskedLM):
    def loss(params, input_ids, segment_ids, labels):
        logits = model.apply({"params": params}, input_ids, segment_ids=segment_ids).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

    return jax.value_and_grad(loss)


def compile_forward_backward(model_name: str, implementation: str, topology: str, batch: int, seq: int,
                             dtype: str) -> jax.stages.Compiled:
    config = get_config(model_name, attention_implementation=implementation, dtype=dtype,
                        max_position_embeddings=max(seq, get_config(model_name).max_position_embeddings))
    model = EncoderForMaskedLM(config)
    params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    mesh = topology_mesh(topology)
    replicated, by_batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    # No logical axis rules: GSPMD propagates the batch split from the inputs, and the Pallas TPU wrapper's
    # shard_map splits the batch over every mesh axis, which here is the one "data" axis.
    return aot_compile(mlm_loss_fn(model), params, tokens, tokens, tokens, mesh=mesh,
                       in_shardings=(replicated, by_batch, by_batch, by_batch), print_memory=False)


LAYERS = {"alibi": (None, 0), "longformer": (512, 8)}  # (local_window, global tokens per row)


def compile_attention_layer(layer: str, implementation: str, topology: str, batch: int, seq: int, heads: int = 12,
                            head_dim: int = 64) -> jax.stages.Compiled:
    """value_and_grad (q, k, v) of one ALiBi or Longformer attention call, batch split over every chip."""
    from bertjax import ops
    from bertjax.config import alibi_slopes

    window, num_global = LAYERS[layer]
    slopes = jnp.asarray(alibi_slopes(heads), jnp.float32) if layer == "alibi" else None

    def loss(q, k, v, segment_ids, global_tokens):
        out = ops.attention(q, k, v, segment_ids=segment_ids, local_window=window, implementation=implementation,
                            alibi_slopes=slopes, global_tokens=global_tokens if num_global else None,
                            max_global_tokens=num_global or None)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    x = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    flags = jax.ShapeDtypeStruct((batch, seq), jnp.bool_)
    mesh = topology_mesh(topology)
    by_batch = NamedSharding(mesh, P("data"))
    return aot_compile(jax.value_and_grad(loss, argnums=(0, 1, 2)), x, x, x, rows, flags, mesh=mesh,
                       in_shardings=(by_batch,) * 5, print_memory=False)


def kernel_key_blocks(layer: str, seq: int) -> str:
    """Key blocks the Pallas TPU kernel's grid visits per query block, against all of them (dense)."""
    from bertjax.ops.pallas_tpu_flash import _Static, _block_size, _steps

    window, _ = LAYERS[layer]
    block = _block_size(seq, None, interpret=False)
    st = _Static(scale=1.0, half=None if window is None else window // 2, block_q=block, block_k=block,
                 alibi=layer == "alibi", interpret=False)
    padded = -(-seq // block) * block
    return f"{_steps(st, padded, block, block)} of {padded // block} key blocks of {block} per query block"


def layer_main(args) -> None:
    print(f"attention layers {args.layers}, {args.topology}, global batch {args.batch}, 12 heads x 64, bfloat16, "
          f"forward + backward of sum(out^2) in q, k, v")
    for layer in args.layers:
        for seq in args.seq:
            for implementation in args.implementations:
                start = time.perf_counter()
                try:
                    compiled = compile_attention_layer(layer, implementation, args.topology, args.batch, seq)
                except jax.errors.JaxRuntimeError as error:
                    print(f"\n[{layer} seq {seq} {implementation}] does not compile "
                          f"({time.perf_counter() - start:.1f} s): {str(error).splitlines()[0]}")
                    continue
                cost = compiled.cost_analysis()
                cost = cost[0] if isinstance(cost, list) else cost
                mosaic = compiled.as_text().count("tpu_custom_call")
                print(f"\n[{layer} seq {seq} {implementation}] compiled in {time.perf_counter() - start:.1f} s; "
                      f"{mosaic} Mosaic calls; XLA-counted flops {cost.get('flops', 0):.3g}, bytes accessed "
                      f"{cost.get('bytes accessed', 0):.3g}")
                if implementation == "pallas_tpu":
                    print("kernel grid:", kernel_key_blocks(layer, seq))
                print(memory_report(compiled))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="modernbert-base")
    parser.add_argument("--topology", default="v5e:2x2")
    parser.add_argument("--batch", type=int, default=8, help="global batch, split over every chip")
    parser.add_argument("--seq", type=int, nargs="+", default=[1024], help="sequence length(s); one for --model")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--implementations", nargs="+", default=["pallas_tpu", "xla"])
    parser.add_argument("--layers", nargs="+", choices=sorted(LAYERS),
                        help="compile single attention layers (ALiBi, Longformer) instead of a model")
    args = parser.parse_args(argv)
    if args.layers:
        return layer_main(args)
    args.seq = args.seq[0]
    print(f"{args.model} forward+backward (MLM cross-entropy), {args.topology}, global batch {args.batch}, "
          f"seq {args.seq}, {args.dtype}; batch data-parallel, parameters replicated")
    for implementation in args.implementations:
        start = time.perf_counter()
        try:
            compiled = compile_forward_backward(args.model, implementation, args.topology, args.batch, args.seq,
                                                args.dtype)
        except jax.errors.JaxRuntimeError as error:  # e.g. RESOURCE_EXHAUSTED: the program does not fit in HBM
            print(f"\n[{implementation}] does not compile ({time.perf_counter() - start:.1f} s): "
                  f"{str(error).splitlines()[0]}")
            continue
        print(f"\n[{implementation}] compiled in {time.perf_counter() - start:.1f} s")
        print(memory_report(compiled))
        print("raw:", compiled.memory_analysis())


if __name__ == "__main__":
    main()
