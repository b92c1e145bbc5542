"""`bertjax glue`: the GLUE dev-set protocol on local data in the standard GLUE layout (`DIR/<task>/train.tsv`,
`dev.tsv`; MNLI's `dev_matched.tsv`).

Following the ModernBERT paper's protocol: each task is fine-tuned over a grid of learning rates x weight decays,
for a number of epochs that depends on the task's size (more for the small ones), with early stopping on the task's
metric; RTE, MRPC and STS-B start from the best MNLI model (as RoBERTa and ModernBERT do) when MNLI is part of the
run. The table shows, per task, the best dev score over the grid and the settings that reached it.

Each file is read as GLUE distributes it (tab-separated, no quoting; CoLA without a header) and written as JSONL
with the columns of `bertjax finetune`; rows with the wrong number of fields (a few in QQP and MNLI) are skipped
and counted.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Callable

LARGE_EPOCHS = 3
SMALL_EPOCHS = 10
EARLY_STOPPING_PATIENCE = 2  # evaluations (epochs) without a better score


@dataclasses.dataclass(frozen=True)
class GlueTask:
    name: str  # directory name in the GLUE layout
    text: str  # column of the first sentence
    pair: str | None  # column of the second sentence
    label: str
    metric: str  # the score the GLUE table reports (and best/ follows)
    small: bool = False  # small tasks train longer
    from_mnli: bool = False
    regression: bool = False
    validation: str = "dev.tsv"
    header: tuple[str, ...] | None = None  # column names of a file without a header line (CoLA)


GLUE_TASKS: dict[str, GlueTask] = {task.name: task for task in (
    GlueTask("MNLI", "sentence1", "sentence2", "gold_label", "accuracy", validation="dev_matched.tsv"),
    GlueTask("QNLI", "question", "sentence", "label", "accuracy"),
    GlueTask("QQP", "question1", "question2", "is_duplicate", "accuracy"),
    GlueTask("SST-2", "sentence", None, "label", "accuracy"),
    GlueTask("CoLA", "sentence", None, "label", "mcc", small=True,
             header=("source", "label", "original_label", "sentence")),
    GlueTask("RTE", "sentence1", "sentence2", "label", "accuracy", small=True, from_mnli=True),
    GlueTask("MRPC", "#1 String", "#2 String", "Quality", "accuracy", small=True, from_mnli=True),
    GlueTask("STS-B", "sentence1", "sentence2", "score", "pearson", small=True, from_mnli=True, regression=True),
)}


def read_glue_tsv(path: Path, task: GlueTask) -> tuple[list[dict], int]:
    """(rows with text/text_pair/label, number of malformed rows skipped)."""
    with open(path, encoding="utf-8", newline="") as file:
        lines = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not lines:
        raise ValueError(f"{path}: the file is empty")
    header = list(task.header) if task.header else lines.pop(0)
    for column in (task.text, task.pair, task.label):
        if column is not None and column not in header:
            raise ValueError(f"{path}: no column {column!r} (columns: {header}); is this GLUE's {task.name}?")
    rows, skipped = [], 0
    for fields in lines:
        if len(fields) != len(header):
            skipped += 1
            continue
        row = dict(zip(header, fields))
        out = {"text": row[task.text], "label": row[task.label]}
        if task.pair is not None:
            out["text_pair"] = row[task.pair]
        rows.append(out)
    return rows, skipped


def prepare_task(data_dir: Path, task: GlueTask, out: Path, say: Callable[[str], None]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for source, split in (("train.tsv", "train"), (task.validation, "validation")):
        rows, skipped = read_glue_tsv(data_dir / task.name / source, task)
        if skipped:
            say(f"{task.name}/{source}: skipped {skipped} malformed rows of {len(rows) + skipped}")
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def _number(value: float) -> str:
    return f"{value:g}"


def run_glue(model: str | Path, data_dir: str | Path, workdir: str | Path, *, tasks: list[str] | None = None,
             learning_rates: list[float], weight_decays: list[float], overrides: list[str] = (),
             say: Callable[[str], None] = print) -> list[dict]:
    """Fine-tune every task found (or `tasks`) over the grid; returns one row per task (and writes glue.json)."""
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from bertjax.finetune.trainer import BEST_DIR, finetune

    data_dir, workdir = Path(data_dir), Path(workdir)
    names = tasks or [name for name in GLUE_TASKS if (data_dir / name / "train.tsv").is_file()]
    unknown = [name for name in names if name not in GLUE_TASKS]
    if unknown:
        raise ValueError(f"unknown GLUE task(s) {unknown}; known: {list(GLUE_TASKS)}")
    if not names:
        raise FileNotFoundError(f"{data_dir}: no GLUE task directory with a train.tsv ({', '.join(GLUE_TASKS)})")
    cls = task_class("sequence-classification")
    table, mnli_best = [], None
    for name in sorted(names, key=list(GLUE_TASKS).index):  # MNLI first: others may start from it
        task = GLUE_TASKS[name]
        train, validation = prepare_task(data_dir, task, workdir / "data" / name, say)
        start = mnli_best if task.from_mnli and mnli_best is not None else Path(model)
        best = None
        for lr in learning_rates:
            for wd in weight_decays:
                settings = [f"train.learning_rate={lr}", f"train.weight_decay={wd}",
                            f"train.epochs={SMALL_EPOCHS if task.small else LARGE_EPOCHS}",
                            f"train.early_stopping_patience={EARLY_STOPPING_PATIENCE}",
                            f"eval.main_metric={task.metric}"]
                if task.regression:
                    settings.append("task.problem_type=regression")
                config = load_finetune_config(None, settings + list(overrides), cls.defaults)
                run_dir = workdir / name / f"lr{_number(lr)}-wd{_number(wd)}"
                say(f"{name}: learning rate {lr:g}, weight decay {wd:g}, from {start}")
                result = finetune(start, cls, train, validation, run_dir, config, say=say)
                score = result.results["best"]
                if score is not None and (best is None or score > best["score"]):
                    best = {"task": name, "metric": task.metric, "score": score, "learning_rate": lr,
                            "weight_decay": wd, "epoch": result.results["best_epoch"], "from_mnli": start == mnli_best,
                            "model": str(run_dir / BEST_DIR)}
        if best is not None:
            table.append(best)
            if name == "MNLI":
                mnli_best = Path(best["model"])
    (workdir / "glue.json").write_text(json.dumps(table, indent=1) + "\n")
    return table


def format_table(table: list[dict]) -> str:
    lines = [f"{'task':<7} {'metric':<9} {'dev':>7}  {'lr':>8} {'wd':>8} {'epoch':>6}  start"]
    for row in table:
        start = "MNLI" if row["from_mnli"] else "model"
        lines.append(f"{row['task']:<7} {row['metric']:<9} {row['score']:>7.4f}  {row['learning_rate']:>8g} "
                     f"{row['weight_decay']:>8g} {row['epoch']:>6g}  {start}")
    return "\n".join(lines)
