"""Layer and RMS normalisation over the last axis, statistics in float32, with a hand-written backward pass.

The forward is Flax's `nn.LayerNorm` / `nn.RMSNorm` arithmetic (two-pass variance, `(x - mean) * (rsqrt(var + eps)
* scale) + bias`, cast to the compute dtype), so outputs are equal bit for bit. The backward is written out because
of what XLA makes of the autodiff one on a GPU: the scale's gradient sum(g * x_hat) over all tokens is a column
reduction while x_hat needs each row's statistics, so XLA recomputed them inside a row-reduction fusion and wrote
g * x_hat as a float32 [tokens, features] array for another kernel to sum, at every norm. Here the forward keeps
each row's mean and reciprocal deviation (8 bytes a row) behind an optimization barrier, which stops XLA from
recomputing them, so x_hat is elementwise in the backward: the scale's sum reads x and g directly, in the same
kernel that writes dx, and dx needs one row reduction of them:

    dx = rstd * (g*scale - mean(g*scale) - x_hat * mean(g*scale * x_hat))     (RMS: without mean(g*scale))

In modernbert-base's step compiled for an H100 this moves 6.7 GB less a step (79.2 -> 72.5 GB, docs/benchmarks.md).
CPU compiles drop the barrier and get the same formula; there it also keeps XLA's CPU fusion from recomputing a
pre-norm stack's residual stream inside each later layer's backward (tests/test_cpu_step_structure.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from bertjax.ops.lazy import load_function
from bertjax.ops.platform_guard import KernelChoice, require_platform


def _statistics(x: jax.Array, epsilon: float, centered: bool) -> tuple[jax.Array, jax.Array]:
    """(mean, 1/sqrt(var + eps)) of each row in float32, kept as [..., 1]; the mean is 0 for RMS norm."""
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True) if centered else jnp.zeros(x.shape[:-1] + (1,), jnp.float32)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return mean, jax.lax.rsqrt(variance + epsilon)


def _apply(x, scale, bias, mean, rstd, dtype):
    y = (x.astype(jnp.float32) - mean) * (rstd * scale.astype(jnp.float32))
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def normalize(x: jax.Array, scale: jax.Array, bias: jax.Array | None, epsilon: float, centered: bool,
              dtype) -> jax.Array:
    """Normalise x over its last axis (`centered`: LayerNorm, else RMSNorm), then scale and shift; `dtype` out."""
    mean, rstd = _statistics(x, epsilon, centered)
    return _apply(x, scale, bias, mean, rstd, dtype)


def _forward(x, scale, bias, epsilon, centered, dtype):
    mean, rstd = jax.lax.optimization_barrier(_statistics(x, epsilon, centered))
    return _apply(x, scale, bias, mean, rstd, dtype), (x, scale, bias, mean, rstd)


def _backward(epsilon, centered, dtype, residuals, g):
    del epsilon, dtype
    x, scale, bias, mean, rstd = residuals
    g = g.astype(jnp.float32)
    x_hat = (x.astype(jnp.float32) - mean) * rstd
    g_scaled = g * scale.astype(jnp.float32)
    correction = x_hat * jnp.mean(g_scaled * x_hat, axis=-1, keepdims=True)
    if centered:
        correction = correction + jnp.mean(g_scaled, axis=-1, keepdims=True)
    dx = (rstd * (g_scaled - correction)).astype(x.dtype)
    rows = tuple(range(x.ndim - 1))
    dscale = jnp.sum(g * x_hat, axis=rows).astype(scale.dtype)
    dbias = None if bias is None else jnp.sum(g, axis=rows).astype(bias.dtype)
    return dx, dscale, dbias


normalize.defvjp(_forward, _backward)


def add_normalize_xla(x: jax.Array, delta: jax.Array | None, scale: jax.Array, bias: jax.Array | None, *,
                      epsilon: float, centered: bool, dtype, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """`add_normalize` in XLA: the sum, then `normalize` (XLA's fusion decides how many passes that takes)."""
    del interpret
    s = x if delta is None else x + delta
    return s, normalize(s, scale, bias, epsilon, centered, dtype)


# Implementations of `add_normalize` by name ("module:function", imported when first asked for, so the Triton
# kernel's module loads only where it is used). Both compute the same thing; they differ in how many times each
# row crosses memory (bertjax/ops/pallas_gpu_norm.py).
IMPLEMENTATIONS = {
    "xla": "bertjax.ops.normalize:add_normalize_xla",
    "pallas_gpu": "bertjax.ops.pallas_gpu_norm:add_normalize",
}
# The implementations that compile for some JAX platforms only (elsewhere: interpret mode); the rest run anywhere.
PLATFORMS = {"pallas_gpu": frozenset({"gpu"})}


def add_normalize(x: jax.Array, delta: jax.Array | None, scale: jax.Array, bias: jax.Array | None, *,
                  epsilon: float, centered: bool, dtype, implementation: str = "xla",
                  interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """(s, y) with s = x + delta (x itself when delta is None) and y = norm(s) over the last axis, `dtype` out.

    A pre-norm residual stream is `x = x + sublayer(y); y = norm(x)`: taking the sum and its norm together lets a
    kernel read the stream once and write it once each way. `implementation` is a key of IMPLEMENTATIONS;
    `interpret` runs a Pallas one in interpret mode (CPU tests).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"norm implementation {implementation!r} is unknown; known: {sorted(IMPLEMENTATIONS)}")
    if implementation in PLATFORMS:  # compiled elsewhere: an error naming the field (bertjax/ops/platform_guard.py)
        x = require_platform(x, KernelChoice.in_registry(
            "norm", implementation, PLATFORMS, IMPLEMENTATIONS,
            fields="EncoderConfig.norm_implementation, or implementation= of bertjax.ops.normalize.add_normalize",
            interpret="EncoderConfig.norm_interpret=True, or interpret=True"), interpret)
    fn = load_function(IMPLEMENTATIONS[implementation])
    return fn(x, delta, scale, bias, epsilon=epsilon, centered=centered, dtype=dtype, interpret=interpret)
