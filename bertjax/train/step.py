"""The jitted train step and eval step: ONE `jax.jit` boundary each, with explicit shardings.

The train step takes the state (donated: XLA reuses its buffers for the new state, so parameters and optimizer
state are never held twice), the objective's frozen parameters (a distillation teacher; never donated, never
updated) and a global batch, and returns the new state and replicated scalar metrics. The objective
(bertjax/train/objectives) supplies the loss as sums and counts; with `accumulation_steps` > 1 the batch is split
into microbatches that a `lax.scan` runs one after the other, summing gradients and sums, and the counts of the
whole batch normalise them, so the update equals the one of the full batch at once.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.data.global_batch import batch_sharding
from bertjax.train import guards
from bertjax.train import mesh as mesh_lib
from bertjax.train.objectives import Objective
from bertjax.train.state import TrainState

# Step metrics that count the batch (for throughput and FLOPs), not averages.
COUNT_METRICS = ("tokens", "predictions", "rows")


def batch_shardings(mesh: Mesh, batch: dict) -> dict[str, NamedSharding]:
    return {name: batch_sharding(mesh, mesh_lib.BATCH_AXES) for name in batch}


def _split_microbatches(batch: dict, count: int) -> dict:
    """[rows, ...] -> [count, rows // count, ...], microbatch i holding rows i, i + count, ...

    Taking every count-th row (rather than contiguous blocks) keeps each device's rows on that device: a device
    owning a contiguous block of rows owns the same block of every microbatch, so the split moves no data.
    """
    def split(x):
        x = x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1)
        spec = PartitionSpec(None, mesh_lib.BATCH_AXES, *([None] * (x.ndim - 2)))
        return jax.lax.with_sharding_constraint(x, spec)
    return jax.tree.map(split, batch)


def make_train_step(objective: Objective, optimizer: optax.GradientTransformation, schedule: Callable, mesh: Mesh,
                    shardings: TrainState, frozen_shardings: Any = None, *, accumulation_steps: int = 1,
                    seed: int = 0, nonfinite: str = "stop") -> "JittedStep":
    """`train_step(state, frozen, batch) -> (state, metrics)`; batch arrays global and sharded by
    `batch_shardings`, `frozen` the objective's frozen parameters ({} for most objectives).

    `nonfinite="skip"` keeps the old parameters and optimizer state when the loss or gradient norm is not finite
    (bertjax/train/guards.py); "stop" leaves that to the loop.
    """
    base_key = jax.random.key(seed)
    frozen_shardings = {} if frozen_shardings is None else frozen_shardings

    def loss_fn(params, frozen, batch, norm, key):
        params = mesh_lib.gathered_for_compute(params, shardings.params)
        frozen = mesh_lib.gathered_for_compute(frozen, frozen_shardings)
        sums = objective.loss_sums(params, frozen, batch, key, deterministic=False)
        return objective.loss(sums, norm), sums

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, frozen, batch: dict):
        norm = objective.normalisers(batch)
        key = jax.random.fold_in(base_key, state.step)  # dropout and sampling depend only on the step: exact resume
        if accumulation_steps == 1:
            grads, sums = grad_fn(state.params, frozen, batch, norm, key)
        else:
            def accumulate(carry, micro):
                grads, sums = carry
                index, microbatch = micro
                g, s = grad_fn(state.params, frozen, microbatch, norm, jax.random.fold_in(key, index))
                return (jax.tree.map(jnp.add, grads, g), jax.tree.map(jnp.add, sums, s)), None
            micro = (jnp.arange(accumulation_steps), _split_microbatches(batch, accumulation_steps))
            first = jax.tree.map(lambda x: x[0], micro)
            shapes = jax.eval_shape(lambda m: grad_fn(state.params, frozen, m[1], norm, key), first)
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
            (grads, sums), _ = jax.lax.scan(accumulate, zeros, micro)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = objective.metrics(sums)
        metrics.update(grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                       tokens=jnp.sum(batch["segment_ids"] > 0).astype(jnp.float32),
                       predictions=jnp.sum(batch["masked_weights"].astype(jnp.float32)),
                       rows=jnp.float32(batch["input_ids"].shape[0]))
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
        if nonfinite == "skip":
            return guards.keep_finite_update(state, new_state, metrics)
        return new_state, metrics

    return JittedStep(train_step, mesh, lambda batch: (shardings, frozen_shardings, batch_shardings(mesh, batch)),
                      out_shardings=(shardings, mesh_lib.replicated(mesh)), donate_argnums=(0,))


class JittedStep:
    """One jit of `fn(*args, batch)` per set of batch keys, called and lowered under the mesh's axis rules."""

    def __init__(self, fn: Callable, mesh: Mesh, in_shardings: Callable[[dict], tuple], out_shardings,
                 donate_argnums: tuple[int, ...] = ()):
        self.fn, self.mesh, self.in_shardings = fn, mesh, in_shardings
        self.out_shardings, self.donate_argnums = out_shardings, donate_argnums
        self._compiled: dict[tuple, Callable] = {}

    def jitted(self, batch: dict) -> Callable:
        signature = tuple(sorted(batch))
        if signature not in self._compiled:
            self._compiled[signature] = jax.jit(self.fn, in_shardings=self.in_shardings(batch),
                                                out_shardings=self.out_shardings,
                                                donate_argnums=self.donate_argnums)
        return self._compiled[signature]

    def __call__(self, *args):
        with mesh_lib.activate(self.mesh):
            return self.jitted(args[-1])(*args)

    def lower(self, *args):
        """Ahead-of-time lowering for abstract arguments (ShapeDtypeStructs), e.g. for another topology."""
        with mesh_lib.activate(self.mesh):
            return self.jitted(args[-1]).lower(*args)


EVAL_SEED = 0  # sampling objectives (ELECTRA) draw the same samples at every evaluation


def make_eval_step(objective: Objective, mesh: Mesh, param_shardings, frozen_shardings: Any = None) -> "JittedStep":
    """`eval_step(params, frozen, batch) -> sums` (replicated), deterministic (no dropout)."""
    frozen_shardings = {} if frozen_shardings is None else frozen_shardings

    def eval_step(params, frozen, batch):
        params = mesh_lib.gathered_for_compute(params, param_shardings)
        frozen = mesh_lib.gathered_for_compute(frozen, frozen_shardings)
        return objective.loss_sums(params, frozen, batch, jax.random.key(EVAL_SEED), deterministic=True)

    return JittedStep(eval_step, mesh,
                      lambda batch: (param_shardings, frozen_shardings, batch_shardings(mesh, batch)),
                      out_shardings=mesh_lib.replicated(mesh))
