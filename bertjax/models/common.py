"""Small shared pieces: dtype lookup, initialisers with logical axis names, norms and activations by name."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
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


class Linear(nn.Module):
    """x contracted over its last `in_ndim` axes with a kernel [*in_shape, *features], plus an optional bias.

    Flax's DenseGeneral initialises a flattened 2-d kernel and reshapes it; under a mesh with logical-axis rules
    that constrains a 3-axis logical box ([embed, heads, kv]) on a 2-d value and fails. This layer creates every
    kernel at full rank, so its logical names always match its shape.
    """

    features: tuple[int, ...]
    in_ndim: int
    axes: tuple[str, ...]  # logical names of the kernel: input axes, then output axes
    use_bias: bool
    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        in_shape = x.shape[x.ndim - self.in_ndim:]
        kernel = self.param("kernel", kernel_init(cfg, self.axes), (*in_shape, *self.features), param_dtype(cfg))
        dtype = compute_dtype(cfg)
        contract = tuple(range(x.ndim - self.in_ndim, x.ndim))
        y = jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype),
                                ((contract, tuple(range(self.in_ndim))), ((), ())))
        if self.use_bias:
            bias = self.param("bias", zeros_init(self.axes[self.in_ndim:]), self.features, param_dtype(cfg))
            y = y + bias.astype(dtype)
        return y


def dense(config: EncoderConfig, features, axes: tuple[str, ...], *, use_bias: bool, name: str,
          in_ndim: int = 1) -> Linear:
    """A linear layer whose kernel and bias carry logical axis names (input axes first, then output axes)."""
    features = features if isinstance(features, tuple) else (features,)
    if len(axes) != in_ndim + len(features):
        raise ValueError(f"{name}: {len(axes)} logical axes for a kernel of rank {in_ndim + len(features)}")
    return Linear(features, in_ndim, axes, use_bias, config, name=name)


def norm(config: EncoderConfig, name: str) -> nn.Module:
    """The family's normalisation: statistics in float32 whatever the compute dtype."""
    scale_init = nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",))
    if config.norm == "rmsnorm":
        return nn.RMSNorm(epsilon=config.norm_eps, dtype=compute_dtype(config), param_dtype=param_dtype(config),
                          scale_init=scale_init, name=name)
    return nn.LayerNorm(epsilon=config.norm_eps, use_bias=config.norm_bias, dtype=compute_dtype(config),
                        param_dtype=param_dtype(config), scale_init=scale_init,
                        bias_init=zeros_init(("norm",)), use_fast_variance=False, name=name)
