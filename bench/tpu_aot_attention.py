"""AOT-compile a ModernBERT forward + backward for a TPU slice from this (CPU) machine and print its memory.

    pip install -e ".[tpu-aot]"
    python -m bench.tpu_aot_attention [--model modernbert-base] [--topology v5e:2x2] [--batch 8] [--seq 1024]
                                      [--implementations pallas_tpu xla]

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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="modernbert-base")
    parser.add_argument("--topology", default="v5e:2x2")
    parser.add_argument("--batch", type=int, default=8, help="global batch, split over every chip")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--implementations", nargs="+", default=["pallas_tpu", "xla"])
    args = parser.parse_args(argv)
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
