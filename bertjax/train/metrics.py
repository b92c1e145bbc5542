"""Where training metrics go: `metrics.jsonl` (one JSON object per logged step), TensorBoard event files, a tqdm
progress bar, and `loss.png` at the end. Files are written by process 0; the other processes print their values,
which show that every process computed the same replicated metrics.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from bertjax.jsonl import json_objects, write_json_objects

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"
TENSORBOARD_DIR = "tensorboard"


def read_metrics(workdir: str | Path) -> list[dict]:
    """The records of metrics.jsonl, in order. A last line without its newline is a record still being written
    (the file is read while a run appends to it; a write that crosses a page boundary shows half a line), so it is
    left for the next read; any other line that is not a JSON object is an error naming the file and line."""
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    *complete, _unfinished = path.read_text(encoding="utf-8").split("\n")
    return json_objects(complete, path)


def summary_writer(logdir: str | Path, **kwargs):
    """A tensorboardX SummaryWriter, imported (here: only primary processes write events) without PyTorch.

    Why: tensorboardX's writer module imports torch whenever it is installed, only so that it can accept torch
    tensors as values; that import was 1.6 of the 1.9 s tensorboardX took, in every run's start. bertjax logs
    Python floats, so torch is hidden for the length of that import (a None entry in sys.modules makes `import
    torch` an ImportError, which tensorboardX expects); a torch already imported is used as it is.
    """
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        from tensorboardX import SummaryWriter
    else:
        sys.modules["torch"] = None
        try:
            from tensorboardX import SummaryWriter
        finally:
            if "torch" in sys.modules and sys.modules["torch"] is None:
                del sys.modules["torch"]
    return SummaryWriter(str(logdir), **kwargs)


class MetricsLogger:
    """Log dicts of floats by step.

    On resume (`start_step` > 0) records after `start_step` are dropped from metrics.jsonl first: they were
    written by the interrupted run after its last checkpoint and will be logged again, identically, by this one,
    so the file reads like one uninterrupted run.
    """

    def __init__(self, workdir: str | Path, *, total_steps: int, start_step: int, is_primary: bool,
                 progress_bar: bool = True, process_index: int = 0, desc: str = "pretrain"):
        self.workdir = Path(workdir)
        self.is_primary = is_primary
        self.process_index = process_index
        self._file = None
        self._tensorboard = None
        self._bar = None
        if not is_primary:
            return
        path = self.workdir / METRICS_FILE
        kept = [r for r in read_metrics(self.workdir) if r.get("step", 0) <= start_step] if start_step else []
        write_json_objects(path, kept)
        self._file = open(path, "a", encoding="utf-8")  # as write_json_objects writes it
        self._tensorboard = summary_writer(self.workdir / TENSORBOARD_DIR, purge_step=start_step + 1)
        if progress_bar:
            from tqdm import tqdm

            from bertjax.train.session_outputs import CurrentStderr
            self._bar = tqdm(total=total_steps, initial=start_step, desc=desc, unit="step",
                             dynamic_ncols=True, file=CurrentStderr())

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def log(self, step: int, values: dict[str, Any]) -> None:
        record = {"step": int(step), **{k: _plain(v) for k, v in values.items()}}
        if not self.is_primary:
            print(f"[process {self.process_index}] " + json.dumps(record), flush=True)
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for name, value in record.items():
            if name != "step" and isinstance(value, float) and math.isfinite(value):
                self._tensorboard.add_scalar(name, value, step)
        if self._bar is not None:
            shown = {k: record[k] for k in ("loss", "eval_loss", "tokens_per_sec") if k in record}
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=True)

    def message(self, text: str) -> None:
        """A line of text that does not break the progress bar."""
        if not self.is_primary:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._file is not None:
            self._file.close()


def _plain(value: Any) -> Any:
    """JSON-friendly value: arrays and numpy scalars become Python floats (float32 values are exact in float64)."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    return float(value)


def plot_loss(workdir: str | Path, ylabel: str = "loss (MLM + NSP when on)") -> Path | None:
    """Write loss.png: training loss and held-out loss against the step, phase boundaries marked."""
    records = read_metrics(workdir)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    held_out = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train and not held_out:
        return None
    import matplotlib
    matplotlib.use("Agg")  # no display on training hosts
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    if train:
        axes.plot(*zip(*train), label="train loss", linewidth=1)
    if held_out:
        axes.plot(*zip(*held_out), "o-", label="held-out loss")
    for record in records:  # phase boundaries (context extension, decay, ...): a dashed line and the phase's name
        if "phase_start" in record and record["step"] > 0:
            axes.axvline(record["step"], color="gray", linestyle="--", linewidth=0.8)
        if "phase_start" in record:
            axes.annotate(str(record["phase_start"]), (record["step"], 1.0), xycoords=("data", "axes fraction"),
                          xytext=(3, -12), textcoords="offset points", fontsize=8, color="gray")
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    axes.legend()
    path = Path(workdir) / PLOT_FILE
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
