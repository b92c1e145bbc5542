"""train-embedder's batches: "random" is the per-epoch permutation cut in order (what earlier runs trained on, so
their resumes continue); "no_duplicates" equals one pass of sentence-transformers' NoDuplicatesBatchSampler over
the same order."""

from __future__ import annotations

import numpy as np
import pytest

from bertjax.embeddings.batches import PairBatches, duplicate_free_batches


def _columns(count: int, distinct: int, seed: int) -> list[list[str]]:
    """anchor/positive/negative texts drawn from few distinct ones, so rows share texts often."""
    rng = np.random.default_rng(seed)
    return [[f"{name}{int(i)}" for i in rng.integers(0, distinct, count)] for name in ("q", "d", "d")]


def test_random_batches_are_the_epoch_permutation_cut_in_order():
    columns = _columns(23, 50, 0)
    batches = PairBatches(columns, batch_size=4, seed=7)
    assert batches.batches_in_epoch(0) == 5 and batches.steps_in(3) == 15
    for step in range(15):
        epoch, position = divmod(step, 5)
        expected = np.random.default_rng([7, epoch]).permutation(23)[position * 4:(position + 1) * 4]
        np.testing.assert_array_equal(batches.rows(step), expected)
    assert batches.epoch_progress(7) == pytest.approx(1.4)
    assert (batches.epoch_progress(0), batches.epoch_progress(5), batches.epoch_progress(15)) == (0.0, 1.0, 3.0)


def test_no_duplicates_holds_no_text_twice_and_uses_each_row_at_most_once():
    columns = _columns(300, 25, 1)
    batches = PairBatches(columns, batch_size=8, seed=3, sampler="no_duplicates")
    per_epoch = [batches.batches_in_epoch(epoch) for epoch in range(3)]
    assert 0 < min(per_epoch) and max(per_epoch) < 300 // 8  # the duplicates cost whole batches
    step = 0
    for epoch, count in enumerate(per_epoch):
        used = []
        for _ in range(count):
            rows = batches.rows(step)
            texts = [column[row] for row in rows for column in columns]
            row_texts = sum(len(set(column[row] for column in columns)) for row in rows)
            assert len(rows) == 8 and len(set(texts)) == row_texts, (step, texts)
            assert batches.locate(step) == (epoch, step - sum(per_epoch[:epoch]))
            used.extend(rows.tolist())
            step += 1
        assert len(used) == len(set(used))
    again = PairBatches(columns, batch_size=8, seed=3, sampler="no_duplicates")
    np.testing.assert_array_equal(again.rows(step - 1), batches.rows(step - 1))  # by seed, in any order of calls
    other = PairBatches(columns, batch_size=8, seed=4, sampler="no_duplicates")
    assert not np.array_equal(other.rows(0), batches.rows(0))


def test_without_duplicates_the_samplers_agree():
    columns = [[f"q{i}" for i in range(40)], [f"d{i}" for i in range(40)]]
    plain, unique = PairBatches(columns, 8, 0), PairBatches(columns, 8, 0, "no_duplicates")
    assert unique.steps_in(2) == plain.steps_in(2) == 10
    for step in range(10):
        np.testing.assert_array_equal(unique.rows(step), plain.rows(step))


class _Rows(list):
    """The rows as the sampler reads a datasets.Dataset: len, dataset[i] -> {column: value}, column_names."""

    column_names = ["anchor", "positive", "negative"]


def test_no_duplicates_equals_sentence_transformers_sampler(monkeypatch):
    torch = pytest.importorskip("torch")
    sampler = pytest.importorskip("sentence_transformers.base.sampler")
    columns = _columns(200, 40, 2)
    order = np.random.default_rng(5).permutation(200)
    ids: dict[str, int] = {}
    texts = [{ids.setdefault(text, len(ids)) for text in row} for row in zip(*columns)]
    ours = duplicate_free_batches(texts, order, 6)

    dataset = _Rows({"anchor": a, "positive": p, "negative": n} for a, p, n in zip(*columns))
    monkeypatch.setattr(torch, "randperm", lambda n, **kwargs: torch.as_tensor(order, dtype=kwargs.get("dtype")))
    reference = sampler.NoDuplicatesBatchSampler(dataset, batch_size=6, drop_last=True)
    theirs = list(reference)[:len(ours)]  # its first pass; it then adds batches of rows already seen
    assert len(ours) >= 10 and [b.tolist() for b in ours] == theirs


def test_a_sampler_is_named_and_an_unfillable_epoch_is_refused():
    with pytest.raises(ValueError, match="train.batch_sampler must be one of"):
        PairBatches([["a"], ["b"]], 2, 0, "group_by_label")
    same = [["q"] * 5, ["d"] * 5]  # every row shares its texts: no batch of 2 without a duplicate
    batches = PairBatches(same, 2, 0, "no_duplicates")
    assert batches.batches_in_epoch(0) == 0
    with pytest.raises(ValueError, match="epoch 0 holds no full batch of 2 pairs"):
        batches.rows(0)
