"""Two-process `bertjax finetune` on localhost (CPU, gloo collectives), as the pretraining multi-host test: the
two processes together reproduce the single-process run (same global batches, same validation metrics over the
whole validation file), and only process 0 writes the workdir's files.

The model is a EuroBERT bertjax model directory fine-tuned for multiple choice, which transformers has no EuroBERT
class for: every process restores the model with orbax (onto its own device: process 1's is not the writer's cpu:0)
and best/ is a bertjax model directory that orbax writes (process 0 alone, without waiting for the others)."""

import json
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertjax.finetune.config import load_finetune_config
from bertjax.finetune.tasks import task_class
from bertjax.finetune.trainer import finetune
from bertjax.train.metrics import read_metrics
from finetune_helpers import VOCAB, choice_rows, write_jsonl
from train_helpers import REPO, cpu_env

OVERRIDES = ["train.batch_size=8", "train.epochs=1", "train.learning_rate=3e-3", "data.max_length=16",
             "eval.batch_size=16", "eval.every=2", "train.progress_bar=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _eurobert_model_dir(path):
    import bertjax
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.model_dirs import save_model_dir
    from bertjax.models import MODEL_CLASSES, init_params

    config = bertjax.get_config("eurobert-tiny", vocab_size=len(VOCAB), pad_token_id=0, dropout_rate=0.0)
    model = MODEL_CLASSES["masked_lm"](config)
    save_model_dir(path, model, init_params(model, jax.random.key(0)), WordPieceTokenizer("\n".join(VOCAB)))
    return path


def run_two_processes(root, workdir: str, overrides: list[str], timeout: float = 400) -> list[str]:
    """`bertjax finetune` (multiple choice on root's model and data) as two processes; "{i}" in `workdir` is the
    process id. Their outputs, once both exit 0 (killed at `timeout`: a hang fails the test instead of the suite)."""
    coordinator = f"127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "bertjax", "finetune", "--model", str(root / "model"), "--task",
               "multiple-choice", "--train", str(root / "train.jsonl"), "--validation", str(root / "validation.jsonl"),
               *overrides, "--coordinator", coordinator, "--num-processes", "2"]
    processes = [subprocess.Popen(command + ["--workdir", workdir.replace("{i}", str(i)), "--process-id", str(i)],
                                  env=cpu_env(devices=1), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for i in range(2)]
    try:
        outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    finally:
        for process in processes:
            process.kill()
    for i, process in enumerate(processes):
        assert process.returncode == 0, f"process {i}:\n{outputs[i]}"
    return outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune-multihost")
    model = _eurobert_model_dir(root / "model")
    train = write_jsonl(root / "train.jsonl", choice_rows(np.random.default_rng(0), 32))
    # 20: not a multiple of the evaluation batch (16)
    validation = write_jsonl(root / "validation.jsonl", choice_rows(np.random.default_rng(1), 20))
    workdir = root / "two"
    outputs = run_two_processes(root, str(workdir), OVERRIDES)
    single = root / "one"
    config = load_finetune_config(None, OVERRIDES, task_class("multiple-choice").defaults)
    finetune(model, task_class("multiple-choice"), train, validation, single, config, say=lambda _: None)
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
    assert (two / "best" / "finetune.json").is_file() and not (two / "best" / "config.json").exists()


def test_best_is_a_bertjax_model_directory_that_predicts_what_was_measured(runs):
    from bertjax.finetune.prediction import predict
    from bertjax.model_dirs import load_model_dir

    two, _, _ = runs
    loaded = load_model_dir(two / "best")  # verifies params/checksums.json, which process 0 wrote alone
    assert (two / "best" / "params" / "checksums.json").is_file()
    assert loaded.model.config.family == "eurobert" and loaded.tokenizer is not None
    validation = two.parent / "validation.jsonl"
    gold = [json.loads(line)["label"] for line in validation.read_text().splitlines()]
    predictions = predict(two / "best", validation)
    measured = json.loads((two / "results.json").read_text())["best_metrics"]["accuracy"]
    assert np.mean([p["label"] == g for p, g in zip(predictions, gold)]) == pytest.approx(measured)


def test_only_process_0_reports(runs):
    _, _, outputs = runs
    assert "best validation accuracy" in outputs[0]
    assert "best validation" not in outputs[1] and "initialised from" not in outputs[1]


def test_per_host_workdirs_resume_on_process_0s_records(runs):
    """Each host's own --workdir (checkpoints shared): only process 0's holds metrics.jsonl, and on a rerun process 1
    decided on no records at all. After an early stop it trained on alone, waiting forever on the others."""
    root = runs[0].parent
    overrides = [*OVERRIDES, "train.epochs=4", "eval.every=1", "train.early_stopping_patience=1",
                 f"checkpoint.directory={root / 'shared-checkpoints'}"]
    first = run_two_processes(root, str(root / "host{i}"), overrides, timeout=200)
    results = json.loads((root / "host0" / "results.json").read_text())
    assert results["stopped_early"] and results["steps"] < results["total_steps"], first[0]
    again = run_two_processes(root, str(root / "host{i}"), overrides, timeout=120)
    assert f"steps {results['steps']} -> {results['steps']}" in again[0], again[0]
