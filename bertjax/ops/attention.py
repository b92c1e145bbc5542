"""The one attention entry point every layer calls, and the registry of its implementations.

Implementations differ by backend, never by meaning: each takes q [batch, seq, heads, head_dim], k/v
[batch, seq, kv_heads, head_dim], segment ids [batch, seq] (0 = padding) and an optional bidirectional window,
and returns [batch, seq, heads, head_dim]. They are registered by import path so that a backend's modules (Pallas
TPU, Pallas GPU) are imported only when that backend is asked for.
"""

from __future__ import annotations

import importlib
import math
from typing import Callable

import jax
import jax.numpy as jnp

# name -> "module:function". Each function has the signature
#   fn(q, k, v, *, segment_ids, local_window, scale, interpret) -> out
IMPLEMENTATIONS: dict[str, str] = {
    "xla": "bertjax.ops.xla_attention:dense_attention",
    "xla_blockwise": "bertjax.ops.blockwise_attention:blockwise_local_attention",
    "xla_auto": "bertjax.ops.blockwise_attention:xla_auto_attention",  # dense or blockwise, by shape
    "pallas_tpu": "bertjax.ops.pallas_tpu_attention:pallas_tpu_attention",
    "pallas_gpu": "bertjax.ops.pallas_gpu_attention:pallas_gpu_attention",
}

# What "auto" means on each JAX platform. A platform missing here falls back to "xla".
AUTO_BY_PLATFORM: dict[str, str] = {"cpu": "xla_auto", "tpu": "pallas_tpu", "gpu": "pallas_gpu"}



def resolve_implementation(implementation: str) -> str:
    if implementation == "auto":
        return AUTO_BY_PLATFORM.get(jax.default_backend(), "xla")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {implementation!r}; known: "
                         f"{['auto', *sorted(IMPLEMENTATIONS)]}")
    return implementation


def _load(name: str) -> Callable:
    module_name, function_name = IMPLEMENTATIONS[name].split(":")
    return getattr(importlib.import_module(module_name), function_name)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, segment_ids: jax.Array | None = None,
              local_window: int | None = None, implementation: str = "auto", scale: float | None = None,
              interpret: bool = False) -> jax.Array:
    """Bidirectional multi-head attention within segments.

    Args:
      q: [batch, seq, heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim] with heads % kv_heads == 0.
      segment_ids: [batch, seq] int; a token attends only to tokens of its own segment; 0 marks padding.
        None means one segment covering the whole row.
      local_window: None for global attention; w for a sliding window |i - j| <= w // 2 (inclusive).
      implementation: a name in `IMPLEMENTATIONS`, or "auto" for the best one on the current backend.
      scale: multiplier of q.k; default 1 / sqrt(head_dim).
      interpret: run Pallas implementations in interpret mode (CPU testing); ignored by XLA ones.
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention expects 4-d q, k, v [batch, seq, heads, head_dim]; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    batch, seq, heads, head_dim = q.shape
    if k.shape != v.shape or k.shape[:2] != (batch, seq) or k.shape[3] != head_dim:
        raise ValueError(f"k and v must be [batch={batch}, seq={seq}, kv_heads, head_dim={head_dim}]; got "
                         f"{k.shape} and {v.shape}")
    if heads % k.shape[2]:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({k.shape[2]})")
    if local_window is not None and local_window <= 0:
        raise ValueError(f"local_window must be positive or None, got {local_window}")
    if segment_ids is None:
        segment_ids = jnp.ones((batch, seq), jnp.int32)
    elif segment_ids.shape != (batch, seq):
        raise ValueError(f"segment_ids must be [batch={batch}, seq={seq}], got {segment_ids.shape}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    fn = _load(resolve_implementation(implementation))
    return fn(q, k, v, segment_ids=segment_ids.astype(jnp.int32), local_window=local_window, scale=scale,
              interpret=interpret)
