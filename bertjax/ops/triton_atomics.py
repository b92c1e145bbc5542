"""`relaxed_atomic_add`: Pallas Triton's float atomic add without memory ordering, for sums nothing reads until the
kernel has finished.

`jax.experimental.pallas.triton.atomic_add` lowers to an acquire-release atomic at GPU scope (jax 0.10 and 0.11
give no other choice). Compiled for sm_90, ptxas wraps each such atomic in a GPU-wide memory barrier before it
(MEMBAR.ALL.GPU) and an L1 invalidation after it (CCTL.IVALL): the thread waits for each atomic to reach L2 before
the next, which serialises what should be fire-and-forget reductions (`bench.pallas_gpu_static --backward-kernel
triton_atomic` counts them in the one-pass attention backward). A relaxed atomic orders nothing and compiles to the
plain reduction. That is all a sum needs whose result is read only after the kernel (the launch boundary orders it):
addition's result does not depend on which program adds first, only its rounding does.

JAX exposes no ordering argument, so this is its own primitive: JAX's atomic's shape checks and interpret-mode
rule (an add), and a Triton lowering that asks for relaxed ordering. It uses JAX's Pallas Triton internals
(`jax._src.pallas.triton`), checked on jax 0.10.2, 0.11.2 and 0.12.0 (tests/test_pallas_gpu_export.py compiles it for
sm_90 and looks for the barriers).
"""

from __future__ import annotations

import jax

try:
    from jax._src import core as jax_core
    from jax._src import state, tree_util
    from jax._src.lib.mlir.dialects import arith as arith_dialect
    from jax._src.lib.triton import dialect as tt_dialect
    from jax._src.pallas.triton import lowering
    from jax._src.pallas.triton import primitives as triton_primitives
    from jax._src.state import discharge as state_discharge
    from jax._src.state import indexing
    from jax._src.state import primitives as state_primitives

    _ABSTRACT_EVAL, _DISCHARGE = triton_primitives._atomic_abstract_eval, triton_primitives._atomic_rmw_discharge_rule
    _COMPUTE_POINTERS, _ENSURE_IR_VALUE = lowering._compute_pointers_from_indices, lowering._ensure_ir_value
    _ATOMIC_RMW, _RELAXED, _FADD = lowering._atomic_rmw, tt_dialect.MemSemantic.RELAXED, tt_dialect.RMWOp.FADD
    _ADD, _NDINDEXER, _TRANSFORM_TYPE = triton_primitives.AtomicOpType.ADD, indexing.NDIndexer, state.transform_type
    _REF_AND_TRANSFORMS = state_primitives.get_ref_and_transforms
except (ImportError, AttributeError) as error:  # a JAX whose Pallas Triton internals moved
    raise ImportError(f"bertjax's relaxed atomic add (the one-pass attention backward, pallas_gpu_atomic) is built on "
                      f"JAX's Pallas Triton internals as of jax 0.10-0.12, which jax {jax.__version__} does not have "
                      f"({error}); use attention_implementation 'pallas_gpu'") from error

relaxed_atomic_add_p = jax_core.Primitive("bertjax_relaxed_atomic_add")
# Same parameters as JAX's atomic_rmw primitive, so its abstract evaluation (the dtypes an atomic add takes) and its
# discharge rule (what interpret mode runs: a read, an add and a write) serve this one unchanged.
relaxed_atomic_add_p.def_effectful_abstract_eval(_ABSTRACT_EVAL)
state_discharge.register_discharge_rule(relaxed_atomic_add_p)(_DISCHARGE)


@lowering.register_lowering(relaxed_atomic_add_p)
def _relaxed_atomic_add_lowering(ctx, *args_flat, args_tree, atomic_type):
    del atomic_type  # always ADD
    [block_info, *_] = ctx.block_infos
    ptr, indexers, value, mask = args_tree.unflatten(args_flat)
    *_, value_aval, mask_aval = args_tree.unflatten(ctx.avals_in)
    indexers = list(indexers)
    if not indexers or not isinstance(indexers[-1], _NDINDEXER):
        ref_aval = _TRANSFORM_TYPE(indexers, ctx.avals_in[0])
        indexers.append(_NDINDEXER.make_trivial_indexer(ref_aval.shape))
    if len(indexers) != 1:
        raise NotImplementedError("relaxed_atomic_add: one indexer only")
    pointers = _COMPUTE_POINTERS(ptr, block_info, indexers[0])
    # jax >= 0.12 also returns which indices fall inside the array (a block overhanging its edge); 0.10-0.11 only the
    # pointers, and their callers bound the block themselves.
    pointers, in_bounds = pointers if isinstance(pointers, tuple) else (pointers, None)
    value = _ENSURE_IR_VALUE(value, value_aval)
    if mask is not None:
        mask = _ENSURE_IR_VALUE(mask, mask_aval)
    if in_bounds is not None:
        mask = in_bounds if mask is None else arith_dialect.andi(mask, in_bounds)
    return _ATOMIC_RMW(_FADD, pointers, value, mask=mask, semantic=_RELAXED)


def relaxed_atomic_add(ref, index, value) -> None:
    """ref[index] += value (float32), atomically and without ordering against the program's other memory accesses."""
    ref, transforms = _REF_AND_TRANSFORMS(ref, index, "relaxed_atomic_add")
    args_flat, args_tree = tree_util.tree_flatten((ref, transforms, value, None))
    relaxed_atomic_add_p.bind(*args_flat, args_tree=args_tree, atomic_type=_ADD)
