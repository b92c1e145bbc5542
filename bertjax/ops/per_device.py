"""Run a Pallas attention kernel once per device under the active mesh, shared by the Pallas TPU and GPU paths.

XLA cannot partition a Pallas custom call: a Mosaic (TPU) call is an error without a shard_map ("wrap the call in a
shard_map"), and a Triton (GPU) call is silently replicated, i.e. q, k and v are all-gathered and every device
computes the whole batch. So under a mesh set with `jax.set_mesh(mesh)` the kernel runs inside `jax.shard_map`:
batch split as the Flax logical axis rules map "activation_batch" (over every mesh axis when no rules are active),
heads as "activation_heads" when both the query and kv head counts divide; sequence and head_dim stay whole on
every device. Without a mesh the kernel is called directly.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P


def per_device(kernel: Callable, q, k, v, segment_ids, alibi_slopes, global_tokens):
    """`kernel(q, k, v, segment_ids, alibi_slopes, global_tokens)` on each device's shard of batch (and heads).

    Shapes as `bertjax.ops.attention` (q [batch, seq, heads, dim], k/v [batch, seq, kv_heads, dim], segment_ids
    and global_tokens [batch, seq], alibi_slopes [heads]); the optional operands may be None. The kernel sees the
    shard's heads and slopes; static settings (window, scale, global slots) travel in its closure.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return kernel(q, k, v, segment_ids, alibi_slopes, global_tokens)
    batch_axes = mesh_axes(mesh, "activation_batch", q.shape[0], default=mesh.axis_names)
    # kv_heads divides heads, so axes that split the kv heads split the query heads too (GQA groups stay whole).
    head_axes = mesh_axes(mesh, "activation_heads", k.shape[2], default=(), taken=batch_axes or ())
    qkv_spec, row_spec = P(batch_axes, None, head_axes, None), P(batch_axes, None)
    # Optional operands travel as None (an empty pytree: no spec needed beyond a placeholder).
    slope_spec = None if alibi_slopes is None else P(head_axes)
    glob_spec = None if global_tokens is None else row_spec
    return jax.shard_map(kernel, mesh=mesh,
                         in_specs=(qkv_spec, qkv_spec, qkv_spec, row_spec, slope_spec, glob_spec),
                         out_specs=qkv_spec, check_vma=False)(q, k, v, segment_ids, alibi_slopes, global_tokens)


def mesh_axes(mesh, logical_name: str, size: int, default: tuple[str, ...],
              taken: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Mesh axes that split a dimension of `size`: from the active Flax logical rules, else `default`.

    Axes are kept in order while their product still divides `size` (e.g. batch 4 over data=2, fsdp=2, tensor=2
    splits over data and fsdp); None (replicated) when none fits: correct, at the cost of a gather.
    """
    if nn.get_logical_axis_rules():
        axes = nn.logical_to_mesh_axes((logical_name,))[0]
        axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    else:
        axes = tuple(default)
    kept = []
    for axis in axes:
        if axis in mesh.axis_names and axis not in taken and size % (math.prod(mesh.shape[a] for a in kept)
                                                                      * mesh.shape[axis]) == 0:
            kept.append(axis)
    return tuple(kept) or None
