"""Checkpoints with orbax: the train state (params, optimizer state, step) and each process's data-iterator state.

Layout under `<workdir>/checkpoints/<step>/`: `state/` (orbax arrays, each process writing its own shards),
`data/process_<i>-of-<n>.json` (the iterator position of process i, so every host resumes on its own next batch;
a run resumed on another number of processes gets all n positions and redistributes them, bertjax.data.reshard)
and `checksums.json` (sha256 of every file, written once the save has completed: the training loop calls
`record_finished` after every step, which costs a flag read while a save is in flight).

Orbax writes a step into a temporary directory and renames it when complete, so a process killed mid-save
(`kill -9`, preemption) leaves the previous checkpoints intact and the half-written one invisible. Files damaged
later (disk errors, partial copies) are caught by the checksums before restoring, with an error naming the file.
Checksums are written only for steps this process saved (never for a step found on disk, which may already be
damaged), and every restore also refuses NaN/inf values and parameters shaped for another model. The parameters of
a bertjax model directory (`restore_param_tree`) and of a transformers directory (`check_finite`) get the same
checks when bertjax.model_dirs reads them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from bertjax.train.guards import nonfinite_leaves
from bertjax.train.run_config import CheckpointConfig

log = logging.getLogger(__name__)

CHECKSUMS_FILE = "checksums.json"
_PROCESS_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored; the message names the step, the file and what to do."""


class ModelMismatch(CheckpointError):
    """A sound checkpoint of another model than the one the run builds, or of another optimizer state."""


# ---------------------------------------------------------------------------------------------------------------
# The data-iterator state: one JSON file per process (an orbax CheckpointHandler).

class ProcessJsonHandler(ocp.CheckpointHandler):
    """Saves a JSON-serialisable value per process, as `process_<i>-of-<n>.json`.

    The value is captured when `save` is called (not read from a live iterator later), so an asynchronous save
    records exactly the position that matches the saved train state.
    """

    def save(self, directory: epath.Path, args: "ProcessJsonSave") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / _process_file()).write_text(json.dumps(args.value, sort_keys=True))

    def restore(self, directory: epath.Path, args: "ProcessJsonRestore | None" = None) -> Any:
        """This process's value; from a run with another number of processes, {"processes": [every value]}
        (in process order) for the caller to redistribute (bertjax.data.reshard)."""
        path = directory / _process_file()
        if not path.exists():
            return {"processes": [_read_json(p) for p in _saved_process_files(directory)]}
        return _read_json(path)

    def metadata(self, directory: epath.Path) -> None:
        return None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


def _process_file() -> str:
    return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


def _saved_process_files(directory: epath.Path) -> list[epath.Path]:
    """The files of every process of the run that saved `directory` (all of them, or an error)."""
    names = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
    counts = {int(match.group(2)) for match in map(_PROCESS_FILE.fullmatch, names) if match}
    if len(counts) != 1:
        raise CheckpointError(f"{directory} holds {names}: not the data positions of one run")
    count = counts.pop()
    files = [directory / f"process_{i}-of-{count}.json" for i in range(count)]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise CheckpointError(f"{directory} lacks {missing} of the {count} processes that saved it")
    return files


def _read_json(path: epath.Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None


@ocp.args.register_with_handler(ProcessJsonHandler, for_save=True)
@dataclasses.dataclass
class ProcessJsonSave(ocp.args.CheckpointArgs):
    value: Any


@ocp.args.register_with_handler(ProcessJsonHandler, for_restore=True)
@dataclasses.dataclass
class ProcessJsonRestore(ocp.args.CheckpointArgs):
    pass


# ---------------------------------------------------------------------------------------------------------------
# Checksums.

def _file_digests(step_dir: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(step_dir.rglob("*")):
        if path.is_file() and path.name != CHECKSUMS_FILE:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            digests[str(path.relative_to(step_dir))] = digest.hexdigest()
    return digests


def write_checksums(step_dir: Path) -> None:
    tmp = step_dir / (CHECKSUMS_FILE + ".tmp")
    tmp.write_text(json.dumps(_file_digests(step_dir), indent=1, sort_keys=True))
    tmp.rename(step_dir / CHECKSUMS_FILE)  # atomic: a checksum file is either complete or absent


def verify_checksums(step_dir: Path) -> bool:
    """Raise CheckpointError on a missing or changed file; False when the step has no checksums to check."""
    recorded_path = step_dir / CHECKSUMS_FILE
    if not recorded_path.exists():
        return False
    try:
        recorded = json.loads(recorded_path.read_text())
    except json.JSONDecodeError:
        raise CheckpointError(f"{recorded_path} is corrupt (not valid JSON)") from None
    actual = _file_digests(step_dir)
    for name, digest in recorded.items():
        if name not in actual:
            raise CheckpointError(f"checkpoint {step_dir}: file {name} is missing")
        if actual[name] != digest:
            raise CheckpointError(f"checkpoint {step_dir}: file {name} is corrupt (sha256 differs from the one "
                                  f"recorded when it was saved)")
    return True


# ---------------------------------------------------------------------------------------------------------------

class Checkpointer:
    """Save and restore (train state, data state) by step, keeping the last `config.keep` steps."""

    def __init__(self, directory: str | Path, config: CheckpointConfig):
        # Multi-host runs checkpoint to storage every host sees, often a bucket ("gs://..."): orbax reaches it
        # through etils.epath. Checksums are computed on local filesystems only (hashing a bucket means reading
        # the whole checkpoint back over the network).
        self.remote = "://" in str(directory)
        self.directory = epath.Path(directory) if self.remote else Path(directory).absolute()
        self.config = config
        self._hashes = config.checksums and not self.remote and jax.process_index() == 0
        self._unhashed: set[int] = set()  # steps this process saved: the only ones it may write checksums for
        self._hashing: threading.Thread | None = None
        self._hash_error: BaseException | None = None
        options = ocp.CheckpointManagerOptions(max_to_keep=config.keep, create=True,
                                               enable_async_checkpointing=config.async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                            "data": ProcessJsonHandler()})

    # Checksums are written here rather than in orbax's post_finalization_callback: orbax 0.12 runs that callback
    # before it renames `<step>.orbax-checkpoint-tmp` into place and then still writes `_CHECKPOINT_METADATA` and
    # `commit_success.txt`, so neither the final directory nor final contents exist there. Hashing starts only
    # while no save is in flight: orbax deletes the steps `keep` rotates out in a save's finalize thread, and every
    # save first finishes the hashing of the one before (`save` -> `_hash_now`), so the two never overlap.
    def record_finished(self) -> None:
        """Write the checksums of the saves this process started that have completed, in a thread (call after
        every training step; while a save is in flight it only reads orbax's in-progress flag)."""
        if self._unhashed and not self.manager.is_saving_in_progress() and not self._hashing_alive():
            self._start_hashing()

    def _hashing_alive(self) -> bool:
        return self._hashing is not None and self._hashing.is_alive()

    def _start_hashing(self) -> None:
        self._join_hashing()
        steps, self._unhashed = sorted(self._unhashed), set()
        self._hashing = threading.Thread(target=self._hash_steps, args=(steps,), name="bertjax-checksums",
                                         daemon=True)
        self._hashing.start()

    def _hash_steps(self, steps: list[int]) -> None:
        """Never a step found on disk: checksums written now for files damaged earlier would certify the damage.
        A step this process started but whose save failed has no final directory and gets none."""
        try:
            for step in steps:
                step_dir = self.step_dir(step)
                if step_dir.is_dir() and not (step_dir / CHECKSUMS_FILE).exists():
                    write_checksums(step_dir)
        except BaseException as error:  # raised in the training thread by the next _join_hashing
            self._hash_error = error

    def _join_hashing(self) -> None:
        if self._hashing is not None:
            self._hashing.join()
            self._hashing = None
        if self._hash_error is not None:
            error, self._hash_error = self._hash_error, None
            raise error

    def _hash_now(self) -> None:
        """Checksums of every completed save, written before returning (orbax's saves must be finished)."""
        if self._unhashed:
            self._start_hashing()
        self._join_hashing()

    def step_dir(self, step: int) -> Path | epath.Path:
        return self.directory / str(step)

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_state: Any) -> None:
        """Start saving (returns before the files are written when async_save is on)."""
        # orbax's save waits for the previous one anyway; waiting first lets that step be hashed before this
        # save's finalize thread may delete it (checkpoint.keep).
        self.manager.wait_until_finished()
        self._hash_now()
        if self._hashes:
            self._unhashed.add(step)
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        data=ProcessJsonSave(data_state)), force=True)
        if not self.config.async_save:
            self._hash_now()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, Any]:
        """(state, data state) of `step`, each array placed by the sharding of its `abstract_state` leaf."""
        step_dir = self.step_dir(step)
        if step not in self.manager.all_steps():
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; available steps: "
                                  f"{self.all_steps()}")
        try:
            checked = self.config.checksums and not self.remote
            verified = verify_checksums(step_dir) if checked else False
            if checked and not verified:
                log.warning("checkpoint %s has no checksums (saved without them, or interrupted before they were "
                            "written); restoring without verification", step_dir)
            with quiet_abandoned_reads():  # reading metadata runs many reads too
                stored = self.manager.item_metadata(step)["state"]
                if stored is None:
                    raise CheckpointError(f"checkpoint {step_dir}: the array metadata of state/ cannot be read (a "
                                          "file of state/ is missing or damaged)")
                _check_same_model(stored, abstract_state, step_dir)
                _check_same_state(stored, abstract_state, step_dir)
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), data=ProcessJsonRestore()))
            _check_finite(restored["state"], step_dir)
        except ModelMismatch:
            raise  # the checkpoint is fine: no hint to restore another or delete it
        except CheckpointError as error:
            raise CheckpointError(f"{error}. {self._hint(step)}") from None
        except Exception as error:  # orbax/tensorstore raise many types for damaged files
            raise CheckpointError(f"checkpoint {step_dir} cannot be restored ({describe_read_error(error)}). "
                                  f"{self._hint(step)}") from error
        return restored["state"], restored["data"]

    def set_aside_after(self, step: int) -> list[int]:
        """Move the checkpoints after `step` to `<directory>-abandoned/` (a run resumed from an earlier step
        rewrites those steps; they are kept for inspection, not deleted). Returns the steps moved."""
        later = [s for s in self.all_steps() if s > step]
        if later and jax.process_index() == 0:
            aside = self.directory.with_name(self.directory.name + "-abandoned")
            aside.mkdir(parents=True, exist_ok=True)
            for s in later:
                target = aside / str(s)
                if target.exists():
                    target = aside / f"{s}-{len(list(aside.iterdir()))}"
                self.step_dir(s).rename(target)
            log.warning("resuming from step %d: later checkpoints %s moved to %s/. config.yaml does not record "
                        "checkpoint.restore_step: leave it out of later reruns, or each goes back to step %d again",
                        step, later, aside, step)
        if later:
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils
                multihost_utils.sync_global_devices("bertjax-set-aside-checkpoints")
            self.manager.reload()
        return later

    def _hint(self, step: int) -> str:
        earlier = [s for s in self.all_steps() if s < step]
        if not earlier:
            return "There is no earlier checkpoint; delete this one to start from scratch."
        return (f"Restore an earlier one with checkpoint.restore_step={earlier[-1]} (available: {earlier}), "
                f"or delete {self.step_dir(step)}.")

    def wait(self) -> None:
        """Until every save has completed and has its checksums."""
        self.manager.wait_until_finished()
        self._hash_now()

    def close(self) -> None:
        self.wait()
        self.manager.close()


def restore_params(step_dir: str | Path, device: jax.Device | None = None, model: Any = None,
                   params_key: str | None = None, model_source: str = "model_config.json") -> Any:
    """Only the parameters of a saved train state, on one device (inference: fill-mask, export).

    The optimizer state is not read, so this needs a third of the memory of a full restore. `params_key`: read only
    that subtree of the parameters (the main model of a checkpoint that trains several, ELECTRA). `model`: the model
    the parameters must fit (`model_source` describes it, a workdir's model_config.json); their stored shapes are
    compared with its before any array is read (ModelMismatch naming the first differing paths), since a restore
    allocates whatever shapes the checkpoint's own metadata claims.
    """
    step_dir = Path(step_dir).absolute()  # orbax reads metadata of relative paths as missing
    state_dir = step_dir / "state"
    verify_checksums(step_dir)  # first: it names the missing or damaged file, as a resume does
    if not state_dir.is_dir():
        raise CheckpointError(f"checkpoint {step_dir} is incomplete (no state/ directory)")
    # This process's own device (jax.devices()[0] is process 0's on a pod, which no other process can write to).
    sharding = jax.sharding.SingleDeviceSharding(device or jax.local_devices()[0])
    checkpointer = ocp.PyTreeCheckpointer()
    # Reading the state item on its own makes orbax warn that the step-level metadata is not in state/; it is
    # one directory up, as the manager wrote it, and nothing else is missing.
    absl_logger = logging.getLogger("absl")
    previous_level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        with quiet_abandoned_reads():
            metadata = checkpointer.metadata(state_dir)
            tree = metadata.item_metadata
            tree = getattr(tree, "tree", tree)
            if tree is None:
                raise CheckpointError(f"checkpoint {step_dir}: the array metadata of state/ cannot be read (a file "
                                      "of state/ is missing or damaged)")
            stored = _params_subtree(tree, params_key, step_dir)
            if model is not None:
                check_stored_model(stored, model, f"checkpoint {step_dir}", model_source)
            target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), stored)
            target = {"params": {params_key: target} if params_key else target}
            restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
                item=target, restore_args=jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=sharding), target),
                partial_restore=True))
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(f"parameters of checkpoint {step_dir} cannot be read "
                              f"({describe_read_error(error)})") from error
    finally:
        absl_logger.setLevel(previous_level)
        checkpointer.close()
    params = restored["params"][params_key] if params_key else restored["params"]
    _check_finite(params, step_dir)
    return params


def _params_subtree(tree: Any, params_key: str | None, step_dir) -> Any:
    """The stored metadata of the parameters (of the `params_key` model), or a CheckpointError saying they are
    missing."""
    params = tree.get("params") if isinstance(tree, dict) else None
    if params_key and isinstance(params, dict):
        params = params.get(params_key)
    if not isinstance(params, dict):
        what = f"params/{params_key}" if params_key else "params"
        raise CheckpointError(f"checkpoint {step_dir}: the train state holds no {what} (not a checkpoint of this "
                              "kind of run, or damaged)")
    return params


def check_stored_model(stored: Any, model: Any, source: str, model_source: str) -> None:
    """The stored metadata of a parameter tree against `model` (described by `model_source`, a model_config.json),
    before any array is read: a ModelMismatch naming `source` and the first differing paths with both shapes.
    Restoring reads arrays at the stored shapes, so a few-kilobyte checkpoint claiming a huge embedding would be
    allocated first and refused by Flax only afterwards. The layer count is compared before the model is traced."""
    from bertjax.models import abstract_params  # here: bertjax.models imports nothing of training

    differing = _layer_count_difference(stored, model.config) or _shape_differences(
        _leaf_shapes(stored), _leaf_shapes(abstract_params(model)), model_source)
    if differing:
        raise ModelMismatch(f"{source} holds another model than {model_source} describes ({differing}); was "
                            "model_config.json edited?")


_LAYER_NAME = re.compile(r"layers_(\d+)")  # the layer stack's parameter scopes, encoder/layers_<k>


def _layer_count_difference(stored: Any, config: Any) -> str:
    """How the config's number of distinct layers differs from the stored encoder's ("" when it does not), found
    before the model is traced to compare every shape: tracing costs ~50 ms and ~0.25 MB per layer, so
    `num_layers: 1000000` would run for hours. Only a claim beyond the stored layers is refused here: extra stored
    layers and gaps cost nothing to trace and are left to the shape comparison, which names the path."""
    encoder = stored.get("encoder") if isinstance(stored, dict) else None
    held = [int(match.group(1)) for name in (encoder if isinstance(encoder, dict) else {})
            if (match := _LAYER_NAME.fullmatch(name))]
    claimed = config.layer_groups * config.layers_per_group
    if claimed <= (max(held) + 1 if held else 0):
        return ""
    described = f"num_layers {config.num_layers}"
    if config.shares_layers:
        described += f" in {config.layer_groups} groups of {config.layers_per_group} layers"
    return f"{described}, but it stores {f'layers 0..{max(held)}' if held else 'no layers'}"


def _leaf_shapes(tree: Any) -> dict[str, tuple]:
    """Every leaf of a state tree (stored metadata or the run's abstract state) by its path, "params/..." etc."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape) for path, leaf in leaves}


def _param_shapes(tree: Any) -> dict[str, tuple]:
    return {path: shape for path, shape in _leaf_shapes(tree).items() if path.startswith("params/")}


def _shape_differences(stored: dict[str, tuple], wanted: dict[str, tuple], wanted_name: str) -> str:
    """The first few paths whose stored shape differs from the wanted one ("" when none does)."""
    differing = [f"{path} stored {stored.get(path, 'absent')}, {wanted_name} {wanted.get(path, 'absent')}"
                 for path in sorted(set(stored) | set(wanted)) if stored.get(path) != wanted.get(path)]
    return f"{'; '.join(differing[:3])}{'; ...' if len(differing) > 3 else ''}"


def _check_same_model(stored: Any, abstract_state: Any, step_dir) -> None:
    """Parameters of the stored state against the run's model, before reading any array."""
    differing = _shape_differences(_param_shapes(stored), _param_shapes(abstract_state), "this run's model")
    if differing:
        raise ModelMismatch(f"checkpoint {step_dir} is of another model ({differing}): run with the model config "
                            "that saved it, or give another workdir / checkpoint.directory")


def open_for_resume(config, workdir: str | Path) -> tuple["Checkpointer", int | None]:
    """The checkpointer of a run (checkpoint.directory, or <workdir>/checkpoints) and the step it resumes from
    (checkpoint.restore_step, or the latest; None: a fresh start). One path for pretraining, fine-tuning and
    embedder runs; after restoring, `set_aside_after(step)` moves later checkpoints out of the way."""
    checkpointer = Checkpointer(config.directory or Path(workdir) / "checkpoints", config)
    check_shared_by_every_process(checkpointer.directory)
    step = config.restore_step if config.restore_step is not None else checkpointer.latest_step()
    return checkpointer, step


_SHARED_MARKER = ".bertjax-every-host-sees-this"


def check_shared_by_every_process(directory) -> None:
    """Several processes save one checkpoint into one directory, each its shards, and orbax's commit waits for all
    of them there: a directory on each host's own disk (a per-host workdir's checkpoints/) hung the first save
    forever. Process 0 writes a marker with a token every process is told; a process that cannot read it back
    has its own directory, and every process stops with an error naming checkpoint.directory."""
    if jax.process_count() == 1:
        return
    import numpy as np
    from jax.experimental import multihost_utils

    marker = epath.Path(directory) / _SHARED_MARKER
    token = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    if jax.process_index() == 0:
        epath.Path(directory).mkdir(parents=True, exist_ok=True)
        marker.write_text(str(token))
    token = int(multihost_utils.broadcast_one_to_all(np.int32(token)))  # also a barrier after the write
    try:
        sees = marker.read_text().strip() == str(token)
    except OSError:
        sees = False
    everyone = np.asarray(multihost_utils.process_allgather(np.int32(sees)))
    multihost_utils.sync_global_devices("bertjax-checkpoint-directory-check")
    if jax.process_index() == 0:
        marker.unlink(missing_ok=True)
    if not everyone.all():
        blind = [str(i) for i, seen in enumerate(everyone.reshape(-1)) if not seen]
        raise CheckpointError(f"checkpoint directory {directory} is not shared: process(es) {', '.join(blind)} do "
                              "not see what process 0 writes there, and every process must save into the same one. "
                              "Give checkpoint.directory on storage every host sees (a gs:// bucket, a shared "
                              "filesystem), or one --workdir every host sees")


def _check_same_state(stored: Any, abstract_state: Any, step_dir) -> None:
    """The same model with another optimizer state (another optimizer, clipping turned on or off): the checkpoint
    is sound, the run's settings differ from those that saved it, so the error says so instead of calling the
    checkpoint damaged. Run configs refuse such changes earlier, naming the key; this catches the rest (a
    checkpoint.directory of another run)."""
    stored_paths, wanted = set(_leaf_shapes(stored)), set(_leaf_shapes(abstract_state))
    missing, extra = sorted(wanted - stored_paths), sorted(stored_paths - wanted)
    if missing or extra:
        shown = [f"{path} stored, not in this run" for path in extra[:2]] + \
                [f"{path} in this run, not stored" for path in missing[:2]]
        raise ModelMismatch(f"checkpoint {step_dir} holds another optimizer state than this run builds "
                            f"({'; '.join(shown)}): the optimizer settings (its name, gradient clipping on or off) "
                            "differ from those of the run that saved it. Run with those settings, or give another "
                            "workdir / checkpoint.directory")


def _check_finite(tree: Any, step_dir) -> None:
    """What a restore can verify without checksums: damaged bytes of float arrays often read as NaN/inf."""
    check_finite(tree, f"checkpoint {step_dir}")


def check_finite(tree: Any, source: str, cause: str = "damaged, or saved by a diverged run") -> None:
    """Refuse a pytree whose floating-point arrays hold a NaN or an infinity: a CheckpointError naming `source`
    ("checkpoint DIR", "model directory DIR", ...) and the first few arrays by path. Every model that commands read
    passes here: workdir checkpoints, bertjax model directories and transformers directories."""
    bad = nonfinite_leaves(tree)
    if bad:
        raise CheckpointError(f"{source} holds non-finite values (NaN or infinity) in {len(bad)} array(s) "
                              f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): {cause}")


# ---------------------------------------------------------------------------------------------------------------
# A bertjax model directory's params/ (bertjax.model_dirs): the same checks as a workdir checkpoint's parameters.

_WRITE_AGAIN = "Write the directory again (bertjax convert --from-hf, or init-from)"


def restore_param_tree(params_dir: str | Path, model: Any, source: str, model_source: str) -> Any:
    """The parameter pytree an Orbax checkpointer saved in `params_dir`, read onto the shapes of `model` (described
    by `model_source`, the directory's model_config.json).

    Damage is a one-line CheckpointError naming `source` and what is wrong: parameters shaped for another model than
    `model` (ModelMismatch, naming the first differing paths, before reading any array or tracing more layers than
    are stored), a missing or unreadable file, NaN/inf values."""
    from bertjax.models import abstract_params

    params_dir = Path(params_dir).absolute()  # orbax reads metadata of relative paths as missing
    damaged = f"{source}: {params_dir.name}/ cannot be read"
    with ocp.StandardCheckpointer() as checkpointer, quiet_abandoned_reads():
        try:
            stored = checkpointer.metadata(params_dir).item_metadata
        except Exception as error:
            raise CheckpointError(f"{damaged} ({describe_read_error(error)}). {_WRITE_AGAIN}") from error
        stored = getattr(stored, "tree", stored)
        if stored is None:
            raise CheckpointError(f"{damaged} (its array metadata is missing or damaged). {_WRITE_AGAIN}")
        try:
            check_stored_model(stored, model, f"{source}: {params_dir.name}/", model_source)
        except ModelMismatch as error:
            raise ModelMismatch(f"{error} {_WRITE_AGAIN}") from None
        try:
            params = checkpointer.restore(params_dir, on_this_host(abstract_params(model)))
        except Exception as error:  # orbax/tensorstore raise many types for damaged files
            raise CheckpointError(f"{damaged} ({describe_read_error(error)}); the directory is damaged. "
                                  f"{_WRITE_AGAIN}") from error
    check_finite(params, source)
    return params


def on_this_host(abstract: Any) -> Any:
    """`abstract` (ShapeDtypeStructs) with this process's first device as the sharding of every leaf that has none
    (those traced under a mesh keep theirs). Orbax places a leaf without one where the writer's array was, by its
    recorded device name: `cpu:0` of the machine that converted a checkpoint is not a device of a GPU or TPU host,
    nor of any process but the first of a pod."""
    single = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda leaf: leaf if getattr(leaf, "sharding", None) is not None
                        else jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=single), abstract)


# ---------------------------------------------------------------------------------------------------------------
# Errors of damaged files.

def describe_read_error(error: BaseException) -> str:
    """`Type: first line` of the error orbax's read failed with at the bottom (TensorStore's, which names the
    file or array), not orbax's wrapper around it, which carries a TensorStore spec repr."""
    seen = set()
    while error.__cause__ is not None and id(error.__cause__) not in seen:
        seen.add(id(error))
        error = error.__cause__
    return f"{type(error).__name__}: {_TENSORSTORE_SPEC.sub('', _first_line(error))}"


_TENSORSTORE_SPEC = re.compile(r"\s*\[tensorstore_spec=.*$")  # a JSON spec TensorStore appends to its errors


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


# Orbax runs a restore's reads on an event loop of its own and closes that loop as soon as one read fails; the
# reads still in flight (TensorStore threads) finish later and call back into the closed loop. Each such call prints
# "RuntimeError: Event loop is closed" through sys.unraisablehook, and asyncio logs "exception was never retrieved"
# for the abandoned tasks, often after the one-line error, at exit. They say nothing the error does not, so once a
# read has failed the process drops them (and only them).
def _from_abandoned_read(error: BaseException | None, obj: Any = None) -> bool:
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    code = getattr(obj, "cr_code", None)  # "Exception ignored in: <coroutine object _read_...>"
    if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename:
        return True
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if "TensorStore" in text or "OCDBT" in text or "Event loop is closed" in text:
            return True
        tb = error.__traceback__
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if f"{os.sep}orbax{os.sep}" in filename or f"{os.sep}tensorstore{os.sep}" in filename:
                return True
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return False


class _AbandonedReadLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if "exception was never retrieved" not in str(record.msg):
            return True
        return not _from_abandoned_read(record.exc_info[1] if record.exc_info else None)


_ABANDONED_READ_LOG_FILTER = _AbandonedReadLogFilter()


def _drop_abandoned_read_noise() -> bool:
    """Install the filters; False when they already were."""
    if getattr(sys.unraisablehook, "drops_abandoned_reads", False):
        return False
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _from_abandoned_read(unraisable.exc_value, unraisable.object):
            previous(unraisable)

    hook.drops_abandoned_reads = True
    hook.previous = previous
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_ABANDONED_READ_LOG_FILTER)
    return True


@contextlib.contextmanager
def quiet_abandoned_reads():
    """Around an orbax restore: if it fails, the reads it abandoned stay quiet for the rest of the process.

    The filters go in before the reads start (the first callbacks can land before the error reaches any handler)
    and come out again after a restore that succeeded."""
    installed = _drop_abandoned_read_noise()
    yield  # an error here propagates past what follows: the abandoned reads finish later, the filters stay
    if installed and getattr(sys.unraisablehook, "drops_abandoned_reads", False):
        sys.unraisablehook = sys.unraisablehook.previous
        logging.getLogger("asyncio").removeFilter(_ABANDONED_READ_LOG_FILTER)
