"""Starting a pretraining run from another model's weights (run config `model.init_from`).

Every parameter of the new model is copied from the source model at the same path with the same shape. Two
adaptations follow Beltagy et al. (2020), who continued Longformer's pretraining from RoBERTa:
- a learned position table longer than the source's is filled by copying the source's rows over and over (after
  the `position_offset` rows RoBERTa never uses), so position 512 + i starts as position i;
- Longformer's global projections (`query_global`, `key_global`, `value_global`), absent from RoBERTa, start as
  copies of the same layer's local `query`, `key`, `value`.
Anything else that does not match is an error naming the parameter: a warm start never silently re-initialises
part of a model.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import traverse_util

from bertjax.config import EncoderConfig

GLOBAL_PROJECTIONS = {"query_global": "query", "key_global": "key", "value_global": "value"}


def tile_positions(source: np.ndarray, rows: int, offset: int) -> np.ndarray:
    """A [rows, dim] table whose first `offset` rows are the source's and the rest repeat source[offset:]."""
    body = source[offset:]
    repeats = -(-(rows - offset) // body.shape[0])
    return np.concatenate([source[:offset], np.tile(body, (repeats, 1))[:rows - offset]], axis=0)


def adapt_params(source: dict, target_config: EncoderConfig, target: dict) -> dict:
    """Numpy parameters of the target's structure (`target`: its arrays or ShapeDtypeStructs) from `source`."""
    flat_source = {path: np.asarray(value) for path, value in traverse_util.flatten_dict(source).items()}
    out = {}
    for path, spec in traverse_util.flatten_dict(target).items():
        shape, name = tuple(spec.shape), "/".join(path)
        value = flat_source.get(path)
        if value is None and len(path) >= 2 and path[-2] in GLOBAL_PROJECTIONS:
            value = flat_source.get(path[:-2] + (GLOBAL_PROJECTIONS[path[-2]], path[-1]))
        if (value is not None and path[-2:] == ("position_embeddings", "embedding")
                and value.shape[1:] == shape[1:] and value.shape[0] < shape[0]):
            value = tile_positions(value, shape[0], target_config.position_offset)
        if value is None:
            raise ValueError(f"model.init_from: the source model has no parameter {name} {shape}")
        if value.shape != shape:
            raise ValueError(f"model.init_from: parameter {name} is {value.shape} in the source model but {shape} in "
                             "this run's model (vocab_size follows the tokenizer: use the source's)")
        out[path] = value.astype(spec.dtype)
    return traverse_util.unflatten_dict(out)


def initial_params(path: str, target_config: EncoderConfig, target: dict, shardings) -> dict:
    """The run's first parameters from the model directory `path`, placed with the run's shardings."""
    from bertjax.model_dirs import load_model_dir

    _, source, _ = load_model_dir(path)
    return jax.device_put(adapt_params(jax.device_get(source), target_config, target), shardings)
