"""Parameter helpers for notebooks and tests: plain (unboxed) parameters and their logical axis names."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def init_params(model: nn.Module, key: jax.Array, seq_len: int = 8) -> dict:
    """Randomly initialised parameters as a plain pytree of arrays (logical-axis boxes removed)."""
    ids = jnp.zeros((1, seq_len), jnp.int32)
    return nn.meta.unbox(model.init(key, ids)["params"])


def logical_axes(model: nn.Module, seq_len: int = 8) -> dict:
    """The logical axis names of every parameter (a pytree of PartitionSpecs of names), without allocating."""
    ids = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(ids.shape, ids.dtype)))
    return nn.get_partition_spec(abstract)["params"]
