"""The one attention entry point every layer calls, and the registry of its implementations.

Implementations differ by backend, never by meaning: each takes q [batch, seq, heads, head_dim], k/v
[batch, seq, kv_heads, head_dim], segment ids [batch, seq] (0 = padding), an optional bidirectional window, optional
ALiBi slopes [heads] and optional global tokens [batch, seq], and returns [batch, seq, heads, head_dim]. They are
registered by import path so that a backend's modules (Pallas TPU, Pallas GPU) are imported only when that backend
is asked for, and each declares the features it can serve, so "auto" never picks one that would have to refuse the
call and an explicit choice that cannot serve it fails before tracing anything.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp

from bertjax.ops.lazy import load_function
from bertjax.ops.masks import global_slots
from bertjax.ops.platform_guard import KernelChoice, require_platform
from bertjax.ops.rope import apply_rope

# What a call may need beyond plain attention within segments (which every implementation serves).
FEATURES = ("local_window", "gqa", "alibi", "global_tokens")


@dataclasses.dataclass(frozen=True)
class Implementation:
    """Where an implementation lives ("module:function"), the features (names in FEATURES) it supports, and the
    JAX platforms (`jax.default_backend()` names: "cpu", "gpu", "tpu") it compiles for; None: every platform. A
    Pallas kernel runs elsewhere only in interpret mode (`interpret=True`, EncoderConfig.attention_interpret).

    The function has the signature
      fn(q, k, v, *, segment_ids, local_window, scale, interpret, alibi_slopes, global_tokens, global_slots) -> out
    with segment_ids int32 [batch, seq], alibi_slopes float32 [heads] or None, global_tokens bool [batch, seq]
    (already False on padding) or None, and global_slots the static number of global positions per row an
    implementation may gather (at least the largest count in the batch).
    """

    path: str
    features: frozenset[str]
    platforms: frozenset[str] | None = None

    def __post_init__(self):
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"attention implementation {self.path}: unknown features {sorted(unknown)}")

    def runs_on(self, platform: str) -> bool:
        return self.platforms is None or platform in self.platforms


_ALL = frozenset(FEATURES)
_TPU, _GPU = frozenset({"tpu"}), frozenset({"gpu"})
IMPLEMENTATIONS: dict[str, Implementation] = {
    "xla": Implementation("bertjax.ops.xla_attention:dense_attention", _ALL),
    "xla_blockwise": Implementation("bertjax.ops.blockwise_attention:blockwise_local_attention", _ALL),
    "xla_auto": Implementation("bertjax.ops.blockwise_attention:xla_auto_attention", _ALL),
    # Splash attention; ALiBi and global tokens in bertjax's own Mosaic kernel (pallas_tpu_flash.py).
    "pallas_tpu": Implementation("bertjax.ops.pallas_tpu_attention:pallas_tpu_attention", _ALL, _TPU),
    "pallas_gpu": Implementation("bertjax.ops.pallas_gpu_attention:pallas_gpu_attention", _ALL, _GPU),
    # pallas_gpu with its forward, dq and dk/dv kernels in Pallas Mosaic GPU (Hopper; bfloat16 / float16); "auto" does
    # not pick it.
    "pallas_gpu_mosaic": Implementation("bertjax.ops.mosaic_gpu_attention:pallas_gpu_mosaic_attention",
                                        _ALL - {"alibi"}, _GPU),
    # pallas_gpu with its backward in one kernel, dq added with float atomics (not reproducible run to run);
    # "auto" does not pick it.
    "pallas_gpu_atomic": Implementation("bertjax.ops.pallas_gpu_attention_one_pass:pallas_gpu_atomic_attention",
                                        _ALL, _GPU),
}

# What "auto" prefers on each JAX platform, best first; the first that supports the call is used. A platform
# missing here uses AUTO_FALLBACK.
AUTO_PREFERENCE: dict[str, tuple[str, ...]] = {
    "cpu": ("xla_auto",),
    "tpu": ("pallas_tpu", "xla_auto"),
    "gpu": ("pallas_gpu", "xla_auto"),
}
AUTO_FALLBACK = ("xla",)


def required_features(*, heads: int, kv_heads: int, local_window: int | None = None, alibi: bool = False,
                      global_tokens: bool = False) -> frozenset[str]:
    """The FEATURES a call with these properties needs."""
    needed = {"local_window": local_window is not None, "gqa": heads != kv_heads, "alibi": alibi,
              "global_tokens": global_tokens}
    return frozenset(name for name, used in needed.items() if used)


def resolve_implementation(implementation: str, features: frozenset[str] = frozenset(),
                           platform: str | None = None) -> str:
    """The registry name that will serve a call needing `features` on `platform` (default: this backend).

    "auto" takes the platform's first preference that supports every feature; an explicit name that lacks one is a
    ValueError naming the missing features.
    """
    if implementation == "auto":
        candidates = AUTO_PREFERENCE.get(platform or jax.default_backend(), AUTO_FALLBACK) + AUTO_FALLBACK
        return next(name for name in candidates if features <= IMPLEMENTATIONS[name].features)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {implementation!r}; known: "
                         f"{['auto', *sorted(IMPLEMENTATIONS)]}")
    missing = features - IMPLEMENTATIONS[implementation].features
    if missing:
        able = [name for name, impl in IMPLEMENTATIONS.items() if features <= impl.features]
        raise ValueError(f"attention implementation {implementation!r} does not support "
                         f"{', '.join(sorted(missing))}; implementations that do: {able} (or 'auto')")
    return implementation


def _load(name: str) -> Callable:
    return load_function(IMPLEMENTATIONS[name].path)


def _runs_where_compiled(segment_ids: jax.Array, name: str, interpret) -> jax.Array:
    """segment_ids, and compiling a platform-bound implementation elsewhere (not in interpret mode) an error naming
    it (bertjax/ops/platform_guard.py): the platform is the one compiled for, an ahead-of-time target included."""
    platforms = IMPLEMENTATIONS[name].platforms
    if platforms is None:
        return segment_ids
    choice = KernelChoice.in_registry(
        "attention", name, {n: impl.platforms for n, impl in IMPLEMENTATIONS.items() if impl.platforms is not None},
        IMPLEMENTATIONS, auto=True,
        fields="EncoderConfig.attention_implementation, or implementation= of bertjax.ops.attention",
        interpret="EncoderConfig.attention_interpret=True, or interpret=True")
    return require_platform(segment_ids, choice, interpret)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, segment_ids: jax.Array | None = None,
              local_window: int | None = None, implementation: str = "auto", scale: float | None = None,
              interpret: bool = False, alibi_slopes: jax.Array | None = None,
              global_tokens: jax.Array | None = None, max_global_tokens: int | None = None) -> jax.Array:
    """Bidirectional multi-head attention within segments.

    Args:
      q: [batch, seq, heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim] with heads % kv_heads == 0.
      segment_ids: [batch, seq] int; a token attends only to tokens of its own segment; 0 marks padding.
        None means one segment covering the whole row.
      local_window: None for global attention; w for a sliding window |i - j| <= w // 2 (inclusive).
      implementation: a name in `IMPLEMENTATIONS`, or "auto" for the best one on the current backend that supports
        the call.
      scale: multiplier of q.k; default 1 / sqrt(head_dim).
      interpret: run Pallas implementations in interpret mode (CPU testing); ignored by XLA ones.
      alibi_slopes: float [heads] or None; adds -slope_h * |i - j| to the scores of head h, with i, j the positions
        in the row (equal, between two tokens of one packed document, to the distance of per-document positions).
      global_tokens: bool [batch, seq] or None; a global token attends to every token of its own segment and every
        token of its segment attends to it, whatever the window. Padding (segment 0) stays out even if flagged.
      max_global_tokens: static bound on the global tokens of one row; implementations that gather the global
        positions (xla_blockwise) then work on [bound, seq] instead of [seq, seq] when the mask is traced. None: the
        count of a concrete mask, or every position for a traced one. A concrete row above the bound is an error.
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
    segment_ids = jnp.asarray(segment_ids).astype(jnp.int32)
    if alibi_slopes is not None:
        if jnp.shape(alibi_slopes) != (heads,):
            raise ValueError(f"alibi_slopes must be [heads={heads}], got {jnp.shape(alibi_slopes)}")
        alibi_slopes = jnp.asarray(alibi_slopes, jnp.float32)
    if global_tokens is not None:
        if jnp.shape(global_tokens) != (batch, seq):
            raise ValueError(f"global_tokens must be [batch={batch}, seq={seq}], got {jnp.shape(global_tokens)}")
        # Padding is never global: every implementation can then treat a flagged token as a real one.
        global_tokens = jnp.asarray(global_tokens).astype(bool) & (segment_ids != 0)
        if local_window is None:  # every token already sees its whole segment: global tokens change nothing
            global_tokens = None
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    features = required_features(heads=heads, kv_heads=k.shape[2], local_window=local_window,
                                 alibi=alibi_slopes is not None, global_tokens=global_tokens is not None)
    name = resolve_implementation(implementation, features)
    fn = _load(name)
    segment_ids = _runs_where_compiled(segment_ids, name, interpret)
    slots = None if global_tokens is None else global_slots(global_tokens, max_global_tokens)
    return fn(q, k, v, segment_ids=segment_ids, local_window=local_window, scale=scale, interpret=interpret,
              alibi_slopes=alibi_slopes, global_tokens=global_tokens, global_slots=slots)


# Implementations with a stacked-projection path for `rope_attention`: "module:function" taking (qkv, positions,
# theta, *, segment_ids, local_window, scale, interpret).
STACKED_ROPE_IMPLEMENTATIONS = {
    "pallas_gpu": "bertjax.ops.pallas_gpu_attention:pallas_gpu_rope_attention",
    "pallas_gpu_atomic": "bertjax.ops.pallas_gpu_attention_one_pass:pallas_gpu_atomic_rope_attention",
}


def rope_attention(qkv: jax.Array, positions: jax.Array, theta: float, *, segment_ids: jax.Array | None = None,
                   local_window: int | None = None, implementation: str = "auto", scale: float | None = None,
                   interpret: bool = False) -> jax.Array:
    """`attention(apply_rope(q), apply_rope(k), v)` of a stacked projection qkv [batch, seq, 3, heads, head_dim].

    The implementation (resolved as `attention` resolves it) runs it on the stack itself where it has such a path
    (STACKED_ROPE_IMPLEMENTATIONS; head_dim a power of two >= 16): its kernels then read v from qkv and write qkv's
    gradient whole, which saves XLA a copy of v and a pass over the whole gradient. Elsewhere the stack is split
    and rotated, and `attention` runs as usual. positions: [batch, seq] int, the RoPE positions.
    """
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"rope_attention expects qkv [batch, seq, 3, heads, head_dim], got {qkv.shape}")
    batch, seq, _, heads, head_dim = qkv.shape
    if segment_ids is None:
        segment_ids = jnp.ones((batch, seq), jnp.int32)
    name = resolve_implementation(implementation, required_features(heads=heads, kv_heads=heads,
                                                                     local_window=local_window))
    if name in STACKED_ROPE_IMPLEMENTATIONS and head_dim >= 16 and not head_dim & (head_dim - 1):
        if segment_ids.shape != (batch, seq) or positions.shape != (batch, seq):
            raise ValueError(f"segment_ids and positions must be [batch={batch}, seq={seq}], got "
                             f"{segment_ids.shape} and {positions.shape}")
        fn = load_function(STACKED_ROPE_IMPLEMENTATIONS[name])
        segment_ids = _runs_where_compiled(jnp.asarray(segment_ids).astype(jnp.int32), name, interpret)
        return fn(qkv, positions, theta, segment_ids=segment_ids,
                  local_window=local_window, scale=1.0 / math.sqrt(head_dim) if scale is None else scale,
                  interpret=interpret)
    # split, not indexed: the backward concatenates instead of padding and adding (as `project` splits)
    q, k, v = (part.squeeze(2) for part in jnp.split(qkv, 3, axis=2))
    q, k = apply_rope(q, positions, theta), apply_rope(k, positions, theta)
    return attention(q, k, v, segment_ids=segment_ids, local_window=local_window, implementation=name, scale=scale,
                     interpret=interpret)
