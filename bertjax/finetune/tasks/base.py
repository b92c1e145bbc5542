"""What a fine-tuning task is: the interface the trainer and `bertjax predict` use.

A task owns everything that differs between classification, token classification, question answering and
multiple choice: the columns it reads, how labels become ids (and the label names the model keeps), how rows
become fixed-shape arrays, the loss, the metrics and the records `predict` writes. The trainer only calls these.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.config import TaskConfig
from bertjax.train.run_config import ConfigError
from bertjax.train.objectives import losses as objective_losses


@dataclasses.dataclass
class Encoded:
    """A split turned into arrays, plus what the metrics and predictions need to go back to examples.

    `arrays` all share their leading axis (rows: one per example, or per QA window); `examples` is the task's own
    per-example record (gold labels, words, contexts), `notes` lines worth telling the user (skipped rows),
    `truncated` how many examples were cut to data.max_length, so that part of them never reaches the model
    (`bertjax predict` warns with the count; the task's `truncation_effect` says what it means for its records).
    """

    arrays: dict[str, np.ndarray]
    examples: list[Any]
    notes: list[str] = dataclasses.field(default_factory=list)
    truncated: int = 0

    @property
    def rows(self) -> int:
        return len(next(iter(self.arrays.values())))


@dataclasses.dataclass(frozen=True)
class Labels:
    """The label space fixed from the training file: names in id order, or regression (one number)."""

    names: tuple[str, ...] = ()
    regression: bool = False
    unanswerable: bool = False  # question answering: some training questions have no answer (SQuAD v2)
    # A transformers checkpoint trained with problem_type multi_label_classification: each label is a yes/no of its
    # own (a sigmoid), not one of exclusive classes. `bertjax predict` serves such checkpoints; fine-tuning them is
    # not supported (the data format has one label per example).
    multi_label: bool = False
    # Sequence classification: whether the training rows had a second text ("all", "none" or "some" of them), so
    # that predicting a pair model on single texts (its text_pair column missing) is an error, not a guess.
    text_pairs: str | None = None
    # What reading the labels decided that the user may not expect (said by the trainer, not saved).
    notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def num_labels(self) -> int:
        return 1 if self.regression else len(self.names)


class Task(abc.ABC):
    name: ClassVar[str]  # the --task value
    head: ClassVar[str]  # the key of bertjax.models.MODEL_CLASSES of its model
    main_metric: ClassVar[str]  # what results.json and best/ follow (higher is better; see report.LOWER_IS_BETTER)
    # Config sections replaced before the user's file and overrides (configs/finetune/<task>.yaml spells them out).
    defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    # Batch keys that are targets, not model inputs.
    target_keys: ClassVar[tuple[str, ...]] = ("labels",)
    # How `bertjax predict` packs examples (bertjax/finetune/inference.py): "segments" (one output per packed
    # example), "tokens" (outputs per token, cut back per example) or None (one example per row, unpacked).
    prediction_unit: ClassVar[str | None] = None
    # What data.truncation's cut means for the task's predictions (tasks that cut examples set it; see Encoded).
    truncation_effect: ClassVar[str] = "each is predicted from the tokens that fit"
    # What a cut example is, for the same warning ({length}: data.max_length).
    truncation_cause: ClassVar[str] = "are longer than data.max_length={length} tokens and were cut"
    # Whether data.packing packs this task's training examples several to a row (its `encode` does).
    packs_training_rows: ClassVar[bool] = False
    # Whether the head pools a sequence into one vector (what task.classifier_pooling chooses).
    pools_sequence: ClassVar[bool] = False

    def __init__(self, data_config, task_config):
        if data_config.packing and not self.packs_training_rows:
            raise ConfigError(f"data.packing: the {self.name} task does not pack its training examples (sequence "
                              "classification does); set data.packing=false")
        if task_config.unanswerable is not None and self.head != "question_answering":
            raise ConfigError(f"task.unanswerable: the {self.name} task has no empty answer; remove it")
        if task_config.classifier_pooling is not None and not self.pools_sequence:
            raise ConfigError(f"task.classifier_pooling: the {self.name} head predicts per token and pools nothing; "
                              "remove it")
        self.data = data_config
        self.task_config = task_config

    def head_settings(self, labels: Labels, current: TaskConfig) -> TaskConfig:
        """The model config's TaskConfig for this task's head: the run's `task:` section where it sets a value,
        else the checkpoint's (`current`), with what the labels decide."""
        own = self.task_config
        return TaskConfig(**self.label_settings(labels),
                          classifier_dropout=(current.classifier_dropout if own.classifier_dropout is None
                                              else own.classifier_dropout),
                          classifier_pooling=own.classifier_pooling or current.classifier_pooling)

    def label_settings(self, labels: Labels) -> dict[str, Any]:
        """TaskConfig fields the label space sets (question answering and multiple choice: none, their number of
        outputs is fixed)."""
        return {}

    def main_metric_for(self, labels: "Labels") -> str:
        """The metric best/ follows for this label space (regression follows another one than classification)."""
        return self.main_metric

    # -- labels and data ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def fit_labels(self, rows: list[dict], source: str, known: tuple[str, ...] | None) -> Labels:
        """The label space of the training rows (`known`: the names a fine-tuned checkpoint already has)."""

    @abc.abstractmethod
    def encode(self, tokenizer, rows: list[dict], labels: Labels, source: str, *, with_targets: bool,
               training: bool = False) -> Encoded:
        """Arrays for `rows`; `with_targets` False for prediction files without labels, `training` True for the
        training file (where a task may skip unusable examples, and says how many in `notes`)."""

    # -- computation (traced inside jit) ------------------------------------------------------------------------
    @abc.abstractmethod
    def loss_sums(self, output, batch: dict) -> tuple[jax.Array, jax.Array]:
        """(sum of per-example losses, number of examples) over the rows whose `weight` is 1."""

    # The two methods the jitted steps call are the class's, not an instance's: a compiled program depends on the
    # task's kind alone (bertjax.finetune.inference.task_row_fn caches per model and task class).
    @classmethod
    @abc.abstractmethod
    def host_outputs(cls, output) -> dict[str, jax.Array]:
        """The arrays of the model output that evaluation and prediction need on the host."""

    @classmethod
    def model_kwargs(cls, batch: dict, type_vocab_size: int) -> dict:
        inputs = {"input_ids": batch["input_ids"], "segment_ids": batch["segment_ids"]}
        # One token type (RoBERTa's family): every position is type 0, as its own tokenizer says, whatever the pair
        # template of the tokenizer at hand numbers the second text (bertjax's trained one: BERT's 0/1).
        if type_vocab_size > 1:
            inputs["token_type_ids"] = batch["token_type_ids"]
        return inputs

    # -- results on the host ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def metrics(self, outputs: dict[str, np.ndarray], encoded: Encoded, labels: Labels) -> dict[str, float]:
        """The task's metrics over a split (outputs in row order, padding rows dropped)."""

    @abc.abstractmethod
    def predictions(self, outputs: dict[str, np.ndarray], encoded: Encoded, labels: Labels) -> list[dict]:
        """One JSON-able record per example for `bertjax predict`."""


def fit_max_length(data_config, model_config, *, chosen: Collection[str] = (), model: str = "the model"):
    """`data_config` with max_length at most the model's usable positions (max_position_embeddings less
    position_offset, inference.model_max_length), where the model itself would fail inside its jitted program with
    an error naming neither. `chosen`: the dotted keys the user set (a --config file, overrides). A default (QA's
    384) is capped to fit a smaller model, and a default doc_stride shrinks with it in proportion (QA's 128 of 384)
    so that windows still advance; a max_length the user chose that does not fit is an error naming it.
    `bertjax predict` and `bertjax finetune` take this one path."""
    from bertjax.inference.texts import model_max_length

    limit = model_max_length(model_config)
    length = data_config.max_length
    if length <= limit:
        return data_config
    if "data.max_length" in chosen:
        offset = f" less position_offset {model_config.position_offset}" if model_config.position_offset else ""
        raise ValueError(f"data.max_length={length} is longer than {model} takes: {limit} tokens "
                         f"(max_position_embeddings {model_config.max_position_embeddings}{offset}); set "
                         f"data.max_length={limit} or less")
    stride = data_config.doc_stride
    if "data.doc_stride" not in chosen:
        stride = max(1, stride * limit // length)
    return dataclasses.replace(data_config, max_length=limit, doc_stride=stride)


def chosen_keys(overrides: Iterable[str], config_file: Mapping | None = None) -> frozenset[str]:
    """The dotted keys a user set: `key=value` overrides, and the keys of a --config file's sections."""
    keys = {override.partition("=")[0].strip() for override in overrides}
    for section, values in (config_file or {}).items():
        if isinstance(values, Mapping):
            keys.update(f"{section}.{key}" for key in values)
    return frozenset(keys)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-position cross entropy in float32; labels outside [0, classes) (IGNORE) give 0."""
    valid = (labels >= 0) & (labels < logits.shape[-1])
    return jnp.where(valid, objective_losses.cross_entropy(logits, jnp.where(valid, labels, 0)), 0.0)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    return np.exp(-np.logaddexp(0.0, -logits))  # 1 / (1 + e^-x) without overflow for large |x|


def softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def fit_names(values: list, known: tuple[str, ...] | None) -> tuple[str, ...]:
    """Label names of a training file: integers in numeric order, other strings sorted; a checkpoint's own order
    when it already has all of them (its classifier rows keep their meaning), matched as `same_labels` does and
    spelled as the file spells them ("neutral" for a checkpoint's "NEUTRAL")."""
    seen = {label_key(v) for v in values}
    if known and seen <= set(known):  # exactly its names (even two that differ only in case: pos, POS)
        return tuple(known)
    if known:
        spelled = {_label_identity(name): name for name in seen}
        identities = [_label_identity(name) for name in known]
        if len(spelled) == len(seen) and set(spelled) <= set(identities) and len(set(identities)) == len(known):
            return tuple(spelled.get(identity, name) for identity, name in zip(identities, known))
    if all(_is_int(v) for v in seen):
        return tuple(sorted(seen, key=int))
    return tuple(sorted(seen))


def same_labels(names: tuple[str, ...], known: tuple[str, ...]) -> bool:
    """Whether `names` (a training file's, in id order) are a checkpoint's `known` label names in the same order,
    up to case and transformers' placeholder names: LABEL_3 is label 3 (a checkpoint saved without id2label)."""
    return [_label_identity(name) for name in names] == [_label_identity(name) for name in known]


def _label_identity(name: str) -> str:
    placeholder = re.fullmatch(r"LABEL_(\d+)", name)
    return str(int(placeholder.group(1))) if placeholder else name.casefold()


def label_ids(values: list, names: tuple[str, ...], source: str, column: str, unit: str = "row") -> np.ndarray:
    """ids of `values`; a value the training file never had is an error, never a silent wrong label."""
    index = {name: i for i, name in enumerate(names)}
    out = np.empty(len(values), np.int32)
    for row, value in enumerate(values):
        key = label_key(value)
        if key not in index:
            raise ValueError(f"{source}, {unit} {row + 1}: label {value!r} in column {column!r} does not occur in the "
                             f"training file (its labels: {list(names)})")
        out[row] = index[key]
    return out


def label_key(value: Any) -> str:
    """A label as its name: 1, 1.0, "1" and "1.0" are all "1" (CSV gives strings, JSONL numbers)."""
    return str(int(float(value))) if _is_int(value) else str(value)


def is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def written_as_float(value: Any) -> bool:
    """A number written with a fraction part or exponent (1.0, "2.0", "1e0"), as a float column of scores is."""
    if isinstance(value, (float, np.floating)):
        return True
    return isinstance(value, str) and is_number(value) and any(c in value for c in ".eE")


def _is_int(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return number.is_integer() and not isinstance(value, bool)
