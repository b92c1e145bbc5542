"""Batches of a fine-tuning split: a shuffled order per epoch that depends only on (seed, epoch), and fixed-size
batches (the last one filled with weight-0 copies of row 0) so every step has one compiled shape.

Because the order of epoch e is a pure function of the seed, a resumed run finds the batch of step s without any
saved iterator state: epoch s // steps_per_epoch, position s % steps_per_epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

# Keys that stay on the host (mapping predictions back to words, windows and packed slots).
HOST_KEYS = frozenset({"word_of_token", "offsets", "cls_index", "window_example", "slot_example"})


def steps_per_epoch(rows: int, batch_size: int) -> int:
    return math.ceil(rows / batch_size)


def epoch_order(rows: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(rows)


def take(arrays: dict[str, np.ndarray], indices: np.ndarray, batch_size: int) -> dict[str, np.ndarray]:
    """Rows `indices` of every device key, padded to `batch_size` rows; `weight` is 1 on real rows, 0 on fill."""
    real = len(indices)
    padded = np.concatenate([indices, np.zeros(batch_size - real, indices.dtype)])
    batch = {k: v[padded] for k, v in arrays.items() if k not in HOST_KEYS}
    batch["weight"] = (np.arange(batch_size) < real).astype(np.float32)
    return batch


def train_batch(arrays: dict[str, np.ndarray], step: int, batch_size: int, seed: int) -> tuple[dict, int]:
    """(batch of global step `step`, its epoch)."""
    rows = len(next(iter(arrays.values())))
    per_epoch = steps_per_epoch(rows, batch_size)
    epoch, position = divmod(step, per_epoch)
    order = epoch_order(rows, seed, epoch)
    return take(arrays, order[position * batch_size:(position + 1) * batch_size], batch_size), epoch


def eval_batches(arrays: dict[str, np.ndarray], batch_size: int) -> Iterator[tuple[dict, int]]:
    """(batch, number of real rows) in row order."""
    rows = len(next(iter(arrays.values())))
    for start in range(0, rows, batch_size):
        indices = np.arange(start, min(start + batch_size, rows))
        yield take(arrays, indices, batch_size), len(indices)
