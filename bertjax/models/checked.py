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
"""

from __future__ import annotations

import contextvars
import functools
from typing import Callable

import jax
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


def checked(fn: Callable) -> Callable:
    """`jax.jit(fn)` with bertjax's input checks compiled in; raises ValueError when one fails."""

    def traced(*args, **kwargs):
        token = _CHECKING.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _CHECKING.reset(token)

    jitted = jax.jit(checkify.checkify(traced, errors=checkify.user_checks))

    @functools.wraps(fn)
    def call(*args, **kwargs):
        error, out = jitted(*args, **kwargs)
        message = error.get()
        if message:
            raise ValueError(message.strip().splitlines()[0])
        return out

    return call
