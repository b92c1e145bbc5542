"""What a pretraining workdir holds, and keeping it whole: one run at a time, no mistaken rerun written over it,
no half-made directory left by a run that failed while setting up.

- `exclusive` (a decorator of `pretrain`) takes the workdir's lock file, `bertjax.lock`, holding the host and pid
  of the run; a second run on the same workdir fails at once with an error naming the holder. A lock left by a
  process that died (same host, pid no longer running) is taken over with a warning. The lock is released when
  the run ends, whatever the way. A local `checkpoint.directory` outside the workdir gets the same lock, so two
  runs with different workdirs cannot write one checkpoint directory. When a run fails before its setup completed
  (no `config.yaml` yet) in a workdir it created or found empty, what it wrote there is removed again.
- `check_pretraining_workdir` (run by `exclusive` before the workdir is made or locked) refuses a workdir that holds
  another kind of run (fine-tuning, embedder) and a `config.yaml` bertjax did not write: the workdir's
  `config.yaml` is bertjax's record of the resolved run, rewritten by every run, so a hand-written config kept
  there (`--config exp/config.yaml --workdir exp`) would be replaced. It is bertjax's when the workdir holds a run
  (`model_config.json`, written with it, or a checkpoint). The kernels the model names must run on this backend.
- `check_rerun` compares the requested run config with the workdir's `config.yaml` before anything is written:
  another model is an error naming the differing fields; other changes (more steps, another evaluation
  interval) are allowed and listed in a warning. Only checkpoints pin the model: a workdir whose run saved none
  (it failed in its first steps) starts over with the new settings, with a note (and a new tokenizer when the
  settings it is made from changed).
- `check_same_identity` refuses a fine-tuning or embedder rerun on another model or data file, or on a data file
  whose bytes changed at the same path (`data_identity` records each file's size and sha256); `check_resumable`
  refuses a change outside the settings a run type lets a resume change, naming each key.
- `check_optimizer_state` refuses optimizer settings whose state the checkpoints cannot be restored into (another
  optimizer, clipping turned on or off), naming the dotted key.
- `check_model_config` does the same for `model_config.json` once the model config is built (it depends on the
  tokenizer), and `record_run` writes both files only after the state was restored or created.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable

import jax
import yaml

from bertjax.config import EncoderConfig
from bertjax.data import remote
from bertjax.file_digest import sha256_of
from bertjax.train.run_config import (ONE_SHOT_KEYS, ConfigError, OptimizerConfig, RunConfig, parse_dataclass,
                                      run_config_from_dict, to_dict, to_record)

log = logging.getLogger(__name__)

from bertjax.model_dirs import (CHECKPOINTS_DIR, MODEL_CONFIG_FILE, RUN_CONFIG_FILE as CONFIG_FILE,  # noqa: E402
                                TOKENIZER_DIR, with_family)
LOCK_FILE = "bertjax.lock"
# The record files of the other run types that keep a config.yaml in their workdir (bertjax.finetune.trainer,
# bertjax.embeddings.training), and what they are called in errors.
# The record each kind of run writes beside its config.yaml: what kind of run a workdir holds.
RUN_FILES = {MODEL_CONFIG_FILE: "bertjax pretrain", "finetune.json": "bertjax finetune",
             "train_embedder.json": "bertjax train-embedder"}
# What each command keeps in its workdir, which is therefore a local directory (the error for a bucket path), and
# whether its checkpoints can go to a bucket instead (checkpoint.directory; glue's grid points share one config).
LOCAL_CONTENTS = {"bertjax pretrain": "its lock, config.yaml, the tokenizer, metrics.jsonl and TensorBoard events",
                  "bertjax finetune": "config.yaml, metrics.jsonl, results.json and the best model (best/)",
                  "bertjax train-embedder": "its lock, config.yaml, metrics.jsonl and the trained model (model/)",
                  "bertjax glue": "glue.json, the prepared task data and a fine-tuning run per task and grid point"}
CHECKPOINTS_IN_A_BUCKET = tuple(RUN_FILES.values())  # every command with a run file; not glue
# What each run type writes into its workdir besides its record and config.yaml (bertjax.train.metrics,
# bertjax.finetune.report and trainer, bertjax.embeddings.training), by record: a workdir that holds no run but one of
# these is a directory of the user's, whose file the run would replace. (Not pretraining's tokenizer/: a run that
# finds one keeps it, and on a pod every host's workdir holds a copy before process 0 writes the record.)
RUN_OUTPUTS = {MODEL_CONFIG_FILE: ("metrics.jsonl", "tensorboard", "loss.png"),
               "finetune.json": ("metrics.jsonl", "tensorboard", "results.json", "finetune.png", "best"),
               "train_embedder.json": ("metrics.jsonl", "tensorboard", "loss.png", "model")}
# Run-config keys the workdir's tokenizer is made from (tokenizer.path, or one trained on data.input's train split).
TOKENIZER_KEYS = ("tokenizer", "data.input", "data.text_format", "data.text_field", "data.eval_fraction",
                  "train.seed")

# Data settings that lay out the documents in windows and rows (bertjax.data.pipeline): a checkpoint's data position
# is a window and row of that layout, which a resume with other values reads in the new one.
DATA_LAYOUT_KEYS = ("input", "text_format", "text_field", "eval_fraction", "seq_len", "packing", "window_documents",
                    "shuffle", "sentence_objective", "short_seq_prob")

# Run-config fields a workdir's checkpoints depend on: resuming with other values would restore a state of another
# shape. Dotted prefixes. (Tokenizer settings may differ: a resumed run uses the tokenizer saved in the workdir.)
FIXED_ON_RESUME = ("model.preset", "model.overrides", "objective.name")


class WorkdirBusy(ValueError):
    """Another process holds the lock of the workdir (or of the checkpoint.directory)."""


# ---------------------------------------------------------------------------------------------------------------
# The lock.

class WorkdirLock:
    """A lock file created with O_EXCL (atomic on local and NFSv3+ filesystems) holding {host, pid, since}.
    `what` names the directory in messages: "workdir", or "checkpoint.directory" for the lock a run takes in a
    checkpoint directory of its own choosing, which another run's workdir lock does not cover."""

    def __init__(self, workdir: Path, what: str = "workdir"):
        self.path = Path(workdir) / LOCK_FILE
        self.what = what
        self.held = False

    def acquire(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        for _ in range(10):  # a few rounds: the holder may be writing its lock or releasing it right now
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read_holder()
                if holder is None:
                    time.sleep(0.1)
                    continue
                if holder.get("host") == me["host"] and not _process_alive(holder.get("pid")):
                    log.warning("%s %s: taking over the lock of process %s on %s, which is no longer running",
                                self.what, self.path.parent, holder.get("pid"), holder.get("host"))
                    self.path.unlink(missing_ok=True)
                    continue
                raise WorkdirBusy(
                    f"{self.what} {self.path.parent} is in use by process {holder.get('pid')} on host "
                    f"{holder.get('host')} (since {holder.get('since')}). Wait for that run to end, or use another "
                    f"{self.what}; if that process is gone, delete {self.path}") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return
        raise WorkdirBusy(f"{self.what} {self.path.parent}: cannot take the lock {self.path} (unreadable lock file)")

    def _read_holder(self) -> dict | None:
        try:
            holder = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return holder if isinstance(holder, dict) else None

    def release(self) -> None:
        if self.held:
            holder = self._read_holder()
            if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                self.path.unlink(missing_ok=True)
            self.held = False


def _process_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def check_local_workdir(workdir: str | Path, command: str) -> None:
    """Refuse a bucket path ("gs://...") as the workdir of `command` (a key of LOCAL_CONTENTS), before anything is
    created: taken as a local path it would become a directory `gs:` here and fail only at the first write. Commands
    with checkpoints (CHECKPOINTS_IN_A_BUCKET) are told to put those, the part worth keeping, in the bucket with
    checkpoint.directory."""
    text = str(workdir)
    if "://" in text:
        where = (f" and put the checkpoints in the bucket with checkpoint.directory={text.rstrip('/')}/checkpoints"
                 if command in CHECKPOINTS_IN_A_BUCKET else "")
        raise ConfigError(f"--workdir {text} is a bucket path: `{command}` keeps {LOCAL_CONTENTS[command]} in a "
                          f"local directory. Give a local --workdir{where}")


def exclusive(pretrain: Callable | None = None, *, check: Callable | None = None,
              record: str | None = None) -> Callable:
    """Decorate `pretrain(config, workdir, ...)`: hold the workdir's lock while it runs (process 0 only: the other
    hosts of a multi-host run share process 0's run), and remove a half-made workdir if setup fails.
    `@exclusive(check=f)` first runs `f(workdir, config, config_path)`, before the workdir is made or locked
    (`check_pretraining_workdir`, `check_workdir_is_for`); `config_path`, a keyword of the decorated function's
    callers, names the --config file in its errors. `record`: the run file of the decorated run's kind (RUN_FILES),
    which names it when the workdir is refused as a bucket path."""
    if pretrain is None:
        return functools.partial(exclusive, check=check, record=record)

    @functools.wraps(pretrain)
    def run(config, workdir: str | Path, *args, config_path: str | Path | None = None, **kwargs):
        if record is not None:
            check_local_workdir(workdir, RUN_FILES[record])
        directory = _configured_checkpoint_directory(config)
        if directory is not None:  # a bucket needs its filesystem package: say so now, not at the first read
            remote.require_filesystem(directory, "checkpoint.directory")
        workdir = Path(workdir).absolute()
        if workdir.exists() and not workdir.is_dir():
            raise ConfigError(f"--workdir {workdir} is a file, not a directory: give a directory (new or a run's)")
        if check is not None:
            check(workdir, config, config_path)
        if jax.process_index() != 0:
            return pretrain(config, workdir, *args, **kwargs)
        existed_before = set(workdir.iterdir()) if workdir.is_dir() else None
        workdir.mkdir(parents=True, exist_ok=True)
        lock = WorkdirLock(workdir)
        lock.acquire()
        checkpoints = _checkpoint_directory(config, workdir)
        checkpoints_existed = checkpoints is not None and checkpoints.exists()
        checkpoints_lock = None
        try:
            if checkpoints is not None:
                checkpoints.mkdir(parents=True, exist_ok=True)
                checkpoints_lock = WorkdirLock(checkpoints, "checkpoint.directory")
                checkpoints_lock.acquire()
            return pretrain(config, workdir, *args, **kwargs)
        except BaseException:
            _remove_half_made(workdir, existed_before, lock.path)
            raise
        finally:
            if checkpoints_lock is not None:
                checkpoints_lock.release()
            if checkpoints is not None and not checkpoints_existed and checkpoints.is_dir() \
                    and not any(checkpoints.iterdir()):
                checkpoints.rmdir()
            lock.release()
            if existed_before is None and workdir.is_dir() and not any(workdir.iterdir()):
                workdir.rmdir()  # created here and left empty by a failed setup

    return run


def _configured_checkpoint_directory(config: Any) -> str | None:
    """checkpoint.directory of any run type's config (None: the workdir's checkpoints/)."""
    return getattr(getattr(config, "checkpoint", None), "directory", None)


def _checkpoint_directory(config: Any, workdir: Path) -> Path | None:
    """The run's checkpoint.directory when it needs a lock of its own: a local one outside the workdir. (The
    workdir's checkpoints/ is covered by the workdir lock.) A bucket has no atomic create-if-absent through
    etils.epath, so a directory there is not locked: docs/guarantees.md says what holds instead."""
    directory = _configured_checkpoint_directory(config)
    if directory is None or "://" in str(directory):
        return None
    directory = Path(directory).absolute()
    return None if directory.resolve() == workdir.resolve() else directory


def _remove_half_made(workdir: Path, existed_before: set[Path] | None, lock_path: Path) -> None:
    """After a failure before `record_run` (no config.yaml): remove what this run added to a new or empty workdir."""
    if (workdir / CONFIG_FILE).exists() or existed_before:
        return
    for path in workdir.iterdir():
        if path != lock_path:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    log.warning("the run failed while setting up; removed what it had written to %s", workdir)


# ---------------------------------------------------------------------------------------------------------------
# What the workdir holds.

def has_checkpoint(workdir: Path, checkpoint: Any) -> bool:
    """Whether the run's checkpoint directory (`checkpoint`: a CheckpointConfig) holds a step, or
    checkpoint.restore_step names one: only then does the workdir's run pin the model. Nothing is created."""
    if checkpoint.restore_step is not None:
        return True
    directory = checkpoint.directory or Path(workdir) / CHECKPOINTS_DIR
    if "://" in str(directory):
        from etils import epath
        directory = epath.Path(directory)
    else:
        directory = Path(directory)
    try:
        return directory.is_dir() and any(path.name.isdigit() for path in directory.iterdir())
    except OSError:  # unreadable: as if it held one (the restore's own checks then say what is wrong)
        return True


def holds_run(workdir: Path, checkpoint: Any) -> bool:
    """Whether the workdir holds a bertjax run of any type: a record file written with its config.yaml
    (model_config.json, finetune.json, train_embedder.json) or a checkpoint."""
    return any((Path(workdir) / name).is_file() for name in RUN_FILES) or has_checkpoint(workdir, checkpoint)


def check_config_is_ours(workdir: Path, has_run: bool, config_path: str | Path | None = None) -> None:
    """The workdir's config.yaml is bertjax's record of the resolved run (its settings with the command-line
    overrides, no comments), rewritten by every run: refuse to start where such a file exists but the workdir holds
    no run (`has_run` False: see `holds_run`), since bertjax did not write it. `config_path`: the --config given,
    named when it is that very file. A run's own config.yaml given back as --config (resuming) is fine."""
    saved = Path(workdir) / CONFIG_FILE
    if has_run or not saved.exists():
        return
    if config_path is not None and Path(config_path).exists() and os.path.samefile(saved, config_path):
        raise ConfigError(f"--config {config_path} is the file bertjax writes its resolved config to "
                          f"({saved}: each run replaces it with the settings it ran, command-line overrides "
                          "included and comments dropped); keep your config outside the workdir or use another "
                          "--workdir")
    raise ConfigError(f"{saved} was not written by bertjax: the workdir holds no bertjax run (no checkpoint, no "
                      f"{' or '.join(RUN_FILES)}), and bertjax writes the resolved config "
                      "of its run there, replacing what the file holds. Keep your config outside the workdir or use "
                      "another --workdir")


def check_workdir_is_for(workdir: Path, own_record: str, checkpoint: Any,
                         config_path: str | Path | None = None) -> None:
    """Before anything is written: the workdir holds no run of another kind (the record of each kind, RUN_FILES;
    `own_record` is this run's) and no config.yaml of the user's (the --config file itself, `config_path`, named
    as such)."""
    workdir = Path(workdir)
    for name, what in RUN_FILES.items():
        if name != own_record and (workdir / name).is_file():
            raise ConfigError(f"workdir {workdir} holds a run of `{what}` ({name}), not one of "
                              f"`{RUN_FILES[own_record]}`; give another --workdir")
    has_run = holds_run(workdir, checkpoint)
    check_config_is_ours(workdir, has_run, config_path)
    found = [name for name in RUN_OUTPUTS[own_record] if (workdir / name).exists()] if not has_run else []
    if found:
        raise ConfigError(f"workdir {workdir} holds no bertjax run (no checkpoint, no {' or '.join(RUN_FILES)}) but "
                          f"holds {', '.join(found)}, which a run writes there, replacing what is there; give a new "
                          "or empty --workdir")


def check_pretraining_workdir(workdir: Path, config: RunConfig, config_path: str | Path | None = None) -> None:
    """`check_workdir_is_for` a pretraining run, and the model's kernels run here
    (bertjax.train.setup.check_kernels_run_on)."""
    from bertjax.train.setup import check_kernels_run_on

    check_workdir_is_for(workdir, MODEL_CONFIG_FILE, config.checkpoint, config_path)
    check_kernels_run_on(config, jax.default_backend())


# ---------------------------------------------------------------------------------------------------------------
# Rerun checks and the files that describe the run.

def _plain(config: Any) -> dict:
    """A run type's config as its workdir file holds it (through YAML: tuples compare equal to lists read back)."""
    return yaml.safe_load(yaml.safe_dump(to_dict(config), sort_keys=False))


def differences(held: Any, requested: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, held value, requested value) of every leaf that differs, keys missing on one side included."""
    if isinstance(held, dict) and isinstance(requested, dict):
        found = []
        for key in list(held) + [k for k in requested if k not in held]:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            found += differences(held.get(key, "<absent>"), requested.get(key, "<absent>"), dotted)
        return found
    return [] if held == requested else [(prefix, held, requested)]


def recorded_differences(workdir: Path, held: Any, config: Any,
                         parse: Callable[[dict], Any]) -> list[tuple[str, Any, Any]]:
    """`differences` between the settings a workdir recorded (`held`, as its file holds them) and `config`.

    A key the record lacks was added to bertjax after the workdir was written, and its default keeps what the older
    version did (docs/guarantees.md, "Older workdirs resume"): read through the run type's own loader (`parse`), it
    takes that default, is no difference, and the resume says which keys it filled in. A record the loader refuses
    (a key renamed or removed since) is compared as it stands."""
    if isinstance(held, dict):
        try:
            parsed = _plain(parse(copy.deepcopy(held)))
        except (ConfigError, TypeError, ValueError):
            parsed = None
        if parsed is not None:
            added = [key for key, before, _ in differences(held, parsed) if before == "<absent>"]
            if added and jax.process_index() == 0:
                log.warning("workdir %s was written by an older bertjax, before %s: %s its default", workdir,
                            ", ".join(added), "each takes" if len(added) > 1 else "it takes")
            held = parsed
    # A one-shot key is no setting to compare (an older bertjax recorded restore_step as given).
    return [d for d in differences(held, _plain(config)) if d[0] not in ONE_SHOT_KEYS]


def describe_differences(found: list[tuple[str, Any, Any]]) -> str:
    """Each differing dotted key with both values, for errors and warnings about a rerun (every run type)."""
    return "; ".join(f"{key}: {held!r} in the workdir, {requested!r} requested" for key, held, requested in found)


def check_rerun(workdir: Path, config: RunConfig, resumable: bool = True) -> list[tuple[str, Any, Any]]:
    """Before writing anything: refuse a run whose model differs from the one the workdir's checkpoints hold.

    `resumable`: whether the workdir holds a checkpoint (`has_checkpoint`). Without one nothing pins the model: the
    run starts over with the requested settings, says so when they differ, and the tokenizer saved by the earlier
    run is removed (process 0) when the settings it was made from changed, so that `prepare_tokenizer` makes it
    anew (as train-embedder's workdirs do). Returns the differences a resume goes on with (dotted key, the
    workdir's value, the requested one).
    """
    saved = Path(workdir) / CONFIG_FILE
    if not saved.is_file():
        if resumable and jax.process_index() == 0:  # checkpoints elsewhere (checkpoint.directory), records gone
            log.warning("resuming from the checkpoints of %s into a workdir without its records (config.yaml, "
                        "metrics.jsonl): the settings cannot be compared with the run's, and the metrics, "
                        "TensorBoard events and loss plot start at the resumed step (a host's disk recreated, as "
                        "after a preempted TPU slice? keep the workdir on storage that outlives it)",
                        config.checkpoint.directory or Path(workdir) / "checkpoints")
        return []
    try:
        held = yaml.safe_load(saved.read_text())
    except yaml.YAMLError as error:
        if not resumable:  # a damaged record of a run that saved nothing: nothing to keep
            _start_over(workdir, [(CONFIG_FILE, "<damaged>", "<this run's>")], config)
            return []
        raise ConfigError(f"{saved} is not valid YAML ({yaml_problem(error)}); this workdir's run config is "
                          "damaged") from None
    found = recorded_differences(workdir, held, config, run_config_from_dict)
    if not resumable:
        if found:
            _start_over(workdir, found, config)
        return []
    # An override the workdir's run did not give may spell out what its model already is (a field added to
    # EncoderConfig since, as check_model_config's error suggests): check_model_config, once the model is built,
    # refuses it if the model then differs from the one the checkpoints hold.
    fixed = [d for d in found if under(d[0], FIXED_ON_RESUME)
             and not (under(d[0], ("model.overrides",)) and d[0] != "model.overrides" and d[1] == "<absent>")]
    if fixed:
        raise ConfigError(f"workdir {workdir} holds a run with another model ({describe_differences(fixed)}). "
                          f"Rerun with the workdir's settings ({saved}) to resume it, or give another --workdir")
    check_optimizer_state(workdir, held.get("optimizer") if isinstance(held, dict) else None, config.optimizer,
                          {f.name: f"optimizer.{f.name}" for f in dataclasses.fields(config.optimizer)})
    if found and jax.process_index() == 0:
        tokenizer_note = any(key.startswith("tokenizer.") for key, _, _ in found)
        relaid = [key for key, _, _ in found if key == "train.seed" or key.rsplit(".", 1)[-1] in DATA_LAYOUT_KEYS
                  and (key.startswith("data.") or ".data." in key)]
        log.warning("resuming %s with changed settings: %s%s%s", workdir, describe_differences(found),
                    " (the tokenizer saved in the workdir is used)" if tokenizer_note else "",
                    f". The saved data position is a window and row of the documents as the old {', '.join(relaid)} "
                    "laid them out: the run goes on from that window and row of the new layout, so documents are "
                    "skipped or seen again" if relaid else "")
    return found


def _start_over(workdir: Path, found: list[tuple[str, Any, Any]], config: RunConfig) -> None:
    if jax.process_index() != 0:
        return
    tokenizer = Path(workdir) / TOKENIZER_DIR
    keys = TOKENIZER_KEYS if config.tokenizer.path is None else ("tokenizer",)
    remake = tokenizer.is_dir() and any(key == k or key.startswith(k + ".") or key == CONFIG_FILE
                                        for key, _, _ in found for k in keys)
    if remake:
        shutil.rmtree(tokenizer)
    log.warning("workdir %s holds no checkpoint of its earlier run: starting over with these settings (changed: "
                "%s)%s", workdir, describe_differences(found),
                "; its tokenizer is made anew" if remake else "")


def yaml_problem(error: yaml.YAMLError) -> str:
    """One line for a YAML parse error (PyYAML's own message spans several, with the source quoted)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def path_identity(path: str | Path | None) -> str | None:
    """A data or model path as a run file records it: resolved, so the same file reached through "..", a link or
    another working directory is the same run."""
    return None if path is None else str(Path(path).resolve())


# The identity key of the data files' fingerprints ({file key: {"size", "sha256"}}): a file rewritten at the same
# path (regenerated, edited) is another data set, which its path alone would not tell.
FINGERPRINTS = "fingerprints"


def file_fingerprint(path: str | Path | None) -> dict | None:
    """Size and sha256 of a data file's bytes, read once per run (the fine-tuning and embedder files are small).
    None for no file, or for a path that is not a file: the run's reader then names the problem."""
    if path is None or not Path(path).is_file():
        return None
    return {"size": Path(path).stat().st_size, "sha256": sha256_of(path)}


def data_identity(files: dict[str, str | Path | None]) -> dict[str, Any]:
    """The identity entries of a run's data files (key -> path): each resolved path, and under FINGERPRINTS each
    file's content fingerprint."""
    return {**{key: path_identity(path) for key, path in files.items()},
            FINGERPRINTS: {key: file_fingerprint(path) for key, path in files.items()}}


def read_run_file(path: Path) -> dict:
    """A workdir's JSON record of its run (fine-tuning's, the embedder's), a damaged one named as such."""
    try:
        held = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not valid JSON ({error}); this workdir's record of its run is damaged: "
                          "restore it, or use a new --workdir") from None
    if not isinstance(held, dict):
        raise ConfigError(f"{path}: expected a JSON object; this workdir's record of its run is damaged")
    return held


def check_same_identity(workdir: Path, held: dict, identity: dict[str, Any], paths: tuple[str, ...]) -> None:
    """Refuse a rerun on another model or data file (`identity`, with `paths` the keys that name files: compared
    resolved on both sides, since older workdirs recorded them unresolved), or on a data file whose contents
    changed (`data_identity`'s fingerprints)."""
    for key, value in identity.items():
        if key == FINGERPRINTS:
            continue
        before = held.get(key)
        if key in paths and isinstance(before, str) and value is not None:
            before, value = path_identity(before), path_identity(value)
        if before != value:
            raise ConfigError(f"workdir {workdir} holds a run with another {key} ({held.get(key)!r}, now "
                              f"{identity[key]!r}); rerun it unchanged to resume, or use a new --workdir")
    check_same_contents(workdir, held.get(FINGERPRINTS), identity.get(FINGERPRINTS), identity)


def check_same_contents(workdir: Path, held: Any, fingerprints: Any, identity: dict[str, Any]) -> None:
    """Refuse a data file whose bytes differ from those the workdir's run trained on, naming the file. Compared only
    where both the workdir's record and this run have a file's fingerprint: workdirs written before fingerprints
    were recorded resume as they did (and record them from then on)."""
    if not isinstance(held, dict) or not isinstance(fingerprints, dict):
        return
    for key, now in fingerprints.items():
        before = held.get(key)
        if isinstance(before, dict) and isinstance(now, dict) and before != now:
            raise ConfigError(f"workdir {workdir} holds a run trained on another content of its {key} file "
                              f"{identity.get(key)} ({_described(before)} then, {_described(now)} now): the file "
                              "changed since; restore it to resume, or use a new --workdir")


def _described(fingerprint: dict) -> str:
    return f"{fingerprint.get('size')} bytes, sha256 {str(fingerprint.get('sha256'))[:12]}"


def under(key: str, prefixes: tuple[str, ...]) -> bool:
    """Whether the dotted `key` is one of `prefixes` or inside one of them (a whole section: "checkpoint")."""
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def check_resumable(workdir: Path, found: list[tuple[str, Any, Any]], resumable: tuple[str, ...]) -> None:
    """Refuse a resume whose settings differ from the workdir's (`found`: `differences`) outside `resumable`, the
    settings a run type lets a resume change, naming each other key with the workdir's and the requested value.
    (Fine-tuning's and the embedder's rule: what decides the data of each step, the schedule or the optimizer's
    trajectory would not continue the run the checkpoints hold.)"""
    fixed = [d for d in found if not under(d[0], resumable)]
    if fixed:
        raise ConfigError(f"workdir {workdir} holds a run with other settings ({describe_differences(fixed)}); only "
                          f"{', '.join(resumable)} may change on resume. Rerun with the workdir's settings to resume "
                          "it, or use a new --workdir")


def check_optimizer_state(workdir: Path, held: Any, requested: OptimizerConfig, keys: dict[str, str]) -> None:
    """Refuse optimizer settings whose state the workdir's checkpoints cannot be restored into (another optimizer,
    clipping turned on or off), naming the dotted key (`keys`: OptimizerConfig field -> the run config's key), before
    anything is restored: restoring would fail on a sound checkpoint. `held` is the workdir's raw optimizer
    settings (as config.yaml holds them, or as the run type maps its own keys to them)."""
    if isinstance(held, dict):
        try:
            held = parse_dataclass(OptimizerConfig, held, "optimizer")
        except ConfigError:  # written by another version: the restore's own structure check still applies
            return
    if not isinstance(held, OptimizerConfig):
        return
    from bertjax.train.optimizers import state_changing_fields

    changed = [(keys[name], getattr(held, name), getattr(requested, name))
               for name in state_changing_fields(held, requested)]
    if changed:
        raise ConfigError(f"workdir {workdir} holds checkpoints of another optimizer state "
                          f"({describe_differences(changed)}): "
                          "these settings change what the optimizer stores, so they cannot change on resume. Rerun "
                          "with the workdir's values to resume, or give another --workdir")


def check_model_config(workdir: Path, description: dict) -> None:
    """The built model's description (model_config.json: its head and config, which follows the tokenizer) must
    equal the one the workdir's checkpoints hold."""
    saved = Path(workdir) / MODEL_CONFIG_FILE
    if not saved.is_file():
        return
    try:
        held = json.loads(saved.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{saved} is not valid JSON ({error}); this workdir's model description is damaged") \
            from None
    if isinstance(held, dict) and "frozen" not in held:  # written before frozen parameters were recorded
        description = {k: v for k, v in description.items() if k != "frozen"}
    # Frozen parameters (a teacher) are the same by their fingerprint wherever they are stored now.
    held_frozen = held.get("frozen") if isinstance(held, dict) else None
    held_frozen = held_frozen if isinstance(held_frozen, dict) else {}
    found = differences(_comparable(_frozen_by_contents(held)), _comparable(_frozen_by_contents(description)))
    if any(key.startswith("frozen.") for key, _, _ in found):
        raise ConfigError(f"workdir {workdir} was trained against other frozen parameters than this run loads (a "
                          f"teacher with another fingerprint; the run started from {held_frozen.get('teacher')}): "
                          "give objective.teacher the teacher it started with, or another --workdir")
    if found:
        fields = {f.name for f in dataclasses.fields(EncoderConfig)}
        # Nested options (longformer.sep_token_id) are overrides too: model.overrides.longformer.sep_token_id=2.
        keep = [f"model.overrides.{key[len('config.'):]}={json.dumps(held_value)}" for key, held_value, _ in found
                if key.startswith("config.") and key[len("config."):].split(".")[0] in fields
                and isinstance(held_value, (bool, int, float, str, type(None)))]
        hint = f"resume it with the workdir's model ({' '.join(keep)}), or " if len(keep) == len(found) else ""
        raise ConfigError(f"workdir {workdir} holds another model ({describe_differences(found)}); {hint}"
                          "give another --workdir")


def _frozen_by_contents(description: dict) -> dict:
    """A model description whose frozen parameters are compared by fingerprint, not by where they were read."""
    frozen = description.get("frozen") if isinstance(description, dict) else None
    if not isinstance(frozen, dict):
        return description
    return {**description, "frozen": {key: value for key, value in frozen.items() if key != "teacher"}}


def _comparable(description: dict) -> dict:
    """A model description with its config in `EncoderConfig.resolved_dict` form: fields the file predates take
    their defaults (which keep the math of the models written before them; the family and its head fields,
    `model_dirs.with_family`) and a "None: as X" field compares equal to X spelled out. A config that no longer
    parses is compared as written."""
    description = json.loads(json.dumps(description))
    config = with_family(description.get("config")) if isinstance(description, dict) else None
    if isinstance(config, dict):
        try:
            config = json.loads(json.dumps(EncoderConfig.from_dict(config).resolved_dict()))
        except (TypeError, ValueError):
            return description
        description = {**description, "config": config}
    return description


def record_run(workdir: Path, config: RunConfig, description: dict) -> None:
    """Write config.yaml and model_config.json (process 0; call once the state was restored or created)."""
    if jax.process_index() != 0:
        return
    _write_atomically(Path(workdir) / CONFIG_FILE, yaml.safe_dump(to_record(config), sort_keys=False))
    _write_atomically(Path(workdir) / MODEL_CONFIG_FILE, json.dumps(description, indent=1))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
