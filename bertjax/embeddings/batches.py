"""Which pairs each step of `bertjax train-embedder` trains on: a shuffled order per epoch that depends only on (seed,
epoch), cut into full batches, so a resumed run (on any number of hosts) sees the batches the stopped one would.

    batches = PairBatches(pairs.columns, batch_size=64, seed=0, sampler="no_duplicates")
    rows = batches.rows(step)            # int64 [64]: the pairs of global step `step`
    total = batches.steps_in(epochs=3)   # the run's length when train.steps is null

"random" (sentence-transformers' default batch sampler) cuts the epoch's permutation into consecutive batches.
"no_duplicates" (its NoDuplicatesBatchSampler, which it recommends for in-batch-negative losses) fills each batch
in the permuted order with pairs that share no text with the batch so far, deferring the others to the next batch:
a text that is in two rows of a batch (the same passage as two queries' positive, the same query twice) would
otherwise be a negative of the anchor it answers. Either way a batch that cannot be filled is dropped (a padded row
would be a false negative too), so with duplicates an epoch may hold fewer batches than pairs // batch_size, where
sentence-transformers would make up the difference with pairs the epoch has already seen.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SAMPLERS = ("random", "no_duplicates")


def duplicate_free_batches(texts: Sequence[Sequence[int]], order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Full batches of the rows in `order`, none holding a text (an id in `texts[row]`) twice, as one pass of
    sentence-transformers' NoDuplicatesBatchSampler with drop_last: each batch takes the rows not yet used in
    `order`'s order, deferring a row that shares a text with the batch so far. A batch that cannot be filled is
    dropped (its rows too) and the deferred rows go on filling batches, until every row is used or dropped."""
    batches, deferred, position = [], [], 0
    while deferred or position < len(order):
        taken, seen, still_deferred = [], set(), []
        for row in deferred:
            if len(taken) < batch_size and seen.isdisjoint(texts[row]):
                taken.append(row)
                seen.update(texts[row])
            else:
                still_deferred.append(row)
        while len(taken) < batch_size and position < len(order):
            row = int(order[position])
            position += 1
            if seen.isdisjoint(texts[row]):
                taken.append(row)
                seen.update(texts[row])
            else:
                still_deferred.append(row)
        if len(taken) == batch_size:
            batches.append(np.asarray(taken, np.int64))
        deferred = still_deferred
    return batches


class PairBatches:
    """The rows of every global step for pairs whose texts are `columns` (anchors, positives, negatives...)."""

    def __init__(self, columns: Sequence[Sequence[str]], batch_size: int, seed: int, sampler: str = "random"):
        if sampler not in SAMPLERS:
            raise ValueError(f"train.batch_sampler must be one of {list(SAMPLERS)}, got {sampler!r}")
        self.count, self.batch_size, self.seed, self.sampler = len(columns[0]), batch_size, seed, sampler
        self._counts: dict[int, int] = {}  # batches per epoch, kept
        self._batches: tuple[int, list[np.ndarray]] | None = None  # one epoch's batches at a time
        self._texts = None
        if sampler == "no_duplicates":
            ids: dict[str, int] = {}
            self._texts = [tuple({ids.setdefault(text, len(ids)) for text in row}) for row in zip(*columns)]

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.count)

    def batches_in_epoch(self, epoch: int) -> int:
        if self.sampler == "random":
            return self.count // self.batch_size
        if epoch not in self._counts:
            self._counts[epoch] = len(self._epoch(epoch))
        return self._counts[epoch]

    def _epoch(self, epoch: int) -> list[np.ndarray]:
        if self._batches is None or self._batches[0] != epoch:
            self._batches = (epoch, duplicate_free_batches(self._texts, self._order(epoch), self.batch_size))
        return self._batches[1]

    def steps_in(self, epochs: int) -> int:
        return sum(self.batches_in_epoch(epoch) for epoch in range(epochs))

    def locate(self, step: int) -> tuple[int, int]:
        """(epoch, batch within it) of global step `step`."""
        epoch = 0
        while step >= (count := self.batches_in_epoch(epoch)):
            if count == 0:
                raise ValueError(f"epoch {epoch} holds no full batch of {self.batch_size} pairs")
            step -= count
            epoch += 1
        return epoch, step

    def rows(self, step: int) -> np.ndarray:
        epoch, position = self.locate(step)
        if self.sampler == "random":
            return self._order(epoch)[position * self.batch_size:(position + 1) * self.batch_size]
        return self._epoch(epoch)[position]

    def epoch_progress(self, step: int) -> float:
        """Epochs done after `step` steps (for the metrics' "epoch"). Located from the step just taken: at an
        epoch's end this builds no batches of the next one (seconds of Python for a large no_duplicates file)."""
        if step == 0:
            return 0.0
        epoch, position = self.locate(step - 1)
        return epoch + (position + 1) / self.batches_in_epoch(epoch)
