"""What a training objective is: the interface the train step, the loop, compile-check and the benchmarks use.

An objective owns everything that differs between MLM, MLM + NSP/SOP, ELECTRA and distillation:
- its typed options (the run config's `objective:` section, `name` plus the options of that objective);
- the batch keys it reads, checked against what the data pipeline produces before anything compiles;
- the trainable parameters (one model, or a generator and a discriminator) and any frozen ones (a teacher);
- the loss as sums and counts (so gradient accumulation stays exact), its metrics and its model FLOPs;
- the user-facing models its parameters hold (`exports`: what pretraining saves and users fine-tune).

The train step only calls these methods; no objective name appears outside this package.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax

from bertjax.config import EncoderConfig
from bertjax.train.state import abstract_boxed_params

Sums = dict[str, jax.Array]
Params = Any

# Batch keys every objective's model reads (bertjax.data's batch contract). token_type_ids only when the model
# has token types.
MODEL_BATCH_KEYS = frozenset({"input_ids", "segment_ids", "positions", "masked_positions", "masked_ids",
                              "masked_weights"})


@dataclasses.dataclass(frozen=True)
class ObjectiveOptions:
    """Options shared by every objective; each objective subclasses this with its own typed fields."""

    name: str = "mlm"

    def tokenizer_path(self) -> str | None:
        """A tokenizer the objective needs (a teacher's), used when the run config names none."""
        return None


class ObjectiveError(ValueError):
    """An objective that cannot run with this model or data; the message names the config key."""


def model_inputs(config: EncoderConfig, batch: dict, input_ids: jax.Array | None = None) -> dict:
    """Keyword arguments of a bertjax model for a pretraining batch (`input_ids` replaces the batch's)."""
    inputs = {"input_ids": batch["input_ids"] if input_ids is None else input_ids,
              "segment_ids": batch["segment_ids"],
              "position_ids": batch["positions"] + config.position_offset}
    if config.type_vocab_size:
        inputs["token_type_ids"] = batch["token_type_ids"]
    return inputs


class Objective(abc.ABC):
    """One training objective over one model config (the model users keep: the MLM model, the discriminator, the
    student). Instances are built by `bertjax.train.objectives.build_objective`."""

    name: ClassVar[str]
    options_class: ClassVar[type[ObjectiveOptions]]
    # Batch keys read besides MODEL_BATCH_KEYS.
    extra_batch_keys: ClassVar[frozenset[str]] = frozenset()
    # Where the main model's parameters sit in the trainable tree (None: the tree is the main model's).
    params_key: ClassVar[str | None] = None

    def __init__(self, options: ObjectiveOptions, model_config: EncoderConfig, remat_policy: str = "none"):
        self.options = options
        self.model_config = model_config
        self.remat_policy = remat_policy

    # -- data ---------------------------------------------------------------------------------------------------
    @property
    def batch_keys(self) -> frozenset[str]:
        keys = MODEL_BATCH_KEYS | self.extra_batch_keys
        return keys | {"token_type_ids"} if self.model_config.type_vocab_size else keys

    def check_data(self, data_config, produced: set[str], where: str) -> None:
        """Refuse data that lacks a key this objective reads; `where` names the data config key."""
        missing = sorted(self.batch_keys - set(produced))
        if missing:
            raise ObjectiveError(f"objective.name={self.name!r} reads batch key(s) {missing}, which {where} does not "
                                 f"produce (it produces {sorted(produced)})" + self._data_hint(missing))

    def _data_hint(self, missing: list[str]) -> str:
        return ""

    # -- parameters ---------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def init_params(self, key: jax.Array) -> Params:
        """Trainable parameters with logical-axis boxes (the train state's `params`)."""

    def abstract_params(self) -> Params:
        """Shapes and dtypes of the trainable parameters, without allocating them."""
        return nn.meta.unbox(abstract_boxed_params(self.init_params))

    def frozen_params(self, mesh, abstract: bool = False) -> tuple[Params, Any]:
        """(parameters the objective reads but never updates, their shardings), placed on `mesh`; with
        `abstract`, ShapeDtypeStructs carrying the shardings (ahead-of-time compiles)."""
        return {}, {}

    def frozen_description(self) -> dict | None:
        """What the frozen parameters are (a teacher's path and fingerprint), kept in model_config.json so that a
        resume against other ones is refused; None when the objective has none."""
        return None

    def warm_start(self, params: Params, frozen: Params) -> Params:
        """The parameters a fresh run starts from, given the randomly initialised ones (jitted, sharded)."""
        return params

    # -- loss ---------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def loss_sums(self, params: Params, frozen: Params, batch: dict, key: jax.Array, deterministic: bool) -> Sums:
        """Sums (and counts) of one (micro)batch; `key` drives dropout and any sampling."""

    @abc.abstractmethod
    def normalisers(self, batch: dict) -> Sums:
        """Counts of the whole batch that turn the sums into means (each at least 1)."""

    @abc.abstractmethod
    def loss(self, sums: Sums, norm: Sums) -> jax.Array:
        """The scalar that is differentiated."""

    @abc.abstractmethod
    def metrics(self, sums: Sums) -> dict[str, jax.Array]:
        """Means over a whole batch (or several batches' summed sums); always includes `loss`."""

    # -- accounting and saving ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def train_flops(self, *, seq_len: int, tokens: float, predictions: float, rows: float) -> float:
        """Model FLOPs of one training step (bertjax/train/flops.py conventions)."""

    @abc.abstractmethod
    def exports(self, params: Params) -> dict[str, tuple[nn.Module, Params]]:
        """The user-facing models held by `params`, by name; the first is the one pretraining is for."""

    def export_models(self) -> dict[str, nn.Module]:
        """The models `exports` returns, by name, without any parameter values: `exports` traced on shapes (its
        parameters may be computed, as GDES adds the generator's embeddings to the discriminator's)."""
        models = {}

        def parameters_of(params):
            exported = self.exports(params)
            models.update({name: model for name, (model, _) in exported.items()})
            return {name: model_params for name, (_, model_params) in exported.items()}

        jax.eval_shape(parameters_of, self.abstract_params())
        return models
