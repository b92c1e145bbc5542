"""Starting a pretraining run from another model's weights (run config `model.init_from`).

Every parameter of the new model is copied from the source model at the same path with the same shape. Two
adaptations follow Beltagy et al. (2020), who continued Longformer's pretraining from RoBERTa:
- a learned position table longer than the source's is filled by copying the source's rows over and over (after
  the `position_offset` rows RoBERTa never uses), so position 512 + i starts as position i;
- Longformer's global projections (`query_global`, `key_global`, `value_global`), absent from RoBERTa, start as
  copies of the same layer's local `query`, `key`, `value`.
Anything else that does not match is an error naming the parameter: a warm start never silently re-initialises
part of a model.

Growing a model (`bertjax init-from`, ModernBERT-large from a trained ModernBERT-base, Warner et al. 2024):
`grow_params` builds every parameter of a wider and deeper model from a smaller one of the same family:
- centre tiling (`centre_tile`): along every axis where the new tensor is larger, index i of the new axis holds
  index (i - offset) mod n of the source axis, offset = (new - n) // 2: the source sits whole in the middle and
  wrapped copies of its edges fill both sides (numpy's `np.pad(source, ..., mode="wrap")`); the rows of a longer
  learned position table stay in place instead (as above), so position i starts as the source's position i;
- a Gopher-style layer map (`layer_map`): layer i of the L-layer model starts from layer floor(i * l / L) of the
  l-layer source, so depth is mapped proportionally (the first from the first, the last from the last, source
  layers repeated evenly). A norm the source layer lacks (ModernBERT's first layer has no attention norm) starts
  as a fresh norm (scale 1, bias 0).
The grown parameters are written as a bertjax model directory, which `model.init_from` then reads like any other.
"""

from __future__ import annotations

import re

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


# ---------------------------------------------------------------------------------------------------------------
# Growing a smaller model into a larger one: centre tiling and a proportional layer map.

LAYER_SCOPE = re.compile(r"^layers_(\d+)$")


def centre_tile(source: np.ndarray, shape: tuple[int, ...], name: str = "parameter") -> np.ndarray:
    """`source` tiled up to `shape`: along each larger axis the source sits centred, wrapped copies on both sides."""
    source = np.asarray(source)
    if source.ndim != len(shape):
        raise ValueError(f"init-from: {name} has {source.ndim} axes in the source model but {len(shape)} in the "
                         f"target ({source.shape} -> {tuple(shape)})")
    out = source
    for axis, (old, new) in enumerate(zip(source.shape, shape)):
        if new < old:
            raise ValueError(f"init-from: {name} is {source.shape} in the source model, larger than the target's "
                             f"{tuple(shape)} on axis {axis}: tiling only grows a model")
        if new > old:
            out = np.take(out, (np.arange(new) - (new - old) // 2) % old, axis=axis)
    return out


def layer_map(source_layers: int, target_layers: int) -> list[int]:
    """The source layer each target layer starts from: floor(i * source / target) (depth mapped proportionally)."""
    if source_layers < 1 or target_layers < source_layers:
        raise ValueError(f"init-from: cannot map {source_layers} source layers onto {target_layers}: growing keeps "
                         "every source layer, so the target needs at least as many")
    return [i * source_layers // target_layers for i in range(target_layers)]


def count_layers(flat: dict) -> int:
    """How many `layers_<k>` scopes a flattened parameter tree holds (shared layers count once)."""
    found = {int(match.group(1)) for path in flat for part in path if (match := LAYER_SCOPE.match(part))}
    return len(found)


def grow_params(source: dict, target: dict, position_offset: int = 0) -> tuple[dict, list[int]]:
    """Numpy parameters of the target's structure (`target`: arrays or ShapeDtypeStructs) grown from `source` by
    the layer map and centre tiling; returns them and the layer map. A longer learned position table keeps its rows
    in place (`tile_positions` past `position_offset`, as `adapt_params`): centre-tiled, target position 0 would
    start as a middle position of the source; only its width is centre-tiled."""
    flat_source = {path: np.asarray(value) for path, value in traverse_util.flatten_dict(source).items()}
    flat_target = traverse_util.flatten_dict(target)
    mapping = (layer_map(count_layers(flat_source), count_layers(flat_target))
               if count_layers(flat_target) else [])
    out = {}
    for path, spec in flat_target.items():
        shape, name = tuple(spec.shape), "/".join(path)
        source_path = tuple(f"layers_{mapping[int(match.group(1))]}" if (match := LAYER_SCOPE.match(part)) else part
                            for part in path)
        value = flat_source.get(source_path)
        if value is None and len(path) >= 2 and path[-2].endswith("norm") and path[-1] in ("scale", "bias"):
            value = np.full(shape, 1.0 if path[-1] == "scale" else 0.0)  # a norm the source layer does not have
        if value is None:
            raise ValueError(f"init-from: the source model has no parameter {'/'.join(source_path)} "
                             f"(for the target's {name} {shape})")
        if path[-2:] == ("position_embeddings", "embedding") and value.ndim == 2 and value.shape[0] < shape[0]:
            value = tile_positions(value, shape[0], position_offset)
        out[path] = centre_tile(value, shape, name).astype(spec.dtype)
    return traverse_util.unflatten_dict(out), mapping
