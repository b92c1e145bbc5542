"""sentence-transformers model directories in and out, and every other model directory as an embedding model.

    encoder = load_sentence_encoder(path)   # a sentence-transformers, transformers or bertjax directory
    save_sentence_encoder(encoder, out)     # SentenceTransformer(out) loads it and gives the same embeddings

A sentence-transformers directory is a pipeline of modules listed in `modules.json`:

    modules.json                         [{"idx", "name", "path", "type": "...Transformer"}, ...Pooling, ...]
    config_sentence_transformers.json    prompts, default_prompt_name, similarity_fn_name, truncate_dim
    <Transformer path>/                  a transformers checkpoint + tokenizer + sentence_bert_config.json
                                         ({"max_seq_length": 256, "do_lower_case": false})
    1_Pooling/config.json                {"embedding_dimension", "pooling_mode": "mean" | [...], "include_prompt"}
                                         (or the older pooling_mode_cls_token / ..._mean_tokens booleans)
    2_Dense/config.json + weights        {"in_features", "out_features", "bias", "activation_function"}
    3_Normalize/                         L2 normalisation

Supported: one Transformer module first, one Pooling, any Dense layers, an optional final Normalize. Anything else
(word embeddings, LSTM, routers, a Dense on token embeddings) is refused by name. A transformers or bertjax
directory without modules.json gets sentence-transformers' default: mean pooling, no normalisation.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from bertjax.embeddings.config import DenseConfig, PoolingConfig
from bertjax.embeddings.encoder import SentenceEncoder, check_single_text_layout
from bertjax.embeddings.similarity import SIMILARITY_FUNCTIONS
from bertjax.embeddings.model import EncoderForEmbedding
from bertjax.inference.texts import check_tokenizer_fits
from bertjax.jsonl import json_type_name, read_json_file

logger = logging.getLogger(__name__)

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
TRANSFORMER_CONFIG_FILE = "sentence_bert_config.json"
MODULE_CONFIG_FILE = "config.json"
# Written as the classic import paths, which every sentence-transformers version resolves.
MODULE_TYPES = {
    "Transformer": "sentence_transformers.models.Transformer",
    "Pooling": "sentence_transformers.models.Pooling",
    "Dense": "sentence_transformers.models.Dense",
    "Normalize": "sentence_transformers.models.Normalize",
}
# sentence-transformers' legacy Pooling booleans, in the order its forward concatenates them.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# torch activation class (last component of 2_Dense/config.json's activation_function) <-> DenseConfig.activation.
TORCH_ACTIVATIONS = {
    "Identity": ("identity", "torch.nn.modules.linear.Identity"),
    "Tanh": ("tanh", "torch.nn.modules.activation.Tanh"),
    "ReLU": ("relu", "torch.nn.modules.activation.ReLU"),
    "GELU": ("gelu", "torch.nn.modules.activation.GELU"),
    "Sigmoid": ("sigmoid", "torch.nn.modules.activation.Sigmoid"),
    "SiLU": ("silu", "torch.nn.modules.activation.SiLU"),
}
EMBEDDING_KEY = "sentence_embedding"
BACKBONE_SCOPES = ("embeddings", "encoder")


# ---------------------------------------------------------------------------------------------------------------
# Reading.

def _read_json(path: Path, what: str, expected: type = dict) -> Any:
    """The JSON file's value, whose top level must be an `expected` (an object unless said otherwise)."""
    try:
        return read_json_file(path, expected)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing ({what})") from None


def _expect(condition: bool, path: Path, message: str) -> None:
    if not condition:
        raise ValueError(f"{path}: {message}")


def _module_kind(entry: Any, path: Path) -> str:
    _expect(isinstance(entry, dict), path, f"each module entry must be an object with 'type' and 'path', got "
            f"{json_type_name(entry)}")
    type_name = entry.get("type")
    _expect(isinstance(type_name, str), path, f"module entry {entry} has no 'type'")
    kind = type_name.rsplit(".", 1)[-1]
    _expect(kind in MODULE_TYPES, path, f"module {entry.get('name', '?')!r} has type {type_name!r}; bertjax reads "
            f"{', '.join(MODULE_TYPES)} modules only")
    return kind


def _module_dir(root: Path, entry: dict, modules_path: Path) -> Path:
    sub = entry.get("path", "")
    _expect(isinstance(sub, str) and not os.path.isabs(sub) and ".." not in Path(sub).parts, modules_path,
            f"module path {sub!r} must be a folder inside the model directory")
    return root / sub


def _read_transformer(directory: Path, allow_pickle: bool):
    """(backbone EncoderConfig, backbone params, tokenizer, sentence_bert_config values)."""
    from bertjax.model_dirs import load_model_dir

    settings: dict = {}
    config_path = directory / TRANSFORMER_CONFIG_FILE
    if config_path.is_file():
        settings = _read_json(config_path, "the Transformer module's settings")
        task = settings.get("transformer_task", "feature-extraction")
        _expect(task == "feature-extraction", config_path, f"transformer_task {task!r}: bertjax embeds with the "
                "bare encoder (feature-extraction) only")
        output = settings.get("module_output_name", "token_embeddings")
        _expect(output == "token_embeddings", config_path, f"module_output_name {output!r}: the Pooling module "
                "reads token_embeddings")
        modalities = settings.get("modality_config") or {}
        text = modalities.get("text", {}) if isinstance(modalities, dict) else None
        _expect(isinstance(text, dict), config_path, f"modality_config must map modality names to objects, got "
                f"{modalities!r}")
        _expect(text.get("method_output_name", "last_hidden_state") == "last_hidden_state", config_path,
                f"the text modality reads {text.get('method_output_name')!r}; bertjax pools last_hidden_state")
        _check_processing_kwargs(settings, config_path)
    model, params, tokenizer = load_model_dir(directory, allow_pickle=allow_pickle)
    if tokenizer is not None:  # none: SentenceEncoder says so
        check_tokenizer_fits(tokenizer, model.config, directory)
        check_single_text_layout(tokenizer, str(directory))
    return model, params, tokenizer, settings


def _pooling_modes(values: dict, path: Path) -> tuple[str, ...]:
    mode = values.get("pooling_mode")
    if mode is not None:
        modes = (mode,) if isinstance(mode, str) else mode
        _expect(isinstance(modes, (list, tuple)) and all(isinstance(m, str) for m in modes), path,
                f"pooling_mode must be a name or a list of names, got {mode!r}")
        return tuple(modes)
    legacy = tuple(name for key, name in LEGACY_POOLING_KEYS.items() if values.get(key))
    return legacy or ("mean",)  # sentence-transformers' default


def _read_pooling(directory: Path, hidden_size: int) -> tuple[tuple[str, ...], bool]:
    path = directory / MODULE_CONFIG_FILE
    values = _read_json(path, "the Pooling module's settings")
    size = values.get("embedding_dimension", values.get("word_embedding_dimension", hidden_size))
    _expect(size == hidden_size, path, f"pools token embeddings of size {size}, the model's hidden size is "
            f"{hidden_size}")
    include_prompt = values.get("include_prompt", True)
    _expect(isinstance(include_prompt, bool), path, f"include_prompt must be true or false, got {include_prompt!r}")
    return _pooling_modes(values, path), include_prompt


def _read_dense(directory: Path, allow_pickle: bool) -> tuple[DenseConfig, dict]:
    from bertjax.hf.weights import read_weights

    path = directory / MODULE_CONFIG_FILE
    values = _read_json(path, "the Dense module's settings")
    for key in ("module_input_name", "module_output_name"):
        name = values.get(key)
        _expect(name in (None, EMBEDDING_KEY), path, f"{key}={name!r}: bertjax reads Dense layers on the sentence "
                "embedding only")
    activation_path = values.get("activation_function", TORCH_ACTIVATIONS["Tanh"][1])
    # Only torch's own classes: sentence-transformers imports any other path only with trust_remote_code (else it
    # falls back to Tanh), and a class of that name elsewhere may compute anything.
    activation = TORCH_ACTIVATIONS.get(str(activation_path).rsplit(".", 1)[-1]) \
        if str(activation_path).startswith("torch.") else None
    _expect(activation is not None, path, f"activation_function {activation_path!r} is not one of "
            f"{', '.join('torch.nn.' + name for name in TORCH_ACTIVATIONS)}")
    try:
        spec = DenseConfig(in_features=values.get("in_features"), out_features=values.get("out_features"),
                           bias=values.get("bias", True), activation=activation[0],
                           use_residual=values.get("use_residual", False))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    tensors = read_weights(str(directory), allow_pickle=allow_pickle)
    expected = {"linear.weight": (spec.out_features, spec.in_features)}
    if spec.bias:
        expected["linear.bias"] = (spec.out_features,)
    if spec.use_residual and spec.in_features != spec.out_features:
        expected["residual.weight"] = (spec.out_features, spec.in_features)
    for name, shape in expected.items():
        _expect(name in tensors, directory, f"Dense weights lack {name!r} (found {sorted(tensors)})")
        _expect(tuple(tensors[name].shape) == shape, directory, f"{name} has shape {tuple(tensors[name].shape)}, "
                f"config.json says {shape}")
    unexpected = sorted(set(tensors) - set(expected))
    _expect(not unexpected, directory, f"unexpected Dense tensors {unexpected}")
    params = {"linear": {"kernel": np.asarray(tensors["linear.weight"], np.float32).T}}  # torch Linear: [out, in]
    if spec.bias:
        params["linear"]["bias"] = np.asarray(tensors["linear.bias"], np.float32)
    if "residual.weight" in expected:
        params["residual"] = {"kernel": np.asarray(tensors["residual.weight"], np.float32).T}
    return spec, params


def _read_st_settings(root: Path) -> dict:
    path = root / ST_CONFIG_FILE
    if not path.is_file():
        return {}
    values = _read_json(path, "model settings")
    prompts = values.get("prompts") or {}
    _expect(isinstance(prompts, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()),
            path, f"prompts must map names to texts, got {prompts!r}")
    similarity = values.get("similarity_fn_name") or "cosine"
    if similarity not in SIMILARITY_FUNCTIONS:
        logger.warning("%s: similarity_fn_name %r is not one of %s; using cosine", path, similarity,
                       tuple(SIMILARITY_FUNCTIONS))
        similarity = "cosine"
    truncate_dim = values.get("truncate_dim")
    _expect(truncate_dim is None or (isinstance(truncate_dim, int) and truncate_dim > 0), path,
            f"truncate_dim must be a positive integer, got {truncate_dim!r}")
    default = values.get("default_prompt_name")
    _expect(default is None or default in prompts, path, f"default_prompt_name {default!r} is not one of the "
            f"prompts {sorted(prompts)}")
    return {"prompts": dict(prompts), "default_prompt_name": default, "similarity_fn_name": similarity,
            "truncate_dim": truncate_dim}


def _default_max_seq_length(config, directory: Path) -> int:
    """sentence-transformers' default: the tokenizer's model_max_length, capped by the model's positions."""
    limit = config.max_position_embeddings - config.position_offset
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():
        value = _read_json(tokenizer_config, "tokenizer settings").get("model_max_length")
        if isinstance(value, int) and 2 <= value < limit:
            return value
    return limit


# What sentence-transformers 6's `processing_kwargs` may say to the tokenizer of a text (its "text" and "common"
# groups) that bertjax follows: the length (read as max_seq_length); padding and truncation change no embedding.
PROCESSING_KEYS = ("max_length", "padding", "truncation")


def _check_processing_kwargs(settings: dict, config_path: Path) -> None:
    """Refuse the sentence-transformers 6 settings that would make its embeddings differ from bertjax's."""
    processing = settings.get("processing_kwargs") or {}
    _expect(isinstance(processing, dict) and all(isinstance(v, dict) for v in processing.values()), config_path,
            f"processing_kwargs must map modality names to objects, got {processing!r}")
    for group in ("common", "text"):  # the other groups (audio, image, chat_template) never reach a text
        unknown = sorted(set(processing.get(group, {})) - set(PROCESSING_KEYS))
        _expect(not unknown, config_path, f"processing_kwargs.{group} sets {unknown}, which bertjax does not apply "
                f"to a text (it follows {', '.join(PROCESSING_KEYS)})")
    _expect(settings.get("query_expansion") is None, config_path, "query_expansion is ColBERT-style multi-vector "
            "retrieval; bertjax embeds a text as one vector")
    for key, call in (("query_length", "encode_query"), ("document_length", "encode_document")):
        if settings.get(key) is not None:
            logger.warning("%s: %s %s applies in sentence-transformers' %s only; bertjax cuts every text at "
                           "max_seq_length", config_path, key, settings[key], call)


def _max_seq_length(settings: dict, directory: Path) -> int | None:
    """sentence_bert_config.json's max_seq_length, or the max_length its processing_kwargs give a text (which
    override it in sentence-transformers 6); None: unset. Its range is SentenceEncoder's to check."""
    processing = settings.get("processing_kwargs") or {}
    given = [processing.get(group, {}).get("max_length") for group in ("text", "common")]
    value = next((length for length in given if length is not None), settings.get("max_seq_length"))
    # bool is an int in Python, but `true` is no length.
    _expect(value is None or (isinstance(value, int) and not isinstance(value, bool)),
            directory / TRANSFORMER_CONFIG_FILE, f"max_seq_length must be an integer, got {value!r}")
    return value


def _embedding_model(backbone, pooling: PoolingConfig, dense: tuple[DenseConfig, ...], dtype: str | None):
    # config.pooler stays as the checkpoint has it (the embedding model never runs a pooler; saving reads it).
    changes: dict = {"task": None}
    if dtype is not None:
        changes["dtype"] = dtype
    return EncoderForEmbedding(backbone.config.replace(**changes), pooling=pooling, dense=dense)


def _backbone_params(params: dict) -> dict:
    return {scope: params[scope] for scope in BACKBONE_SCOPES}


def _load_st_dir(root: Path, dtype: str | None, allow_pickle: bool) -> SentenceEncoder:
    import jax
    import jax.numpy as jnp

    modules_path = root / MODULES_FILE
    entries = _read_json(modules_path, "the module list", expected=list)
    _expect(bool(entries), modules_path, "expected a non-empty list of modules")
    kinds = [_module_kind(entry, modules_path) for entry in entries]
    _expect(kinds[0] == "Transformer" and kinds.count("Transformer") == 1, modules_path,
            f"the first module, and only it, must be a Transformer; modules are {kinds}")
    _expect(kinds.count("Pooling") == 1 and kinds[1] == "Pooling", modules_path,
            f"a Pooling module must follow the Transformer; modules are {kinds}")
    _expect("Normalize" not in kinds[:-1], modules_path, f"Normalize must be the last module; modules are {kinds}")
    transformer_dir = _module_dir(root, entries[0], modules_path)
    model, params, tokenizer, settings = _read_transformer(transformer_dir, allow_pickle)
    modes, include_prompt = _read_pooling(_module_dir(root, entries[1], modules_path), model.config.hidden_size)
    dense_specs, dense_params = [], {}
    for entry, kind in zip(entries[2:], kinds[2:]):
        if kind == "Dense":
            spec, layer = _read_dense(_module_dir(root, entry, modules_path), allow_pickle)
            dense_params[f"dense_{len(dense_specs)}"] = layer
            dense_specs.append(spec)
    st = _read_st_settings(root)
    try:
        pooling = PoolingConfig(modes=modes, normalize=kinds[-1] == "Normalize", truncate_dim=st.get("truncate_dim"),
                                include_prompt=include_prompt)
    except ValueError as error:
        raise ValueError(f"{root}: {error}") from None
    embedding_model = _embedding_model(model, pooling, tuple(dense_specs), dtype)
    dense_params = jax.tree.map(lambda v: jnp.asarray(v, embedding_model.config.param_dtype), dense_params)
    all_params = {**_backbone_params(params), **dense_params}
    max_seq_length = _max_seq_length(settings, transformer_dir) or _default_max_seq_length(model.config,
                                                                                           transformer_dir)
    do_lower_case = settings.get("do_lower_case", False)
    _expect(isinstance(do_lower_case, bool), transformer_dir / TRANSFORMER_CONFIG_FILE,
            f"do_lower_case must be true or false, got {do_lower_case!r}")
    return SentenceEncoder(embedding_model, all_params, tokenizer, max_seq_length=max_seq_length,
                           do_lower_case=do_lower_case, prompts=st.get("prompts", {}),
                           default_prompt_name=st.get("default_prompt_name"),
                           similarity_fn_name=st.get("similarity_fn_name", "cosine"))


def _trained_model_of(root: Path) -> Path:
    """A `bertjax train-embedder` workdir stands for the model its run wrote (<workdir>/model); the directory
    itself otherwise."""
    from bertjax.embeddings.training import MODEL_DIR, RUN_FILE

    if not (root / RUN_FILE).is_file() or (root / MODULES_FILE).is_file():
        return root
    if not (root / MODEL_DIR / MODULES_FILE).is_file():
        raise FileNotFoundError(f"{root} is a train-embedder workdir whose run has not finished (no {MODEL_DIR}/ "
                                "yet): rerun the same train-embedder command to finish it")
    return root / MODEL_DIR


def load_sentence_encoder(path: str | os.PathLike, *, dtype: str | None = None, allow_pickle: bool = False,
                          pooling: PoolingConfig | None = None) -> SentenceEncoder:
    """The SentenceEncoder of a sentence-transformers directory (modules.json; a train-embedder workdir stands for
    its model/), or of any directory `bertjax.model_dirs.load_model_dir` reads (transformers checkpoint, bertjax
    model directory, pretraining workdir) with `pooling` (default mean pooling, as sentence-transformers wraps a
    plain transformers model).

    dtype: the backbone's computation dtype ("bfloat16" for fast inference); parameters keep their stored dtype
    and pooling stays float32. allow_pickle: read PyTorch pickles (trusted files only).
    """
    from bertjax.model_dirs import load_model_dir

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: {'a file, not a model directory' if root.exists() else 'no such directory'}")
    root = _trained_model_of(root)
    if (root / MODULES_FILE).is_file():
        encoder = _load_st_dir(root, dtype, allow_pickle)
        return encoder if pooling is None else encoder.replace(pooling=pooling)
    model, params, tokenizer = load_model_dir(root, allow_pickle=allow_pickle)
    if tokenizer is None:
        raise FileNotFoundError(f"{root}: holds no tokenizer, which an embedding model needs (tokenizer.json, "
                                "vocab.txt, vocab.json + merges.txt or a SentencePiece .model)")
    check_tokenizer_fits(tokenizer, model.config, root)
    check_single_text_layout(tokenizer, str(root))
    embedding_model = _embedding_model(model, pooling or PoolingConfig(), (), dtype)
    return SentenceEncoder(embedding_model, _backbone_params(params), tokenizer,
                           max_seq_length=_default_max_seq_length(model.config, root))


# ---------------------------------------------------------------------------------------------------------------
# Writing.

def _backbone_for_export(encoder: SentenceEncoder):
    """(EncoderModel, params) for `bertjax.save_pretrained`: the backbone, plus a freshly initialised pooler where
    the base model has one (config.pooler: BertModel); sentence-transformers never reads the pooler's output, and
    the embedding model does not keep one."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from bertjax.models import EncoderModel
    from bertjax.models.heads import Pooler

    config = _with_base_model_pooler(encoder.config.replace(dtype=encoder.config.param_dtype))
    params = _backbone_params(encoder.params)
    if config.pooler:  # initialise the pooler alone: initialising the whole model would cost a full forward
        pooler = Pooler(config).init(jax.random.key(0), jnp.zeros((1, 1, config.hidden_size)),
                                      jnp.ones((1, 1), jnp.int32))["params"]
        params = {**params, "pooler": nn.meta.unbox(pooler)}
    return EncoderModel(config), params


def _with_base_model_pooler(config):
    """The config with the pooler its family's base model class has: BertModel has one even when the encoder was
    loaded from a checkpoint without it (BertForMaskedLM, or a model trained by `bertjax train-embedder` from one);
    ModernBertModel and DistilBertModel have none."""
    from bertjax.hf import registry

    family = registry.family_named(config.family, source="EncoderConfig.family")
    for pooler in (config.pooler, not config.pooler):
        try:
            family.hf_config(config.replace(pooler=pooler), "encoder")
        except ValueError:
            continue
        return config.replace(pooler=pooler)
    return config  # refused either way: save_pretrained names the reason


def _torch_linear(kernel) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(kernel, np.float32).T)


def save_sentence_encoder(encoder: SentenceEncoder, path: str | os.PathLike) -> None:
    """Write a sentence-transformers directory: `SentenceTransformer(path).encode` then gives the embeddings
    `encoder.encode` gives (with `normalize_embeddings=True` where the pooling truncates and normalises:
    sentence-transformers truncates after its Normalize module, bertjax normalises after truncating).
    """
    import bertjax
    from bertjax.data.tokenizer_export import save_for_transformers
    from bertjax.hf.weights import write_safetensors

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    model, params = _backbone_for_export(encoder)
    bertjax.save_pretrained(str(root), model, params)
    names = ["input_ids", "token_type_ids", "attention_mask"] if encoder.config.type_vocab_size else \
        ["input_ids", "attention_mask"]
    save_for_transformers(encoder.tokenizer, root, model_max_length=encoder.max_seq_length, model_input_names=names)
    _write_json(root / TRANSFORMER_CONFIG_FILE, {"max_seq_length": encoder.max_seq_length,
                                                 "do_lower_case": encoder.do_lower_case})
    modules = [{"idx": 0, "name": "0", "path": "", "type": MODULE_TYPES["Transformer"]}]

    def add(kind: str) -> Path:
        idx = len(modules)
        modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_{kind}", "type": MODULE_TYPES[kind]})
        directory = root / f"{idx}_{kind}"
        directory.mkdir(exist_ok=True)
        return directory

    pooling = encoder.pooling
    modes = pooling.modes
    _write_json(add("Pooling") / MODULE_CONFIG_FILE, {
        "embedding_dimension": encoder.config.hidden_size, "pooling_mode": modes[0] if len(modes) == 1 else list(modes),
        "include_prompt": pooling.include_prompt})
    activation_path = {short: torch_path for short, torch_path in TORCH_ACTIVATIONS.values()}
    for i, spec in enumerate(encoder.dense):
        directory = add("Dense")
        layer = encoder.params[f"dense_{i}"]
        config = {"in_features": spec.in_features, "out_features": spec.out_features, "bias": spec.bias,
                  "activation_function": activation_path[spec.activation]}
        tensors = {"linear.weight": _torch_linear(layer["linear"]["kernel"])}
        if spec.bias:
            tensors["linear.bias"] = np.asarray(layer["linear"]["bias"], np.float32)
        if spec.use_residual:
            config["use_residual"] = True
            if "residual" in layer:
                tensors["residual.weight"] = _torch_linear(layer["residual"]["kernel"])
        _write_json(directory / MODULE_CONFIG_FILE, config)
        write_safetensors(str(directory / "model.safetensors"), tensors)
    if pooling.normalize:
        add("Normalize")
    _write_json(root / MODULES_FILE, modules)
    settings = {"model_type": "SentenceTransformer", "__version__": {"bertjax": bertjax.__version__},
                "prompts": dict(encoder.prompts), "default_prompt_name": encoder.default_prompt_name,
                "similarity_fn_name": encoder.similarity_fn_name}
    if pooling.truncate_dim is not None:
        settings["truncate_dim"] = pooling.truncate_dim
    _write_json(root / ST_CONFIG_FILE, settings)


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
