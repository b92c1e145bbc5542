"""Parameter helpers: the one place that runs `model.init` on dummy inputs, for real or abstractly.

- `init_boxed`: random parameters boxed with their logical axis names (the training objectives' initialiser);
- `init_params`: the same as a plain pytree (notebooks, tests);
- `abstract_params`: their shapes and dtypes (`jax.ShapeDtypeStruct`), nothing allocated (checkpoint targets);
- `logical_axes`: their logical axis names (`PartitionSpec`s of names), which the mesh rules turn into shardings;
- `draw_leaves`: some leaves of an initialiser's parameters, drawn alone (a new head on loaded weights).

Parameter shapes do not depend on the dummy row's length; `seq_len` only has to be a valid input length.
"""

from __future__ import annotations

import functools
import hashlib

import flax.linen as nn
import jax
from flax import traverse_util

DUMMY_SEQ_LEN = 8



def init_boxed(model: nn.Module, key: jax.Array, seq_len: int = DUMMY_SEQ_LEN) -> dict:
    """`model.init`'s parameters, still boxed with their logical axis names (a training objective's initialiser
    of one model: sharded state creation reads the names). Inputs of the model's own shape (`example_input_ids`:
    [1, choices, seq] for multiple choice)."""
    return model.init({"params": key, "dropout": key}, model.example_input_ids(seq_len))["params"]


def draw_leaves(initialiser, paths: list[tuple[str, ...]], key: jax.Array, out_shardings=None) -> list[jax.Array]:
    """The leaves at `paths` of `initialiser(key)`'s (unboxed) parameters, with the values the whole initialiser
    gives them. Only they leave the jitted program, so XLA drops the others' random draws: a new head on loaded
    weights costs neither a second copy of the model nor its compile and run time."""
    def draw(key):
        drawn = traverse_util.flatten_dict(nn.meta.unbox(initialiser(key)))
        return [drawn[path] for path in paths]
    return jax.jit(draw, out_shardings=out_shardings)(key)


def init_params(model: nn.Module, key: jax.Array, seq_len: int = DUMMY_SEQ_LEN) -> dict:
    """Randomly initialised parameters as a plain pytree of arrays (logical-axis boxes removed)."""
    return nn.meta.unbox(init_boxed(model, key, seq_len))


def abstract_params(model: nn.Module, seq_len: int = DUMMY_SEQ_LEN) -> dict:
    """Shape and dtype of every parameter (`jax.ShapeDtypeStruct` pytree), without allocating anything.

    Tracing the model's initialiser costs a fraction of a second, and loading or saving one model asks for its shapes
    several times (the key mapping, the loaded tree's check, the writer's), so they are kept per model config (a
    Flax module compares by its fields). Each call gets its own containers: a caller may edit what it gets. Under
    `jax.set_mesh` the shapes carry that mesh's shardings, so they are traced afresh there."""
    if not jax.sharding.get_abstract_mesh().empty or not _hashable(model):
        return _trace_shapes(model, seq_len)
    return jax.tree.map(lambda leaf: leaf, _traced_shapes(model, seq_len))


def _hashable(model: nn.Module) -> bool:
    try:
        hash(model)
    except TypeError:  # a module holding something unhashable: traced every time
        return False
    return True


def _trace_shapes(model: nn.Module, seq_len: int) -> dict:
    return jax.eval_shape(lambda key: init_params(model, key, seq_len), jax.random.key(0))


_traced_shapes = functools.lru_cache(maxsize=64)(_trace_shapes)


def logical_axes(model: nn.Module, seq_len: int = DUMMY_SEQ_LEN) -> dict:
    """The logical axis names of every parameter (a pytree of PartitionSpecs of names), without allocating."""
    boxed = jax.eval_shape(lambda key: init_boxed(model, key, seq_len), jax.random.key(0))
    return nn.get_partition_spec(boxed)


def params_fingerprint(params, extra: str = "") -> str:
    """A short hash of a parameter tree (and `extra`, its settings): every array's path, shape and a sample of up to
    256 of its values, so two copies of one model agree wherever they are stored and two different models (almost
    surely) do not, for the cost of reading a few thousand numbers."""
    import numpy as np

    digest = hashlib.sha256(extra.encode())
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        values = np.asarray(leaf).reshape(-1)
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(str(values.shape).encode())
        digest.update(np.ascontiguousarray(values[:: max(len(values) // 256, 1)][:256], np.float32).tobytes())
    return digest.hexdigest()[:16]
