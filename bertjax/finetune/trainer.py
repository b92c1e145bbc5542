"""The fine-tuning run: a model directory + a task + two data files -> a workdir with the best model.

    model dir -> (backbone params, tokenizer) -> task model (fresh head) -> AdamW, linear warmup and decay
    -> one jitted train step under the mesh rules -> evaluation (metrics.jsonl, TensorBoard)
    -> best/ (transformers directory + tokenizer + labels) -> orbax checkpoints (rerunning resumes)

The batch of every step is a pure function of (seed, step) (bertjax.finetune.batches) and dropout keys are folded
from the step, so a run resumed from a checkpoint repeats exactly what the interrupted run would have done.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from bertjax.data.global_batch import from_full_batch
from bertjax.finetune import batches as batch_lib
from bertjax.finetune import report
from bertjax.finetune.config import FinetuneConfig, save_finetune_config
from bertjax.finetune.readers import read_rows
from bertjax.finetune.tasks import Encoded, Labels, Task
from bertjax.finetune.tasks.base import fit_max_length, same_labels
from bertjax.inference.texts import check_tokenizer_fits  # shared with predict and the embedding commands
from bertjax.jsonl import read_json_file
from bertjax.train import mesh as mesh_lib
from bertjax.train.distributed import PreemptionWatch, check_same_everywhere, run_settings
from bertjax.train.guards import NonFiniteGuard
from bertjax.train import workdir as workdir_lib
from bertjax.train.optimizers import TRAINER_OPTIMIZER_KEYS, build_optimizer, trainer_adamw
from bertjax.train.run_config import ConfigError, ScheduleConfig, parse_dataclass, to_dict, to_record
from bertjax.train.unused_params import undecayed_note, unused_parameters

CONFIG_FILE = "config.yaml"
RUN_FILE = "finetune.json"  # in the workdir and in best/: task, labels, data settings (what predict needs)
BEST_DIR = "best"


@dataclasses.dataclass
class FinetuneResult:
    workdir: Path
    results: dict
    start_step: int
    final_step: int
    seconds: float
    model: Any
    params: Any
    labels: Labels


# ---------------------------------------------------------------------------------------------------------------
# The model: the loaded backbone under a fresh task head.

def task_model(base_config, task: Task, labels: Labels):
    """The task's model on the checkpoint's backbone (its head's settings: `Task.head_settings`). A checkpoint
    without task settings pools as its family's transformers heads do by default (EuroBERT "late")."""
    from bertjax.hf.registry import default_task
    from bertjax.models import MODEL_CLASSES

    current = base_config.task if base_config.task is not None else default_task(base_config.family)
    return MODEL_CLASSES[task.head](base_config.replace(task=task.head_settings(labels, current)))


def known_labels(model) -> tuple[str, ...] | None:
    task = getattr(model.config, "task", None)
    return None if task is None or task.labels is None else tuple(task.labels)


def without_relabelled_rows(base_params: dict, base_model, task: Task, labels: Labels) -> tuple[dict, list[str]]:
    """`base_params` without the checkpoint's label-indexed head parameters (the classifier's output rows) when its
    labels are not the training file's in the same order: kept because their shapes fit, row i would go on meaning
    the checkpoint's label i (an MNLI checkpoint's NEUTRAL read as "entailment"), so they start fresh instead.
    Returns (parameters, the dropped paths)."""
    from bertjax.models import abstract_params

    known = known_labels(base_model)
    if known is None or labels.regression or not labels.names or same_labels(labels.names, known):
        return base_params, []
    config = base_model.config.replace(param_dtype="float32")
    shapes = [traverse_util.flatten_dict(abstract_params(task_model(config, task, choice)))
              for choice in (labels, dataclasses.replace(labels, names=labels.names + ("another",)))]
    indexed = {path for path, shape in shapes[0].items() if shapes[1].get(path, shape).shape != shape.shape}
    flat = traverse_util.flatten_dict(base_params)
    dropped = sorted("/".join(path) for path in indexed if path in flat)
    return traverse_util.unflatten_dict({k: v for k, v in flat.items() if k not in indexed}), dropped


# ---------------------------------------------------------------------------------------------------------------
# Steps.

def task_forward(task: Task, model, prepare: Callable = lambda params: params) -> Callable:
    """forward(params, batch, deterministic, key=None): the task model's output on a batch; `prepare` maps the
    parameters first (the steps gather them for compute)."""
    type_vocab_size = model.config.type_vocab_size

    def forward(params, batch, deterministic, key=None):
        return model.apply({"params": prepare(params)}, **task.model_kwargs(batch, type_vocab_size),
                           deterministic=deterministic, rngs=None if deterministic else {"dropout": key})

    return forward


def task_loss(task: Task, forward: Callable) -> Callable:
    """loss(params, batch, key) -> (mean loss over the batch's targets, (its sum, their count)), with dropout."""
    def loss_fn(params, batch, key):
        total, count = task.loss_sums(forward(params, batch, False, key), batch)
        return total / jnp.maximum(count, 1.0), (total, count)

    return loss_fn


def make_steps(task: Task, model, optimizer, schedule, mesh, shardings, seed: int, nonfinite: str = "stop"):
    from bertjax.train import guards
    from bertjax.train.state import TrainState
    from bertjax.train.step import JittedStep, batch_shardings

    base_key = jax.random.key(seed)
    forward = task_forward(task, model, lambda params: mesh_lib.gathered_for_compute(params, shardings.params))
    loss_fn = task_loss(task, forward)

    def train_step(state, batch):
        key = jax.random.fold_in(base_key, state.step)  # dropout depends only on the step: exact resume
        grads, (total, count) = jax.grad(loss_fn, has_aux=True)(state.params, batch, key)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss_sum": total, "count": count, "loss": total / jnp.maximum(count, 1.0),
                   "learning_rate": schedule(state.step), "grad_norm": optax.tree.norm(grads)}
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
        if nonfinite == "skip":
            return guards.keep_finite_update(state, new_state, metrics)
        return new_state, metrics

    def eval_step(params, batch):
        output = forward(params, batch, True)
        total, count = task.loss_sums(output, batch) if _has_targets(task, batch) else (0.0, 0.0)
        return task.host_outputs(output), total, count

    train = JittedStep(train_step, mesh, lambda batch: (shardings, batch_shardings(mesh, batch)),
                       out_shardings=(shardings, mesh_lib.replicated(mesh)), donate_argnums=(0,))
    evaluate = JittedStep(eval_step, mesh, lambda batch: (shardings.params, batch_shardings(mesh, batch)),
                          out_shardings=mesh_lib.replicated(mesh))
    return train, evaluate


def _has_targets(task: Task, batch: dict) -> bool:
    return all(key in batch for key in task.target_keys)


def run_eval(evaluate: Callable, params, encoded: Encoded, batch_size: int,
             mesh=None) -> tuple[dict[str, np.ndarray], float]:
    """Host outputs of every row of a split (in row order) and the mean loss (nan without targets).

    With a mesh, each process feeds only its rows of every batch; the outputs come back replicated, so every
    process sees the whole split and computes the same metrics."""
    pieces: list[dict] = []
    total = count = 0.0
    for batch, real in batch_lib.eval_batches(encoded.arrays, batch_size):
        fed = batch if mesh is None else from_full_batch(batch, mesh, mesh_lib.BATCH_AXES)
        outputs, loss_sum, loss_count = evaluate(params, fed)
        pieces.append({k: np.asarray(v)[:real] for k, v in outputs.items()})
        total += float(loss_sum)
        count += float(loss_count)
    outputs = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
    return outputs, (total / count if count else float("nan"))


class TrainSpeed:
    """Examples per second of the training steps alone, batch assembly included; evaluations, checkpoints and
    the first step (which compiles) are left out. Packed rows count every example they hold, so padded and packed
    runs compare (results.json; bench/finetune_bench.py). Also per second of this process's CPU time (all its
    threads): on a machine shared with other jobs, wall-clock time counts the others' work too."""

    def __init__(self):
        self.first_seconds = None
        self.examples = 0.0
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def add(self, examples: float, seconds: float, cpu_seconds: float) -> None:
        if self.first_seconds is None:
            self.first_seconds = seconds
            return
        self.examples += examples
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds

    def summary(self) -> dict:
        rate = self.examples / self.seconds if self.seconds else None
        cpu_rate = self.examples / self.cpu_seconds if self.cpu_seconds else None
        return {"train_examples_per_second": rate, "train_examples_per_cpu_second": cpu_rate,
                "first_step_seconds": self.first_seconds}


# ---------------------------------------------------------------------------------------------------------------
# Saving the best model.

def save_best(directory: Path, model, params, tokenizer, task: Task, labels: Labels, config: FinetuneConfig,
              say: Callable[[str], None], token_ids: dict[str, int] | None = None) -> str:
    """A transformers directory (config with id2label/label2id, weights, tokenizer files) when transformers has
    this family's task class, else a bertjax model directory; both load with `bertjax predict`. `token_ids`: the
    base model's special-token ids (bos, eos, mask, ...: `read_token_ids`), kept in the config as `convert` keeps
    them."""
    import bertjax
    from bertjax.data.tokenizer_export import save_for_model
    from bertjax.hf.pretrained import hf_config_of
    from bertjax.model_dirs import save_model_dir_from_process_0

    from jax.experimental import multihost_utils

    host_params = multihost_utils.process_allgather(params, tiled=True)  # every process: it is a collective
    try:  # decided on every process alike: writing a bertjax model directory involves them all
        hf_config_of(model, token_ids)
        problem = None
    except ValueError as error:  # a family or head transformers has no class for
        problem = error
    primary = jax.process_index() == 0
    if problem is not None:
        if primary:
            say(f"best/: {problem}; writing a bertjax model directory instead")
        save_model_dir_from_process_0(directory, model, host_params, token_ids=token_ids)
    if not primary:
        return "none (only process 0 writes)"
    directory.mkdir(parents=True, exist_ok=True)
    if problem is None:
        bertjax.save_pretrained(str(directory), model, host_params, token_ids=token_ids)
    tokenizer.save(directory)
    if problem is None:  # AutoTokenizer reads tokenizer.json; a bare tokenizer.model has no special tokens
        save_for_model(tokenizer, directory, model.config)
    write_run_file(directory, task, labels, config)
    return "transformers" if problem is None else "bertjax"


def write_run_file(directory: Path, task: Task, labels: Labels, config: FinetuneConfig,
                   extra: dict | None = None) -> None:
    described = {"task": task.name, "labels": list(labels.names), "regression": labels.regression,
                 "unanswerable": labels.unanswerable, "text_pairs": labels.text_pairs, "data": to_dict(config.data),
                 **(extra or {})}
    (directory / RUN_FILE).write_text(json.dumps(described, indent=1) + "\n")


def read_run_file(directory: Path) -> dict:
    """best/'s record of its task, labels and data settings (a shared directory's: read as any outside JSON)."""
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {RUN_FILE}; it is written into best/ by `bertjax finetune`")
    return read_json_file(path)


# ---------------------------------------------------------------------------------------------------------------
# The run.

def _progress(config: FinetuneConfig, total: int, start: int):
    if not config.train.progress_bar:
        return None
    from tqdm import tqdm

    from bertjax.train.session_outputs import CurrentStderr
    return tqdm(total=total, initial=start, desc="finetune", unit="step", dynamic_ncols=True, file=CurrentStderr())


def _say(bar, say: Callable[[str], None], text: str) -> None:
    """A line that does not break the progress bar."""
    if bar is not None:
        bar.write(text)
    else:
        say(text)


# Settings a resumed run may change: they leave the trained weights as they would be in one uninterrupted run
# (how the run is shown, sharded, checkpointed, and when it is evaluated). Everything else decides the data of each
# step, the schedule or the optimizer state, so a changed value would not continue the run the workdir holds.
RESUMABLE_CHANGES = ("train.progress_bar", "eval.every", "eval.batch_size", "checkpoint", "mesh")


def _check_workdir(workdir: Path, config: FinetuneConfig, identity: dict) -> list[tuple[str, Any, Any]]:
    """A workdir holds one run: rerunning it resumes. Another model, task or data file (its path, or its contents at
    the same path), or a change of a setting outside RESUMABLE_CHANGES, is an error naming each differing key; the
    allowed changes are returned."""

    path = workdir / RUN_FILE
    if not path.is_file():
        return []
    before = workdir_lib.read_run_file(path)
    workdir_lib.check_same_identity(workdir, before, identity, paths=("model", "train", "validation"))
    found = workdir_lib.recorded_differences(workdir, before.get("config", {}), config,
                                             lambda held: parse_dataclass(FinetuneConfig, held, ""))
    workdir_lib.check_resumable(workdir, found, RESUMABLE_CHANGES)
    return found


def check_main_metric(task: Task, model, validation: Encoded, labels: Labels, main_metric: str) -> None:
    """eval.main_metric must be one the evaluations report, checked before anything is trained or written: the
    metric names come from the task's metrics over zero outputs of the model's shapes (no compile, no forward)."""
    import warnings

    from bertjax.models import abstract_params

    row = {k: v[:1] for k, v in validation.arrays.items()}
    kwargs = task.model_kwargs(row, model.config.type_vocab_size)
    shapes = jax.eval_shape(lambda params: task.host_outputs(model.apply({"params": params}, **kwargs,
                                                                         deterministic=True)),
                            abstract_params(model))
    rows = len(validation.arrays["input_ids"])
    zeros = {k: np.zeros((rows, *v.shape[1:]), v.dtype) for k, v in shapes.items()}
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # constant outputs: correlations are undefined
        warnings.simplefilter("ignore")
        names = ["loss", *task.metrics(zeros, validation, labels)]
    if main_metric not in names:
        raise ConfigError(f"eval.main_metric: {main_metric!r} is not a metric of this task; its metrics: "
                          f"{sorted(names)}")


def finetune(model_dir: str | Path, task_cls: type[Task], train_file: str | Path, validation_file: str | Path,
             workdir: str | Path, config: FinetuneConfig, *, stop_after: int | None = None,
             say: Callable[[str], None] = print, chosen: Collection[str] = (),
             config_path: str | Path | None = None, allow_pickle: bool = False) -> FinetuneResult:
    """Fine-tune; `stop_after` ends the run after that many steps (as a kill would, used to test resuming).
    `chosen`: the dotted keys the user set; a data.max_length among them must fit the model, a default is capped
    to it (tasks.base.fit_max_length). `config_path`: the run config's file, named in the workdir checks' errors.
    `allow_pickle`: read a transformers directory that has only a pytorch_model.bin (trusted files only)."""
    return _finetune_holding_the_workdir(config, workdir, model_dir, task_cls, train_file, validation_file,
                                         stop_after=stop_after, say=say, chosen=chosen, config_path=config_path,
                                         allow_pickle=allow_pickle)


def _check_workdir_first(workdir: Path, config: FinetuneConfig, config_path: str | Path | None) -> None:
    # Before the model loads: another kind of run, or a config.yaml of the user's, here (which the run rewrites).
    workdir_lib.check_workdir_is_for(workdir, RUN_FILE, config.checkpoint, config_path)


@workdir_lib.exclusive(check=_check_workdir_first, record=RUN_FILE)
def _finetune_holding_the_workdir(config: FinetuneConfig, workdir: Path, model_dir: str | Path, task_cls: type[Task],
                                  train_file: str | Path, validation_file: str | Path, *, stop_after: int | None,
                                  say: Callable[[str], None], chosen: Collection[str],
                                  allow_pickle: bool) -> FinetuneResult:
    """finetune's body, run while the workdir's lock (and a checkpoint.directory's of its own) is held: two runs on
    one workdir would write each other's checkpoints and best/."""
    from bertjax.model_dirs import load_model_dir, read_token_ids
    from bertjax.models import abstract_params
    from bertjax.models.inputs import check_ids
    from bertjax.models.task_models import with_global_token_bound
    from bertjax.train.checkpoints import open_for_resume
    from bertjax.train.schedules import build_schedule, warmup_steps
    from bertjax.train.state import start_or_resume

    started = time.time()
    primary = jax.process_index() == 0  # on several hosts, only process 0 writes files (checkpoints: all)
    if not primary:
        say = lambda text: None  # noqa: E731  (one copy of every message)
    identity = {"model": workdir_lib.path_identity(model_dir), "task": task_cls.name,
                **workdir_lib.data_identity({"train": train_file, "validation": validation_file})}
    check_same_everywhere(run_settings(config, task=task_cls.name,
                                       data_files=identity[workdir_lib.FINGERPRINTS]),
                          "Start every host with the same command, config and data files.")
    base_model, base_params, tokenizer = load_model_dir(model_dir, allow_pickle=allow_pickle)
    token_ids = read_token_ids(model_dir)  # bos, eos, mask, ... for best/'s config, as `convert` keeps them
    fitted = fit_max_length(config.data, base_model.config, chosen=chosen, model=f"--model {model_dir}")
    if fitted != config.data:
        say(f"data.max_length {config.data.max_length} -> {fitted.max_length} (the positions of --model {model_dir})"
            + (f", data.doc_stride {config.data.doc_stride} -> {fitted.doc_stride}"
               if fitted.doc_stride != config.data.doc_stride else ""))
        config = dataclasses.replace(config, data=fitted)
    changed = _check_workdir(workdir, config, identity)  # the fitted config: a rerun compares like with like

    if tokenizer is None:
        raise FileNotFoundError(f"{model_dir} holds no tokenizer; fine-tuning needs the one it was trained with")
    check_tokenizer_fits(tokenizer, base_model.config, model_dir)
    task = task_cls(config.data, config.task)
    train_rows, validation_rows = read_rows(train_file), read_rows(validation_file)
    labels = task.fit_labels(train_rows, str(train_file), known_labels(base_model))
    for note in labels.notes:
        say(note)
    base_params, relabelled = without_relabelled_rows(base_params, base_model, task, labels)
    if relabelled:
        say(f"{model_dir}'s labels {list(known_labels(base_model))} are not the training file's "
            f"{list(labels.names)} in the same order: {', '.join(relabelled)} start fresh")
    train_data = task.encode(tokenizer, train_rows, labels, str(train_file), with_targets=True, training=True)
    validation = task.encode(tokenizer, validation_rows, labels, str(validation_file), with_targets=True)
    for note in train_data.notes + validation.notes:
        say(note)
    # Float32 master weights whatever the directory stores: bfloat16 parameters would round away most updates at
    # fine-tuning's learning rates (the compute dtype stays the directory's).
    model = task_model(base_model.config.replace(param_dtype="float32"), task, labels)
    for name, data in (("train", train_data), ("validation", validation)):  # once, on the host: the steps are jitted
        check_ids(data.arrays["input_ids"], model.config.vocab_size, f"--{name} token ids")
    main_metric = config.eval.main_metric or task.main_metric_for(labels)
    check_main_metric(task, model, validation, labels, main_metric)

    mesh = mesh_lib.build_mesh(config.mesh)
    if config.train.batch_size % mesh_lib.batch_shards(mesh) or config.eval.batch_size % mesh_lib.batch_shards(mesh):
        raise ValueError(f"train.batch_size ({config.train.batch_size}) and eval.batch_size "
                         f"({config.eval.batch_size}) must divide over the {mesh_lib.batch_shards(mesh)} batch "
                         "shards of the mesh")
    per_epoch = batch_lib.steps_per_epoch(train_data.rows, config.train.batch_size)
    total_steps = per_epoch * config.train.epochs
    warmup = warmup_steps(config.train.warmup_ratio, total_steps)
    schedule = build_schedule(ScheduleConfig(name="linear", warmup=warmup), config.train.learning_rate, total_steps)
    # A Longformer's steps with the most global tokens a row here has: a static bound keeps attention linear.
    step_model = with_global_token_bound(model, train_data.arrays, validation.arrays)
    # Parameters the loss does not depend on (a Longformer's global projections when no token here attends
    # globally, XLNet's mask_emb) do not decay, as transformers' Trainer leaves them.
    first_batch, _ = batch_lib.train_batch(train_data.arrays, 0, config.train.batch_size, config.train.seed)
    unused = unused_parameters(task_loss(task, task_forward(task, step_model)), abstract_params(model), first_batch,
                               jax.random.key(0))
    optimizer = build_optimizer(trainer_adamw(config.train), schedule, unused)
    undecayed = undecayed_note(unused, config.train.weight_decay)
    if undecayed is not None:
        say(undecayed)

    workdir.mkdir(parents=True, exist_ok=True)
    checkpointer, start_step = open_for_resume(config.checkpoint, workdir)
    start_step = start_step or 0
    state, shardings, accumulated, fresh = start_or_resume(model, optimizer, mesh, checkpointer, start_step,
                                                           config.train.seed, base_params)
    if start_step:
        say(f"resuming {workdir} from step {start_step} of {total_steps}"
            + (f" with changed settings: {workdir_lib.describe_differences(changed)}" if changed else ""))
    else:
        say(f"initialised from {model_dir}; new (randomly initialised) parameters: {', '.join(fresh) or 'none'}")
    if primary:
        save_finetune_config(config, workdir / CONFIG_FILE)
        write_run_file(workdir, task, labels, config, {**identity, "config": to_record(config)})

    train_step, evaluate = make_steps(task, step_model, optimizer, schedule, mesh, shardings, config.train.seed,
                                      config.train.nonfinite)
    every = config.eval.every or per_epoch
    log = report.EvaluationLog(workdir, start_step, write=primary)
    best = report.best_record(log.records, main_metric)
    bar = _progress(config, total_steps, start_step) if primary else None
    step = start_step
    end = total_steps if stop_after is None else min(total_steps, start_step + stop_after)
    learning_rate = float("nan")
    patience = config.train.early_stopping_patience
    stopped_early = bool(patience) and report.evaluations_since_best(log.records, main_metric) >= patience
    speed = TrainSpeed()
    watch = PreemptionWatch()  # SIGTERM (preemption), SIGHUP, Ctrl-C: save this step's checkpoint, then stop
    nonfinite = NonFiniteGuard(config.train.nonfinite, keys=TRAINER_OPTIMIZER_KEYS)
    last_saved = start_step or None
    try:
        while step < end and not stopped_early:
            began, began_cpu = time.perf_counter(), time.process_time()
            batch, _ = batch_lib.train_batch(train_data.arrays, step, config.train.batch_size, config.train.seed)
            state, metrics = train_step(state, from_full_batch(batch, mesh, mesh_lib.BATCH_AXES))
            step += 1
            checkpointer.record_finished()  # a completed save gets its checksums now, not at the next save
            nonfinite.observe(step, metrics)
            nonfinite.check(last_saved)  # every step: the loop waits for each step's loss anyway
            if not float(metrics.get("skipped", 0.0)):  # float() waits for the step
                accumulated = {k: accumulated[k] + float(metrics[k]) for k in accumulated}
            speed.add(float(metrics["count"]), time.perf_counter() - began, time.process_time() - began_cpu)
            learning_rate = float(metrics["learning_rate"])
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{accumulated['loss_sum'] / max(accumulated['count'], 1):.4f}")
            evaluating = step % every == 0 or step == total_steps
            if evaluating:
                epoch = step / per_epoch
                log.log(step, epoch, "train", {"loss": accumulated["loss_sum"] / max(accumulated["count"], 1.0),
                                               "learning_rate": learning_rate})
                outputs, loss = run_eval(evaluate, state.params, validation, config.eval.batch_size, mesh)
                record = log.log(step, epoch, report.VALIDATION,
                                 {"loss": loss, **task.metrics(outputs, validation, labels)})
                if main_metric not in record:
                    raise ValueError(f"eval.main_metric: {main_metric!r} is not a metric of this task; its metrics: "
                                     f"{sorted(k for k in record if k not in ('step', 'epoch', 'split'))}")
                _say(bar, say, f"step {step} epoch {epoch:.2f}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in record.items() if isinstance(v, float) and k != "epoch"))
                if best is None or report.improves(main_metric, record[main_metric], best[main_metric]):
                    best = record
                    save_best(workdir / BEST_DIR, model, state.params, tokenizer, task, labels, config,
                              lambda text: _say(bar, say, text), token_ids=token_ids)
                accumulated = {"loss_sum": 0.0, "count": 0.0}
                if patience and report.evaluations_since_best(log.records, main_metric) >= patience:
                    stopped_early = True
                    _say(bar, say, f"early stopping: no better {main_metric} in {patience} evaluations")
            stop = watch.should_stop(step)
            if evaluating or step % config.checkpoint.every == 0 or step == end or stop:
                checkpointer.save(step, state, accumulated)
                last_saved = step
            if stop and step < total_steps:
                _say(bar, say, f"{watch.reason}: saved a checkpoint at step {step}; rerun the same command to resume")
                break
    finally:
        watch.close()
        if bar is not None:
            bar.close()
        log.close()
        checkpointer.close()
    results = report.write_results(workdir, task.name, main_metric,
                                   {"steps": step, "total_steps": total_steps, "stopped_early": stopped_early,
                                    "finished": step == total_steps or stopped_early, **speed.summary()},
                                   records=log.records, write=primary)
    if primary:
        report.plot(workdir, main_metric)
    return FinetuneResult(workdir, results, start_step, step, time.time() - started, model, state.params, labels)
