"""The typed YAML run config of `bertjax pretrain`: frozen dataclasses, one per section.

    model:      {preset: modernbert-tiny, overrides: {hidden_size: 64}, remat_policy: none}
    objective:  {name: mlm}  (or mlm_nsp, mlm_sop, electra, distillation, permutation_lm, with their options:
                bertjax.train.objectives)
    tokenizer:  {path: null, vocab_size: 8192}  (null: train one on the run's training documents)
    data:       the data pipeline's own config (bertjax.data.DataConfig): input, seq_len, global_batch_size, ...
    optimizer:  {name: stable_adamw, learning_rate: 1.0e-3, ...}
    schedule:   {name: wsd, warmup: 100, decay: 200, decay_shape: 1-sqrt, unit: steps}
    train:      {steps: 1000, seed: 0, log_every: 10, phases: [{name, fraction | tokens, data, model, ...}]}
    eval:       {every: 100, batches: 8}
    checkpoint: {every: 500, keep: 3}
    mesh:       {data: -1, fsdp: 1, tensor: 1}

Unknown keys and values of the wrong type are errors that name the dotted key (`optimizer.b1`). Command-line
overrides are `key=value` pairs on dotted keys (`train.steps=20`): a string field takes the value as written
(`data.input=2024`, `data.anchor_prompt="query: "`), any other field its YAML reading.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the dotted key."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    preset: str  # a name registered in bertjax.config.PRESETS (the model the objective trains)
    # EncoderConfig fields replaced on top of the preset; vocab_size and pad_token_id come from the tokenizer.
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    remat_policy: str = "none"  # a name of bertjax.models.encoder.REMAT_POLICIES
    # A model directory (transformers, bertjax or a pretraining workdir) whose weights start a fresh run instead of
    # random ones, adapted by bertjax.train.init_from (Longformer from RoBERTa: positions copied to the longer
    # table, global projections from the local ones; a larger model grown from a smaller one by `bertjax init-from`,
    # as ModernBERT-large from base). None: random initialisation. A resumed run ignores it.
    init_from: str | None = None


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"  # a name of bertjax.train.optimizers.OPTIMIZERS
    learning_rate: float = 1e-3  # the peak learning rate; the schedule shapes it
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-6
    weight_decay: float = 0.01
    no_decay: tuple[str, ...] = (r"bias$", r"norm/")  # regexes over "a/b/c" parameter paths
    clip_global_norm: float | None = None
    accumulation_steps: int = 1  # microbatches per update; the batch is split, gradients summed


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    name: str = "linear"  # a name of bertjax.train.schedules.SCHEDULES
    # Unit of warmup, decay and total: steps, tokens, or "fraction" of the run (train.steps), which makes a recipe
    # hold for any run length (warmup: 0.1 is 10% of the steps).
    unit: Literal["steps", "tokens", "fraction"] = "steps"
    warmup: float = 0.0
    decay: float | None = None  # wsd: length of the final decay; others decay over everything after warmup
    decay_shape: Literal["linear", "1-sqrt"] = "linear"  # wsd only
    total: float | None = None  # None: the whole run (train.steps, or its tokens)
    final_lr_ratio: float = 0.0  # the learning rate at the end, as a fraction of the peak


@dataclasses.dataclass(frozen=True)
class BatchWarmupConfig:
    """The global batch ramps from `start` rows to the phase's data.global_batch_size over `tokens` trained tokens,
    growing by whole per-device rows (the mesh's batch shards at a time): ModernBERT-base 768 -> 4608 over 50B."""

    start: int
    tokens: float


@dataclasses.dataclass(frozen=True)
class PhaseConfig:
    """A part of the run with its own data, model (RoPE) settings, batch and learning rate.

    BERT: 90% of steps at 128 tokens then 10% at 512 (`fraction`); ModernBERT: 1.719T tokens at 1024, 250B at 8192
    with global RoPE theta 160k, then a 50B-token 1-sqrt decay (`tokens`: the phase lasts that many trained tokens).
    """

    fraction: float | None = None  # share of train.steps; the fractions of all phases sum to 1
    tokens: float | None = None  # or a token budget (then train.steps is derived from the phases)
    name: str = ""  # in metrics.jsonl and on the loss plot; "" -> "phase <i>"
    data: dict[str, Any] = dataclasses.field(default_factory=dict)  # data fields replaced in this phase (seq_len, ...)
    # EncoderConfig fields replaced in this phase that leave the parameters' shapes alone (rope_theta_global, ...).
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    learning_rate: float | None = None  # the peak in this phase; None: optimizer.learning_rate
    # Schedule fields for a schedule of this phase alone, counted from its start (units relative to the phase:
    # fraction of the phase, its tokens or steps); None: the run's schedule continues through this phase.
    schedule: dict[str, Any] | None = None
    batch_warmup: BatchWarmupConfig | None = None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # Optimizer updates; None when every phase has a token budget (the steps follow from the batch sizes).
    steps: int | None = None
    seed: int = 0
    log_every: int = 10
    phases: tuple[PhaseConfig, ...] = ()
    peak_tflops_per_device: float | None = None  # for MFU; None: looked up by device kind (bertjax.train.flops)
    progress_bar: bool = True
    # A non-finite loss or gradient norm: stop before saving (keeping the finite checkpoints), or skip that update.
    nonfinite: Literal["stop", "skip"] = "stop"


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """Which tokenizer the run uses; it is saved into `<workdir>/tokenizer` and reused when the run resumes."""

    path: str | None = None  # a tokenizer file or directory (tokenizer.json, *.model, vocab.txt); None: see below
    # With no path: the tokenizer of a `bertjax prepare` directory given as data.input, else a SentencePiece model
    # trained here on the training split of data.input.
    vocab_size: int = 8192
    model_type: Literal["bpe", "unigram"] = "bpe"
    max_lines: int = 200_000  # lines sampled for training


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 0  # 0: only at the start and the end
    batches: int = 8  # held-out batches per evaluation
    at_start: bool = True
    at_end: bool = True
    fill_mask_examples: int = 3  # held-out sentences shown with fill-mask predictions at the end


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 1000  # steps between saves; the last step is always saved
    keep: int = 3  # most recent checkpoints kept
    async_save: bool = True  # write in the background while training continues
    directory: str | None = None  # None: <workdir>/checkpoints; multi-host runs need one all hosts share
    restore_step: int | None = None  # None: resume from the latest checkpoint in the workdir
    checksums: bool = True  # record sha256 of every file, verified before restoring (local filesystems only)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape; -1 on one axis takes all remaining devices."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    train: TrainConfig
    data: Any = None  # the data pipeline's config dataclass (see `data_config_class`)
    objective: Any = None  # the objective's options dataclass (bertjax.train.objectives), `mlm` when absent
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    def __post_init__(self) -> None:
        _validate(self)


def data_config_class() -> type:
    """The data pipeline's config dataclass (imported lazily: the run config is usable without the data stack)."""
    from bertjax.data import DataConfig
    return DataConfig


# ---------------------------------------------------------------------------------------------------------------
# Loading.

def load_run_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML run config, apply `key=value` overrides, and check every key and type."""
    raw = read_config_file(path, kind="pretrain")
    for override in overrides:
        apply_override(raw, override)
    config = run_config_from_dict(raw)
    check_overrides_reach_phases(config, overrides)
    return config


# Override prefixes a phase replaces, and the PhaseConfig field that holds the phase's own values.
PHASE_SECTIONS = {"data.": "data", "model.overrides.": "model"}


def check_overrides_reach_phases(config: RunConfig, overrides: Sequence[str]) -> None:
    """An override of a key that every phase sets for itself changes nothing the run does: an error, not a silent
    no-op (`data.global_batch_size=256` on a config whose phases each set their batch)."""
    phases = config.train.phases
    for override in overrides if phases else ():
        key = override.split("=", 1)[0].strip()
        for prefix, field in PHASE_SECTIONS.items():
            name = key[len(prefix):]
            if key.startswith(prefix) and all(name in getattr(phase, field) for phase in phases):
                raise ConfigError(f"override {key}: every phase sets its own {name} (train.phases[i].{field}."
                                  f"{name}), so this one would change nothing. Edit the phases in the config file, "
                                  "or drop them with train.phases=[]")


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: a run config needs none, and a few nested ones (a 300-byte file) expand to gigabytes
    wherever the value is walked or shown (a type error's message)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(f"line {mark.line + 1}: aliases (*name) are not accepted in a run config; write "
                                 "the value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        # PyYAML keeps the last of two equal keys: a second `optimizer:` block would replace the first unnoticed.
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.YAMLError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice (also on "
                                     f"line {seen[key] + 1}); keep one")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path, *, empty_ok: bool = False, kind: str | None = None) -> dict:
    """A YAML run config file as a dict of sections (pretraining, fine-tuning and embedder runs read it alike);
    `empty_ok`: an empty file is no sections, for run types whose every key has a default. A path that does not
    exist may name a config shipped with bertjax (`bertjax.shipped_configs`), of the run type `kind`."""
    from bertjax import shipped_configs

    path = shipped_configs.resolve(path, kind)
    if path.is_dir():
        raise FileNotFoundError(f"run config {path} is a directory: give a YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"run config {path} does not exist (nor is it one of {shipped_configs.describe(kind)})")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_NoAliasLoader)
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}); save the run config as UTF-8") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if raw is None and empty_ok:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the run config must be a mapping of sections, got {type(raw).__name__}")
    return raw


def run_config_from_dict(raw: Mapping) -> RunConfig:
    from bertjax.train.objectives import parse_options

    raw = dict(raw)
    data = raw.pop("data", None)
    objective = raw.pop("objective", None)
    config = parse_dataclass(RunConfig, raw, "")
    data_cls = data_config_class()
    try:
        options = parse_options(objective, parse_dataclass)
    except ConfigError:
        raise
    except ValueError as error:  # an unknown objective name
        raise ConfigError(str(error)) from None
    config = dataclasses.replace(config, data=parse_dataclass(data_cls, data or {}, "data"), objective=options)
    for i, phase in enumerate(config.train.phases):  # each phase's data must be a valid data config too
        parse_dataclass(data_cls, {**to_dict(config.data), **phase.data}, f"train.phases[{i}].data")
    return config


def apply_override(raw: dict, override: str) -> None:
    """Set `a.b.c=value` in the raw config mapping. The value is kept as an `OverrideText`: a string field takes it
    as written (`data.input=2024`, `data.anchor_prompt="query: "` after the shell's quoting), any other field its
    YAML reading (numbers, bools, lists); which one is decided by `parse_value`, which knows the field's type."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key=value (e.g. train.steps=100)")
    key, text = override.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {override!r}: empty part in key {key!r}")
    value = OverrideText(text)
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[:depth + 1])} is not a section")
        node = child
    node[parts[-1]] = value


class OverrideText(str):
    """A command-line override's value before its field's type is known. It is a `str` so that code looking at the
    raw mapping before parsing (the objective's name) reads it as written; `parse_value` replaces it by a plain
    string for string fields and by its YAML reading for every other field."""

    _NULLS = ("null", "~", "Null", "NULL")

    def as_string(self, optional: bool) -> str | None:
        """The text as written; `null`/`~` is None for an optional field; a fully quoted value is unquoted by YAML
        (`'" query"'` keeps its leading space)."""
        text = str(self)
        if optional and text.strip() in self._NULLS:
            return None
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            try:
                unquoted = yaml.safe_load(text)
            except yaml.YAMLError:
                return text
            return unquoted if isinstance(unquoted, str) else text
        return text

    def as_yaml(self) -> Any:
        try:
            return yaml.safe_load(str(self))
        except yaml.YAMLError:
            return str(self)


def _plain(value: Any) -> Any:
    """Override texts inside a free-form value (`model.overrides`, an objective's dict) read as YAML."""
    if isinstance(value, OverrideText):
        return value.as_yaml()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _string_typed(annotation: Any) -> tuple[bool, bool]:
    """(whether a field of this type takes text as written, whether it is optional): str, paths, Literals of
    strings, and those | None."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [arg for arg in args if arg is not type(None)]
        stringy = bool(rest) and all(_string_typed(arg)[0] for arg in rest)
        return stringy, len(rest) < len(args)
    if origin is Literal:
        return all(isinstance(arg, str) for arg in args), False
    return annotation in (str, Path), False


def _resolve_override(annotation: Any, value: OverrideText) -> Any:
    stringy, optional = _string_typed(annotation)
    if stringy:
        return value.as_string(optional)
    return value.as_yaml()


def to_dict(config: Any) -> Any:
    """A config as plain YAML-able values (for writing the resolved config next to a run)."""
    if dataclasses.is_dataclass(config):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (tuple, list)):
        return [to_dict(v) for v in config]
    if isinstance(config, dict):
        return {k: to_dict(v) for k, v in config.items()}
    return config


# Instructions to one start of a run rather than settings of it. A workdir records them as null, so that rerunning
# its config.yaml, or the same command after a preemption, resumes from the latest checkpoint instead of going back
# to the named step again (and setting aside everything trained since).
ONE_SHOT_KEYS = ("checkpoint.restore_step",)


def to_record(config: Any) -> dict:
    """`to_dict` of a run type's config as its workdir records it: the ONE_SHOT_KEYS it has are null."""
    record = to_dict(config)
    for dotted in ONE_SHOT_KEYS:
        *parents, leaf = dotted.split(".")
        section = record
        for parent in parents:
            section = section.get(parent) if isinstance(section, dict) else None
        if isinstance(section, dict) and leaf in section:
            section[leaf] = None
    return record


# ---------------------------------------------------------------------------------------------------------------
# Typed parsing of nested dataclasses, shared with the data config.

_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


_SHOWN = reprlib.Repr()  # (keyword arguments from Python 3.12)
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 3, 8, 8, 80, 80


def _shown(value: Any) -> str:
    """A config value as an error shows it: its repr, cut short (a long list is not worth a screenful)."""
    return _SHOWN.repr(value)


def parse_dataclass(cls: type, values: Any, path: str) -> Any:
    """Build dataclass `cls` from a mapping, checking keys and types; errors name the dotted key."""
    where = path or "the run config"
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(values).__name__}: {_shown(values)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ConfigError(f"unknown key {_join(path, str(unknown[0]))}; known keys here: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, field in fields.items():
        key = _join(path, name)
        if name in values:
            kwargs[name] = parse_value(hints[name], values[name], key)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key {key}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{where}: {error}") from None


def parse_value(annotation: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(value, OverrideText):
        value = _resolve_override(annotation, value)
    if annotation is Any:
        return _plain(value)
    if dataclasses.is_dataclass(annotation):
        return parse_dataclass(annotation, value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {list(args)}, got {_shown(value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_value(arg, value, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key} has the wrong type: {_shown(value)} "
                          f"(expected {annotation})")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {type(value).__name__}: {_shown(value)}")
        item = args[0] if args else Any
        items = [parse_value(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}: {_shown(value)}")
        return _plain(dict(value))
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {_shown(value)}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {_shown(value)}")
        return value
    if annotation is float:
        # PyYAML reads "1e-3" (no dot) as a string; accept it as the number everyone means.
        if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {_shown(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {_shown(value)}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {_shown(value)}")
        return value
    if isinstance(annotation, type):
        if not isinstance(value, annotation):
            raise ConfigError(f"{key} must be {annotation.__name__}, got {_shown(value)}")
        return value
    return value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# ---------------------------------------------------------------------------------------------------------------
# Cross-field checks (each names its key).

def _validate(config: RunConfig) -> None:
    from bertjax.config import get_config
    from bertjax.models.encoder import REMAT_POLICIES

    _check_model_fields(config.model.overrides, "model.overrides")
    if config.tokenizer.max_lines < 1:
        raise ConfigError(f"tokenizer.max_lines must be at least 1 (lines sampled to train the tokenizer), got "
                          f"{config.tokenizer.max_lines}")
    try:
        get_config(config.model.preset, **config.model.overrides)
    except ValueError as error:
        raise ConfigError(f"model: {error}") from None
    for i, phase in enumerate(config.train.phases):  # a phase's model fields go on top of model.overrides
        if phase.model:
            _check_model_fields(phase.model, f"train.phases[{i}].model")
            try:
                get_config(config.model.preset, **{**config.model.overrides, **phase.model})
            except ValueError as error:
                raise ConfigError(f"train.phases[{i}].model: {error}") from None
    if config.model.remat_policy not in REMAT_POLICIES:
        raise ConfigError(f"model.remat_policy must be one of {sorted(REMAT_POLICIES)}, got "
                          f"{config.model.remat_policy!r}")
    _validate_phases(config)
    if not 0 <= config.train.seed < 2**32:  # numpy's and SentencePiece's generators take 0 .. 2**32 - 1
        raise ConfigError(f"train.seed must be in [0, 2**32), got {config.train.seed}")
    peak = config.train.peak_tflops_per_device
    if peak is not None and peak <= 0:
        raise ConfigError(f"train.peak_tflops_per_device must be positive (a device's peak for MFU), or null to "
                          f"look it up by device kind (measured on CPUs), got {peak}")
    if config.eval.fill_mask_examples < 0:
        raise ConfigError(f"eval.fill_mask_examples must be >= 0 (0: none shown), got "
                          f"{config.eval.fill_mask_examples}")
    positive = {"tokenizer.vocab_size": config.tokenizer.vocab_size,
                "train.log_every": config.train.log_every, "eval.batches": config.eval.batches,
                "checkpoint.every": config.checkpoint.every, "checkpoint.keep": config.checkpoint.keep,
                "optimizer.learning_rate": config.optimizer.learning_rate,
                "optimizer.accumulation_steps": config.optimizer.accumulation_steps}
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    if config.eval.every < 0:
        raise ConfigError(f"eval.every must be >= 0 (0: only at start and end), got {config.eval.every}")
    _validate_optimizer(config.optimizer)
    for name in ("b1", "b2"):
        if not 0.0 <= getattr(config.optimizer, name) < 1.0:
            raise ConfigError(f"optimizer.{name} must be in [0, 1), got {getattr(config.optimizer, name)}")
    for pattern in config.optimizer.no_decay:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(f"optimizer.no_decay: bad regex {pattern!r}: {error}") from None
    for name in ("data", "fsdp", "tensor"):
        size = getattr(config.mesh, name)
        if size == 0 or size < -1:
            raise ConfigError(f"mesh.{name} must be positive or -1 (all remaining devices), got {size}")
    if [config.mesh.data, config.mesh.fsdp, config.mesh.tensor].count(-1) > 1:
        raise ConfigError("mesh: at most one of data, fsdp, tensor may be -1")
    _validate_schedule(config.schedule)



def _check_model_fields(values: Mapping, where: str) -> None:
    """Every key of `values` (model.overrides, a phase's model) must be a field of EncoderConfig."""
    from bertjax.config import EncoderConfig

    fields = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = [key for key in values if key not in fields]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), sorted(fields), n=1)
        raise ConfigError(f"unknown key {where}.{unknown[0]}"
                          f"{f' (did you mean {close[0]}?)' if close else ''}; {where} takes the fields of "
                          "bertjax.config.EncoderConfig")


def _validate_optimizer(optimizer: OptimizerConfig) -> None:
    """Values optax takes without complaint but that train wrongly: clip_by_global_norm(-1) flips the gradient's
    sign (gradient ascent), a negative weight decay grows the weights, eps 0 divides by zero."""
    check_grad_clip(optimizer.clip_global_norm, "optimizer.clip_global_norm")
    if optimizer.weight_decay < 0:
        raise ConfigError(f"optimizer.weight_decay must be >= 0, got {optimizer.weight_decay}")
    if optimizer.eps <= 0:
        raise ConfigError(f"optimizer.eps must be positive, got {optimizer.eps}")


def check_grad_clip(value: float | None, key: str) -> None:
    """A global-norm clipping threshold must be positive or null (no clipping): optax scales the gradient by
    value / norm, so a negative value reverses it and 0 zeroes it. Shared by fine-tuning and embedder runs."""
    if value is not None and value <= 0:
        raise ConfigError(f"{key} must be positive (or null: no clipping), got {value}")


def _validate_phases(config: RunConfig) -> None:
    """Phases are all fractions of train.steps or all token budgets (then train.steps is left out)."""
    phases = config.train.phases
    if config.train.steps is not None and config.train.steps <= 0:
        raise ConfigError(f"train.steps must be positive, got {config.train.steps}")
    by_tokens = [phase.tokens is not None for phase in phases]
    for i, phase in enumerate(phases):
        if (phase.fraction is None) == (phase.tokens is None):
            raise ConfigError(f"train.phases[{i}]: give exactly one of fraction and tokens")
        length = phase.fraction if phase.tokens is None else phase.tokens
        if length <= 0:
            raise ConfigError(f"train.phases[{i}].{'fraction' if phase.tokens is None else 'tokens'} must be "
                              f"positive, got {length}")
        if phase.learning_rate is not None and phase.learning_rate <= 0:
            raise ConfigError(f"train.phases[{i}].learning_rate must be positive, got {phase.learning_rate}")
        if phase.schedule is not None:
            schedule = parse_dataclass(ScheduleConfig, phase.schedule, f"train.phases[{i}].schedule")
            _validate_schedule(schedule, f"train.phases[{i}].schedule")
        warmup = phase.batch_warmup
        if warmup is not None and (warmup.start <= 0 or warmup.tokens <= 0):
            raise ConfigError(f"train.phases[{i}].batch_warmup: start and tokens must be positive, got {warmup}")
    if any(by_tokens) and not all(by_tokens):
        raise ConfigError("train.phases: give every phase a fraction of train.steps or every phase a token budget, "
                          "not a mix")
    if all(by_tokens) and phases:
        if config.train.steps is not None:
            raise ConfigError("train.steps: leave it out when the phases have token budgets (the steps follow from "
                              "them and the batch sizes)")
    elif config.train.steps is None:
        raise ConfigError("missing required key train.steps (or give every train.phases entry a token budget)")
    if phases and not any(by_tokens):
        total = sum(phase.fraction for phase in phases)
        if abs(total - 1.0) > 1e-9:
            raise ConfigError(f"train.phases: fractions must sum to 1, got {total}")


# ScheduleConfig fields that only some schedules read, by the keyword of bertjax.train.schedules' builders.
_SCHEDULE_KEYWORDS = {"decay": "decay", "decay_shape": "decay_shape", "final_lr_ratio": "final", "total": "total"}


def _validate_schedule(schedule: ScheduleConfig, where: str = "schedule") -> None:
    import inspect

    from bertjax.train.schedules import SCHEDULES

    if schedule.name not in SCHEDULES:
        raise ConfigError(f"{where}.name: unknown schedule {schedule.name!r}; known: {sorted(SCHEDULES)}")
    reads = inspect.signature(SCHEDULES[schedule.name]).parameters
    for field, keyword in _SCHEDULE_KEYWORDS.items():
        value, default = getattr(schedule, field), getattr(ScheduleConfig, field)
        if keyword not in reads and value != default:
            readers = sorted(name for name, build in SCHEDULES.items()
                             if keyword in inspect.signature(build).parameters)
            raise ConfigError(f"{where}.{field}: {value!r} does nothing for the {schedule.name!r} schedule (it is read "
                              f"by {readers}); remove it, or choose one of those schedules")
    lengths = {"warmup": schedule.warmup, "decay": schedule.decay, "total": schedule.total}
    for name, value in lengths.items():
        if value is not None and value < 0:
            raise ConfigError(f"{where}.{name} must be >= 0, got {value}")
    if not 0.0 <= schedule.final_lr_ratio <= 1.0:
        raise ConfigError(f"{where}.final_lr_ratio must be in [0, 1], got {schedule.final_lr_ratio}")
    if schedule.unit == "fraction":
        for name, value in lengths.items():
            if value is not None and value > 1:
                raise ConfigError(f"{where}.{name} ({value}) is a fraction of the run (schedule.unit: fraction), so "
                                  f"at most 1; for a length in steps set schedule.unit: steps")
