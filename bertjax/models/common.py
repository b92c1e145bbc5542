"""Small shared pieces: dtype lookup, initialisers with logical axis names, norms and activations by name."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.config import EncoderConfig
from bertjax.ops.activations import ACTIVATIONS  # noqa: F401 (models take it from here)
from bertjax.ops.normalize import add_normalize

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def compute_dtype(config: EncoderConfig):
    return DTYPES[config.dtype]


def param_dtype(config: EncoderConfig):
    return DTYPES[config.param_dtype]


def kernel_init(config: EncoderConfig, axes: tuple[str, ...]):
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), axes)


def zeros_init(axes: tuple[str, ...]):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _linear_params(module: nn.Module, in_shape: tuple[int, ...], features: tuple[int, ...], axes: tuple[str, ...],
                   use_bias: bool, cfg: EncoderConfig) -> tuple[jax.Array, jax.Array | None]:
    kernel = module.param("kernel", kernel_init(cfg, axes), (*in_shape, *features), param_dtype(cfg))
    bias = (module.param("bias", zeros_init(axes[len(in_shape):]), features, param_dtype(cfg))
            if use_bias else None)
    return kernel, bias


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
        in_shape = x.shape[x.ndim - self.in_ndim:]
        weights = _linear_params(self, in_shape, self.features, self.axes, self.use_bias, self.config)
        return project(x, [weights], self.in_ndim, compute_dtype(self.config))[0]


class LinearWeights(nn.Module):
    """A Linear's kernel and bias (same names, shapes and logical axes) without applying them, for `project`."""

    in_shape: tuple[int, ...]
    features: tuple[int, ...]
    axes: tuple[str, ...]
    use_bias: bool
    config: EncoderConfig

    @nn.compact
    def __call__(self) -> tuple[jax.Array, jax.Array | None]:
        return _linear_params(self, self.in_shape, self.features, self.axes, self.use_bias, self.config)


def project(x: jax.Array, weights: list[tuple[jax.Array, jax.Array | None]], in_ndim: int, dtype, *,
            stacked: bool = False):
    """x through several linear maps of the same input, as one matmul where that pays.

    Stacked on a new, unsharded axis (not concatenated along an output axis that tensor parallelism may split),
    the kernels become one dot: x is read once, and in the backward pass XLA computes one input gradient instead
    of summing several. The stacking itself copies every kernel on every call, a cost that follows the weights,
    while the gain follows the activations; so kernels are stacked only when the rows of x are at least as many
    as the stacked output features. Measured on CPU, one thread: tiny.yaml's model (4,096 rows, 384 stacked q/k/v
    features) fwd+bwd 447 -> 390 ms stacked; ModernBERT-base at 1,024 rows (2,304 features) forward 790 -> 858
    tokens/s and bert-base 1,330 -> 1,400 unstacked.

    Returns the outputs as a list, or with `stacked` as one array with the outputs on a new axis after x's leading
    axes: the stacked product itself where it pays (biases added stacked), else the outputs stacked.
    """
    contract = tuple(range(x.ndim - in_ndim, x.ndim))
    x = x.astype(dtype)
    kernels = [kernel for kernel, _ in weights]
    rows = math.prod(x.shape[:x.ndim - in_ndim])
    stacked_features = sum(math.prod(kernel.shape[in_ndim:]) for kernel in kernels)
    # A symbolic row count (a `jax.export` with a polymorphic batch) cannot be compared: the unstacked dots are
    # right at any size.
    pays = isinstance(rows, int) and rows >= stacked_features
    if len(weights) > 1 and len({kernel.shape for kernel in kernels}) == 1 and pays:
        kernel = jnp.stack(kernels, axis=in_ndim).astype(dtype)  # [*in_shape, n, *features]
        y = jax.lax.dot_general(x, kernel, ((contract, tuple(range(in_ndim))), ((), ())))
        axis = x.ndim - in_ndim  # split, not indexed: the backward concatenates instead of padding and adding
        if stacked:
            biases = [bias for _, bias in weights]
            if all(bias is None for bias in biases):
                return y
            zeros = jnp.zeros(kernels[0].shape[in_ndim:], dtype)
            return y + jnp.stack([zeros if bias is None else bias.astype(dtype) for bias in biases])
        outputs = [part.squeeze(axis) for part in jnp.split(y, len(weights), axis=axis)]
    else:
        outputs = [jax.lax.dot_general(x, kernel.astype(dtype), ((contract, tuple(range(in_ndim))), ((), ())))
                   for kernel in kernels]
    outputs = [y if bias is None else y + bias.astype(dtype) for y, (_, bias) in zip(outputs, weights)]
    return jnp.stack(outputs, axis=x.ndim - in_ndim) if stacked else outputs


def dense_weights(config: EncoderConfig, in_shape, features, axes: tuple[str, ...], *, use_bias: bool,
                  name: str) -> LinearWeights:
    """`dense`'s parameters alone (same paths and logical axes), for several projections fused by `project`."""
    in_shape = in_shape if isinstance(in_shape, tuple) else (in_shape,)
    features = features if isinstance(features, tuple) else (features,)
    if len(axes) != len(in_shape) + len(features):
        raise ValueError(f"{name}: {len(axes)} logical axes for a kernel of rank {len(in_shape) + len(features)}")
    return LinearWeights(in_shape, features, axes, use_bias, config, name=name)


def dense(config: EncoderConfig, features, axes: tuple[str, ...], *, use_bias: bool, name: str,
          in_ndim: int = 1) -> Linear:
    """A linear layer whose kernel and bias carry logical axis names (input axes first, then output axes)."""
    features = features if isinstance(features, tuple) else (features,)
    if len(axes) != in_ndim + len(features):
        raise ValueError(f"{name}: {len(axes)} logical axes for a kernel of rank {in_ndim + len(features)}")
    return Linear(features, in_ndim, axes, use_bias, config, name=name)


class Norm(nn.Module):
    """LayerNorm (`centered`) or RMSNorm over the last axis: Flax's parameters ("scale", "bias"), arithmetic and
    float32 statistics, with the backward pass of `bertjax.ops.normalize` (fewer bytes moved per norm).

    Called as `norm(x)` it returns the normalised x. A residual stream calls `norm(x, delta, return_sum=True)` and
    gets (x + delta, norm(x + delta)): the add and the norm then run together (`implementation`, a key of
    bertjax.ops.normalize.IMPLEMENTATIONS, says how).
    """

    epsilon: float
    centered: bool
    use_bias: bool
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    implementation: str = "xla"
    interpret: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, delta: jax.Array | None = None, *, return_sum: bool = False):
        features = (x.shape[-1],)
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)), features,
                           self.param_dtype)
        bias = (self.param("bias", zeros_init(("norm",)), features, self.param_dtype) if self.use_bias else None)
        s, y = add_normalize(x, delta, scale, bias, epsilon=self.epsilon, centered=self.centered, dtype=self.dtype,
                             implementation=self.implementation, interpret=self.interpret)
        return (s, y) if return_sum else y


def norm(config: EncoderConfig, name: str) -> nn.Module:
    """The family's normalisation: statistics in float32 whatever the compute dtype."""
    return Norm(epsilon=config.norm_eps, centered=config.norm != "rmsnorm", use_bias=config.norm_bias,
                dtype=compute_dtype(config), param_dtype=param_dtype(config),
                implementation=config.norm_implementation, interpret=config.norm_interpret, name=name)
