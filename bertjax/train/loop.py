"""The pretraining loop: build everything from the run config, resume if the workdir has a checkpoint, train,
evaluate, checkpoint, and stop cleanly on preemption.

    result = pretrain(load_run_config("configs/pretrain/tiny.yaml"), "runs/tiny")

The workdir holds `config.yaml` (the resolved run config), `model_config.json` (the model's EncoderConfig and
head), `tokenizer/`, `checkpoints/`, `metrics.jsonl`, `tensorboard/` and, at the end, `loss.png`. Running the same
command again in the same workdir continues from the latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

import jax

from bertjax.train import feed as feed_lib
from bertjax.train import flops as flops_lib
from bertjax.train import mesh as mesh_lib
from bertjax.train import workdir as workdir_lib
from bertjax.train.checkpoints import Checkpointer, open_for_resume
from bertjax.train.distributed import PreemptionWatch, check_same_everywhere, run_settings
from bertjax.train.guards import NonFiniteGuard
from bertjax.train.metrics import MetricsLogger, plot_loss, read_metrics
from bertjax.train.objectives import Objective
from bertjax.train.run_config import RunConfig
from bertjax.train.setup import schedule_change_on_resume, setup_run
from bertjax.train.state import count_params, unsplit_parameters_note
from bertjax.train.unused_params import undecayed_note
from bertjax.train.step import COUNT_METRICS
from bertjax.train.workdir import CONFIG_FILE  # noqa: F401 (the resolved run config in a workdir)

log = logging.getLogger(__name__)



@dataclasses.dataclass
class PretrainResult:
    workdir: Path
    start_step: int  # where this invocation started (0, or the restored checkpoint)
    final_step: int
    preempted: bool  # stopped by SIGTERM after saving a checkpoint
    eval_loss_start: float | None  # held-out loss before any training (from metrics.jsonl on a resumed run)
    eval_loss_end: float | None  # the latest held-out loss: at the end, or at eval_loss_end_step when stopped early
    seconds: float
    model: Any  # the Flax module of the objective's main model (the MLM model, the discriminator, the student)
    params: Any  # its final parameters (global arrays over the mesh)
    tokenizer: Any
    eval_loss_end_step: int | None = None  # the step eval_loss_end was measured at


def _peak_flops(config: RunConfig, dtype: str, logger: MetricsLogger) -> float | None:
    """Per-device FLOP/s that MFU is relative to, or None (no MFU) on an accelerator with no datasheet peak here."""
    if config.train.peak_tflops_per_device is not None:
        return config.train.peak_tflops_per_device * 1e12
    device = jax.devices()[0]
    peak = flops_lib.peak_flops_per_device(device)
    if peak is not None:
        logger.message(f"MFU is relative to the datasheet's dense bf16 peak of a {device.device_kind}: "
                       f"{peak / 1e12:g} TFLOP/s per device (train.peak_tflops_per_device sets another)")
    elif device.platform == "cpu":
        import jax.numpy as jnp
        peak = flops_lib.measure_peak_flops(jnp.dtype(dtype))
        logger.message(f"MFU is relative to this machine's measured {dtype} matmul rate: {peak / 1e9:.1f} GFLOP/s "
                       f"per device ({device.device_kind} has no published peak)")
    else:
        # A small timed matmul on a large accelerator measures its launch overhead, not its peak: MFU against it
        # would read several times too high.
        logger.message(f"MFU is not reported: bertjax.train.flops has no datasheet peak for a {device.device_kind}; "
                       f"set train.peak_tflops_per_device to its dense bf16 TFLOP/s")
    return peak


class _Throughput:
    """Tokens/s and MFU between log points, excluding compilation and evaluation time."""

    def __init__(self, objective: Objective, peak_per_device: float | None):
        self.objective, self.peak = objective, peak_per_device
        self.start: float | None = None
        self.steps: list[tuple[int, dict]] = []

    def restart(self) -> None:
        self.start, self.steps = time.perf_counter(), []

    def add(self, seq_len: int, metrics: dict) -> None:
        if self.start is not None:
            self.steps.append((seq_len, metrics))

    def report(self) -> dict[str, float]:
        """Call after the latest metrics were fetched (so every counted step has finished)."""
        if self.start is None or not self.steps:
            return {}
        seconds = time.perf_counter() - self.start
        counts = jax.device_get([{k: m[k] for k in COUNT_METRICS} for _, m in self.steps])
        tokens = sum(float(c["tokens"]) for c in counts)
        model_flops = sum(self.objective.train_flops(seq_len=seq_len, tokens=float(c["tokens"]),
                                                     predictions=float(c["predictions"]), rows=float(c["rows"]))
                          for (seq_len, _), c in zip(self.steps, counts))
        out = {"tokens_per_sec": tokens / seconds}
        if self.peak is not None:
            out["mfu"] = flops_lib.mfu(model_flops, seconds, jax.device_count(), self.peak)
        return out


@workdir_lib.exclusive(check=workdir_lib.check_pretraining_workdir,  # the lock; a failed setup leaves nothing
                       record=workdir_lib.MODEL_CONFIG_FILE)
def pretrain(config: RunConfig, workdir: str | Path, *,
             on_log: Callable[[int, dict[str, float]], bool | None] | None = None) -> PretrainResult:
    """Train `config` in `workdir`, resuming from its latest checkpoint (what `bertjax pretrain` runs).

    `on_log(step, metrics)` is called with every record written to metrics.jsonl (a live plot in a notebook, an
    early stop), the held-out loss at step 0 and the phase records included. Returning True for a train step's
    record stops the run there as Ctrl-C does: a checkpoint is saved and calling `pretrain` again resumes from it
    (the answer to any other record, a phase's start or the step-0 held-out loss, is ignored). On several processes
    it is called on each with the same metrics and must decide the same everywhere.
    `config_path` (a keyword, taken by workdir.exclusive): the run config's file, named in the workdir
    checks' errors when it is the workdir's own config.yaml.
    """
    began = time.perf_counter()
    workdir = Path(workdir).absolute()
    primary = jax.process_index() == 0
    config = _with_objective_tokenizer(config)  # as config.yaml records it, so a rerun compares equal
    check_same_everywhere(run_settings(config), "Start every host with the same --config file and overrides "
                          "(launch/tpu_pod.sh copies one to every worker).")
    # Only a checkpoint pins the model: a workdir whose run saved none starts over with these settings.
    resumable = workdir_lib.has_checkpoint(workdir, config.checkpoint)
    changed = workdir_lib.check_rerun(workdir, config, resumable)  # before anything is written

    tokenizer = feed_lib.prepare_tokenizer(config, workdir)
    setup = setup_run(config, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, sep_id=tokenizer.sep_id)
    objective, model_config, mesh = setup.objective, setup.model_config, setup.mesh
    description = model_description(objective)
    if resumable:
        workdir_lib.check_model_config(workdir, description)
    phases = setup.phases
    total = feed_lib.total_steps(phases)

    checkpointer, restore_step = open_for_resume(config.checkpoint, workdir)
    if restore_step is not None:
        state, feed_state = checkpointer.restore(restore_step, setup.abstract_state())
        checkpointer.set_aside_after(restore_step)
    else:
        state = setup.fresh_state()
        feed_state = None
    start = int(jax.device_get(state.step))
    # A checkpoint at or past the run's length: nothing trains, and config.yaml keeps describing the run that
    # saved it (rewriting it with the smaller train.steps would make the next rerun compare against that).
    done_before = restore_step is not None and start >= total
    if done_before and primary:
        by_tokens = any(phase.tokens is not None for phase in config.train.phases)
        length, more = ((f"the {total} steps of train.phases' token budgets", "the phases' token budgets")
                        if by_tokens else (f"train.steps ({total})", f"train.steps above {start}"))
        log.warning("workdir %s is already at step %d >= %s: nothing to train; its config.yaml keeps the settings "
                    "of the run that saved step %d. Raise %s to train further", workdir, start, length, start, more)
    held_steps = next((held for key, held, _ in changed if key == "train.steps"), None)
    if restore_step is not None and not done_before and isinstance(held_steps, int) and primary:
        note = schedule_change_on_resume(config, held_steps, mesh_lib.batch_shards(mesh), start)
        if note is not None:
            log.warning("%s", note)
    notes = [phase.data.capped_masking_note() for phase in phases]
    notes.append(unsplit_parameters_note(objective.init_params, mesh) if primary and not done_before else None)
    for note in dict.fromkeys(notes):
        if note is not None and primary and not done_before:
            log.warning("%s", note)
    feed = feed_lib.TrainFeed(phases, tokenizer, mesh, config.train.seed)
    eval_cache: dict[int, list] = {}
    try:
        feed.start(start, feed_state)  # checks the data against the tokenizer
        if config.eval.at_start or config.eval.at_end or config.eval.every:  # fails now if nothing is held out
            phase = feed_lib.phase_at(phases, max(start - 1, 0))
            eval_cache[phase.index] = feed_lib.eval_batches(phase.data, tokenizer, mesh, config.eval.batches)
        # Only now that the state is there and the data fits the tokenizer: a run that fails before this point in
        # a new workdir leaves nothing behind (workdir.exclusive), so the corrected command starts afresh.
        if not (done_before and (workdir / CONFIG_FILE).is_file()):
            workdir_lib.record_run(workdir, config, description)
    except BaseException:
        feed.close()
        raise

    logger = MetricsLogger(workdir, total_steps=total, start_step=start, is_primary=primary,
                           progress_bar=config.train.progress_bar, process_index=jax.process_index())
    logger.message(f"{config.model.preset} trained by objective {objective.name} "
                   f"({count_params(state.params) / 1e6:.2f}M trainable parameters), mesh "
                   f"{dict(mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} device(s), "
                   f"{'resuming from step ' + str(start) if start else 'starting'}; workdir {workdir}")
    undecayed = undecayed_note(setup.unused, config.optimizer.weight_decay)
    if undecayed is not None:
        logger.message(undecayed)
    frozen = setup.frozen

    def evaluate(step: int) -> dict[str, float]:
        phase = feed_lib.phase_at(phases, max(step - 1, 0))  # the phase just trained
        if phase.index not in eval_cache:
            eval_cache[phase.index] = feed_lib.eval_batches(phase.data, tokenizer, mesh, config.eval.batches)
        eval_step = setup.steps_for(phase)[1]
        sums = None
        for batch in eval_cache[phase.index]:
            batch_sums = eval_step(state.params, frozen, batch)
            sums = batch_sums if sums is None else jax.tree.map(lambda a, b: a + b, sums, batch_sums)
        values = jax.device_get(objective.metrics(sums))
        return {f"eval_{name}": float(value) for name, value in values.items()}

    def publish(step: int, record: dict) -> bool:
        """Write a record to metrics.jsonl and show it to on_log; whether on_log asked to stop."""
        logger.log(step, record)
        return bool(on_log is not None and on_log(step, record))

    throughput = _Throughput(objective, _peak_flops(config, model_config.dtype, logger))
    if feed.reshard_report is not None:  # the checkpoint was written by another number of processes
        log.warning("%s", feed.reshard_report.message())
        publish(start, feed.reshard_report.metrics())
    watch = PreemptionWatch()
    nonfinite = NonFiniteGuard(config.train.nonfinite)
    last_saved = restore_step
    eval_start = eval_end = eval_end_step = None
    step, preempted = start, False
    try:
        if start == 0 and config.eval.at_start:
            record = evaluate(0)
            publish(0, record)
            eval_start = record["eval_loss"]
        while step < total:
            phase = feed_lib.phase_at(phases, step)
            if step == phase.start and len(phases) > 1:  # the boundaries a run used, for readers and the plot
                publish(step, {"phase": phase.index, "phase_start": phase.label, "batch_size": phase.batch_at(step),
                               "seq_len": phase.data.seq_len})
            seq_len = phase.data.seq_len
            state, metrics = setup.steps_for(phase)[0](state, frozen, _next_batch(feed, step, checkpointer,
                                                                                  state, nonfinite, last_saved))
            step += 1
            checkpointer.record_finished()  # a completed save gets its checksums now, not at the next save
            throughput.add(seq_len, metrics)
            nonfinite.observe(step, metrics)
            logger.advance()
            last = step == total
            stop = watch.should_stop(step)
            stop_reason = watch.reason
            eval_due = (last and config.eval.at_end) or (
                config.eval.every > 0 and step % config.eval.every == 0 and not last)
            save_due = step % config.checkpoint.every == 0 or last or stop
            if step % config.train.log_every == 0 or last or eval_due or stop:
                record = {k: v for k, v in jax.device_get(metrics).items() if k not in COUNT_METRICS}
                record.update(phase=phase.index, batch_size=phase.batch_at(step - 1))
                record.update(throughput.report())
                if eval_due:
                    record.update(evaluate(step))
                    eval_end, eval_end_step = record["eval_loss"], step
                asked_to_stop = publish(step, record)
                throughput.restart()
                if asked_to_stop and not last:
                    stop, save_due, stop_reason = True, True, "on_log asked to stop"
            elif throughput.start is None:
                jax.block_until_ready(metrics)  # the first step compiled: time from here on
                throughput.restart()
            if save_due or step % config.train.log_every == 0:
                nonfinite.check(last_saved)  # stop mode: raises before a non-finite state is saved
            if save_due:
                checkpointer.save(step, state, feed.state())
                last_saved = step
            if stop and not last:
                preempted = True
                logger.message(f"{stop_reason}: saved a checkpoint at step {step} and stopped; rerun the same command "
                               "to resume")
                break
    finally:
        watch.close()
        feed.close()
        checkpointer.close()
        logger.close()
    exports = objective.exports(state.params)
    if len(exports) > 1 and not preempted:
        save_exports(workdir, exports, tokenizer)
    if primary:
        plot_loss(workdir)
        records = read_metrics(workdir)
        evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
        if eval_start is None and evals and records and any(r["step"] == 0 and "eval_loss" in r for r in records):
            eval_start = next(r["eval_loss"] for r in records if r["step"] == 0 and "eval_loss" in r)
        if eval_end is None and not preempted and len(evals) > 1:
            eval_end_step, eval_end = evals[-1]
    primary_model, primary_params = next(iter(exports.values()))
    return PretrainResult(workdir=workdir, start_step=start, final_step=step, preempted=preempted,
                          eval_loss_start=eval_start, eval_loss_end=eval_end, eval_loss_end_step=eval_end_step,
                          seconds=time.perf_counter() - began, model=primary_model, params=primary_params,
                          tokenizer=tokenizer)


def _next_batch(feed, step: int, checkpointer: Checkpointer, state, nonfinite: NonFiniteGuard,
                last_saved: int | None) -> dict:
    """The batch of `step`; when the data runs out (data.num_epochs), the steps trained since the last checkpoint
    are saved first, so that a rerun with more epochs (or fewer steps) loses nothing."""
    try:
        return feed.next(step)
    except feed_lib.DataExhausted as error:
        if step and step != last_saved:
            nonfinite.check(last_saved)  # stop mode: a non-finite state is never saved
            checkpointer.save(step, state, feed.state())
            checkpointer.wait()
            raise feed_lib.DataExhausted(f"{error}; saved a checkpoint at step {step}") from None
        raise


def _with_objective_tokenizer(config: RunConfig) -> RunConfig:
    """The run config with the objective's tokenizer (a teacher's) when the config names none."""
    path = config.objective.tokenizer_path()
    if path is None or config.tokenizer.path is not None:
        return config
    return dataclasses.replace(config, tokenizer=dataclasses.replace(config.tokenizer, path=path))


def model_description(objective: Objective) -> dict:
    """`model_config.json`: the objective's main model (head, config) and, when the checkpoint's parameters hold
    several models, the key of its subtree."""
    from bertjax.hf.pretrained import head_of

    model = next(iter(objective.export_models().values()))
    description = {"head": head_of(model), "config": model.config.to_dict()}
    if objective.params_key is not None:
        description["params_key"] = objective.params_key
    frozen = objective.frozen_description()
    if frozen is not None:
        description["frozen"] = frozen
    return description


def save_exports(workdir: Path, exports: dict, tokenizer) -> None:
    """Each model of a multi-model objective (ELECTRA's discriminator and generator) as a bertjax model directory
    `<workdir>/models/<name>/`, with the run's tokenizer, ready for `bertjax convert --to-hf`."""
    from jax.experimental import multihost_utils

    from bertjax.model_dirs import EXPORTS_DIR, save_model_dir_from_process_0

    for name, (model, params) in exports.items():
        # Gathered to every host (a collective), written by process 0 alone: on a pod the workdir is often each
        # host's own disk, where a save by every process into "one" directory never completes.
        host = multihost_utils.process_allgather(params, tiled=True) if jax.process_count() > 1 else params
        save_model_dir_from_process_0(workdir / EXPORTS_DIR / name, model, host, tokenizer)
