"""Every directory that holds a model, read one way: `load_model_dir(path, step=None) -> (model, params, tokenizer)`.

Commands that take a model (`convert`, `fill-mask`, and those to come) and the training objectives that need one
(a distillation teacher) all read it here. Three kinds of directory, told apart by the files present:

- a pretraining workdir (`bertjax pretrain --workdir`): `model_config.json` + `checkpoints/<step>/` + `tokenizer/`;
  the latest checkpoint, or `step`;
- a bertjax model directory (`bertjax convert --from-hf`): `model_config.json` + `params/` (an Orbax checkpoint of
  the parameters) + the tokenizer files;
- a transformers directory: `config.json` + safetensors weights + the tokenizer files.

`model_config.json` is `{"head": <a key of MODEL_CLASSES>, "config": <EncoderConfig fields>}`, plus in a workdir
whose checkpoints hold several models (ELECTRA) `"params_key"`, the main model's subtree, and in a directory
converted from transformers `"token_ids"`, the source config.json's special-token ids besides the padding one
(`read_token_ids`), which `convert --to-hf` writes back. The tokenizer is
None when the directory holds none (a converted checkpoint that came without one).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, NamedTuple

from bertjax.jsonl import read_json_file

MODEL_CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS_DIR = "checkpoints"
RUN_CONFIG_FILE = "config.yaml"  # the resolved run config a workdir starts with
EXPORTS_DIR = "models"  # multi-model objectives (ELECTRA) write each model here at the end of the run


class LoadedModel(NamedTuple):
    model: Any  # a Flax module of MODEL_CLASSES
    params: Any  # its parameter pytree
    tokenizer: Any  # a bertjax.data Tokenizer, or None


# ---------------------------------------------------------------------------------------------------------------
# model_config.json: the model's class and EncoderConfig.

def write_model_config(directory: str | Path, model, token_ids: dict[str, int] | None = None) -> None:
    from bertjax.hf.pretrained import head_of

    path = Path(directory) / MODEL_CONFIG_FILE
    described = {"head": head_of(model), "config": model.config.to_dict()}
    if token_ids:
        described["token_ids"] = token_ids
    path.write_text(json.dumps(described, indent=1) + "\n")


def read_model_config(directory: Path) -> dict:
    path = directory / MODEL_CONFIG_FILE
    described = read_json_file(path)
    if "config" not in described:
        raise ValueError(f"{path}: expected {{\"head\": ..., \"config\": {{...}}}}")
    return {**described, "config": with_family(described["config"])}


# The fields EncoderConfig.family brought (2026-11-23): which Hugging Face family a model is, and that family's
# fine-tuning head. EncoderConfig's own defaults are BERT's.
_FAMILY_FIELDS = ("family", "classifier_activation", "classifier_norm", "classifier_token_transform")


def with_family(config: Any) -> Any:
    """A model_config.json config written before EncoderConfig.family names no family. bertjax then had three,
    told apart by their positions: rotary (ModernBERT), learned and numbered after the padding id (RoBERTa), learned
    (BERT). Such a config gets its family and that family's head fields, as the model was (a ModernBERT read as
    BERT would resume as "another model" and export as BERT); the other fields added since keep their defaults."""
    if not isinstance(config, dict) or "family" in config:
        return config
    from bertjax.config import get_config

    preset = ("modernbert-base" if config.get("position_embedding") == "rope"
              else "roberta-base" if config.get("position_offset") else "bert-base")
    base = get_config(preset).to_dict()
    return {**{name: base[name] for name in _FAMILY_FIELDS}, **config}


def read_token_ids(directory: str | Path) -> dict[str, int]:
    """The special-token ids besides the padding one that a model directory keeps for export: `model_config.json`'s
    (empty when it keeps none, as a pretraining workdir), or a transformers directory's config.json's."""
    path = Path(directory) / MODEL_CONFIG_FILE
    if not path.is_file():
        from bertjax.hf.pretrained import CONFIG_FILE, special_token_ids

        return special_token_ids(str(directory)) if (Path(directory) / CONFIG_FILE).is_file() else {}
    token_ids = read_model_config(Path(directory)).get("token_ids", {})
    if not isinstance(token_ids, dict) or not all(
            isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool)
            for key, value in token_ids.items()):
        raise ValueError(f"{path}: token_ids must map names to integer ids, got {token_ids!r}")
    return token_ids


def read_model(directory: Path):
    """The (unparameterised) model described by `directory/model_config.json`."""
    from bertjax.config import EncoderConfig
    from bertjax.models import MODEL_CLASSES

    described = read_model_config(directory)
    head = described.get("head")
    if not isinstance(head, str) or head not in MODEL_CLASSES:
        raise ValueError(f"{directory / MODEL_CONFIG_FILE}: head {head!r} is not one of {sorted(MODEL_CLASSES)}")
    if not isinstance(described.get("config"), dict):
        raise ValueError(f"{directory / MODEL_CONFIG_FILE}: 'config' must be an object of EncoderConfig fields, got "
                         f"{type(described.get('config')).__name__}")
    try:
        config = EncoderConfig.from_dict(described["config"])
    except ValueError as error:  # the config's own checks name the field; this names the file
        raise ValueError(f"{directory / MODEL_CONFIG_FILE}: {error}") from None
    return MODEL_CLASSES[head](config)


def _tokenizer_in(*candidates: Path):
    """The tokenizer in the first candidate directory that holds one; None if none does."""
    from bertjax.data import load_tokenizer

    for directory in candidates:
        try:
            return load_tokenizer(directory)
        except FileNotFoundError:
            continue
    return None


# ---------------------------------------------------------------------------------------------------------------
# A bertjax model directory.

def save_model_dir(path: str | Path, model, params, tokenizer=None, token_ids: dict[str, int] | None = None, *,
                   this_process_only: bool = False) -> None:
    """Write a bertjax model directory (`load_model_dir` reads it back, onto any mesh).

    Called on every process of a multi-host run, with global arrays, into a directory they all see; or with
    `this_process_only`, by one process with host arrays (the others wait for nothing: their own disks, a per-host
    workdir, never see the directory).

    `params` may be boxed (`model.init(...)["params"]`: Flax's LogicallyPartitioned): the arrays are saved. A tree
    that is not `model`'s (another path or shape) is a ValueError naming the first difference, before anything is
    written."""
    import flax.linen as nn
    import jax
    import orbax.checkpoint as ocp

    params = nn.meta.unbox(params)
    check_params_match(model, params)
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    write_model_config(path, model, token_ids)
    alone = jax.process_index()
    options = ocp.options.MultiprocessingOptions(primary_host=alone, active_processes={alone}) \
        if this_process_only else ocp.options.MultiprocessingOptions()
    with ocp.StandardCheckpointer(multiprocessing_options=options) as checkpointer:
        checkpointer.save(path / PARAMS_DIR, params, force=True)
        checkpointer.wait_until_finished()
    if this_process_only or jax.process_index() == 0:
        # A sha256 of every parameter file, as a workdir's checkpoints carry: a flipped byte in params/ otherwise
        # loads as slightly different weights, without a word (orbax stores no checksums of its own).
        from bertjax.train.checkpoints import write_checksums

        write_checksums(path / PARAMS_DIR)
    if tokenizer is not None:
        tokenizer.save(path / TOKENIZER_DIR)


def save_model_dir_from_process_0(path: str | Path, model, host_params, tokenizer=None,
                                  token_ids: dict[str, int] | None = None) -> None:
    """Called on every process of a run with the same host arrays (e.g. `process_allgather`ed): process 0 writes the
    directory alone (`this_process_only`: a per-host disk is fine), and the others advance orbax's count of saves as
    its save does. Orbax keeps that count per process and names the signals of the next save made together (a
    checkpoint) by it: a save made by process 0 alone left the processes waiting forever on differently named
    signals at the run's next checkpoint."""
    import jax
    import orbax.checkpoint as ocp

    if jax.process_index() == 0:
        save_model_dir(path, model, host_params, tokenizer, token_ids, this_process_only=True)
        return
    me = jax.process_index()
    options = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    with ocp.StandardCheckpointer(multiprocessing_options=options) as checkpointer:
        checkpointer.synchronize_next_awaitable_signal_operation_id()  # what each save does first, alone


def check_params_match(model, params) -> None:
    """ValueError naming the first parameter path whose shape differs between `params` (unboxed) and what `model`
    creates, or that only one of them has: a directory written from such a tree would never load."""
    import jax
    import numpy as np

    from bertjax.models import abstract_params

    def shapes(tree) -> dict[str, tuple]:
        return {jax.tree_util.keystr(key, simple=True, separator="/"): tuple(np.shape(leaf))
                for key, leaf in jax.tree_util.tree_leaves_with_path(tree)}

    given, wanted = shapes(params), shapes(abstract_params(model))
    differing = [key for key in sorted(set(given) | set(wanted)) if given.get(key) != wanted.get(key)]
    if differing:
        key = differing[0]
        raise ValueError(f"params do not match the {type(model).__name__} of this config: params/{key} is "
                         f"{given.get(key, 'absent')}, the model's is {wanted.get(key, 'absent')} "
                         f"({len(differing)} paths differ); nothing was written")


def _is_model_dir(path: Path) -> bool:
    return (path / MODEL_CONFIG_FILE).is_file() and (path / PARAMS_DIR).is_dir()


def _load_model_dir(path: Path, step: int | None, allow_pickle: bool) -> LoadedModel:
    from bertjax.train.checkpoints import CheckpointError, restore_param_tree, verify_checksums

    model = read_model(path)
    try:  # directories written before checksums were recorded have none: nothing to compare
        verify_checksums(path / PARAMS_DIR)
    except CheckpointError as error:
        detail = str(error).removeprefix(f"checkpoint {path / PARAMS_DIR}: file ")
        raise CheckpointError(f"model directory {path}: {PARAMS_DIR}/{detail}; write the directory again from its "
                              "source") from None
    # Checked as a workdir checkpoint's parameters are: shapes against model_config.json before reading, damaged
    # files, NaN/inf (a one-line error naming the directory each time).
    params = restore_param_tree(path / PARAMS_DIR, model, f"model directory {path}",
                                f"its {MODEL_CONFIG_FILE}")
    return LoadedModel(model, params, _tokenizer_in(path / TOKENIZER_DIR, path))


# ---------------------------------------------------------------------------------------------------------------
# A pretraining workdir.

def _is_workdir(path: Path) -> bool:
    return (path / MODEL_CONFIG_FILE).is_file() and (path / RUN_CONFIG_FILE).is_file()


def _run_config(workdir: Path) -> dict:
    """A workdir's config.yaml as written ({} when it has none)."""
    import yaml

    run_config = workdir / RUN_CONFIG_FILE
    if not run_config.is_file():
        return {}
    try:
        saved = yaml.safe_load(run_config.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"{run_config} cannot be read ({str(error).splitlines()[0]}): this workdir's run "
                         "config is damaged") from None
    if not isinstance(saved, dict) or not all(isinstance(saved.get(section), (dict, type(None)))
                                              for section in ("checkpoint", "objective")):
        raise ValueError(f"{run_config}: this workdir's run config is damaged (not a mapping of sections with "
                         "checkpoint: and objective: mappings)")
    return saved


def checkpoints_dir(workdir: Path) -> Path:
    """Where the run's checkpoints are: checkpoint.directory of its config, else <workdir>/checkpoints."""
    directory = (_run_config(workdir).get("checkpoint") or {}).get("directory")
    return Path(directory) if directory else workdir / CHECKPOINTS_DIR


def trained_objective(path: str | Path) -> str | None:
    """The objective a pretraining workdir trains (`objective.name` of its config.yaml, "mlm" by default); None
    for any other directory."""
    path = Path(path)
    if not _is_workdir(path):
        return None
    return str((_run_config(path).get("objective") or {}).get("name", "mlm"))


def step_dirs(workdir: Path) -> list[int]:
    """Every step directory of the run's checkpoints, complete or not. Orbax writes a step under a temporary name
    (`<step>.orbax-checkpoint-tmp-...`) and renames it once complete: only directories named by a bare number
    count, so a save in progress is no step."""
    directory = checkpoints_dir(workdir)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def checkpoint_steps(workdir: Path) -> list[int]:
    """The steps whose directory holds a train state (`state/`); damage inside it is found when reading."""
    directory = checkpoints_dir(workdir)
    return [s for s in step_dirs(workdir) if (directory / str(s) / "state").is_dir()]


def _load_workdir(path: Path, step: int | None, allow_pickle: bool) -> LoadedModel:
    from bertjax.train.checkpoints import CheckpointError, ModelMismatch, restore_params

    steps, complete = step_dirs(path), checkpoint_steps(path)
    if not steps:
        raise FileNotFoundError(f"{checkpoints_dir(path)} holds no checkpoint yet (the run saves one every "
                                "checkpoint.every steps and at the end)")
    if step is None:
        # The latest step, even when it is incomplete: an older model answering silently instead is worse than an
        # error that names the step to pick (as a resume refuses it).
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(f"{path}: no checkpoint of step {step}; available steps: {complete}")
    step_dir = checkpoints_dir(path) / str(step)
    model = read_model(path)
    # The checkpoint's shapes are compared with the model model_config.json describes before reading: a restore
    # allocates whatever its own metadata claims. The params_key model (ELECTRA) is the only part read.
    params_key = read_model_config(path).get("params_key")
    try:
        params = restore_params(step_dir, model=model, params_key=params_key,
                                model_source=str(path / MODEL_CONFIG_FILE))
    except ModelMismatch:
        raise  # every step of the workdir was saved from the same model: an earlier one would not fit either
    except CheckpointError as error:
        earlier = [s for s in complete if s < step]
        if earlier:
            hint = (f"Use an earlier one (available: {earlier}): --step {earlier[-1]} where the command takes it "
                    f"(fill-mask, convert), else export it with `bertjax convert --to-hf {path} --step "
                    f"{earlier[-1]} --out DIR`; or restore or delete {step_dir}")
        else:
            hint = f"There is no earlier checkpoint; restore or delete {step_dir}"
        raise CheckpointError(f"{error}. {hint}") from None
    return LoadedModel(model, params, _tokenizer_in(path / TOKENIZER_DIR))


# ---------------------------------------------------------------------------------------------------------------
# A transformers directory.

def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _load_hf_dir(path: Path, step: int | None, allow_pickle: bool) -> LoadedModel:
    from bertjax.hf import from_pretrained

    model, params = from_pretrained(str(path), allow_pickle=allow_pickle)  # refuses NaN/inf weights
    return LoadedModel(model, params, _tokenizer_in(path))


@dataclasses.dataclass(frozen=True)
class DirectoryKind:
    name: str
    test: Callable[[Path], bool]
    load: Callable[[Path, int | None, bool], LoadedModel]  # (path, step, allow_pickle)
    has_steps: bool = False


# The first kind whose test passes reads the directory. Add a line to add a kind.
MODEL_DIR_KINDS: tuple[DirectoryKind, ...] = (
    DirectoryKind("pretraining workdir", _is_workdir, _load_workdir, has_steps=True),
    DirectoryKind("bertjax model directory", _is_model_dir, _load_model_dir),
    DirectoryKind("transformers directory", _is_hf_dir, _load_hf_dir),
)


def model_dir_kind(path: str | Path) -> DirectoryKind:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: {'a file, not a model directory' if path.exists() else 'no such directory'}")
    for kind in MODEL_DIR_KINDS:
        if kind.test(path):
            return kind
    raise FileNotFoundError(f"{path}: not a pretraining workdir ({MODEL_CONFIG_FILE} + {RUN_CONFIG_FILE} + "
                            f"{CHECKPOINTS_DIR}/), a bertjax model directory ({MODEL_CONFIG_FILE} + {PARAMS_DIR}/) "
                            f"or a transformers directory (config.json + weights)")


def load_model_dir(path: str | Path, step: int | None = None, allow_pickle: bool = False) -> LoadedModel:
    """(model, params, tokenizer) of any model directory; `step` picks a pretraining workdir's checkpoint;
    `allow_pickle` lets a transformers directory with only a pytorch_model.bin be read (trusted files only).

    Every kind is refused, with a one-line error (a ValueError) naming the directory, when its parameters hold a NaN
    or an infinity, its files are damaged, or (a workdir's checkpoint, bertjax `params/`, a transformers
    directory's layers) their shapes are not those model_config.json / config.json describes: compared before any
    array is read or the model is traced at the claimed sizes. A workdir's latest step directory that is incomplete
    is an error naming it and the earlier steps, never passed over for an older one."""
    kind = model_dir_kind(path)
    if step is not None and not kind.has_steps:
        raise ValueError(f"{path} is a {kind.name}: it holds one set of weights, so a step cannot be chosen "
                         "(--step applies to pretraining workdirs)")
    return kind.load(Path(path), step, allow_pickle)
