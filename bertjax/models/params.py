"""Parameter helpers for notebooks and tests: plain (unboxed) parameters and their logical axis names."""

from __future__ import annotations

import flax.linen as nn
import jax


def init_params(model: nn.Module, key: jax.Array, seq_len: int = 8) -> dict:
    """Randomly initialised parameters as a plain pytree of arrays (logical-axis boxes removed)."""
    return nn.meta.unbox(model.init(key, model.example_input_ids(seq_len))["params"])


def logical_axes(model: nn.Module, seq_len: int = 8) -> dict:
    """The logical axis names of every parameter (a pytree of PartitionSpecs of names), without allocating."""
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), model.example_input_ids(seq_len)))
    return nn.get_partition_spec(abstract)["params"]
