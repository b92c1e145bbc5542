"""Non-finite values: find them in a restored state, and stop (or skip) a train step that produced them.

A NaN or an infinity in the loss or the gradient norm poisons every parameter at the next update, and then every
checkpoint after it. The run config's `train.nonfinite` picks what happens:

- `stop` (default): the loop stops with an error naming the step, before saving anything, so the checkpoints on
  disk are the finite ones from before the divergence;
- `skip`: the jitted step computes the update and keeps the old parameters and optimizer state instead when the
  loss or gradient norm is not finite (`keep_finite_update`); the step counter, the optimizer counts that the
  learning rate schedule reads, and the data still advance, and the loop reports how many updates were skipped.

Detection reads only the "loss" and "grad_norm" entries of the train step's metrics, which every objective returns.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

log = logging.getLogger(__name__)

NONFINITE_MODES = ("stop", "skip")
WATCHED_METRICS = ("loss", "grad_norm")


class NonFiniteError(ValueError):
    """The run produced a non-finite loss or gradient norm and stopped without saving."""


# ---------------------------------------------------------------------------------------------------------------
# Inside the jitted step.

def update_is_finite(metrics: dict) -> jax.Array:
    """A scalar bool: every watched metric of this step is finite."""
    return jnp.all(jnp.stack([jnp.isfinite(metrics[name]) for name in WATCHED_METRICS]))


def keep_finite_update(old_state: Any, new_state: Any, metrics: dict) -> tuple[Any, dict]:
    """`new_state` when the step's loss and gradient norm are finite, else `old_state` with the new step counter
    and the new optimizer counts.

    The counts (the integer scalars of the optimizer state) advance with the step because the learning rate
    schedule reads them: kept, every later update would run at schedule(step - skipped) while the step, the logged
    learning_rate and the phases move on (transformers' Trainer also steps its scheduler past a skipped update).
    Adam's bias correction then counts the skipped update too, which changes an update by about b1^t: nothing after
    its first few dozen. The update is computed either way (one program, no host round trip); `jnp.where` picks per
    leaf, so with the old state donated XLA still updates the buffers in place. Adds metrics["skipped"] (1.0 for a
    skipped update).
    """
    finite = update_is_finite(metrics)
    kept = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, old_state)
    counts = jax.tree.map(lambda new, old: new if _is_count(new) else old, new_state.opt_state, kept.opt_state)
    return kept.replace(step=new_state.step, opt_state=counts), \
        {**metrics, "skipped": jnp.where(finite, 0.0, 1.0).astype(jnp.float32)}


def _is_count(leaf: Any) -> bool:
    return jnp.ndim(leaf) == 0 and jnp.issubdtype(jnp.result_type(leaf), jnp.integer)


# ---------------------------------------------------------------------------------------------------------------
# On the host, between steps.

class NonFiniteGuard:
    """Collects each step's watched metrics (device scalars, no sync) and checks them when `check` is called:
    before a checkpoint is saved, and at every log point."""

    def __init__(self, mode: str, keys: dict[str, str] | None = None):
        """`keys`: the run type's config keys behind the optimizer's `learning_rate` and `clip_global_norm`, which
        the error's advice names (default: pretraining's `optimizer.*`)."""
        if mode not in NONFINITE_MODES:
            raise ValueError(f"train.nonfinite must be one of {NONFINITE_MODES}, got {mode!r}")
        self.mode = mode
        self.keys = {"learning_rate": "optimizer.learning_rate", "clip_global_norm": "optimizer.clip_global_norm",
                     **(keys or {})}
        self.skipped = 0
        self._pending: list[tuple[int, dict]] = []

    def observe(self, step: int, metrics: dict) -> None:
        """`step`: the number of updates done after this one (the step a checkpoint now would carry)."""
        watched = {name: metrics[name] for name in WATCHED_METRICS}
        if self.mode == "skip":
            watched["skipped"] = metrics["skipped"]
        self._pending.append((step, watched))

    def check(self, last_checkpoint: int | None) -> None:
        """Raise NonFiniteError (stop mode) at the first non-finite step seen since the last check."""
        pending, self._pending = jax.device_get(self._pending), []
        for step, values in pending:
            if self.mode == "skip":
                if float(values["skipped"]):
                    self.skipped += 1
                    log.warning("step %d: non-finite %s; update skipped (train.nonfinite=skip; %d skipped so far)",
                                step, _describe(values), self.skipped)
                continue
            if not all(np.isfinite(float(values[name])) for name in WATCHED_METRICS):
                kept = (f"the latest checkpoint (step {last_checkpoint}) was saved before it and is kept"
                        if last_checkpoint is not None else "no checkpoint was saved")
                raise NonFiniteError(
                    f"step {step}: non-finite {_describe(values)}; stopped without saving ({kept}). Lower "
                    f"{self.keys['learning_rate']}, set {self.keys['clip_global_norm']}, or skip such updates "
                    "with train.nonfinite=skip")


def _describe(values: dict) -> str:
    return ", ".join(f"{name} {float(values[name])}" for name in WATCHED_METRICS)


@jax.jit
def _finite_flags(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.all(jnp.isfinite(x)), tree)


def nonfinite_leaves(tree: Any) -> list[str]:
    """Paths ("params/encoder/...") of the floating-point leaves of `tree` that hold a NaN or an infinity.

    Arrays in host memory (numpy, or JAX arrays on CPU devices) are checked with numpy where they lie: a jitted
    check compiles a program per tree structure, about a second for bert-base on CPU against 0.08 s of numpy. Arrays
    on accelerators, or not all on this host, are checked by that program on their devices."""
    floating = {jax.tree_util.keystr(path, simple=True, separator="/"): leaf
                for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
                if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)}
    on_host = {path: leaf for path, leaf in floating.items() if _in_host_memory(leaf)}
    flags = {path: _all_finite_on_host(leaf) for path, leaf in on_host.items()}
    on_devices = {path: leaf for path, leaf in floating.items() if path not in on_host}
    if on_devices:
        flags.update(jax.device_get(_finite_flags(on_devices)))
    return [path for path in floating if not bool(flags[path])]


def _in_host_memory(leaf: Any) -> bool:
    if isinstance(leaf, np.ndarray):
        return True
    return (isinstance(leaf, jax.Array) and leaf.is_fully_addressable
            and all(device.platform == "cpu" for device in leaf.devices()))


def _all_finite_on_host(leaf: Any, chunk: int = 1 << 22) -> bool:
    flat = np.asarray(leaf).reshape(-1)  # no copy for a CPU array held in one piece
    return all(bool(np.isfinite(flat[start:start + chunk]).all()) for start in range(0, flat.size, chunk))
