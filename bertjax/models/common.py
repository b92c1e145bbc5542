"""Small shared pieces: dtype lookup, initialisers with logical axis names, norms and activations by name."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax.numpy as jnp

from bertjax.config import EncoderConfig

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),  # Hugging Face "gelu" is the exact erf form.
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "relu": nn.relu,
    "silu": nn.silu,
    "tanh": jnp.tanh,
}


def compute_dtype(config: EncoderConfig):
    return DTYPES[config.dtype]


def param_dtype(config: EncoderConfig):
    return DTYPES[config.param_dtype]


def kernel_init(config: EncoderConfig, axes: tuple[str, ...]):
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), axes)


def zeros_init(axes: tuple[str, ...]):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dense(config: EncoderConfig, features, axes: tuple[str, ...], *, use_bias: bool, name: str,
          axis=-1) -> nn.DenseGeneral:
    """A DenseGeneral whose kernel and bias carry logical axis names (input axes first, then output axes)."""
    out_ndim = len(features) if isinstance(features, tuple) else 1
    return nn.DenseGeneral(features, axis=axis, use_bias=use_bias, dtype=compute_dtype(config),
                           param_dtype=param_dtype(config), kernel_init=kernel_init(config, axes),
                           bias_init=zeros_init(axes[-out_ndim:]), name=name)


def norm(config: EncoderConfig, name: str) -> nn.Module:
    """The family's normalisation: statistics in float32 whatever the compute dtype."""
    scale_init = nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",))
    if config.norm == "rmsnorm":
        return nn.RMSNorm(epsilon=config.norm_eps, dtype=compute_dtype(config), param_dtype=param_dtype(config),
                          scale_init=scale_init, name=name)
    return nn.LayerNorm(epsilon=config.norm_eps, use_bias=config.norm_bias, dtype=compute_dtype(config),
                        param_dtype=param_dtype(config), scale_init=scale_init,
                        bias_init=zeros_init(("norm",)), use_fast_variance=False, name=name)
