"""The typed run config of `bertjax train-embedder`: frozen dataclasses per section, parsed by pretraining's machinery
(bertjax.train.run_config: unknown keys, wrong types and impossible values name the dotted key).

    loss:       {scale: 20.0, symmetric: false, similarity: cosine}
    train:      {epochs: 1, steps: null, batch_size: 64, mini_batch_size: null, learning_rate: 5.0e-5,
                 batch_sampler: random, ...}
    data:       {max_length: null, anchor_column: anchor, positive_column: positive, negative_column: negative, ...}
    pooling:    {modes: null, normalize: null}   (null: the model's own; a transformers directory: mean)
    eval:       {every: 0, k: 10, batch_size: 64, at_start: true}
    checkpoint: {every: 500, keep: 2, ...}  (pretraining's)
    mesh:       {data: -1, fsdp: 1, tensor: 1}

The defaults are sentence-transformers' (MultipleNegativesRankingLoss with scale 20 and cosine similarity; AdamW
with peak 5e-5, 10% linear warmup then linear decay, weight decay 0.01). `train.mini_batch_size` turns on cached
(GradCache) batches: the batch is embedded that many pairs at a time, so its size is bounded by the loss's
[batch, batch] score matrix rather than by the encoder's activations (the same gradient when the model has no
dropout; with dropout other masks, bertjax.embeddings.contrastive).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import yaml

from bertjax.train.run_config import (CheckpointConfig, ConfigError, MeshConfig, apply_override, check_grad_clip,
                                      parse_dataclass, read_config_file, to_record)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    scale: float = 20.0  # multiplies the similarities before the softmax (1 / temperature)
    symmetric: bool = False  # also score each positive against every anchor, and average the two directions
    similarity: Literal["cosine", "dot"] = "cosine"


@dataclasses.dataclass(frozen=True)
class EmbedderTrainConfig:
    epochs: int = 1
    steps: int | None = None  # optimizer updates; None: the batches of `epochs` epochs (bertjax.embeddings.batches)
    batch_size: int = 64  # pairs per update; each anchor's negatives are the other pairs' positives (and negatives)
    # Pairs embedded at a time (cached batches, GradCache); None: the whole batch in one differentiated pass. The
    # whole batch's gradient exactly when the model has no dropout; with dropout equal in distribution, but the
    # masks depend on the chunking (so a resume may not change it then).
    mini_batch_size: int | None = None
    learning_rate: float = 5e-5  # the peak; linear warmup then linear decay to 0
    weight_decay: float = 0.01  # not on biases and norms
    warmup_ratio: float = 0.1
    max_grad_norm: float | None = 1.0
    seed: int = 0  # shuffling and dropout
    # How an epoch's shuffled pairs are cut into batches (bertjax.embeddings.batches): "random" in order,
    # "no_duplicates" with no text twice in a batch, as sentence-transformers' batch samplers of those names.
    batch_sampler: Literal["random", "no_duplicates"] = "random"
    log_every: int = 10
    progress_bar: bool = True
    nonfinite: Literal["stop", "skip"] = "stop"  # as pretraining's train.nonfinite


@dataclasses.dataclass(frozen=True)
class EmbedderDataConfig:
    max_length: int | None = None  # tokens per text, [CLS] and [SEP] included; None: the model's max_seq_length
    anchor_column: str = "anchor"
    positive_column: str = "positive"
    # Hard negatives: this column when the file has it, else its negative_1 ... negative_n (sentence-transformers'
    # n-tuples); a list names the columns to read, every one a hard negative of the row.
    negative_column: str | tuple[str, ...] = "negative"
    anchor_prompt: str | None = None  # text put before every anchor ("query: "); a name of the model's prompts too
    positive_prompt: str | None = None  # and before every positive and negative ("search_document: ")


@dataclasses.dataclass(frozen=True)
class EmbedderPoolingConfig:
    """Changes to the loaded model's pooling (a sentence-transformers directory keeps its own when these are null)."""

    modes: tuple[Literal["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"], ...] | None = None
    normalize: bool | None = None


@dataclasses.dataclass(frozen=True)
class EmbedderEvalConfig:
    every: int = 0  # steps between retrieval evaluations on the validation pairs; 0: at the start and the end only
    k: int = 10  # recall@k and MRR@k: each anchor retrieves from the validation positives (and negatives)
    batch_size: int = 64  # texts embedded at a time
    at_start: bool = True  # evaluate the model before any training (the "before" number)


@dataclasses.dataclass(frozen=True)
class EmbedderConfig:
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    train: EmbedderTrainConfig = dataclasses.field(default_factory=EmbedderTrainConfig)
    data: EmbedderDataConfig = dataclasses.field(default_factory=EmbedderDataConfig)
    pooling: EmbedderPoolingConfig = dataclasses.field(default_factory=EmbedderPoolingConfig)
    eval: EmbedderEvalConfig = dataclasses.field(default_factory=EmbedderEvalConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=lambda: CheckpointConfig(every=500, keep=2))
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    def __post_init__(self) -> None:
        _validate(self)


def load_embedder_config(path: str | Path | None, overrides: list[str] = ()) -> EmbedderConfig:
    """The defaults, then the YAML file at `path` (optional), then `key=value` overrides."""
    raw = {} if path is None else read_config_file(path, empty_ok=True, kind="embedder")
    for override in overrides:
        apply_override(raw, override)
    return parse_dataclass(EmbedderConfig, raw, "")


def embedder_config_from_dict(raw: dict) -> EmbedderConfig:
    return parse_dataclass(EmbedderConfig, raw, "")


def save_embedder_config(config: EmbedderConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_record(config), sort_keys=False))


def _validate(config: EmbedderConfig) -> None:
    train = config.train
    positive = {"loss.scale": config.loss.scale, "train.epochs": train.epochs, "train.batch_size": train.batch_size,
                "train.learning_rate": train.learning_rate, "train.log_every": train.log_every,
                "eval.k": config.eval.k, "eval.batch_size": config.eval.batch_size,
                "checkpoint.every": config.checkpoint.every, "checkpoint.keep": config.checkpoint.keep}
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    if train.batch_size < 2:
        raise ConfigError(f"train.batch_size must be at least 2 (in-batch negatives), got {train.batch_size}")
    if train.steps is not None and train.steps <= 0:
        raise ConfigError(f"train.steps must be positive (or null: from train.epochs), got {train.steps}")
    if train.mini_batch_size is not None:
        if train.mini_batch_size <= 0:
            raise ConfigError(f"train.mini_batch_size must be positive (or null: no caching), got "
                              f"{train.mini_batch_size}")
        if train.batch_size % train.mini_batch_size:
            raise ConfigError(f"train.mini_batch_size ({train.mini_batch_size}) must divide train.batch_size "
                              f"({train.batch_size})")
    if not 0.0 <= train.warmup_ratio <= 1.0:
        raise ConfigError(f"train.warmup_ratio must be in [0, 1], got {train.warmup_ratio}")
    if train.weight_decay < 0:
        raise ConfigError(f"train.weight_decay must be >= 0, got {train.weight_decay}")
    check_grad_clip(train.max_grad_norm, "train.max_grad_norm")
    if config.data.max_length is not None and config.data.max_length < 3:
        raise ConfigError(f"data.max_length must be at least 3 ([CLS], [SEP] and a token), got "
                          f"{config.data.max_length}")
    if config.eval.every < 0:
        raise ConfigError(f"eval.every must be >= 0 (0: at the start and the end), got {config.eval.every}")
    if config.pooling.modes is not None and not config.pooling.modes:
        raise ConfigError("pooling.modes must name at least one mode (or be null: the model's own)")
    negatives = config.data.negative_column
    if not isinstance(negatives, str) and not negatives:
        raise ConfigError("data.negative_column must name at least one column (a name, or a list of names)")
    columns = [config.data.anchor_column, config.data.positive_column,
               *([negatives] if isinstance(negatives, str) else negatives)]
    if len(set(columns)) != len(columns):
        raise ConfigError(f"data.anchor_column, data.positive_column and data.negative_column must differ, got "
                          f"{columns}")
