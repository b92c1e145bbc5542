"""Lay tokenized documents out in fixed-length rows: packed (several documents per row) or padded (one per row).

Every document piece in a row is `[CLS] tokens [SEP]` with its own segment id (1..k within the row, 0 = padding)
and its own positions (0 at its [CLS]), so that attention (segment ids) and position embeddings treat each
document as if it were alone in the row. Documents longer than a row are first split into row-sized chunks.

Packing is best-fit decreasing over one window of documents: take pieces longest first and put each in the
fullest row it still fits in. With many short documents (the default corpus) rows come out > 99% full.
Every input token lands in exactly one row, once, in order within its piece.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Rows:
    """Fixed-length rows: int32 arrays of shape [rows, seq_len]."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    token_type_ids: np.ndarray

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def take(self, order: np.ndarray) -> "Rows":
        return Rows(*(getattr(self, f.name)[order] for f in dataclasses.fields(self)))


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    cls_id: int
    sep_id: int
    pad_id: int


def split_long_documents(docs: Sequence[np.ndarray], max_tokens: int) -> tuple[list[np.ndarray], int]:
    """Cut every document into consecutive chunks of at most `max_tokens` (full chunks first, then the rest).

    Returns the chunks in document order and how many documents were split. Full chunks fill a row exactly;
    only the last, shorter chunk needs a partner in packing.
    """
    chunks: list[np.ndarray] = []
    split = 0
    for doc in docs:
        if len(doc) <= max_tokens:
            chunks.append(doc)
        else:
            split += 1
            chunks.extend(doc[start:start + max_tokens] for start in range(0, len(doc), max_tokens))
    return chunks, split


def best_fit(sizes: np.ndarray, capacity: int | Callable[[int], int], *, order: np.ndarray | None = None,
             max_items: int | None = None) -> np.ndarray:
    """Assign items to rows of limited room, each into the fullest open row that still holds it; returns the row of
    each item (rows numbered in opening order). The one placement routine of pretraining, fine-tuning and
    inference packing, O(n log n).

    order: the order items are placed in; default longest first, equal sizes in index order (best-fit
    decreasing; stable, so a packing is reproducible). capacity: every row's room, or a function of the size of
    a row's first item giving that row's room. max_items: items one row may hold at most.
    """
    sizes = np.asarray(sizes)
    room_of = capacity if callable(capacity) else (lambda first, room=int(capacity): room)
    if sizes.size and sizes.min() <= 0:
        raise ValueError(f"item sizes must be at least 1, got {sizes.min()}")
    if sizes.size and not callable(capacity) and sizes.max() > capacity:
        raise ValueError(f"item sizes must be in [1, {capacity}], got [{sizes.min()}, {sizes.max()}]")
    rows = np.empty(len(sizes), np.int64)
    order = np.argsort(-sizes, kind="stable") if order is None else np.asarray(order)
    smallest = int(sizes.min()) if sizes.size else 1
    # Open rows by free room, as (free, row) sorted ascending: the first with free >= size is the best fit.
    open_rows: list[tuple[int, int]] = []
    items_in: list[int] = []
    for item in order:
        size = int(sizes[item])
        slot = bisect.bisect_left(open_rows, (size, -1))
        if slot < len(open_rows):
            free, row = open_rows.pop(slot)
        else:
            free, row = room_of(size), len(items_in)
            if size > free:
                raise ValueError(f"an item of size {size} is larger than its row's room {free}")
            items_in.append(0)
        rows[item] = row
        free -= size
        items_in[row] += 1
        # A row that nothing can fill any more, or that holds its most items, leaves the search list.
        if free >= smallest and (max_items is None or items_in[row] < max_items):
            bisect.insort(open_rows, (free, row))
    return rows


def rows_in_order(rows: np.ndarray, order: np.ndarray | None = None) -> list[list[int]]:
    """Each row's items from `best_fit`'s result, listed in `order` (the order they were placed; default index
    order)."""
    members: list[list[int]] = [[] for _ in range(int(rows.max()) + 1 if rows.size else 0)]
    for item in (range(len(rows)) if order is None else order):
        members[int(rows[item])].append(int(item))
    return members


def write_rows(pieces: Sequence[np.ndarray], row: np.ndarray, column: np.ndarray, segment: np.ndarray,
               token_type: np.ndarray, first_position: np.ndarray, num_rows: int, seq_len: int,
               pad_id: int) -> Rows:
    """Scatter token pieces into rows in one vectorised pass.

    Piece i is written at `row[i]`, starting at `column[i]`, with segment id `segment[i]`, token type
    `token_type[i]` and positions `first_position[i], first_position[i] + 1, ...`.
    """
    shape = (num_rows, seq_len)
    rows = Rows(np.full(shape, pad_id, np.int32), np.zeros(shape, np.int32), np.zeros(shape, np.int32),
                np.zeros(shape, np.int32))
    if not len(pieces):
        return rows
    lengths = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
    if np.any(column + lengths > seq_len):
        raise ValueError("a piece runs past the end of its row")
    piece_of_token = np.repeat(np.arange(len(pieces)), lengths)
    offset_in_piece = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    flat = (np.asarray(row) * seq_len + np.asarray(column))[piece_of_token] + offset_in_piece
    rows.input_ids.flat[flat] = np.concatenate(pieces)
    rows.segment_ids.flat[flat] = np.asarray(segment)[piece_of_token]
    rows.token_type_ids.flat[flat] = np.asarray(token_type)[piece_of_token]
    rows.positions.flat[flat] = np.asarray(first_position)[piece_of_token] + offset_in_piece
    return rows


def _with_specials(chunks: Sequence[np.ndarray], specials: SpecialTokens) -> list[np.ndarray]:
    cls, sep = np.array([specials.cls_id], np.int32), np.array([specials.sep_id], np.int32)
    return [np.concatenate((cls, chunk, sep)) for chunk in chunks]


def pack_documents(docs: Sequence[np.ndarray], seq_len: int, specials: SpecialTokens) -> tuple[Rows, int]:
    """Pack documents into rows, several per row. Returns the rows and the number of documents split."""
    chunks, split = split_long_documents(docs, seq_len - 2)
    pieces = _with_specials(chunks, specials)
    sizes = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
    bins = best_fit(sizes, seq_len)
    num_rows = int(bins.max()) + 1 if len(bins) else 0
    # Within a row, pieces keep document order; columns and segment numbers follow from that order.
    order = np.lexsort((np.arange(len(bins)), bins))
    sorted_bins, sorted_sizes = bins[order], sizes[order]
    row_start = np.searchsorted(sorted_bins, sorted_bins)  # index of the first piece of each piece's row
    column_sorted = np.cumsum(sorted_sizes) - sorted_sizes
    column_sorted -= column_sorted[row_start]
    column, segment = np.empty_like(bins), np.empty_like(bins)
    column[order] = column_sorted
    segment[order] = np.arange(len(bins)) - row_start + 1
    zeros = np.zeros(len(pieces), np.int64)
    return write_rows(pieces, bins, column, segment, zeros, zeros, num_rows, seq_len, specials.pad_id), split


def pad_documents(docs: Sequence[np.ndarray], seq_len: int, specials: SpecialTokens) -> tuple[Rows, int]:
    """One document (chunk) per row, padded: classic BERT rows."""
    chunks, split = split_long_documents(docs, seq_len - 2)
    pieces = _with_specials(chunks, specials)
    n = len(pieces)
    zeros, ones = np.zeros(n, np.int64), np.ones(n, np.int64)
    return write_rows(pieces, np.arange(n), zeros, ones, zeros, zeros, n, seq_len, specials.pad_id), split


# DataConfig.packing -> layout of single documents into rows.
PACKERS: dict[str, Callable[[Sequence[np.ndarray], int, SpecialTokens], tuple[Rows, int]]] = {
    "pack": pack_documents,
    "pad": pad_documents,
}
