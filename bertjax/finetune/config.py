"""The typed run config of `bertjax finetune`: frozen dataclasses per section, parsed by the same machinery as
pretraining's (bertjax.train.run_config: unknown keys, wrong types and impossible values name the dotted key).

    task:       {num_labels: null, problem_type: null}   (null: from the training labels)
    train:      {epochs: 3, batch_size: 32, learning_rate: 2.0e-5, weight_decay: 0.01, warmup_ratio: 0.1, seed: 0}
    data:       {max_length: 128, packing: false, truncation: true, doc_stride: 128, text_column: text, ...}
    eval:       {every: 0, batch_size: 64}   (every 0: at the end of each epoch)
    checkpoint: {every: 1000, keep: 3, ...}  (as pretraining's; a checkpoint is also written at every evaluation)
    mesh:       {data: -1, fsdp: 1, tensor: 1}

The defaults are BERT's and RoBERTa's fine-tuning settings (AdamW, linear warmup over 10% then linear decay,
weight decay 0.01, 3 epochs, batch 32); each task's preset (configs/finetune/) adjusts what its papers do.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Literal, Mapping

import yaml

from bertjax.config import ClassifierPooling, ProblemType
from bertjax.train.run_config import (CheckpointConfig, ConfigError, MeshConfig, apply_override, check_grad_clip,
                                      parse_dataclass, read_config_file, to_record)


@dataclasses.dataclass(frozen=True)
class FinetuneTaskConfig:
    """The run config's `task:` section: what the new head predicts, and how (bertjax.TaskConfig is what the
    model config then holds)."""

    num_labels: int | None = None  # None: the number of distinct training labels (1 for numeric labels)
    problem_type: ProblemType | None = None
    # The head's dropout and its pooling of a sequence (ModernBERT's "mean"); None: the checkpoint's.
    classifier_dropout: float | None = None
    classifier_pooling: ClassifierPooling | None = None
    # Question answering: whether an answer may be "" (no answer, SQuAD v2). None: when some training question has
    # no answer; predicting with a transformers checkpoint (no finetune.json), false.
    unanswerable: bool | None = None


@dataclasses.dataclass(frozen=True)
class FinetuneTrainConfig:
    epochs: int = 3
    # Examples per optimizer update (multiple choice: questions, each with all its choices; data.packing: packed
    # rows, each holding several examples).
    batch_size: int = 32
    learning_rate: float = 2e-5  # the peak; linear warmup then linear decay to 0
    weight_decay: float = 0.01  # not on biases and norms
    warmup_ratio: float = 0.1  # share of the updates spent warming up
    max_grad_norm: float | None = 1.0  # global-norm clipping, as transformers' Trainer
    seed: int = 0  # head initialisation, shuffling, dropout
    early_stopping_patience: int = 0  # stop after this many evaluations without a better main metric; 0: never
    nonfinite: Literal["stop", "skip"] = "stop"  # a NaN/inf loss or gradient norm: as pretraining's train.nonfinite
    progress_bar: bool = True


@dataclasses.dataclass(frozen=True)
class FinetuneDataConfig:
    max_length: int = 128  # tokens per example, [CLS] and [SEP] included
    packing: bool = False  # several short examples per row (sequence classification; one prediction each)
    truncation: bool = True  # false: an example longer than max_length is an error instead of being cut
    # Question answering: tokens shared by consecutive windows; less than the context room of a row (what
    # max_length leaves after the question, up to half of it, and the special tokens): bertjax.finetune.qa.
    doc_stride: int = 128
    max_answer_length: int = 30  # question answering: longest answer span predicted, in tokens
    n_best: int = 20  # question answering: start and end candidates considered per window
    # Question answering with unanswerable questions: answer "" when the [CLS] score beats the best span's by more
    # than this (transformers' run_qa option); SQuAD v2 evaluation prints the best one found as best_f1_thresh.
    null_score_diff_threshold: float = 0.0
    text_column: str = "text"
    text_pair_column: str = "text_pair"  # used when the file has it
    label_column: str = "label"
    tokens_column: str = "tokens"
    tags_column: str = "tags"
    question_column: str = "question"
    context_column: str = "context"
    answers_column: str = "answers"
    id_column: str = "id"  # question answering: an identifier per question, when the file has one
    choices_column: str = "choices"


@dataclasses.dataclass(frozen=True)
class FinetuneEvalConfig:
    every: int = 0  # steps between evaluations on the validation file; 0: at the end of each epoch
    batch_size: int = 64
    main_metric: str | None = None  # what best/ and early stopping follow; None: the task's (accuracy, f1, ...)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    task: FinetuneTaskConfig = dataclasses.field(default_factory=FinetuneTaskConfig)
    train: FinetuneTrainConfig = dataclasses.field(default_factory=FinetuneTrainConfig)
    data: FinetuneDataConfig = dataclasses.field(default_factory=FinetuneDataConfig)
    eval: FinetuneEvalConfig = dataclasses.field(default_factory=FinetuneEvalConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    def __post_init__(self) -> None:
        _validate(self)


def load_finetune_config(path: str | Path | None, overrides: list[str] = (),
                         defaults: Mapping | None = None) -> FinetuneConfig:
    """`defaults` (a task's own), then the YAML file at `path` (optional), then `key=value` overrides."""
    raw: dict = {}
    for section, values in (defaults or {}).items():
        raw[section] = dict(values)
    if path is not None:
        for section, values in read_config_file(path, empty_ok=True, kind="finetune").items():
            if isinstance(values, dict) and isinstance(raw.get(section), dict):
                raw[section].update(values)
            else:
                raw[section] = values
    for override in overrides:
        apply_override(raw, override)
    return parse_dataclass(FinetuneConfig, raw, "")


def save_finetune_config(config: FinetuneConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_record(config), sort_keys=False))


def _validate(config: FinetuneConfig) -> None:
    positive = {"train.epochs": config.train.epochs, "train.batch_size": config.train.batch_size,
                "train.learning_rate": config.train.learning_rate,
                "data.max_length": config.data.max_length, "data.doc_stride": config.data.doc_stride,
                "data.max_answer_length": config.data.max_answer_length, "data.n_best": config.data.n_best,
                "eval.batch_size": config.eval.batch_size, "checkpoint.every": config.checkpoint.every,
                "checkpoint.keep": config.checkpoint.keep}
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    if not math.isfinite(config.data.null_score_diff_threshold):
        raise ConfigError(f"data.null_score_diff_threshold must be a finite number, got "
                          f"{config.data.null_score_diff_threshold}")
    if config.data.max_length < 4:
        raise ConfigError(f"data.max_length must be at least 4 ([CLS], [SEP] and room for text), got "
                          f"{config.data.max_length}")
    if not 0.0 <= config.train.warmup_ratio <= 1.0:
        raise ConfigError(f"train.warmup_ratio must be in [0, 1], got {config.train.warmup_ratio}")
    if config.train.weight_decay < 0:
        raise ConfigError(f"train.weight_decay must be >= 0, got {config.train.weight_decay}")
    check_grad_clip(config.train.max_grad_norm, "train.max_grad_norm")
    if config.train.seed < 0:  # numpy's generators refuse it, after the workdir is made, naming no key
        raise ConfigError(f"train.seed must be >= 0, got {config.train.seed}")
    if config.train.early_stopping_patience < 0:
        raise ConfigError(f"train.early_stopping_patience must be >= 0 (0: off), got "
                          f"{config.train.early_stopping_patience}")
    if config.eval.every < 0:
        raise ConfigError(f"eval.every must be >= 0 (0: at the end of each epoch), got {config.eval.every}")
    if config.task.classifier_dropout is not None and not 0.0 <= config.task.classifier_dropout < 1.0:
        raise ConfigError(f"task.classifier_dropout must be in [0, 1) or null (the checkpoint's), got "
                          f"{config.task.classifier_dropout}")
    if config.task.num_labels is not None and config.task.num_labels <= 0:
        raise ConfigError(f"task.num_labels must be positive, got {config.task.num_labels}")
    if config.task.problem_type == "multi_label_classification":
        # The readers take one label per example and the head trains with softmax cross-entropy: accepting it would
        # train single-label while best/config.json claims multi-label.
        raise ConfigError("task.problem_type multi_label_classification is not supported by fine-tuning (the data "
                          "readers take one label per example); use single_label_classification or regression")
    if config.task.problem_type == "single_label_classification" and config.task.num_labels == 1:
        raise ConfigError("task.problem_type single_label_classification needs task.num_labels >= 2 (or null: from "
                          "the training labels); one output is regression (task.problem_type=regression)")
    if config.task.problem_type == "regression" and config.task.num_labels not in (None, 1):
        raise ConfigError(f"task.problem_type regression predicts one number: task.num_labels must be 1, got "
                          f"{config.task.num_labels}")
