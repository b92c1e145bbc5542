"""`bertjax glue` on tiny files in the GLUE layout: MNLI (3 labels, dev_matched.tsv) then RTE started from the best
MNLI model, and CoLA's header-less file read as GLUE ships it."""

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


def test_glue_runs_mnli_then_rte_from_mnli(tmp_path, capsys):
    from bertjax.cli import main

    rng = np.random.default_rng(0)
    data = tmp_path / "glue"
    header = ["index", "sentence1", "sentence2", "gold_label"]
    labels = ["entailment", "contradiction", "neutral"]
    _write(data / "MNLI" / "train.tsv", header, _pairs(rng, 96, labels))
    _write(data / "MNLI" / "dev_matched.tsv", header, _pairs(rng, 32, labels))
    rte_header = ["index", "sentence1", "sentence2", "label"]
    _write(data / "RTE" / "train.tsv", rte_header, _pairs(rng, 64, ["entailment", "not_entailment"]))
    _write(data / "RTE" / "dev.tsv", rte_header, _pairs(rng, 32, ["entailment", "not_entailment"]))
    model = tiny_model_dir(tmp_path / "model")
    workdir = tmp_path / "work"
    assert main(["glue", "--model", str(model), "--data-dir", str(data), "--workdir", str(workdir),
                 "--learning-rates", "3e-3", "--weight-decays", "0.01", "train.epochs=2", "train.batch_size=16",
                 "data.max_length=16", "train.progress_bar=false", "eval.batch_size=32"]) == 0
    table = json.loads((workdir / "glue.json").read_text())
    assert [row["task"] for row in table] == ["MNLI", "RTE"]
    assert not table[0]["from_mnli"] and table[1]["from_mnli"]
    mnli = json.loads((workdir / "MNLI" / "lr0.003-wd0.01" / "finetune.json").read_text())
    rte = json.loads((workdir / "RTE" / "lr0.003-wd0.01" / "finetune.json").read_text())
    assert rte["model"] == str((workdir / "MNLI" / "lr0.003-wd0.01" / "best").absolute())
    assert mnli["labels"] == sorted(labels) and rte["labels"] == ["entailment", "not_entailment"]
    printed = capsys.readouterr().out
    assert "GLUE dev scores" in printed and "RTE" in printed and "MNLI" in printed
    assert all(0.0 <= row["score"] <= 1.0 for row in table)
