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


# Axis roles of the operands: which dimensions follow the batch split, which the head split (None: whole).
QKV = ("batch", None, "heads", None)  # [batch, seq, heads, head_dim]
ROWS = ("batch", None)  # [batch, seq]
HEADS = ("heads",)  # per-head constants (ALiBi slopes)


def per_device(kernel: Callable, operands: tuple, roles: tuple, out_roles: tuple, *, batch: int, heads: int,
               mlp: int = 1):
    """`kernel(*operands)` on each device's shard of batch (and heads) under the active mesh, or directly without one.

    roles: per operand, one role per dimension ("batch", "heads", "mlp" or None); an operand may be None (absent, no
    spec). out_roles: the same for the output. `heads` is the smallest head count among the operands (the kv
    heads under GQA): axes that split it split every larger multiple too, so GQA groups stay whole. `mlp`: the
    size of the "mlp" dimensions (a gated MLP's features), split as "activation_mlp" maps. Static settings travel
    in the kernel's closure.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return kernel(*operands)
    batch_axes = mesh_axes(mesh, "activation_batch", batch, default=mesh.axis_names)
    head_axes = mesh_axes(mesh, "activation_heads", heads, default=(), taken=batch_axes or ())
    mlp_axes = mesh_axes(mesh, "activation_mlp", mlp, default=(), taken=batch_axes or ())
    by_role = {"batch": batch_axes, "heads": head_axes, "mlp": mlp_axes}
    spec = lambda dims: P(*(by_role.get(d) for d in dims))
    in_specs = tuple(None if x is None else spec(r) for x, r in zip(operands, roles))
    if any(kind == jax.sharding.AxisType.Explicit for kind in mesh.axis_types):
        # Under explicit axes (jax.make_mesh's default) shard_map takes operands sharded as its specs say, not
        # whatever the caller's arrays are: move them there (nothing moves when they already are).
        operands = tuple(x if x is None else jax.sharding.reshard(x, s) for x, s in zip(operands, in_specs))
    return jax.shard_map(kernel, mesh=mesh, in_specs=in_specs, out_specs=spec(out_roles),
                         check_vma=False)(*operands)


def per_device_attention(kernel: Callable, q, k, v, segment_ids, alibi_slopes, global_tokens):
    """`per_device` for the operands of `bertjax.ops.attention`: q [batch, seq, heads, dim], k/v [batch, seq,
    kv_heads, dim], segment_ids and global_tokens [batch, seq], alibi_slopes [heads]; the optional ones may be
    None. The kernel sees the shard's heads and slopes."""
    return per_device(kernel, (q, k, v, segment_ids, alibi_slopes, global_tokens),
                      (QKV, QKV, QKV, ROWS, HEADS, ROWS), QKV, batch=q.shape[0], heads=k.shape[2])


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
