"""Training pairs for embedding models: (anchor, positive[, negatives]) rows from JSONL, CSV, TSV or Parquet, and
their token arrays.

    pairs = read_pairs("train.jsonl", config.data)    # columns anchor, positive, optional negative or negative_1..n
    arrays = tokenize_pairs(encoder, pairs, ...)       # input_ids / segment_ids int32 [pairs, columns, seq]

Every problem with a file is an error naming it (and the row and column where it applies): a missing file, an
empty one, a missing column (with the override that renames it), a cell that is not text, a negative column that
only some rows fill, numbered negative columns the run would not read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bertjax.finetune.readers import read_rows, require_columns

_SEQ_MULTIPLE = 8  # token rows are padded to a multiple of this (fewer distinct compiled shapes)


@dataclasses.dataclass(frozen=True)
class Pairs:
    anchors: list[str]
    positives: list[str]
    negatives: tuple[list[str], ...] | None  # hard negatives by column (each one per pair), when the file has them
    source: str

    def __len__(self) -> int:
        return len(self.anchors)

    @property
    def columns(self) -> list[list[str]]:
        """The texts by column: anchors, positives[, each column of negatives]."""
        return [self.anchors, self.positives, *(self.negatives or ())]


def _text(value, path, index: int, column: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        raise ValueError(f"{path}, row {index + 1}: no value in column {column!r} ({key})")
    raise ValueError(f"{path}, row {index + 1}: column {column!r} ({key}) must hold text, got "
                     f"{type(value).__name__} {value!r}")


_NUMBERED_NEGATIVE = re.compile(r"negative_?(\d+)")


def negative_columns(setting: str | Sequence[str], keys: Sequence) -> tuple[str, ...]:
    """The hard-negative columns a file with columns `keys` is read with, given data.negative_column.

    A list names them exactly. A single name is read when the file has it; otherwise sentence-transformers'
    n-tuple columns (mine_hard_negatives: negative_1 ... negative_n) are read, all of them in numeric order, as its
    MultipleNegativesRankingLoss would. Numbered columns that the setting leaves out are an error: training without
    them would drop hard negatives without a word."""
    keys = [key for key in keys if isinstance(key, str)]
    numbered = sorted((key for key in keys if _NUMBERED_NEGATIVE.fullmatch(key)),
                      key=lambda key: int(_NUMBERED_NEGATIVE.fullmatch(key).group(1)))
    if not isinstance(setting, str):
        chosen = tuple(setting)
    elif setting in keys:
        chosen = (setting,)
    else:
        chosen = tuple(numbered)
    unread = [key for key in numbered if key not in chosen]
    if unread:
        listed = "[" + ", ".join(list(chosen) + unread) + "]"
        raise ValueError(f"columns {unread} look like hard negatives, which this run would not read: it reads "
                         f"{list(chosen)} (data.negative_column); name every one to read them all (e.g. "
                         f"data.negative_column={listed}), or drop them from the file")
    return chosen


def read_pairs(path: str | Path, data) -> Pairs:
    """The pairs of a data file; `data` is the run config's data section (column names)."""
    rows = read_rows(path)
    columns = {"data.anchor_column": data.anchor_column, "data.positive_column": data.positive_column}
    require_columns(rows, path, columns)
    try:
        negatives = negative_columns(data.negative_column, list(dict.fromkeys(key for row in rows for key in row)))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    listed = not isinstance(data.negative_column, str)
    negative_keys = [f"data.negative_column[{i}]" if listed else "data.negative_column" for i in range(len(negatives))]
    for name, key in zip(negatives, negative_keys):
        present = [name in row for row in rows]
        if listed and not any(present):
            raise ValueError(f"{path}: no column {name!r} ({key}); its rows have {sorted(rows[0]) if rows else []}")
        if not all(present):
            raise ValueError(f"{path}, row {present.index(False) + 1}: no column {name!r} ({key}), which "
                             f"{sum(present)} other rows have; give every row its hard negatives, or none")
    read = lambda name, key: [_text(row[name], path, i, name, key) for i, row in enumerate(rows)]  # noqa: E731
    negative_texts = tuple(read(name, key) for name, key in zip(negatives, negative_keys))
    return Pairs(read(data.anchor_column, "data.anchor_column"), read(data.positive_column, "data.positive_column"),
                 negative_texts or None, str(path))


def resolve_prompt(encoder, prompt: str | None) -> str | None:
    """A prompt setting: the name of one of the model's prompts ("query") or the text itself ("query: ")."""
    if prompt is None or prompt == "":
        return None
    return encoder.prompts.get(prompt, prompt)


def padded_length(tokens: Sequence[np.ndarray], limit: int) -> int:
    longest = max((len(t) for t in tokens), default=2)
    return min(limit, -(-longest // _SEQ_MULTIPLE) * _SEQ_MULTIPLE)


def tokenize_columns(encoder, columns: Sequence[Sequence[str]], prompts: Sequence[str | None],
                     seq_len: int | None = None) -> dict[str, np.ndarray]:
    """input_ids, segment_ids int32 [rows, len(columns), seq] (one text per row slot, segment id 1, 0 = padding)
    and prompt_lengths int32 [len(columns)] (the tokens of each column's prompt, for pooling that excludes them).
    Texts are truncated to `encoder.max_seq_length`; seq is `seq_len`, or the longest text rounded up to 8."""
    tokens = [encoder.tokenize(list(texts), prompt) for texts, prompt in zip(columns, prompts)]
    seq = seq_len or padded_length([t for column in tokens for t in column], encoder.max_seq_length)
    rows, width = len(columns[0]), len(columns)
    input_ids = np.full((rows, width, seq), encoder.config.pad_token_id, np.int32)
    segment_ids = np.zeros((rows, width, seq), np.int32)
    for c, column in enumerate(tokens):
        for r, ids in enumerate(column):
            input_ids[r, c, :len(ids)] = ids[:seq]
            segment_ids[r, c, :len(ids)] = 1
    prompt_lengths = np.asarray([encoder.prompt_length(p) for p in prompts], np.int32)
    return {"input_ids": input_ids, "segment_ids": segment_ids, "prompt_lengths": prompt_lengths}


def tokenize_pairs(encoder, pairs: Pairs, anchor_prompt: str | None = None,
                   positive_prompt: str | None = None) -> dict[str, np.ndarray]:
    """`tokenize_columns` of anchors (with the anchor prompt), positives and negatives (with the positive one)."""
    columns = pairs.columns
    prompts = [resolve_prompt(encoder, anchor_prompt)] + [resolve_prompt(encoder, positive_prompt)] * (len(columns) - 1)
    return tokenize_columns(encoder, columns, prompts)
