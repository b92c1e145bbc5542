"""What a fine-tuning run leaves besides checkpoints: results.json (the best main metric and its step) and a plot
of the losses and the main metric against the step (finetune.png)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bertjax.jsonl import write_json_objects
from bertjax.train.metrics import read_metrics

RESULTS_FILE = "results.json"
PLOT_FILE = "finetune.png"
VALIDATION = "validation"


# The metrics a run may follow (eval.main_metric) where lower is better; every other one the tasks report (accuracy,
# F1, MCC, correlations, exact match) is higher-is-better. transformers' Trainer minimises a "loss" the same way.
LOWER_IS_BETTER = frozenset({"loss", "mse"})


def improves(metric: str, value: float, than: float) -> bool:
    """Whether `value` of `metric` is strictly better than `than` (NaN never is)."""
    return value < than if metric in LOWER_IS_BETTER else value > than


def best_record(records: list[dict], metric: str) -> dict | None:
    """The validation record with the best `metric`, the highest or for a loss the lowest (the earliest on ties)."""
    best = None
    for record in records:
        if record.get("split") == VALIDATION and metric in record:
            if best is None or improves(metric, record[metric], best[metric]):
                best = record
    return best


def evaluations_since_best(records: list[dict], metric: str) -> int:
    """Validation records after the best one (early stopping counts them)."""
    best = best_record(records, metric)
    validation = [r for r in records if r.get("split") == VALIDATION and metric in r]
    return 0 if best is None else len(validation) - 1 - validation.index(best)


def write_results(workdir: Path, task: str, metric: str, extra: dict, records: list[dict] | None = None,
                  write: bool = True) -> dict:
    """results.json from the run's evaluation records (metrics.jsonl when `records` is None)."""
    records = read_metrics(workdir) if records is None else records
    best = best_record(records, metric)
    final = next((r for r in reversed(records) if r.get("split") == VALIDATION), None)
    results = {"task": task, "main_metric": metric,
               "best": None if best is None else best[metric],
               "best_step": None if best is None else best["step"],
               "best_epoch": None if best is None else best["epoch"],
               "best_metrics": best, "final_metrics": final, **extra}
    if write:
        (workdir / RESULTS_FILE).write_text(json.dumps(results, indent=1) + "\n")
    return results


def plot(workdir: Path, metric: str) -> Path | None:
    records = read_metrics(workdir)
    train = [(r["step"], r["loss"]) for r in records if r.get("split") == "train" and "loss" in r]
    held_out = [(r["step"], r["loss"]) for r in records if r.get("split") == VALIDATION and "loss" in r]
    scores = [(r["step"], r[metric]) for r in records if r.get("split") == VALIDATION and metric in r]
    if not (train or held_out):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, loss_axes = plt.subplots(figsize=(7, 4.5))
    if train:
        loss_axes.plot(*zip(*train), label="train loss", linewidth=1)
    if held_out:
        loss_axes.plot(*zip(*held_out), "o-", label="validation loss")
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("loss")
    loss_axes.grid(True, alpha=0.3)
    metric_axes = loss_axes.twinx()
    if scores:
        metric_axes.plot(*zip(*scores), "s--", color="tab:green", label=f"validation {metric}")
    metric_axes.set_ylabel(metric)
    lines = loss_axes.get_legend_handles_labels()
    more = metric_axes.get_legend_handles_labels()
    loss_axes.legend(lines[0] + more[0], lines[1] + more[1], loc="best")
    path = workdir / PLOT_FILE
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


class EvaluationLog:
    """metrics.jsonl (one line per evaluation and split) and TensorBoard scalars tagged `split/metric`.

    On resume, lines after the checkpoint the run restarts from are dropped first: the resumed run writes them
    again, identically, so the file reads like one uninterrupted run.
    """

    def __init__(self, workdir: Path, start_step: int, write: bool = True):
        """`write` False (every process but 0 of a multi-host run): the records are kept, nothing is written."""
        import jax

        from bertjax.train.metrics import METRICS_FILE, TENSORBOARD_DIR, summary_writer

        path = workdir / METRICS_FILE
        kept = [r for r in read_metrics(workdir) if r.get("step", 0) <= start_step] \
            if start_step and jax.process_index() == 0 else []
        # Process 0's records on every process: each decides on them (the best so far, early stopping), and a host
        # reading another file (its own empty workdir on a per-host disk) took other collectives and hung.
        self.records = kept = _from_process_0(kept)
        self._file = self._tensorboard = None
        if write:
            write_json_objects(path, kept)
            self._file = open(path, "a", encoding="utf-8")  # as write_json_objects writes it
            self._tensorboard = summary_writer(workdir / TENSORBOARD_DIR, purge_step=start_step + 1)

    def log(self, step: int, epoch: float, split: str, values: dict) -> dict:
        record = {"step": int(step), "epoch": round(float(epoch), 4), "split": split,
                  **{k: float(v) for k, v in values.items()}}
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
            for name, value in values.items():
                self._tensorboard.add_scalar(f"{split}/{name}", float(value), step)
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._tensorboard.close()


def _from_process_0(records: list[dict]) -> list[dict]:
    """`records` as process 0 has them, on every process: a collective, so also a barrier (process 0 rewrites the
    file it read only once every process has them)."""
    import jax

    if jax.process_count() == 1:
        return records
    from jax.experimental import multihost_utils

    encoded = np.frombuffer(json.dumps(records).encode(), np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int32(encoded.size)))
    buffer = np.zeros(size, np.uint8)
    if jax.process_index() == 0:
        buffer[:] = encoded
    return json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(buffer))).decode())
