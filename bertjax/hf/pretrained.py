"""`from_pretrained` / `save_pretrained`: a transformers checkpoint directory <-> (bertjax model, params).

Loading fills every parameter of `model.init`'s tree from the file and nothing else: a tensor the mapping expects
but the file lacks, a tensor the file has but nothing consumes, and a tensor of the wrong shape are all errors
naming the key, so no parameter is ever left at its random initial value. The exceptions: the pooler and NSP
head that published BERT/RoBERTa MLM checkpoints still carry are dropped with a warning, as transformers does; and
`from_pretrained(path, head=...)` initialises the parts of a new head the checkpoint lacks, saying so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bertjax.config import EncoderConfig, TaskConfig
from bertjax.hf import registry, weights
from bertjax.hf.family import HfFamily
from bertjax.hf.mapping import KeyMapping, ParamPath
from bertjax.jsonl import read_json_file
from bertjax.models import MODEL_CLASSES, TASK_HEADS, abstract_params
from bertjax.models.params import draw_leaves

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
LOADABLE_DTYPES = ("float32", "bfloat16", "float16")
BACKBONE_SCOPES = ("embeddings", "encoder")  # top-level parameter scopes every head shares
_POOLER_SCOPE = "pooler"  # the bare model's pooler, which transformers' add_pooling_layer=False leaves out


def _read_config(directory: str) -> dict:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no {CONFIG_FILE} (not a transformers checkpoint directory)")
    return read_json_file(path)


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


def from_pretrained(path: str, dtype=None, *, head: str | None = None, seed: int = 0, allow_pickle: bool = False,
                    **task) -> tuple[nn.Module, dict]:
    """(model, params) from a directory written by transformers' `save_pretrained`.

    The head follows `config.architectures[0]` (a file without it, as DeBERTa's releases: the MLM head when the
    file holds its tensors, else the bare model, as transformers' AutoModel) unless `head` (a name in
    bertjax.models.MODEL_CLASSES) asks for another: then the backbone comes from the file, so does any head tensor
    the new head shares with it (BERT's pretrained pooler, as transformers does), and the rest of the new head is
    initialised from `seed`, with a warning listing what was initialised. `**task` sets TaskConfig fields
    (num_labels, labels, problem_type, classifier_dropout, classifier_pooling) over the checkpoint's; a head tensor
    that no longer fits (another num_labels) is initialised too. `dtype` (default float32) is both the parameter
    dtype and the model's computation dtype; params are a plain nested dict of jnp arrays, the structure of
    `model.init`.
    A directory with only `pytorch_model.bin` (a pickle) is read only with `allow_pickle=True`.

        model, params = from_pretrained("bert-base-uncased", head="sequence_classification", num_labels=3,
                                        labels=("entailment", "neutral", "contradiction"))
    """
    dtype_name = jnp.dtype(dtype or jnp.float32).name
    if dtype_name not in LOADABLE_DTYPES:
        raise ValueError(f"dtype must be one of {LOADABLE_DTYPES}, got {dtype_name}")
    values = _read_config(path)
    try:
        family, saved_head = registry.architecture(values, head)
    except ValueError as error:
        raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: {str(error).removeprefix(f'{CONFIG_FILE}: ')}") from None
    if weights.weights_file(path) in weights.PICKLED:  # a trusted pickle (allow_pickle) is read whole, once
        tensors = weights.read_weights(path, allow_pickle=allow_pickle)
        shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    else:  # safetensors: the headers first, the tensors once their shapes are known to fit config.json
        tensors, shapes = None, weights.tensor_shapes(path)
    if head is None and not values.get("architectures"):  # the class is unnamed: the file's tensors say it
        saved_head = _head_the_names_hold(family, values, shapes)
    head = head or saved_head
    if head not in MODEL_CLASSES:
        raise ValueError(f"unknown head {head!r}; known: {sorted(MODEL_CLASSES)}")
    if task and head not in TASK_HEADS:
        raise ValueError(f"task settings {sorted(task)} need a task head ({', '.join(TASK_HEADS)}), not {head!r}")
    model_type = family.model_type
    try:
        config = family.encoder_config(values, head)
    except ValueError as error:  # the checks name the key; this names the file (theirs say just "config.json")
        message = str(error).removeprefix(f"{CONFIG_FILE}: ")
        raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: {message}") from None
    if config.family != model_type:
        raise RuntimeError(f"bertjax.hf.{model_type} built an EncoderConfig with family={config.family!r}")
    if head != saved_head and head in TASK_HEADS:  # another task's labels mean nothing here; pooling still does
        saved = config.task_or_default
        config = config.replace(task=TaskConfig(classifier_dropout=saved.classifier_dropout,
                                                classifier_pooling=saved.classifier_pooling))
    if task:
        if "num_labels" in task and "labels" not in task:  # the saved names belong to the old label count
            task = {**task, "labels": None}
        config = config.replace(task=config.task_or_default.replace(**task))
    config = config.replace(dtype=dtype_name, param_dtype=dtype_name)
    # The file first: its layers are compared with config.json's before the model is traced (tracing is per layer).
    _check_layer_count(path, values, config, shapes)
    _check_claimed_sizes(path, family.mapping(config, head), shapes)
    if tensors is None:
        tensors = weights.read_weights(path, allow_pickle=allow_pickle)
    config = _untied_where_the_file_differs(path, family, values, config, head, tensors)
    model = MODEL_CLASSES[head](config)
    expected = expected_params(model)
    # Head classes name the backbone's tensors with a prefix ("bert."), the bare model without. Files exist whose
    # names disagree with their architectures[0] (a head model's weights under "BertModel", or the reverse);
    # transformers goes by the names, and so does bertjax.
    prefixed = any(key.startswith(family.task_heads.base_prefix) for key in tensors)
    names_agree = prefixed == (saved_head != "encoder")
    if not names_agree:
        logger.warning("%s: config.json says %s, but the tensor names are %s; reading them as such", path,
                       _architecture_named(values),
                       f"a head model's ({family.task_heads.base_prefix!r} prefix)" if prefixed else "a bare model's")
    if head == saved_head and not task and names_agree:
        mapping = family.mapping(config, head)
        _check_mapping_covers(mapping, expected)
        flat = _load_exact(path, values, model_type, head, mapping, tensors, dtype_name)
        missing = sorted(set(expected) - set(flat))  # the pooler only (_load_exact names any other tensor)
        if missing:
            logger.warning("%s: the file holds no pooler (saved with add_pooling_layer=False); initialised from "
                           "scratch (seed %d), as transformers does: pooler_output means nothing until trained",
                           path, seed)
            flat.update(zip(missing, draw_leaves(lambda key: model.init(key, model.example_input_ids())["params"],
                                                 missing, jax.random.key(seed))))
    else:
        flat = _load_into_new_head(path, family, model, saved_head, head, tensors, expected, seed, prefixed)
    for param_path, spec in expected.items():
        if flat[param_path].shape != spec.shape:
            raise RuntimeError(f"the {model_type} key mapping built {'/'.join(param_path)} with shape "
                               f"{flat[param_path].shape}, the model expects {spec.shape}")
    from bertjax.train.checkpoints import check_finite  # here: importing bertjax.hf stays free of orbax

    params = traverse_util.unflatten_dict(flat)
    cause = "damaged, or saved from a diverged run"
    if dtype_name != "float32":
        cause += f", or values beyond the range of {dtype_name}"
    check_finite(params, f"transformers directory {path}", cause)  # NaN weights give NaN outputs, silently
    return model, params


# The layer index in every family's tensor names: "bert.encoder.layer.3.", "model.layers.3.", "transformer.layer.3.";
# ALBERT's are its shared groups, "albert.encoder.albert_layer_groups.0.".
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|albert_layer_groups)\.(\d+)\.")
# The config.json fields that give the number of layers the file holds (ALBERT: of distinct groups), by family.
_LAYER_FIELDS = ("num_hidden_groups", "num_hidden_layers", "n_layers", "n_layer")


def _check_claimed_sizes(path: str, mapping: KeyMapping, shapes: dict[str, tuple[int, ...]]) -> None:
    """No tensor of the file may hold more values than the largest tensor of the model config.json describes
    (in the file's layout: fused projections whole): a header claiming a [10**9, 32] table (a sparse file of a few
    kilobytes on disk) would otherwise be read whole before the per-tensor shape checks."""
    largest = max(math.prod(rule.hf_shape) for rule in mapping.rules)
    for name, shape in shapes.items():
        if math.prod(shape) > largest:
            raise ValueError(f"{path}: tensor {name!r} has shape {shape}, more values than any tensor of the "
                             f"model its config.json describes ({largest} at most); the file does not belong to "
                             "that config.json, or is damaged")


def _check_layer_count(path: str, values: dict, config: EncoderConfig, tensors) -> None:
    """config.json's layer count against the layers the weights file holds, before the model is traced: tracing
    costs ~50 ms and ~0.25 MB per layer, so `num_hidden_layers: 1000000` over a 2-layer file would run for hours
    before the first missing tensor is noticed. Only a claim beyond the file is refused here: extra layers in the
    file and gaps in its numbering cost nothing to trace and are left to the per-tensor checks, which name the
    tensor."""
    held = {int(match.group(1)) for key in tensors if (match := _LAYER_INDEX.search(key))}
    claimed = config.layer_groups  # distinct layers: the number of layers, or ALBERT's groups
    if claimed <= (max(held) + 1 if held else 0):
        return
    field = next((name for name in _LAYER_FIELDS if values.get(name) == claimed), "num_hidden_layers")
    holds = f"layers 0..{max(held)}" if held else "no layers"
    raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: {field} {claimed}, but {weights.weights_file(path)} "
                     f"holds {holds}")


# The parameters an MLM decoder tied to the word embeddings would share.
_DECODER_KERNEL: ParamPath = ("mlm_head", "decoder", "kernel")
_WORD_EMBEDDINGS: ParamPath = ("embeddings", "word_embeddings", "embedding")


def _untied_where_the_file_differs(path: str, family: HfFamily, values: dict, config: EncoderConfig, head: str,
                                   tensors: dict[str, np.ndarray]) -> EncoderConfig:
    """`config`, untied when config.json says `tie_word_embeddings` but the file holds an MLM decoder weight that
    differs from its word embeddings: a model trained untied whose config.json kept the family's default.
    transformers 5 then keeps the two tensors apart, with a warning, and so does bertjax; tying would replace the
    trained decoder by the embeddings and change every logit. A decoder equal to the embeddings (older files write
    the tied copy) stays tied."""
    if not config.tie_word_embeddings:
        return config
    untied = config.replace(tie_word_embeddings=False)
    keys = {}
    for rule in family.mapping(untied, head).rules:
        if rule.params in ((_DECODER_KERNEL,), (_WORD_EMBEDDINGS,)):
            keys[rule.params[0]] = next((key for key in rule.hf_keys if key in tensors), None)
    decoder, embeddings = keys.get(_DECODER_KERNEL), keys.get(_WORD_EMBEDDINGS)
    if decoder is None or embeddings is None:  # a head without a decoder, or the file holds only one of them
        return config
    if tensors[decoder].shape == tensors[embeddings].shape and np.array_equal(tensors[decoder], tensors[embeddings]):
        return config
    # Read again only now (its warnings would repeat), and only for a family whose config.json can say "untied"
    # (MosaicBERT's is always tied).
    try:
        if family.encoder_config({**values, "tie_word_embeddings": False}, head).tie_word_embeddings:
            return config
    except ValueError:
        return config
    logger.warning("%s: config.json says tie_word_embeddings=true, but %r differs from %r; loading them untied, as "
                   "transformers does (set tie_word_embeddings to false in config.json to silence this)", path,
                   decoder, embeddings)
    return untied


def _load_exact(path: str, values: dict, model_type: str, head: str, mapping: KeyMapping,
                tensors: dict[str, np.ndarray], dtype_name: str) -> dict[ParamPath, jax.Array]:
    """Every parameter from the file, every tensor of the file used (or known to be droppable)."""
    consumed = set(mapping.ignored) & set(tensors)
    flat: dict[ParamPath, jax.Array] = {}
    for rule in mapping.rules:
        present = [key for key in rule.hf_keys if key in tensors]
        if not present and all(p[0] == _POOLER_SCOPE for p in rule.params):
            continue  # a bare model saved with add_pooling_layer=False: the caller draws the pooler
        if not present:
            raise ValueError(f"{path}: missing tensor {rule.hf_keys[0]!r} (needed by a {model_type} {head} model, "
                             f"{_architecture_named(values)})")
        key = present[0]
        consumed.update(present)
        tensor = _floating(path, key, tensors[key])
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
                         f"({_architecture_named(values)})")
    return flat


def _head_the_names_hold(family, values: dict, tensors: dict[str, np.ndarray]) -> str:
    """The head of a file whose config.json names no class: the MLM head when any of its tensors is there (DeBERTa's
    own releases are MLM checkpoints without `architectures`), else the bare model, which transformers' AutoModel
    builds from such a file."""
    if "masked_lm" not in family.heads.values():
        return "encoder"
    try:
        mapping = family.mapping(family.encoder_config(values, "masked_lm"), "masked_lm")
    except ValueError:  # a config the family cannot read: the load reports it, naming the file
        return "encoder"
    head_keys = {key for rule in mapping.rules if all(p[0] not in BACKBONE_SCOPES for p in rule.params)
                 for key in rule.hf_keys}
    return "masked_lm" if head_keys & set(tensors) else "encoder"


def _architecture_named(values: dict) -> str:
    """How config.json names the class, for messages."""
    if not values.get("architectures"):
        return "no architectures"
    return f"architecture {values['architectures'][0]}"


def _floating(path: str, key: str, tensor: np.ndarray) -> np.ndarray:
    if not jnp.issubdtype(tensor.dtype, jnp.floating):  # casting ints to float would hide a wrong file
        raise ValueError(f"{path}: tensor {key!r} is {tensor.dtype}; model parameters are floating point")
    return tensor


def _load_into_new_head(path: str, family: HfFamily, model: nn.Module, saved_head: str, head: str,
                        tensors: dict[str, np.ndarray], expected: dict[ParamPath, jax.ShapeDtypeStruct],
                        seed: int, prefixed: bool) -> dict[ParamPath, jax.Array]:
    """The backbone from the file (every backbone tensor must be there), the head from the file where its tensors
    exist with the right shape, otherwise from a fresh init; a warning says which. `prefixed`: the file names the
    backbone's tensors as head classes do ("bert.embeddings..."), not as the bare model."""
    config = model.config
    prefix = family.task_heads.base_prefix
    source, target = (prefix if prefixed else ""), ("" if head == "encoder" else prefix)
    tensors = {(target + key[len(source):] if key.startswith(source) else key): value
               for key, value in tensors.items()}
    mapping = family.mapping(config, head)
    flat: dict[ParamPath, jax.Array] = {}
    consumed, refitted = set(), []
    for rule in mapping.rules:
        in_head = all(p[0] not in BACKBONE_SCOPES for p in rule.params)
        present = [key for key in rule.hf_keys if key in tensors]
        if not present:
            if in_head:
                continue
            raise ValueError(f"{path}: missing backbone tensor {rule.hf_keys[0]!r} for a {family.model_type} "
                             f"{head} model")
        tensor = _floating(path, present[0], tensors[present[0]])
        consumed.update(present)
        if tuple(tensor.shape) != rule.hf_shape:
            if in_head:
                refitted.append(present[0])
                continue
            raise ValueError(f"{path}: tensor {present[0]!r} has shape {tuple(tensor.shape)}, expected "
                             f"{rule.hf_shape} from config.json")
        for param_path, array in zip(rule.params, rule.layout.load(np.asarray(tensor))):
            flat[param_path] = jnp.asarray(array, dtype=config.param_dtype)
    fresh = sorted(set(expected) - set(flat))
    if any(p[0] in BACKBONE_SCOPES for p in fresh):
        raise RuntimeError(f"the {family.model_type} key mapping leaves backbone parameters unmapped: {fresh}")
    if fresh:
        # Only the new head's arrays are drawn: the backbone's would be thrown away.
        flat.update(zip(fresh, draw_leaves(lambda key: model.init(key, model.example_input_ids())["params"], fresh,
                                           jax.random.key(seed))))
    unused = sorted(set(tensors) - consumed - set(mapping.ignored))
    logger.warning("%s: loaded a %s checkpoint into a new %s head; initialised from scratch (seed %d): %s%s; "
                   "checkpoint tensors not used: %s", path, saved_head, head, seed,
                   ", ".join("/".join(p) for p in fresh) or "nothing",
                   f" (shape changed: {refitted})" if refitted else "", unused or "none")
    return flat


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


def special_token_ids(directory: str) -> dict[str, int]:
    """The special-token ids a transformers config.json names (`bos_token_id`, `cls_token_id`, ...) besides
    `pad_token_id`, which EncoderConfig holds: the model's arithmetic never reads them, but generation utilities,
    pipelines and tokenizer checks do, so a converted model carries them back out (`save_pretrained(token_ids=)`)."""
    return {key: value for key, value in _read_config(directory).items()
            if key.endswith("_token_id") and key != "pad_token_id" and isinstance(value, int)
            and not isinstance(value, bool)}


def hf_config_of(model: nn.Module, token_ids: dict[str, int] | None = None) -> dict:
    """The config.json `save_pretrained` writes for `model` (but its dtype), reading no parameter: a ValueError where
    its family has no transformers class for its head or cannot express a field of its config."""
    config: EncoderConfig = model.config
    head = head_of(model)
    family = registry.family_named(config.family, source="EncoderConfig.family")
    hf_config = {"architectures": [family.architecture_for(head)], **family.hf_config(config, head)}
    for key, value in (token_ids or {}).items():  # where the family leaves an id unset (None), not over its own
        if hf_config.get(key) is None:
            hf_config[key] = value
    return hf_config


def save_pretrained(path: str, model: nn.Module, params: dict, token_ids: dict[str, int] | None = None) -> None:
    """Write `config.json` + `model.safetensors` that transformers loads into the matching architecture.

    The family is `model.config.family`. As transformers does, the tied decoder weight is left out of the file.
    Refuses models whose config has knobs that family cannot express, naming each, before writing anything.
    `token_ids`: special-token ids to write into config.json where the model's config sets none
    (`special_token_ids` of the checkpoint it came from).
    """
    config: EncoderConfig = model.config
    head = head_of(model)
    family = registry.family_named(config.family, source="EncoderConfig.family")
    hf_config = hf_config_of(model, token_ids)
    flat = _flatten_checked(model, params)
    mapping = family.mapping(config, head)
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
