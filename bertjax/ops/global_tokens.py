"""Longformer's global tokens on top of a local flash kernel, shared by the Pallas GPU and TPU paths.

The kernel keeps its block skipping: it computes the window part and its log-sum-exp; the row's global keys beyond
the window ([seq, slots] in XLA) join the same softmax through the log-sum-exp; then the global queries get their
own rows over their whole segment ([slots, seq]). Work O(seq * (window + slots)); nothing [seq, seq] exists.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from bertjax.ops.blockwise_attention import _global_query_rows
from bertjax.ops.masks import flagged_first

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def attention_with_lse(forward, backward):
    """A flash kernel's (out, lse) as one custom_vjp function of (q, k, v, seg, slopes, static), differentiable in
    q, k, v through both outputs: the merge below continues the window's softmax from its log-sum-exp.

    `forward(q, k, v, seg, slopes, static) -> (out, lse)`; `backward(q, k, v, seg, slopes, out, lse, do, static,
    dlse=...) -> (dq, dk, dv)`. Segment ids have no cotangent; ALiBi slopes are constants of the model (zero).
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
    def attention(q, k, v, seg, slopes, static):
        return forward(q, k, v, seg, slopes, static)

    def attention_fwd(q, k, v, seg, slopes, static):
        out, lse = forward(q, k, v, seg, slopes, static)
        return (out, lse), (q, k, v, seg, slopes, out, lse)

    def attention_bwd(static, residuals, cotangents):
        q, k, v, seg, slopes, out, lse = residuals
        do, dlse = cotangents
        dq, dk, dv = backward(q, k, v, seg, slopes, out, lse, do, static, dlse=dlse)
        return dq, dk, dv, None, jnp.zeros_like(slopes)

    attention.defvjp(attention_fwd, attention_bwd)
    return attention


def merge_global_tokens(q, k, v, seg, glob, global_slots, *, scale: float, half: int, slopes, local):
    """Attention of a local layer (window |i - j| <= half) with global tokens.

    Args:
      q: [batch, seq, heads, dim]; k, v: [batch, seq, kv_heads, dim]; seg: int32 [batch, seq] (0 = padding);
      glob: bool [batch, seq], False on padding; global_slots: static bound on a row's global tokens;
      slopes: ALiBi slopes [heads] or None;
      local: (q, k, v) -> (out [batch, seq, heads, dim], lse [batch, heads, seq]), the kernel's window attention,
        differentiable through lse; a row with no visible key has out 0.
    """
    batch, seq, heads, dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    out_local, lse_local = local(q, k, v)
    order, valid = flagged_first(glob, global_slots or seq)
    g_seg = jnp.where(valid, jnp.take_along_axis(seg, order, axis=1), -1)
    gather = lambda x: jnp.take_along_axis(x, order[:, :, None, None], axis=1)  # [batch, slots, kv_heads, dim]
    k_glob, v_glob = gather(k), gather(v)
    qg = (q.astype(jnp.float32) * scale).reshape(batch, seq, kv_heads, group, dim)
    scores = jnp.einsum("bshgd,bnhd->bhgsn", qg, k_glob.astype(jnp.float32))
    distance = jnp.abs(jnp.arange(seq)[None, :, None] - order[:, None, :])  # [batch, seq, slots]
    head_slopes = None if slopes is None else jnp.asarray(slopes, jnp.float32).reshape(kv_heads, group)
    if head_slopes is not None:
        scores = scores - head_slopes[None, :, :, None, None] * distance[:, None, None].astype(jnp.float32)
    # Keys inside the window are already in the kernel's part: only global keys beyond it are added here.
    visible = (seg[:, :, None] == g_seg[:, None, :]) & (seg[:, :, None] != 0) & (distance > half)
    scores = jnp.where(visible[:, None, None], scores, MASK_VALUE)
    m = jnp.max(scores, axis=-1)
    p = jnp.where(visible[:, None, None], jnp.exp(scores - m[..., None]), 0.0)
    total = jnp.sum(p, axis=-1)
    safe_total = jnp.where(total > 0, total, 1.0)
    out_global = jnp.einsum("bhgsn,bnhd->bshgd", p, v_glob.astype(jnp.float32)).reshape(batch, seq, heads, dim)
    out_global = out_global / safe_total.reshape(batch, heads, seq).transpose(0, 2, 1)[..., None]
    lse_global = jnp.where(total > 0, m + jnp.log(safe_total), MASK_VALUE).reshape(batch, heads, seq)
    lse = jnp.logaddexp(lse_local, lse_global)
    w_local = jnp.exp(lse_local - lse).transpose(0, 2, 1)[..., None]
    w_global = jnp.exp(lse_global - lse).transpose(0, 2, 1)[..., None]
    out = (out_local.astype(jnp.float32) * w_local + out_global * w_global).astype(q.dtype)
    return _global_query_rows(out, q, k, v, seg, order, valid, scale, head_slopes)
