"""Two-process `bertjax finetune` on localhost (CPU, gloo collectives), as the pretraining multi-host test: the
two processes together reproduce the single-process run (same global batches, same validation metrics over the
whole validation file), and only process 0 writes the workdir's files."""

import json
import socket
import subprocess
import sys

import pytest

from bertjax.finetune.config import load_finetune_config
from bertjax.finetune.tasks import task_class
from bertjax.finetune.trainer import finetune
from bertjax.train.metrics import read_metrics
from finetune_helpers import sentiment_rows, tiny_model_dir, write_jsonl
from train_helpers import REPO, cpu_env

OVERRIDES = ["train.batch_size=8", "train.epochs=1", "train.learning_rate=3e-3", "data.max_length=16",
             "eval.batch_size=16", "eval.every=2", "train.progress_bar=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune-multihost")
    model = tiny_model_dir(root / "model")
    train = write_jsonl(root / "train.jsonl", sentiment_rows(32, 0))
    validation = write_jsonl(root / "validation.jsonl", sentiment_rows(20, 1))  # 20: not a multiple of 16
    workdir = root / "two"
    coordinator = f"127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "bertjax", "finetune", "--model", str(model), "--task", "sequence-classification",
               "--train", str(train), "--validation", str(validation), "--workdir", str(workdir), *OVERRIDES,
               "--coordinator", coordinator, "--num-processes", "2"]
    processes = [subprocess.Popen(command + ["--process-id", str(i)], env=cpu_env(devices=1), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [process.communicate(timeout=400)[0] for process in processes]
    for i, process in enumerate(processes):
        assert process.returncode == 0, f"process {i}:\n{outputs[i]}"
    single = root / "one"
    config = load_finetune_config(None, OVERRIDES, task_class("sequence-classification").defaults)
    finetune(model, task_class("sequence-classification"), train, validation, single, config, say=lambda _: None)
    return workdir, single, outputs


def test_two_processes_reproduce_the_single_process_run(runs):
    two, one, _ = runs
    records_two, records_one = read_metrics(two), read_metrics(one)
    # One line per evaluation: process 1 wrote nothing into the shared metrics.jsonl.
    assert [(r["step"], r["split"]) for r in records_two] == [(r["step"], r["split"]) for r in records_one]
    assert [r["step"] for r in records_two if r["split"] == "validation"] == [2, 4]
    for a, b in zip(records_two, records_one):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(b[key], str):  # "split"; pytest >= 9 refuses approx on strings
                assert a[key] == b[key], (a["step"], key)
            else:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (a["step"], a["split"], key)
    results = json.loads((two / "results.json").read_text())
    assert results["finished"] and results["best"] == json.loads((one / "results.json").read_text())["best"]
    assert (two / "best" / "config.json").is_file() and (two / "best" / "finetune.json").is_file()


def test_only_process_0_reports(runs):
    _, _, outputs = runs
    assert "best validation accuracy" in outputs[0]
    assert "best validation" not in outputs[1] and "initialised from" not in outputs[1]
