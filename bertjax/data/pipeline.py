"""The pretraining input pipeline: `DataConfig` and the builders of the training and evaluation iterators.

    source (random access) -> windows of documents: [shuffle per epoch, this process's 1/N share, tokenize,
    pack or pad or pair, shuffle rows, mask]  (grain MapDataset, threads / worker processes)
    -> batches of rows (stateful, in this process) -> per-process batch dicts

See `bertjax.data` for the batch format.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Literal

import numpy as np

from bertjax.data.masking import MaskingOptions
from bertjax.data.sources import DocumentSource, open_documents
from bertjax.typecheck import check_field_types

if TYPE_CHECKING:  # imported when building, not at import time: it brings in grain
    from bertjax.data.batching import BatchIterator

log = logging.getLogger(__name__)

Packing = Literal["pack", "pad"]
Masking = Literal["token", "whole_word", "span"]
SentenceObjective = Literal["none", "nsp", "sop"]
TextFormat = Literal["lines", "paragraphs"]


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Every option of the pretraining data pipeline."""

    # Input: "default" (the embedded corpus), a directory written by `bertjax prepare`, or comma-separated
    # files / directories / globs of .txt, .jsonl, .parquet.
    input: str = "default"
    text_format: TextFormat = "lines"  # .txt: one document per line, or "paragraphs" (blank-line separated)
    text_field: str = "text"  # JSONL / Parquet field holding the text
    # Documents whose text hash falls below this are held out for evaluation (prepared data keeps the fraction
    # it was prepared with).
    eval_fraction: float = 0.02

    # Rows and batches.
    seq_len: int = 128
    global_batch_size: int = 32  # over all processes; each process yields global_batch_size / process_count rows
    packing: Packing = "pack"  # "pack": several documents per row; "pad": one per row (classic BERT)
    window_documents: int = 1024  # documents packed together; larger packs tighter but costs latency

    # Masked language modelling.
    mlm_probability: float = 0.15  # BERT 0.15, ModernBERT 0.30
    # Held-out batches mask at this rate (ModernBERT trains at 30%, evaluates at 15%); None: mlm_probability.
    eval_mlm_probability: float | None = None
    mask_token_fraction: float = 0.8  # of the predicted tokens: replaced by [MASK] ...
    random_token_fraction: float = 0.1  # ... by a random token; the rest are kept
    masking: Masking = "token"
    max_predictions: int | None = None  # per row; None: ceil(seq_len * mlm_probability)
    span_p: float = 0.2  # span masking: span length in words ~ Geometric(span_p) ...
    span_max_words: int = 10  # ... truncated here and renormalised (SpanBERT's values)

    # Sentence-pair objective: rows become [CLS] A [SEP] B [SEP] pairs with `nsp_labels` (needs packing="pad").
    sentence_objective: SentenceObjective = "none"
    short_seq_prob: float = 0.1  # pairs shorter than the row, as BERT

    # Order and epochs.
    shuffle: bool = True  # documents reshuffled every epoch (evaluation never shuffles)
    # None: repeat forever. Pretraining on several hosts stops every host at the first step any host's share
    # of the epoch runs out (each packs its documents into its own number of rows).
    num_epochs: int | None = None
    eval_batches: int | None = None  # evaluation yields exactly this many batches (padding rows after the data)

    # Parallelism: threads and worker processes build windows ahead; results do not depend on either.
    worker_threads: int = 1
    worker_processes: int = 0
    prefetch_windows: int = 2

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("seq_len", "global_batch_size", "window_documents", "span_max_words", "prefetch_windows"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DataConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("worker_threads", "worker_processes"):
            if getattr(self, name) < 0:
                raise ValueError(f"DataConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.seq_len < 5:
            raise ValueError(f"DataConfig.seq_len must be at least 5, got {self.seq_len}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"DataConfig.mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.eval_mlm_probability is not None and not 0.0 < self.eval_mlm_probability < 1.0:
            raise ValueError(f"DataConfig.eval_mlm_probability must be in (0, 1), got {self.eval_mlm_probability}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"DataConfig.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"DataConfig.short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.max_predictions is not None and not 0 < self.max_predictions <= self.seq_len:
            raise ValueError(f"DataConfig.max_predictions must be in [1, seq_len={self.seq_len}], "
                             f"got {self.max_predictions}")
        for name, value in (("num_epochs", self.num_epochs), ("eval_batches", self.eval_batches)):
            if value is not None and value <= 0:
                raise ValueError(f"DataConfig.{name} must be positive or None, got {value}")
        if self.sentence_objective != "none" and self.packing != "pad":
            raise ValueError(f"DataConfig.sentence_objective={self.sentence_objective!r} needs packing='pad' "
                             "(one sentence pair per row: the pair head reads the row's [CLS])")
        self.masking_options()  # validates the masking fields

    @property
    def predictions_per_row(self) -> int:
        if self.max_predictions is not None:
            return self.max_predictions
        return math.ceil(self.seq_len * self.mlm_probability)

    def capped_masking_note(self) -> str | None:
        """What a `max_predictions` below the rate's share of a full row does to the masking (ALBERT's released
        flags, 20 at 512 tokens, mask about 4% of a full row, not 15%); None when the cap does not bind."""
        wanted = math.ceil(self.seq_len * self.mlm_probability)
        if self.max_predictions is None or self.max_predictions >= wanted:
            return None
        return (f"data.max_predictions={self.max_predictions} caps the masking of a full {self.seq_len}-token row at "
                f"{self.max_predictions / self.seq_len:.1%}, below data.mlm_probability={self.mlm_probability} "
                f"({wanted} predictions); leave max_predictions unset for the full rate")

    def masking_options(self) -> MaskingOptions:
        return MaskingOptions(rate=self.mlm_probability, mask_fraction=self.mask_token_fraction,
                              random_fraction=self.random_token_fraction, max_predictions=self.predictions_per_row,
                              strategy=self.masking, span_p=self.span_p, span_max_words=self.span_max_words)

    def for_evaluation(self) -> "DataConfig":
        """The config of held-out batches: masked at eval_mlm_probability when set."""
        if self.eval_mlm_probability is None:
            return self
        return dataclasses.replace(self, mlm_probability=self.eval_mlm_probability, eval_mlm_probability=None)

    def replace(self, **changes) -> "DataConfig":
        return dataclasses.replace(self, **changes)

    def batch_size_per_process(self, process_count: int) -> int:
        if process_count <= 0 or self.global_batch_size % process_count:
            raise ValueError(f"DataConfig.global_batch_size ({self.global_batch_size}) must be divisible by the "
                             f"number of processes ({process_count})")
        return self.global_batch_size // process_count


def batch_spec(config: DataConfig, process_count: int = 1) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array of a per-process batch, without building the pipeline."""
    batch = config.batch_size_per_process(process_count)
    rows, predictions = (batch, config.seq_len), (batch, config.predictions_per_row)
    spec = {name: (rows, np.dtype(np.int32)) for name in ("input_ids", "segment_ids", "positions", "token_type_ids")}
    spec.update(masked_positions=(predictions, np.dtype(np.int32)), masked_ids=(predictions, np.dtype(np.int32)),
                masked_weights=(predictions, np.dtype(np.float32)))
    if config.sentence_objective != "none":
        spec["nsp_labels"] = ((batch,), np.dtype(np.int32))
    return spec


def build_pretraining_iterator(config: DataConfig, tokenizer, *, seed: int, process_index: int = 0,
                               process_count: int = 1, split: str = "train",
                               source: DocumentSource | None = None, origin: tuple[int, int] = (0, 0)
                               ) -> BatchIterator:
    """The (by default endless) iterator of per-process training batches; see `bertjax.data` for the format.

    `source` overrides `config.input` (tests, notebooks: e.g. `sources.InMemorySource(texts)`). `origin` (epoch,
    position) starts the data there instead of at the beginning: a run resumed on another number of processes
    (bertjax.data.reshard); iterator states are relative to it.
    """
    return _build(config, tokenizer, seed=seed, process_index=process_index, process_count=process_count,
                  split=split, source=source, evaluation=False, origin=origin)


def build_eval_iterator(config: DataConfig, tokenizer, *, seed: int = 0, process_index: int = 0,
                        process_count: int = 1, source: DocumentSource | None = None) -> BatchIterator:
    """A finite, deterministic iterator over the held-out split: one pass, no shuffling, fixed masks for a seed.

    The last batch is completed with padding rows (all segment ids 0, weights 0, `nsp_labels` -1). With
    `config.eval_batches` set, exactly that many batches come out on every process (the data is cut or padded),
    which multi-host evaluation needs: processes hold different amounts of held-out data.
    """
    return _build(config, tokenizer, seed=seed, process_index=process_index, process_count=process_count,
                  split="eval", source=source, evaluation=True)


def open_source(config: DataConfig, split: str = "train") -> DocumentSource:
    return open_documents(config.input, split=split, text_format=config.text_format, text_field=config.text_field,
                          eval_fraction=config.eval_fraction)


def window_plan(config: DataConfig, num_documents: int, *, seed: int, process_index: int, process_count: int,
                evaluation: bool = False, origin: tuple[int, int] = (0, 0)):
    """The WindowPlan of which documents each window of this process holds (see bertjax.data.windows)."""
    from bertjax.data.windows import WindowPlan

    return WindowPlan(num_documents=num_documents, window_documents=config.window_documents,
                      process_index=process_index, process_count=process_count,
                      shuffle=config.shuffle and not evaluation, seed=seed, start_epoch=int(origin[0]),
                      start_position=int(origin[1]))


def _build(config: DataConfig, tokenizer, *, seed, process_index, process_count, split, source, evaluation,
           origin=(0, 0)):
    # Imported here so that DataConfig and batch_spec (run setup, compile-check, benchmarks) need no grain.
    import grain

    from bertjax.data.batching import BatchIterDataset
    from bertjax.data.stats import PipelineStats
    from bertjax.data.windows import WindowBuilder

    batch_size = config.batch_size_per_process(process_count)
    if source is None:
        source = open_source(config, split)
    _check_tokenizer(source, tokenizer)
    report = log.warning if source.stats.skipped else log.info
    report("data %s split, process %d/%d: %s", split, process_index, process_count, source.stats.report())
    plan = window_plan(config, len(source), seed=seed, process_index=process_index, process_count=process_count,
                       evaluation=evaluation, origin=origin)
    if plan.documents_per_epoch == 0 and not evaluation:
        # (Evaluation tolerates an empty share: its batches are padding, so every process runs the same steps.)
        raise ValueError(f"process {process_index} of {process_count} gets no {split} documents: only "
                         f"{len(source)} in {config.input!r}")
    builder = WindowBuilder(source, tokenizer, plan, seq_len=config.seq_len, packing=config.packing,
                            sentence_objective=config.sentence_objective, short_seq_prob=config.short_seq_prob,
                            masking=config.masking_options(), split=split)
    epochs = 1 if evaluation else config.num_epochs
    # Element j of the range is window number j (the plan locates its epoch): endless when epochs is None.
    indices = grain.MapDataset.range(max(plan.windows_per_epoch, 1)).repeat(None) if epochs is None else \
        grain.MapDataset.range(plan.total_windows(epochs))
    windows = indices.map_with_index(_window_number)
    windows = windows.map(builder)
    pad_rows = _padding_rows(config, tokenizer.pad_id) if evaluation else None
    dataset = BatchIterDataset(windows, batch_size, stats=PipelineStats(source=source.stats),
                               threads=config.worker_threads, prefetch=config.prefetch_windows,
                               processes=config.worker_processes, pad_rows=pad_rows,
                               num_batches=config.eval_batches if evaluation else None)
    return iter(dataset)


def _window_number(index: int, _within_epoch: int) -> int:
    return index


def _check_tokenizer(source: DocumentSource, tokenizer) -> None:
    for prepared in source.prepared_with:
        if prepared["fingerprint"] != tokenizer.fingerprint:
            raise ValueError(f"the prepared data was tokenized with another tokenizer (fingerprint "
                             f"{prepared['fingerprint']}, vocab {prepared['vocab_size']}) than the one given "
                             f"({tokenizer.fingerprint}, vocab {tokenizer.vocab_size}); load the tokenizer saved in "
                             "the prepared directory")


class _PaddingRows:
    """Picklable n -> n empty rows of the batch format."""

    def __init__(self, spec: dict, pad_id: int):
        self.spec = spec
        self.pad_id = pad_id

    def __call__(self, n: int) -> dict[str, np.ndarray]:
        rows = {name: np.zeros((n, *shape[1:]), dtype) for name, (shape, dtype) in self.spec.items()}
        rows["input_ids"][:] = self.pad_id
        if "nsp_labels" in rows:
            rows["nsp_labels"][:] = -1
        return rows


def _padding_rows(config: DataConfig, pad_id: int) -> _PaddingRows:
    return _PaddingRows(batch_spec(config.replace(global_batch_size=1)), pad_id)

