"""Packing for sequence classification: several short examples in one row, each its own segment.

Padding a batch of short sentences to data.max_length wastes most of every row; packing fills rows with whole
examples (segment ids 1, 2, ...; attention never crosses segments, positions restart at each) and the model pools
one prediction per segment (`max_segments`). Examples are placed in a given order (the training file's in a
seeded shuffled order, `training_order`; other files in file order), each in the fullest row that holds it
(bertjax.data.packing.best_fit), so a packing is a pure function of the data: the same rows every epoch and after a
resume. Shuffling first matters: files are often sorted by label, and rows of consecutive examples would make every
packed row (and batch) one-label, which costs accuracy (measured: bench/finetune_bench.py, docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

from bertjax.data.packing import best_fit, rows_in_order

MAX_SEGMENTS = 32  # examples per row at most: bounds the [rows, K, labels] logits of a row of tiny examples
TRAINING_ORDER_SEED = 0  # the order training examples are packed in (fixed: the rows must not change on resume)


def training_order(count: int) -> np.ndarray:
    return np.random.default_rng(TRAINING_ORDER_SEED).permutation(count)


def pack_rows(arrays: dict[str, np.ndarray], pad_id: int, order: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Unpacked rows (`segment_ids` 1 on tokens, 0 on padding; optional `labels` [examples]) -> packed rows with
    `labels`/`slot_weight`/`slot_example` [rows, K]: slot k of a row holds its segment k + 1. Examples are placed
    in `order` (default: as given)."""
    lengths = (arrays["segment_ids"] > 0).sum(1)
    max_length = arrays["input_ids"].shape[1]
    order = np.arange(len(lengths)) if order is None else np.asarray(order)
    rows = rows_in_order(best_fit(lengths, max_length, order=order, max_items=MAX_SEGMENTS), order)
    slots = max(len(r) for r in rows)
    out = {"input_ids": np.full((len(rows), max_length), pad_id, np.int32),
           "segment_ids": np.zeros((len(rows), max_length), np.int32),
           "token_type_ids": np.zeros((len(rows), max_length), np.int32),
           "slot_weight": np.zeros((len(rows), slots), np.float32),
           "slot_example": np.full((len(rows), slots), -1, np.int32)}
    if "labels" in arrays:
        out["labels"] = np.zeros((len(rows), slots), arrays["labels"].dtype)
    for r, examples in enumerate(rows):
        cursor = 0
        for k, example in enumerate(examples):
            length = int(lengths[example])
            for key in ("input_ids", "token_type_ids"):
                out[key][r, cursor:cursor + length] = arrays[key][example, :length]
            out["segment_ids"][r, cursor:cursor + length] = k + 1
            out["slot_weight"][r, k] = 1.0
            out["slot_example"][r, k] = example
            if "labels" in arrays:
                out["labels"][r, k] = arrays["labels"][example]
            cursor += length
    return out
