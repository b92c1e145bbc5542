"""One jitted per-row function, run batch after batch, data-parallel over a mesh when there are several devices.

A row function is `fn(params, batch, max_segments) -> {"segments": {name: [rows, K, ...]}, "tokens": {name:
[rows, length, ...]}}`: everything a model computes per packed slot (an embedding, class logits) or per token (tags,
masked-token predictions). `batch` holds `input_ids` and `segment_ids` [rows, length] plus any per-slot inputs
[rows, K]. Fill-mask, task prediction and embeddings are all such functions, so all share this loop.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

RowFunction = Callable[[Any, dict[str, jax.Array], int], dict[str, dict[str, jax.Array]]]
DATA_AXIS = "data"


def data_mesh(devices: Iterable[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh over `devices` (default: every local device): batch rows are split, parameters replicated."""
    devices = list(jax.local_devices() if devices is None else devices)
    return Mesh(np.asarray(devices), (DATA_AXIS,))


# row function -> (its jitted form, [traces so far]), least recently used first. Runners of one row function (equal
# functions hash equal, e.g. encoder_row_fn or embedding_row_fn of equal models) share one jitted function, so its
# compiled programs outlive any one runner: a second `bertjax embed` in one process, or a new Embedder of the same
# model, compiles nothing again. Bounded: a server making a row function per request (a closure equal to no other)
# would otherwise keep every jitted function and its executables forever; a live Runner keeps its own.
_JITTED: collections.OrderedDict = collections.OrderedDict()
JITTED_CACHE_SIZE = 16


def _jitted(row_fn: RowFunction):
    if row_fn in _JITTED:
        _JITTED.move_to_end(row_fn)
        return _JITTED[row_fn]
    traces = [0]

    def traced(params, batch, max_segments):
        traces[0] += 1  # Python runs once per trace, i.e. once per new shape: the compile count
        return row_fn(params, batch, max_segments)

    _JITTED[row_fn] = (jax.jit(traced, static_argnames="max_segments"), traces)
    while len(_JITTED) > JITTED_CACHE_SIZE:
        _JITTED.popitem(last=False)
    return _JITTED[row_fn]


class Runner:
    """Compiles `row_fn` once per batch shape (`compiles` counts them) and runs batches with rows split over the
    mesh. Up to `in_flight` batches are dispatched before the first result is read back, so packing the next batch
    on the host overlaps with the device computing the current one."""

    def __init__(self, row_fn: RowFunction, mesh: Mesh | None = None, in_flight: int = 2):
        self.mesh = mesh if mesh is not None else data_mesh()
        self.devices = self.mesh.devices.size
        self.platform = self.mesh.devices.flat[0].platform  # "cpu", "gpu", "tpu": picks the default token budget
        self.in_flight = max(in_flight, 1)
        self._fn, self._traces = _jitted(row_fn)
        self._traces_before = self._traces[0]
        self._rows = NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))
        self._replicated = NamedSharding(self.mesh, PartitionSpec())

    @property
    def compiles(self) -> int:
        """Programs compiled since this runner was made (a runner of an equal row function made before may
        already have compiled a shape: its programs are reused)."""
        return self._traces[0] - self._traces_before

    def place_params(self, params):
        """Parameters replicated on every device of the mesh (do this once, not per batch)."""
        return jax.device_put(params, self._replicated)

    def dispatch(self, params, batch: dict[str, np.ndarray], max_segments: int):
        rows = next(iter(batch.values())).shape[0]
        if rows % self.devices:
            raise ValueError(f"a batch of {rows} rows does not split over {self.devices} devices")
        # Traced under the mesh: Pallas attention kernels then run per device in a shard_map (bertjax/ops/
        # per_device.py); without it XLA would gather every row onto every device for the Triton (GPU) call, and
        # refuse the Mosaic (TPU) one.
        with jax.set_mesh(self.mesh):
            return self._fn(params, jax.device_put(batch, self._rows), max_segments=max_segments)

    def lower(self, params, batch: dict, max_segments: int):
        """The program `dispatch` runs for a batch of this shape (arrays or ShapeDtypeStructs), lowered."""
        rows = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self._rows), batch)
        with jax.set_mesh(self.mesh):
            return self._fn.lower(params, rows, max_segments=max_segments)

    def run(self, params, batches: Iterable[dict[str, np.ndarray]], max_segments: int) -> Iterator[dict]:
        """Host (numpy) outputs of every batch, in order."""
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append(self.dispatch(params, batch, max_segments))
            if len(pending) > self.in_flight:
                yield jax.tree.map(np.asarray, pending.popleft())
        while pending:
            yield jax.tree.map(np.asarray, pending.popleft())
