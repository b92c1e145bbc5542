"""`from_pretrained` / `save_pretrained`: a transformers checkpoint directory <-> (bertjax model, params).

Loading fills every parameter of `model.init`'s tree from the file and nothing else: a tensor the mapping expects
but the file lacks, a tensor the file has but nothing consumes, and a tensor of the wrong shape are all errors
naming the key, so no parameter is ever left at its random initial value. The one exception: the pooler and
NSP head that published BERT/RoBERTa MLM checkpoints still carry are dropped with a warning, as transformers does.
"""

from __future__ import annotations

import json
import logging
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bertjax.config import EncoderConfig
from bertjax.hf import registry, weights
from bertjax.hf.mapping import KeyMapping, ParamPath
from bertjax.models import MODEL_CLASSES, abstract_params

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
LOADABLE_DTYPES = ("float32", "bfloat16", "float16")


def _read_config(directory: str) -> dict:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no {CONFIG_FILE} (not a transformers checkpoint directory)")
    with open(path) as f:
        try:
            values = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: invalid JSON ({error})") from error
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return values


def head_of(model: nn.Module) -> str:
    for head, cls in MODEL_CLASSES.items():
        if type(model) is cls:
            return head
    raise ValueError(f"{type(model).__name__} is not one of bertjax's model classes {sorted(MODEL_CLASSES)}")


def expected_params(model: nn.Module) -> dict[ParamPath, jax.ShapeDtypeStruct]:
    """Shape and dtype of every parameter `model.init` creates, by path, without allocating them."""
    return traverse_util.flatten_dict(abstract_params(model))


def _check_mapping_covers(mapping: KeyMapping, expected: dict[ParamPath, jax.ShapeDtypeStruct]) -> None:
    """The key mapping must address each parameter exactly once: a gap here would leave a random init behind."""
    mapped = [path for rule in mapping.rules for path in rule.params]
    missing = sorted(set(expected) - set(mapped))
    extra = sorted(set(mapped) - set(expected))
    duplicated = sorted({p for p in mapped if mapped.count(p) > 1})
    if missing or extra or duplicated:
        raise RuntimeError(f"the key mapping is out of step with the model: unmapped {missing}, "
                           f"not in the model {extra}, mapped twice {duplicated}")


def from_pretrained(path: str, dtype=None, *, allow_pickle: bool = False) -> tuple[nn.Module, dict]:
    """(model, params) from a directory written by transformers' `save_pretrained`.

    The head follows `config.architectures[0]`. `dtype` (default float32) is both the parameter dtype and the
    model's computation dtype; params are a plain nested dict of jnp arrays, the structure of `model.init`.
    A directory with only `pytorch_model.bin` (a pickle) is read only with `allow_pickle=True`.
    """
    dtype_name = jnp.dtype(dtype or jnp.float32).name
    if dtype_name not in LOADABLE_DTYPES:
        raise ValueError(f"dtype must be one of {LOADABLE_DTYPES}, got {dtype_name}")
    values = _read_config(path)
    family, head = registry.architecture(values)
    model_type = family.model_type
    config = family.to_encoder_config(values, head)
    if config.family != model_type:
        raise RuntimeError(f"bertjax.hf.{model_type} built an EncoderConfig with family={config.family!r}")
    config = config.replace(dtype=dtype_name, param_dtype=dtype_name)
    model = MODEL_CLASSES[head](config)
    expected = expected_params(model)
    mapping = family.key_mapping(config, head)
    _check_mapping_covers(mapping, expected)

    tensors = weights.read_weights(path, allow_pickle=allow_pickle)
    consumed = set(mapping.ignored) & set(tensors)
    flat: dict[ParamPath, jax.Array] = {}
    for rule in mapping.rules:
        present = [key for key in rule.hf_keys if key in tensors]
        if not present:
            raise ValueError(f"{path}: missing tensor {rule.hf_keys[0]!r} (needed by a {model_type} {head} model, "
                             f"architecture {values['architectures'][0]})")
        key = present[0]
        consumed.update(present)
        tensor = tensors[key]
        if not jnp.issubdtype(tensor.dtype, jnp.floating):  # casting ints to float would hide a wrong file
            raise ValueError(f"{path}: tensor {key!r} is {tensor.dtype}; model parameters are floating point")
        if tuple(tensor.shape) != rule.hf_shape:
            raise ValueError(f"{path}: tensor {key!r} has shape {tuple(tensor.shape)}, expected {rule.hf_shape} "
                             "from config.json")
        for param_path, array in zip(rule.params, rule.layout.load(np.asarray(tensor))):
            flat[param_path] = jnp.asarray(array, dtype=dtype_name)
    unused = sorted(set(mapping.unused) & set(tensors))
    if unused:
        logger.warning("%s: dropping tensors the %s head does not use (as transformers does): %s", path, head, unused)
    unexpected = sorted(set(tensors) - consumed - set(unused))
    if unexpected:
        raise ValueError(f"{path}: unexpected tensor(s) {unexpected} for a {model_type} {head} model "
                         f"(architecture {values['architectures'][0]})")
    for param_path, spec in expected.items():
        if flat[param_path].shape != spec.shape:
            raise RuntimeError(f"the {model_type} key mapping built {'/'.join(param_path)} with shape "
                               f"{flat[param_path].shape}, the model expects {spec.shape}")
    return model, traverse_util.unflatten_dict(flat)


def _flatten_checked(model: nn.Module, params: dict) -> dict[ParamPath, np.ndarray]:
    expected = expected_params(model)
    flat = traverse_util.flatten_dict(nn.meta.unbox(params))
    missing = sorted("/".join(p) for p in set(expected) - set(flat))
    extra = sorted("/".join(p) for p in set(flat) - set(expected))
    if missing or extra:
        raise ValueError(f"params do not match the model's parameter tree: missing {missing}, unexpected {extra}")
    for path, spec in expected.items():
        if tuple(np.shape(flat[path])) != spec.shape:
            raise ValueError(f"params['{'/'.join(path)}'] has shape {np.shape(flat[path])}, the model expects "
                             f"{spec.shape}")
    return {path: np.asarray(jax.device_get(value)) for path, value in flat.items()}


def save_pretrained(path: str, model: nn.Module, params: dict) -> None:
    """Write `config.json` + `model.safetensors` that transformers loads into the matching architecture.

    The family is `model.config.family`. As transformers does, the tied decoder weight is left out of the file.
    Refuses models whose config has knobs that family cannot express, naming each, before writing anything.
    """
    config: EncoderConfig = model.config
    head = head_of(model)
    family = registry.family_named(config.family, source="EncoderConfig.family")
    hf_config = {"architectures": [family.architecture_for(head)], **family.to_hf_config(config, head)}
    flat = _flatten_checked(model, params)
    mapping = family.key_mapping(config, head)
    _check_mapping_covers(mapping, expected_params(model))
    tensors: dict[str, np.ndarray] = {}
    for rule in mapping.rules:
        tensor = rule.layout.save([flat[p] for p in rule.params])
        assert tuple(tensor.shape) == rule.hf_shape, (rule.hf_keys, tensor.shape, rule.hf_shape)
        for key in rule.names_to_write:
            tensors[key] = tensor
    hf_config["dtype"] = str(tensors[mapping.rules[0].hf_keys[0]].dtype)
    os.makedirs(path, exist_ok=True)
    weights.write_safetensors(os.path.join(path, weights.SAFETENSORS), tensors)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
        f.write("\n")
