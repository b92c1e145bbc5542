"""Gated linear unit of a stacked projection: act(y[..., 0, :]) * y[..., 1, :] (GeGLU with gelu, SwiGLU with silu).

The two up-projections of a gated MLP are one product whose output is stacked [..., 2, features]
(`bertjax.models.common.project`); this takes that stack. In modernbert-base's step on an H100 (docs/benchmarks.md,
the second lease) XLA's fusions moved 302 MB forward (the product and a saved intermediate of the gate's
activation) and 453 MB backward per layer, where reading the stack and writing the product (226 MB), and reading
the stack and the product's cotangent to write the stack's (377 MB), is all the arithmetic needs: the Triton
kernel (bertjax/ops/pallas_gpu_glu.py) moves that. Both implementations compute the same function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.ops.activations import ACTIVATIONS
from bertjax.ops.lazy import load_function
from bertjax.ops.platform_guard import KernelChoice, require_platform


def glu_xla(y: jax.Array, activation: str, *, interpret: bool = False) -> jax.Array:
    """`glu` in XLA, its fusions as they choose."""
    del interpret
    # Split, not indexed: the backward concatenates the two cotangents instead of padding and adding them.
    activated, gate = (part.squeeze(-2) for part in jnp.split(y, 2, axis=-2))
    return ACTIVATIONS[activation](activated) * gate


# Implementations of `glu` by name ("module:function", imported when first asked for: the Triton kernel's module
# loads only where it is used).
IMPLEMENTATIONS = {
    "xla": "bertjax.ops.glu:glu_xla",
    "pallas_gpu": "bertjax.ops.pallas_gpu_glu:glu",
}
# The implementations that compile for some JAX platforms only (elsewhere: interpret mode); the rest run anywhere.
PLATFORMS = {"pallas_gpu": frozenset({"gpu"})}


def glu(y: jax.Array, activation: str, *, implementation: str = "xla", interpret: bool = False) -> jax.Array:
    """act(y[..., 0, :]) * y[..., 1, :] for y [..., 2, features], in y's dtype. `activation`: a key of
    bertjax.ops.activations.ACTIVATIONS; `implementation`: a key of IMPLEMENTATIONS; `interpret` runs a Pallas one
    in interpret mode (CPU tests)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"glu implementation {implementation!r} is unknown; known: {sorted(IMPLEMENTATIONS)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"glu activation {activation!r} is unknown; known: {sorted(ACTIVATIONS)}")
    if y.ndim < 2 or y.shape[-2] != 2:
        raise ValueError(f"glu: y must be [..., 2, features] (the stacked up-projections), got {y.shape}")
    if implementation in PLATFORMS:  # compiled elsewhere: an error naming the field (bertjax/ops/platform_guard.py)
        y = require_platform(y, KernelChoice.in_registry(
            "glu", implementation, PLATFORMS, IMPLEMENTATIONS,
            fields="EncoderConfig.glu_implementation, or implementation= of bertjax.ops.glu.glu",
            interpret="EncoderConfig.glu_interpret=True, or interpret=True"), interpret)
    return load_function(IMPLEMENTATIONS[implementation])(y, activation, interpret=interpret)
