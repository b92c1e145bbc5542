"""Contrastive fine-tuning of an embedding model: a model directory + pairs -> a workdir with a sentence-transformers
model (what `bertjax train-embedder` runs).

    model dir -> SentenceEncoder (backbone, pooling, Dense, tokenizer, prompts) -> pairs, tokenized once
    -> one jitted train step under the mesh rules: embed anchors, positives (and hard negatives) -> in-batch
       ranking loss with the negatives all-gathered over the mesh -> AdamW (pretraining's optimizer and schedule)
       (train.mini_batch_size: GradCache, chunk by chunk)
    -> retrieval evaluation on the validation pairs (recall@k, MRR@k) -> metrics.jsonl, TensorBoard, loss.png
    -> orbax checkpoints (rerunning resumes) -> model/ (a sentence-transformers directory)

The workdir follows pretraining's conventions and reuses its pieces: the lock (bertjax.train.workdir), the
checkpointer, the metrics logger and plot, the preemption watch (SIGTERM or Ctrl-C save and stop) and the
non-finite guard. The batch of every step is a pure function of (seed, step) and dropout keys are folded from the
step, so a resumed run repeats exactly what the interrupted run would have done.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import yaml

from bertjax.embeddings.contrastive import (cached_loss_and_grads, mesh_ranking_loss, uncached_loss_and_grads)
from bertjax.embeddings.batches import PairBatches
from bertjax.embeddings.pairs import Pairs, read_pairs, resolve_prompt, tokenize_columns, tokenize_pairs
from bertjax.embeddings.retrieval_metrics import pair_corpus, retrieval_metrics
from bertjax.embeddings.train_config import EmbedderConfig, embedder_config_from_dict, save_embedder_config
from bertjax.train import mesh as mesh_lib
from bertjax.train import workdir as workdir_lib
from bertjax.train.optimizers import TRAINER_OPTIMIZER_KEYS, build_optimizer, trainer_adamw
from bertjax.train.run_config import ConfigError, ScheduleConfig
from bertjax.train.unused_params import undecayed_note, unused_parameters

log = logging.getLogger(__name__)

RUN_FILE = "train_embedder.json"  # which model and data files the workdir's run trains on
MODEL_DIR = "model"  # the final sentence-transformers directory
# Settings a resumed run may change: how long it trains (listed in the warning: the schedule becomes the longer
# run's), how it is shown, evaluated, checkpointed and sharded, and what it does on a non-finite loss. Everything
# else decides the model's output, the pairs of each step (seed, batch size, data) or the optimizer's trajectory
# (learning rate, warmup, weight decay, clipping), so a changed value would not continue the run the checkpoints
# hold. (Fine-tuning's RESUMABLE_CHANGES is narrower: its evaluation picks best/ and stops early, and its epochs
# fix the schedule, so there only the display, eval.every, eval.batch_size, checkpoint and mesh may change.)
RESUMABLE_CHANGES = ("train.epochs", "train.steps", "train.log_every", "train.progress_bar", "train.nonfinite",
                     "eval", "checkpoint", "mesh")


@dataclasses.dataclass
class EmbedderResult:
    workdir: Path
    start_step: int
    final_step: int
    total_steps: int
    preempted: bool
    eval_start: dict | None  # retrieval metrics before training (None without validation pairs)
    eval_end: dict | None  # the latest evaluation's metrics
    seconds: float
    encoder: Any  # the trained SentenceEncoder (parameters on the host)
    model_dir: Path | None  # <workdir>/model, once the run finished
    eval_end_step: int | None = None  # the step of eval_end (before final_step when a run stopped between evals)


# ---------------------------------------------------------------------------------------------------------------
# The model.

def load_encoder(model_dir: str | Path, config: EmbedderConfig, allow_pickle: bool = False):
    """The SentenceEncoder to train: the directory's (sentence-transformers settings kept), with the run config's
    pooling changes and maximum length, its similarity (what the evaluation scores with and the saved model's
    `similarity_fn_name`) and its prompts (`trained_prompts`)."""
    from bertjax.embeddings import load_sentence_encoder

    encoder = load_sentence_encoder(model_dir, allow_pickle=allow_pickle)
    encoder = encoder.replace(similarity_fn_name=config.loss.similarity, prompts=trained_prompts(encoder, config))
    changes = {k: v for k, v in (("modes", config.pooling.modes), ("normalize", config.pooling.normalize))
               if v is not None}
    if changes:
        encoder = encoder.replace(pooling=encoder.pooling.replace(**changes))
    if config.data.max_length is not None:
        limit = encoder.config.max_position_embeddings - encoder.config.position_offset
        if not 2 <= config.data.max_length <= limit:
            raise ConfigError(f"data.max_length must be in [2, {limit}] (the positions of {model_dir}), got "
                              f"{config.data.max_length}")
        encoder = encoder.replace(max_seq_length=config.data.max_length)
    # Train in float32, master weights included: the loaded directory may store a fast-inference bfloat16, whose
    # parameters would round away most updates at these learning rates.
    return encoder.replace(model=encoder.model.clone(config=encoder.config.replace(dtype="float32",
                                                                                   param_dtype="float32")))


def trained_prompts(encoder, config: EmbedderConfig) -> dict[str, str]:
    """The model's prompts, plus the texts this run puts before anchors (as "query") and before positives and
    negatives (as "document") where a setting is a text rather than one of the model's prompt names: the saved
    model then embeds queries as it was trained to (`bertjax search` and sentence-transformers'
    `prompt_name="query"`)."""
    prompts = dict(encoder.prompts)
    for name, setting in (("query", config.data.anchor_prompt), ("document", config.data.positive_prompt)):
        if setting and setting not in encoder.prompts:
            prompts[name] = setting
    return prompts


def make_embed(model, param_shardings, prompt_lengths: np.ndarray, deterministic: bool):
    """(params, rows, key) -> float32 [n, columns, dim]: every text of rows {input_ids, segment_ids} [n, columns,
    seq] embedded, one text per row of the flattened [n * columns, seq] batch (batch-major, so each device keeps
    its rows). The prompt length of each text (used when the pooling leaves prompts out) is rows["prompt_lengths"]
    [n, columns] when given, else `prompt_lengths` [columns]. `param_shardings` None: the parameters as given
    (tracing outside a step)."""
    lengths = jnp.asarray(prompt_lengths, jnp.int32)

    def embed(params, rows, key):
        if param_shardings is not None:
            params = mesh_lib.gathered_for_compute(params, param_shardings)
        ids, segments = rows["input_ids"], rows["segment_ids"]
        n, columns, seq = ids.shape
        prompts = None
        if not model.pooling.include_prompt:
            prompts = rows.get("prompt_lengths", jnp.broadcast_to(lengths[None, :columns], (n, columns)))
            prompts = prompts.reshape(n * columns, 1)
        vectors = model.apply({"params": params}, ids.reshape(n * columns, seq), segments.reshape(n * columns, seq),
                              1, prompts, deterministic=deterministic,
                              rngs=None if deterministic else {"dropout": key})
        return vectors[:, 0].reshape(n, columns, -1)

    return embed


def make_steps(model, optimizer, schedule, mesh, shardings, config: EmbedderConfig, prompt_lengths: np.ndarray):
    """(train_step(state, batch) -> (state, metrics), embed_step(params, batch) -> [rows, columns, dim])."""
    from bertjax.train import guards
    from bertjax.train.state import TrainState
    from bertjax.train.step import JittedStep, batch_shardings

    base_key = jax.random.key(config.train.seed)
    train_embed = make_embed(model, shardings.params, prompt_lengths, deterministic=False)
    eval_embed = make_embed(model, shardings.params, prompt_lengths, deterministic=True)
    ranking = mesh_ranking_loss(mesh, mesh_lib.BATCH_AXES, scale=config.loss.scale, symmetric=config.loss.symmetric,
                                similarity=config.loss.similarity)
    mini = config.train.mini_batch_size
    chunks = config.train.batch_size // mini if mini else 1

    def loss_of(embeddings):  # [batch, columns, dim]: anchors, positives, hard negatives
        negatives = embeddings[:, 2:] if embeddings.shape[1] > 2 else None
        return ranking(embeddings[:, 0], embeddings[:, 1], negatives)

    def train_step(state, batch):
        key = jax.random.fold_in(base_key, state.step)  # dropout depends only on the step: exact resume
        rows = {"input_ids": batch["input_ids"], "segment_ids": batch["segment_ids"]}
        if chunks > 1:
            loss, grads = cached_loss_and_grads(train_embed, loss_of, state.params, rows, key, chunks,
                                                mesh_lib.BATCH_AXES)
        else:
            loss, grads = uncached_loss_and_grads(train_embed, loss_of, state.params, rows, key)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "learning_rate": schedule(state.step)}
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
        if config.train.nonfinite == "skip":
            return guards.keep_finite_update(state, new_state, metrics)
        return new_state, metrics

    def embed_step(params, batch):
        return eval_embed(params, batch, None)

    train = JittedStep(train_step, mesh, lambda batch: (shardings, batch_shardings(mesh, batch)),
                       out_shardings=(shardings, mesh_lib.replicated(mesh)), donate_argnums=(0,))
    embed = JittedStep(embed_step, mesh, lambda batch: (shardings.params, batch_shardings(mesh, batch)),
                       out_shardings=mesh_lib.replicated(mesh))
    return train, embed


# ---------------------------------------------------------------------------------------------------------------
# Evaluation.

def embed_texts(embed_step, params, encoder, texts: list[str], prompt: str | None, batch_size: int,
                mesh) -> np.ndarray:
    """float32 [len(texts), dim] through the jitted deterministic embedding (one text per row)."""
    from bertjax.data.global_batch import from_full_batch

    arrays = tokenize_columns(encoder, [texts], [prompt])
    prompt_lengths = np.broadcast_to(arrays["prompt_lengths"][None, :], (batch_size, 1)).copy()
    out = []
    for start in range(0, len(texts), batch_size):
        chosen = np.arange(start, min(start + batch_size, len(texts)))
        padded = np.concatenate([chosen, np.zeros(batch_size - len(chosen), np.int64)])
        batch = {k: arrays[k][padded] for k in ("input_ids", "segment_ids")}
        if not encoder.pooling.include_prompt:
            batch["prompt_lengths"] = prompt_lengths
        out.append(np.asarray(embed_step(params, from_full_batch(batch, mesh, mesh_lib.BATCH_AXES)))[:len(chosen), 0])
    return np.concatenate(out)


class RetrievalEval:
    """recall@k and MRR@k of the validation anchors against the validation positives (and negatives)."""

    def __init__(self, pairs: Pairs, encoder, config: EmbedderConfig):
        self.pairs, self.encoder, self.config = pairs, encoder, config
        negatives = [text for column in pairs.negatives or () for text in column]
        self.corpus, self.gold = pair_corpus(pairs.positives, negatives)
        self.query_prompt = resolve_prompt(encoder, config.data.anchor_prompt)
        self.document_prompt = resolve_prompt(encoder, config.data.positive_prompt)

    def __call__(self, embed_step, params, mesh) -> dict[str, float]:
        size = self.config.eval.batch_size
        queries = embed_texts(embed_step, params, self.encoder, self.pairs.anchors, self.query_prompt, size, mesh)
        corpus = embed_texts(embed_step, params, self.encoder, self.corpus, self.document_prompt, size, mesh)
        metrics = retrieval_metrics(queries, corpus, self.gold, self.config.eval.k, self.encoder.similarity_fn_name)
        return {f"eval_{name}": value for name, value in metrics.items()}


# ---------------------------------------------------------------------------------------------------------------
# The workdir.

def _identity(model_dir, train_file, validation_file) -> dict:
    return {"model": workdir_lib.path_identity(model_dir),
            **workdir_lib.data_identity({"train": train_file, "validation": validation_file})}


def resumable_changes(drops_out: bool) -> tuple[str, ...]:
    """RESUMABLE_CHANGES, with train.mini_batch_size when the model has no dropout: GradCache's chunking then
    changes only memory, while with dropout chunk c draws its masks from fold_in(step key, c) (the uncached step
    from the step key), so another chunking trains with other masks."""
    return RESUMABLE_CHANGES if drops_out else (*RESUMABLE_CHANGES, "train.mini_batch_size")


def check_rerun(workdir: Path, config: EmbedderConfig, identity: dict, resumable: bool, *, drops_out: bool) -> None:
    """A workdir holds one run: another model or data file (path, or contents at the same path), or a setting
    outside `resumable_changes(drops_out)` (`drops_out`: the model's dropout rate is above 0), is refused naming
    it; the other changes (more epochs or steps, another evaluation interval) are allowed with a warning. Without
    a checkpoint (`resumable` False: a run that failed before its first save) there is nothing to resume, and the
    run starts over."""
    if not resumable:
        if (workdir / RUN_FILE).is_file() and jax.process_index() == 0:
            log.warning("workdir %s holds no checkpoint of its earlier run: starting over with these settings",
                        workdir)
        return
    run_file = workdir / RUN_FILE
    if run_file.is_file():
        workdir_lib.check_same_identity(workdir, workdir_lib.read_run_file(run_file), identity,
                                        paths=("model", "train", "validation"))
    saved = workdir / workdir_lib.CONFIG_FILE
    if not saved.is_file():
        return
    try:
        held_values = yaml.safe_load(saved.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{saved} is not valid YAML ({workdir_lib.yaml_problem(error)}); this workdir's run "
                          "config is damaged: restore it, or use a new --workdir") from None
    found = workdir_lib.recorded_differences(workdir, held_values, config, embedder_config_from_dict)
    try:
        held = embedder_config_from_dict(held_values)
    except ConfigError:  # written by another version: the restore's own structure check still applies
        held = None
    if held is not None:  # first: the more specific error for clipping turned on or off
        workdir_lib.check_optimizer_state(workdir, trainer_adamw(held.train), trainer_adamw(config.train),
                                         TRAINER_OPTIMIZER_KEYS)
    workdir_lib.check_resumable(workdir, found, resumable_changes(drops_out))
    if found and jax.process_index() == 0:
        log.warning("resuming %s with changed settings: %s", workdir, workdir_lib.describe_differences(found))


def save_final_model(directory: Path, encoder, params) -> Any:
    """The trained encoder (host parameters) written as a sentence-transformers directory by process 0."""
    from jax.experimental import multihost_utils

    from bertjax.embeddings import save_sentence_encoder

    host = multihost_utils.process_allgather(params, tiled=True)  # every process: it is a collective
    trained = encoder.replace(params=jax.tree.map(np.asarray, host))
    if jax.process_index() == 0:
        save_sentence_encoder(trained, directory)
    return trained


# ---------------------------------------------------------------------------------------------------------------
# The run.

def train_embedder(config: EmbedderConfig, workdir: str | Path, model_dir: str | Path, train_file: str | Path,
                   validation_file: str | Path | None = None, *, stop_after: int | None = None,
                   on_log: Callable[[int, dict], bool | None] | None = None,
                   config_path: str | Path | None = None, allow_pickle: bool = False) -> EmbedderResult:
    """Train in `workdir`, resuming from its latest checkpoint. `stop_after` ends this invocation after that many
    steps, as a kill would after a checkpoint (used to test resuming). `config_path`: the run config's file, named
    when it is the workdir's own config.yaml (which the run rewrites).

    The model is loaded first, before the workdir is made or locked: a model that cannot be trained (a tokenizer
    larger than its vocabulary, a data.max_length past its positions) is refused with nothing written."""
    began = time.perf_counter()
    workdir_lib.check_local_workdir(workdir, workdir_lib.RUN_FILES[RUN_FILE])  # before the model loads
    encoder = load_encoder(model_dir, config, allow_pickle)
    return _train(config, workdir, model_dir, train_file, validation_file, encoder, began=began,
                  stop_after=stop_after, on_log=on_log, config_path=config_path)


def _check_workdir(workdir: Path, config: EmbedderConfig, config_path: str | Path | None) -> None:
    workdir_lib.check_workdir_is_for(workdir, RUN_FILE, config.checkpoint, config_path)


@workdir_lib.exclusive(check=_check_workdir, record=RUN_FILE)
def _train(config: EmbedderConfig, workdir: Path, model_dir: str | Path, train_file: str | Path,
           validation_file: str | Path | None, encoder, *, began: float, stop_after: int | None,
           on_log: Callable[[int, dict], bool | None] | None) -> EmbedderResult:
    """`train_embedder` with the loaded encoder, holding the workdir's lock."""
    from bertjax.data.global_batch import from_full_batch
    from bertjax.models import abstract_params
    from bertjax.train.checkpoints import open_for_resume
    from bertjax.train.distributed import PreemptionWatch, check_same_everywhere, run_settings
    from bertjax.train.guards import NonFiniteGuard
    from bertjax.train.metrics import MetricsLogger, plot_loss, read_metrics
    from bertjax.train.schedules import build_schedule, warmup_steps
    from bertjax.train.state import count_params, start_or_resume

    workdir = Path(workdir)
    primary = jax.process_index() == 0
    identity = _identity(model_dir, train_file, validation_file)
    check_same_everywhere(run_settings(config, data_files=identity[workdir_lib.FINGERPRINTS]),
                          "Start every host with the same command, config and data files.")
    checkpointer, start = open_for_resume(config.checkpoint, workdir)
    check_rerun(workdir, config, identity, resumable=start is not None, drops_out=encoder.config.dropout_rate > 0)

    pairs = read_pairs(train_file, config.data)
    validation = read_pairs(validation_file, config.data) if validation_file is not None else None
    mesh = mesh_lib.build_mesh(config.mesh)
    shards = mesh_lib.batch_shards(mesh)
    rows_per_chunk = config.train.mini_batch_size or config.train.batch_size
    if rows_per_chunk % shards or config.eval.batch_size % shards:
        raise ConfigError(f"train.batch_size ({config.train.batch_size}), train.mini_batch_size "
                          f"({config.train.mini_batch_size}) and eval.batch_size ({config.eval.batch_size}) must "
                          f"divide over the {shards} batch shards of the mesh")
    batches = PairBatches(pairs.columns, config.train.batch_size, config.train.seed, config.train.batch_sampler)
    if batches.batches_in_epoch(0) == 0:
        raise ValueError(f"{train_file}: {len(pairs)} pairs, fewer than train.batch_size ({config.train.batch_size})"
                         f"{' that share no text' if config.train.batch_sampler == 'no_duplicates' else ''}; lower "
                         "train.batch_size or give more pairs")
    total = config.train.steps or batches.steps_in(config.train.epochs)
    arrays = tokenize_pairs(encoder, pairs, config.data.anchor_prompt, config.data.positive_prompt)

    schedule = build_schedule(ScheduleConfig(name="linear", warmup=warmup_steps(config.train.warmup_ratio, total)),
                              config.train.learning_rate, total)
    model = encoder.model
    # Parameters no embedding depends on (a Longformer's global projections) do not decay, as sentence-transformers'
    # AdamW leaves them. The loss reads every embedding, so the forward alone decides.
    rows = {key: arrays[key][:config.train.batch_size] for key in ("input_ids", "segment_ids")}
    unused = unused_parameters(make_embed(model, None, arrays["prompt_lengths"], deterministic=False),
                               abstract_params(model), rows, jax.random.key(0))
    optimizer = build_optimizer(trainer_adamw(config.train), schedule, unused)
    start = start or 0
    state, shardings, accumulated, fresh = start_or_resume(model, optimizer, mesh, checkpointer, start,
                                                           config.train.seed, encoder.params)
    if fresh:
        raise ValueError(f"{model_dir}: the model directory lacks parameters {fresh} of the embedding model")
    if primary:
        save_embedder_config(config, workdir / workdir_lib.CONFIG_FILE)
        (workdir / RUN_FILE).write_text(json.dumps(identity, indent=1) + "\n")
    train_step, embed_step = make_steps(model, optimizer, schedule, mesh, shardings, config, arrays["prompt_lengths"])
    evaluate = RetrievalEval(validation, encoder, config) if validation is not None else None

    logger = MetricsLogger(workdir, total_steps=total, start_step=start, is_primary=primary,
                           progress_bar=config.train.progress_bar, process_index=jax.process_index(),
                           desc="train-embedder")
    negatives = {0: "", 1: " with a hard negative each"}.get(len(pairs.negatives or ()),
                                                              f" with {len(pairs.negatives or ())} hard negatives each")
    logger.message(f"train-embedder: {len(pairs)} pairs{negatives} "
                   f"(texts padded to {arrays['input_ids'].shape[-1]} tokens), {count_params(state.params) / 1e6:.2f}M "
                   f"parameters, pooling {'+'.join(encoder.pooling.modes)}, batch {config.train.batch_size}"
                   f"{f' in cached chunks of {rows_per_chunk}' if config.train.mini_batch_size else ''}, mesh "
                   f"{dict(mesh.shape)}; "
                   f"{f'resuming from step {start} of {total}' if start else f'starting: {total} steps'}")
    undecayed = undecayed_note(unused, config.train.weight_decay)
    if undecayed is not None:
        logger.message(undecayed)
    watch = PreemptionWatch()
    nonfinite = NonFiniteGuard(config.train.nonfinite, keys=TRAINER_OPTIMIZER_KEYS)
    eval_start = eval_end = eval_end_step = None
    step, preempted, last_saved = start, False, start or None
    end = total if stop_after is None else min(total, start + stop_after)
    timer = time.perf_counter()
    try:
        if evaluate is not None and start == 0 and config.eval.at_start:
            eval_start = evaluate(embed_step, state.params, mesh)
            logger.log(0, eval_start)
        while step < end:
            chosen = batches.rows(step)
            batch = {key: arrays[key][chosen] for key in ("input_ids", "segment_ids")}
            state, metrics = train_step(state, from_full_batch(batch, mesh, mesh_lib.BATCH_AXES))
            step += 1
            checkpointer.record_finished()  # a completed save gets its checksums now, not at the next save
            nonfinite.observe(step, metrics)
            logger.advance()
            accumulated = {"loss_sum": accumulated["loss_sum"] + float(metrics["loss"]),
                           "count": accumulated["count"] + 1.0}
            last = step == total
            stop = watch.should_stop(step)
            eval_due = evaluate is not None and (last or (config.eval.every and step % config.eval.every == 0))
            save_due = step % config.checkpoint.every == 0 or last or stop or step == end
            if step % config.train.log_every == 0 or last or eval_due or stop or step == end:
                seconds = time.perf_counter() - timer
                record = {"loss": accumulated["loss_sum"] / accumulated["count"],
                          "learning_rate": float(metrics["learning_rate"]), "grad_norm": float(metrics["grad_norm"]),
                          "epoch": round(batches.epoch_progress(step), 4),
                          "pairs_per_sec": accumulated["count"] * config.train.batch_size / seconds}
                if eval_due:
                    eval_end, eval_end_step = evaluate(embed_step, state.params, mesh), step
                    record.update(eval_end)
                logger.log(step, record)
                accumulated = {"loss_sum": 0.0, "count": 0.0}
                timer = time.perf_counter()
                if on_log is not None and on_log(step, record) and not last:
                    stop, save_due = True, True
            if save_due or step % config.train.log_every == 0:
                nonfinite.check(last_saved)
            if save_due:
                checkpointer.save(step, state, accumulated)
                last_saved = step
            if stop and not last:
                preempted = True
                logger.message(f"{watch.reason if watch.received else 'stopped'}: saved a checkpoint at step {step}; "
                               "rerun the same command to resume")
                break
    finally:
        watch.close()
        checkpointer.close()
        logger.close()
    finished = step == total
    trained = save_final_model(workdir / MODEL_DIR, encoder, state.params) if finished else \
        encoder.replace(params=jax.tree.map(np.asarray, jax.device_get(state.params)))
    if primary:
        plot_loss(workdir, ylabel="in-batch ranking loss")
        records = read_metrics(workdir)
        evals = [r for r in records if any(k.startswith("eval_") for k in r)]
        if eval_start is None and evals and evals[0]["step"] == 0:
            eval_start = {k: v for k, v in evals[0].items() if k.startswith("eval_")}
        if eval_end is None and evals and evals[-1]["step"] > 0:  # a rerun of a finished or stopped run
            eval_end = {k: v for k, v in evals[-1].items() if k.startswith("eval_")}
            eval_end_step = evals[-1]["step"]
    return EmbedderResult(workdir=workdir, start_step=start, final_step=step, total_steps=total,
                          preempted=preempted, eval_start=eval_start, eval_end=eval_end,
                          seconds=time.perf_counter() - began, encoder=trained,
                          model_dir=workdir / MODEL_DIR if finished else None, eval_end_step=eval_end_step)
