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
from typing import Any

import jax

from bertjax.config import EncoderConfig, get_config
from bertjax.models import MODEL_CLASSES
from bertjax.train import feed as feed_lib
from bertjax.train import flops as flops_lib
from bertjax.train import objectives
from bertjax.train import workdir as workdir_lib
from bertjax.train.checkpoints import Checkpointer
from bertjax.train.distributed import PreemptionWatch
from bertjax.train.guards import NonFiniteGuard
from bertjax.train.mesh import build_mesh
from bertjax.train.metrics import MetricsLogger, plot_loss, read_metrics
from bertjax.train.optimizers import build_optimizer
from bertjax.train.run_config import ConfigError, RunConfig
from bertjax.train.schedules import StepClock, build_schedule
from bertjax.train.state import abstract_state, count_params, create_train_state, state_shardings
from bertjax.train.step import make_eval_step, make_train_step
from bertjax.train.workdir import CONFIG_FILE, MODEL_CONFIG_FILE  # noqa: F401 (read by `bertjax fill-mask`)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PretrainResult:
    workdir: Path
    start_step: int  # where this invocation started (0, or the restored checkpoint)
    final_step: int
    preempted: bool  # stopped by SIGTERM after saving a checkpoint
    eval_loss_start: float | None  # held-out loss before any training (from metrics.jsonl on a resumed run)
    eval_loss_end: float | None
    seconds: float
    model: Any  # the Flax module
    params: Any  # the final parameters (global arrays over the mesh)
    tokenizer: Any


def build_model_config(config: RunConfig, tokenizer, max_seq_len: int) -> EncoderConfig:
    """The preset with its overrides; vocabulary size and pad id follow the tokenizer unless overridden."""
    overrides = dict(config.model.overrides)
    overrides.setdefault("vocab_size", tokenizer.vocab_size)
    overrides.setdefault("pad_token_id", tokenizer.pad_id)
    if overrides["vocab_size"] < tokenizer.vocab_size:
        raise ConfigError(f"model.overrides.vocab_size ({overrides['vocab_size']}) is smaller than the tokenizer's "
                          f"vocabulary ({tokenizer.vocab_size})")
    model_config = get_config(config.model.preset, **overrides)
    longest = max_seq_len + model_config.position_offset
    if longest > model_config.max_position_embeddings:
        raise ConfigError(f"data.seq_len ({max_seq_len}) does not fit the model's max_position_embeddings "
                          f"({model_config.max_position_embeddings}); lower it or override the model's")
    return model_config


def _check_objective(config: RunConfig, phases) -> bool:
    """True when the run trains NSP/SOP; the model head and the data must agree."""
    with_nsp = config.model.head == "pretraining"
    for phase in phases:
        has_pairs = phase.data.sentence_objective != "none"
        if has_pairs != with_nsp:
            raise ConfigError(f"model.head={config.model.head!r} needs data.sentence_objective "
                              f"{'nsp or sop' if with_nsp else 'none'}, got {phase.data.sentence_objective!r}")
    return with_nsp


def _peak_flops(config: RunConfig, dtype: str, logger: MetricsLogger) -> float:
    if config.train.peak_tflops_per_device is not None:
        return config.train.peak_tflops_per_device * 1e12
    peak = flops_lib.peak_flops_per_device()
    if peak is None:
        import jax.numpy as jnp
        peak = flops_lib.measure_peak_flops(jnp.dtype(dtype))
        logger.message(f"MFU is relative to this machine's measured {dtype} matmul rate: {peak / 1e9:.1f} GFLOP/s "
                       f"per device ({jax.devices()[0].device_kind} has no published peak)")
    return peak


class _Throughput:
    """Tokens/s and MFU between log points, excluding compilation and evaluation time."""

    def __init__(self, model_config: EncoderConfig, with_nsp: bool, peak_per_device: float):
        self.model_config, self.with_nsp, self.peak = model_config, with_nsp, peak_per_device
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
        counts = jax.device_get([{k: m[k] for k in ("tokens", "predictions", "rows")} for _, m in self.steps])
        tokens = sum(float(c["tokens"]) for c in counts)
        model_flops = sum(flops_lib.train_flops(self.model_config, seq_len=seq_len, tokens=float(c["tokens"]),
                                                predictions=float(c["predictions"]), rows=float(c["rows"]),
                                                with_nsp=self.with_nsp)
                          for (seq_len, _), c in zip(self.steps, counts))
        return {"tokens_per_sec": tokens / seconds,
                "mfu": flops_lib.mfu(model_flops, seconds, jax.device_count(), self.peak)}


@workdir_lib.exclusive  # the workdir's lock; a failed setup leaves no half-made workdir
def pretrain(config: RunConfig, workdir: str | Path) -> PretrainResult:
    began = time.perf_counter()
    workdir = Path(workdir).absolute()
    primary = jax.process_index() == 0
    workdir_lib.check_rerun(workdir, config)  # before anything is written

    phases = feed_lib.plan_phases(config)
    with_nsp = _check_objective(config, phases)
    tokenizer = feed_lib.prepare_tokenizer(config, workdir)
    model_config = build_model_config(config, tokenizer, max(p.data.seq_len for p in phases))
    workdir_lib.check_model_config(workdir, config.model.head, model_config)
    model = MODEL_CLASSES[config.model.head](model_config, remat_policy=config.model.remat_policy)

    mesh = build_mesh(config.mesh)
    feed_lib.check_batch_fits(phases, mesh, config.optimizer.accumulation_steps)
    total = config.train.steps
    clock = StepClock(feed_lib.boundaries(phases), feed_lib.tokens_per_step(phases))
    schedule = build_schedule(config.schedule, config.optimizer.learning_rate, total, clock)
    optimizer = build_optimizer(config.optimizer, schedule)

    checkpointer = Checkpointer(config.checkpoint.directory or workdir / "checkpoints", config.checkpoint)
    restore_step = config.checkpoint.restore_step
    if restore_step is None:
        restore_step = checkpointer.latest_step()
    if restore_step is not None:
        _, shardings = state_shardings(model, optimizer, mesh)
        state, feed_state = checkpointer.restore(restore_step, abstract_state(model, optimizer, mesh))
        abandoned = checkpointer.set_aside_after(restore_step)
        if abandoned and primary:
            log.warning("resuming from step %d: later checkpoints %s moved to %s-abandoned/", restore_step,
                        abandoned, checkpointer.directory)
    else:
        state, shardings = create_train_state(model, optimizer, mesh, config.train.seed)
        feed_state = None
    workdir_lib.record_run(workdir, config, config.model.head, model_config)  # only now that the state is there
    start = int(jax.device_get(state.step))

    logger = MetricsLogger(workdir, total_steps=total, start_step=start, is_primary=primary,
                           progress_bar=config.train.progress_bar, process_index=jax.process_index())
    logger.message(f"{config.model.preset} ({count_params(state.params) / 1e6:.2f}M parameters), mesh "
                   f"{dict(mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} device(s), "
                   f"{'resuming from step ' + str(start) if start else 'starting'}; workdir {workdir}")
    train_step = make_train_step(model, optimizer, schedule, mesh, shardings, with_nsp=with_nsp,
                                 accumulation_steps=config.optimizer.accumulation_steps, seed=config.train.seed,
                                 nonfinite=config.train.nonfinite)
    eval_step = make_eval_step(model, mesh, shardings.params, with_nsp=with_nsp)
    eval_cache: dict[int, list] = {}

    def evaluate(step: int) -> dict[str, float]:
        phase = feed_lib.phase_at(phases, max(step - 1, 0))  # the phase just trained
        if phase.index not in eval_cache:
            eval_cache[phase.index] = feed_lib.eval_batches(phase.data, tokenizer, mesh, config.eval.batches)
        sums = None
        for batch in eval_cache[phase.index]:
            batch_sums = eval_step(state.params, batch)
            sums = batch_sums if sums is None else sums + batch_sums
        values = jax.device_get(objectives.metrics(sums, with_nsp))
        return {f"eval_{name}": float(value) for name, value in values.items()}

    throughput = _Throughput(model_config, with_nsp, _peak_flops(config, model_config.dtype, logger))
    feed = feed_lib.TrainFeed(phases, tokenizer, mesh, config.train.seed)
    feed.start(start, feed_state)
    watch = PreemptionWatch()
    nonfinite = NonFiniteGuard(config.train.nonfinite)
    last_saved = restore_step
    eval_start = eval_end = None
    step, preempted = start, False
    try:
        if start == 0 and config.eval.at_start:
            record = evaluate(0)
            logger.log(0, record)
            eval_start = record["eval_loss"]
        while step < total:
            seq_len = feed_lib.phase_at(phases, step).data.seq_len
            state, metrics = train_step(state, feed.next(step))
            step += 1
            throughput.add(seq_len, metrics)
            nonfinite.observe(step, metrics)
            logger.advance()
            last = step == total
            stop = watch.should_stop(step)
            eval_due = (last and config.eval.at_end) or (
                config.eval.every > 0 and step % config.eval.every == 0 and not last)
            save_due = step % config.checkpoint.every == 0 or last or stop
            if step % config.train.log_every == 0 or last or eval_due or stop:
                record = {k: v for k, v in jax.device_get(metrics).items()
                          if k not in ("tokens", "predictions", "rows")}
                record.update(throughput.report())
                if eval_due:
                    record.update(evaluate(step))
                    eval_end = record["eval_loss"]
                logger.log(step, record)
                throughput.restart()
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
                logger.message(f"{watch.reason}: saved a checkpoint at step {step} and stopped; rerun the same command "
                               "to resume")
                break
    finally:
        watch.close()
        feed.close()
        checkpointer.close()
        logger.close()
    if primary:
        plot_loss(workdir)
        records = read_metrics(workdir)
        evals = [r["eval_loss"] for r in records if "eval_loss" in r]
        if eval_start is None and evals and records and any(r["step"] == 0 and "eval_loss" in r for r in records):
            eval_start = next(r["eval_loss"] for r in records if r["step"] == 0 and "eval_loss" in r)
        if eval_end is None and not preempted and len(evals) > 1:
            eval_end = evals[-1]
    return PretrainResult(workdir=workdir, start_step=start, final_step=step, preempted=preempted,
                          eval_loss_start=eval_start, eval_loss_end=eval_end,
                          seconds=time.perf_counter() - began, model=model, params=state.params,
                          tokenizer=tokenizer)
