"""`bertjax glue` on tiny files in the GLUE layout: MNLI (3 labels, dev_matched.tsv, dev_mismatched.tsv) then MRPC
started from the best MNLI model with the scores GLUE reports for each (MNLI matched/mismatched accuracy, MRPC F1 and
accuracy), and CoLA's header-less file read as GLUE ships it."""

import json

import numpy as np
import pytest

from bertjax.finetune.glue import GLUE_TASKS, read_glue_tsv
from finetune_helpers import NEGATIVE, NEUTRAL, POSITIVE, tiny_model_dir


def _pairs(rng, count, labels):
    lines = []
    for i in range(count):
        label = labels[int(rng.integers(len(labels)))]
        cue = {labels[0]: POSITIVE, labels[1]: NEGATIVE}.get(label, NEUTRAL)
        first = " ".join(rng.choice(NEUTRAL, 3))
        second = " ".join(list(rng.choice(NEUTRAL, 2)) + list(rng.choice(cue, 2)))
        lines.append((i, first, second, label))
    return lines


def _write(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))


def test_glue_tsv_quirks(tmp_path):
    path = tmp_path / "CoLA" / "train.tsv"
    path.parent.mkdir()
    path.write_text('gj04\t1\t\tThe "big" dog barked .\nbad row\n')
    rows, skipped = read_glue_tsv(path, GLUE_TASKS["CoLA"])
    assert rows == [{"text": 'The "big" dog barked .', "label": "1"}] and skipped == 1
    # GLUE's download script leaves MRPC's byte-order mark in front of its header.
    path = tmp_path / "MRPC" / "dev.tsv"
    path.parent.mkdir()
    path.write_bytes("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA cat .\tA cat sat .\n".encode())
    rows, skipped = read_glue_tsv(path, GLUE_TASKS["MRPC"])
    assert rows == [{"text": "A cat .", "text_pair": "A cat sat .", "label": "1"}] and skipped == 0


def test_grid_weight_decays_are_decoupled_as_in_modernberts_fine_tuning():
    """The grid's weight decays {1e-6, 5e-6, 1e-5} are Composer's decoupled ones (weights shrink by wd x lr_t / peak
    each step). Passed to AdamW as they were, they shrank the weights by lr x wd, about 1e-10 a step: nothing in
    float32, so two thirds of the grid trained the same model."""
    import jax.numpy as jnp
    import optax

    from bertjax.finetune.glue import LEARNING_RATES, WEIGHT_DECAYS, grid_configs
    from bertjax.finetune.tasks import task_class

    configs = grid_configs(GLUE_TASKS["RTE"], LEARNING_RATES, WEIGHT_DECAYS, None, [],
                           task_class("sequence-classification").defaults)
    for (lr, wd, _), config in configs.items():
        assert config.train.weight_decay == pytest.approx(wd / lr, rel=1e-12)
        # One AdamW step at the peak with a zero gradient: the weights shrink by wd, as DecoupledAdamW's do.
        weights = jnp.ones(4)
        optimizer = optax.adamw(lr, weight_decay=config.train.weight_decay)
        updates, _ = optimizer.update(jnp.zeros(4), optimizer.init(weights), weights)
        np.testing.assert_allclose(-updates, wd, rtol=1e-5)


def test_glue_runs_mnli_then_mrpc_from_mnli(tmp_path, capsys):
    from bertjax.cli import main

    rng = np.random.default_rng(0)
    data = tmp_path / "glue"
    header = ["index", "sentence1", "sentence2", "gold_label"]
    labels = ["entailment", "contradiction", "neutral"]
    _write(data / "MNLI" / "train.tsv", header, _pairs(rng, 96, labels))
    _write(data / "MNLI" / "dev_matched.tsv", header, _pairs(rng, 32, labels))
    _write(data / "MNLI" / "dev_mismatched.tsv", header, _pairs(rng, 24, labels))
    mrpc_header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    _write(data / "MRPC" / "train.tsv", mrpc_header, [(label, i, i, a, b) for i, a, b, label in _pairs(rng, 64, [1, 0])])
    _write(data / "MRPC" / "dev.tsv", mrpc_header, [(label, i, i, a, b) for i, a, b, label in _pairs(rng, 32, [1, 0])])
    model = tiny_model_dir(tmp_path / "model")
    workdir = tmp_path / "work"
    assert main(["glue", "--model", str(model), "--data-dir", str(data), "--workdir", str(workdir),
                 "--learning-rates", "3e-3", "--weight-decays", "0.01", "--epochs", "2", "train.batch_size=16",
                 "data.max_length=16", "train.progress_bar=false", "eval.batch_size=32"]) == 0
    table = json.loads((workdir / "glue.json").read_text())
    assert [row["task"] for row in table] == ["MNLI", "MRPC"]
    assert not table[0]["from_mnli"] and table[1]["from_mnli"]
    mnli_dir = workdir / "MNLI" / "lr0.003-wd0.01-ep2"
    mnli = json.loads((mnli_dir / "finetune.json").read_text())
    mrpc = json.loads((workdir / "MRPC" / "lr0.003-wd0.01-ep2" / "finetune.json").read_text())
    assert mrpc["model"] == str((mnli_dir / "best").absolute())
    assert mnli["labels"] == sorted(labels) and mrpc["labels"] == ["0", "1"]
    assert set(table[0]["scores"]) == {"accuracy", "accuracy_mismatched"}
    assert list(table[1]["scores"]) == ["f1", "accuracy"] and table[1]["metric"] == "f1"
    # The reported MRPC scores are those of its best evaluation; the mismatched accuracy that of best/.
    mrpc_best = json.loads((workdir / "MRPC" / "lr0.003-wd0.01-ep2" / "results.json").read_text())["best_metrics"]
    assert table[1]["scores"] == {"f1": mrpc_best["f1"], "accuracy": mrpc_best["accuracy"]}
    from bertjax.finetune.prediction import predict
    gold = [line.split("\t")[-1] for line in (data / "MNLI" / "dev_mismatched.tsv").read_text().splitlines()[1:]]
    predicted = [p["label"] for p in predict(mnli_dir / "best", workdir / "data" / "MNLI" / "mismatched.jsonl")]
    assert table[0]["scores"]["accuracy_mismatched"] == pytest.approx(np.mean([p == g for p, g in zip(predicted, gold)]))
    printed = capsys.readouterr().out
    assert "GLUE dev scores" in printed and "MRPC" in printed and "acc-mm" in printed and "F1" in printed
    assert all(0.0 <= v <= 1.0 for row in table for v in row["scores"].values())
    # One task again (--tasks): it resumes its finished run from MNLI's model as before, and glue.json keeps MNLI.
    assert main(["glue", "--model", str(model), "--data-dir", str(data), "--workdir", str(workdir), "--tasks", "MRPC",
                 "--learning-rates", "3e-3", "--weight-decays", "0.01", "--epochs", "2", "train.batch_size=16",
                 "data.max_length=16", "train.progress_bar=false", "eval.batch_size=32"]) == 0
    assert json.loads((workdir / "glue.json").read_text()) == table


@pytest.mark.parametrize("broken, expected", [
    ("missing", "GLUE task CoLA: no dev.tsv in "),
    ("malformed", "CoLA/dev.tsv: no row with the 4 fields"),
])
def test_every_task_is_checked_before_any_training(tmp_path, capsys, broken, expected):
    """SST-2 is fine, CoLA's dev.tsv is missing or not CoLA's: the run stops before SST-2's grid trains (the
    model directory holds only a config.json: nothing may read its weights), naming the task and the file."""
    from bertjax.cli import main

    data = tmp_path / "glue"
    _write(data / "SST-2" / "train.tsv", ["sentence", "label"], [("a fine film", 1), ("a dull film", 0)])
    _write(data / "SST-2" / "dev.tsv", ["sentence", "label"], [("a fine film", 1)])
    (data / "CoLA").mkdir()
    (data / "CoLA" / "train.tsv").write_text("gj04\t1\t\tThe dog barked .\n")
    if broken == "malformed":  # three columns: CoLA's header-less four are (source, label, original, sentence)
        (data / "CoLA" / "dev.tsv").write_text("gj04\t1\t\n")
    workdir = tmp_path / "work"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a model directory's kind: glue checks it first
    assert main(["glue", "--model", str(tmp_path / "model"), "--data-dir", str(data), "--workdir",
                 str(workdir), "--learning-rates", "3e-3", "--weight-decays", "0.01", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertjax glue: error: ") and expected in err
    assert not (workdir / "SST-2").exists()  # no grid point of the first task was started


def test_a_stopped_grid_point_stops_the_grid_and_reports_no_partial_score(tmp_path, capsys, monkeypatch):
    """SIGTERM, SIGHUP or Ctrl-C in a grid point saves its checkpoint and ends that point's `finetune`; glue went on
    with the rest of the grid and wrote the stopped point's partial score into glue.json as final. (The signal is
    stood for by `finetune(stop_after=1)`, which returns from the loop the same way.)"""
    from bertjax.cli import main
    from bertjax.finetune import trainer

    rng = np.random.default_rng(0)
    data = tmp_path / "glue"
    mrpc_header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    for split, count in (("train", 32), ("dev", 16)):
        _write(data / "MRPC" / f"{split}.tsv", mrpc_header,
               [(label, i, i, a, b) for i, a, b, label in _pairs(rng, count, [1, 0])])
    finetune = trainer.finetune
    monkeypatch.setattr(trainer, "finetune", lambda *args, **kwargs: finetune(*args, stop_after=1, **kwargs))
    workdir = tmp_path / "work"
    assert main(["glue", "--model", str(tiny_model_dir(tmp_path / "model")), "--data-dir", str(data), "--workdir",
                 str(workdir), "--learning-rates", "3e-3,1e-3", "--weight-decays", "0", "--epochs", "2",
                 "train.batch_size=16", "data.max_length=16", "train.progress_bar=false", "eval.batch_size=16"]) == 0
    captured = capsys.readouterr()
    assert "MRPC: lr0.003-wd0-ep2 stopped at step 1 of 4 with its checkpoint saved" in captured.err
    assert "Rerun the same command to resume the grid" in captured.err and "GLUE dev scores" not in captured.out
    assert json.loads((workdir / "glue.json").read_text()) == []  # no task finished
    assert (workdir / "MRPC" / "lr0.003-wd0-ep2" / "checkpoints").is_dir()
    assert not (workdir / "MRPC" / "lr0.001-wd0-ep2").exists()  # the grid did not go on
