"""Similarity of embeddings, by the names sentence-transformers stores (`similarity_fn_name`).

Each function maps a [n, dim] and b [m, dim] to float32 [n, m], larger = more similar, as sentence-transformers'
`util` functions: cosine, dot product, and the negated euclidean and manhattan distances. Pure and jit-able.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def unit_rows(x: jax.Array) -> jax.Array:
    """Rows scaled to unit L2 norm (a zero row stays zero), as torch.nn.functional.normalize: x / max(||x||, 1e-12),
    written with the squared norm, whose gradient at a zero row is finite (the norm's is NaN there, and one zero
    embedding in a batch made every parameter's gradient NaN)."""
    x = jnp.asarray(x, jnp.float32)
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-24))


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(unit_rows(a), unit_rows(b).T, precision=_HIGHEST)


def dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32).T, precision=_HIGHEST)


def euclidean(a: jax.Array, b: jax.Array) -> jax.Array:
    difference = jnp.asarray(a, jnp.float32)[:, None, :] - jnp.asarray(b, jnp.float32)[None, :, :]
    return -jnp.sqrt(jnp.sum(difference * difference, axis=-1))


def manhattan(a: jax.Array, b: jax.Array) -> jax.Array:
    difference = jnp.asarray(a, jnp.float32)[:, None, :] - jnp.asarray(b, jnp.float32)[None, :, :]
    return -jnp.sum(jnp.abs(difference), axis=-1)


SIMILARITY_FUNCTIONS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "cosine": cosine,
    "dot": dot,
    "euclidean": euclidean,
    "manhattan": manhattan,
}
