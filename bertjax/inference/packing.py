"""Sequences of token ids -> fixed-shape batches of (packed) rows, and where each sequence went.

Packing puts several sequences in one row, each its own segment (ids 1, 2, ...; 0 = padding): attention never
crosses segments and positions restart at each, so every sequence is computed exactly as if it were alone, while the
row carries almost no padding. Rows are filled best-fit-decreasing (longest sequence first, into the fullest row
that still has room), then each row is cut to the shortest bucket that holds it and rows of one length are grouped
into batches of that bucket's row count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bertjax.data.packing import best_fit, rows_in_order
from bertjax.inference.buckets import BucketPlan


@dataclasses.dataclass(frozen=True)
class Batch:
    input_ids: np.ndarray  # [rows, length] int32
    segment_ids: np.ndarray  # [rows, length] int32; 1..K per row, 0 = padding (and whole padding rows)
    real_rows: int


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where sequence i went: batch[i], row[i], slot[i] (its segment id - 1), start[i], length[i]."""

    batch: np.ndarray
    row: np.ndarray
    slot: np.ndarray
    start: np.ndarray
    length: np.ndarray


def batch_sizes(plan: BucketPlan, length: int, devices: int) -> list[int]:
    """The row counts a batch of `length` may have, ascending: the bucket's rows, a quarter and a sixteenth of
    them (each a multiple of the device count)."""
    full = plan.rows[length]
    return sorted({full, *(max(full // divisor // devices, 1) * devices for divisor in (4, 16))})


def tail_rows(plan: BucketPlan, length: int, real: int, devices: int) -> int:
    """Rows of the next batch when `real` rows of `length` remain: the largest allowed size they fill, else the
    smallest. Three programs per bucket length at most, and a job's padding rows fewer than a sixteenth of a full
    batch (a remainder of 100 rows under a 256-row bucket runs as 64 + 16 + 16 + 16, not as 256)."""
    sizes = batch_sizes(plan, length, devices)
    fitting = [size for size in sizes if size <= real]
    return fitting[-1] if fitting else sizes[0]


def batch_shapes(plan: BucketPlan, devices: int = 1) -> set[tuple[int, int]]:
    """Every [rows, length] a batch of `pack` may take: the most programs one row function compiles for a job,
    whatever the number and lengths of its texts (at most three per bucket length)."""
    return {(size, length) for length in plan.lengths for size in batch_sizes(plan, length, devices)}


def pack(sequences: Sequence[np.ndarray], plan: BucketPlan, pad_id: int, *, packing: bool = True,
         devices: int = 1) -> tuple[list[Batch], Placement]:
    """Batches for `sequences` (each at most plan.max_length tokens) and the placement of every sequence."""
    lengths = np.asarray([len(s) for s in sequences], np.int64)
    if len(lengths) and lengths.max() > plan.max_length:
        raise ValueError(f"a sequence of {lengths.max()} tokens is longer than the model's {plan.max_length}; "
                         "truncate or chunk it first")
    if len(lengths) and lengths.min() == 0:
        raise ValueError("an empty token sequence cannot be placed (an empty text still has its special tokens)")
    order = np.argsort(-lengths, kind="stable")
    room = (lambda first: max(plan.pack_length, plan.length_for(first))) if packing else plan.length_for
    rows_of = rows_in_order(best_fit(lengths, room, order=order, max_items=plan.max_segments if packing else 1),
                            order)  # sequence indices per row, in placement order
    used = [int(lengths[members].sum()) for members in rows_of]

    count = len(sequences)
    placement = Placement(*(np.zeros(count, np.int64) for _ in range(5)))
    by_length: dict[int, list[int]] = {}
    for r in range(len(rows_of)):
        by_length.setdefault(plan.length_for(used[r]), []).append(r)
    batches: list[Batch] = []
    for length in sorted(by_length):
        rows = by_length[length]
        start = 0
        while start < len(rows):
            size = tail_rows(plan, length, len(rows) - start, devices)
            chunk = rows[start:start + size]
            start += size
            input_ids = np.full((size, length), pad_id, np.int32)
            segment_ids = np.zeros((size, length), np.int32)
            for row_in_batch, r in enumerate(chunk):
                cursor = 0
                for slot, i in enumerate(rows_of[r]):
                    n = int(lengths[i])
                    input_ids[row_in_batch, cursor:cursor + n] = sequences[i]
                    segment_ids[row_in_batch, cursor:cursor + n] = slot + 1
                    placement.batch[i], placement.row[i], placement.slot[i] = len(batches), row_in_batch, slot
                    placement.start[i], placement.length[i] = cursor, n
                    cursor += n
            batches.append(Batch(input_ids=input_ids, segment_ids=segment_ids, real_rows=len(chunk)))
    return batches, placement
