"""`bertjax glue`: the GLUE dev-set protocol on local data in the standard GLUE layout (`DIR/<task>/train.tsv`,
`dev.tsv`; MNLI's `dev_matched.tsv` and `dev_mismatched.tsv`).

The protocol of the ModernBERT paper (its GLUE appendix, as we read it): every task is fine-tuned over a grid of
learning rates {1e-5, 3e-5, 5e-5, 8e-5} x weight decays {1e-6, 5e-6, 1e-5} x epochs, {1, 2, 3} for the four large
tasks (MNLI, QNLI, QQP, SST-2) and {2, 5, 10} for the small ones (CoLA, MRPC, RTE, STS-B), with early stopping on
the task's metric (evaluated after every epoch); RTE, MRPC and STS-B start from the best MNLI model (as RoBERTa
and ModernBERT do) when MNLI is part of the run. Those weight decays are decoupled, as the DecoupledAdamW of
MosaicML's Composer that ModernBERT's fine-tuning code uses applies them: each step shrinks the weights by
wd x lr_t / peak lr. bertjax's AdamW shrinks them by lr_t x train.weight_decay (optax, transformers' Trainer), where
1e-5 would be a no-op in float32, so a grid point runs with train.weight_decay = wd / learning rate (the same
decay). The table shows, per task, the dev scores GLUE reports (CoLA: Matthews correlation; STS-B: Pearson and
Spearman; MRPC, QQP: F1 and accuracy; MNLI: matched and mismatched
accuracy; the others: accuracy) of the best grid point, chosen on the first of them, and the settings that
reached it.

Each file is read as GLUE distributes it (tab-separated, no quoting; CoLA without a header) and written as JSONL
with the columns of `bertjax finetune`; rows with the wrong number of fields (a few in QQP and MNLI) are skipped
and counted.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bertjax.jsonl import write_json_objects

if TYPE_CHECKING:
    from bertjax.finetune.config import FinetuneConfig

LEARNING_RATES = (1e-5, 3e-5, 5e-5, 8e-5)
WEIGHT_DECAYS = (1e-6, 5e-6, 1e-5)
LARGE_EPOCHS = (1, 2, 3)
SMALL_EPOCHS = (2, 5, 10)
EARLY_STOPPING_PATIENCE = 2  # evaluations (epochs) without a better score


@dataclasses.dataclass(frozen=True)
class GlueTask:
    name: str  # directory name in the GLUE layout
    text: str  # column of the first sentence
    pair: str | None  # column of the second sentence
    label: str
    metrics: tuple[str, ...]  # the scores the GLUE table reports; the first one chooses the grid point and best/
    epochs: tuple[int, ...] = LARGE_EPOCHS
    from_mnli: bool = False
    regression: bool = False
    validation: str = "dev.tsv"
    mismatched: str | None = None  # MNLI's second dev set, scored with the model chosen on the first
    header: tuple[str, ...] | None = None  # column names of a file without a header line (CoLA)

    @property
    def metric(self) -> str:
        return self.metrics[0]


GLUE_TASKS: dict[str, GlueTask] = {task.name: task for task in (
    GlueTask("MNLI", "sentence1", "sentence2", "gold_label", ("accuracy",), validation="dev_matched.tsv",
             mismatched="dev_mismatched.tsv"),
    GlueTask("QNLI", "question", "sentence", "label", ("accuracy",)),
    GlueTask("QQP", "question1", "question2", "is_duplicate", ("f1", "accuracy")),
    GlueTask("SST-2", "sentence", None, "label", ("accuracy",)),
    GlueTask("CoLA", "sentence", None, "label", ("mcc",), epochs=SMALL_EPOCHS,
             header=("source", "label", "original_label", "sentence")),
    GlueTask("RTE", "sentence1", "sentence2", "label", ("accuracy",), epochs=SMALL_EPOCHS, from_mnli=True),
    GlueTask("MRPC", "#1 String", "#2 String", "Quality", ("f1", "accuracy"), epochs=SMALL_EPOCHS, from_mnli=True),
    GlueTask("STS-B", "sentence1", "sentence2", "score", ("pearson", "spearman"), epochs=SMALL_EPOCHS,
             from_mnli=True, regression=True),
)}


def read_glue_tsv(path: Path, task: GlueTask) -> tuple[list[dict], int]:
    """(rows with text/text_pair/label, number of malformed rows skipped)."""
    try:
        # utf-8-sig: GLUE's download script copies the byte-order mark of MRPC's source files into its TSVs
        with open(path, encoding="utf-8-sig", newline="") as file:
            lines = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (UnicodeDecodeError, csv.Error) as error:  # their messages name neither the file nor the task
        raise ValueError(f"{path}: unreadable as GLUE's {task.name} (UTF-8, tab-separated): {error}") from None
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
    if not rows:  # nothing to train or score on: caught here, not when the run reaches this task
        raise ValueError(f"{path}: no row with the {len(header)} fields {header} ({skipped} rows with another "
                         f"number); is this GLUE's {task.name}?")
    return rows, skipped


def prepare_task(data_dir: Path, task: GlueTask, out: Path, say: Callable[[str], None]) -> dict[str, Path]:
    """JSONL files of the task's splits: train, validation (and mismatched for MNLI). Nothing is written for a task
    whose files are missing."""
    sources = {"train": "train.tsv", "validation": task.validation}
    missing = [source for source in sources.values() if not (data_dir / task.name / source).is_file()]
    if missing:
        raise FileNotFoundError(f"GLUE task {task.name}: no {' or '.join(missing)} in {data_dir / task.name} "
                                f"(it needs {', '.join(sources.values())})")
    if task.mismatched is not None:
        if (data_dir / task.name / task.mismatched).is_file():
            sources["mismatched"] = task.mismatched
        else:
            say(f"{task.name}: no {task.mismatched}; the mismatched accuracy is left out")
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, source in sources.items():
        rows, skipped = read_glue_tsv(data_dir / task.name / source, task)
        if skipped:
            say(f"{task.name}/{source}: skipped {skipped} malformed rows of {len(rows) + skipped}")
        paths[split] = write_json_objects(out / f"{split}.jsonl", rows)
    return paths


def prepare_tasks(data_dir: Path, names: list[str], out: Path,
                  say: Callable[[str], None]) -> dict[str, dict[str, Path]]:
    """`prepare_task` of every task, by name: all of them before any training, so that a missing or malformed file
    of the last task stops the run at once rather than after the grids of the tasks before it (hours)."""
    return {name: prepare_task(data_dir, GLUE_TASKS[name], out / name, say) for name in names}


def _number(value: float) -> str:
    return f"{value:g}"


def mismatched_accuracy(model_dir: Path, path: Path) -> float:
    """Accuracy of a fine-tuned model directory on a JSONL file with `label` (MNLI's mismatched dev set)."""
    from bertjax.finetune.prediction import predict
    from bertjax.finetune.readers import read_rows
    from bertjax.finetune.tasks.base import label_key

    gold = [label_key(row["label"]) for row in read_rows(path)]  # the reader predict uses: rows line up
    predicted = [record["label"] for record in predict(model_dir, path)]
    return sum(p == g for p, g in zip(predicted, gold)) / max(len(gold), 1)


def grid_configs(task: GlueTask, learning_rates, weight_decays, epochs, overrides,
                 defaults) -> dict[tuple[float, float, int], FinetuneConfig]:
    """The fine-tuning config of each grid point of `task` ((learning rate, weight decay, epochs) -> config), all
    built before anything trains: a value that no config takes (a learning rate of 0, a bad override) is an error
    naming the grid point, not a failure after the points before it have trained."""
    from bertjax.finetune.config import load_finetune_config
    from bertjax.train.run_config import ConfigError

    for flag, values in (("--learning-rates", learning_rates), ("--weight-decays", weight_decays),
                         ("--epochs", epochs or task.epochs)):
        if not list(values):
            raise ValueError(f"{flag}: the grid needs at least one value")
    configs = {}
    for lr, wd, count in itertools.product(learning_rates, weight_decays, epochs or task.epochs):
        decay = wd / lr if lr > 0 else wd  # (a learning rate of 0 is refused by the config's check, naming it)
        settings = [f"train.learning_rate={lr}", f"train.weight_decay={decay!r}", f"train.epochs={count}",
                    f"train.early_stopping_patience={EARLY_STOPPING_PATIENCE}", "eval.every=0",
                    f"eval.main_metric={task.metric}"]
        if task.regression:
            settings.append("task.problem_type=regression")
        try:
            configs[(lr, wd, count)] = load_finetune_config(None, settings + list(overrides), defaults)
        except ConfigError as error:
            raise ConfigError(f"GLUE {task.name}, grid point learning rate {lr:g}, weight decay {wd:g}, {count} "
                              f"epochs (--learning-rates, --weight-decays, --epochs): {error}") from None
    return configs


class GlueStopped(Exception):
    """A grid point stopped before its end (SIGTERM, SIGHUP, Ctrl-C: its checkpoint saved). The grid stops with it:
    going on would keep a preempted machine busy, and the table would report the stopped point's partial score.
    `table`: the rows of the tasks finished, which glue.json holds."""

    def __init__(self, message: str, table: list[dict]):
        super().__init__(message)
        self.table = table


def run_glue(model: str | Path, data_dir: str | Path, workdir: str | Path, *, tasks: list[str] | None = None,
             learning_rates: list[float] = LEARNING_RATES, weight_decays: list[float] = WEIGHT_DECAYS,
             epochs: list[int] | None = None, overrides: list[str] = (),
             say: Callable[[str], None] = print, allow_pickle: bool = False) -> list[dict]:
    """Fine-tune every task found (or `tasks`) over the grid (`epochs` None: each task's own epochs); returns one
    row per task (and writes glue.json, keeping the rows of tasks that earlier runs in this workdir did)."""
    from bertjax.finetune.tasks import task_class
    from bertjax.finetune.trainer import BEST_DIR, finetune
    from bertjax.model_dirs import model_dir_kind
    from bertjax.train.workdir import check_local_workdir

    check_local_workdir(workdir, "bertjax glue")  # before any task's data is prepared under it
    data_dir, workdir = Path(data_dir), Path(workdir).absolute()  # glue.json's model paths hold wherever read
    names = tasks or [name for name in GLUE_TASKS if (data_dir / name / "train.tsv").is_file()]
    unknown = [name for name in names if name not in GLUE_TASKS]
    if "WNLI" in unknown:
        raise ValueError("WNLI is not fine-tuned: its dev set is adversarial to what training teaches (BERT, RoBERTa "
                         "and ModernBERT leave it out too)")
    if unknown:
        raise ValueError(f"unknown GLUE task(s) {unknown}; known: {list(GLUE_TASKS)}")
    if not tasks and (data_dir / "WNLI" / "train.tsv").is_file():
        say(f"{data_dir / 'WNLI'}: skipped (WNLI's dev set is adversarial to its training set; BERT, RoBERTa and "
            "ModernBERT leave it out)")
    if not names:
        raise FileNotFoundError(f"{data_dir}: no GLUE task directory with a train.tsv ({', '.join(GLUE_TASKS)})")
    cls = task_class("sequence-classification")
    names = sorted(names, key=list(GLUE_TASKS).index)  # MNLI first: others may start from it
    grids = {name: grid_configs(GLUE_TASKS[name], learning_rates, weight_decays, epochs, overrides, cls.defaults)
             for name in names}  # every grid point's config, checked before any file is read or run trained
    model_dir_kind(model)  # a --model that is no model directory: said before any task's data is written
    prepared = prepare_tasks(data_dir, names, workdir / "data", say)
    earlier = read_table(workdir / "glue.json")
    # A run of some tasks (--tasks) in a workdir whose MNLI is done starts the others from it, as the full run did.
    mnli_best = Path(earlier["MNLI"]["model"]) if "MNLI" in earlier and "MNLI" not in names else None
    table = []
    for name in names:
        task, files = GLUE_TASKS[name], prepared[name]
        start = mnli_best if task.from_mnli and mnli_best is not None else Path(model)
        best = None
        for (lr, wd, count), config in grids[name].items():
            run_dir = workdir / name / f"lr{_number(lr)}-wd{_number(wd)}-ep{count}"
            say(f"{name}: learning rate {lr:g}, weight decay {wd:g}, {count} epochs, from {start}")
            result = finetune(start, cls, files["train"], files["validation"], run_dir, config, say=say,
                              allow_pickle=allow_pickle)
            if not result.results["finished"]:
                done = _write_table(workdir, earlier, table)
                raise GlueStopped(f"{name}: {run_dir.name} stopped at step {result.final_step} of "
                                  f"{result.results['total_steps']} with its checkpoint saved; glue.json holds the "
                                  "tasks finished. Rerun the same command to resume the grid", done)
            record = result.results["best_metrics"]
            if record is not None and (best is None or record[task.metric] > best["score"]):
                best = {"task": name, "metric": task.metric, "score": record[task.metric],
                        "scores": {metric: record[metric] for metric in task.metrics}, "learning_rate": lr,
                        "weight_decay": wd, "epochs": count, "epoch": record["epoch"],
                        "from_mnli": start == mnli_best, "model": str(run_dir / BEST_DIR)}
        if best is None:
            continue
        if "mismatched" in files:
            best["scores"]["accuracy_mismatched"] = mismatched_accuracy(Path(best["model"]), files["mismatched"])
        table.append(best)
        if name == "MNLI":
            mnli_best = Path(best["model"])
    return _write_table(workdir, earlier, table)


def _write_table(workdir: Path, earlier: dict[str, dict], table: list[dict]) -> list[dict]:
    """glue.json is the workdir's table: the tasks of earlier runs stay beside those run now."""
    merged = {**earlier, **{row["task"]: row for row in table}}
    table = [merged[name] for name in GLUE_TASKS if name in merged]
    (workdir / "glue.json").write_text(json.dumps(table, indent=1) + "\n")
    return table


def read_table(path: Path) -> dict[str, dict]:
    """The rows of a workdir's glue.json by task (none if it has none yet)."""
    if not path.is_file():
        return {}
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): restore it, or remove it to start the table "
                         "afresh") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) and row.get("task") in GLUE_TASKS
                                             for row in rows):
        raise ValueError(f"{path}: expected a list of GLUE rows with a known \"task\"; remove it to start the "
                         "table afresh")
    return {row["task"]: row for row in rows}


SCORE_NAMES = {"accuracy": "acc", "accuracy_mismatched": "acc-mm", "f1": "F1", "mcc": "MCC", "pearson": "Pearson",
               "spearman": "Spearman"}


def format_table(table: list[dict]) -> str:
    lines = [f"{'task':<7} {'dev scores':<32} {'lr':>8} {'wd':>8} {'epochs':>6} {'best':>5}  start"]
    for row in table:
        start = "MNLI" if row["from_mnli"] else "model"
        scores = ", ".join(f"{SCORE_NAMES.get(k, k)} {v:.4f}" for k, v in row["scores"].items())
        lines.append(f"{row['task']:<7} {scores:<32} {row['learning_rate']:>8g} {row['weight_decay']:>8g} "
                     f"{row['epochs']:>6} {row['epoch']:>5g}  {start}")
    return "\n".join(lines)
