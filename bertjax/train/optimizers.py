"""Optimizers as optax GradientTransformations, chosen by name from `OPTIMIZERS`.

- "adamw": Adam with decoupled weight decay (optax.adamw), as BERT/RoBERTa fine-tuning and most pretraining.
- "lamb": layer-wise adaptive moments, BERT's large-batch recipe (biases and norms outside the trust ratio).
- "stable_adamw": ModernBERT's optimizer (see `stable_adamw`).

Every optimizer decays only the parameters that `decay_mask` selects (norms and biases are excluded by default)
and can clip the global gradient norm first. Gradient accumulation is done by the train step (bertjax/train/step.py),
which sums microbatch gradients before one optimizer update, so the optimizers here always see full-batch gradients.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bertjax.train.run_config import OptimizerConfig

# Parameter paths ("encoder/layers_0/attention/query/bias") that get no weight decay by default: biases (including
# the MLM decoder bias) and every norm's scale/bias.
DEFAULT_NO_DECAY = (r"bias$", r"norm/")


def param_path(path) -> str:
    """A pytree key path as "a/b/c" (dict keys, attribute names and sequence indices)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def decay_mask(params: Any, no_decay: tuple[str, ...] = DEFAULT_NO_DECAY,
               unused: frozenset[str] = frozenset()) -> Any:
    """A pytree of bools, True where weight decay applies: no pattern of `no_decay` matches the parameter path, and
    the path is not in `unused` (parameters the loss does not depend on: bertjax/train/unused_params.py)."""
    patterns = [re.compile(p) for p in no_decay]

    def decays(path, _) -> bool:
        name = param_path(path)
        return name not in unused and not any(p.search(name) for p in patterns)

    return jax.tree_util.tree_map_with_path(decays, params)


class StableAdamWState(NamedTuple):
    count: jax.Array  # updates done so far (int32)
    mu: optax.Updates  # first moment, float32
    nu: optax.Updates  # second moment, float32


def stable_adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.98, eps: float = 1e-6,
                 weight_decay: float = 0.0, mask: Any = None,
                 max_learning_rate: float | None = None) -> optax.GradientTransformation:
    """StableAdamW as ModernBERT trains with it (the `optimi` formulation).

    At update t (1-based), per tensor, with g the gradient:
        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2;   m_hat = m / (1 - b1^t);   v_hat = v / (1 - b2^t)
        lr_t = lr / max(1, sqrt(mean(g^2 / max(v_hat, eps^2))))        (Adafactor-style update clipping)
        p <- p - lr_t * m_hat / (sqrt(v_hat) + eps) - weight_decay * (lr_t / max_learning_rate) * p
    The clipping bounds the update of a tensor whose gradient jumps far above its running second moment, which is
    why no global gradient clipping is needed. The weight decay is fully decoupled: it follows the schedule (and
    the clipping) through lr_t / max_learning_rate but not the size of the learning rate itself, so `weight_decay`
    is a per-step fraction at peak learning rate (ModernBERT: 1e-5).

    Args:
      learning_rate: a float or a schedule (step -> lr); the schedule sees the number of updates done (0-based).
      max_learning_rate: the peak learning rate; defaults to `learning_rate` when that is a float.
      mask: pytree of bools (or a function params -> pytree) choosing the parameters that decay.
    """
    if max_learning_rate is None:
        if callable(learning_rate):
            raise ValueError("stable_adamw: max_learning_rate is required when learning_rate is a schedule")
        max_learning_rate = float(learning_rate)
    if max_learning_rate <= 0:
        raise ValueError(f"stable_adamw: max_learning_rate must be positive, got {max_learning_rate}")

    def init(params):
        zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)
        return StableAdamWState(count=jnp.zeros([], jnp.int32), mu=jax.tree.map(zeros, params),
                                nu=jax.tree.map(zeros, params))

    def update(grads, state, params=None):
        if params is None and weight_decay:
            raise ValueError("stable_adamw needs params in update() to apply weight decay")
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        grads32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, grads32)
        nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * g * g, state.nu, grads32)
        correction1 = 1.0 - b1 ** t
        correction2 = 1.0 - b2 ** t
        decays = mask(params) if callable(mask) else mask
        if decays is None:
            decays = jax.tree.map(lambda _: True, grads)

        def tensor_update(g, m, v, p, decay, original):
            m_hat = m / correction1
            v_hat = v / correction2
            rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(v_hat, eps * eps)))
            lr_t = lr / jnp.maximum(1.0, rms)
            step = -lr_t * m_hat / (jnp.sqrt(v_hat) + eps)
            if weight_decay and decay:
                step = step - weight_decay * (lr_t / max_learning_rate) * p.astype(jnp.float32)
            return step.astype(original.dtype)

        params_or_grads = params if params is not None else grads
        updates = jax.tree.map(tensor_update, grads32, mu, nu, params_or_grads, decays, grads)
        return updates, StableAdamWState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def _adamw(config: OptimizerConfig, learning_rate, mask) -> optax.GradientTransformation:
    return optax.adamw(learning_rate, b1=config.b1, b2=config.b2, eps=config.eps,
                       weight_decay=config.weight_decay, mask=mask)


def _trust_ratio_where(mask) -> optax.GradientTransformation:
    """optax.scale_by_trust_ratio on the leaves `mask` selects, the others passed through. Its state is the
    unmasked transformation's own, so checkpoints of optax.lamb's chain restore into it (optax.masked would wrap
    that state in another node)."""
    inner = optax.scale_by_trust_ratio()

    def update(updates, state, params=None):
        scaled, state = inner.update(updates, state, params)
        selected = mask(params) if callable(mask) else mask
        return jax.tree.map(lambda ratio_scaled, plain, keep: ratio_scaled if keep else plain,
                            scaled, updates, selected), state

    return optax.GradientTransformation(inner.init, update)


def _lamb(config: OptimizerConfig, learning_rate, mask) -> optax.GradientTransformation:
    """LAMB as BERT and ALBERT were trained with it: the parameters without weight decay (biases, norms) are also
    left out of the layer-wise trust ratio (their `exclude_from_layer_adaptation`). optax.lamb scales every
    parameter by it, so a bias starting at zero would move by about lr^2 a step. The chain is optax.lamb's, so
    its state (and a run's checkpoints) are the same."""
    return optax.chain(optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps),
                       optax.add_decayed_weights(config.weight_decay, mask),
                       _trust_ratio_where(mask),
                       optax.scale_by_learning_rate(learning_rate))


def _stable_adamw(config: OptimizerConfig, learning_rate, mask) -> optax.GradientTransformation:
    return stable_adamw(learning_rate, b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, mask=mask, max_learning_rate=config.learning_rate)


# name -> builder(config, learning rate or schedule, decay mask function). Add a line to add an optimizer.
OPTIMIZERS: dict[str, Callable[[OptimizerConfig, optax.ScalarOrSchedule, Callable], optax.GradientTransformation]] = {
    "adamw": _adamw,
    "lamb": _lamb,
    "stable_adamw": _stable_adamw,
}


# The keys of a fine-tuning or embedder run config behind `trainer_adamw`'s settings (the others are constants):
# what a resume with changed settings and the non-finite guard's advice name.
TRAINER_OPTIMIZER_KEYS = {"learning_rate": "train.learning_rate", "weight_decay": "train.weight_decay",
                          "clip_global_norm": "train.max_grad_norm"}


def trainer_adamw(train) -> OptimizerConfig:
    """The AdamW of transformers' Trainer and sentence-transformers (betas 0.9/0.999, eps 1e-8) with a fine-tuning
    or embedder run's `train.learning_rate`, `train.weight_decay` and `train.max_grad_norm`."""
    return OptimizerConfig(name="adamw", learning_rate=train.learning_rate, b1=0.9, b2=0.999, eps=1e-8,
                           weight_decay=train.weight_decay, clip_global_norm=train.max_grad_norm)


def build_optimizer(config: OptimizerConfig, schedule: optax.ScalarOrSchedule,
                    unused: frozenset[str] = frozenset()) -> optax.GradientTransformation:
    """The optimizer named by `config.name`, with its weight-decay mask and optional global-norm clipping. `unused`:
    paths of parameters the loss does not depend on, which do not decay (PyTorch's optimizers skip them)."""
    if config.name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name: unknown optimizer {config.name!r}; known: {sorted(OPTIMIZERS)}")
    mask = lambda params: decay_mask(params, config.no_decay, unused)
    optimizer = OPTIMIZERS[config.name](config, schedule, mask)
    if config.clip_global_norm is not None:
        optimizer = optax.chain(optax.clip_by_global_norm(config.clip_global_norm), optimizer)
    return optimizer


# A stand-in parameter tree with the kinds of leaves a model has (a decayed kernel, biases and norms excluded by
# `no_decay`): the optimizer state's structure over it changes exactly when it changes over a real model.
_PROBE_PARAMS = {"dense": {"kernel": jax.ShapeDtypeStruct((2, 2), jnp.float32),
                           "bias": jax.ShapeDtypeStruct((2,), jnp.float32)},
                 "norm": {"scale": jax.ShapeDtypeStruct((2,), jnp.float32)}}


def _state_structure(config: OptimizerConfig) -> Any:
    optimizer = build_optimizer(config, lambda count: config.learning_rate)  # every run passes a schedule
    return jax.tree.structure(jax.eval_shape(optimizer.init, _PROBE_PARAMS))


def state_changing_fields(held: OptimizerConfig, requested: OptimizerConfig) -> list[str]:
    """The fields of `requested` that differ from `held` in a way that changes the optimizer state's structure
    (another optimizer; clipping turned on or off adds or removes a state): a checkpoint saved with `held` cannot
    be restored into an optimizer built from `requested`. Other changes (the learning rate, a clipping threshold)
    only change the numbers and may differ on resume."""
    if held == requested:
        return []
    base = _state_structure(held)
    changed = []
    for field in dataclasses.fields(OptimizerConfig):
        value = getattr(requested, field.name)
        if value != getattr(held, field.name) and \
                _state_structure(dataclasses.replace(held, **{field.name: value})) != base:
            changed.append(field.name)
    return changed
