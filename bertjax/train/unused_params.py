"""Parameters a loss does not depend on, which weight decay leaves alone as PyTorch's optimizers do.

`torch.optim.AdamW` skips a parameter whose `.grad` is None: one with no path to the loss in the autograd graph, such
as Longformer's global projections when no token attends globally, or XLNet's `mask_emb` without a target mapping.
optax decays every leaf its mask selects, gradient or not, so without this such a parameter would shrink by
lr * weight_decay each step where transformers' Trainer leaves it as loaded (1% of Longformer's global projections
over longformer-base.yaml's 65k steps). A parameter whose path to the loss gives it a zero gradient (a projection
whose output is sliced away) is used, as in torch, and decays.

Which parameters reach the loss is read off the traced program: a backward pass over the jaxpr from the loss marks
every equation that an output depends on, entering the sub-programs of calls whose operands and results map one to
one (jit, remat, shard_map). Any other equation with a sub-program (scan, cond, custom derivatives, Pallas kernels)
counts all of its operands as used, which can only keep a parameter decayed, never stop a used one's decay.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
from jax.extend.core import Var, jaxprs_in_params

from bertjax.train.optimizers import param_path

# Call-like primitives whose one sub-program takes the operands and gives the results in order (names across
# JAX 0.10-0.12: "pjit" became "jit").
_ONE_TO_ONE_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint", "shard_map"})


def _used_inputs(jaxpr, used_outputs: Sequence[bool]) -> list[bool]:
    used = {var for var, needed in zip(jaxpr.outvars, used_outputs) if needed and isinstance(var, Var)}
    for eqn in reversed(jaxpr.eqns):
        needed = [var in used for var in eqn.outvars]
        if not any(needed) and not eqn.effects:
            continue
        inner = list(jaxprs_in_params(eqn.params))
        if (eqn.primitive.name in _ONE_TO_ONE_CALLS and len(inner) == 1 and not eqn.effects
                and len(inner[0].invars) == len(eqn.invars) and len(inner[0].outvars) == len(eqn.outvars)):
            reached = _used_inputs(inner[0], needed)
        else:
            reached = [True] * len(eqn.invars)
        used.update(var for var, needed in zip(eqn.invars, reached) if needed and isinstance(var, Var))
    return [var in used for var in jaxpr.invars]


def unused_parameters(loss: Callable[..., Any], params: Any, *args: Any) -> frozenset[str]:
    """Paths ("encoder/layers_0/attention/query_global/kernel") of the leaves of `params` that `loss(params, *args)`
    does not depend on. Traced, not run: `params` and `args` may be ShapeDtypeStructs."""
    closed = jax.make_jaxpr(loss)(params, *args)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    used = _used_inputs(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    # make_jaxpr flattens (params, *args) in order: the parameters' leaves come first.
    return frozenset(param_path(path) for (path, _), reached in zip(leaves, used) if not reached)


def undecayed_note(unused: frozenset[str], weight_decay: float) -> str | None:
    """The line a run prints when weight decay skips parameters for this reason (None when it skips none)."""
    if not unused or not weight_decay:
        return None
    names = sorted(unused)
    return (f"weight decay skips {len(names)} parameter(s) the loss does not depend on, as PyTorch's AdamW skips a "
            f"parameter without a gradient: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}")
