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


def best_fit_decreasing(sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Assign items to bins of `capacity`; returns the bin of each item (bins numbered in opening order)."""
    sizes = np.asarray(sizes)
    if sizes.size and (sizes.max() > capacity or sizes.min() <= 0):
        raise ValueError(f"item sizes must be in [1, {capacity}], got [{sizes.min()}, {sizes.max()}]")
    bins = np.empty(len(sizes), np.int64)
    order = np.argsort(-sizes, kind="stable")  # stable: equal sizes keep document order, so packing is reproducible
    smallest = int(sizes.min()) if sizes.size else 1
    # Open bins by free space, as (free, bin) sorted ascending: the first with free >= size is the best fit.
    free: list[tuple[int, int]] = []
    num_bins = 0
    for item in order:
        size = int(sizes[item])
        slot = bisect.bisect_left(free, (size, -1))
        if slot < len(free):
            space, which = free.pop(slot)
        else:
            space, which = capacity, num_bins
            num_bins += 1
        bins[item] = which
        space -= size
        if space >= smallest:  # a bin nothing can fill any more leaves the search list
            bisect.insort(free, (space, which))
    return bins


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
    bins = best_fit_decreasing(sizes, seq_len)
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
