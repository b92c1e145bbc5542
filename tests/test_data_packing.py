"""Packing and sentence pairs: every token exactly once, segments contiguous, positions restarting per document,
rows never overflowing; NSP/SOP labels balanced and pairs built from the right text."""

import numpy as np
import pytest

from bertjax.data.nsp import make_sentence_pairs
from bertjax.data.packing import (SpecialTokens, best_fit, pack_documents, pad_documents,
                                  split_long_documents)

CLS, SEP, PAD = 2, 3, 0
SPECIALS = SpecialTokens(CLS, SEP, PAD)


def unique_documents(lengths):
    """Documents whose tokens are all distinct (ids from 10 up), so each token's origin is known."""
    docs, next_id = [], 10
    for n in lengths:
        docs.append(np.arange(next_id, next_id + n, dtype=np.int32))
        next_id += n
    return docs


def segments_of(rows):
    """Independent reading of packed rows: [(row, segment id, tokens between [CLS] and [SEP], positions)]."""
    found = []
    for r in range(rows.num_rows):
        seg = rows.segment_ids[r]
        real = np.flatnonzero(seg)
        if len(real):
            # Real tokens come first, padding after.
            assert real[-1] == len(real) - 1, f"row {r}: padding inside the row"
            assert np.all(rows.input_ids[r, len(real):] == PAD)
        for s in np.unique(seg[seg > 0]):
            where = np.flatnonzero(seg == s)
            assert np.all(np.diff(where) == 1), f"row {r}: segment {s} not contiguous"
            tokens = rows.input_ids[r, where]
            assert tokens[0] == CLS and tokens[-1] == SEP
            found.append((r, int(s), tokens[1:-1], rows.positions[r, where]))
    return found


@pytest.mark.parametrize("seq_len", [16, 64])
def test_packing_keeps_every_token_exactly_once(seq_len):
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1, 20, 300), rng.integers(seq_len - 4, 3 * seq_len, 20)])
    docs = unique_documents(rng.permutation(lengths))
    rows, split = pack_documents(docs, seq_len, SPECIALS)
    assert rows.input_ids.shape[1] == seq_len
    assert split == sum(len(d) > seq_len - 2 for d in docs)
    pieces = segments_of(rows)
    # Segment ids count 1..k within each row.
    for r in range(rows.num_rows):
        ids = sorted(s for row, s, _, _ in pieces if row == r)
        assert ids == list(range(1, len(ids) + 1))
    for _, _, tokens, positions in pieces:
        np.testing.assert_array_equal(positions, np.arange(len(tokens) + 2))
        assert np.all(np.diff(tokens) == 1), "a piece is not a consecutive stretch of its document"
    all_tokens = np.sort(np.concatenate([tokens for _, _, tokens, _ in pieces]))
    np.testing.assert_array_equal(all_tokens, np.sort(np.concatenate(docs)))
    assert np.all(rows.token_type_ids == 0)
    # Many short documents: best fit leaves almost no padding.
    assert (rows.segment_ids > 0).mean() > 0.97


def test_long_documents_split_into_consecutive_chunks():
    doc = np.arange(25, dtype=np.int32)
    chunks, split = split_long_documents([doc, doc[:3]], 10)
    assert split == 1
    assert [len(c) for c in chunks] == [10, 10, 5, 3]
    np.testing.assert_array_equal(np.concatenate(chunks[:3]), doc)


def test_best_fit_decreasing_fills_bins():
    rng = np.random.default_rng(1)
    sizes = rng.integers(3, 60, 2000)
    bins = best_fit(sizes, 128)
    load = np.bincount(bins, weights=sizes)
    assert load.max() <= 128
    # Within 1% of the lower bound on the number of bins.
    assert bins.max() + 1 <= np.ceil(sizes.sum() / 128) * 1.01 + 1
    with pytest.raises(ValueError, match="sizes"):
        best_fit(np.array([129]), 128)
    with pytest.raises(ValueError, match="at least 1"):
        best_fit(np.array([0, 3]), 128)


def _best_fit_by_scanning(sizes, capacity, order, max_items):
    """The definition, row by row: each item into the open row with the least room that holds it (the earliest
    such row on a tie), else a new row whose room `capacity` gives from the item."""
    free, count, rows = [], [], np.empty(len(sizes), np.int64)
    for item in order:
        fits = [(free[r], r) for r in range(len(free)) if free[r] >= sizes[item] and count[r] < max_items]
        row = min(fits)[1] if fits else len(free)
        if not fits:
            free.append(capacity(int(sizes[item])))
            count.append(0)
        free[row] -= sizes[item]
        count[row] += 1
        rows[item] = row
    return rows


@pytest.mark.parametrize("max_items", [1, 3, 10 ** 6])
def test_best_fit_in_a_given_order_matches_the_definition(max_items):
    rng = np.random.default_rng(max_items)
    sizes = rng.integers(1, 40, 400)
    order = rng.permutation(len(sizes))
    room = lambda first: 48 if first <= 48 else 64  # a row's room from its first item (inference's buckets)
    expected = _best_fit_by_scanning(sizes, room, order, max_items)
    np.testing.assert_array_equal(best_fit(sizes, room, order=order, max_items=max_items), expected)
    decreasing = np.argsort(-sizes, kind="stable")
    np.testing.assert_array_equal(best_fit(sizes, 48, max_items=max_items),
                                  _best_fit_by_scanning(sizes, lambda first: 48, decreasing, max_items))


def test_padded_rows_hold_one_document_each():
    docs = unique_documents([5, 30, 1])
    rows, split = pad_documents(docs, 16, SPECIALS)
    assert split == 1 and rows.num_rows == 5  # 5 | 30 -> 14, 14, 2 | 1
    pieces = segments_of(rows)
    assert [row for row, _, _, _ in pieces] == list(range(5)) and all(s == 1 for _, s, _, _ in pieces)
    assert [len(tokens) for _, _, tokens, _ in pieces] == [5, 14, 14, 2, 1]
    np.testing.assert_array_equal(np.concatenate([t for _, _, t, _ in pieces]), np.concatenate(docs))


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_sentence_pairs_are_balanced_and_well_formed(objective):
    rng = np.random.default_rng(2)
    seq_len = 32
    docs = unique_documents(rng.integers(1, 120, 400))
    doc_of = {int(t): i for i, d in enumerate(docs) for t in d}
    rows, labels, dropped = make_sentence_pairs(docs, seq_len, objective, 0.1, SPECIALS, rng)
    assert rows.num_rows == len(labels) > 500
    assert abs(labels.mean() - 0.5) < 0.05
    used = []
    for r in range(rows.num_rows):
        ids, types, seg = rows.input_ids[r], rows.token_type_ids[r], rows.segment_ids[r]
        n = int((seg > 0).sum())
        assert np.all(seg[:n] == 1) and np.all(seg[n:] == 0)
        np.testing.assert_array_equal(rows.positions[r, :n], np.arange(n))
        seps = np.flatnonzero(ids[:n] == SEP)
        assert ids[0] == CLS and len(seps) == 2 and seps[1] == n - 1
        a, b = ids[1:seps[0]], ids[seps[0] + 1:n - 1]
        assert len(a) and len(b)
        assert np.all(types[:seps[0] + 1] == 0) and np.all(types[seps[0] + 1:n] == 1)
        same_doc = doc_of[int(a[0])] == doc_of[int(b[0])]
        if objective == "nsp":
            assert same_doc == (labels[r] == 0)
            if labels[r] == 0:
                assert b[0] == a[-1] + 1, "B must continue A"
            used.append(a)
            if labels[r] == 0:
                used.append(b)
        else:
            assert same_doc
            first, second = (a, b) if labels[r] == 0 else (b, a)
            assert second[0] == first[-1] + 1, "SOP pairs are two consecutive stretches"
            used.extend([a, b])
    # Every token of every document is used once as its own text (random B stretches aside), bar the dropped.
    used = np.concatenate(used)
    assert len(np.unique(used)) == len(used)
    assert len(used) + dropped == sum(len(d) for d in docs)
