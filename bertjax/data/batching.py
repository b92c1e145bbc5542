"""Windows of rows -> fixed-size batches, with a small, portable, JSON-serialisable state.

The heavy work (building windows) runs in grain: `MapDataset` -> `to_iter_dataset` (threads) and optionally
`mp_prefetch` (worker processes), both of which keep window order. Cutting rows into batches is stateful, so it
runs here, after them, in the consuming process: this is what makes the batches independent of the number of
threads and processes (grain's `mp_prefetch` warns that stateful transformations before it are not).

The state is `{"window": j, "row": r, "batches": b}`: the next row is row r of window j. Restoring rebuilds the
grain pipeline from window j (recomputing it: windows are pure functions of their number) and skips r rows, so a
resumed run continues with exactly the next batch, even with a different number of workers.
"""

from __future__ import annotations

import grain
import numpy as np

from bertjax.data.stats import PipelineStats

STATE_KEYS = ("window", "row", "batches")


class BatchIterDataset(grain.IterDataset):
    """Batches of `batch_size` rows from `windows` (a MapDataset of window dicts, see windows.WindowBuilder).

    `pad_rows` (a function n -> dict of n padding rows) makes the last partial batch full instead of dropping
    it; with `num_batches` set, exactly that many batches come out (padding batches after the data ends).
    """

    def __init__(self, windows: grain.MapDataset, batch_size: int, *, stats: PipelineStats, threads: int = 1,
                 prefetch: int = 2, processes: int = 0, pad_rows=None, num_batches: int | None = None):
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch size per process must be positive, got {batch_size}")
        self._windows = windows
        self._batch_size = batch_size
        self._stats = stats
        self._threads = threads
        self._prefetch = prefetch
        self._processes = processes
        self._pad_rows = pad_rows
        self._num_batches = num_batches

    def windows_from(self, start: int) -> grain.DatasetIterator:
        """A grain iterator over windows start, start + 1, ..."""
        # A buffer smaller than the thread count would idle threads; no threads means no buffer (in-line work).
        buffer = max(self._prefetch, self._threads) if self._threads else 0
        read = grain.ReadOptions(num_threads=self._threads, prefetch_buffer_size=buffer)
        dataset = self._windows[start:].to_iter_dataset(read)
        if self._processes:
            _mark_absl_flags_parsed()
            dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=self._processes,
                                                                       per_worker_buffer_size=self._prefetch))
        return iter(dataset)

    def __iter__(self) -> "BatchIterator":
        return BatchIterator(self)

    def __str__(self) -> str:
        return f"BatchIterDataset(batch_size={self._batch_size})"


def _mark_absl_flags_parsed() -> None:
    # grain's worker processes read absl flags, which fails ("flags not parsed") in programs that do not start
    # through absl.app (grain issue #1355). Parsing no argument marks them parsed, keeping every default.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class BatchIterator(grain.DatasetIterator):
    """The pipeline's iterator: `next()` gives one per-process batch (dict of numpy arrays);
    `get_state()` / `set_state()` save and restore the position (JSON-serialisable dict);
    `stats` counts what was read, skipped, packed and masked."""

    def __init__(self, dataset: BatchIterDataset):
        super().__init__()
        self._dataset = dataset
        self.stats = dataset._stats
        self._open = True  # our own flag: grain's closed-state check is private API
        self._windows = None
        self._start(window=0, row=0, batches=0)

    def _start(self, window: int, row: int, batches: int) -> None:
        self._close_windows()
        # Built on the first fetch: a restore right after creation (resuming a run) wastes no window.
        self._windows: grain.DatasetIterator | None = None
        self._window, self._row, self._batches = window, row, batches
        self._current: dict | None = None  # rows of window self._window, once fetched
        self._exhausted = False

    def _close_windows(self) -> None:
        if self._windows is not None:
            self._windows.close()

    def get_state(self) -> dict:
        return {"window": self._window, "row": self._row, "batches": self._batches}

    def set_state(self, state: dict) -> None:
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"data iterator state lacks {missing}; got keys {sorted(state)}")
        self._start(int(state["window"]), int(state["row"]), int(state["batches"]))

    def _fetch(self) -> bool:
        """Make self._current the rows of window self._window; False when the data is exhausted."""
        if self._windows is None:
            self._windows = self._dataset.windows_from(self._window)
        try:
            element = next(self._windows)
        except StopIteration:
            self._exhausted = True
            return False
        if element["window"] != self._window:
            raise RuntimeError(f"window order broken: expected {self._window}, got {element['window']}")
        # Copies out of worker processes' shared memory (grain hands arrays over in it), so the shared block is
        # freed now rather than whenever the last view of a batch dies.
        self._current = {name: np.array(rows) for name, rows in element["rows"].items()}
        self.stats.add_window(element["counts"])
        return True

    def _rows_left(self) -> int:
        return len(self._current["input_ids"]) - self._row

    def __next__(self) -> dict[str, np.ndarray]:
        return self.take(self._dataset._batch_size)

    def take(self, rows: int) -> dict[str, np.ndarray]:
        """The next batch of `rows` rows: a batch warmup changes the batch size while the rows run on, so a
        resumed run continues with exactly the next rows whatever the batch was."""
        if not self._open:
            raise ValueError("this data iterator is closed: create a new one (the pipeline's iterator) to read on")
        limit = self._dataset._num_batches
        if limit is not None and self._batches >= limit:
            raise StopIteration
        parts: list[dict] = []
        needed = rows
        while needed and not self._exhausted:
            if self._current is None:
                if not self._fetch():
                    break
            take = min(needed, self._rows_left())
            if take:
                parts.append({k: v[self._row:self._row + take] for k, v in self._current.items()})
                self._row += take
                needed -= take
            if not self._rows_left():
                self._window, self._row, self._current = self._window + 1, 0, None
        if needed:
            pad = self._dataset._pad_rows
            if pad is None or (not parts and limit is None):
                # Training drops the last partial batch; evaluation without a batch count ends after the data.
                raise StopIteration
            parts.append(pad(needed))
        self._batches += 1
        return {key: np.concatenate([p[key] for p in parts]) if len(parts) > 1 else parts[0][key]
                for key in parts[0]}

    def close(self) -> None:
        self._open = False
        self._close_windows()
        super().close()
