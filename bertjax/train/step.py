"""The jitted train step and eval step: ONE `jax.jit` boundary each, with explicit shardings.

The train step takes the state (donated: XLA reuses its buffers for the new state, so parameters and optimizer
state are never held twice) and a global batch, and returns the new state and replicated scalar metrics.
With `accumulation_steps` > 1 the batch is split into microbatches that a `lax.scan` runs one after the other,
summing gradients; losses are normalised by the counts of the whole batch (bertjax/train/objectives.py), so the
update equals the one of the full batch at once.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.config import EncoderConfig
from bertjax.train import guards
from bertjax.train import mesh as mesh_lib
from bertjax.train import objectives
from bertjax.train.state import TrainState


def model_inputs(config: EncoderConfig, batch: dict) -> dict:
    """Keyword arguments of the model for a pretraining batch (see bertjax.data for the batch contract)."""
    inputs = {"input_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
              "position_ids": batch["positions"] + config.position_offset,
              "masked_positions": batch["masked_positions"]}
    if config.type_vocab_size:
        inputs["token_type_ids"] = batch["token_type_ids"]
    return inputs


def batch_shardings(mesh: Mesh, batch: dict) -> dict[str, NamedSharding]:
    return {name: mesh_lib.batch_sharding(mesh, len(value.shape)) for name, value in batch.items()}


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


def make_train_step(model: nn.Module, optimizer: optax.GradientTransformation, schedule: Callable, mesh: Mesh,
                    shardings: TrainState, *, with_nsp: bool, accumulation_steps: int = 1,
                    seed: int = 0, nonfinite: str = "stop") -> "JittedStep":
    """`train_step(state, batch) -> (state, metrics)`; batch arrays global and sharded by `batch_shardings`.

    `nonfinite="skip"` keeps the old parameters and optimizer state when the loss or gradient norm is not finite
    (bertjax/train/guards.py); "stop" leaves that to the loop.
    """
    config: EncoderConfig = model.config
    base_key = jax.random.key(seed)

    def loss_fn(params, batch, norm, key):
        params = mesh_lib.gathered_for_compute(params, shardings.params)
        output = model.apply({"params": params}, **model_inputs(config, batch), deterministic=False,
                             rngs={"dropout": key})
        sums = objectives.loss_sums(output, batch, with_nsp)
        return objectives.total_loss(sums, norm), sums

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, batch: dict):
        norm = objectives.normalisers(batch, with_nsp)
        key = jax.random.fold_in(base_key, state.step)  # dropout masks depend only on the step: exact resume
        if accumulation_steps == 1:
            grads, sums = grad_fn(state.params, batch, norm, key)
        else:
            def accumulate(carry, micro):
                grads, sums = carry
                index, microbatch = micro
                g, s = grad_fn(state.params, microbatch, norm, jax.random.fold_in(key, index))
                return (jax.tree.map(jnp.add, grads, g), sums + s), None
            zero_grads = jax.tree.map(jnp.zeros_like, state.params)
            zero = jnp.float32(0.0)
            zero_sums = objectives.LossSums(zero, zero, zero, zero, zero, zero)
            micro = (jnp.arange(accumulation_steps), _split_microbatches(batch, accumulation_steps))
            (grads, sums), _ = jax.lax.scan(accumulate, (zero_grads, zero_sums), micro)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = objectives.metrics(sums, with_nsp)
        metrics.update(grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                       tokens=jnp.sum(batch["segment_ids"] > 0).astype(jnp.float32),
                       predictions=sums.mlm_weight, rows=jnp.float32(batch["input_ids"].shape[0]))
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
        if nonfinite == "skip":
            return guards.keep_finite_update(state, new_state, metrics)
        return new_state, metrics

    return JittedStep(train_step, mesh, lambda batch: (shardings, batch_shardings(mesh, batch)),
                      out_shardings=(shardings, mesh_lib.replicated(mesh)), donate_argnums=(0,))


class JittedStep:
    """One jit of `fn(first, batch)` per set of batch keys, called and lowered under the mesh's axis rules."""

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

    def __call__(self, first, batch: dict):
        with mesh_lib.activate(self.mesh):
            return self.jitted(batch)(first, batch)

    def lower(self, first, batch: dict):
        """Ahead-of-time lowering for abstract arguments (ShapeDtypeStructs), e.g. for another topology."""
        with mesh_lib.activate(self.mesh):
            return self.jitted(batch).lower(first, batch)


def make_eval_step(model: nn.Module, mesh: Mesh, param_shardings, *,
                   with_nsp: bool) -> "JittedStep":
    """`eval_step(params, batch) -> LossSums` (replicated), deterministic (no dropout)."""
    config: EncoderConfig = model.config

    def eval_step(params, batch):
        params = mesh_lib.gathered_for_compute(params, param_shardings)
        output = model.apply({"params": params}, **model_inputs(config, batch), deterministic=True)
        return objectives.loss_sums(output, batch, with_nsp)

    return JittedStep(eval_step, mesh, lambda batch: (param_shardings, batch_shardings(mesh, batch)),
                      out_shardings=mesh_lib.replicated(mesh))
