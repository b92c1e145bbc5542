"""Per-process numpy batches -> global `jax.Array`s sharded over the mesh's data axes.

Each process holds `global_batch_size / process_count` rows; `jax.make_array_from_process_local_data` stitches
the processes' rows together into one array of the global shape, the batch dimension split over `batch_axes`,
without any cross-host copy (each host's rows go to its own devices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def batch_sharding(mesh: Mesh, batch_axes: str | Sequence[str] = "data") -> NamedSharding:
    """Rows split over `batch_axes` (one mesh axis or several, e.g. ("data", "fsdp")), the rest replicated."""
    axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    unknown = [axis for axis in axes if axis not in mesh.axis_names]
    if unknown:
        raise ValueError(f"batch axes {unknown} are not axes of the mesh {mesh.axis_names}")
    return NamedSharding(mesh, PartitionSpec(axes if len(axes) > 1 else axes[0]))


def to_global_batch(batch: Mapping[str, np.ndarray], mesh: Mesh,
                    batch_axes: str | Sequence[str] = "data") -> dict[str, jax.Array]:
    """The global arrays of one step's batch, from this process's rows (every process calls this)."""
    sharding = batch_sharding(mesh, batch_axes)
    sizes = {name: np.shape(value)[0] for name, value in batch.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"batch arrays disagree on the number of rows: {sizes}")
    return {name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
            for name, value in batch.items()}


def rows_of_each_process(sharding: NamedSharding, rows: int) -> dict[int, frozenset[int]]:
    """The rows of a [rows, ...] array that each process's devices hold under `sharding` (the same answer on every
    process: it reads the global device layout)."""
    held: dict[int, set[int]] = {}
    for device, index in sharding.devices_indices_map((rows,)).items():
        held.setdefault(device.process_index, set()).update(range(rows)[index[0]])
    return {process: frozenset(block) for process, block in held.items()}


def processes_feed_distinct_rows(sharding: NamedSharding, rows: int) -> bool:
    """Whether each process's devices hold rows no other process holds, rows / process_count of them: what
    `to_global_batch` needs, since every process passes only its own rows. A mesh whose batch axes do not reach
    across the processes (tensor parallelism over every chip of a multi-host slice) replicates rows over
    processes, and each would then see its own data under one "replicated" array."""
    blocks = rows_of_each_process(sharding, rows)
    share = rows // len(blocks)
    return all(len(block) == share for block in blocks.values()) and len(frozenset().union(*blocks.values())) == rows


def process_rows(sharding, rows: int) -> np.ndarray:
    """The rows of a [rows, ...] global batch that `sharding` puts on this process's devices, in order: what this
    process feeds `jax.make_array_from_process_local_data` (all of them on a single process)."""
    indices = sharding.addressable_devices_indices_map((rows,))
    mine = sorted({i for index in indices.values() for i in range(rows)[index[0]]})
    return np.asarray(mine, np.int64)


def from_full_batch(batch: Mapping[str, np.ndarray], mesh: Mesh,
                    batch_axes: str | Sequence[str] = "data") -> dict[str, jax.Array]:
    """The global arrays of a batch that every process builds whole (a pure function of seed and step, as in
    fine-tuning and embedder training), from this process's rows only: the rows the batch sharding puts on its
    devices. Any mesh works, batch axes within one host included."""
    rows = len(next(iter(batch.values())))
    mine = process_rows(batch_sharding(mesh, batch_axes), rows)
    return to_global_batch({k: v[mine] for k, v in batch.items()}, mesh, batch_axes)
