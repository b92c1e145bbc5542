"""`checked(fn)`: `jax.jit(fn)` in which out-of-range ids are an error instead of silent garbage.

Under a plain `jax.jit` the ids are tracers, so `prepare_inputs` cannot look at their values: an id >= vocab_size
gathers a row of NaN (XLA's out-of-bounds gather fill) and -1 wraps to the last row, without a word. `checked`
traces `fn` with the id checks turned into `jax.experimental.checkify` checks, which run on the device inside the
compiled program (two reductions per id array) and raise a ValueError naming the bad range after the call. The
same holds for token_type_ids, position_ids (the position table's rows) and masked_positions ([0, seq)).

    predict = bertjax.checked(lambda params, ids: model.apply({"params": params}, ids).logits)
    logits = predict(params, ids)   # ValueError: token ids must be in [0, 30522); got min -1 and max 17

`bertjax fill-mask` and `bertjax predict` check their ids on the host instead (bertjax.inference runs them).
Arguments are traced as in `jax.jit`: close over static settings (deterministic=True, ...) rather than passing them.
`checked` is an outermost boundary: `jax.grad` and `jax.vmap` may wrap it, an outer `jax.jit` may not (a TypeError:
put the whole computation inside `checked` instead, e.g. `checked(jax.grad(loss))`). The checks are added while
`fn` is traced: a `jax.jit`-compiled function of yours that `fn` calls, and that JAX already traced outside
`checked` (its trace is cached), runs without them, so call the model itself inside `fn`.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Callable

import jax
import jax.extend.core  # noqa: F401 (jax.extend.core below)
import jax.numpy as jnp
from jax.experimental import checkify

_CHECKING = contextvars.ContextVar("bertjax_checking_ids", default=False)


def checking_traced_values() -> bool:
    """True while `checked` traces its function: traced ids can be checked with checkify."""
    return _CHECKING.get()


def check_traced_ids(ids: jax.Array, size: int | None, what: str, note: str = "") -> None:
    """Inside `checked`: a device-side check that every id is in [0, size) (>= 0 when size is None)."""
    if not ids.size:  # nothing to check, and min/max of an empty array would not trace
        return
    note = note.replace("{", "{{").replace("}", "}}")
    if size is None:
        checkify.check(jnp.all(ids >= 0), f"{what} must be >= 0{note}; got min {{}}", jnp.min(ids))
        return
    checkify.check(jnp.all((ids >= 0) & (ids < size)),
                   f"{what} must be in [0, {size}){note}; got min {{}} and max {{}}", jnp.min(ids), jnp.max(ids))


def check_traced_at_most(value: jax.Array, bound: int, what: str) -> None:
    """Inside `checked`: a device-side check that the scalar `value` is at most `bound`; `what` says what."""
    checkify.check(value <= bound, f"{what.replace('{', '{{').replace('}', '}}')}; got {{}}", value)


def checked(fn: Callable) -> Callable:
    """`jax.jit(fn)` with bertjax's input checks compiled in; raises ValueError when one fails.

    It is an outermost jit boundary: under an outer `jax.jit` (or anything else that stages out: `lax.scan`,
    `shard_map`, ...) the checks could only report through an outer checkify, so that is a TypeError; put the whole
    computation inside `checked` instead (`checked(jax.grad(loss))`). `jax.grad` and `jax.vmap` around it work: `fn`
    then runs under them, uncompiled, with its checks evaluated as it runs.
    """

    def traced(*args, **kwargs):
        token = _CHECKING.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _CHECKING.reset(token)

    checkified = checkify.checkify(traced, errors=checkify.user_checks)
    jitted = jax.jit(checkified)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _staging():
            raise TypeError(
                "bertjax.checked(fn) is an outermost jit boundary and was called under jax.jit (or another "
                "transformation that stages it out), where its checks have nowhere to report: call it outside, with "
                "the whole computation inside (bertjax.checked(jax.grad(loss)) rather than jax.jit(...checked...)); "
                "jax.grad and jax.vmap around it work")
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((args, kwargs))):
            # grad or vmap of concrete values: they evaluate the checks right here. Not through `jitted`: JAX 0.10
            # cannot linearize a jitted checkify of a custom_vjp (the norms') ("foreach() argument 2 is shorter").
            try:
                error, out = checkified(*args, **kwargs)
                checkify.check_error(error)
            except checkify.JaxRuntimeError as failed:
                raise ValueError(_first_line(str(failed))) from None
            return out
        _refuse_wrapping_integers(args, kwargs)
        error, out = jitted(*args, **kwargs)
        message = error.get()
        if message:
            raise ValueError(_first_line(message))
        return out

    return call


def _refuse_wrapping_integers(args, kwargs) -> None:
    """jax.jit turns a numpy int64 array into int32 (64-bit types are off by default) before any check sees it, so
    2**32 + 5 would arrive as 5, a valid wrong id; such arrays are refused here, as an eager call refuses them.
    Only direct calls: under jax.vmap the values reach `checked` already converted."""
    import numpy as np

    for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]:
        if not (isinstance(leaf, np.ndarray) and np.issubdtype(leaf.dtype, np.integer) and leaf.size):
            continue
        target = np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype))
        if target == leaf.dtype:
            continue  # kept as it is (uint32, int32; int64 with jax_enable_x64)
        bounds = np.iinfo(target)
        if leaf.min() < bounds.min or leaf.max() > bounds.max:
            top, inner = path[1], jax.tree_util.keystr(path[2:])
            where = f"argument {top.idx}{inner}" if path[0].idx == 0 else f"{top.key}{inner}"
            raise ValueError(f"{where}: {leaf.dtype} values in [{leaf.min()}, {leaf.max()}] do not fit in {target}, "
                             "which jax.jit converts them to (they would wrap around silently)")


def _staging() -> bool:
    """True while tracing for jit (or any staged transformation): values are unknown until the program runs."""
    # JAX's own answer; where a JAX lacks it, JAX's error about an unfunctionalized check says it at compile time.
    under_jit = getattr(jax.extend.core, "unsafe_am_i_under_a_jit_DO_NOT_USE", None)
    return bool(under_jit and under_jit())


def _first_line(message: str) -> str:
    """The check's own message: its first line, without checkify's " (`check` failed)" tag."""
    return message.strip().splitlines()[0].removesuffix(" (`check` failed)")
