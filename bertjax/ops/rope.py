"""Rotary position embedding in the "rotate half" layout used by Hugging Face checkpoints (not interleaved)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) of each position's angles, float32 [batch, seq, head_dim / 2]."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [batch, seq, heads, head_dim] rotated by `rope_tables`' (cos, sin), in float32, returned in x's dtype."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotate x [batch, seq, heads, head_dim] by its positions [batch, seq]; computed in float32."""
    return rotate(x, *rope_tables(positions, x.shape[-1], theta))
